"""The fleet report's memory headroom per job (analysis/fleet.py ``memory_headroom``, Warehouse.fleet, the HTML):
checked against the raw Kineto JSON of the H200 samples and against built frames."""

from __future__ import annotations

import dataclasses
import datetime as dt
import gzip
import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from typer.testing import CliRunner

from support import SAMPLES
from tracelake.analysis import fleet
from tracelake.api.cli import app as cli
from tracelake.api.reports import fleet_report
from tracelake.warehouse import Warehouse

runner = CliRunner()
#: job -> the Kineto trace it is ingested from (both profiled with profile_memory=True).
MEASURED = {"leak": SAMPLES.parent / "gpu_h200" / "leak" / "leak.pt.trace.json.gz",
            "train": SAMPLES.parent / "gpu_h200" / "train" / "train.pt.trace.json.gz"}


@pytest.fixture(scope="module")
def memory_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("fleet-memory") / "warehouse"
    wh = Warehouse(home)
    for job, path in MEASURED.items():
        assert wh.ingest([path], job=job).ok
    assert wh.ingest([SAMPLES / "launch_bound"], job="launch").ok  # no memory events
    return home


def _raw(path: Path) -> dict[str, Any]:
    """Peaks and capacity of the trace's accelerator as its own JSON gives them (the CPU, device -1, left out)."""
    with gzip.open(path, "rt") as f:
        trace = json.load(f)
    args = [e["args"] for e in trace["traceEvents"] if e.get("name") == "[memory]" and e["args"]["Device Id"] >= 0]
    assert args, f"{path} has no device memory events"
    capacity = {p["id"]: p["totalGlobalMem"] for p in trace["deviceProperties"]}
    devices = {a["Device Id"] for a in args}
    assert len(devices) == 1
    return {"allocated": max(a["Total Allocated"] for a in args), "reserved": max(a["Total Reserved"] for a in args),
            "capacity": capacity[devices.pop()]}


def test_peaks_capacity_and_headroom_match_the_raw_traces(memory_home: Path) -> None:
    memory = Warehouse(memory_home).fleet().memory
    assert memory["job"].to_list() == sorted(MEASURED)  # the launch-bound job has no memory data: absent
    for row in memory.to_dicts():
        raw = _raw(MEASURED[row["job"]])
        assert row["peak_allocated_bytes"] == raw["allocated"]
        assert row["peak_reserved_bytes"] == raw["reserved"]
        assert row["capacity_bytes"] == raw["capacity"] == 150109880320  # an H200's totalGlobalMem
        assert row["headroom_bytes"] == raw["capacity"] - raw["reserved"]
        assert row["headroom_pct"] == pytest.approx(100 * (raw["capacity"] - raw["reserved"]) / raw["capacity"])
        assert row["ranks"] == row["devices"] == 1
        assert row["verdict"] == "room"  # a few GiB of 140: both could take a larger batch


def test_a_window_without_the_traces_has_no_memory_rows(memory_home: Path) -> None:
    wh = Warehouse(memory_home)
    latest = wh.registry.frame()["ingested_at"].max()
    later = wh.fleet(since=latest + dt.timedelta(seconds=1))
    assert later.memory.is_empty()
    assert list(later.memory.columns) == list(fleet.MEMORY_COLUMNS)


def test_the_fleet_report_has_the_memory_section(memory_home: Path, tmp_path: Path) -> None:
    out = tmp_path / "fleet.html"
    result = runner.invoke(cli, ["report", "fleet", "--no-job-reports", "--out", str(out), "--home", str(memory_home)])
    assert result.exit_code == 0, result.output
    text = out.read_text()
    section = text[text.index('id="memory"'):]
    section = section[:section.index("</section>")] if "</section>" in section else section
    assert "Memory headroom" in text and "plot-memory-headroom" in section
    assert "leak" in section and "train" in section and "launch" not in section.split("plot-memory-headroom")[1]
    assert "1 job without memory data" in section
    assert "could take a larger batch" in section


def _peaks(rows: list[tuple[str, int, int, int, int]]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema={"trace_id": pl.String, "rank": pl.Int64, "device": pl.Int64,
                                      "peak_allocated_bytes": pl.Int64, "peak_reserved_bytes": pl.Int64}, orient="row")


def test_headroom_is_the_tightest_device_bounded_and_classified() -> None:
    gib = 1024 ** 3
    peaks = _peaks([
        ("a0", 0, 0, 70 * gib, 76 * gib),   # job edge: 4 of 80 GiB left on rank 0...
        ("a1", 1, 0, 40 * gib, 44 * gib),   # ...and 36 on rank 1: the tightest counts
        ("b0", 0, 0, 10 * gib, 12 * gib),   # job room: 68 of 80 left
        ("b0", 0, -1, 90 * gib, 0),         # the CPU (device -1) is not device memory
        ("c0", 0, 0, 50 * gib, 90 * gib),   # job over: reserved beyond capacity -> 0%, not negative
        ("d0", 0, 0, 30 * gib, 40 * gib),   # job middle: 50% exactly is neither edge nor room
        ("e0", 0, 0, 1 * gib, 2 * gib),     # job unknown: no capacity, no headroom
    ])
    capacity = pl.DataFrame({"trace_id": ["a0", "a1", "b0", "c0", "d0", "b0"], "rank": [0, 1, 0, 0, 0, None],
                             "device": [0, 0, 0, 0, 0, 0], "kind": ["gpu"] * 5 + ["nic"],
                             "memory_bytes": [80 * gib] * 5 + [10 * gib]})
    traces = pl.DataFrame({"trace_id": ["a0", "a1", "b0", "c0", "d0", "e0"],
                           "job": ["edge", "edge", "room", "over", "middle", "unknown"]})
    out = {r["job"]: r for r in fleet.memory_headroom(peaks, capacity, traces).to_dicts()}
    assert sorted(out) == ["edge", "middle", "over", "room", "unknown"]
    assert out["edge"]["headroom_pct"] == pytest.approx(5.0) and out["edge"]["verdict"] == "edge"
    assert out["edge"]["peak_reserved_bytes"] == 76 * gib and out["edge"]["ranks"] == 2
    assert out["room"]["peak_allocated_bytes"] == 10 * gib and out["room"]["devices"] == 1
    assert out["room"]["headroom_pct"] == pytest.approx(85.0) and out["room"]["verdict"] == "room"
    assert out["over"]["headroom_pct"] == 0.0 and out["over"]["headroom_bytes"] == 0
    assert out["middle"]["headroom_pct"] == 50.0 and out["middle"]["verdict"] is None
    assert out["unknown"]["headroom_pct"] is None and out["unknown"]["capacity_bytes"] is None
    assert all(0 <= r["headroom_pct"] <= 100 for r in out.values() if r["headroom_pct"] is not None)


def test_the_report_lists_jobs_at_the_edge_first(memory_home: Path) -> None:
    result = Warehouse(memory_home).fleet()
    gib = 1024 ** 3
    built = fleet.memory_headroom(
        _peaks([("x", 0, 0, 10 * gib, 12 * gib), ("y", 0, 0, 70 * gib, 79 * gib)]),
        pl.DataFrame({"trace_id": ["x", "y"], "rank": [0, 0], "device": [0, 0], "memory_bytes": [80 * gib] * 2}),
        pl.DataFrame({"trace_id": ["x", "y"], "job": ["leak", "train"]}))
    text = fleet_report(dataclasses.replace(result, memory=built), lambda job: None)
    section = text[text.index('id="memory"'):]
    table = section[section.index("<table"):]
    assert table.index("train") < table.index("leak")  # train runs at the edge (1.2%): it comes first
    assert "1 job at the edge" in section and "at the edge" in table
