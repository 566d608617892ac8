"""Analyses stored at ingest equal the same analyses computed at query time."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from tracelake.analysis.idle import idle_breakdown
from tracelake.analysis.launches import launch_stats, queue_lengths
from tracelake.warehouse import Warehouse


def _rows(frame: pl.DataFrame, columns: list[str]) -> list[tuple]:  # type: ignore[type-arg]
    return sorted(frame.select(columns).rows())


def test_stored_idle_and_launches_match_query_time(sample_warehouse: Warehouse) -> None:
    con = sample_warehouse.connect()
    stored_idle = con.sql("SELECT * EXCLUDE (job) FROM stream_idle").pl()
    live_idle = idle_breakdown(con)
    columns = ["trace_id", "rank", "stream", "gaps", "idle_ns", "host_wait_ns", "kernel_wait_ns", "other_ns"]
    assert stored_idle.height == live_idle.height > 0
    assert _rows(stored_idle, columns) == _rows(live_idle, columns)
    stored = con.sql("SELECT * EXCLUDE (job) FROM launch_stats").pl()
    live = launch_stats(con)
    columns = ["trace_id", "rank", "launches", "shorter_than_launch", "max_delay_ns"]
    assert _rows(stored, columns) == _rows(live, columns)
    stored = con.sql("SELECT * EXCLUDE (job) FROM stream_queues").pl()
    live = queue_lengths(con, where="d.trace_id IS NOT NULL")
    columns = ["trace_id", "rank", "stream", "launches", "max_queue"]
    assert stored.height == live.height > 0
    assert _rows(stored, columns) == _rows(live, columns)


def test_kernel_stats_add_up_to_device_time(sample_warehouse: Warehouse) -> None:
    stored = dict(sample_warehouse.query(
        "SELECT trace_id, sum(total_ns) FROM kernel_stats GROUP BY 1").rows)
    direct = dict(sample_warehouse.query(
        "SELECT trace_id, sum(dur_ns) FROM device_ops WHERE category <> 'sync' GROUP BY 1").rows)
    assert stored == direct and len(stored) == 5
    counts = sample_warehouse.query(
        "SELECT count(*) FROM kernel_stats WHERE mean_ns > max_ns OR p50_ns > max_ns").rows[0][0]
    assert counts == 0


@pytest.mark.parametrize("job", ["ddp_straggler", "launch_bound"])
def test_sql_and_vectorised_derived_tables_are_equal(sample_warehouse: Warehouse, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch, job: str) -> None:
    """Small traces get their derived tables from DuckDB, large ones from numpy/polars: same rows either way."""
    from tracelake.warehouse import derived

    store = sample_warehouse.store
    trace_id = store.job_traces(job)[0]
    parsed = tmp_path / "parsed"
    parsed.mkdir()
    for name in derived.INPUTS:
        (parsed / f"{name}.parquet").symlink_to(store.path(name, job, trace_id))
    results = {}
    for way, limit in (("sql", 10**9), ("vectorised", 0)):
        monkeypatch.setattr(derived, "SQL_MAX_OPS", limit)
        out = tmp_path / way
        out.mkdir()
        derived.write_derived(parsed, out)
        results[way] = {name: pl.read_parquet(out / f"{name}.parquet") for name in ("breakdown", "kernel_stats",
                                                                                  "stream_idle")}
    for name, frame in results["sql"].items():
        keys = [c for c in ("trace_id", "rank", "step", "name", "stream") if c in frame.columns]
        other = results["vectorised"][name]
        assert frame.height == other.height > 0, name
        assert frame.sort(keys, nulls_last=False).equals(other.sort(keys, nulls_last=False)), name
