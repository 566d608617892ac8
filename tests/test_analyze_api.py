"""The notebook API: Warehouse.analyze returns polars frames and ranked findings."""

from __future__ import annotations

import re

import polars as pl
import pytest

from tracelake.warehouse import NotFound, Warehouse


def test_analyze_job_returns_frames(sample_warehouse: Warehouse) -> None:
    result = sample_warehouse.analyze(job="ddp_straggler")
    for name in ("breakdown", "top_kernels", "idle_by_stream", "launches", "step_stats", "collectives"):
        frame = getattr(result, name)
        assert isinstance(frame, pl.DataFrame) and frame.height > 0, name
    assert result.breakdown["rank"].to_list() == [0, 1, 2, 3]
    kinds = [f.kind for f in result.findings]
    assert kinds[0] == "straggler"  # the largest estimated gain in this sample
    # The evidence: the sample's straggler computes 1.25x as long as the others.
    assert re.search(r"compute time is \+2[3-7]% against the median rank", result.findings[0].detail)
    assert [f.gain_ns for f in result.findings] == sorted((f.gain_ns for f in result.findings), reverse=True)
    assert set(result.as_dict()) >= {"findings", "breakdown", "collectives"}


def test_analyze_one_trace(sample_warehouse: Warehouse) -> None:
    trace = sample_warehouse.traces(job="launch_bound")[0]
    result = sample_warehouse.analyze(trace_id=trace["trace_id"])
    assert result.breakdown.height == 1 and result.collectives.height == 0
    assert {"short_kernels", "host_wait"} <= {f.kind for f in result.findings}


def test_analyze_unknown(sample_warehouse: Warehouse) -> None:
    with pytest.raises(NotFound):
        sample_warehouse.analyze(job="nope")
