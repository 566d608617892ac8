"""The 6·N·D cross-check from user labels (analysis/model_flops.py; docs/analyses.md, "6·N·D cross-check").

Truth: the H200 GPT of sample_traces/capture_gpu.py (6 layers, d=1024, 16 heads, vocabulary 8192, 8 x 1024 tokens per
step) ingested with its N and D as labels: 6·N·D is computed here from the model, and the operators' count per step
is 6·N·D plus its causal attention (2.5x backward), both counted here from the model. ``analyze --json`` carries the same figures; a mislabelled N makes a finding.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from support import ROOT
from tracelake.analysis.model_flops import cross_check
from tracelake.api.cli.render_ops import model_flops_lines
from tracelake.api.cli import app
from tracelake.warehouse import Warehouse

H200 = ROOT / "sample_traces" / "gpu_h200"
LAYERS, D_MODEL, HEADS, VOCAB, BATCH, SEQ = 6, 1024, 16, 8192, 8, 1024
PARAMS = LAYERS * 12 * D_MODEL * D_MODEL + D_MODEL * VOCAB  # qkv, proj, fc1, fc2 per layer; the head
TOKENS = BATCH * SEQ
#: Attention as the operators count it: QK^T and PV, causal (halved), forward once and backward 2.5x.
ATTENTION_COUNTED = LAYERS * 4 * BATCH * HEADS * SEQ * SEQ * (D_MODEL // HEADS) / 2 * 3.5
runner = CliRunner()


def _ingest(home: Path, labels: dict[str, str]) -> Warehouse:
    wh = Warehouse(home)
    report = wh.ingest([H200 / "train"], job="train", labels=labels)
    assert all(r.ok for r in report.results)
    return wh


def test_six_n_d_against_the_operators_count(tmp_path: Path) -> None:
    wh = _ingest(tmp_path, {"params": str(PARAMS), "tokens_per_step": str(TOKENS)})
    (row,) = wh.analyze(job="train").model_flops.to_dicts()  # the memory timeline beside it has no operators
    assert row["model_flops_6nd"] == 6 * PARAMS * TOKENS
    assert row["attention_flops"] is None and row["steps"] == 3
    expected = 6 * PARAMS * TOKENS + ATTENTION_COUNTED
    assert row["model_flops_counted"] == pytest.approx(expected, rel=0.005)
    assert row["ratio"] == pytest.approx(expected / (6 * PARAMS * TOKENS), rel=0.005)
    assert "aten::_fused_adamw_" in row["no_estimate"]  # the optimizer has no cost rule
    assert not [f for f in wh.analyze(job="train").findings if f.kind == "model_flops_mismatch"]  # 1.09x: within 25%
    out = runner.invoke(app, ["analyze", "--job", "train", "--json", "--home", str(tmp_path)])
    assert out.exit_code == 0, out.output
    (shown,) = json.loads(out.stdout)["model_flops"]
    assert shown["model_flops_6nd"] == 6 * PARAMS * TOKENS
    assert shown["model_flops_counted"] == pytest.approx(row["model_flops_counted"])
    (line,) = model_flops_lines(wh.analyze(job="train").model_flops)
    assert line == (f"model FLOPs per step, rank 0: counted {expected:.3g}, 6ND {6 * PARAMS * TOKENS:.3g} "
                    f"({expected / (6 * PARAMS * TOKENS):.2f}x)")


def test_the_attention_labels_add_12_l_h_q_t(tmp_path: Path) -> None:
    labels = {"params": str(PARAMS), "tokens_per_step": str(TOKENS), "layers": str(LAYERS), "heads": str(HEADS),
              "head_dim": str(D_MODEL // HEADS), "seq_len": str(SEQ)}
    (row,) = _ingest(tmp_path, labels).analyze(job="train").model_flops.to_dicts()
    assert row["attention_flops"] == 12 * LAYERS * HEADS * (D_MODEL // HEADS) * SEQ * TOKENS
    # 12·L·H·Q·T·D is unmasked attention at a 2x backward (3 x 4·L·H·Q·T per token); the GPT's is causal, at 2.5x
    six_nd, attention = 6 * PARAMS * TOKENS, 12 * LAYERS * HEADS * (D_MODEL // HEADS) * SEQ * TOKENS
    assert row["ratio"] == pytest.approx((six_nd + ATTENTION_COUNTED) / (six_nd + attention), rel=0.005)


@pytest.mark.parametrize(("factor", "words"), [(0.25, "recomputed forward ops"), (4.0, "shapes or estimates missing")])
def test_a_count_far_from_six_n_d_is_a_finding(tmp_path: Path, factor: float, words: str) -> None:
    wh = _ingest(tmp_path, {"params": str(PARAMS * factor), "tokens_per_step": str(TOKENS)})
    (finding,) = [f for f in wh.analyze(job="train").findings if f.kind == "model_flops_mismatch"]
    ratio = (6 * PARAMS * TOKENS + ATTENTION_COUNTED) / (6 * PARAMS * factor * TOKENS)
    assert finding.title == f"counted FLOPs are {ratio:.2f}x of 6ND on rank 0"
    assert words in finding.detail and finding.gain_ns == 0


def test_no_labels_no_rows() -> None:
    traces = pl.DataFrame({"trace_id": ["a", "b"], "rank": [0, 1], "labels": [{"team": "x"}, {"params": "oops"}],
                           "step_count": [3, 3], "device_op_count": [10, 10]})
    assert cross_check(traces, pl.DataFrame()).is_empty()
