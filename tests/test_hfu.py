"""HFU beside MFU (analysis/recompute.py, analysis/breakdown.py; docs/analyses.md, "HFU and MFU").

Truth: a Kineto trace made here of one checkpointed linear layer on an H200: its forward ``addmm`` runs once in the
forward and once more inside ``CheckpointFunctionBackward`` (the recomputation), then ``AddmmBackward0`` runs the two
gradient ``mm``s. Each of the four matmuls is 2·M·K·N (counted here from the shapes written), so HFU = 4 matmuls and
MFU = 3 matmuls over (989.5 TFLOP/s x the span), the span read from the kernels written here.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from tracelake import ingest
from tracelake.analysis.breakdown import breakdown_frame
from tracelake.analysis.recompute import recomputed_events
from tracelake.api.cli.render import inclusive_view
from tracelake.warehouse import Warehouse

M, K, N = 4096, 2048, 8192
MATMUL = 2 * M * K * N
H200_BF16 = 989.5e12  # H200 SXM dense bf16 (NVIDIA datasheet), FLOP/s
BF16 = "c10::BFloat16"
KERNEL_US = 100.0
#: (launch correlation, start of its kernel, us): forward, recomputed forward, grad input, grad weight.
KERNELS = ((1, 20.0), (2, 220.0), (3, 330.0), (4, 440.0))
SPAN_NS = (KERNELS[-1][1] + KERNEL_US - KERNELS[0][1]) * 1000


def _op(name: str, tid: int, ts: float, dur: float, dims: list | None = None, types: list | None = None,
        cat: str = "cpu_op") -> dict:
    args: dict = {}
    if dims is not None:
        args = {"Input Dims": dims, "Input type": types}
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _launch(tid: int, ts: float, correlation: int) -> dict:
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": tid, "ts": ts, "dur": 4,
            "args": {"correlation": correlation}}


def _trace() -> dict:
    addmm = ([[N], [M, K], [K, N]], [BF16, BF16, BF16])
    linear = ([[M, K], [N, K], [N]], [BF16, BF16, BF16])
    events = [
        _op("ProfilerStep#1", 1, 0, 1000, cat="user_annotation"),
        _op("aten::linear", 1, 10, 40, *linear), _op("aten::addmm", 1, 12, 35, *addmm), _launch(1, 14, 1),
        _op("autograd::engine::evaluate_function: CheckpointFunctionBackward", 2, 200, 700),
        _op("CheckpointFunctionBackward", 2, 201, 690),
        _op("aten::linear", 2, 210, 40, *linear), _op("aten::addmm", 2, 212, 35, *addmm), _launch(2, 214, 2),
        _op("autograd::engine::evaluate_function: AddmmBackward0", 2, 300, 300),
        _op("AddmmBackward0", 2, 301, 290),
        _op("aten::mm", 2, 310, 40, [[M, N], [N, K]], [BF16, BF16]), _launch(2, 312, 3),
        _op("aten::mm", 2, 360, 40, [[K, M], [M, N]], [BF16, BF16]), _launch(2, 362, 4),
    ]
    events += [{"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16bf16", "pid": 0, "tid": 7, "ts": ts,
                "dur": KERNEL_US, "args": {"device": 0, "stream": 7, "correlation": c}} for c, ts in KERNELS]
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H200", "totalGlobalMem": 150 * 2**30,
                                                       "numSms": 132, "computeMajor": 9, "computeMinor": 0}],
            "traceEvents": events}


@pytest.fixture()
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "checkpointed.pt.trace.json"
    path.write_text(json.dumps(_trace()))
    return path


def _parsed(trace: Path, out: Path) -> dict[str, pl.DataFrame]:
    out.mkdir()
    ingest.parse_into(trace, out, ingest.ParseOptions(source_name=trace.name, trace_id="c" * 20))
    return {name: pl.read_parquet(out / f"{name}.parquet") for name in ("host_ops", "device_ops")}


def test_the_recomputed_forward_is_found_and_nothing_else(trace: Path, tmp_path: Path) -> None:
    host = _parsed(trace, tmp_path / "parsed")["host_ops"]
    found = host.filter(pl.col("event_id").is_in(recomputed_events(host).implode()))
    assert sorted(found["name"].to_list()) == ["aten::addmm", "aten::linear", "cudaLaunchKernel"]
    assert (found["ts_ns"] >= 210_000).all() and (found["ts_ns"] < 300_000).all()  # inside the recomputation


def test_hfu_counts_the_recomputation_and_mfu_does_not(trace: Path, tmp_path: Path) -> None:
    parsed = _parsed(trace, tmp_path / "parsed")
    host, device = parsed["host_ops"], parsed["device_ops"]
    recomputed = host.filter(pl.col("event_id").is_in(recomputed_events(host).implode())
                             & pl.col("correlation").is_not_null())["correlation"].to_list()
    assert recomputed == [2]
    ops = device.with_columns(
        pl.lit(float(MATMUL)).alias("flops"), pl.lit(float(MATMUL)).alias("model_flops"),
        pl.when(pl.col("correlation").is_in(recomputed)).then(float(MATMUL)).otherwise(0.0).alias("recomputed_flops"))
    (row,) = breakdown_frame(ops, peak_tflops={("c" * 20, 0): H200_BF16 / 1e12}).filter(
        pl.col("step").is_null()).to_dicts()
    assert row["span_ns"] == SPAN_NS
    assert row["hfu_pct"] == pytest.approx(100 * 4 * MATMUL / (H200_BF16 * SPAN_NS / 1e9))
    assert row["mfu_pct"] == pytest.approx(100 * 3 * MATMUL / (H200_BF16 * SPAN_NS / 1e9))
    whole = breakdown_frame(ops, peak_tflops={("c" * 20, 0): H200_BF16 / 1e12}).filter(pl.col("step").is_null())
    shown = inclusive_view(whole).row(0, named=True)  # what `analyze` prints: HFU beside MFU, as it differs
    assert shown["HFU %"] == round(row["hfu_pct"], 1) and shown["MFU %"] == round(row["mfu_pct"], 1)
    assert "HFU %" not in inclusive_view(whole.with_columns(pl.col("mfu_pct").alias("hfu_pct"))).columns


def test_ingest_leaves_the_recomputation_out_of_mfu(trace: Path, tmp_path: Path) -> None:
    """Ingested: the stored HFU counts all four matmuls, as executed, and MFU the three the model needs
    (docs/analyses.md, "HFU and MFU"); without recomputation HFU is MFU."""
    wh = Warehouse(tmp_path / "wh")
    assert all(r.ok for r in wh.ingest([trace], job="ckpt").results)
    (hfu, mfu, span) = wh.query("SELECT hfu_pct, mfu_pct, span_ns FROM breakdown WHERE step IS NULL").rows[0]
    assert span == SPAN_NS
    assert hfu == pytest.approx(100 * 4 * MATMUL / (H200_BF16 * SPAN_NS / 1e9))
    assert mfu == pytest.approx(100 * 3 * MATMUL / (H200_BF16 * SPAN_NS / 1e9))
    ops = pl.DataFrame({"trace_id": ["t"], "rank": [0], "step": [None], "category": ["compute"], "ts_ns": [0],
                        "dur_ns": [1000], "flops": [1e6]}, schema_overrides={"step": pl.Int64})
    (row,) = breakdown_frame(ops, peak_tflops={("t", 0): 1.0}).to_dicts()
    assert row["hfu_pct"] == row["mfu_pct"] == pytest.approx(100 * 1e6 / (1e12 * 1e-6))
    assert mfu is not None


def test_the_sql_oracle_marks_the_same_recomputation(trace: Path, tmp_path: Path) -> None:
    """The stored breakdown and op_stats of the checkpointed trace equal their SQL oracle's (tests/oracles)."""
    from oracles.derived import write_derived_sql

    from tracelake.warehouse.derived import write_derived

    parsed = tmp_path / "parsed"
    _parsed(trace, parsed)
    got = {}
    for name, writer in (("sql", write_derived_sql), ("numpy", write_derived)):
        (tmp_path / name).mkdir()
        writer(parsed, tmp_path / name)
        got[name] = pl.read_parquet(tmp_path / name / "breakdown.parquet").sort("step", nulls_last=False)
    assert got["sql"]["mfu_pct"].to_list() == pytest.approx(got["numpy"]["mfu_pct"].to_list())
    assert got["sql"]["hfu_pct"].to_list() == pytest.approx(got["numpy"]["hfu_pct"].to_list())
    assert (got["numpy"]["hfu_pct"] > got["numpy"]["mfu_pct"]).any()
