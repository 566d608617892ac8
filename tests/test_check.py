"""``tracelake check`` against a warehouse written to behind tracelake's back.

Each test takes a warehouse of ingested sample traces (its own copy of one built
for the module), then forges the damage the way someone with
write access to the folder (or a hole in a SQL sandbox) would: with pyarrow or
DuckDB directly. ``check`` must report it, ``--repair`` must put right what it can
(moving files aside into ``quarantine/``, never deleting them, and rewriting the
catalog), the views must answer again, and a second check must be clean, while the
healthy traces stay byte for byte as they were.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from tracelake.api.cli import app
from tracelake.contracts import schema
from tracelake.warehouse import Warehouse
from tracelake.warehouse.catalog import catalog_differences
from tracelake.warehouse.check import check
from tracelake.warehouse.check_layout import QUARANTINE
from tracelake.warehouse.store import Store

from support import SAMPLES

JOB = "ddp"
runner = CliRunner()


@pytest.fixture(scope="module")
def built_once(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two ranks of the DDP sample ingested under ``ddp``, once for the module (tests damage copies of it)."""
    home = tmp_path_factory.mktemp("check") / "warehouse"
    report = Warehouse(home).ingest(sorted((SAMPLES / "ddp_straggler").glob("rank-[01].json.gz")), job=JOB)
    assert report.ok, [r.error for r in report.failed]
    return home


@pytest.fixture
def built(home: Path, built_once: Path) -> tuple[Warehouse, list[str]]:
    """A warehouse of its own with two ranks of the DDP sample ingested under ``ddp``; its trace ids."""
    shutil.copytree(built_once, home, symlinks=True)
    warehouse = Warehouse(home)
    return warehouse, warehouse.store.job_traces(JOB)


def _digests(home: Path) -> dict[str, str]:
    """SHA-256 of every file under ``tables/``, by path relative to the home."""
    return {str(p.relative_to(home)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted((home / "tables").rglob("*")) if p.is_file()}


def _trace_digests(home: Path, trace_id: str) -> dict[str, str]:
    return {path: digest for path, digest in _digests(home).items() if trace_id in path}


def _quarantined(home: Path) -> list[str]:
    """Every file moved aside, by its path under the home (the run's folder left out)."""
    return sorted("/".join(p.relative_to(home / QUARANTINE).parts[1:])
                  for p in (home / QUARANTINE).rglob("*") if p.is_file() or p.is_symlink())


def _cli(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, [*args], env={"COLUMNS": "400"})
    return result.exit_code, result.output


def _assert_clean_and_queryable(home: Path, traces: int) -> None:
    warehouse = Warehouse(home)
    again = warehouse.check()
    assert again.ok and again.problems == [] and again.orphans == [], again.as_dict()
    assert warehouse.query("SELECT count(*) FROM traces").rows == [(traces,)]
    assert len(warehouse.traces()) == traces
    with duckdb.connect(str(warehouse.store.catalog_path), read_only=True) as con:  # what the DuckDB shell reads
        assert con.execute("SELECT count(*) FROM traces").fetchone() == (traces,)


def test_a_healthy_warehouse_checks_clean_and_repair_changes_nothing(built: tuple[Warehouse, list[str]]) -> None:
    warehouse, ids = built
    before = _digests(warehouse.home)
    catalog = warehouse.store.catalog_path.read_bytes()
    report = warehouse.check()
    assert report.ok and report.problems == [] and report.orphans == [], report.as_dict()
    assert report.traces == 2 and report.files == 3 * len(schema.TABLES)  # and each _schema file
    repaired = warehouse.check(repair=True)
    assert repaired.ok and repaired.problems == [] and repaired.orphans == []
    assert _digests(warehouse.home) == before
    assert warehouse.store.catalog_path.read_bytes() == catalog
    assert not (warehouse.home / QUARANTINE).exists()
    code, out = _cli("check", "--home", str(warehouse.home))
    assert code == 0 and "healthy: 2 traces" in out, out


def test_stray_files_and_folders_are_moved_to_quarantine(built: tuple[Warehouse, list[str]]) -> None:
    warehouse, ids = built
    home, tables = warehouse.home, warehouse.store.tables
    before = _digests(home)
    job_folder = tables / "device_ops" / f"job={JOB}"
    forged = {
        tables / "evil" / "x.txt": "an unknown table folder",
        tables / "notes.md": "a file where table folders go",
        tables / "steps" / "job=no good" / "a.parquet": "a job folder with an invalid name",
        tables / "steps" / "loose.parquet": "a file where job folders go",
        job_folder / "notes.txt": "not <trace id>.parquet",
        job_folder / "ABC.parquet": "an upper-case trace id",
        job_folder / "sub" / "0badc0de.parquet": "a folder inside a job folder",
        tables / "traces" / "job=_schema" / "extra.parquet": "another file in a schema folder",
    }
    for path in forged:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("not parquet")
    link = job_folder / "0123abcd.parquet"  # a link named like a trace file, pointing out of the warehouse
    os.symlink("/etc/hostname", link)

    report = warehouse.check()
    strays = {o.path for o in report.orphans if o.kind == "stray"}
    assert strays == {tables / "evil", tables / "notes.md", tables / "steps" / "job=no good",
                      tables / "steps" / "loose.parquet", job_folder / "notes.txt", job_folder / "ABC.parquet",
                      job_folder / "sub", tables / "traces" / "job=_schema" / "extra.parquet", link}
    assert not report.ok and report.problems == []
    assert all(o.repair == f"--repair moves it to {QUARANTINE}/" for o in report.orphans)
    code, out = _cli("check", "--home", str(home))
    assert code == 1 and out.count("--repair moves it to quarantine/") == len(strays), out

    code, out = _cli("check", "--repair", "--home", str(home))
    assert code == 0, out
    assert out.count(f"moved to {home / QUARANTINE}") == len(strays), out
    assert _quarantined(home) == sorted(
        [str(p.relative_to(home)) for p in forged] + [str(link.relative_to(home))])
    assert os.readlink(next((home / QUARANTINE).rglob("0123abcd.parquet"))) == "/etc/hostname"
    assert _digests(home) == before  # the healthy traces, byte for byte
    _assert_clean_and_queryable(home, 2)


def test_a_forged_registration_with_other_types_is_moved_aside(built: tuple[Warehouse, list[str]]) -> None:
    """A ``traces`` file whose ``rank`` is text breaks every listing until it is moved aside."""
    warehouse, ids = built
    home = warehouse.home
    before = _digests(home)
    row = pq.read_table(warehouse.store.path("traces", JOB, ids[0]))
    row = row.set_column(row.schema.get_field_index("rank"), "rank", pa.array(["0"]))
    row = row.set_column(0, "trace_id", pa.array(["deadbeef"]))
    forged = warehouse.store.path("traces", JOB, "deadbeef")
    pq.write_table(row, forged)
    with pytest.raises(Exception, match="rank"):  # the attack works: listings fail
        Warehouse(home).traces()

    report = warehouse.check()
    [problem] = report.problems
    assert (problem.trace_id, problem.table, problem.kind) == ("deadbeef", "traces", "schema")
    assert "rank is string, declared int32" in problem.detail and "unregisters the trace" in problem.repair
    assert report.traces == 2 and not report.ok

    repaired = warehouse.check(repair=True)
    assert repaired.ok and [p.fixed for p in repaired.problems] == [True], repaired.as_dict()
    assert not forged.exists() and _quarantined(home) == [str(forged.relative_to(home))]
    assert _digests(home) == before
    _assert_clean_and_queryable(home, 2)


def test_a_registration_overwritten_with_other_types_unregisters_the_trace(
    built: tuple[Warehouse, list[str]], samples: Path,
) -> None:
    """The trace's registration and its files go aside together; ingesting it again brings it back."""
    warehouse, ids = built
    home, store = warehouse.home, warehouse.store
    victim, other = ids
    kept = _trace_digests(home, other)
    path = store.path("traces", JOB, victim)
    row = pq.read_table(path)
    pq.write_table(row.set_column(row.schema.get_field_index("rank"), "rank", pa.array(["7"])), path)

    report = warehouse.check()
    assert {(p.trace_id, p.table, p.kind) for p in report.problems} == {(victim, "traces", "schema")}
    partial = {o.path for o in report.orphans}
    assert partial == {store.path(name, JOB, victim) for name in schema.DATA_TABLES}
    assert all(o.kind == "partial" and o.quarantine and "registration" in o.detail for o in report.orphans)

    repaired = warehouse.check(repair=True)
    assert repaired.ok, repaired.as_dict()
    assert len(_quarantined(home)) == len(schema.TABLES)
    assert _trace_digests(home, other) == kept
    _assert_clean_and_queryable(home, 1)
    again = Warehouse(home).ingest(sorted((samples / "ddp_straggler").glob("rank-[01].json.gz")), job=JOB)
    assert again.ok
    _assert_clean_and_queryable(home, 2)


def test_a_data_file_with_another_schema_is_moved_aside_and_its_trace_reported(
    built: tuple[Warehouse, list[str]], samples: Path,
) -> None:
    """``COPY (SELECT * FROM read_parquet(file) LIMIT 0)`` over a file adds the ``job`` column: another schema."""
    warehouse, ids = built
    home, store = warehouse.home, warehouse.store
    victim, other = ids
    kept = _trace_digests(home, other)
    path = store.path("device_ops", JOB, victim)
    with duckdb.connect() as con:
        con.execute(f"COPY (SELECT * FROM read_parquet('{path}') LIMIT 0) TO '{path}.new' (FORMAT parquet)")
    os.replace(f"{path}.new", path)

    report = warehouse.check()
    [problem] = report.problems
    assert (problem.trace_id, problem.table, problem.kind) == (victim, "device_ops", "schema")
    assert "job" in problem.detail and "then delete the trace and ingest it again" in problem.repair
    code, out = _cli("check", "--home", str(home))
    assert code == 1 and "schema" in out and "--repair moves it to quarantine/" in out, out

    code, out = _cli("check", "--repair", "--home", str(home), "--json")
    assert code == 1, out  # the trace now lacks a file: only ingesting it again makes it whole
    data = json.loads(out)
    kinds = {(p["table"], p["kind"], p["fixed"]) for p in data["problems"]}
    assert kinds == {("device_ops", "schema", True), ("device_ops", "missing", False)}
    assert any("delete the trace and ingest it again" in p["repair"] for p in data["problems"] if not p["fixed"])
    assert _quarantined(home) == [str(path.relative_to(home))]
    assert _trace_digests(home, other) == kept
    assert Warehouse(home).query("SELECT count(*) FROM device_ops").rows[0][0] > 0  # the views answer again

    warehouse.delete(victim)
    assert Warehouse(home).ingest([samples / "ddp_straggler" / "rank-0.json.gz",
                                   samples / "ddp_straggler" / "rank-1.json.gz"], job=JOB).ok
    _assert_clean_and_queryable(home, 2)


def test_a_file_overwritten_with_no_rows_is_a_count_problem(built: tuple[Warehouse, list[str]]) -> None:
    """The same schema, zero rows: the views show the trace without its device ops; check says so."""
    warehouse, ids = built
    path = warehouse.store.path("device_ops", JOB, ids[0])
    with duckdb.connect() as con:
        con.execute(f"COPY (SELECT * FROM read_parquet('{path}', hive_partitioning = false) LIMIT 0) "
                    f"TO '{path}.new' (FORMAT parquet)")
    os.replace(f"{path}.new", path)
    assert pq.read_metadata(path).num_rows == 0
    for repair in (False, True):
        report = warehouse.check(repair=repair)
        [problem] = report.problems
        assert (problem.trace_id, problem.table, problem.kind, problem.fixed) == (ids[0], "device_ops", "count", False)
        assert "holds 0 rows" in problem.detail and "delete the trace and ingest it again" in problem.repair
    assert path.exists() and not (warehouse.home / QUARANTINE).exists()  # reported, left for the operator


def test_a_file_holding_another_traces_rows_is_moved_aside(built: tuple[Warehouse, list[str]]) -> None:
    warehouse, ids = built
    store = warehouse.store
    victim, other = ids
    path = store.path("kernel_stats", JOB, victim)
    pq.write_table(pq.read_table(store.path("kernel_stats", JOB, other)), path)  # rows of the other trace
    report = warehouse.check()
    [problem] = report.problems
    assert (problem.table, problem.kind) == ("kernel_stats", "foreign") and other in problem.detail
    assert "tracelake analyze --recompute" in problem.repair  # a derived table: recomputing rewrites it
    repaired = warehouse.check(repair=True)
    assert {(p.kind, p.fixed) for p in repaired.problems} == {("foreign", True), ("missing", False)}
    assert warehouse.query(f"SELECT count(*) FROM kernel_stats WHERE trace_id = '{other}'").rows[0][0] > 0


@pytest.mark.parametrize("damage", ["types", "rows", "garbage", "missing"])
def test_schema_files_are_checked_and_written_again(built: tuple[Warehouse, list[str]], damage: str) -> None:
    warehouse, ids = built
    home, store = warehouse.home, warehouse.store
    before = _digests(home)
    table = "traces" if damage == "rows" else "steps"
    target = store.schema_file(table)
    if damage == "types":  # the names Store.initialise looks at, another type
        declared = schema.table(table).arrow_schema
        pq.write_table(pa.schema([pa.field(f.name, pa.string()) if f.name == "rank" else f for f in declared])
                       .empty_table(), target)
    elif damage == "rows":  # a forged trace in the traces view, which no semi-join filters
        pq.write_table(pq.read_table(store.path("traces", JOB, ids[0])), target)
        assert warehouse.query("SELECT count(*) FROM traces").rows == [(3,)]
    elif damage == "garbage":
        target.write_bytes(b"not parquet")
    else:
        target.unlink()
    report = check(Store(home))  # a garbage schema file stops Warehouse() itself (Store.initialise)
    [problem] = report.problems
    expected = {"types": "schema", "rows": "rows", "garbage": "unreadable", "missing": "missing"}[damage]
    assert (problem.job, problem.table, problem.kind) == ("_schema", table, expected)
    repaired = check(Store(home), repair=True)
    assert repaired.ok and repaired.problems[0].fixed, repaired.as_dict()
    written = pq.read_metadata(target)
    assert written.num_rows == 0 and written.schema.to_arrow_schema().equals(schema.table(table).arrow_schema)
    assert _quarantined(home) == ([] if damage == "missing" else [str(target.relative_to(home))])
    assert {k: v for k, v in _digests(home).items() if "_schema" not in k} == {
        k: v for k, v in before.items() if "_schema" not in k}
    _assert_clean_and_queryable(home, 2)


CATALOG_ATTACKS = {
    "dropped view": "DROP VIEW c.traces",
    "extra view": "CREATE VIEW c.secrets AS SELECT 1 AS x",
    "extra view in another schema": "CREATE SCHEMA c.other; CREATE VIEW c.other.traces AS SELECT 1 AS x",
    "macro": "CREATE MACRO c.main.evil(x) AS x + 1",
    "table macro": "CREATE MACRO c.main.rows() AS TABLE SELECT 1 AS x",
    "table": "CREATE TABLE c.stash AS SELECT 42 AS x",
    "sequence": "CREATE SEQUENCE c.main.seq",
    # every file, registered or not (the semi-join on traces dropped)
    "redefined view": "CREATE OR REPLACE VIEW c.device_ops AS SELECT * FROM "
                      "read_parquet('{tables}/device_ops/*/*.parquet', union_by_name = true)",
}


@pytest.mark.parametrize("attack", sorted(CATALOG_ATTACKS))
def test_a_tampered_catalog_is_reported_and_written_again(built: tuple[Warehouse, list[str]], attack: str) -> None:
    """``ATTACH '<home>/tracelake.duckdb' AS c; <statement>``, as from a DuckDB shell or a leaky sandbox."""
    warehouse, _ = built
    home, store = warehouse.home, warehouse.store
    before = _digests(home)
    with duckdb.connect() as con:
        con.execute(f"ATTACH '{store.catalog_path}' AS c")
        con.execute(CATALOG_ATTACKS[attack].format(tables=store.tables))
    assert catalog_differences(store)
    report = Warehouse(home).check()  # opening the warehouse does not notice: the catalog's stamp is current
    assert report.problems and {p.kind for p in report.problems} == {"catalog"} and not report.ok
    assert all(p.repair == "--repair writes the catalog again" for p in report.problems)
    code, out = _cli("check", "--home", str(home))
    assert code == 1 and "catalog" in out, out

    code, out = _cli("check", "--repair", "--home", str(home))
    assert code == 0 and "catalog written again" in out, out
    assert catalog_differences(store) == []
    assert _digests(home) == before
    _assert_clean_and_queryable(home, 2)


@pytest.mark.parametrize("damage", ["garbage", "wal"])
def test_a_catalog_that_does_not_open_is_written_again(built: tuple[Warehouse, list[str]], damage: str) -> None:
    warehouse, _ = built
    store = warehouse.store
    if damage == "garbage":
        store.catalog_path.write_bytes(b"not a database" * 100)
    else:  # a write-ahead log DuckDB would replay over the catalog on open
        store.catalog_path.with_name("tracelake.duckdb.wal").write_bytes(b"\0" * 64)
    report = warehouse.check()
    assert {p.kind for p in report.problems} == {"catalog"} and not report.ok
    assert warehouse.check(repair=True).ok
    assert catalog_differences(store) == []
    assert not store.catalog_path.with_name("tracelake.duckdb.wal").exists()
    _assert_clean_and_queryable(warehouse.home, 2)
