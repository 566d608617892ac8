"""Idle breakdown and launch statistics on hand-built timelines, and on the samples."""

from __future__ import annotations

import random
from pathlib import Path

import duckdb
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oracles.idle import idle_breakdown, idle_sql, random_timeline
from oracles.launches import launch_stats, launch_stats_sql, queue_lengths, queue_lengths_sql
from tracelake.analysis.idle import COLUMNS as IDLE_COLUMNS
from tracelake.analysis.launches import COLUMNS as LAUNCH_COLUMNS

US = 1000


def _con(device: list[tuple], host: list[tuple]) -> duckdb.DuckDBPyConnection:  # type: ignore[type-arg]
    con = duckdb.connect()
    dev = pl.DataFrame(device, orient="row", schema={
        "trace_id": pl.String, "rank": pl.Int32, "stream": pl.Int64, "kind": pl.String, "category": pl.String,
        "ts_ns": pl.Int64, "dur_ns": pl.Int64, "correlation": pl.Int64})
    hst = pl.DataFrame(host, orient="row", schema={
        "trace_id": pl.String, "correlation": pl.Int64, "ts_ns": pl.Int64, "dur_ns": pl.Int64}).with_columns(
        pl.lit("cudaLaunchKernel").alias("name"))
    con.register("device_ops", dev.to_arrow())
    con.register("host_ops", hst.to_arrow())
    return con


def _stored(device: list[tuple], host: list[tuple], table: str, folder: Path) -> pl.DataFrame:  # type: ignore[type-arg]
    """``table`` as ingest stores it for these ops: ``warehouse/derived.py`` over Parquet files of them."""
    import pyarrow.parquet as pq

    from tracelake.contracts import schema
    from tracelake.warehouse.derived import INPUTS, write_derived

    con = _con(device, host)
    frames = {name: con.table(name).pl() for name in ("device_ops", "host_ops")}
    folder.mkdir()
    for name in INPUTS:
        tbl = schema.table(name)
        arrow = tbl.arrow_schema.empty_table() if name not in frames else frames[name].select(
            pl.col(c) if c in frames[name].columns else pl.lit(None).alias(c) for c in tbl.column_names).to_arrow()
        pq.write_table(arrow.cast(tbl.arrow_schema), folder / f"{name}.parquet")
    write_derived(folder, folder)
    return pl.read_parquet(folder / f"{table}.parquet")


def test_idle_causes(tmp_path: Path) -> None:
    device = [
        ("t", 0, 7, "kernel", "compute", 0, 100 * US, 1),        # first op: no gap before it
        ("t", 0, 7, "kernel", "compute", 110 * US, 10 * US, 2),  # 10 us gap, launched early: kernel_wait
        ("t", 0, 7, "kernel", "compute", 200 * US, 10 * US, 3),  # 80 us gap, launched late: host_wait
        ("t", 0, 7, "kernel", "compute", 400 * US, 10 * US, 4),  # 190 us gap, launched early: other
        ("t", 0, 7, "sync", "sync", 500 * US, 10 * US, None),    # syncs are not ops here
        ("t", 0, 9, "kernel", "compute", 0, 5 * US, 5),          # another stream, one op
    ]
    host = [("t", 1, 0, 1 * US), ("t", 2, 50 * US, 5 * US), ("t", 3, 150 * US, 5 * US), ("t", 4, 60 * US, 5 * US),
            ("t", 5, 0, 1 * US)]
    for result in (_stored(device, host, "stream_idle", tmp_path / "stored"), idle_breakdown(_con(device, host))):
        assert tuple(result.columns) == IDLE_COLUMNS
        rows = {r["stream"]: r for r in result.to_dicts()}
        assert rows[7] == rows[7] | {"gaps": 3, "idle_ns": 280 * US, "host_wait_ns": 80 * US,
                                     "kernel_wait_ns": 10 * US, "other_ns": 190 * US}
        assert rows[9]["gaps"] == 0 and rows[9]["idle_ns"] == 0


def test_overlapping_ops_on_a_stream_leave_no_gap(tmp_path: Path) -> None:
    device = [("t", 0, 7, "kernel", "compute", 0, 100, None), ("t", 0, 7, "kernel", "compute", 10, 20, None),
              ("t", 0, 7, "kernel", "compute", 100, 10, None)]
    for result in (_stored(device, [], "stream_idle", tmp_path / "stored"), idle_breakdown(_con(device, []))):
        assert result.row(0, named=True)["idle_ns"] == 0


def test_launch_stats(tmp_path: Path) -> None:
    device = [
        ("t", 0, 7, "kernel", "compute", 20 * US, 2 * US, 1),    # call 10-15 us: delay 5 us, shorter than call
        ("t", 0, 7, "kernel", "compute", 30 * US, 50 * US, 2),   # call 16-20 us: delay 10 us, longer than call
        ("t", 0, 7, "memcpy", "memory", 90 * US, 5 * US, 3),     # not a kernel
    ]
    host = [("t", 1, 10 * US, 5 * US), ("t", 2, 16 * US, 4 * US), ("t", 3, 80 * US, 1 * US)]
    for result in (_stored(device, host, "launch_stats", tmp_path / "stored"), launch_stats(_con(device, host))):
        row = result.row(0, named=True)
        assert tuple(result.columns) == LAUNCH_COLUMNS
        assert row["launches"] == 2
        assert row["mean_delay_ns"] == pytest.approx(7.5 * US) and row["max_delay_ns"] == 10 * US
        assert row["shorter_than_launch"] == 1 and row["shorter_than_launch_pct"] == pytest.approx(50.0)
        assert row["launch_overhead_ns"] == 5 * US


def test_launch_bound_sample(sample_warehouse) -> None:  # type: ignore[no-untyped-def]
    con = sample_warehouse.connect()
    stored = con.sql("SELECT * FROM launch_stats WHERE job = 'launch_bound' ORDER BY trace_id, rank").pl()
    for result in (stored, launch_stats(con, where="d.job = ?", params=["launch_bound"])):
        stats = result.row(0, named=True)
        # The sample's ground truth: 1200 of its 1206 kernels are shorter than their launch.
        assert stats["launches"] == 1206 and stats["shorter_than_launch"] == 1200
    stored = con.sql("SELECT * FROM stream_idle WHERE job = 'launch_bound' ORDER BY trace_id, rank, stream").pl()
    for idle in (stored, idle_breakdown(con, where="d.job = ?", params=["launch_bound"])):
        compute = idle.filter(pl.col("stream") == 7).row(0, named=True)
        assert compute["host_wait_ns"] > 0.8 * compute["idle_ns"], compute  # launch-bound: the CPU is late


def test_queue_lengths(tmp_path: Path) -> None:
    from tracelake.analysis.launches import QUEUE_COLUMNS

    # Three launches at 0, 1, 2 us; the kernels start at 5, 6, 7 us: the queue reaches 3.
    device = [("t", 0, 7, "kernel", "compute", (5 + i) * US, 1 * US, i + 1) for i in range(3)]
    host = [("t", i + 1, i * US, 1) for i in range(3)]
    for result in (_stored(device, host, "stream_queues", tmp_path / "stored"), queue_lengths(_con(device, host))):
        assert tuple(result.columns) == QUEUE_COLUMNS
        row = result.row(0, named=True)
        assert row["launches"] == 3 and row["max_queue"] == 3
        # depth 1 for 1 us, 2 for 1 us, 3 for 3 us, 2 for 1 us, 1 for 1 us over 7 us
        assert row["mean_queue"] == pytest.approx((1 + 2 + 9 + 2 + 1) / 7)


def test_launch_bound_queue_stays_short(sample_warehouse) -> None:  # type: ignore[no-untyped-def]
    con = sample_warehouse.connect()

    def stored(job: str) -> pl.DataFrame:
        return con.sql("SELECT * FROM stream_queues WHERE job = ? ORDER BY trace_id, rank, stream", params=[job]).pl()

    for queues in (stored, lambda job: queue_lengths(con, where="d.job = ?", params=[job])):
        bound = queues("launch_bound").filter(pl.col("stream") == 7)
        ddp = queues("ddp_straggler").filter(pl.col("stream") == 7)
        # Launch-bound: the host barely gets ahead of the device; DDP: the host runs far ahead.
        assert bound.row(0, named=True)["mean_queue"] < 1
        assert ddp["mean_queue"].min() > 5


@settings(max_examples=25, suppress_health_check=[HealthCheck.too_slow])
@given(rng=st.randoms())
def test_stored_idle_equals_the_sql_on_random_streams(rng: random.Random) -> None:
    """idle_frame (what ingest stores) and idle_sql (the oracle) agree."""
    from tracelake.analysis.idle import idle_frame

    n = rng.randint(1, 30)
    device = pl.DataFrame({
        "trace_id": ["t"] * n, "rank": [0] * n, "stream": [rng.choice([7, 8]) for _ in range(n)],
        "category": [rng.choice(["compute", "communication", "sync"]) for _ in range(n)],
        "ts_ns": [rng.randint(0, 500) * 100 for _ in range(n)],
        "dur_ns": [rng.randint(0, 300) * 100 for _ in range(n)],
        "correlation": [rng.choice([None, *range(10)]) for _ in range(n)],
    }, schema={"trace_id": pl.String, "rank": pl.Int32, "stream": pl.Int64, "category": pl.String,
               "ts_ns": pl.Int64, "dur_ns": pl.Int64, "correlation": pl.Int64})
    host = pl.DataFrame({"trace_id": ["t"] * 10, "correlation": list(range(10)),
                         "ts_ns": [rng.randint(0, 500) * 100 for _ in range(10)]},
                        schema={"trace_id": pl.String, "correlation": pl.Int64, "ts_ns": pl.Int64})
    con = duckdb.connect()
    con.register("d", device.to_arrow())
    con.register("h", host.to_arrow())
    expected = con.sql(idle_sql("d", "h")).pl()
    launches = host.group_by("trace_id", "correlation").agg(pl.col("ts_ns").min().alias("launch_ns"))
    got = idle_frame(device, launches)
    assert got.rows() == expected.rows()


@settings(max_examples=30, suppress_health_check=[HealthCheck.too_slow])
@given(rng=st.randoms(), many=st.booleans())
def test_stored_idle_equals_the_sql_on_many_streams_ranks_and_ties(rng: random.Random, many: bool) -> None:
    """idle_frame agrees with the SQL on one trace and rank and on several."""
    from tracelake.analysis.idle import idle_frame

    device, host = random_timeline(rng, rng.randint(1, 50), streams=[3, 7, 2**40, -1], many=many)
    con = duckdb.connect()
    con.register("d", device.to_arrow())
    con.register("h", host.to_arrow())
    expected = con.sql(idle_sql("d", "h")).pl()
    launches = host.group_by("trace_id", "correlation").agg(pl.col("ts_ns").min().alias("launch_ns"))
    got = idle_frame(device, launches)
    assert got.rows() == expected.rows()


@settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow])
@given(rng=st.randoms(), wide=st.booleans(), spilled=st.booleans())
def test_launch_parts_in_windows_equal_the_sql_on_random_timelines(rng: random.Random, wide: bool,
                                                                   spilled: bool) -> None:
    """LaunchParts (what ingest stores), fed a rank's ops in random pieces, equals launch_stats and queue_lengths.

    The timelines have ties, zero durations, launches after the op's start, null streams, ops no host
    call launched, and host ids carried by several events (the call is the first by start, then duration).
    ``wide``: times in steps of 0.1 s, so delays and waits pass 2**31 ns (the logs in memory keep them as int32
    only where a piece's all fit). ``spilled``: its values kept on disk (the warehouse's logs), in runs of 1-4 values
    merged a block of 1-3 at a time, as ingest keeps them.
    """
    import tempfile
    from pathlib import Path

    import numpy as np

    from tracelake.warehouse.spill_log import SpillLog

    folder = tempfile.TemporaryDirectory()
    made = iter(range(1000))
    run, block = rng.randint(1, 4), rng.randint(1, 3)

    def logs() -> SpillLog:
        return SpillLog(Path(folder.name) / f"{next(made)}.i64", run=run, budget=8, min_block=block)

    from tracelake.analysis.launches import GRAPH_CALL, LaunchParts, launch_calls, shared_correlations

    n, calls = rng.randint(1, 60), rng.randint(1, 12)
    unit = 10**8 if wide else 100
    device = pl.DataFrame({
        "trace_id": ["t"] * n, "rank": [2] * n, "stream": [rng.choice([None, 3, 7]) for _ in range(n)],
        "kind": [rng.choice(["kernel", "kernel", "memcpy", "sync"]) for _ in range(n)],
        "category": [rng.choice(["compute", "memory", "communication", "sync"]) for _ in range(n)],
        "ts_ns": [rng.randint(0, 30) * unit for _ in range(n)],
        "dur_ns": [rng.choice([0, unit, rng.randint(1, 20) * unit]) for _ in range(n)],
        "correlation": [rng.choice([None, *range(calls + 3)]) for _ in range(n)],
        "graph_id": [None] * n,
    }, schema={"trace_id": pl.String, "rank": pl.Int32, "stream": pl.Int64, "kind": pl.String,
               "category": pl.String, "ts_ns": pl.Int64, "dur_ns": pl.Int64, "correlation": pl.Int64,
               "graph_id": pl.Int64})
    events = [(rng.randrange(calls), rng.randint(0, 30) * unit, rng.choice([None, 0, rng.randint(1, 9) * unit]))
              for _ in range(calls + rng.randint(0, 4))]
    host = pl.DataFrame({"trace_id": ["t"] * len(events), "correlation": [e[0] for e in events],
                         "ts_ns": [e[1] for e in events], "dur_ns": [e[2] for e in events],
                         "name": [rng.choice(["cudaLaunchKernel", "cudaLaunchKernel", "cudaGraphLaunch_v10000"])
                                  for _ in events]},
                        schema={"trace_id": pl.String, "correlation": pl.Int64, "ts_ns": pl.Int64,
                                "dur_ns": pl.Int64, "name": pl.String})
    con = duckdb.connect()
    con.register("d", device.to_arrow())
    con.register("h", host.to_arrow())
    keys, starts, durations, graph = launch_calls(
        *(host[c].fill_null(0).to_numpy().astype(np.int64) for c in ("correlation", "ts_ns", "dur_ns")),
        host["name"].str.contains(GRAPH_CALL).to_numpy())
    kernels = device.filter((pl.col("kind") == "kernel") & pl.col("correlation").is_not_null())
    graph |= np.isin(keys, shared_correlations(kernels["correlation"].to_numpy()))
    found = {int(k): (int(s), int(d), bool(g)) for k, s, d, g in zip(keys, starts, durations, graph, strict=True)}
    ops = device.with_columns(
        pl.col("correlation").map_elements(lambda c: found.get(c, (None, None))[0], return_dtype=pl.Int64)
        .alias("launch_ns"),
        pl.col("correlation").map_elements(lambda c: found.get(c, (None, None))[1], return_dtype=pl.Int64)
        .alias("call_ns"),
        pl.col("correlation").map_elements(lambda c: found.get(c, (None, None, None))[2],
                                           return_dtype=pl.Boolean).alias("graph"))
    parts = LaunchParts(logs) if spilled else LaunchParts()
    ops = ops.sample(fraction=1.0, shuffle=True, seed=rng.randrange(2**32))
    cuts = sorted(rng.sample(range(n + 1), min(3, n + 1)))
    for low, high in zip([0, *cuts], [*cuts, n], strict=True):
        parts.add(ops[low:high])
    stats = con.sql(launch_stats_sql("d", "h")).pl()
    got = parts.stats("t", 2)
    assert got.height == stats.height
    if stats.height:
        assert got.row(0) == stats.cast(got.schema).row(0)  # type: ignore[arg-type]
    queues = con.sql(queue_lengths_sql("d", "h")).pl()
    got_queues = parts.queues("t", 2)
    assert got_queues.rows() == queues.cast(got_queues.schema).rows()  # type: ignore[arg-type]
    # made once (the logs let go): asked again, the same rows; ops added after them are refused, not dropped
    assert parts.queues("t", 2).rows() == got_queues.rows() and parts._streams == {}
    assert parts.stats("t", 2).rows() == got.rows()
    with pytest.raises(ValueError, match="after the queues"):
        parts.add(ops)
    assert not list(Path(folder.name).iterdir())  # each spilled log's file gone once read back
    folder.cleanup()


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(-5, 5), st.integers(0, 3), st.booleans()), max_size=40),
       st.sampled_from(["as drawn", "distinct", "distinct and sorted"]))
def test_launch_calls_pick_each_ids_first_call_as_a_loop_does(
    events: list[tuple[int, int, int, bool]], shape: str,
) -> None:
    """Each correlation id's call is its first event by start, then the shorter; its graph flag is any of its
    events' (ids repeated or not, in order or not), as a plain loop over the events finds them."""
    import numpy as np

    from tracelake.analysis.launches import launch_calls

    if shape != "as drawn":
        events = list({e[0]: e for e in events}.values())
        events = sorted(events) if shape == "distinct and sorted" else events
    expected: dict[int, tuple[int, int, bool]] = {}
    for correlation, ts, dur, graph in events:
        best = expected.get(correlation)
        if best is None or (ts, dur) < best[:2]:
            expected[correlation] = (ts, dur, graph or (best is not None and best[2]))
        else:
            expected[correlation] = (*best[:2], best[2] or graph)
    columns = [np.array([e[i] for e in events], dtype=np.int64) for i in range(3)]
    ids, starts, durations, graph = launch_calls(*columns, np.array([e[3] for e in events], dtype=bool))
    assert ids.tolist() == sorted(expected)
    assert [(int(s), int(d), bool(g)) for s, d, g in zip(starts, durations, graph, strict=True)] == \
        [expected[k] for k in sorted(expected)]


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_the_deepest_queue_equals_a_count_at_every_launch(data: st.DataObject) -> None:
    """``deepest_queue`` (of the launches and the ends, each sorted), in chunks of any lengths drawn apart for the
    two (empty ones too), against counting at each launch time the ops launched by then and not yet ended by then
    (ties included), one op at a time."""
    import numpy as np

    from tracelake.analysis.sorted_values import deepest_queue

    ops = data.draw(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 12)), min_size=1, max_size=50))
    launch = np.array([t for t, _ in ops], dtype=np.int64)
    end = np.array([t + wait for t, wait in ops], dtype=np.int64)
    expected = max(sum(1 for lo, hi in zip(launch, end) if lo <= t and not hi <= t) for t in launch)

    def chunked(values: np.ndarray) -> list[np.ndarray]:
        cuts = sorted(data.draw(st.lists(st.integers(0, len(values)), max_size=8)))
        return [values[a:b] for a, b in zip([0, *cuts], [*cuts, len(values)], strict=True)]

    assert deepest_queue(chunked(np.sort(launch)), chunked(np.sort(end))) == expected
