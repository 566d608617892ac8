"""`tracelake export perfetto`: one timeline of every rank (warehouse/perfetto.py; docs/formats.md, "Perfetto export").

Checked by the trace-event format's own rules (valid JSON, every event on a named process and thread,
time order per thread, flows paired) and by reading the file back through tracelake's Kineto parser,
against the job's tables.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from support import ROOT
from tracelake.api.cli import app
from tracelake.warehouse import NotFound, Warehouse

DDP = ROOT / "sample_traces" / "gpu_h200" / "ddp"


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Warehouse, Path, dict[str, Any]]:
    home = tmp_path_factory.mktemp("perfetto")
    wh = Warehouse(home / "wh")
    wh.ingest([DDP], job="ddp")
    out = home / "ddp.json.gz"
    result = CliRunner().invoke(app, ["export", "perfetto", "--job", "ddp", "--out", str(out), "--home",
                                      str(home / "wh")])
    assert result.exit_code == 0, result.output
    return wh, out, json.loads(gzip.decompress(out.read_bytes()))


def test_every_event_is_on_a_named_process_and_thread_in_time_order(exported: tuple[Warehouse, Path, dict]) -> None:
    _, _, doc = exported
    events = doc["traceEvents"]
    named_threads = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    named_processes = {e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    slices = [e for e in events if e["ph"] == "X"]
    assert slices and all((e["pid"], e["tid"]) in named_threads for e in slices)
    assert named_processes == {0, 1} == {e["pid"] for e in slices}
    last: dict[tuple[int, int, str], float] = {}
    for e in slices:  # per thread (and per kind of track), starts never go back
        key = (e["pid"], e["tid"], e["cat"] == "critical_path")
        assert e["ts"] >= last.get(key, float("-inf")) and e["dur"] >= 0
        last[key] = e["ts"]
    path_end: dict[tuple[int, int], float] = {}
    for e in (e for e in slices if e["cat"] == "critical_path"):  # a track's slices never overlap
        assert e["ts"] >= path_end.get((e["pid"], e["tid"]), float("-inf")) - 0.001
        path_end[(e["pid"], e["tid"])] = e["ts"] + e["dur"]
    starts = Counter(e["id"] for e in events if e["ph"] == "s")
    ends = Counter(e["id"] for e in events if e["ph"] == "f")
    assert starts and starts == ends and set(starts.values()) == {1}


def test_the_timeline_reads_back_as_the_jobs_own_ops(exported: tuple[Warehouse, Path, dict], tmp_path: Path) -> None:
    wh, out, doc = exported
    back = Warehouse(tmp_path / "back")
    back.ingest([out], job="back")
    for table, where in (("device_ops", ""), ("host_ops", "WHERE cat <> 'critical_path'")):
        sql = f"SELECT count(*), sum(dur_ns), min(ts_ns) FROM {table} {where}"
        assert back.query(sql).rows == wh.query(sql).rows, table
    a = wh.analyze(job="ddp")
    path = [e for e in doc["traceEvents"] if e.get("cat") == "critical_path" and e["ph"] == "X"]
    assert len(path) == a.critical_path_stretches.height
    assert sum(round(e["dur"] * 1000) for e in path) == a.critical_path["length_ns"].sum()
    marks = [e for e in doc["traceEvents"] if e.get("cat") == "tracelake_finding"]
    assert [m["name"] for m in marks] == [f"finding: {f.title}" for f in a.findings]


def test_one_step_keeps_that_steps_events_and_a_missing_step_is_an_error(
        exported: tuple[Warehouse, Path, dict], tmp_path: Path) -> None:
    wh, _, _ = exported
    done = wh.export_perfetto("ddp", tmp_path / "s5.json.gz", step=5)
    in_step = wh.query("SELECT (SELECT count(*) FROM host_ops WHERE step = 5) + "
                       "(SELECT count(*) FROM device_ops WHERE step = 5)").rows[0][0]
    assert done.ops == in_step > 0
    doc = json.loads(gzip.decompress((tmp_path / "s5.json.gz").read_bytes()))
    assert {e["args"]["step"] for e in doc["traceEvents"] if e.get("cat") == "critical_path" and e["ph"] == "X"} == {5}
    with pytest.raises(NotFound, match="step 99"):
        wh.export_perfetto("ddp", tmp_path / "none.json.gz", step=99)
    assert not (tmp_path / "none.json.gz").exists()
    result = CliRunner().invoke(app, ["export", "perfetto", "--job", "nope", "--home", str(wh.store.home)])
    assert result.exit_code != 0 and "nope" in result.output and "Traceback" not in result.output
