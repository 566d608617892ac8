"""The operators whose fix would move MFU most (analysis/operator_findings.py; docs/analyses.md, "Operator findings").

Truth: the bounds hold for any ``op_stats`` rows (hypothesis): a saving never exceeds the rank's span, the step never
shortens by more than 100%, MFU after the fix never exceeds 100 nor falls below MFU before it. On the H200 GPT
(sample_traces/gpu_h200/train), the findings' savings equal device time x (1 - % of roofline / 100) of the stored rows
read back with DuckDB (added up over an operator's rows), and the MFU after the fix equals MFU x span / (span - saving) computed here.
"""

from __future__ import annotations

import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st

from support import ROOT
from tracelake.analysis.operator_findings import from_op_stats, savings, shapes_text
from tracelake.warehouse import Warehouse

H200 = ROOT / "sample_traces" / "gpu_h200"
KINDS = ("matmul", "conv", "attention", "norm", "elementwise", None)


@st.composite
def _selection(draw: st.DrawFn) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``op_stats`` rows of one to three ranks, and their whole-trace breakdown rows (span, MFU)."""
    ranks = draw(st.integers(1, 3))
    rows, whole = [], []
    for rank in range(ranks):
        span = draw(st.integers(1, 10**10))
        mfu = draw(st.one_of(st.none(), st.floats(0, 100)))
        whole.append({"trace_id": f"t{rank}", "rank": rank, "span_ns": span, "mfu_pct": mfu})
        for i in range(draw(st.integers(0, 6))):
            rows.append({
                "trace_id": f"t{rank}", "rank": rank, "op": f"aten::op{i % 3}", "input_shapes": f"[[{i + 1}, 8]]",
                "dtype": draw(st.sampled_from(["bf16", "fp32", None])), "kind": draw(st.sampled_from(KINDS)),
                # device time of an op may exceed the span: kernels on several streams overlap
                "device_ns": draw(st.integers(0, 3 * 10**10)),
                "pct_of_roofline": draw(st.one_of(st.none(), st.floats(0, 250))),
                "bound": "compute", "achieved_tflops": 1.0,
            })
    schema = {"trace_id": pl.String, "rank": pl.Int32, "op": pl.String, "input_shapes": pl.String,
              "dtype": pl.String, "kind": pl.String, "device_ns": pl.Int64, "pct_of_roofline": pl.Float64,
              "bound": pl.String, "achieved_tflops": pl.Float64}
    return (pl.DataFrame(rows, schema=schema),
            pl.DataFrame(whole, schema={"trace_id": pl.String, "rank": pl.Int32, "span_ns": pl.Int64,
                                        "mfu_pct": pl.Float64}))


@given(_selection())
def test_savings_are_bounded(selection: tuple[pl.DataFrame, pl.DataFrame]) -> None:
    op_stats, whole = selection
    found = savings(op_stats, whole)
    for r in found.to_dicts():
        assert 0 <= r["saving_ns"] <= r["span_ns"]
        assert r["saving_ns"] <= r["device_ns"]
        assert 0 <= r["step_shorter_pct"] <= 100
        assert r["kind"] in ("matmul", "conv", "attention")
        if r["mfu_pct"] is None:
            assert r["mfu_after_pct"] is None
        else:
            assert r["mfu_pct"] - 1e-9 <= r["mfu_after_pct"] <= 100
        assert r["pct_of_roofline"] is None or min(r["pct_of_roofline"], 100) <= r["attainable_pct"] + 1e-9
        assert r["attainable_pct"] <= 100 and 0 <= r["attainable_saving_ns"] <= r["saving_ns"]
    spans = dict(zip(whole["trace_id"].to_list(), whole["span_ns"].to_list()))
    for f in from_op_stats(op_stats, whole):
        assert 0 <= f.gain_ns <= spans[f.traces[0]]


def test_a_row_at_its_roof_saves_nothing_and_one_far_below_saves_its_time() -> None:
    op_stats = pl.DataFrame({"trace_id": ["t", "t"], "rank": [0, 0], "op": ["aten::mm", "aten::bmm"],
                             "input_shapes": ["[[4096, 4096], [4096, 4096]]", "[[8, 64, 64], [8, 64, 64]]"],
                             "dtype": ["bf16", "bf16"], "kind": ["matmul", "matmul"],
                             "device_ns": [6_000_000, 4_000_000], "pct_of_roofline": [100.0, 25.0],
                             "bound": ["compute", "memory"], "achieved_tflops": [989.5, 10.0]})
    whole = pl.DataFrame({"trace_id": ["t"], "rank": [0], "span_ns": [20_000_000], "mfu_pct": [30.0]})
    (finding,) = from_op_stats(op_stats, whole)
    assert finding.gain_ns == 3_000_000  # 4 ms at 25% of its roof: 3 ms back
    assert finding.title == "aten::bmm [8x64x64, 8x64x64 bf16] takes 40% of device time at 25% of its roofline"
    after = 30.0 * 20 / (20 - 3)
    assert f"the step would be 15% shorter and MFU 30.0% -> {after:.1f}%" in finding.detail


def test_shapes_text_names_tensors_only() -> None:
    assert shapes_text("[[4096], [8192, 1024], [], [1024, 4096]]") == "4096, 8192x1024, 1024x4096"
    assert shapes_text(None) == ""
    assert shapes_text("[[" + ", ".join(["1"] * 100) + "]]", 20).endswith("…")


@pytest.fixture(scope="module")
def train(tmp_path_factory: pytest.TempPathFactory) -> Warehouse:
    wh = Warehouse(tmp_path_factory.mktemp("wh"))
    report = wh.ingest([H200 / "train"], job="train")
    assert all(r.ok for r in report.results)
    return wh


def test_h200_gpt_findings_end_to_end(train: Warehouse) -> None:
    result = train.analyze(job="train")
    found = [f for f in result.findings if f.kind == "operator_roofline"]
    assert 1 <= len(found) <= 3
    rows = train.query(  # an operator's rows (one per module calling it) add up
        "WITH ops AS (SELECT o.trace_id, o.rank, o.op, any_value(o.input_shapes) AS shapes, o.dtype, o.kind, "
        "sum(o.device_ns) AS device_ns, sum(o.pct_of_roofline * o.device_ns) / sum(o.device_ns) AS pct, "
        "any_value(b.span_ns) AS span, any_value(b.mfu_pct) AS mfu, "
        "floor(sum(o.device_ns * (1 - least(o.pct_of_roofline, 100) / 100))) AS saving "
        "FROM op_stats o JOIN breakdown b ON b.trace_id = o.trace_id AND b.rank = o.rank AND b.step IS NULL "
        "WHERE o.kind IN ('matmul', 'conv', 'attention') AND o.pct_of_roofline IS NOT NULL "
        "GROUP BY o.trace_id, o.rank, o.op, o.input_shapes, o.dtype, o.kind), "
        "shares AS (SELECT ops.*, 100.0 * device_ns / (SELECT sum(device_ns) FROM op_stats p "
        "WHERE p.trace_id = ops.trace_id AND p.rank = ops.rank) AS share FROM ops), "
        "best AS (SELECT trace_id, rank, kind, max(least(pct, 100)) AS best FROM shares WHERE share >= 1 GROUP BY ALL) "
        "SELECT s.op, s.shapes, s.dtype, s.device_ns, s.pct, s.span, s.mfu, s.saving, "
        "least(floor(s.device_ns * (1 - least(s.pct, 100) / greatest(least(s.pct, 100), coalesce(b.best, 0)))), "
        "s.saving) AS attainable "
        "FROM shares s LEFT JOIN best b USING (trace_id, rank, kind) ORDER BY s.saving DESC").rows
    top = rows[:len(found)]
    found = sorted(found, key=lambda f: -next(r[7] for r in rows if f.title.startswith(r[0])
                                               and f"at {r[4]:.0f}% of" in f.title))
    for finding, (op, _, dtype, device_ns, pct, span, mfu, saving, attainable) in zip(found, top):
        assert finding.title.startswith(op) and f" {dtype}]" in finding.title
        assert finding.gain_ns == attainable <= saving <= span
        assert f"at {pct:.0f}% of its roofline" in finding.title
        assert f"MFU {mfu:.1f}% -> {mfu * span / (span - saving):.1f}%" in finding.detail
        assert f"{100 * saving / span:.0f}% shorter" in finding.detail
    # the GPT's step is bounded by far more than its matmuls: no single operator gives back most of it
    assert all(f.gain_ns < 0.2 * rows[0][5] for f in found)
