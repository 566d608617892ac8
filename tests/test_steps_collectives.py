"""Step statistics and outliers; collectives across ranks with bandwidth."""

from __future__ import annotations

import pickle
from pathlib import Path

import polars as pl
import pytest

from oracles.kernels import top_kernels
from support import ROOT
from tracelake.analysis import collectives, kernels, steps
from tracelake.warehouse import Warehouse


def test_step_stats_and_outliers() -> None:
    durs = [100, 101, 99, 100, 100, 180, 100]
    frame = pl.DataFrame({"trace_id": ["t"] * 7, "rank": [0] * 7, "step": list(range(7)), "dur_ns": durs})
    stats = steps.step_stats(frame).row(0, named=True)
    assert tuple(steps.step_stats(frame).columns) == steps.STAT_COLUMNS
    assert stats["steps"] == 7 and stats["p50_ns"] == 100 and stats["max_ns"] == 180
    assert stats["cv"] == pytest.approx(pl.Series(durs).std() / pl.Series(durs).mean())
    outliers = steps.step_outliers(frame)
    assert tuple(outliers.columns) == steps.OUTLIER_COLUMNS
    assert outliers["step"].to_list() == [5] and outliers.row(0, named=True)["excess_ns"] == 80


def test_steady_steps_have_no_outliers() -> None:
    frame = pl.DataFrame({"trace_id": ["t"] * 5, "rank": [0] * 5, "step": list(range(5)), "dur_ns": [100] * 5})
    assert steps.step_outliers(frame).height == 0


def test_collective_instances_skew_and_busbw() -> None:
    frame = pl.DataFrame({
        "process_group": ["0"] * 4 + ["0"],
        "seq": [1, 1, 1, 1, 2],
        "collective": ["allreduce"] * 5,
        "rank": [0, 1, 2, 3, 0],
        "ts_ns": [1000, 1100, 1500, 1050, 5000],
        "dur_ns": [2_000_000, 1_900_000, 1_000_000, 1_950_000, 10],
        "message_bytes": [10_000_000] * 5,
    })
    result = collectives.instances(frame)
    assert tuple(result.columns) == collectives.COLUMNS
    assert result.height == 1  # seq 2 was seen on one rank only
    row = result.row(0, named=True)
    assert row["skew_ns"] == 500 and row["last_rank"] == 2 and row["transfer_ns"] == 1_000_000
    assert row["algbw_gbs"] == pytest.approx(10.0)  # 10 MB in 1 ms
    assert row["busbw_gbs"] == pytest.approx(10.0 * 2 * 3 / 4)
    arrivals = collectives.last_arrivals(frame).row(0, named=True)
    assert arrivals == {"rank": 2, "times_last": 1, "collectives": 1, "mean_skew_us": 0.5}


def test_busbw_factors() -> None:
    frame = pl.DataFrame({"c": ["AllReduce", "all_gather", "broadcast", "mystery"], "n": [4, 4, 4, 4]})
    factors = frame.select(collectives.busbw_factor(pl.col("c"), pl.col("n"))).to_series().to_list()
    assert factors == [1.5, 0.75, 1.0, None]


def test_samples(sample_warehouse: Warehouse) -> None:
    con = sample_warehouse.connect()
    frame = con.sql("SELECT * FROM collectives WHERE job = 'ddp_straggler'").pl()
    inst = collectives.instances(frame)
    assert inst.height == 18 and set(inst["ranks"].to_list()) == {4}
    assert set(inst["last_rank"].to_list()) == {2}  # the sample's straggler
    assert (inst["busbw_gbs"] > 0).all()
    arrivals = collectives.last_arrivals(frame)
    assert arrivals["rank"].to_list() == [2] and arrivals["times_last"].to_list() == [18]
    stats = steps.step_stats(con.sql("SELECT * FROM steps WHERE job = 'ddp_straggler'").pl())
    assert stats.height == 4 and set(stats["steps"].to_list()) == {6}


def test_top_kernels_from_stored_stats_match_the_device_ops(sample_warehouse: Warehouse) -> None:
    """One trace's ranking from kernel_stats equals the one computed over its device ops."""
    con = sample_warehouse.connect()
    for (trace_id,) in con.sql("SELECT trace_id FROM traces").fetchall():
        for top in (3, 1000):
            live = top_kernels(con, where="trace_id = ?", params=[trace_id], top=top)
            stats = con.sql("SELECT * FROM kernel_stats WHERE trace_id = ?", params=[trace_id]).pl()
            stored = kernels.top_from_stats(stats, top=top)
            assert stored.height == live.height > 0
            assert stored.drop("share_pct").rows() == live.drop("share_pct").rows()
            assert stored["share_pct"].to_list() == pytest.approx(live["share_pct"].to_list())


def test_bandwidth_by_size_buckets() -> None:
    frame = pl.DataFrame({
        "process_group": ["0"] * 6, "seq": [1, 1, 2, 2, 3, 3], "collective": ["allreduce"] * 6,
        "rank": [0, 1] * 3, "ts_ns": [0, 10, 100, 110, 200, 230],
        "dur_ns": [1_000_000, 900_000, 2_000_000, 2_100_000, 10_000, 10_000],
        "message_bytes": [1 << 20] * 2 + [(1 << 20) + 5] * 2 + [3000] * 2,
    })
    inst = collectives.instances(frame)
    buckets = collectives.bandwidth_by_size(inst)
    assert buckets.select("bucket", "bucket_bytes", "instances").rows() == [("1 KiB", 1024, 1), ("1 MiB", 1 << 20, 2)]
    mib = buckets.row(1, named=True)
    assert mib["min_busbw_gbs"] == pytest.approx(((1 << 20) + 5) / 2_000_000 * 1.0)
    assert mib["total_transfer_ns"] == 900_000 + 2_000_000
    assert collectives.slowest(inst, top=1)["seq"].to_list() == [2]


def test_one_rank_seen_by_several_sources_is_no_straggler() -> None:
    """A rank's trace, Flight Recorder dump and NCCL log each hold its collectives, with clocks apart."""
    rows = [(0, "0", 1, "allreduce", ts) for ts in (1_000, 5_000_000_000, 7_000)]
    rows += [(0, "0", 2, "allreduce", ts) for ts in (2_000, 6_000_000_000)]
    frame = pl.DataFrame(rows, schema={"rank": pl.Int32, "process_group": pl.String, "seq": pl.Int64,
                                       "collective": pl.String, "ts_ns": pl.Int64}, orient="row")
    assert collectives.last_arrivals(frame).is_empty()
    # a second rank makes them instances again, with one arrival per rank: rank 1 at 10 us, after rank 0's 1 us
    two = pl.concat([frame, pl.DataFrame([(1, "0", 1, "allreduce", 10_000)], schema=frame.schema, orient="row")])
    late = collectives.last_arrivals(two)
    assert late.rows() == [(1, 1, 1, 9.0)]


FR_2_11 = ROOT / "sample_traces" / "gpu_h200" / "nccl" / "flight_recorder.pickle"


def test_a_healthy_flight_recorder_dump_whose_status_lags_is_no_hang(tmp_path: Path) -> None:
    """PyTorch 2.11's pg_status said 64 of 192 completed; every entry said completed (a finished run)."""
    dump = pickle.loads(FR_2_11.read_bytes())
    done = max(e["collective_seq_id"] for e in dump["entries"] if e["state"] == "completed")
    assert dump["pg_status"]["0"]["last_completed_collective"] < done  # the lag this test is about
    wh = Warehouse(tmp_path / "wh")
    wh.ingest([FR_2_11], job="fr")
    assert wh.query("SELECT last_completed FROM flight_recorder_status").rows == [(done,)]
    assert not [f for f in wh.analyze(job="fr").findings if f.kind == "hang"]
