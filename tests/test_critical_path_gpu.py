"""Critical paths of the real H200 traces in sample_traces/gpu_h200 (captured by sample_traces/capture_gpu.py).

The ``ddp`` run: two ranks share one GPU over gloo with CUDA tensors; rank 1 runs 40 extra 4096x4096
matmuls (``straggler_delay``) each step, so rank 0 waits in every gradient all-reduce. Its backward runs
on the autograd engine's own thread and gloo's work on worker threads, so the path crosses threads
the trace draws no arrow between (docs/analyses.md, "Critical path", waits between threads).
Expected figures come from the trace JSON read here, not from tracelake's tables.
"""

from __future__ import annotations

import gzip
import json
from functools import cache
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from tracelake.analysis import critical_path
from tracelake.analysis.assemble import Analysis
from tracelake.api.user_input import parse_speedups
from tracelake.contracts.critical import Scenario
from tracelake.contracts.errors import InvalidArgument
from tracelake.warehouse import Warehouse

GPU = Path(__file__).resolve().parent.parent / "sample_traces" / "gpu_h200"
US = 1000


def _events(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path, "rt") as fh:
        events: list[dict[str, Any]] = json.load(fh)["traceEvents"]
    return events


def _straggler_kernels_ns(path: Path) -> dict[int, int]:
    """Per ProfilerStep number: device time of the kernels launched inside ``straggler_delay``."""
    events = _events(path)
    steps = [(int(e["name"].split("#")[1]), e["ts"], e["ts"] + e["dur"]) for e in events
             if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")]
    delays = [(e["ts"], e["ts"] + e["dur"], e["tid"]) for e in events
              if e.get("ph") == "X" and e.get("name") == "straggler_delay"]
    launched = {e["args"]["correlation"]: e["ts"] for e in events
                if e.get("cat") == "cuda_runtime" and "Launch" in e["name"]
                and any(s <= e["ts"] <= t and e["tid"] == tid for s, t, tid in delays)}
    out: dict[int, int] = {}
    for e in events:
        launch = launched.get(e.get("args", {}).get("correlation")) if e.get("cat") == "kernel" else None
        if launch is not None:
            step = next(n for n, s, t in steps if s <= launch <= t)
            out[step] = out.get(step, 0) + int(e["dur"] * US)
    return out


@cache
def _analysis(job: str, home: Path) -> Analysis:
    wh = Warehouse(home)
    wh.ingest([GPU / job], job=job)
    return wh.analyze(job=job)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gpu")


def test_the_straggler_bounds_every_step_through_the_autograd_and_gloo_threads(home: Path) -> None:
    a = _analysis("ddp", home)
    kernels = _straggler_kernels_ns(GPU / "ddp" / "rank1.pt.trace.json.gz")
    steps = a.critical_path.to_dicts()
    assert [s["step"] for s in steps] == sorted(kernels)
    for s in steps:
        assert s["bounding_rank"] == 1
        assert abs(s["residual_pct"]) <= 2.0
        on_path = a.critical_path_stretches.filter(
            (pl.col("step") == s["step"]) & (pl.col("rank") == 1) & (pl.col("kind") == "compute"))["dur_ns"].sum()
        # rank 1's extra matmuls are on the path, nearly whole (what is off it ran while the host still queued)
        assert on_path >= 0.95 * kernels[s["step"]], (s["step"], on_path, kernels[s["step"]])
        assert on_path <= s["measured_ns"]


def test_evening_out_the_straggler_saves_what_it_added_and_no_more(home: Path) -> None:
    a = _analysis("ddp", home)
    kernels = _straggler_kernels_ns(GPU / "ddp" / "rank1.pt.trace.json.gz")
    rows = {(r["step"], r["scenario"]): r for r in a.what_if.to_dicts()}
    for step, extra in kernels.items():
        evened = rows[(step, Scenario.SLOWEST_RANK_AT_MEDIAN)]
        assert evened["changed_rank"] == 1
        # two ranks: the median is halfway, so about half the straggler's own compute comes off the step
        assert 0.35 * extra <= evened["saving_ns"] <= evened["measured_ns"]
        doubled = rows[(step, Scenario.COMPUTE_X2)]
        assert 0.35 * extra <= doubled["saving_ns"] <= 0.5 * evened["measured_ns"] + 0.05 * extra
    found = {f.kind for f in a.findings}
    assert "what_if_slowest_rank_at_median" in found or "straggler" in found


def test_one_rank_with_its_nccl_log_has_no_slower_rank_to_even_out(home: Path) -> None:
    """The NCCL log is a second trace of rank 0, with no ops: no median to bring a rank to."""
    a = _analysis("nccl", home)
    assert a.critical_path.height and set(a.critical_path["ranks"].to_list()) == {1}
    scenarios = set(a.what_if["scenario"].to_list())
    assert Scenario.SLOWEST_RANK_AT_MEDIAN not in scenarios
    assert not [f for f in a.findings if f.kind == "what_if_slowest_rank_at_median"]


@pytest.mark.parametrize("job", ["train", "graphs", "compile", "conv", "leak", "jax"])
def test_single_gpu_runs_replay_their_steps_and_never_promise_more_than_the_step(home: Path, job: str) -> None:
    a = _analysis(job, home)
    assert a.critical_path.height
    for s in a.critical_path.to_dicts():
        assert abs(s["residual_pct"]) <= 2.0, s
    totals = critical_path.totals(a.what_if)
    for r in totals.to_dicts():
        if r["scenario"] != Scenario.RANKS_X2:
            assert 0 <= r["predicted_ns"] <= r["measured_ns"]


def test_the_critical_path_is_stored_for_sql_once_the_job_is_analysed(tmp_path: Path) -> None:
    wh = Warehouse(tmp_path / "wh")
    wh.ingest([GPU / "ddp"], job="ddp")
    assert wh.query("SELECT count(*) AS n FROM critical_path").rows[0][0] == 0  # nothing before an analysis
    trace = wh.query("SELECT trace_id FROM traces WHERE rank = 1").rows[0][0]
    wh.analyze(trace_id=trace)  # one rank of the run alone: not the run's path, nothing stored
    assert wh.query("SELECT count(*) AS n FROM critical_path").rows[0][0] == 0
    a = wh.analyze(job="ddp")
    stored = pl.DataFrame(wh.query("SELECT step, position, rank, trace_id, kind, name, ts_ns, dur_ns, run, ranks "
                                 "FROM critical_path ORDER BY step, position").rows, orient="row",
                          schema=["step", "position", "rank", "trace_id", "kind", "name", "ts_ns", "dur_ns", "run",
                                  "ranks"])
    shown = a.critical_path_stretches.sort("step", "position")
    assert stored.height == shown.height > 0
    assert stored["dur_ns"].to_list() == shown["dur_ns"].to_list()
    assert stored["ts_ns"].to_list() == shown["start_ns"].to_list()
    assert set(stored["ranks"].to_list()) == {2} and set(stored["run"].to_list()) == {a.runs["run"][0]}
    # each rank's stretches live with that rank's trace
    ranks_of = dict(wh.query("SELECT trace_id, rank FROM traces").rows)
    assert all(ranks_of[t] == r for t, r in stored.select("trace_id", "rank").rows())
    # per step, the stored stretches add up to the step's path length
    lengths = dict(a.critical_path.select("step", "length_ns").rows())
    for step, total in stored.group_by("step").agg(pl.col("dur_ns").sum()).rows():
        assert total == lengths[step]
    assert wh.check().ok
    # analysed again with nothing new, nothing is written; recomputing the traces' analyses keeps what is stored
    files = sorted((wh.home / "tables" / "critical_path").glob("job=ddp/*.parquet"))
    stamps = [f.stat().st_mtime_ns for f in files]
    wh.analyze(job="ddp")
    assert [f.stat().st_mtime_ns for f in files] == stamps
    wh.recompute(job="ddp")
    assert wh.query("SELECT count(*) FROM critical_path").rows[0][0] == stored.height


def test_asked_for_speedups_agree_with_the_standard_scenarios_they_repeat(tmp_path: Path) -> None:
    wh = Warehouse(tmp_path / "wh")
    wh.ingest([GPU / "ddp"], job="ddp")
    asked = parse_speedups(["communication=2", "compute=2", "sm80_xmma*=2", "no-such-kernel*=3", "SM80_XMMA*=1"])
    a = wh.analyze(job="ddp", speedups=asked)
    by = {(r["step"], r["scenario"]): r["predicted_ns"] for r in a.what_if.to_dicts()}
    for step in a.critical_path["step"].to_list():
        # the same change reached by another road: a category at x2 is the standard x2 scenario
        assert by[(step, "communication x2")] == by[(step, Scenario.BANDWIDTH_X2)]
        assert by[(step, "compute x2")] == by[(step, Scenario.COMPUTE_X2)]
        # a pattern that matches nothing, or a factor of 1, changes nothing
        assert by[(step, "no-such-kernel* x3")] == by[(step, Scenario.AS_MEASURED)]
        assert by[(step, "SM80_XMMA* x1")] == by[(step, Scenario.AS_MEASURED)]
        # speeding up some compute kernels saves no more than speeding up all of them, and something here
        assert by[(step, "compute x2")] <= by[(step, "sm80_xmma* x2")] < by[(step, Scenario.AS_MEASURED)]
    assert not [f for f in a.findings if " x" in f.kind]  # answers to questions asked, not findings


@pytest.mark.parametrize("text", ["gemm", "=2", "gemm*=0", "gemm*=-1", "gemm*=fast", "gemm*=1e9", "a b=2",
                                  "x;drop=2"])
def test_a_bad_what_if_says_what_it_expected(text: str) -> None:
    with pytest.raises(InvalidArgument, match="what-if"):
        parse_speedups([text])


def test_the_api_answers_asked_for_speedups_and_refuses_bad_ones(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from tracelake.api.app import create_app
    from tracelake.api.settings import ServerSettings

    Warehouse(tmp_path / "wh").ingest([GPU / "ddp"], job="ddp")
    with TestClient(create_app(ServerSettings(home=tmp_path / "wh", ingest_workers=0))) as client:
        plain = client.get("/api/v1/jobs/ddp").json()
        asked = client.get("/api/v1/jobs/ddp", params=[("what_if", "compute=2"), ("what_if", "sm80*=4")]).json()
        bad = client.get("/api/v1/jobs/ddp", params={"what_if": "compute=zero"})
    scenarios = {r["scenario"] for r in asked["what_if"]}
    assert {"compute x2", "sm80* x4"} <= scenarios and not {"compute x2"} & {r["scenario"] for r in plain["what_if"]}
    same = [r for r in asked["what_if"] if r["scenario"] in {s["scenario"] for s in plain["what_if"]}]
    assert same == plain["what_if"]  # the standard answers do not change with what else was asked
    assert bad.status_code == 400 and "what-if" in bad.json()["error"] and "Traceback" not in bad.text


def test_jax_on_the_gpu_launches_its_work_through_cuda_graphs_on_the_path(home: Path) -> None:
    """XLA's host launches (``cuGraphLaunch``) share a correlation with the kernels they start: launch edges."""
    a = _analysis("jax", home)
    launch = a.critical_path["launch_ns"].sum()
    assert launch > 0
    named = set(a.critical_path_stretches.filter(pl.col("kind") == "launch")["name"].to_list())
    assert any(n.startswith("cuGraphLaunch") for n in named), named
