"""The top operators (docs/analyses.md, "Operators") where people look: ``Analysis.top_operators``, ``analyze``'s
table and ``--json``, the job report's section, and MFU in the breakdown table; against the raw JSON, DuckDB and an
independent polars group-by over the stored ``op_stats`` rows."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from support import ROOT
from tracelake.analysis.operators import OTHER_OPERATORS, top_operators
from tracelake.api.cli import app
from tracelake.api.reports.job import render
from tracelake.warehouse import Warehouse

H200 = ROOT / "sample_traces" / "gpu_h200"
NCCL_TESTS = ROOT / "sample_traces" / "nccl" / "nccl_tests" / "all_reduce_perf.txt"
DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
runner = CliRunner()


def _ingest(home: Path, scenario: str) -> Warehouse:
    wh = Warehouse(home)
    report = wh.ingest([H200 / scenario], job=scenario)
    assert all(r.ok for r in report.results), [r.error for r in report.results]
    return wh


def _op_stats(wh: Warehouse) -> pl.DataFrame:
    result = wh.query("SELECT * FROM op_stats")
    return pl.DataFrame(result.rows, schema=result.columns, orient="row", infer_schema_length=None)


def _raw_device_us(scenario: str) -> tuple[float, int]:
    """Summed ``dur`` (us) and count of the trace's kernels, memcpys and memsets, read from the JSON itself."""
    (path,) = (H200 / scenario).glob("*.pt.trace.json.gz")
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    durs = [float(e.get("dur", 0)) for e in events if e.get("ph") == "X" and e.get("cat") in DEVICE_CATS]
    return sum(durs), len(durs)


@pytest.mark.parametrize("scenario", ["train", "conv"])
def test_top_operators_add_up_to_the_device_time(tmp_path: Path, scenario: str) -> None:
    wh = _ingest(tmp_path / "wh", scenario)
    top = wh.analyze(job=scenario).top_operators
    assert 1 < top.height <= 9  # the default top of 8, then the rest
    stored = wh.query("SELECT sum(device_ns), count(*) FROM op_stats").rows[0]
    assert top["device_ns"].sum() == stored[0]
    assert top["count"].sum() == wh.query("SELECT sum(count) FROM op_stats").rows[0][0]
    assert abs(top["share_pct"].sum() - 100) <= 0.01
    # every kernel, memcpy and memset of the JSON is in some row ((no operator) included): ns rounding aside
    raw_us, n = _raw_device_us(scenario)
    assert abs(top["device_ns"].sum() - raw_us * 1000) <= n
    if stored[1] > 8:
        assert top["op"][-1] == OTHER_OPERATORS and top.height == 9
    ranked = top.filter(pl.col("op") != OTHER_OPERATORS)["device_ns"].to_list()
    assert ranked == sorted(ranked, reverse=True)


def test_top_rows_match_a_group_by_of_the_stored_rows(tmp_path: Path) -> None:
    wh = _ingest(tmp_path / "wh", "train")
    rows = _op_stats(wh)
    expected = rows.group_by("op", "input_shapes", "dtype").agg(
        pl.col("count").sum(), pl.col("device_ns").sum(), pl.col("flops").sum(), pl.col("kernels").sum()
    ).sort("device_ns", descending=True)
    top = wh.analyze(job="train", top=3).top_operators
    assert top.height == 4 and top["op"][-1] == OTHER_OPERATORS
    for got, want in zip(top.head(3).to_dicts(), expected.head(3).to_dicts()):
        assert (got["op"], got["input_shapes"], got["dtype"]) == (want["op"], want["input_shapes"], want["dtype"])
        assert (got["count"], got["device_ns"], got["kernels"]) == (want["count"], want["device_ns"], want["kernels"])
        if got["flops"] is not None:
            assert got["flops"] == pytest.approx(want["flops"])
            assert got["achieved_tflops"] == pytest.approx(want["flops"] / want["device_ns"] / 1e3)
    assert top["device_ns"][-1] == expected["device_ns"].slice(3).sum()
    top_op = top.row(0, named=True)
    assert top_op["op"] == "aten::_cudnn_attention_backward" and top_op["bound"] == "compute"
    assert 0 < top_op["pct_of_roofline"] < 100


def test_summing_over_ranks() -> None:
    """Two ranks of one op: counts and times add, the roofline share is weighted by device time, and an op
    without an estimate keeps null FLOPs (never 0)."""
    base = {"trace_id": "t", "op": "aten::mm", "input_shapes": "[[2,2],[2,2]]", "dtype": "bf16", "kind": "matmul",
            "host_ns": 5, "bytes": 10, "arithmetic_intensity": 1.0, "above_roofline": False}
    rows = pl.DataFrame([
        {**base, "rank": 0, "count": 2, "device_ns": 100, "kernels": 2, "flops": 1e6, "achieved_tflops": 0.01,
         "bound": "compute", "pct_of_roofline": 50.0},
        {**base, "rank": 1, "count": 1, "device_ns": 300, "kernels": 1, "flops": 3e6, "achieved_tflops": 0.01,
         "bound": "compute", "pct_of_roofline": 10.0},
        {**base, "rank": 0, "op": "aten::cat", "dtype": None, "kind": None, "count": 4, "device_ns": 50, "kernels": 4,
         "flops": None, "achieved_tflops": None, "bound": None, "pct_of_roofline": None},
    ])
    top = top_operators(rows, top=8)
    assert top["op"].to_list() == ["aten::mm", "aten::cat"]
    mm = top.row(0, named=True)
    assert (mm["count"], mm["device_ns"], mm["kernels"], mm["host_ns"]) == (3, 400, 3, 10)
    assert mm["flops"] == 4e6 and mm["achieved_tflops"] == pytest.approx(4e6 / 400 / 1e3)
    assert mm["pct_of_roofline"] == pytest.approx((50 * 100 + 10 * 300) / 400)
    assert top["flops"][1] is None
    assert top["share_pct"].to_list() == pytest.approx([400 / 450 * 100, 50 / 450 * 100])
    rest = top_operators(rows, top=1)
    assert rest["op"].to_list() == ["aten::mm", OTHER_OPERATORS] and rest["flops"][1] is None
    assert top_operators(rows.clear(), top=8).is_empty()


def test_analyze_prints_the_top_operators_and_mfu(tmp_path: Path) -> None:
    home = tmp_path / "wh"
    _ingest(home, "train")
    result = runner.invoke(app, ["analyze", "--job", "train", "--home", str(home)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "top operators" in result.output
    assert "aten::_cudnn_attention_backward" in result.output and OTHER_OPERATORS in result.output
    assert "MFU %" in result.output
    result = runner.invoke(app, ["analyze", "--job", "train", "--home", str(home), "--json"])
    assert result.exit_code == 0, result.output
    answer = json.loads(result.output)
    assert answer["top_operators"][0]["op"] == "aten::_cudnn_attention_backward"
    assert abs(sum(r["share_pct"] for r in answer["top_operators"]) - 100) <= 0.01
    assert all(r["mfu_pct"] is not None for r in answer["breakdown"])


def test_job_report_has_the_top_operators(tmp_path: Path) -> None:
    wh = _ingest(tmp_path / "wh", "conv")
    top = wh.analyze(job="conv").top_operators
    html = render(wh.job_report("conv"))
    assert "Top operators" in html and 'id="operators"' in html
    assert top["op"][0] in html


def test_no_operators_no_table(tmp_path: Path) -> None:
    home = tmp_path / "wh"
    wh = Warehouse(home)
    wh.ingest([NCCL_TESTS], job="bench")
    assert wh.analyze(job="bench").top_operators.is_empty()
    result = runner.invoke(app, ["analyze", "--job", "bench", "--home", str(home)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "top operators" not in result.output and "MFU %" not in result.output
    assert json.loads(runner.invoke(app, ["analyze", "--job", "bench", "--home", str(home), "--json"]).output)[
        "top_operators"] == []
    assert "Top operators" not in render(wh.job_report("bench"))
