"""Step statistics and outliers; collectives across ranks with bandwidth."""

from __future__ import annotations

import duckdb
import polars as pl
import pytest

from tracelake.analysis import collectives, steps


def _con(name: str, frame: pl.DataFrame) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.register(name, frame.to_arrow())
    return con


def test_step_stats_and_outliers() -> None:
    durs = [100, 101, 99, 100, 100, 180, 100]
    frame = pl.DataFrame({"trace_id": ["t"] * 7, "rank": [0] * 7, "step": list(range(7)), "dur_ns": durs})
    con = _con("steps", frame)
    stats = steps.step_stats(con).row(0, named=True)
    assert tuple(steps.step_stats(con).columns) == steps.STAT_COLUMNS
    assert stats["steps"] == 7 and stats["p50_ns"] == 100 and stats["max_ns"] == 180
    assert stats["cv"] == pytest.approx(pl.Series(durs).std() / pl.Series(durs).mean())
    outliers = steps.step_outliers(con)
    assert tuple(outliers.columns) == steps.OUTLIER_COLUMNS
    assert outliers["step"].to_list() == [5] and outliers.row(0, named=True)["excess_ns"] == 80


def test_steady_steps_have_no_outliers() -> None:
    frame = pl.DataFrame({"trace_id": ["t"] * 5, "rank": [0] * 5, "step": list(range(5)), "dur_ns": [100] * 5})
    assert steps.step_outliers(_con("steps", frame)).height == 0


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
    result = collectives.instances(_con("collectives", frame))
    assert tuple(result.columns) == collectives.COLUMNS
    assert result.height == 1  # seq 2 was seen on one rank only
    row = result.row(0, named=True)
    assert row["skew_ns"] == 500 and row["last_rank"] == 2 and row["transfer_ns"] == 1_000_000
    assert row["algbw_gbs"] == pytest.approx(10.0)  # 10 MB in 1 ms
    assert row["busbw_gbs"] == pytest.approx(10.0 * 2 * 3 / 4)


def test_samples(sample_warehouse) -> None:  # type: ignore[no-untyped-def]
    con = sample_warehouse.connect()
    inst = collectives.instances(con, where="job = ?", params=["ddp_straggler"])
    assert inst.height == 18 and set(inst["ranks"].to_list()) == {4}
    assert set(inst["last_rank"].to_list()) == {2}  # the sample's straggler
    assert (inst["busbw_gbs"] > 0).all()
    stats = steps.step_stats(con, where="job = ?", params=["ddp_straggler"])
    assert stats.height == 4 and set(stats["steps"].to_list()) == {6}
