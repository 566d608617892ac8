"""What the CLI, the API and the reports say is true: buckets that add up, kernels that read apart,
warm-up steps, XLA ranks, trace id prefixes, read commands that create nothing, help in words."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st
from support.server import running_server
from tracelake.analysis import findings, steps
from tracelake.analysis.critical_path import totals
from tracelake.api.cli import render as cli_render
from tracelake.api.cli import render_paths
from tracelake.api.app import create_app
from tracelake.api.cli import app
from tracelake.api.reports import job_report
from tracelake.api.settings import ServerSettings
from tracelake.contracts.critical import PATH_KINDS, Scenario
from tracelake.contracts.schema import TABLES
from tracelake.warehouse import InvalidArgument, NotFound, Warehouse
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parent.parent
XLA_SAMPLE = ROOT / "sample_traces" / "xla"
REAL_XLA = ROOT.parent / "shared" / "real_traces" / "xla" / "tpu_inference_2.xplane.pb"
#: Two kernels whose names share their first 64 characters.
PREFIX = "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_"
KERNEL_A = PREFIX + "32x32_128x2_tn_align8_alpha>(Params)"
KERNEL_B = PREFIX + "32x32_128x2_tn_align8_omega>(Params)"


def _run(*args: str, columns: int = 200) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": str(columns), "TERM": "dumb"})
    return result.exit_code, result.output


# -- exclusive and inclusive buckets ---------------------------------------------------------------


def _numbers(cells: list[str]) -> list[float]:
    return [float(c.rstrip("%").replace(",", "")) for c in cells]


def _html_table(html: str, anchor: str) -> tuple[list[str], list[list[str]]]:
    """Headings and cell texts of the first table after ``anchor`` in a report page."""
    start = html.index(anchor)
    body = html[start:html.index("</table>", start)]
    headings = [re.sub(r"<[^>]+>", "", h) for h in re.findall(r"<th[^>]*>(.*?)</th>", body)]
    rows = [[re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row)]
            for row in re.findall(r"<tr>(.*?)</tr>", body)[1:]]
    return headings, rows


def test_job_report_exclusive_buckets_add_up_and_inclusive_are_labelled(sample_warehouse: Warehouse) -> None:
    html = job_report(sample_warehouse.job_report("ddp_straggler"))
    headings, rows = _html_table(html, 'id="breakdown-exclusive"')
    buckets = [i for i, h in enumerate(headings) if h not in ("rank", "span", "total")]
    assert len(buckets) == 6 and len(rows) == 4
    for row in rows:
        assert sum(_numbers([row[i] for i in buckets])) == pytest.approx(100, abs=0.35), row
    # the stored figures, independently: the six exclusive columns make the span
    whole = sample_warehouse.breakdown(job="ddp_straggler")
    exclusive = ("compute_only_ns", "communication_only_ns", "memory_only_ns", "compute_communication_ns",
                 "other_overlap_ns", "idle_ns")
    assert whole.select(pl.sum_horizontal(exclusive)).to_series().to_list() == whole["span_ns"].to_list()
    inclusive_headings, _ = _html_table(html, 'id="breakdown-inclusive"')
    assert "compute" in inclusive_headings and "exposed comm." in inclusive_headings
    before = html[html.index('id="breakdown-exclusive"'):html.index('id="breakdown-inclusive"')]
    assert "Inclusive" in before and "do not add up" in before  # the inclusive table says what it is
    assert "they add up to it" not in html  # the old claim under the inclusive table


def test_analyze_table_shows_exclusive_buckets_that_add_up(sample_warehouse_home: Path) -> None:
    code, out = _run("analyze", "--job", "ddp_straggler", "--home", str(sample_warehouse_home))
    assert code == 0, out
    assert "exclusive" in out and "inclusive" in out
    section = out[out.index("exclusive"):out.index("inclusive")]
    rows = [line for line in section.splitlines() if re.match(r"^│\s+\d+\s+│", line)]
    assert len(rows) == 4
    for line in rows:
        cells = [c.strip() for c in line.strip("│").split("│")]
        # rank, span ms, the six buckets, total
        assert sum(_numbers(cells[2:8])) == pytest.approx(100, abs=0.35), line


# -- what bounds each step, and what if ---------------------------------------------------------------


def _table(out: str, title: str) -> tuple[list[str], list[list[str]]]:
    """Headings and rows of the rich table printed under ``title`` (a row's wrapped lines joined)."""
    lines = out[out.index(title):].splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("┃"))
    headings = [h.strip() for h in lines[head].strip("┃").split("┃")]
    rows: list[list[str]] = []
    for line in lines[head + 1:]:
        if line.startswith("└"):
            break
        if not line.startswith("│"):
            continue
        cells = [c.strip() for c in line.strip("│").split("│")]
        if cells[0] or not rows:
            rows.append(cells)
        else:
            rows[-1] = [a + b for a, b in zip(rows[-1], cells)]
    return headings, rows


def test_analyze_shows_what_bounds_each_step_and_what_if_as_the_json_says(sample_warehouse_home: Path) -> None:
    code, out = _run("analyze", "--job", "ddp_straggler", "--home", str(sample_warehouse_home))
    assert code == 0, out
    code, raw = _run("analyze", "--job", "ddp_straggler", "--json", "--home", str(sample_warehouse_home))
    assert code == 0, raw
    answer = json.loads(raw)
    steps_json = pl.DataFrame(answer["critical_path"])
    what_if = pl.DataFrame(answer["what_if"])
    assert steps_json.height and what_if.height
    # what bounds each step: every step (six), its measured time and bounding rank, the largest kind first
    headings, rows = _table(out, "what bounds each step")
    by_step = {r["step"]: r for r in steps_json.to_dicts()}
    assert sorted(int(r[0]) for r in rows) == sorted(by_step)
    for row in rows:
        step = by_step[int(row[0])]
        assert float(row[headings.index("measured ms")]) == pytest.approx(step["measured_ns"] / 1e6, abs=0.005)
        assert int(row[headings.index("bounding rank")]) == step["bounding_rank"]
        kinds = row[-1].split(", ")
        largest = max(PATH_KINDS, key=lambda k: step[f"{k}_ns"])
        assert kinds[0] == f"{largest} {100 * step[f'{largest}_ns'] / step['length_ns']:.0f}%"
        assert 1 <= len(kinds) <= 3
    # what if: per scenario, the per-step saving critical_path.totals gives over the --json rows
    summed = totals(what_if)
    expected = {r["scenario"]: r["saving_ns"] / r["steps"] / 1e6 for r in summed.to_dicts()}
    headings, rows = _table(out, "what if")
    shown = {r[headings.index("scenario")]: float(r[headings.index("saving ms/step")]) for r in rows}
    # every scenario but the one that needs the job's own nccl-tests output (the sample has none)
    assert set(shown) == set(expected) == {str(s) for s in Scenario} - {Scenario.NCCL_TESTS_BANDWIDTH}
    for scenario, saving in shown.items():
        assert saving == pytest.approx(expected[scenario], abs=0.0005), scenario
    order = [r[headings.index("scenario")] for r in rows]
    assert order[0] == "as_measured" and [expected[s] for s in order[1:]] == sorted(
        (expected[s] for s in order[1:]), reverse=True)


def test_analyze_shows_the_slowest_median_and_fastest_of_many_steps() -> None:
    measured = [5, 9, 1, 7, 3, 8, 2, 6, 4, 10, 11, 12, 13, 0]  # 14 steps: more than MAX_STEP_ROWS
    frame = pl.DataFrame({"step": list(range(14)), "ranks": [2] * 14, "measured_ns": measured,
                          "length_ns": measured, "bounding_rank": [0] * 14,
                          **{f"{k}_ns": [0] * 14 for k in PATH_KINDS}})
    assert render_paths.MAX_STEP_ROWS < 14
    shown, cut = render_paths.shown_steps(frame)
    assert cut and shown["which"].to_list() == ["slowest", "median", "fastest"]
    assert shown["measured_ns"].to_list() == [13, 7, 0]  # of an even count, the slower of the middle two
    view, title = render_paths.bounds_view(frame)
    assert view["step"].to_list() == ["12 (slowest)", "3 (median)", "13 (fastest)"] and "14 steps" in title
    few, cut = render_paths.shown_steps(frame.head(12))
    assert not cut and few["step"].to_list() == list(range(12))
    # with runs, each run on its own
    runs = pl.concat([frame.with_columns(pl.lit("run-1").alias("run")),
                      frame.head(3).with_columns(pl.lit("run-2").alias("run"))]).select("run", *frame.columns)
    shown, cut = render_paths.shown_steps(runs)
    assert shown.filter(pl.col("run") == "run-1").height == 3 and shown.filter(pl.col("run") == "run-2").height == 3


def test_path_kinds_in_words() -> None:
    row = {"length_ns": 100, "compute_ns": 92, "host_ns": 4, "communication_ns": 2, "idle_ns": 1, "sync_ns": 1}
    assert render_paths.path_kinds(row) == "compute 92%, host 4%, communication 2%"
    assert render_paths.path_kinds({"length_ns": 0}) == ""


# -- kernel names -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kernel_home(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """A warehouse with the launch-bound trace and a copy whose two busiest kernels share 64 characters."""
    folder = tmp_path_factory.mktemp("kernels")
    source = ROOT / "sample_traces" / "kineto" / "launch_bound" / "rank-0.json.gz"
    trace = json.loads(gzip.decompress(source.read_bytes()))
    names = sorted({e["name"] for e in trace["traceEvents"] if e.get("cat") == "kernel"})
    renamed = {names[0]: KERNEL_A, names[1]: KERNEL_B}
    for event in trace["traceEvents"]:
        if event.get("cat") == "kernel" and event["name"] in renamed:
            event["name"] = renamed[event["name"]]
    modified = folder / "rank-0-renamed.json.gz"
    modified.write_bytes(gzip.compress(json.dumps(trace).encode()))
    home = folder / "warehouse"
    wh = Warehouse(home)
    a = wh.ingest([source], job="base").results[0]
    b = wh.ingest([modified], job="renamed").results[0]
    assert a.trace_id and b.trace_id
    return home, a.trace_id, b.trace_id


def _kernel_cells(out: str, title: str, key_column: int) -> list[str]:
    """The kernel column of the table under ``title``, a row's wrapped lines joined; a row starts where
    column ``key_column`` is not empty."""
    lines = out[out.index(title):].splitlines()
    cells: list[str] = []
    for line in lines[1:]:
        if line.startswith("└"):
            break
        if not line.startswith("│"):
            continue
        parts = [p.strip() for p in line.strip("│").split("│")]
        if parts[key_column]:
            cells.append(parts[0])
        elif cells:
            cells[-1] += parts[0]
    return cells


@pytest.mark.parametrize("columns", [80, 200])
def test_kernels_sharing_a_long_prefix_print_distinct(kernel_home: tuple[Path, str, str], columns: int) -> None:
    home, base, renamed = kernel_home
    code, out = _run("analyze", renamed, "--home", str(home), columns=columns)
    assert code == 0, out
    top = _kernel_cells(out, "top kernels", key_column=2)
    shared = [c for c in top if c.startswith(PREFIX.removeprefix("void ")[:20])]
    assert len(shared) == 2, top
    assert len(set(top)) == len(top), top
    code, out = _run("diff", base, renamed, "--home", str(home), columns=columns)
    assert code == 0, out
    changed = _kernel_cells(out, "kernels, biggest change first", key_column=1)
    assert len([c for c in changed if c.startswith(PREFIX.removeprefix("void ")[:20])]) == 2, changed
    assert len(set(changed)) == len(changed), changed
    assert max(len(line) for line in out.splitlines()) <= columns


def test_json_and_html_keep_whole_kernel_names(kernel_home: tuple[Path, str, str]) -> None:
    home, base, renamed = kernel_home
    code, out = _run("analyze", renamed, "--json", "--home", str(home))
    assert code == 0
    names = {k["name"] for k in json.loads(out)["top_kernels"]}
    assert {KERNEL_A, KERNEL_B} <= names
    code, out = _run("diff", base, renamed, "--json", "--home", str(home))
    assert {KERNEL_A, KERNEL_B} <= {k["name"] for k in json.loads(out)["kernels"]}
    html = job_report(Warehouse(home).job_report("renamed"))
    assert KERNEL_A.replace("<", "&lt;").replace(">", "&gt;") in html
    assert KERNEL_B.replace("<", "&lt;").replace(">", "&gt;") in html


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(alphabet="ab<>:, _(x)", min_size=0, max_size=30), min_size=1, max_size=12),
       st.integers(min_value=0, max_value=80), st.integers(min_value=1, max_value=120))
def test_kernel_labels_never_merge_two_names(tails: list[str], shared: int, width: int) -> None:
    names = ["void " + "k" * shared + tail for tail in tails]
    labels = cli_render.kernel_labels(names, width)
    assert len(labels) == len(names)
    assert len({label for label in labels}) == len(set(names))
    for name, label in zip(names, labels):  # the same name, the same label
        assert labels[names.index(name)] == label


# -- warm-up steps ------------------------------------------------------------------------------------


def test_first_step_is_flagged_as_warmup_not_outlier() -> None:
    durs = [900, 100, 101, 99, 100, 100, 180, 100]
    frame = pl.DataFrame({"trace_id": ["t"] * 8, "rank": [0] * 8, "step": list(range(3, 11)), "dur_ns": durs})
    flagged = steps.step_outliers(frame)
    by_step = {r["step"]: r for r in flagged.to_dicts()}
    assert by_step[3]["warmup"] is True and by_step[9]["warmup"] is False
    assert by_step[9]["p50_ns"] == 100  # the median leaves the warm-up out
    found = {f.kind: f for f in findings.from_step_outliers(flagged)}
    assert found["slow_steps"].title.startswith("1 step(s)") and found["slow_steps"].gain_ns == 80
    assert found["warmup_step"].gain_ns == 0 and "warm-up" in found["warmup_step"].title
    only_warm = steps.step_outliers(frame.filter(pl.col("step") != 9))
    assert [f.kind for f in findings.from_step_outliers(only_warm)] == ["warmup_step"]


def test_a_later_slow_step_is_still_an_outlier() -> None:
    frame = pl.DataFrame({"trace_id": ["t"] * 6, "rank": [1] * 6, "step": list(range(6)),
                          "dur_ns": [100, 100, 100, 400, 100, 100]})
    flagged = steps.step_outliers(frame)
    assert flagged["step"].to_list() == [3] and flagged["warmup"].to_list() == [False]


# -- XLA ranks ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("source", [XLA_SAMPLE, pytest.param(REAL_XLA, marks=pytest.mark.slow)],
                         ids=["sample", "tpu_inference_2"])
def test_xla_ranks_agree_between_traces_and_analyze(tmp_path: Path, source: Path) -> None:
    if not source.exists():
        pytest.skip(f"{source} is not present")
    home = tmp_path / "warehouse"
    code, out = _run("ingest", str(source), "--job", "tpu", "--quiet", "--home", str(home))
    assert code == 0, out
    code, out = _run("traces", "--format", "json", "--home", str(home))
    listed = {rank for row in json.loads(out) for rank in row["ranks"]}
    code, out = _run("analyze", "--job", "tpu", "--json", "--home", str(home))
    analysed = {row["rank"] for row in json.loads(out)["breakdown"]}
    code, out = _run("sql", "SELECT DISTINCT rank FROM device_ops", "--format", "json", "--home", str(home))
    devices = {row["rank"] for row in json.loads(out)}
    assert len(devices) > 1 and listed == analysed == devices
    code, out = _run("traces", "--home", str(home), columns=200)
    ranks = sorted(devices)
    assert f"{ranks[0]}-{ranks[-1]}" in out


# -- trace id prefixes -------------------------------------------------------------------------------


def test_unique_prefixes_name_a_trace_everywhere(kernel_home: tuple[Path, str, str]) -> None:
    home, base, renamed = kernel_home
    wh = Warehouse(home)
    assert wh.trace(base[:6])["trace_id"] == base
    assert wh.analyze(trace_id=renamed[:5]).breakdown["trace_id"].to_list() == [renamed]
    code, out = _run("analyze", base[:4], "--json", "--home", str(home))
    assert code == 0 and json.loads(out)["breakdown"][0]["trace_id"] == base
    code, out = _run("diff", base[:8], renamed[:8], "--json", "--home", str(home))
    assert code == 0 and json.loads(out)["kernels"]
    with TestClient(create_app(ServerSettings(home=home, ingest_workers=0))) as client:
        answer = client.get(f"/api/v1/traces/{renamed[:7]}")
        assert answer.status_code == 200 and answer.json()["trace_id"] == renamed


def test_short_and_unknown_prefixes_are_refused(kernel_home: tuple[Path, str, str]) -> None:
    home, base, _ = kernel_home
    with pytest.raises(NotFound, match="at least 4 characters"):
        Warehouse(home).trace(base[:3])
    code, out = _run("analyze", base[:3], "--home", str(home))
    assert code == 1 and "at least 4 characters" in out
    code, out = _run("analyze", "ffff" if not base.startswith("ffff") else "0000", "--home", str(home))
    assert code == 1 and "no trace with id" in out


def test_ambiguous_prefix_lists_the_candidates(tmp_path: Path) -> None:
    home = tmp_path / "warehouse"
    wh = Warehouse(home)
    result = wh.ingest([ROOT / "sample_traces" / "kineto" / "launch_bound"], job="j").results[0]
    assert result.trace_id
    # two more registrations whose ids share a prefix (real ids are content hashes: made by copying a file)
    registry = home / "tables" / "traces" / "job=j"
    twins = ["abcde" + "1" * 15, "abcde" + "2" * 15]
    for twin in twins:
        shutil.copy(registry / f"{result.trace_id}.parquet", registry / f"{twin}.parquet")
    with pytest.raises(InvalidArgument) as caught:
        wh.analyze(trace_id="abcd")
    assert all(t in str(caught.value) for t in twins) and "ambiguous" in str(caught.value)
    code, out = _run("analyze", "abcde", "--home", str(home))
    assert code == 1 and all(t in out for t in twins)
    with TestClient(create_app(ServerSettings(home=home, ingest_workers=0))) as client:
        answer = client.get("/api/v1/traces/abcd")
        assert answer.status_code == 400 and twins[0] in answer.json()["error"]


# -- read commands on a mistyped home -------------------------------------------------------------------


@pytest.mark.parametrize("args", [
    ["traces"], ["sql", "SELECT 1"], ["analyze", "--job", "x"], ["diff", "a", "b"], ["report", "job", "x"],
    ["report", "fleet"], ["report", "list"], ["check"],
])
def test_read_commands_never_create_a_warehouse(tmp_path: Path, args: list[str]) -> None:
    missing = tmp_path / "no" / "such" / "home"
    code, out = _run(*args, "--home", str(missing))
    assert code != 0
    assert f"no warehouse at {missing}" in out.replace("\n", "")
    assert not missing.exists() and not (tmp_path / "no").exists()


# -- the trace list in 80 columns ------------------------------------------------------------------------


def test_traces_fit_80_columns_without_wrapping_ids(sample_warehouse_home: Path) -> None:
    wh = Warehouse(sample_warehouse_home)
    ids = [t["trace_id"] for t in wh.traces()]
    code, out = _run("traces", "--home", str(sample_warehouse_home), columns=80)
    assert code == 0, out
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80
    shown = [line.split()[0] for line in lines if line.strip() and line.split()[0][:4] in {i[:4] for i in ids}]
    assert len(shown) == len(ids)
    for prefix in shown:  # each id whole or a prefix of 12 or more, on one line, naming one trace
        assert len(prefix) >= 12 and sum(i.startswith(prefix) for i in ids) == 1
    code, out = _run("traces", "--home", str(sample_warehouse_home), columns=200)
    assert all(i in out for i in ids)


# -- ingest failures name the whole path -------------------------------------------------------------------


def test_ingest_failure_prints_the_full_path(tmp_path: Path) -> None:
    folder = tmp_path / "deep" / "runs"
    folder.mkdir(parents=True)
    (folder / "broken.json").write_text('{"traceEvents": [ {"ph": "X", ')
    code, out = _run("ingest", str(tmp_path / "deep"), "--quiet", "--home", str(tmp_path / "warehouse"))
    assert code == 1
    assert f"{folder / 'broken.json'}:" in out.replace("\n", "")


# -- help in words -----------------------------------------------------------------------------------------


def _commands() -> list[list[str]]:
    return [[c] for c in ("ingest", "traces", "sql", "analyze", "diff", "demo", "serve", "check", "version")] + [
        ["report", c] for c in ("job", "fleet", "scheduled", "list")] + [[], ["report"]]


@pytest.mark.parametrize("command", _commands(), ids=lambda c: " ".join(c) or "tracelake")
def test_help_placeholders_are_words(command: list[str]) -> None:
    code, out = _run(*command, "--help")
    assert code == 0, out
    for python_type in ("<bool>", "<str>", "<int", "<float", "<path>", "<list", "TEXT", "INTEGER", "BOOLEAN"):
        assert python_type not in out, (command, python_type)


def test_sql_help_names_every_table() -> None:
    code, out = _run("sql", "--help", columns=300)
    assert code == 0
    text = " ".join(out.replace("│", " ").split())
    missing = [name for name in TABLES if name not in text]
    assert not missing


# -- SQL over a real server without a Content-Type ----------------------------------------------------


@pytest.fixture
def server(tmp_path: Path, sample_warehouse_home: Path) -> Iterator[tuple[str, Path]]:
    """A real server without tokens (loopback) over a copy of the sample warehouse; its URL and home."""
    home = tmp_path / "warehouse"
    shutil.copytree(sample_warehouse_home, home)
    env = {**os.environ, "TRACELAKE_HOME": str(home)}
    env.pop("TRACELAKE_TOKENS", None)
    env.pop("TRACELAKE_TOKENS_FILE", None)
    with running_server(["--ingest-workers", "0"], env, tmp_path / "server.log") as url:
        yield url, home


@pytest.mark.slow  # a real uvicorn server
def test_sql_post_without_content_type_on_a_real_server(server: tuple[str, Path]) -> None:
    url, home = server
    expected = len(list((home / "tables" / "traces").glob("job=*/*.parquet"))) - 1  # less the schema file
    body = b'{"sql": "SELECT count(*) AS n FROM traces"}'
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:  # HTTP/1.0: no chunks, closed at the end
        s.sendall(b"POST /api/v1/sql HTTP/1.0\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, answer = data.partition(b"\r\n\r\n")
    assert head.split(b" ")[1] == b"200", data
    assert json.loads(answer)["rows"] == [[expected]] and expected > 0
    if shutil.which("curl"):  # curl -d labels the body application/x-www-form-urlencoded
        done = subprocess.run(["curl", "-s", "-d", body.decode(), f"{url}/api/v1/sql"], capture_output=True,
                              timeout=60, check=False)
        assert done.returncode == 0 and json.loads(done.stdout)["rows"] == [[expected]], done.stdout
