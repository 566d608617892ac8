"""The last step of a Kineto ingest: the parts joined with their cross-event columns (step, depth...).

A join that would not fit DuckDB's memory limit goes by ranges of event ids into one
Parquet file; these tests make the ranges tiny and check that nothing changes.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from support import SAMPLES, real_kineto_files
from tracelake import ingest
from tracelake.contracts import schema
from tracelake.ingest import kineto_scan, kineto_sql_tables
from tracelake.ingest.model import ParseOptions

JOINED = ("device_ops", "host_ops")
ENGINES = ["duckdb", "native"] if kineto_scan.AVAILABLE else ["duckdb"]
FILES = sorted(SAMPLES.glob("*/*.json.gz"))[:2] + real_kineto_files()[:3]


def parse(path: Path, staging: Path, engine: str) -> dict[str, pa.Table]:
    staging.mkdir()
    ingest.parse_into(path, staging, ParseOptions(source_name=path.name, trace_id="t", kineto_engine=engine))
    return {name: pq.read_table(staging / f"{name}.parquet") for name in JOINED}


def nullable(arrow_schema: pa.Schema) -> pa.Schema:
    """The schema with every field nullable (DuckDB writes constants and join keys as required)."""
    return pa.schema([f.with_nullable(True) for f in arrow_schema])


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("path", FILES, ids=[f"{p.parent.name}/{p.name}" for p in FILES])
def test_a_join_by_ranges_gives_the_tables_of_one_join(
    path: Path, engine: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = parse(path, tmp_path / "whole", engine)
    rows_per_join = 97
    monkeypatch.setattr(kineto_sql_tables, "memory_limit",
                        lambda con: rows_per_join * max(kineto_sql_tables.JOIN_BYTES_PER_ROW.values()))
    ranged = parse(path, tmp_path / "ranged", engine)
    for name in JOINED:
        assert nullable(ranged[name].schema) == nullable(schema.table(name).arrow_schema), name
        if ranged[name].num_rows > 2 * rows_per_join:
            assert pq.ParquetFile(tmp_path / "ranged" / f"{name}.parquet").metadata.num_row_groups > 1, name
        one, ranges = (t.cast(nullable(t.schema)).sort_by("event_id") for t in (whole[name], ranged[name]))
        assert ranges.num_rows == one.num_rows > 0 or name == "device_ops"
        for column in one.column_names:
            assert ranges.column(column).to_pylist() == one.column(column).to_pylist(), f"{name}.{column}"


@pytest.mark.parametrize(("limit", "low", "high"), [
    ("200MB", 190 * 2**20, 200 * 10**6), ("1GB", 900 * 2**20, 10**9), ("3.5GiB", 3.4 * 2**30, 3.5 * 2**30),
])
def test_the_memory_limit_is_read_in_bytes(limit: str, low: float, high: float) -> None:
    con = duckdb.connect(config={"memory_limit": limit})
    assert low <= kineto_sql_tables.memory_limit(con) <= high


def test_ranges_follow_where_the_ops_are() -> None:
    """Ops clustered in a tenth of the ids (a thread's CPU ops written together) still fill each range evenly."""
    con = duckdb.connect()
    con.execute("CREATE TABLE facts AS SELECT range * 7 AS event_id FROM range(20000) "  # ids 0..139,993
                "UNION ALL SELECT 140000 + range * 10000 AS event_id FROM range(130)")  # sparse, up to ~1.43M
    budget = 1000
    ranges = kineto_sql_tables.id_ranges(con, "facts", budget)
    assert ranges[0][0] == 0 and ranges[-1][1] == 140000 + 129 * 10000 + 1
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))  # contiguous, no gap, no overlap
    held = [con.execute(f"SELECT count(*) FROM facts WHERE event_id >= {a} AND event_id < {b}").fetchall()[0][0]
            for a, b in ranges]
    assert sum(held) == 20130
    assert max(held) <= budget
    assert len(ranges) <= 2 * 20130 // budget + 1  # not one range per bucket either


def test_a_join_that_fits_is_one_range() -> None:
    con = duckdb.connect()
    con.execute("CREATE TABLE facts AS SELECT range + 5 AS event_id FROM range(100)")
    assert kineto_sql_tables.id_ranges(con, "facts", 100) == [(5, 105)]
    con.execute("CREATE TABLE no_facts AS FROM facts LIMIT 0")
    assert kineto_sql_tables.id_ranges(con, "no_facts", 100) == []


def test_a_side_connection_has_its_share_of_the_limit_the_same_threads_and_its_own_folder(tmp_path: Path) -> None:
    def con(limit: str) -> duckdb.DuckDBPyConnection:
        return duckdb.connect(config={"memory_limit": limit, "threads": 3, "temp_directory": str(tmp_path)})

    def limit(c: duckdb.DuckDBPyConnection) -> int:
        return kineto_sql_tables.memory_limit(c)

    main = con("400MB")
    with kineto_sql_tables.side_connection(main, 0.5, 100 * 10**6) as side:
        assert abs(limit(side) - limit(main) // 2) < 10**6  # DuckDB words it to a tenth of a MiB
        assert side.execute("SELECT current_setting('threads'), current_setting('temp_directory')").fetchall() == \
            [(3, f"{tmp_path}-side")]  # a folder of its own for what it spills
        side.execute("CREATE TABLE mine AS SELECT 1 AS a")
    assert main.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'mine'").fetchall() == [(0,)]
    with kineto_sql_tables.side_connection(main, 0.1, 100 * 10**6) as side:  # never below the floor...
        assert abs(limit(side) - 100 * 10**6) < 10**6
    with kineto_sql_tables.side_connection(con("50MB"), 0.5, 100 * 10**6) as side:  # ...unless the limit is lower
        assert abs(limit(side) - 50 * 10**6) < 10**6
