"""Device memory in the faces: ``Warehouse.analyze``, ``tracelake analyze`` (and ``--json``), the API's job answer
and the job report, over the H200 samples, against figures read from the raw traces here (docs/analyses.md,
"Memory")."""

from __future__ import annotations

import gzip
import json
import re
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from support import ROOT, SAMPLES
from tracelake.analysis.assemble import SERIES_POINTS, MEMORY_FRAMES, memory_series
from tracelake.api.app import create_app
from tracelake.api.cli import app as cli
from tracelake.api.reports import job_report
from tracelake.api.settings import ServerSettings
from tracelake.warehouse import Warehouse

H200 = ROOT / "sample_traces" / "gpu_h200"
LEAK, TRAIN = H200 / "leak", H200 / "train"
PLAIN = SAMPLES / "launch_bound"  # a Kineto trace recorded without profile_memory
MIB = 1 << 20


@pytest.fixture(scope="module")
def memory_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A warehouse with the H200 leak and training samples (jobs ``leak``, ``train``) and a job without memory data
    (``plain``); read-only for the tests."""
    home = tmp_path_factory.mktemp("memory") / "warehouse"
    wh = Warehouse(home)
    for job, folder in (("leak", LEAK), ("train", TRAIN), ("plain", PLAIN)):
        report = wh.ingest([folder], job=job)
        assert report.ok, [r.error for r in report.failed]
    return home


@pytest.fixture(scope="module")
def analyses(memory_home: Path) -> dict[str, Any]:
    """Each job's analysis, made once."""
    wh = Warehouse(memory_home)
    return {job: wh.analyze(job=job) for job in ("leak", "train", "plain")}


def _kineto(folder: Path) -> dict[str, Any]:
    """The folder's one Kineto trace, parsed here with json."""
    (path,) = folder.glob("*.pt.trace.json.gz")
    with gzip.open(path, "rt") as f:
        return json.load(f)


def _raw_maxima(top: dict[str, Any]) -> dict[int, tuple[int, int, int]]:
    """Per device id: the largest ``Total Allocated`` and ``Total Reserved`` args, and the ``[OutOfMemory]`` count."""
    out: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0])
    for e in top["traceEvents"]:
        if e.get("name") in ("[memory]", "[OutOfMemory]"):
            a = e["args"]
            entry = out[int(a["Device Id"])]
            entry[0] = max(entry[0], int(a["Total Allocated"]))
            entry[1] = max(entry[1], int(a["Total Reserved"]))
            entry[2] += e["name"] == "[OutOfMemory]"
    return {device: (a, r, o) for device, (a, r, o) in out.items()}


def _timeline_replay(path: Path) -> tuple[int, dict[int, int]]:
    """PyTorch's memory timeline export replayed the plain way: (peak total, bytes per category code at the peak)."""
    with gzip.open(path, "rt") as f:
        rows = json.load(f)
    live: dict[int, int] = defaultdict(int)
    by_time: dict[int, list[list[int]]] = defaultdict(list)
    for t, action, size, category in rows:
        by_time[-1 if t < 0 else t].append([action, size, category])
    best, at_peak = -1, {}
    for t in sorted(by_time):
        for action, size, category in by_time[t]:
            live[category] += -abs(size) if action == 4 else size if action == 3 else abs(size)
        total = sum(live.values())
        if total > best:
            best, at_peak = total, dict(live)
    return best, at_peak


# -- the library's answer ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("job, folder", [("leak", LEAK), ("train", TRAIN)])
def test_peaks_and_capacity_are_the_raw_traces_own(analyses: dict[str, Any], job: str, folder: Path) -> None:
    top = _kineto(folder)
    raw = _raw_maxima(top)
    memory = analyses[job].memory
    assert sorted(memory["device"].to_list()) == sorted(raw)
    capacity = {int(d["id"]): int(d["totalGlobalMem"]) for d in top["deviceProperties"]}
    for row in memory.to_dicts():
        allocated, reserved, ooms = raw[row["device"]]
        assert (row["peak_allocated_bytes"], row["peak_reserved_bytes"], row["ooms"]) == (allocated, reserved, ooms)
        if row["device"] < 0:  # the CPU: no capacity, no headroom
            assert row["capacity_bytes"] is None and row["headroom_pct"] is None
            continue
        assert row["capacity_bytes"] == capacity[row["device"]]
        assert row["headroom_bytes"] == row["capacity_bytes"] - row["peak_reserved_bytes"]
        assert 0 <= row["headroom_pct"] <= 100
        assert row["fragmentation_bytes"] == row["reserved_at_peak_bytes"] - row["peak_allocated_bytes"] >= 0
        assert row["peak_step"] is not None and row["slope_bytes_per_step"] is not None
    as_dict = analyses[job].as_dict()
    assert as_dict["memory"] == memory.to_dicts() and set(MEMORY_FRAMES) <= set(as_dict)
    assert "memory_series" not in as_dict and "memory_category_series" not in as_dict


def test_the_leak_job_finds_the_leak_the_oom_and_the_churn(analyses: dict[str, Any]) -> None:
    result = analyses["leak"]
    kinds = [f.kind for f in result.findings]
    assert {"memory_growth", "out_of_memory", "allocator_churn"} <= set(kinds)
    gains = [f.gain_ns for f in result.findings if f.kind != "hang"]
    assert gains == sorted(gains, reverse=True)  # ranked with the others, largest gain first
    growth = next(f for f in result.findings if f.kind == "memory_growth")
    assert "grows 32.0 MiB per step" in growth.title
    cuda = result.memory.filter(pl.col("device") == 0).row(0, named=True)
    assert cuda["slope_bytes_per_step"] == 32 * MIB and cuda["leak"]
    leak = result.memory_growth.filter(pl.col("device") == 0).row(0, named=True)
    assert leak["leak"] and leak["growth_bytes"] == 3 * 32 * MIB
    churn = result.allocator_churn.filter(pl.col("steady"))
    assert churn["malloc_calls"].sum() == 46 and churn["free_calls"].sum() == 40  # as the trace's own cuda_runtime
    # what is live at the peak adds up to the trace's total there
    live = result.memory_live_at_peak.filter(pl.col("device") == 0)
    first = live.row(0, named=True)
    assert first["allocated_bytes"] == cuda["peak_allocated_bytes"]
    assert live["bytes"].sum() + first["before_trace_bytes"] + first["residual_bytes"] == first["allocated_bytes"]


def test_the_training_job_has_its_memory_timeline_by_category(analyses: dict[str, Any]) -> None:
    result = analyses["train"]
    peak, per_code = _timeline_replay(TRAIN / "memory_timeline.raw.json.gz")
    categories = result.memory_by_category
    assert set(categories["peak_bytes"].to_list()) == {peak}
    names = {0: "parameter", 1: "optimizer_state", 2: "input", 3: "temporary", 4: "activation", 5: "gradient",
             6: "autograd_detail", 7: "unknown"}
    got = {r["category"]: r["bytes"] for r in categories.to_dicts()}
    assert {names[c]: b for c, b in per_code.items() if b} == {c: b for c, b in got.items() if b}
    assert max(got, key=lambda c: got[c]) == "activation"
    series = result.memory_category_series
    totals = series.group_by("ts_ns").agg(pl.col("bytes").sum())
    assert totals["bytes"].max() == peak and totals.height <= SERIES_POINTS
    assert "no finding" not in " ".join(f.kind for f in result.findings)
    assert not {"memory_growth", "out_of_memory"} & {f.kind for f in result.findings}  # a healthy run


def test_a_job_without_memory_data_has_none(analyses: dict[str, Any]) -> None:
    result = analyses["plain"]
    as_dict = result.as_dict()
    assert all(as_dict[name] == [] for name in MEMORY_FRAMES)
    assert result.memory_series.is_empty() and not any(f.kind.startswith("memory") for f in result.findings)


def test_a_job_of_several_runs_has_each_runs_memory(tmp_path: Path, analyses: dict[str, Any]) -> None:
    wh = Warehouse(tmp_path / "warehouse")
    assert wh.ingest([LEAK, TRAIN, PLAIN], job="mix").ok
    result = wh.analyze(job="mix")
    assert result.runs.height == 3 and "run" in result.memory.columns
    per_run = {(r["run"], r["device"]): r["peak_allocated_bytes"] for r in result.memory.to_dicts()}
    alone = {r["peak_allocated_bytes"] for job in ("leak", "train") for r in analyses[job].memory.to_dicts()}
    assert set(per_run.values()) == alone and len({run for run, _ in per_run}) == 2
    assert result.memory_by_category["run"].n_unique() == 1  # the training run's timeline, in its own run
    text = job_report(wh.job_report("mix"))
    assert 'id="plot-memory-1"' in text and 'id="plot-memory-2"' not in text  # a cuda device per run


def test_the_plotted_series_keeps_its_peaks_in_at_most_the_points() -> None:
    n = 50_000
    allocated = [(i * 7919) % 100_003 for i in range(n)]
    events = pl.DataFrame({"trace_id": "t", "rank": 0, "device": 0, "ts_ns": list(range(0, 10 * n, 10)),
                           "total_allocated": allocated, "total_reserved": [a + 5 for a in allocated[::-1]]})
    series = memory_series(events)
    assert series.height <= SERIES_POINTS and series["ts_ns"].is_sorted()
    assert series["allocated_bytes"].max() == max(allocated) and series["allocated_bytes"].min() == min(allocated)
    assert series["reserved_bytes"].max() == max(allocated) + 5
    small = events.head(100)
    assert memory_series(small)["allocated_bytes"].to_list() == small["total_allocated"].to_list()  # all of it


# -- the CLI ------------------------------------------------------------------------------------------------------
def _cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), env={"COLUMNS": "200"})
    return result.exit_code, result.output


def test_cli_analyze_json_and_table(memory_home: Path, analyses: dict[str, Any]) -> None:
    code, out = _cli("analyze", "--job", "leak", "--json", "--home", str(memory_home))
    assert code == 0, out
    body = json.loads(out)
    expected = {(r["device"], r["peak_allocated_bytes"], r["peak_reserved_bytes"], r["capacity_bytes"])
                for r in analyses["leak"].memory.to_dicts()}
    assert {(r["device"], r["peak_allocated_bytes"], r["peak_reserved_bytes"], r["capacity_bytes"])
            for r in body["memory"]} == expected
    assert body["memory_growth"] and body["allocator_churn"] and body["memory_live_at_peak"]
    assert {"memory_growth", "out_of_memory"} <= {f["kind"] for f in body["findings"]}
    code, out = _cli("analyze", "--job", "leak", "--home", str(memory_home))
    assert code == 0, out
    assert "device memory per rank and device" in out and "cuda:0" in out
    assert "allocated grows 32.0 MiB per step" in out and "ran out of device memory once" in out
    code, out = _cli("analyze", "--job", "train", "--home", str(memory_home))
    assert code == 0 and "at the memory timeline's peak" in out and "activation" in out
    code, out = _cli("analyze", "--job", "plain", "--home", str(memory_home))
    assert code == 0 and "device memory" not in out
    code, out = _cli("analyze", "--job", "plain", "--json", "--home", str(memory_home))
    assert code == 0 and json.loads(out)["memory"] == []


# -- the API ------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def api(memory_home: Path) -> Iterator[TestClient]:
    with TestClient(create_app(ServerSettings(home=memory_home, ingest_workers=0))) as client:
        yield client


def test_api_job_answer_has_memory_at_the_top(api: TestClient, analyses: dict[str, Any]) -> None:
    body = api.get("/api/v1/jobs/leak").json()
    assert body["memory"] and "memory" not in body["analysis"]
    assert [(r["device"], r["peak_allocated_bytes"]) for r in body["memory"]] == \
        [(r["device"], r["peak_allocated_bytes"]) for r in analyses["leak"].memory.to_dicts()]
    for name in MEMORY_FRAMES[1:]:
        assert name in body["analysis"], name
    assert body["analysis"]["memory_growth"][-1]["leak"] is True
    assert api.get("/api/v1/jobs/plain").json()["memory"] == []
    declared = api.get("/openapi.json").json()["components"]["schemas"]["JobAnalysis"]["properties"]
    assert "peak_allocated_bytes" in declared["memory"]["description"]


# -- the job report -----------------------------------------------------------------------------------------------
def _plot_data(text: str, name: str) -> list[dict[str, Any]]:
    """The data traces a page hands plotly.js for the plot ``plot-<name>``."""
    at = re.search(r'Plotly\.newPlot\(\s*"plot-' + re.escape(name) + r'",\s*', text)
    assert at is not None, f"no plot-{name} in the page"
    data, _ = json.JSONDecoder().raw_decode(text, at.end())
    return data


def test_job_report_draws_memory(memory_home: Path, analyses: dict[str, Any]) -> None:
    wh = Warehouse(memory_home)
    text = job_report(wh.job_report("train"))
    assert 'id="memory"' in text and 'id="plot-memory-0"' in text
    data = _plot_data(text, "memory-0")
    names = [d["name"] for d in data]
    assert {"allocated", "reserved", "activation", "parameter", "optimizer_state"} <= set(names)
    stacked = [d for d in data if d.get("stackgroup")]
    assert stacked and all(len(d["x"]) <= SERIES_POINTS for d in data)
    allocated = next(d for d in data if d["name"] == "allocated")
    peak = analyses["train"].memory.row(0, named=True)["peak_allocated_bytes"]
    assert max(allocated["y"]) * (1 << 30) == pytest.approx(peak)
    assert "aten::addmm" in text  # what is live at the peak, in the table
    leak = job_report(wh.job_report("leak"))
    assert 'id="plot-memory-0"' in leak and 'id="plot-memory-1"' not in leak  # the CPU is in the table, not drawn
    plain = job_report(wh.job_report("plain"))
    assert 'id="memory"' not in plain and "plot-memory" not in plain


def test_job_report_memory_renders_in_chromium(memory_home: Path, tmp_path: Path) -> None:
    from support.chromium import Chromium, find_chromium

    executable = find_chromium()
    if executable is None:
        pytest.skip("Chromium is not installed (Debian: apt-get install chromium)")
    page = tmp_path / "train.html"
    page.write_text(job_report(Warehouse(memory_home).job_report("train")))
    (tmp_path / "chromium").mkdir()
    with Chromium.start(executable, tmp_path / "chromium") as browser:
        tab = browser.open(page.as_uri())
        script = ("(() => { const d = document.getElementById('plot-memory-0');"
                  " return d && d._fullLayout !== undefined ? d.querySelectorAll('.js-line, .js-fill').length : 0; })()")
        marks = 0
        for _ in range(100):
            marks = tab.evaluate(script)
            if marks:
                break
            time.sleep(0.2)
        assert marks >= 3, "the memory plot was not drawn"
        assert tab.errors() == []
