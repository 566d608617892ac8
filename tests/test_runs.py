"""Runs within a job (docs/analyses.md, "Runs within a job"): grouping, per-run analyses, the faces.

Per-run figures are checked against the same traces ingested into a job of their own
in another warehouse (an analysis that never heard of runs).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import polars as pl
import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st
from tracelake.analysis.runs import group_runs
from tracelake.api.app import create_app
from tracelake.api.cli import app
from tracelake.api.reports.job import render
from tracelake.api.settings import ServerSettings
from tracelake.sample_traces.generate import SCENARIOS, write_trace
from tracelake.warehouse import Warehouse
from typer.testing import CliRunner

BASE = dataclasses.replace(SCENARIOS["ddp_straggler"], ranks=2, steps=3, layers=4)
HOUR_NS = 3600 * 10**9


def _write(folder: Path, **changes: object) -> list[Path]:
    scenario = dataclasses.replace(BASE, **changes)  # type: ignore[arg-type]
    paths = [folder / f"rank-{r}.json.gz" for r in range(scenario.ranks)]
    for rank, path in enumerate(paths):
        write_trace(path, scenario, rank)
    return paths


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Path]]:
    """Two 2-rank runs an hour apart (different stragglers), and a third overlapping the first."""
    root = tmp_path_factory.mktemp("runs")
    return {
        "a": _write(root / "a", name="a", seed=1, straggler_rank=1),
        "b": _write(root / "b", name="b", seed=2, straggler_rank=0, base_time_ns=BASE.base_time_ns + HOUR_NS),
        "c": _write(root / "c", name="c", seed=3, straggler_rank=0),
    }


@pytest.fixture(scope="module")
def both(two_runs: dict[str, list[Path]], tmp_path_factory: pytest.TempPathFactory) -> Warehouse:
    wh = Warehouse(tmp_path_factory.mktemp("both") / "wh")
    assert wh.ingest(two_runs["a"] + two_runs["b"], job="both").ok
    return wh


@pytest.fixture(scope="module")
def apart(two_runs: dict[str, list[Path]], tmp_path_factory: pytest.TempPathFactory) -> Warehouse:
    wh = Warehouse(tmp_path_factory.mktemp("apart") / "wh")
    assert wh.ingest(two_runs["a"], job="a").ok and wh.ingest(two_runs["b"], job="b").ok
    return wh


def _run_by_folder(wh: Warehouse, job: str) -> dict[str, set[str]]:
    runs: dict[str, set[str]] = {}
    for row in wh.traces(job):
        runs.setdefault(row["run"], set()).add(Path(row["source_path"]).parent.name)
    return runs


def test_two_runs_in_one_job_are_told_apart(both: Warehouse) -> None:
    assert sorted(_run_by_folder(both, "both").values(), key=sorted) == [{"a"}, {"b"}]
    analysis = both.analyze(job="both")
    assert analysis.runs.height == 2 and analysis.runs["warning"].null_count() == 2
    assert analysis.runs["traces"].to_list() == [2, 2]
    assert not [f for f in analysis.findings if f.kind == "repeated_rank"]


@pytest.mark.parametrize("frame", ["breakdown", "last_arrivals", "top_kernels", "step_stats", "idle_by_stream"])
def test_each_run_is_analysed_as_a_job_of_its_own(both: Warehouse, apart: Warehouse, frame: str) -> None:
    merged = getattr(both.analyze(job="both"), frame)
    run_of = {folder.pop(): run for run, folder in _run_by_folder(both, "both").items()}
    for job in ("a", "b"):
        expected = getattr(apart.analyze(job=job), frame)
        got = merged.filter(pl.col("run") == run_of[job]).drop("run")
        assert expected.height > 0
        assert got.columns == expected.columns
        assert got.sort(got.columns).equals(expected.sort(expected.columns)), (frame, job)


def test_findings_name_their_run(both: Warehouse, apart: Warehouse) -> None:
    titles = {f.title for f in both.analyze(job="both").findings}
    run_of = {folder.pop(): run for run, folder in _run_by_folder(both, "both").items()}
    for job in ("a", "b"):
        assert {f"in {run_of[job]}, {f.title}" for f in apart.analyze(job=job).findings} <= titles


def test_a_repeated_rank_is_warned(two_runs: dict[str, list[Path]], warehouse: Warehouse) -> None:
    report = warehouse.ingest(two_runs["a"] + two_runs["c"][:1], job="mixed")  # c overlaps a in time
    assert report.ok
    warned = [r.path.parent.name for r in report.results if any("rank 0 appears in 2" in w for w in r.warnings)]
    assert sorted(warned) == ["a", "c"]  # both rank-0 traces, not rank 1
    analysis = warehouse.analyze(job="mixed")
    assert analysis.runs.height == 1 and analysis.runs["repeated_ranks"].to_list() == [[0]]
    assert "rank 0 appears in 2" in analysis.runs["warning"][0]
    assert [f.kind for f in analysis.findings].count("repeated_rank") == 1
    assert "breakdown" in analysis.as_dict() and analysis.as_dict()["runs"][0]["warning"]


def test_a_run_label_splits_and_joins(two_runs: dict[str, list[Path]], warehouse: Warehouse) -> None:
    assert warehouse.ingest(two_runs["a"], job="split", labels={"run": "first"}).ok
    assert warehouse.ingest(two_runs["c"], job="split", labels={"run": "second"}).ok  # same time, other label
    assert _run_by_folder(warehouse, "split") == {"first": {"a"}, "second": {"c"}}
    assert warehouse.analyze(job="split").runs["warning"].null_count() == 2
    other = Warehouse(warehouse.home.parent / "joined")  # a's traces are in `split` already
    assert other.ingest(two_runs["b"], job="joined", labels={"run": "one"}).ok
    assert other.ingest(two_runs["a"][:1], job="joined", labels={"run": "one"}).ok  # an hour apart, one label
    assert _run_by_folder(other, "joined") == {"one": {"a", "b"}}
    assert other.analyze(job="joined").runs["repeated_ranks"].to_list() == [[0]]


def test_faces_show_the_run(both: Warehouse) -> None:
    home = both.home
    listed = CliRunner().invoke(app, ["traces", "--job", "both", "--home", str(home), "--format", "json"])
    assert listed.exit_code == 0, listed.output
    assert {row["run"] for row in json.loads(listed.output)} == {"run-1", "run-2"}
    analysed = CliRunner().invoke(app, ["analyze", "--job", "both", "--home", str(home)])
    assert analysed.exit_code == 0 and "runs in this job" in analysed.output
    with TestClient(create_app(ServerSettings(home=home, ingest_workers=0))) as client:
        job = client.get("/api/v1/jobs/both").json()
        assert [r["run"] for r in job["runs"]] == ["run-1", "run-2"]
        assert {r["run"] for r in job["breakdown"]} == {"run-1", "run-2"}
        traces = client.get("/api/v1/traces", params={"job": "both"}).json()["traces"]
        assert {t["run"] for t in traces} == {"run-1", "run-2"}
        one = client.get(f"/api/v1/traces/{traces[0]['trace_id']}").json()["trace"]
        assert one["run"] == traces[0]["run"]
    html = render(both.job_report("both"))
    assert 'id="runs"' in html and "run-2 rank 1" in html


# -- the pure grouping -----------------------------------------------------------------------------

_TRACE = st.fixed_dictionaries({
    "rank": st.integers(0, 3),
    "format": st.sampled_from(["pytorch_profiler", "nccl_log", "nccl_tests"]),
    "world_size": st.one_of(st.none(), st.sampled_from([2, 4])),
    "start_ns": st.one_of(st.none(), st.integers(0, 100)),
    "length": st.integers(0, 30),
    "label": st.one_of(st.none(), st.sampled_from(["x", "y", "run-1"])),
    "job": st.sampled_from(["j", "k"]),
})


def _frame(rows: list[dict]) -> pl.DataFrame:  # type: ignore[type-arg]
    return pl.DataFrame([{
        "job": r["job"], "trace_id": f"t{i:03d}", "rank": r["rank"], "format": r["format"],
        "world_size": r["world_size"], "start_ns": r["start_ns"],
        "end_ns": None if r["start_ns"] is None else r["start_ns"] + r["length"],
        "labels": {} if r["label"] is None else {"run": r["label"], "team": "t"},
    } for i, r in enumerate(rows)], schema_overrides={"world_size": pl.Int64, "start_ns": pl.Int64,
                                                      "end_ns": pl.Int64})


@settings(max_examples=300, deadline=None)
@given(st.lists(_TRACE, min_size=1, max_size=25))
def test_grouping_properties(rows: list[dict]) -> None:  # type: ignore[type-arg]
    traces = _frame(rows)
    runs = group_runs(traces)
    a = runs.assignment
    assert sorted(a["trace_id"].to_list()) == sorted(traces["trace_id"].to_list())  # each trace exactly once
    assert a["run"].null_count() == 0
    joined = traces.join(a, on=["job", "trace_id"])
    warned = {(r.job, r.run, r.rank, r.format) for r in runs.repeats}
    for (job, run, rank, fmt), group in joined.group_by("job", "run", "rank", "format"):
        if group.height > 1 and fmt != "nccl_tests":
            assert (job, run, rank, fmt) in warned
    for row in joined.to_dicts():
        label = row["labels"].get("run")
        if label is not None:
            assert row["run"] == label
    for (job, run), group in joined.group_by("job", "run"):  # a run never mixes labels, nor labelled and not
        assert len({(labels or {}).get("run") for labels in group["labels"].to_list()}) == 1
    assert set(runs.summary.select("job", "run").rows()) == set(a.select("job", "run").unique().rows())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 200), st.integers(0, 40)), min_size=1, max_size=30))
def test_timed_runs_are_the_overlap_components(spans: list[tuple[int, int]]) -> None:
    """One world size, no labels, all timed: runs are the connected components of overlapping spans."""
    rows = [{"job": "j", "rank": 0, "format": "pytorch_profiler", "world_size": 8, "start_ns": s, "length": n,
             "label": None} for s, n in spans]
    parent = list(range(len(spans)))

    def find(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    for i, (s1, n1) in enumerate(spans):  # a naive union-find over every pair
        for j, (s2, n2) in enumerate(spans):
            if max(s1, s2) <= min(s1 + n1, s2 + n2):
                parent[find(i)] = find(j)
    expected = {frozenset(f"t{i:03d}" for i in range(len(spans)) if find(i) == root) for root in set(map(find,
                                                                                                     range(len(spans))))}
    a = group_runs(_frame(rows)).assignment
    got = {frozenset(g["trace_id"].to_list()) for _, g in a.group_by("run")}
    assert got == expected
