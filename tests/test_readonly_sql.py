"""The sandboxed read-only SQL engine behind ``POST /api/v1/sql`` (warehouse.readonly), end to end.

Every query here runs as the API runs it: checked against the allow-list, in a worker
process confined by Landlock and resource limits. The walls one at a time are in
tests/test_sql_policy.py (the allow-list alone) and tests/test_sql_walls.py (the OS wall
with the allow-list switched off, and every function DuckDB lists).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import duckdb
import psutil
import pytest

from tracelake.contracts.errors import QueryMemoryLimit, QueryTimeout
from tracelake.warehouse import InvalidArgument, QueryError, QueryResult, Settings, Warehouse
from tracelake.warehouse.readonly import SqlEngine

from support import SAMPLES

LIMITS: dict[str, Any] = {"sql_max_rows": 1000, "sql_timeout_seconds": 10.0, "sql_memory_limit": "500MB",
                          "threads": 2}
TOKEN = "tl-canary-token-5f2a9c"
pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="the SQL sandbox needs Linux")


@pytest.fixture(scope="module")
def wh(tmp_path_factory: pytest.TempPathFactory) -> Warehouse:
    """A warehouse holding the four-rank DDP sample (job ``ddp``); tests must leave it as it is."""
    wh = Warehouse(tmp_path_factory.mktemp("readonly") / "wh")
    report = wh.ingest([SAMPLES / "ddp_straggler"], job="ddp")
    assert report.ok, [r.error for r in report.failed]
    return wh


_ENGINES: dict[tuple[tuple[str, Any], ...], SqlEngine] = {}


@pytest.fixture(scope="module", autouse=True)
def _stop_engines() -> Iterator[None]:
    yield
    for engine in _ENGINES.values():
        engine.close()
    _ENGINES.clear()


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder beside the warehouse holding readable files a query must not reach."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "secret.txt").write_text("name,value\ntoken,hunter2\n")
    duckdb.sql(f"COPY (SELECT 42 AS answer) TO '{folder / 'secret.parquet'}'")
    return folder


def engine(wh: Warehouse, **limits: Any) -> SqlEngine:
    """An engine with the test limits (one per distinct set of limits, shared by the module's tests)."""
    merged = {**LIMITS, **limits}
    key = tuple(sorted(merged.items()))
    if key not in _ENGINES:
        _ENGINES[key] = SqlEngine(wh.store, replace(Settings(home=wh.home), sql_workers=1, **merged))
    return _ENGINES[key]


def run(wh: Warehouse, sql: str, max_rows: int | None = None, **limits: Any) -> QueryResult:
    return engine(wh, **limits).query(sql, max_rows=max_rows)


def files_under(folder: Path) -> set[Path]:
    return {p for p in folder.rglob("*")}


# -- queries that work -------------------------------------------------------------------


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT name, count(*) AS n, sum(dur_ns) AS total FROM device_ops GROUP BY name ORDER BY total DESC, name",
        "SELECT trace_id, job, rank FROM traces ORDER BY rank",
        "WITH r AS (SELECT rank, count(*) AS n FROM device_ops GROUP BY rank) SELECT * FROM r ORDER BY rank",
    ],
)
def test_query_matches_the_warehouse_query(wh: Warehouse, sql: str) -> None:
    expected = wh.query(sql)
    got = run(wh, sql)
    assert got.columns == expected.columns
    assert got.types == expected.types
    assert got.rows == expected.rows and got.rows
    assert got.truncated is False


@pytest.mark.parametrize(
    "sql",
    [
        "DESCRIBE device_ops",
        "SUMMARIZE SELECT rank FROM traces",
        "SHOW TABLES",
        "VALUES (1), (2)",
        "FROM traces SELECT count(*)",
        "PIVOT (SELECT rank FROM traces) ON rank IN (0, 1) USING count(*)",
        "-- a comment\nSELECT 1;",
    ],
)
def test_other_read_only_queries_work(wh: Warehouse, sql: str) -> None:
    assert run(wh, sql).rows


def test_plain_explain_shows_the_plan(wh: Warehouse) -> None:
    result = run(wh, "explain SELECT count(*) FROM device_ops")
    assert result.columns == ["explain_key", "explain_value"]
    assert "physical_plan" in result.rows[0][0]


def test_only_the_views_are_readable_not_the_files_behind_them(wh: Warehouse) -> None:
    # The views hide files of traces that are not registered; reading the files directly would not.
    for sql in (f"SELECT count(*) FROM read_parquet('{wh.store.tables}/traces/*/*.parquet')",
                f"SELECT count(*) FROM '{wh.store.tables}/traces/*/*.parquet'",
                "SELECT count(*) FROM query_table('traces')"):
        with pytest.raises(QueryError, match="not allowed"):
            run(wh, sql)


# -- row limit ---------------------------------------------------------------------------


def test_row_limit_cuts_and_marks_the_result(wh: Warehouse) -> None:
    result = run(wh, "SELECT trace_id, name, ts_ns, dur_ns FROM device_ops ORDER BY ts_ns, name", max_rows=7)
    assert len(result.rows) == 7 and result.truncated is True and result.truncated_by == "rows"
    expected = wh.query("SELECT trace_id, name, ts_ns, dur_ns FROM device_ops ORDER BY ts_ns, name LIMIT 7")
    assert result.rows == expected.rows


def test_row_limit_exactly_met_is_not_truncated(wh: Warehouse) -> None:
    result = run(wh, "SELECT * FROM range(5)", max_rows=5)
    assert result.rows == [(i,) for i in range(5)] and result.truncated is False


def test_an_endless_result_is_cut_without_computing_it(wh: Warehouse) -> None:
    started = time.perf_counter()
    result = run(wh, "SELECT * FROM range(10000000000000)", max_rows=3)
    assert result.rows == [(0,), (1,), (2,)] and result.truncated
    assert time.perf_counter() - started < 2


def test_query_result_defaults_to_not_truncated() -> None:
    assert QueryResult(["a"], ["INTEGER"], [(1,)]).truncated is False


# -- statements that are not one query ---------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "label"),
    [
        ("INSERT INTO traces VALUES (1)", "INSERT"),
        ("CREATE TABLE t AS SELECT 1", "CREATE"),
        ("CREATE MACRO m() AS 1", "CREATE"),
        ("COPY (SELECT 1) TO 'x.csv'", "COPY"),
        ("ATTACH ':memory:' AS m", "ATTACH"),
        ("DETACH memory", "DETACH"),
        ("INSTALL httpfs", "INSTALL"),
        ("LOAD httpfs", "LOAD"),
        ("SET threads = 8", "SET"),
        ("RESET threads", "RESET"),
        ("PRAGMA version", "PRAGMA"),
        ("CALL pragma_version()", "CALL"),
        ("EXPORT DATABASE 'x'", "EXPORT"),
        ("IMPORT DATABASE 'x'", "IMPORT"),
        ("USE memory", "USE"),
        ("UPDATE EXTENSIONS", "UPDATE"),
        ("CHECKPOINT", "CHECKPOINT"),
        ("BEGIN", "BEGIN"),
        ("PREPARE p AS SELECT 1", "PREPARE"),
        ("DELETE FROM traces", "DELETE"),
        ("WITH x AS (SELECT 1) INSERT INTO t SELECT * FROM x", "INSERT"),
        ("SELECT 1; SELECT 2", "2 statements"),
        ("SELECT 1; COPY (SELECT 1) TO 'x.csv'", "2 statements"),
        ("PIVOT traces ON rank", "PIVOT"),
    ],
)
def test_anything_but_one_query_is_refused(wh: Warehouse, sql: str, label: str) -> None:
    with pytest.raises(QueryError, match="only one SELECT query is allowed") as info:
        run(wh, sql)
    assert label in str(info.value)


def test_copy_message_names_the_statement(wh: Warehouse) -> None:
    with pytest.raises(QueryError, match=r"^only one SELECT query is allowed; got COPY \(to save a result, use"):
        run(wh, "COPY (SELECT 1) TO 'x.csv'")


@pytest.mark.parametrize("sql", ["", "   ", ";", "-- nothing"])
def test_empty_sql_is_refused(wh: Warehouse, sql: str) -> None:
    with pytest.raises(QueryError, match="empty SQL query"):
        run(wh, sql)


@pytest.mark.parametrize(
    "sql", ["EXPLAIN ANALYZE SELECT 1", "EXPLAIN (FORMAT json) SELECT 1", "EXPLAIN COPY (SELECT 1) TO 'x.csv'"]
)
def test_only_plain_explain_of_a_query_is_allowed(wh: Warehouse, sql: str) -> None:
    with pytest.raises(QueryError, match="EXPLAIN is allowed only as a plain"):
        run(wh, sql)


def test_parse_errors_carry_duckdbs_message(wh: Warehouse) -> None:
    with pytest.raises(QueryError, match='Parser Error: syntax error at or near "SELEC"'):
        run(wh, "SELEC 1")


def test_query_errors_carry_duckdbs_message(wh: Warehouse) -> None:
    with pytest.raises(QueryError, match='Referenced column "no_such_column" not found'):
        run(wh, "SELECT no_such_column FROM traces")
    with pytest.raises(QueryError, match="table 'no_such_table' is not allowed here: only the warehouse's views"):
        run(wh, "SELECT * FROM no_such_table")


# -- writing ------------------------------------------------------------------------------


def write_attacks(target: Path) -> list[str]:
    """Statements that would write ``target`` if anything let them through."""
    copy = f"COPY (SELECT 1 AS a) TO '{target}'"
    quoted = copy.replace("'", "''")
    return [
        copy,
        f"WITH x AS ({copy}) SELECT 1",  # DuckDB calls this a SELECT and runs the COPY
        f"WITH x AS MATERIALIZED ({copy}) SELECT * FROM x",
        f"WITH x AS ({copy}) SELECT 1 UNION ALL SELECT 2",
        f"WITH x AS ({copy}) SELECT 1 -- trailing comment",
        f"SELECT * FROM (WITH x AS ({copy}) SELECT 1)",
        f"SELECT * FROM query('WITH x AS ({quoted}) SELECT 1')",
        f"SELECT * FROM system.main.query('{quoted}')",
        f"SELECT * FROM json_execute_serialized_sql(json_serialize_sql('WITH x AS ({quoted}) SELECT 1'))",
        f'SELECT * FROM "JSON_EXECUTE_SERIALIZED_SQL"(json_serialize_sql(\'WITH x AS ({quoted}) SELECT 1\'))',
        f"EXPLAIN ANALYZE {copy}",
        f"EXPLAIN WITH x AS ({copy}) SELECT 1",
        f"DESCRIBE (WITH x AS ({copy}) SELECT 1)",
        f"EXPORT DATABASE '{target.parent}'",
        f"ATTACH '{target}' AS w",
    ]


@pytest.mark.parametrize("index", range(len(write_attacks(Path("x")))))
def test_nothing_gets_written_into_the_tables_folder(wh: Warehouse, index: int) -> None:
    target = wh.store.tables / "traces" / "job=evil" / "x.parquet"
    target.parent.mkdir()
    try:
        before = files_under(wh.store.tables)
        with pytest.raises(QueryError):
            run(wh, write_attacks(target)[index])
        assert not target.exists()
        assert files_under(wh.store.tables) == before
    finally:
        target.unlink(missing_ok=True)
        target.parent.rmdir()


def test_data_modifying_ctes_are_named_in_the_message(wh: Warehouse, tmp_path: Path) -> None:
    with pytest.raises(QueryError, match="got COPY inside the query"):
        run(wh, f"WITH x AS (COPY (SELECT 1) TO '{tmp_path / 'x.csv'}') SELECT 1")
    with pytest.raises(QueryError, match="got INSERT inside the query"):
        run(wh, "WITH x AS (INSERT INTO t VALUES (1) RETURNING *) SELECT * FROM x")
    assert not (tmp_path / "x.csv").exists()


def test_nothing_spills_to_the_working_directory(
    wh: Warehouse, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(QueryMemoryLimit, match="TRACELAKE_SQL_MEMORY_LIMIT"):
        run(wh, "SELECT list(i ORDER BY random()) FROM range(50000000) t(i)", sql_memory_limit="128MB")
    assert list(tmp_path.iterdir()) == []
    assert list(wh.store.tables.glob("**/*.tmp")) == []


# -- reading outside the tables folder ----------------------------------------------------


@pytest.mark.parametrize(
    "template",
    [
        "SELECT * FROM read_text('{txt}')",
        "SELECT * FROM read_text('/etc/passwd')",
        "SELECT * FROM read_text('/proc/self/environ')",
        "SELECT * FROM read_csv('{txt}')",
        "SELECT * FROM read_csv('/etc/passwd')",
        "SELECT * FROM read_csv_auto('{txt}')",
        "SELECT * FROM read_json_auto('{txt}')",
        "SELECT * FROM read_ndjson('/proc/self/environ')",
        "SELECT * FROM read_blob('{txt}')",
        "SELECT * FROM read_parquet('{parquet}')",
        "SELECT * FROM read_parquet('/tmp/x.parquet')",
        "SELECT * FROM '{parquet}'",
        "SELECT * FROM read_duckdb('{txt}')",
        "SELECT * FROM sniff_csv('{txt}')",
        "SELECT * FROM parquet_metadata('{parquet}')",
        "SELECT * FROM parquet_schema('/etc/hostname')",
        "SELECT * FROM glob('/etc/*')",
        "SELECT * FROM glob('{folder}/*')",
        "SELECT * FROM read_text('{tables}/{escape}')",
        "SELECT * FROM read_text('file://{txt}')",
        "SELECT * FROM read_parquet(['{tables}/traces/job=_schema/_schema.parquet', '{parquet}'])",
        "SELECT * FROM read_csv('https://example.com/x.csv')",
        "SELECT * FROM query_table('{txt}')",
        "SELECT * FROM sqlite_scan('{txt}', 't')",
        "SELECT * FROM read_xlsx('{txt}')",
        "SELECT * FROM query('SELECT * FROM read_text(''{txt}'')')",
    ],
)
def test_files_outside_the_tables_folder_are_out_of_reach(wh: Warehouse, outside: Path, template: str) -> None:
    sql = template.format(
        txt=outside / "secret.txt",
        parquet=outside / "secret.parquet",
        folder=outside,
        tables=wh.store.tables,
        escape=os.path.relpath(outside / "secret.txt", wh.store.tables),  # tables/../../..: the same file
    )
    with pytest.raises(QueryError) as info:
        run(wh, sql)
    assert "hunter2" not in str(info.value)


def test_attach_and_extensions_are_refused(wh: Warehouse, outside: Path) -> None:
    for sql in (f"ATTACH '{outside / 'x.duckdb'}'", "INSTALL httpfs", "LOAD httpfs", "FORCE INSTALL httpfs"):
        with pytest.raises(QueryError):
            run(wh, sql)
    assert not (outside / "x.duckdb").exists()
    # Autoloading is off: a function from a known extension is simply missing.
    with pytest.raises(QueryError, match="iceberg"):
        run(wh, "SELECT * FROM iceberg_scan('x')")


# -- environment and settings -------------------------------------------------------------


def test_environment_does_not_leak(wh: Warehouse, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / f"home-{TOKEN}"
    monkeypatch.setenv("TRACELAKE_TOKENS", f"{TOKEN}:read,write,admin")
    monkeypatch.setenv("HOME", str(home))
    for sql in ("SELECT getenv('TRACELAKE_TOKENS')", "SELECT getenv('HOME')", "SELECT * FROM duckdb_extensions()"):
        with pytest.raises(QueryError) as info:
            run(wh, sql)
        assert TOKEN not in str(info.value)
    refused = [
        "SELECT * FROM duckdb_settings()",
        "SELECT current_setting('secret_directory'), current_setting('extension_directory'), "
        "current_setting('home_directory'), current_setting('temp_directory')",
        "SELECT * FROM duckdb_secrets()",
        "SELECT * FROM duckdb_variables()",
        "SELECT * FROM pragma_database_size()",
    ]
    for sql in refused:
        with pytest.raises(QueryError, match="not allowed") as info:
            run(wh, sql)
        assert TOKEN not in str(info.value)
    assert TOKEN not in repr(run(wh, "SELECT * FROM duckdb_databases()").rows)
    assert not home.exists()


def test_settings_cannot_be_changed(wh: Warehouse) -> None:
    for sql in ("SET threads = 8", "SET enable_external_access = true", "RESET allowed_directories"):
        with pytest.raises(QueryError, match="got (SET|RESET)"):
            run(wh, sql)
    with pytest.raises(QueryError, match="not allowed"):
        run(wh, "SELECT * FROM enable_logging()")


def test_duckdbs_own_switches_hold_without_the_allow_list(wh: Warehouse) -> None:
    # The layer behind the allow-list: with the checks off, DuckDB's locked settings still refuse.
    unchecked = SqlEngine(wh.store, replace(Settings(home=wh.home), sql_workers=1, **LIMITS), policy=None)
    try:
        for sql in ("SET threads = 8", "SELECT * FROM enable_logging()", "SET allowed_directories = ['/']"):
            with pytest.raises(QueryError, match="configuration has been locked|disabled by configuration"):
                unchecked.query(sql)
        settings = dict(unchecked.query("SELECT name, value FROM duckdb_settings()").rows)
        assert settings["enable_external_access"] == "false"
        assert settings["lock_configuration"] == "true"
        assert settings["temp_directory"] == ""
        assert settings["allowed_directories"] == f"[{wh.store.tables}/]"
        assert settings["threads"] == "2"
    finally:
        unchecked.close()


def test_bad_limits_are_invalid_arguments(wh: Warehouse) -> None:
    for setting, value in [("sql_memory_limit", "lots"), ("sql_memory_limit", "100MB"), ("sql_max_rows", 0),
                           ("sql_timeout_seconds", 0), ("sql_max_bytes", 0), ("sql_workers", 0),
                           ("sql_per_token", 0), ("threads", 0)]:
        with pytest.raises(InvalidArgument, match=f"TRACELAKE_{setting.upper()}"):
            SqlEngine(wh.store, replace(Settings(home=wh.home), **{setting: value}))


# -- time limit and clean-up --------------------------------------------------------------


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT count(*) FROM range(10000000000000) a",
        "SELECT count(*) FROM range(1000000) a, range(100000) b",  # small sides: slow, not big
    ],
)
def test_an_endless_query_is_cancelled(wh: Warehouse, sql: str) -> None:
    started = time.perf_counter()
    message = r"^query cancelled after 0.5 s \(the limit is TRACELAKE_SQL_TIMEOUT_SECONDS\)$"
    with pytest.raises(QueryError, match=message):
        run(wh, sql, sql_timeout_seconds=0.5)
    assert time.perf_counter() - started < 10


def test_failed_and_stopped_queries_leave_no_process_behind(wh: Warehouse) -> None:
    """Errors, timeouts and memory failures end with at most one worker per pool slot, all alive."""
    for sql, limits, error in [
        ("SELECT * FROM no_such_table", {}, QueryError),
        ("WITH x AS (COPY (SELECT 1) TO 'x.csv') SELECT 1", {}, QueryError),
        ("SELECT count(*) FROM range(10000000000000)", {"sql_timeout_seconds": 0.2}, QueryTimeout),
        ("SELECT len(range(100000000))", {"sql_memory_limit": "128MB"}, QueryMemoryLimit),
    ]:
        with pytest.raises(error):
            run(wh, sql, **limits)
        assert run(wh, "SELECT 42", **limits).rows == [(42,)]
    me = psutil.Process()
    workers = [p for p in me.children(recursive=True) if "tracelake.warehouse.sql_worker" in " ".join(p.cmdline())]
    assert len(workers) <= len(_ENGINES)
    assert all(p.status() != psutil.STATUS_ZOMBIE for p in workers)


def test_a_closed_engine_starts_again_with_its_workers(wh: Warehouse) -> None:
    engine = SqlEngine(wh.store, replace(Settings(home=wh.home), sql_workers=2, **LIMITS))
    try:
        for _ in range(3):  # what a server's lifespan does when it stops and starts
            engine.start()
            assert engine.query("SELECT 1").rows == [(1,)]
            engine.close()
            assert engine.pool.idle_workers() == 0  # nothing idle left running
        engine.start()
        assert [engine.query(f"SELECT {i}").rows for i in range(4)] == [[(i,)] for i in range(4)]
    finally:
        engine.close()
