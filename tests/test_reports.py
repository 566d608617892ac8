"""HTML reports (api/reports): self-contained pages, escaped trace strings, the CLI commands and the API endpoints."""

from __future__ import annotations

import dataclasses
import gzip
import json
import re
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from fastapi.testclient import TestClient
from plotly.offline import get_plotlyjs
from typer.testing import CliRunner

from support import SAMPLES
from tracelake.analysis.critical_path import totals
from tracelake.analysis.fleet import collective_summaries
from tracelake.contracts.critical import PathKind, Scenario
from tracelake.api.app import create_app
from tracelake.api.cli import app as cli
from tracelake.api.reports import fleet_report, job_report
from tracelake.api.reports.page import esc, plot_text, tag
from tracelake.api.settings import ServerSettings
from tracelake.warehouse import Warehouse
from tracelake.analysis.fleet_view import compute as compute_fleet

HOSTILE_KERNEL = '<script>alert("kernel")</script><img src=x onerror=alert(1)>'
HOSTILE_LABEL = "<script>alert('team')</script>"
HOSTILE_JOB = '<script>alert("job")</script>'
runner = CliRunner()


class _Page(HTMLParser):
    """Every tag of a page, with the text of each script."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.scripts: list[str] = []
        self._in_script = False
        self.feed(text)

    def handle_starttag(self, name: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((name, dict(attrs)))
        if name == "script":
            self._in_script = True
            self.scripts.append("")

    def handle_endtag(self, name: str) -> None:
        if name == "script":
            self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script:
            self.scripts[-1] += data

    def named(self, name: str) -> list[dict[str, str | None]]:
        return [attrs for tag_name, attrs in self.tags if tag_name == name]


def assert_self_contained(text: str) -> _Page:
    """The page loads nothing: no script, style sheet, image or frame from anywhere, plotly.js inline once."""
    parsed = _Page(text)
    assert text.startswith("<!DOCTYPE html>")
    assert all("src" not in attrs for attrs in parsed.named("script")), "a script is loaded from somewhere"
    assert all((attrs.get("href") or "").startswith("data:") for attrs in parsed.named("link"))
    assert not parsed.named("iframe") and not parsed.named("img") and not parsed.named("object")
    assert not re.search(r"""<script[^>]*\bsrc\s*=\s*["']?https?://""", text, re.IGNORECASE)
    bundle = get_plotlyjs()
    assert text.count(bundle[:2000]) == 1, "plotly.js must be inline exactly once"
    assert sum(bundle[:2000] in s for s in parsed.scripts) == 1
    csp = [a for a in parsed.named("meta") if a.get("http-equiv") == "Content-Security-Policy"]
    assert csp and "default-src 'none'" in (csp[0]["content"] or "")
    divs = [a["id"] for a in parsed.named("div") if "plotly-graph-div" in (a.get("class") or "")]
    assert len(divs) == len(set(divs)) and all(f'Plotly.newPlot(                        "{d}"' in text for d in divs)
    ids = [a["id"] for _, a in parsed.tags if a.get("id")]
    assert len(ids) == len(set(ids)), "element ids must be unique (plotly draws into the first match)"
    return parsed


@pytest.fixture(scope="module")
def hostile_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A warehouse with one trace whose busiest kernel and team label are HTML with scripts in them."""
    folder = tmp_path_factory.mktemp("hostile")
    trace = json.loads(gzip.decompress((SAMPLES / "launch_bound" / "rank-0.json.gz").read_bytes()))
    kernels = [e for e in trace["traceEvents"] if e.get("cat") == "kernel"]
    target = kernels[0]["name"]
    for event in trace["traceEvents"]:
        if event.get("name") == target:
            event["name"] = HOSTILE_KERNEL
    path = folder / "rank-0.json"
    path.write_text(json.dumps(trace))
    home = folder / "warehouse"
    report = Warehouse(home).ingest([path], job="hostile", labels={"team": HOSTILE_LABEL})
    assert report.ok, [r.error for r in report.failed]
    return home


# -- the pages ------------------------------------------------------------------------------------------
def test_job_report_is_self_contained_with_findings_first(fleet_warehouse: Warehouse) -> None:
    text = job_report(fleet_warehouse.job_report("ddp"))
    parsed = assert_self_contained(text)
    sections = [a["id"] for a in parsed.named("section")]
    assert sections[0] == "findings"
    assert {"breakdown", "steps", "idle", "stragglers", "kernels", "bandwidth", "traces"} <= set(sections)
    divs = {a["id"] for a in parsed.named("div") if "plotly-graph-div" in (a.get("class") or "")}
    assert divs == {"plot-breakdown", "plot-steps", "plot-step-timeline", "plot-critical-path", "plot-what-if",
                    "plot-idle", "plot-stragglers", "plot-bandwidth", "plot-roofline"}
    assert {"critical-path", "what-if"} <= set(sections)
    assert "Rank 2 arrives last at 100% of collectives" in text  # the sample's straggler, in plain words
    assert text.index('id="findings"') < text.index('id="plot-breakdown"')
    assert "Peak: nvlink4 at 450 GB/s" in text  # one host of H100s: drawn against NVLink 4 (900 GB/s both ways)


def _plot(text: str, name: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The data traces and the layout a page hands plotly.js for the plot ``plot-<name>``."""
    decoder = json.JSONDecoder()
    at = re.search(r'Plotly\.newPlot\(\s*"plot-' + re.escape(name) + r'",\s*', text)
    assert at is not None, f"no plot-{name} in the page"
    data, end = decoder.raw_decode(text, at.end())
    layout, _ = decoder.raw_decode(text, re.compile(r",\s*").match(text, end).end())  # type: ignore[union-attr]
    return data, layout


def test_job_report_draws_the_critical_path_and_what_if(sample_warehouse: Warehouse) -> None:
    """The slowest step's path, a row per rank, its stretches adding up to the step; the what-if bars are the totals."""
    report = sample_warehouse.job_report("ddp_straggler")
    analysis = sample_warehouse.analyze(job="ddp_straggler")  # the facade's frames, read again
    text = job_report(report)
    parsed = assert_self_contained(text)
    sections = [a["id"] for a in parsed.named("section")]
    assert sections.index("steps") < sections.index("critical-path") < sections.index("what-if")
    slowest = analysis.critical_path.sort("measured_ns", descending=True).row(0, named=True)
    stretches = analysis.critical_path_stretches.filter(pl.col("step") == slowest["step"])
    data, layout = _plot(text, "critical-path")
    # one row per rank of the step: the ranks the breakdown has, as many as the step counts
    rows = layout["yaxis"]["ticktext"]
    assert rows == [f"rank {r}" for r in sorted(analysis.breakdown["rank"].to_list())]
    assert len(rows) == slowest["ranks"] == 4 and layout["yaxis"]["tickvals"] == list(range(len(rows)))
    drawn = [(rows[y], trace["name"], x, base) for trace in data for y, x, base in
             zip(trace["y"], trace["x"], trace["base"], strict=True)]
    assert len(drawn) == stretches.height
    assert {r for r, _, _, _ in drawn} == {f"rank {r}" for r in stretches["rank"].unique().to_list()}
    assert {t["name"] for t in data} == set(stretches["kind"].unique().to_list()) <= {str(k) for k in PathKind}
    assert len({t["name"] for t in data}) == len(data)  # a trace (and legend entry) per kind
    total_ms = sum(x for _, _, x, _ in drawn)
    assert total_ms * 1e6 == pytest.approx(slowest["length_ns"], abs=len(drawn))  # the stretches make the step
    assert max(base + x for _, _, x, base in drawn) * 1e6 == pytest.approx(slowest["length_ns"], abs=len(drawn))
    for kind in data:  # the time of each kind on the path, as the step's summary row has it
        assert sum(kind["x"]) * 1e6 == pytest.approx(slowest[f"{kind['name']}_ns"], abs=len(kind["x"]))
    # the what-if bars: predicted ms per step of every scenario, against the measured time, the baseline first
    summed = totals(analysis.what_if)
    bars, line = _plot(text, "what-if")[0]
    assert bars["type"] == "bar" and bars["x"][0] == str(Scenario.AS_MEASURED)
    # every scenario but the one that needs the job's own nccl-tests output (the sample has none)
    assert set(bars["x"]) == set(summed["scenario"].to_list()) == {str(s) for s in Scenario} - {
        Scenario.NCCL_TESTS_BANDWIDTH}
    savings = dict(zip(summed["scenario"], summed["saving_ns"]))
    assert [savings[s] for s in bars["x"][1:]] == sorted((savings[s] for s in bars["x"][1:]), reverse=True)
    for scenario, predicted, measured in zip(bars["x"], bars["y"], line["y"], strict=True):
        row = summed.filter(pl.col("scenario") == scenario).row(0, named=True)
        assert predicted == pytest.approx(row["predicted_ns"] / row["steps"] / 1e6)
        assert measured == pytest.approx(row["measured_ns"] / row["steps"] / 1e6)
    assert "compute kernels twice as fast" in text  # what each scenario changes, in words


def test_job_report_without_steps_has_no_critical_path(fleet_warehouse: Warehouse) -> None:
    report = fleet_warehouse.job_report("inspector")  # NCCL records only
    assert report.analysis.critical_path.is_empty() and report.analysis.what_if.is_empty()
    text = job_report(report)
    assert 'id="critical-path"' not in text and 'id="what-if"' not in text


def test_job_report_of_every_kind_of_job_renders(fleet_warehouse: Warehouse) -> None:
    tpu = job_report(fleet_warehouse.job_report("tpu"))
    assert_self_contained(tpu)
    assert "MFU (FLOPs / peak)" in tpu and "No peak known for this link" in tpu  # TPU ICI: no default peak
    nccl = job_report(fleet_warehouse.job_report("inspector"))  # NCCL records only: no device timeline
    parsed = assert_self_contained(nccl)
    assert "have no device operations" in nccl
    assert {a["id"] for a in parsed.named("div") if "plotly-graph-div" in (a.get("class") or "")} == {
        "plot-stragglers", "plot-bandwidth"}


def test_fleet_report_is_self_contained_and_links_jobs(fleet_warehouse: Warehouse) -> None:
    fleet = fleet_warehouse.fleet()
    text = fleet_report(fleet, lambda job: f"jobs/{job}.html" if job != "tpu" else None)
    parsed = assert_self_contained(text)
    divs = {a["id"] for a in parsed.named("div") if "plotly-graph-div" in (a.get("class") or "")}
    assert {"plot-over-time", "plot-wasted-by-job", "plot-wasted-by-team", "plot-wasted-by-cluster",
            "plot-wasted-by-hardware"} == divs
    links = {a["href"] for a in parsed.named("a")}
    assert links == {"jobs/ddp.html", "jobs/launch.html", "jobs/inspector.html"}  # no link where there is no report
    offenders = text[text.index('id="offenders"'):text.index('id="stragglers"')]
    assert offenders.index("jobs/ddp.html") < offenders.index("jobs/launch.html")  # most wasted first
    assert "team=infra, cluster=a" in offenders


def test_empty_fleet_report(fleet_warehouse: Warehouse) -> None:
    oldest = min(r["ingested_at"] for r in fleet_warehouse.traces())
    text = fleet_report(fleet_warehouse.fleet(until=oldest), lambda job: None)
    assert_self_contained(text)
    assert "No device time in this window" in text


def test_trace_strings_are_escaped_in_the_job_report(hostile_home: Path) -> None:
    report = Warehouse(hostile_home).job_report("hostile")
    assert HOSTILE_KERNEL in report.analysis.top_kernels["name"].to_list()
    text = job_report(dataclasses.replace(report, job=HOSTILE_JOB))
    _assert_no_injection(text)
    assert esc(HOSTILE_KERNEL) in text  # the kernels table shows the name as text
    assert esc(HOSTILE_LABEL) in text  # the traces' labels
    assert esc(f"Job report: {HOSTILE_JOB}") in text


def test_trace_strings_are_escaped_in_the_fleet_report(hostile_home: Path, fleet_warehouse: Warehouse) -> None:
    wh = Warehouse(hostile_home)
    fleet = wh.fleet()
    assert fleet.by_label["label_value"].to_list() == [HOSTILE_LABEL]
    text = fleet_report(fleet, lambda job: f"/jobs/{job}")
    _assert_no_injection(text)
    assert esc(f"team={HOSTILE_LABEL}") in text  # the offenders table; the chart gets it as plotly text
    assert plot_text(f"team={HOSTILE_LABEL}").replace("/", "\\u002f") in text  # and plotly.js draws it as text
    # job names cannot hold markup (ingest refuses them); the page escapes them anyway
    traces = fleet_warehouse.registry.frame()
    pairs = list(zip(traces["job"], traces["trace_id"]))
    renamed = traces.with_columns(traces["job"].str.replace("^ddp$", HOSTILE_JOB))
    hostile_fleet = compute_fleet(renamed, fleet_warehouse.store.read_frame("breakdown", pairs), None,
                                  collective_summaries(fleet_warehouse.store.read_frame(
                                      "collectives", pairs).head(0).with_columns(job=traces["job"].head(0))),
                                  since=None, until=None, labels={}, now=fleet.now)
    text = fleet_report(hostile_fleet, lambda job: f"/jobs/{job}?x=<b>")
    _assert_no_injection(text)
    assert f'href="{esc("/jobs/" + HOSTILE_JOB + "?x=<b>")}"' in text


def _assert_no_injection(text: str) -> None:
    parsed = assert_self_contained(text)
    scripts = parsed.named("script")
    figures = [a for a in parsed.named("div") if "plotly-graph-div" in (a.get("class") or "")]
    assert len(scripts) == 2 + len(figures)  # the PlotlyConfig and plotly.js ones, then one per figure
    assert not parsed.named("img") and not parsed.named("b")
    assert "<script>alert" not in text and "<img src=x" not in text
    for script in parsed.scripts:
        assert "</script" not in script.lower()


def test_html_helpers_escape() -> None:
    assert tag("a", "<b>&", href='x" onclick="y') == '<a href="x&quot; onclick=&quot;y">&lt;b&gt;&amp;</a>'
    assert tag("p", tag("b", "ok")) == "<p><b>ok</b></p>"  # markup built here is not escaped twice
    assert plot_text("vector<float, 4> & co") == "vector&lt;float, 4&gt; &amp; co"


# -- the CLI --------------------------------------------------------------------------------------------
def test_cli_report_job(fleet_warehouse_home: Path, tmp_path: Path) -> None:
    out = tmp_path / "reports" / "ddp.html"
    result = runner.invoke(cli, ["report", "job", "ddp", "--out", str(out), "--home", str(fleet_warehouse_home)])
    assert result.exit_code == 0, result.output
    assert_self_contained(out.read_text())
    assert "wrote" in result.output and not list(out.parent.glob(".*partial"))


def test_cli_report_job_unknown(fleet_warehouse_home: Path, tmp_path: Path) -> None:
    result = runner.invoke(cli, ["report", "job", "nope", "--out", str(tmp_path / "x.html"),
                                 "--home", str(fleet_warehouse_home)])
    assert result.exit_code == 1
    assert "no traces in job 'nope'" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "x.html").exists()


def test_cli_report_fleet_writes_the_offenders_reports(fleet_warehouse_home: Path, tmp_path: Path) -> None:
    out = tmp_path / "fleet.html"
    result = runner.invoke(cli, ["report", "fleet", "--since", "7d", "--label", "team=ml", "--out", str(out),
                                 "--home", str(fleet_warehouse_home)])
    assert result.exit_code == 0, result.output
    parsed = assert_self_contained(out.read_text())
    links = sorted({a["href"] or "" for a in parsed.named("a")})
    assert links == ["fleet_jobs/launch.html", "fleet_jobs/tpu.html"]  # only team=ml's jobs
    for href in links:
        assert_self_contained((tmp_path / href).read_text())
    assert "2 job reports" in result.output


def test_cli_report_fleet_without_job_reports(fleet_warehouse_home: Path, tmp_path: Path) -> None:
    out = tmp_path / "fleet.html"
    result = runner.invoke(cli, ["report", "fleet", "--no-job-reports", "--top", "1", "--out", str(out),
                                 "--home", str(fleet_warehouse_home)])
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "fleet_jobs").exists()
    assert not _Page(out.read_text()).named("a")


@pytest.mark.parametrize(("args", "message"), [
    (["--since", "last tuesday"], "invalid time 'last tuesday'"),
    (["--until", "soon"], "invalid time 'soon'"),
    (["--label", "team"], "expected key=value"),
])
def test_cli_report_fleet_usage_errors(fleet_warehouse_home: Path, tmp_path: Path, args: list[str],
                                       message: str) -> None:
    result = runner.invoke(cli, ["report", "fleet", *args, "--out", str(tmp_path / "f.html"),
                                 "--home", str(fleet_warehouse_home)])
    assert result.exit_code == 1 and message in result.output and "Traceback" not in result.output


def test_cli_report_help() -> None:
    for args in (["report", "--help"], ["report", "job", "--help"], ["report", "fleet", "--help"]):
        result = runner.invoke(cli, args)
        assert result.exit_code == 0 and len(result.output.strip().splitlines()) > 3


# -- the API --------------------------------------------------------------------------------------------
@pytest.fixture
def client(fleet_warehouse_home: Path) -> Iterator[TestClient]:
    with TestClient(create_app(ServerSettings(home=fleet_warehouse_home, ingest_workers=0))) as c:
        yield c


def test_api_job_report(client: TestClient) -> None:
    answer = client.get("/api/v1/jobs/ddp/report")
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/html")
    assert_self_contained(answer.text)
    missing = client.get("/api/v1/jobs/nope/report")
    assert missing.status_code == 404 and missing.json() == {"error": "no traces in job 'nope'", "kind": "NotFound"}


def test_api_fleet_report_links_to_job_reports(client: TestClient) -> None:
    answer = client.get("/api/v1/reports/fleet", params={"since": "7d", "label": ["team=ml", "cluster=b"]})
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/html")
    parsed = assert_self_contained(answer.text)
    links = {a["href"] for a in parsed.named("a")}
    assert links == {"/api/v1/jobs/launch/report"}
    assert client.get("/api/v1/jobs/launch/report").status_code == 200


@pytest.mark.parametrize(("params", "message"), [
    ({"since": "whenever"}, "invalid time"),
    ({"label": "nolabel"}, "expected key=value"),
])
def test_api_fleet_report_errors(client: TestClient, params: dict[str, str], message: str) -> None:
    answer = client.get("/api/v1/reports/fleet", params=params)
    assert answer.status_code == 400 and message in answer.json()["error"]


def test_api_reports_need_the_read_scope(fleet_warehouse_home: Path) -> None:
    settings = ServerSettings(home=fleet_warehouse_home, ingest_workers=0, tokens="reader-token-0001:read")
    with TestClient(create_app(settings)) as c:
        for path in ("/api/v1/jobs/ddp/report", "/api/v1/reports/fleet"):
            assert c.get(path).status_code == 401
            assert c.get(path, headers={"Authorization": "Bearer reader-token-0001"}).status_code == 200
