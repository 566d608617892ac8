"""The native nesting swept a slice of time at a time (ingest/kineto_nesting.py).

Generated parts, written as the scanner writes them (in file order, which need not be time order),
go through the sliced sweep with slices of a few rows; the host events' depth, parent and step must
be the SQL nesting's (``kineto_sql_facts.nesting_sql``, the reference the native sweep is held to)
and each memory instant's op the one the documented rule names (``kineto_memory_ops.innermost_ops``,
itself held to a brute-force oracle). Every real trace is ingested both ways, sliced and whole.
"""

from __future__ import annotations

import random
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support import real_kineto_files
from tracelake import ingest
from tracelake.ingest import kineto_nesting, kineto_scan, kineto_sql_facts, kineto_sql_tables
from tracelake.ingest.kineto_memory_ops import innermost_ops
from tracelake.ingest.model import ParseOptions

pytestmark = pytest.mark.skipif(not kineto_scan.AVAILABLE, reason="the native Kineto scanner is not built")

HOST = pa.schema([("event_id", pa.int64()), ("cat", pa.string()), ("pid", pa.int64()), ("tid", pa.int64()),
                  ("ts_ns", pa.int64()), ("dur_ns", pa.int64()), ("correlation", pa.int64())])
MEMORY = pa.schema([("event_id", pa.int64()), ("pid", pa.int64()), ("tid", pa.int64()), ("ts_ns", pa.int64())])
STEPS = pa.schema([("step", pa.int64()), ("ts_ns", pa.int64()), ("dur_ns", pa.int64())])


def timeline(rng: random.Random, threads: int) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """Host events (ties, zero lengths, improper overlaps, ``cpu_op`` or not) and memory instants on
    ``threads`` threads; their event ids interleave as in a trace."""
    host, instants = [], []
    pairs = [(rng.choice([1, 2]), rng.randint(1, 9)) for _ in range(threads)]
    for event_id in range(rng.randint(0, 300)):
        pid, tid = rng.choice(pairs)
        if rng.random() < 0.3:
            instants.append({"event_id": event_id, "pid": pid, "tid": tid,
                             "ts_ns": None if rng.random() < 0.03 else rng.randint(0, 80) * rng.choice([1, 10])})
            continue
        host.append({"event_id": event_id, "cat": rng.choice(["cpu_op", "CPU_OP", "cuda_runtime", None]),
                     "pid": pid, "tid": tid, "ts_ns": rng.randint(0, 80) * rng.choice([1, 10]),
                     "dur_ns": rng.choice([0, 0, 1, 5, 20, 100, 600]), "correlation": rng.choice([None, event_id])})
    return host, instants


def write_parts(folder: Path, rows: list[dict[str, object]], schema: pa.Schema, prefix: str, parts: int,
                order: str, rng: random.Random) -> None:
    """``rows`` into ``parts`` files in ``folder`` in an order a trace may have: as drawn, by time, or by time in
    two interleaved stretches (a thread's ops, then its Python functions over the same times)."""
    if order == "time":
        rows = sorted(rows, key=lambda row: (row["ts_ns"] is None, row["ts_ns"] or 0))
    elif order == "two runs":
        first = sorted((r for r in rows if rng.random() < 0.5), key=lambda row: (row["ts_ns"] is None, row["ts_ns"] or 0))
        rows = first + sorted((r for r in rows if r not in first), key=lambda row: (row["ts_ns"] is None, row["ts_ns"] or 0))
    size = -(-len(rows) // parts) if rows else 1
    for n, start in enumerate(range(0, len(rows), size)):
        pq.write_table(pa.Table.from_pylist(rows[start:start + size], schema=schema),
                       folder / f"{prefix}-{n:06d}.parquet", compression="lz4", use_dictionary=False)


def swept(folder: Path, steps: pa.Table, threads: int) -> tuple[list[dict[str, object]], dict[int, object]]:
    """The sliced sweep's nesting (by event id) and each instant's op id."""
    kineto_nesting.sweep(duckdb.connect(), folder / "nesting.parquet", steps, threads)
    nested = pq.read_table(folder / "nesting.parquet").select(["event_id", "depth", "step", "parent_id"])
    ops = folder / "mem_op_ids.parquet"
    found = dict(zip(*pq.read_table(ops).to_pydict().values(), strict=True)) if ops.exists() else {}
    return sorted(nested.to_pylist(), key=lambda row: row["event_id"]), found


def reference(host: list[dict[str, object]], instants: list[dict[str, object]], steps: pa.Table
              ) -> tuple[list[dict[str, object]], dict[int, object]]:
    """The SQL nesting of the host events and the documented op of each instant with a thread and a time."""
    con = duckdb.connect()
    con.register("host_n", pa.Table.from_pylist(host, schema=HOST).drop_columns(["cat"]))
    con.register("steps", steps)
    kineto_sql_facts.step_spans(con)
    kineto_sql_facts.nesting_sql(con)
    nested = con.sql("SELECT event_id, depth, step, parent_id FROM host_d ORDER BY event_id").to_arrow_table()
    ops = pa.Table.from_pylist([{**row, "name": str(row["event_id"])} for row in host
                                if str(row["cat"]).lower() == "cpu_op"],
                               schema=HOST.append(pa.field("name", pa.string()))).drop_columns(["cat", "correlation"])
    timed = pa.Table.from_pylist([row for row in instants if row["ts_ns"] is not None], schema=MEMORY)
    found = innermost_ops(ops, timed)
    return nested.to_pylist(), {i: None if op is None else int(op) for i, op in
                                zip(found.column("event_id").to_pylist(), found.column("op").to_pylist(), strict=True)}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), threads=st.integers(1, 4), parts=st.integers(1, 6),
       order=st.sampled_from(["as drawn", "time", "two runs"]), slice_rows=st.integers(1, 60),
       held_rows=st.sampled_from([0, 5, 1 << 40]))
def test_the_sliced_sweep_is_the_sql_nesting(seed: int, threads: int, parts: int, order: str, slice_rows: int,
                                             held_rows: int, tmp_path_factory: pytest.TempPathFactory,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The nesting, each instant's op, and the host events' facts in event-id order (where the sweep kept that
    order: always when sliced, unless more facts than ``held_rows`` had to wait for later slices)."""
    rng = random.Random(seed)
    folder = tmp_path_factory.mktemp("parts")
    host, instants = timeline(rng, threads)
    write_parts(folder, host, HOST, "host", parts, order, rng)
    if instants:
        write_parts(folder, instants, MEMORY, "memory", parts, order, rng)
    starts = sorted(rng.choice(range(0, 800, 7)) for _ in range(rng.randint(0, 6)))
    steps = pa.Table.from_pylist([{"step": n, "ts_ns": t, "dur_ns": rng.randint(1, 150)} for n, t in enumerate(starts)],
                                 schema=STEPS)
    monkeypatch.setattr(kineto_nesting, "SLICE_ROWS", slice_rows)
    monkeypatch.setattr(kineto_nesting, "HELD_ROWS", held_rows)
    cut = kineto_nesting.slices(folder, threads)
    if len(host) + len(instants) > 2 * slice_rows and host:
        assert len(cut) > 1  # the generated parts do get sliced
    nested, found = swept(folder, steps, threads)
    expected_nested, expected_ops = reference(host, instants, steps)
    assert nested == expected_nested
    assert found == expected_ops
    by_id = kineto_sql_tables.facts_file(folder, "host")
    if by_id.exists():  # every host event's facts, in event-id order: the SQL nesting's, sorted by id
        assert len(cut) > 1
        assert pq.read_table(by_id).to_pylist() == [
            {"event_id": row["event_id"], "depth": row["depth"], "parent_id": row["parent_id"], "step": row["step"]}
            for row in expected_nested]
    elif held_rows == 1 << 40:
        assert len(cut) == 1  # nothing held back is ever too much: every sliced sweep writes them
    assert any(row["parent_id"] is not None for row in expected_nested) or len(host) < 30


def test_slices_cover_all_times_and_read_only_the_parts_they_need(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Parts in time order: each slice lists the parts its times reach and no other; the first and last slices
    are open, so that no time is left out."""
    rows = [{"event_id": i, "cat": "cpu_op", "pid": 1, "tid": 1, "ts_ns": 10 * i, "dur_ns": 5, "correlation": None}
            for i in range(1000)]
    write_parts(tmp_path, rows, HOST, "host", 10, "time", random.Random(0))
    monkeypatch.setattr(kineto_nesting, "SLICE_ROWS", 250)
    cut = kineto_nesting.slices(tmp_path, 1)
    assert len(cut) == 4
    assert cut[0].start is None and cut[-1].stop is None
    assert all(a.stop == b.start for a, b in zip(cut, cut[1:]))
    for piece in cut:
        lows = [pq.read_table(path)["ts_ns"].to_pylist() for path in piece.host]
        assert all((piece.start is None or max(ts) >= piece.start) and (piece.stop is None or min(ts) < piece.stop)
                   for ts in lows)
        assert 2 <= len(piece.host) <= 4  # 100 rows a part, about 250 a slice


@pytest.mark.parametrize("case", ["no statistics", "null time", "many threads"])
def test_where_slices_do_not_apply_the_rows_are_sorted_whole(case: str, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [{"event_id": i, "cat": "cpu_op", "pid": 1, "tid": 1, "ts_ns": None if case == "null time" and i == 7
             else i, "dur_ns": 1, "correlation": None} for i in range(100)]
    pq.write_table(pa.Table.from_pylist(rows, schema=HOST), tmp_path / "host-000000.parquet",
                   write_statistics=case != "no statistics")
    monkeypatch.setattr(kineto_nesting, "SLICE_ROWS", 10)
    threads = kineto_nesting.MAX_THREADS + 1 if case == "many threads" else 1
    assert [(s.start, s.stop) for s in kineto_nesting.slices(tmp_path, threads)] == [(None, None)]


def test_instants_without_times_are_left_out_of_the_slices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    host = [{"event_id": i, "cat": "cpu_op", "pid": 1, "tid": 1, "ts_ns": 10 * i, "dur_ns": 15, "correlation": None}
            for i in range(50)]
    write_parts(tmp_path, host, HOST, "host", 5, "time", random.Random(0))
    untimed = [{"event_id": 100 + i, "pid": 1, "tid": 1, "ts_ns": None} for i in range(5)]
    timed = [{"event_id": 200 + i, "pid": 1, "tid": 1, "ts_ns": 100 * i + 3} for i in range(5)]
    pq.write_table(pa.Table.from_pylist(untimed, schema=MEMORY), tmp_path / "memory-000000.parquet")
    pq.write_table(pa.Table.from_pylist(timed, schema=MEMORY), tmp_path / "memory-000001.parquet")
    monkeypatch.setattr(kineto_nesting, "SLICE_ROWS", 12)
    assert len(kineto_nesting.slices(tmp_path, 1)) > 1
    empty = pa.Table.from_pylist([], schema=STEPS)
    nested, found = swept(tmp_path, empty, 1)
    assert nested == reference(host, untimed + timed, empty)[0]
    assert found == {200 + i: 10 * i for i in range(5)}  # the later of the ops at 100 i - 10 and 100 i (15 long)


@pytest.mark.slow
@pytest.mark.parametrize("path", real_kineto_files(), ids=lambda p: p.name)
def test_every_real_trace_nests_alike_sliced_and_whole(path: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Slices of 500 rows against one sort of the whole: the same host ops and memory instants, to the value."""
    tables = {}
    for rows in (1 << 62, 500):
        monkeypatch.setattr(kineto_nesting, "SLICE_ROWS", rows)
        staging = tmp_path / str(rows)
        staging.mkdir()
        ingest.parse_into(path, staging, ParseOptions(source_name=path.name, trace_id="t", kineto_engine="native"))
        tables[rows] = {name: pq.read_table(staging / f"{name}.parquet") for name in ("host_ops", "memory_events")
                        if (staging / f"{name}.parquet").exists()}
        by_id = kineto_sql_tables.facts_file(staging / "parts", "host")
        if rows == 500 and len(kineto_nesting.slices(staging / "parts", 1)) > 1:  # the merge takes the sweep's facts
            ids = pq.read_table(by_id, columns=["event_id"])["event_id"].to_numpy()
            assert len(ids) == tables[rows]["host_ops"].num_rows and bool((ids[1:] > ids[:-1]).all())
    assert tables[500].keys() == tables[1 << 62].keys()
    for name, whole in tables[1 << 62].items():
        assert tables[500][name].equals(whole), name
    assert tables[500]["host_ops"].num_rows > 0
