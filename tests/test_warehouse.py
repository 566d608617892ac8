"""Warehouse behaviour: idempotence, atomic visibility, jobs and labels, locks, relocation."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import polars as pl
import pyarrow.parquet as pq
import pytest

from support import SAMPLES
from tracelake.contracts import schema
from tracelake.warehouse import InvalidArgument, NotFound, QueryError, Warehouse, WarehouseError, catalog
from tracelake.api.user_input import parse_labels


def test_fresh_warehouse_is_queryable_and_empty(warehouse: Warehouse) -> None:
    for table in ("traces", "device_ops", "host_ops", "collectives", "steps", "counters"):
        assert warehouse.query(f"SELECT count(*) FROM {table}").rows == [(0,)]
    assert (warehouse.home / "tracelake.duckdb").exists()


def test_ingest_registers_trace_and_rows(warehouse: Warehouse) -> None:
    report = warehouse.ingest([SAMPLES / "ddp_straggler"], job="ddp", labels={"team": "infra"})
    assert report.ok and report.count("ingested") == 4
    traces = warehouse.traces(job="ddp")
    assert sorted(t["rank"] for t in traces) == [0, 1, 2, 3]
    assert all(t["labels"] == {"team": "infra"} and t["job"] == "ddp" for t in traces)
    for t in traces:
        n = warehouse.query("SELECT count(*) FROM device_ops WHERE trace_id = ?", [t["trace_id"]]).rows[0][0]
        assert n == t["device_op_count"] > 0
    by_label = warehouse.query("SELECT count(*) FROM traces WHERE labels['team'] = 'infra'").rows[0][0]
    assert by_label == 4


def test_same_content_twice_is_a_noop(warehouse: Warehouse, tmp_path: Path) -> None:
    source = SAMPLES / "launch_bound" / "rank-0.json.gz"
    first = warehouse.ingest_file(source, job="a")
    copy = tmp_path / "renamed.json.gz"
    shutil.copy(source, copy)
    second = warehouse.ingest_file(copy, job="b")
    assert first.status == "ingested"
    assert second.status == "duplicate" and second.trace_id == first.trace_id and second.job == "a"
    assert warehouse.query("SELECT count(*) FROM traces").rows == [(1,)]
    files = list((warehouse.home / "tables" / "device_ops").glob("job=*/[!_]*.parquet"))
    assert len(files) == 1


def test_unregistered_files_are_invisible(warehouse: Warehouse, tmp_path: Path) -> None:
    """Files of an ingest that died before registering its trace never show in queries."""
    warehouse.ingest_file(SAMPLES / "launch_bound" / "rank-0.json.gz", job="x")
    before = warehouse.query("SELECT count(*) FROM device_ops").rows[0][0]
    registered = next((warehouse.home / "tables" / "traces").glob("job=x/*.parquet"))
    # Another trace's data file, published without its registration (as a crash would leave it).
    other = Warehouse(tmp_path / "other")
    other.ingest_file(SAMPLES / "ddp_straggler" / "rank-1.json.gz", job="x")
    for table in ("device_ops", "host_ops", "collectives", "steps"):
        source = next((other.home / "tables" / table).glob("job=x/*.parquet"))
        shutil.copy(source, warehouse.home / "tables" / table / "job=x" / source.name)
    assert warehouse.query("SELECT count(*) FROM device_ops").rows[0][0] == before
    assert warehouse.query("SELECT count(DISTINCT trace_id) FROM host_ops").rows[0][0] == 1
    # The analyses of the job read only registered traces too.
    analysis = warehouse.analyze(job="x")
    assert analysis.breakdown.height == 1 and analysis.step_stats["trace_id"].n_unique() <= 1
    assert analysis.collectives.is_empty()  # the stray rank-1 collectives would pair up with nothing else
    # Take the registration away: the trace's rows disappear with it.
    registered.unlink()
    assert warehouse.query("SELECT count(*) FROM device_ops").rows[0][0] == 0


def test_partial_temp_files_do_not_break_views(warehouse: Warehouse) -> None:
    warehouse.ingest_file(SAMPLES / "launch_bound" / "rank-0.json.gz", job="x")
    half = warehouse.home / "tables" / "device_ops" / "job=x" / ".abc.parquet.123.tmp"
    half.write_bytes(b"PAR1 half written")
    assert warehouse.query("SELECT count(*) FROM device_ops").rows[0][0] > 0


@pytest.mark.parametrize("job", ["", "../etc", "a/b", "_schema", "-x", "x" * 200, "a b"])
def test_bad_job_names_are_refused(warehouse: Warehouse, job: str) -> None:
    with pytest.raises(InvalidArgument, match="invalid job name"):
        warehouse.ingest([SAMPLES / "launch_bound"], job=job)


def test_labels_parsing() -> None:
    assert parse_labels(["team=infra", "model = llama 3"]) == {"team": "infra", "model": "llama 3"}
    with pytest.raises(InvalidArgument, match="key=value"):
        parse_labels(["novalue"])
    with pytest.raises(InvalidArgument):
        parse_labels(["bad key=1"])


def test_query_errors_carry_duckdb_message(warehouse: Warehouse) -> None:
    with pytest.raises(QueryError, match="no_such_table"):
        warehouse.query("SELECT * FROM no_such_table")
    with pytest.raises(NotFound):
        warehouse.trace("0" * 20)


def test_catalog_file_is_never_locked_by_ingest(warehouse: Warehouse) -> None:
    """A reader holding the catalog open (like the DuckDB shell) does not block an ingest."""
    reader = duckdb.connect(str(warehouse.store.catalog_path), read_only=True)
    try:
        report = warehouse.ingest([SAMPLES / "ddp_straggler"], job="ddp")
        assert report.ok
        # The reader sees the new trace through its views without reopening.
        assert reader.execute("SELECT count(*) FROM traces").fetchone() == (4,)
        # And another process can open the catalog at the same time.
        out = subprocess.run(
            [sys.executable, "-c", "import duckdb,sys; c=duckdb.connect(sys.argv[1], read_only=True);"
             "print(c.execute('select count(*) from device_ops').fetchone()[0])", str(warehouse.store.catalog_path)],
            capture_output=True, text=True, check=True,
        )
        assert int(out.stdout) > 0
    finally:
        reader.close()


def test_moved_warehouse_rebuilds_its_catalog(home: Path, tmp_path: Path) -> None:
    Warehouse(home).ingest([SAMPLES / "launch_bound"], job="lb")
    moved = tmp_path / "elsewhere"
    shutil.move(str(home), moved)
    wh = Warehouse(moved)
    assert wh.query("SELECT count(*) FROM traces").rows == [(1,)]
    con = duckdb.connect(str(wh.store.catalog_path), read_only=True)
    assert con.execute("SELECT count(*) FROM traces").fetchone() == (1,)


def test_catalog_stamp_is_checked(home: Path) -> None:
    """A stamp that does not match (old schema, other location) makes the catalog rebuild."""
    wh = Warehouse(home)
    stamp = wh.store.catalog_stamp
    assert stamp.read_text().splitlines() == [str(schema.SCHEMA_VERSION), str(home)]
    stamp.write_text("0\n/somewhere/else\n")
    Warehouse(home)
    assert stamp.read_text().splitlines() == [str(schema.SCHEMA_VERSION), str(home)]
    stamp.unlink()  # a warehouse from before stamps: the catalog itself is checked
    Warehouse(home)
    con = duckdb.connect(str(wh.store.catalog_path), read_only=True)
    assert con.execute("SELECT schema_version FROM tracelake_meta").fetchone() == (schema.SCHEMA_VERSION,)


def test_a_process_without_duckdb_has_a_child_write_the_catalog(home: Path) -> None:
    """Making a warehouse in a process that never loaded DuckDB leaves it unloaded there, and the catalog a child
    wrote is the one the DuckDB shell reads: a view per table, then an ingest's trace is seen through it."""
    made = subprocess.run(
        [sys.executable, "-c", "import sys; from tracelake.warehouse import Warehouse; Warehouse(sys.argv[1]); "
         "print('duckdb' in sys.modules)", str(home)], capture_output=True, text=True, check=True)
    assert made.stdout.strip() == "False", made.stderr
    store = Warehouse(home).store
    assert catalog.catalog_differences(store) == []
    assert sorted(p.name for p in home.iterdir() if p.name.startswith(".")) == []  # no temp file left
    con = duckdb.connect(str(store.catalog_path), read_only=True)
    views = {row[0] for row in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}
    assert views == set(schema.TABLES) | {"tracelake_meta"}
    assert con.execute("SELECT count(*) FROM traces").fetchone() == (0,)
    con.close()
    assert Warehouse(home).ingest([SAMPLES / "launch_bound"], job="lb").ok
    con = duckdb.connect(str(store.catalog_path), read_only=True)
    assert con.execute("SELECT count(*) FROM traces").fetchone() == (1,)
    con.close()


def test_a_catalog_the_child_cannot_write_is_an_error_naming_it(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The child's DuckDB error reaches the caller as a WarehouseError naming the catalog; no file is left."""
    store = Warehouse(home).store
    before = store.catalog_path.read_bytes()
    monkeypatch.delitem(sys.modules, "duckdb")  # as in a process that never loaded it
    monkeypatch.setattr(catalog, "view_statements", lambda *_a, **_k: ["CREATE VIEW catalog.v AS SELECT * FROM nope"])
    with pytest.raises(WarehouseError, match=r"tracelake\.duckdb: CatalogException: .*nope"):
        catalog.write_catalog(store)
    assert store.catalog_path.read_bytes() == before
    assert sorted(p.name for p in home.iterdir()) == ["staging", "tables", "tracelake.duckdb",
                                                      "tracelake.duckdb.stamp"]


def test_without_an_interpreter_to_start_the_catalog_is_written_here(home: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """An embedded Python with no ``sys.executable`` writes the catalog in its own process, as before."""
    store = Warehouse(home).store
    store.catalog_path.unlink()
    monkeypatch.delitem(sys.modules, "duckdb")
    monkeypatch.setattr(sys, "executable", "")
    monkeypatch.setattr(catalog, "_run_in_child", lambda *_a: pytest.fail("started a child"))
    catalog.write_catalog(store)
    assert catalog.catalog_differences(store) == []


@pytest.mark.parametrize("name", ["*", "?", "[a-f]*", "../x", "0" * 65])
def test_trace_ids_are_not_globs(warehouse: Warehouse, name: str) -> None:
    warehouse.ingest_file(SAMPLES / "launch_bound" / "rank-0.json.gz", job="x")
    with pytest.raises(NotFound):
        warehouse.analyze(trace_id=name)
    assert warehouse.store.registered_job(name) is None


def test_home_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACELAKE_HOME", str(tmp_path / "envhome"))
    wh = Warehouse()
    assert wh.home == (tmp_path / "envhome").resolve()


def test_staging_is_cleaned_up(warehouse: Warehouse) -> None:
    warehouse.ingest([SAMPLES / "ddp_straggler"], job="ddp")
    assert list((warehouse.home / "staging").iterdir()) == []
    for path in (warehouse.home / "tables").rglob("*.parquet"):
        assert pq.read_metadata(path).num_columns > 0


@pytest.mark.slow  # a pool of ingest worker processes
def test_parallel_ingest_matches_serial(tmp_path: Path) -> None:
    serial = Warehouse(tmp_path / "serial")
    parallel = Warehouse(tmp_path / "parallel")
    a = serial.ingest([SAMPLES / "ddp_straggler", SAMPLES / "launch_bound"], job="j")
    bad = tmp_path / "broken.json"
    bad.write_text('{"traceEvents": [')
    b = parallel.ingest([SAMPLES / "ddp_straggler", bad, SAMPLES / "launch_bound"], job="j", workers=2)
    assert a.ok and not b.ok and [r.status for r in b.results].count("ingested") == 5
    # Results come back in input order, the failure in its place.
    assert b.results[4].path == bad and b.results[4].status == "failed"
    assert "broken.json" in (b.results[4].error or "")
    query = "SELECT trace_id, rank, device_op_count, host_op_count FROM traces ORDER BY trace_id"
    assert serial.query(query).rows == parallel.query(query).rows
    table = "SELECT * EXCLUDE (job) FROM breakdown ORDER BY ALL"
    assert serial.query(table).rows == parallel.query(table).rows


def test_stored_tables_written_before_a_column_existed_read_with_nulls(warehouse: Warehouse) -> None:
    """A trace stored under an older schema (a column missing) still reads, and analyses, with nulls there."""
    assert warehouse.ingest([SAMPLES / "ddp_straggler" / "rank-0.json.gz"], job="old").ok
    trace_id = warehouse.store.job_traces("old")[0]
    path = warehouse.store.path("breakdown", "old", trace_id)
    table = pq.read_table(path)
    dropped = table.column_names[-1]
    pq.write_table(table.drop_columns([dropped]), path)
    frame = warehouse.store.read_frame("breakdown", [("old", trace_id)])
    assert frame.columns == schema.table("breakdown").column_names
    assert frame[dropped].null_count() == frame.height > 0
    assert frame.drop(dropped).equals(pl.from_arrow(table).drop(dropped))  # type: ignore[union-attr]
    assert warehouse.analyze(job="old").breakdown.height == 1
