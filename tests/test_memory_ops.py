"""The op of each Kineto memory instant (ingest/kineto_memory_ops.py) against a brute-force oracle.

The oracle reads the documented rule directly: of the ``cpu_op`` events on the instant's thread with
start <= t < end (or t = start for an op of zero length), the last to start, then the first to end, then the
larger event id. Generated ops nest, overlap improperly, touch, share starts and have zero length.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracelake.ingest import kineto_scan
from tracelake.ingest.kineto_memory_ops import innermost_ops

TIMES = st.integers(0, 40)


def oracle(ops: list[tuple[int, int, int, int, int]], instant: tuple[int, int, int]) -> str | None:
    pid, tid, t = instant
    holding = [(start, -(start + max(dur, 0)), event_id) for event_id, p, q, start, dur in ops
               if (p, q) == (pid, tid) and start <= t
               and (t < start + max(dur, 0) or (max(dur, 0) == 0 and start == t))]
    return f"op{max(holding)[2]}" if holding else None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 2), st.integers(1, 2), TIMES, st.integers(-2, 15)), max_size=40),
       st.lists(st.tuples(st.integers(1, 2), st.integers(1, 2), TIMES), max_size=30))
def test_innermost_op_is_the_documented_one(raw_ops: list[tuple[int, int, int, int]],
                                             raw_instants: list[tuple[int, int, int]]) -> None:
    ops = [(1000 + i, pid, tid, start, dur) for i, (pid, tid, start, dur) in enumerate(raw_ops)]
    ops_table = pa.table({"event_id": [o[0] for o in ops], "pid": [o[1] for o in ops], "tid": [o[2] for o in ops],
                          "ts_ns": [o[3] for o in ops], "dur_ns": [o[4] for o in ops],
                          "name": [f"op{o[0]}" for o in ops]},
                         schema=pa.schema([("event_id", pa.int64()), ("pid", pa.int64()), ("tid", pa.int64()),
                                           ("ts_ns", pa.int64()), ("dur_ns", pa.int64()), ("name", pa.string())]))
    instants = pa.table({"event_id": pa.array(range(len(raw_instants)), pa.int64()),
                         "pid": pa.array([i[0] for i in raw_instants], pa.int64()),
                         "tid": pa.array([i[1] for i in raw_instants], pa.int64()),
                         "ts_ns": pa.array([i[2] for i in raw_instants], pa.int64())})
    found = innermost_ops(ops_table, instants)
    assert found.column("event_id").to_pylist() == list(range(len(raw_instants)))
    assert found.column("op").to_pylist() == [oracle(ops, instant) for instant in raw_instants]


def test_large_thread_ids_and_null_lengths() -> None:
    big = (1 << 40) + 7  # beyond 32 bits: the pairs are told apart without the packed key
    ops = pa.table({"event_id": pa.array([1, 2], pa.int64()), "pid": pa.array([big, big], pa.int64()),
                    "tid": pa.array([3, 3], pa.int64()), "ts_ns": pa.array([10, 12], pa.int64()),
                    "dur_ns": pa.array([10, None], pa.int64()), "name": ["outer", "point"]})
    instants = pa.table({"event_id": pa.array([7, 8, 9], pa.int64()), "pid": pa.array([big, big, 1], pa.int64()),
                         "tid": pa.array([3, 3, 3], pa.int64()), "ts_ns": pa.array([12, 13, 12], pa.int64())})
    assert innermost_ops(ops, instants).column("op").to_pylist() == ["point", "outer", None]


@pytest.mark.skipif(not kineto_scan.AVAILABLE, reason="the native Kineto scanner is not built")
@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 2), st.integers(1, 2), TIMES, st.integers(-2, 15), st.booleans()),
                max_size=40),
       st.lists(st.tuples(st.integers(1, 2), st.integers(1, 2), TIMES), max_size=30),
       st.integers(1, 50))
def test_the_native_sweep_finds_the_documented_op(raw_events: list[tuple[int, int, int, int, bool]],
                                                   raw_instants: list[tuple[int, int, int]], batch_rows: int) -> None:
    """Instants riding the host nesting sweep (as ingest sorts them, in batches of any size) get the oracle's op;
    host events other than ``cpu_op`` are never an instant's op, and the host events' nesting is unchanged."""
    events = [(1000 + i, pid, tid, start, dur, is_op) for i, (pid, tid, start, dur, is_op) in enumerate(raw_events)]
    ops = [(e, p, t, s, d) for e, p, t, s, d, is_op in events if is_op]
    rows = [{"event_id": e, "pid": p, "tid": t, "ts_ns": s, "dur_ns": d, "correlation": None, "kind": int(is_op)}
            for e, p, t, s, d, is_op in events]
    rows += [{"event_id": i, "pid": p, "tid": t, "ts_ns": s, "dur_ns": None, "correlation": None, "kind": 2}
             for i, (p, t, s) in enumerate(raw_instants)]
    # ORDER BY pid, tid, ts_ns, kind = 2, dur_ns DESC, event_id (kineto_nesting._query)
    rows.sort(key=lambda r: (r["pid"], r["tid"], r["ts_ns"], r["kind"] == 2, -(r["dur_ns"] or 0), r["event_id"]))
    schema = pa.schema([("event_id", pa.int64()), ("pid", pa.int64()), ("tid", pa.int64()), ("ts_ns", pa.int64()),
                        ("dur_ns", pa.int64()), ("correlation", pa.int64()), ("kind", pa.uint8())])
    steps = pa.table({"step": pa.array([], pa.int64()), "ts_ns": pa.array([], pa.int64()),
                      "dur_ns": pa.array([], pa.int64())})
    with_instants, alone = kineto_scan.HostNesting(steps), kineto_scan.HostNesting(steps)
    found: dict[int, int | None] = {}
    nested, nested_alone = [], []
    for start in range(0, len(rows), batch_rows):
        batch = pa.RecordBatch.from_pylist(rows[start:start + batch_rows], schema=schema)
        host, instants = with_instants.add_with_instants(batch)
        nested += host.to_pylist()
        found.update(zip(instants.column("event_id").to_pylist(), instants.column("op_id").to_pylist(), strict=True))
        host_rows = batch.filter(pa.compute.not_equal(batch.column("kind"), 2)).drop_columns(["kind"])
        nested_alone += alone.add(host_rows).to_pylist()
    expected = {i: oracle(ops, instant) for i, instant in enumerate(raw_instants)}
    assert {i: None if op is None else f"op{op}" for i, op in found.items()} == expected
    assert nested == nested_alone
