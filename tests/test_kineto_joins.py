"""The last step of a Kineto ingest: the parts joined with their cross-event columns (step, depth...).

The parts are merged with their facts sorted by event id; parts out of that order go by DuckDB's hash join,
by ranges of event ids into one Parquet file where one join would not fit DuckDB's memory limit. These tests
check the merge against the hash join (with tiny ranges) on real traces, and both against a join counted
in Python on generated parts, in order and out of it.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support import SAMPLES, real_kineto_files
from tracelake import ingest
from tracelake.contracts import schema
from tracelake.ingest import kineto_scan, kineto_sql_tables
from tracelake.ingest.model import ParseOptions
from tracelake.ingest.part_rows import PartColumns

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
def test_the_merge_gives_the_tables_of_a_hash_join_by_ranges(
    path: Path, engine: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    merges: list[tuple[str, bool]] = []
    merge = kineto_sql_tables._write_merged

    def spied(*args: object) -> bool:
        merged = merge(*args)  # type: ignore[arg-type]
        merges.append((args[2].name, merged))  # type: ignore[attr-defined]
        return merged

    monkeypatch.setattr(kineto_sql_tables, "_write_merged", spied)
    merged = parse(path, tmp_path / "merged", engine)
    assert sorted(merges) == [("device_ops", True), ("host_ops", True)]  # the scanners write parts in order
    rows_per_join = 97
    monkeypatch.setattr(kineto_sql_tables, "_write_merged", lambda *args: False)
    monkeypatch.setattr(kineto_sql_tables, "memory_limit",
                        lambda con: rows_per_join * max(kineto_sql_tables.JOIN_BYTES_PER_ROW.values()))
    cut = kineto_sql_tables.id_ranges
    ranges_made: dict[str, int] = {}

    def counted(con: duckdb.DuckDBPyConnection, facts: str, rows_per_range: int) -> list[tuple[int, int]]:
        ranges_made[facts] = len(made := cut(con, facts, rows_per_range))
        return made

    monkeypatch.setattr(kineto_sql_tables, "id_ranges", counted)
    ranged = parse(path, tmp_path / "ranged", engine)
    for name, facts in (("device_ops", "dev_d"), ("host_ops", "host_d")):
        assert nullable(merged[name].schema) == nullable(schema.table(name).arrow_schema), name
        assert nullable(ranged[name].schema) == nullable(schema.table(name).arrow_schema), name
        if ranged[name].num_rows > 2 * rows_per_join:
            assert ranges_made[facts] > 1, name
        one, ranges = (t.cast(nullable(t.schema)).sort_by("event_id") for t in (merged[name], ranged[name]))
        assert ranges.num_rows == one.num_rows > 0 or name == "device_ops"
        assert merged[name].column("event_id").to_pylist() == one.column("event_id").to_pylist()  # in id order
        for column in one.column_names:
            assert ranges.column(column).to_pylist() == one.column(column).to_pylist(), f"{name}.{column}"


FACT_COLUMNS = ("depth", "parent_id", "step")


def _join_in_python(parts: list[list[tuple[int, str, int]]], facts: list[tuple[int, int, int, int]],
                    base: int) -> list[tuple[object, ...]]:
    """The inner join of the parts' rows (id, name, ts) and the facts (id, depth, parent, step), by dicts."""
    by_id = {row[0]: row[1:] for row in facts}
    return sorted((i, name, ts + base, *by_id[i]) for rows in parts for i, name, ts in rows if i in by_id)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(rng=st.randoms(), events=st.integers(0, 400), files=st.integers(1, 4), shuffle=st.booleans(),
       missing_facts=st.integers(0, 3), extra_facts=st.integers(0, 3))
def test_the_joined_table_is_the_inner_join_of_parts_and_facts(
    rng: object, events: int, files: int, shuffle: bool, missing_facts: int, extra_facts: int,
    tmp_path_factory: pytest.TempPathFactory
) -> None:
    """In order or not, with rows on either side lacking a partner: the rows of a join counted in Python."""
    import random
    assert isinstance(rng, random.Random)
    folder = tmp_path_factory.mktemp("parts")
    ids = sorted(rng.sample(range(10 * events + 10), events))
    cuts = sorted(rng.sample(range(events + 1), files - 1)) if events + 1 >= files - 1 else []
    parts = [[(i, f"op{i % 7}", i * 3) for i in ids[a:b]] for a, b in zip([0, *cuts], [*cuts, events], strict=True)]
    if shuffle and events > 1:
        rng.shuffle(parts[0]) if len(parts[0]) > 1 else rng.shuffle(parts)
    for n, rows in enumerate(parts):
        pq.write_table(pa.table({"event_id": pa.array([r[0] for r in rows], pa.int64()),
                                 "name": pa.array([r[1] for r in rows], pa.string()),
                                 "ts_ns": pa.array([r[2] for r in rows], pa.int64())}), folder / f"host-{n:06d}.parquet")
    kept = [i for i in ids if rng.random() >= missing_facts / 10]
    extra = [10 * events + 10 + k for k in range(extra_facts)]
    facts = [(i, i % 5, i - 1, i // 50) for i in kept + extra]
    rng.shuffle(facts)
    con = duckdb.connect(config={"threads": 2, "preserve_insertion_order": False,
                                 "temp_directory": str(folder / "spill")})
    con.execute("CREATE TABLE host_d (event_id BIGINT, depth INTEGER, parent_id BIGINT, step BIGINT)")
    if facts:
        con.executemany("INSERT INTO host_d VALUES (?, ?, ?, ?)", facts)
    out = folder / "host_ops.parquet"
    merges: list[bool] = []
    merge = kineto_sql_tables._write_merged

    def spied(*args: object) -> bool:
        merges.append(merge(*args))  # type: ignore[arg-type]
        return merges[-1]

    kineto_sql_tables._write_merged = spied  # type: ignore[assignment]
    try:
        kineto_sql_tables._write_joined(
            con, out, PartColumns(schema.table("host_ops"), {"event_id": "event_id", "name": "name", "ts_ns": "ts_ns"},
                                  {"trace_id": "t", "rank": 0}, frozenset({"ts_ns"}), 5),
            folder, "host", kineto_sql_tables._Facts("host_d", FACT_COLUMNS, folder / "host_facts_by_id.parquet"))
    finally:
        kineto_sql_tables._write_merged = merge  # type: ignore[assignment]
    in_step = [i for rows in parts for i, _, _ in rows] == ids and len(kept) == len(ids) and not extra
    assert merges == [in_step]  # merged exactly where parts and facts line up one to one
    got = pq.read_table(out)
    rows = sorted(zip(*(got.column(c).to_pylist() for c in ("event_id", "name", "ts_ns", *FACT_COLUMNS)),
                      strict=True))
    assert rows == _join_in_python(parts, facts, 5)
    assert set(got.column("trace_id").to_pylist()) <= {"t"}


@pytest.mark.parametrize("times", [[5, 5, 7, 9], [5, 9, 7, 9], [5, 7, None, 9], [9, 8, 7, 6]])
def test_a_merge_kept_in_order_of_a_column_gives_up_where_the_rows_are_not(times: list[int | None],
                                                                          tmp_path: Path) -> None:
    """The memory instants' merge keeps them by time: where the parts' rows are not in that order (or lack a time),
    nothing is left at the output and the caller sorts instead; where they are, every row comes in that order."""
    for n, (first, stop) in enumerate([(0, 2), (2, 4)]):  # the order is kept across the parts' batches too
        pq.write_table(pa.table({"event_id": pa.array(range(first, stop), pa.int64()),
                                 "ts_ns": pa.array(times[first:stop], pa.int64())}), tmp_path / f"memory-{n:06d}.parquet")
    con = duckdb.connect()
    con.execute("CREATE TABLE facts AS SELECT range AS event_id, 'op' || range AS op, range // 2 AS step FROM range(4)")
    out = tmp_path / "memory_events.parquet"
    select = schema.select_list(schema.MEMORY_EVENTS, {"trace_id": "'t'", "rank": "0", "event_id": "event_id",
                                                      "ts_ns": "ts_ns"})
    kept = kineto_sql_tables._write_merged(
        con, out, schema.MEMORY_EVENTS,
        kineto_sql_tables._sql_batches(con, select, kineto_sql_tables.in_order(tmp_path, "memory")),
        kineto_sql_tables._Facts("facts", ("op", "step"), tmp_path / "facts_by_id.parquet"), ordered_by="ts_ns")
    in_order = None not in times and times == sorted(t for t in times if t is not None)
    assert kept is in_order and out.exists() is in_order
    if in_order:
        got = pq.read_table(out)
        assert got.column("ts_ns").to_pylist() == times and got.column("op").to_pylist() == ["op0", "op1", "op2", "op3"]


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
        # no cache of the files it opens: the parts are read a few times, never changed, and it grew with them
        assert side.execute("SELECT current_setting('enable_external_file_cache')").fetchall() == [(False,)]
        side.execute("CREATE TABLE mine AS SELECT 1 AS a")
    assert main.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'mine'").fetchall() == [(0,)]
    with kineto_sql_tables.side_connection(main, 0.1, 100 * 10**6) as side:  # never below the floor...
        assert abs(limit(side) - 100 * 10**6) < 10**6
    with kineto_sql_tables.side_connection(con("50MB"), 0.5, 100 * 10**6) as side:  # ...unless the limit is lower
        assert abs(limit(side) - 50 * 10**6) < 10**6


def test_row_groups_hold_about_the_bytes_set_and_every_row_in_order(tmp_path: Path) -> None:
    """Batches of any size make row groups of one size, set by the first batch's bytes per row, within the bounds."""
    arrow_schema = pa.schema([("event_id", pa.int64()), ("name", pa.string())])
    wide = "k" * 588  # 600 bytes a row with the id and the offset: the byte budget, not the row cap, sets the groups
    sizes = [1000, 30_000, 7, 0, 52_000, 3]
    rows = sum(sizes)
    out = tmp_path / "t.parquet"
    with kineto_sql_tables._GroupedWriter(out, arrow_schema) as writer:
        first = 0
        for size in sizes:
            writer.write(pa.record_batch([pa.array(range(first, first + size), pa.int64()), pa.array([wide] * size)],
                                         schema=arrow_schema))
            first += size
    expected = kineto_sql_tables._ROW_GROUP_BYTES // 600
    assert kineto_sql_tables._ROW_GROUP_MIN_ROWS < expected < rows
    meta = pq.ParquetFile(out).metadata
    groups = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    assert sum(groups) == rows and all(g == expected for g in groups[:-1]) and 0 < groups[-1] <= expected
    assert expected < kineto_sql_tables._ROW_GROUP_ROWS  # the bytes decided
    assert pq.read_table(out).column("event_id").to_pylist() == list(range(rows))
    abandoned = tmp_path / "gone.parquet"
    with kineto_sql_tables._GroupedWriter(abandoned, arrow_schema) as writer:
        writer.write(pa.record_batch([pa.array([1], pa.int64()), pa.array(["a"])], schema=arrow_schema))
        writer.abandon()
    assert not abandoned.exists()


def test_the_parts_are_read_in_the_order_of_their_batches(tmp_path: Path) -> None:
    """By DuckDB (the hash join) and by Arrow (the merge) alike, whatever order the folder lists them in."""
    for batch in (10, 2, 1_000_000, 0):
        pq.write_table(pa.table({"event_id": pa.array([batch], pa.int64())}), tmp_path / f"host-{batch:06d}.parquet")
    pq.write_table(pa.table({"event_id": pa.array([-1], pa.int64())}), tmp_path / "host_facts_by_id.parquet")
    con = duckdb.connect(config={"preserve_insertion_order": True})
    relation = kineto_sql_tables.in_order(tmp_path, "host")
    assert [row[0] for row in con.execute(f"SELECT event_id FROM {relation}").fetchall()] == [0, 2, 10, 1_000_000]
    columns = PartColumns(schema.table("host_ops"), {"event_id": "event_id"})
    batches = columns.batches(kineto_sql_tables.part_files(tmp_path, "host"))
    assert [i for batch in batches for i in batch.column("event_id").to_pylist()] == [0, 2, 10, 1_000_000]


@pytest.mark.parametrize("name_bytes", [10, 400])
def test_a_merge_maps_large_buffers_apart_only_where_its_batches_hold_that_much_text(
    name_bytes: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The merge reads with glibc's large buffers mapped apart once a batch's largest text column holds half the
    threshold (kernel names of 400 characters, 4,000 to a part: 1.6 MB), not for short names; either way the rows
    come out whole and in order."""
    rows, parts = 4000, 3
    for n in range(parts):
        ids = range(n * rows, (n + 1) * rows)
        pq.write_table(pa.table({"event_id": pa.array(ids, pa.int64()),
                                 "name": pa.array([f"{i:0{name_bytes}d}" for i in ids], pa.string()),
                                 "ts_ns": pa.array(ids, pa.int64())}), tmp_path / f"host-{n:06d}.parquet")
    batch = pq.read_table(tmp_path / "host-000000.parquet").to_batches()[0]
    assert kineto_sql_tables._largest_text(batch) == sum(len(str(v).encode()) for v in batch.column("name").to_pylist())
    entered: list[bool] = []
    mapped = kineto_sql_tables.large_buffers_mapped

    def spied() -> AbstractContextManager[None]:
        entered.append(True)
        return mapped()

    monkeypatch.setattr(kineto_sql_tables, "large_buffers_mapped", spied)
    con = duckdb.connect()
    con.execute(f"CREATE TABLE facts AS SELECT range AS event_id, 1 AS depth, NULL::BIGINT AS parent_id, "
                f"range // 7 AS step FROM range({rows * parts})")
    out = tmp_path / "host_ops.parquet"
    columns = PartColumns(schema.table("host_ops"), {"event_id": "event_id", "name": "name", "ts_ns": "ts_ns"},
                          {"trace_id": "t", "rank": 0})
    assert kineto_sql_tables._write_merged(
        con, out, schema.table("host_ops"), columns.batches(kineto_sql_tables.part_files(tmp_path, "host")),
        kineto_sql_tables._Facts("facts", FACT_COLUMNS, tmp_path / "host_facts_by_id.parquet"))
    text = rows * name_bytes
    assert entered == ([True] if text >= kineto_sql_tables.GLIBC_MAPPED_THRESHOLD // 2 else []), (text, entered)
    got = pq.read_table(out, columns=["event_id", "name", "step"])
    assert got.column("event_id").to_pylist() == list(range(rows * parts))
    assert got.column("name").to_pylist() == [f"{i:0{name_bytes}d}" for i in range(rows * parts)]
    assert got.column("step").to_pylist() == [i // 7 for i in range(rows * parts)]
