"""The second wall alone, and both walls against every function DuckDB lists.

The OS wall (warehouse.sql_sandbox) is tested with the first wall switched off: no
allow-list, no statement check, DuckDB's external access on and its configuration
unlocked, no DuckDB memory limit. What still stops a write, a read outside ``tables/``
or a memory blow-up is then the kernel alone (Landlock, RLIMIT_DATA, RLIMIT_FSIZE).

The sweep calls every function ``duckdb_functions()`` lists, with arguments chosen to do
harm (paths into the warehouse, a canary file outside it, SQL text and serialized plans
that COPY into the warehouse), through the API's engine and through the unguarded one,
and checks after each that no byte of the warehouse changed and the canary never showed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tracelake.warehouse import QueryError, QueryMemoryLimit, Settings, Warehouse
from tracelake.warehouse.readonly import SqlEngine, api_spec
from tracelake.warehouse.sql_sandbox import landlock_abi

from support import SAMPLES

CANARY = "tl-canary-7d41e9-hunter2"
pytestmark = pytest.mark.skipif(landlock_abi() < 1, reason="the OS wall needs Linux with Landlock")


@pytest.fixture(scope="module")
def wh(tmp_path_factory: pytest.TempPathFactory) -> Warehouse:
    wh = Warehouse(tmp_path_factory.mktemp("walls") / "wh")
    assert wh.ingest([SAMPLES / "ddp_straggler"], job="ddp").ok
    return wh


@pytest.fixture(scope="module")
def canary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("outside") / "secret.csv"
    path.write_text(f"name,value\ntoken,{CANARY}\n")
    return path


def _settings(wh: Warehouse) -> Settings:
    return replace(Settings(home=wh.home), sql_workers=1, sql_timeout_seconds=5, sql_memory_limit="512MB")


@pytest.fixture(scope="module")
def guarded(wh: Warehouse) -> Iterator[SqlEngine]:
    """The API's engine: both walls."""
    engine = SqlEngine(wh.store, _settings(wh))
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def os_only(wh: Warehouse) -> Iterator[SqlEngine]:
    """The OS wall alone: no allow-list, no statement check, DuckDB's own file and setting guards off."""
    s = _settings(wh)
    spec = replace(api_spec(wh.store, s), allowed_directories=None, lock=False, duckdb_memory=None)
    engine = SqlEngine(wh.store, s, spec=spec, policy=None)
    yield engine
    engine.close()


def snapshot(home: Path) -> dict[str, str]:
    """Every file under the warehouse home (but the worker-free lock file) and a digest of its bytes."""
    found = {}
    for path in sorted(home.rglob("*")):
        if path.is_file() and path.name != ".write.lock":
            found[str(path.relative_to(home))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def attempt(engine: SqlEngine, sql: str) -> str:
    """What the query answered or the error it got, as text."""
    try:
        return repr(engine.query(sql).rows)
    except QueryError as exc:
        return str(exc)


# -- the OS wall alone ----------------------------------------------------------------------


def test_writes_fail_in_the_kernel_when_nothing_else_stops_them(wh: Warehouse, os_only: SqlEngine) -> None:
    before = snapshot(wh.home)
    victim = next((wh.store.tables / "device_ops").glob("job=ddp/*.parquet"))
    inner = f"WITH x AS (COPY (SELECT 1) TO '{wh.store.tables}/traces/job=ddp/forged.parquet') SELECT 1"
    serialized = duckdb.execute("SELECT json_serialize_sql(?)", [inner]).fetchone()[0]  # type: ignore[index]
    payload = serialized.replace("'", "''")
    attacks = [
        f"COPY (SELECT 1 AS a) TO '{wh.store.tables}/device_ops/job=ddp/new.parquet'",
        f"COPY (SELECT * FROM device_ops LIMIT 0) TO '{victim}'",  # the 0-row overwrite of issue 18
        inner,
        f"SELECT * FROM destroy_external_resource('json_execute_serialized_sql', '{payload}')",
        f"ATTACH '{wh.store.catalog_path}' AS c",
        f"ATTACH '{wh.home}/new.duckdb' AS n",
        f"EXPORT DATABASE '{wh.home}/exported'",
        f"COPY (SELECT 1) TO '{wh.home}/../escaped.csv'",
        "COPY (SELECT 1) TO '/tmp/tracelake-wall-test.csv'",
    ]
    for sql in attacks:
        answer = attempt(os_only, sql)
        assert "Permission denied" in answer or "Permission Error" in answer or "Cannot open" in answer, (sql, answer)
    assert snapshot(wh.home) == before
    assert not Path("/tmp/tracelake-wall-test.csv").exists()
    assert not (wh.home.parent / "escaped.csv").exists()


def test_reads_outside_the_tables_fail_in_the_kernel(wh: Warehouse, os_only: SqlEngine, canary: Path) -> None:
    for sql in (f"SELECT * FROM read_csv('{canary}')", f"SELECT * FROM read_text('/proc/self/root{canary}')",
                f"SELECT * FROM read_text('{wh.store.tables}/../tracelake.duckdb')", "SELECT * FROM read_text('/etc/passwd')",
                f"SELECT * FROM read_text('{wh.home}/.write.lock')", "SELECT * FROM read_text('/proc/1/environ')"):
        answer = attempt(os_only, sql)
        assert "Permission denied" in answer and CANARY not in answer, (sql, answer)
    # what it may read: the warehouse's tables
    assert os_only.query(f"SELECT count(*) FROM read_parquet('{wh.store.tables}/traces/*/*.parquet')").rows == [(4,)]


def test_memory_is_capped_by_the_kernel_without_duckdbs_limit(os_only: SqlEngine) -> None:
    with pytest.raises(QueryMemoryLimit, match="TRACELAKE_SQL_MEMORY_LIMIT"):
        os_only.query("SELECT len(range(300000000))")
    assert os_only.query("SELECT 1").rows == [(1,)]


def test_the_worker_has_no_tokens_and_no_network(os_only: SqlEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    environ = attempt(os_only, "SELECT content FROM read_text('/proc/self/environ')")
    assert "TRACELAKE" not in environ and "HOME=/nonexistent" in environ
    answer = attempt(os_only, "SELECT * FROM read_csv('http://127.0.0.1:9/x.csv')")
    assert "x.csv" in answer and "[(" not in answer


# -- both walls against every function --------------------------------------------------------


def functions() -> list[tuple[str, str, list[str]]]:
    """(name, kind, parameter types) of every overload duckdb_functions() lists, at most 3 per name and kind."""
    rows = duckdb.execute("SELECT function_name, function_type, parameter_types FROM duckdb_functions() "
                      "WHERE function_type <> 'pragma' ORDER BY ALL").fetchall()
    seen: dict[tuple[str, str], int] = {}
    picked = []
    for name, kind, types in rows:
        key = (name, "table" if kind in ("table", "table_macro") else "scalar")
        if seen.get(key, 0) < 3:
            seen[key] = seen.get(key, 0) + 1
            picked.append((name, key[1], list(types or [])))
    return picked


FUNCTIONS = functions()


def harmful_strings(wh: Warehouse, canary: Path) -> list[str]:
    inner = f"WITH x AS (COPY (SELECT 1) TO '{wh.store.tables}/traces/job=ddp/forged.parquet') SELECT 1"
    serialized = duckdb.execute("SELECT json_serialize_sql(?)", [inner]).fetchone()[0]  # type: ignore[index]
    return [str(wh.store.tables / "device_ops" / "job=ddp" / "forged.parquet"), str(canary), inner, serialized,
            "json_execute_serialized_sql", str(wh.store.catalog_path), f"COPY (SELECT 1) TO '{wh.home}/x.csv'"]


def call(name: str, kind: str, types: list[str], strings: list[str], choice: int) -> str:
    """A query calling ``name`` with a harmful value for every text parameter (``choice`` picks which)."""
    args = []
    for i, declared in enumerate(types):
        t = declared or "ANY"  # macros declare no types
        text = "'" + strings[(choice + i) % len(strings)].replace("'", "''") + "'"
        if t.endswith("[]"):
            args.append(f"[{text}]")
        elif t in ("VARCHAR", "ANY", "JSON", "VARIANT", "BLOB"):
            args.append(text)
        elif t in ("BOOLEAN",):
            args.append("true")
        elif t in ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UBIGINT", "UINTEGER", "DOUBLE", "FLOAT"):
            args.append("0")
        else:
            args.append("NULL")
    quoted = '"' + name.replace('"', '""') + '"'
    called = f"{quoted}({', '.join(args)})"
    return f"SELECT * FROM {called}" if kind == "table" else f"SELECT {called}"


@pytest.mark.slow  # sweeps every DuckDB function through the sandbox
def test_no_function_writes_the_warehouse_or_reads_outside_it(
    wh: Warehouse, guarded: SqlEngine, os_only: SqlEngine, canary: Path
) -> None:
    before = snapshot(wh.home)
    strings = harmful_strings(wh, canary)
    for n, (name, kind, types) in enumerate(FUNCTIONS):
        sql = call(name, kind, types, strings, n)
        for engine in (guarded, os_only):
            answer = attempt(engine, sql)
            assert CANARY not in answer, (sql, answer)
            assert not (wh.store.tables / "device_ops" / "job=ddp" / "forged.parquet").exists(), sql
            assert not (wh.store.tables / "traces" / "job=ddp" / "forged.parquet").exists(), sql
    assert snapshot(wh.home) == before


@pytest.mark.slow  # sweeps every DuckDB function through the sandbox
@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(picked=st.sampled_from(FUNCTIONS), choice=st.integers(0, 50), wrap=st.sampled_from([
    "{q}", "WITH a AS ({q}) SELECT * FROM a", "SELECT * FROM ({q}) t, range(2)", "SELECT (SELECT count(*) FROM ({q}))",
]))
def test_generated_calls_never_write_or_leak(
    wh: Warehouse, guarded: SqlEngine, os_only: SqlEngine, canary: Path, picked: tuple[str, str, list[str]],
    choice: int, wrap: str,
) -> None:
    name, kind, types = picked
    sql = wrap.format(q=call(name, kind, types, harmful_strings(wh, canary), choice))
    before = snapshot(wh.store.tables)
    for engine in (guarded, os_only):
        assert CANARY not in attempt(engine, sql), sql
    assert snapshot(wh.store.tables) == before, sql


def test_the_guarded_engine_refuses_what_the_sweep_found_harmful(guarded: SqlEngine, canary: Path) -> None:
    # Control: the unguarded engine's reads inside tables/ work, so the sweep really ran the functions.
    answer: Any = attempt(guarded, f"SELECT * FROM read_csv('{canary}')")
    assert "not allowed" in answer
