"""Traces with no device op recognised: `analyze` says so plainly (docs/analyses.md, "Findings")."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import polars as pl
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from support import SAMPLES
from tracelake.analysis import findings
from tracelake.api.app import create_app
from tracelake.api.cli import app
from tracelake.api.settings import ServerSettings
from tracelake.warehouse import Warehouse


def host_trace(path: Path, *, steps: int, accelerator_cat: str | None = None, rank: int = 0) -> int:
    """Write a Kineto trace of host ops only (plus, if given, device-like events of a category nobody reads).

    Returns the number of complete events, all of them host ops.
    """
    events: list[dict[str, object]] = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "python"}}]
    ts = 0.0
    for step in range(steps):
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1, "tid": 1,
                       "ts": ts, "dur": 900.0})
        for i in range(3):
            events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1,
                           "ts": ts + 10 + 200 * i, "dur": 150.0, "args": {"External id": step * 3 + i}})
            if accelerator_cat:
                events.append({"ph": "X", "cat": accelerator_cat, "name": "matmul", "pid": 7, "tid": 2,
                               "ts": ts + 20 + 200 * i, "dur": 100.0, "args": {"correlation": step * 3 + i}})
        ts += 1000.0
    with gzip.open(path, "wt") as f:
        json.dump({"schemaVersion": 1, "distributedInfo": {"rank": rank, "world_size": rank + 1},
                   "traceEvents": events}, f)
    return sum(1 for e in events if e["ph"] == "X")


@pytest.fixture
def cpu_home(tmp_path: Path) -> tuple[Path, int]:
    """A warehouse with one CPU-only trace (job ``cpu``) and one of an unknown accelerator (job ``xpu``)."""
    home = tmp_path / "wh"
    wh = Warehouse(home)
    host_ops = host_trace(tmp_path / "cpu.json.gz", steps=2)
    assert wh.ingest([tmp_path / "cpu.json.gz"], job="cpu").ok
    host_trace(tmp_path / "xpu.json.gz", steps=3, accelerator_cat="xpu_device_events")
    assert wh.ingest([tmp_path / "xpu.json.gz"], job="xpu").ok
    return home, host_ops


def test_a_cpu_only_trace_gets_a_plain_word(cpu_home: tuple[Path, int]) -> None:
    home, host_ops = cpu_home
    wh = Warehouse(home)
    assert wh.query("SELECT count(*) FROM device_ops").rows == [(0,)]
    found = wh.analyze(job="cpu").findings
    assert [f.kind for f in found] == ["no_device_ops"]
    finding = found[0]
    assert finding.title == "no device op recognised in 1 trace (rank 0)" and finding.gain_ns == 0
    assert f"{host_ops:,} host ops" in finding.detail and "2 profiler steps" in finding.detail
    assert "device type cpu" in finding.detail
    assert finding.traces == tuple(r[0] for r in wh.query("SELECT trace_id FROM traces WHERE job = 'cpu'").rows)


def test_an_unknown_accelerator_gets_it_too(cpu_home: tuple[Path, int]) -> None:
    home, _ = cpu_home
    found = Warehouse(home).analyze(job="xpu").findings
    assert [f.kind for f in found] == ["no_device_ops"] and "3 profiler steps" in found[0].detail


def test_the_cli_prints_it_instead_of_no_findings(cpu_home: tuple[Path, int]) -> None:
    home, _ = cpu_home
    result = CliRunner().invoke(app, ["analyze", "--job", "cpu", "--home", str(home)])
    assert result.exit_code == 0, result.output
    assert "no device op recognised in 1 trace" in result.output
    assert "no findings" not in result.output and "stands out" not in result.output
    result = CliRunner().invoke(app, ["analyze", "--job", "cpu", "--json", "--home", str(home)])
    assert [f["kind"] for f in json.loads(result.output)["findings"]] == ["no_device_ops"]


def test_the_api_carries_it(cpu_home: tuple[Path, int]) -> None:
    home, _ = cpu_home
    with TestClient(create_app(ServerSettings(home=home, ingest_workers=0))) as client:
        body = client.get("/api/v1/jobs/cpu").json()
    assert [f["kind"] for f in body["findings"]] == ["no_device_ops"]


def test_in_a_job_with_device_ops_only_the_bare_traces_are_named(tmp_path: Path) -> None:
    wh = Warehouse(tmp_path / "wh")
    gpu = sorted((SAMPLES / "ddp_straggler").glob("*.json.gz"))[:1]
    assert wh.ingest(gpu, job="mixed").ok
    assert not [f for f in wh.analyze(job="mixed").findings if f.kind == "no_device_ops"]
    host_trace(tmp_path / "cpu.json.gz", steps=1, rank=5)
    assert wh.ingest([tmp_path / "cpu.json.gz"], job="mixed").ok
    found = wh.analyze(job="mixed").findings
    bare = [f for f in found if f.kind == "no_device_ops"]
    cpu_trace = wh.query("SELECT trace_id FROM traces WHERE device_op_count = 0").rows
    assert len(bare) == 1 and bare[0].traces == (cpu_trace[0][0],) and bare[0].ranks == (5,)
    assert len(found) > 1  # the GPU trace's findings are still there


def test_traces_without_host_ops_are_not_named() -> None:
    """NCCL logs and benchmarks have neither host nor device ops: nothing to say about a device timeline."""
    traces = pl.DataFrame({"trace_id": ["a", "b"], "rank": [0, 1], "host_op_count": [0, None],
                           "device_op_count": [0, 0], "start_ns": [0, 0], "end_ns": [10, 10]})
    assert findings.from_traces(traces, pl.DataFrame()) == []
    with_host = traces.with_columns(pl.lit(5).alias("host_op_count"))
    assert findings.from_traces(with_host, pl.DataFrame({"trace_id": ["a", "b"]})) == []
    named = findings.from_traces(with_host, pl.DataFrame({"trace_id": ["a"]}))
    assert [f.traces for f in named] == [("b",)] and named[0].ranks == (1,)
    assert "host time 0.0 ms" in named[0].detail and "no profiler steps" in named[0].detail
