"""``Concrete Inputs`` kept for the operators whose cost needs them, read alike by both engines, and the costs they
give (convolution forward, causal attention) equal to counts made here from the raw JSON with textbook formulas."""

from __future__ import annotations

import gzip
import json
import math
import tempfile
from functools import lru_cache
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

from tracelake import ingest
from tracelake.analysis.flops import op_cost
from tracelake.contracts.concrete import CONCRETE_OPS, keeps_concrete
from tracelake.ingest import kineto_scan
from tracelake.warehouse.derived import write_derived

from support.paths import ROOT, real_kineto_files

H200 = ROOT / "sample_traces" / "gpu_h200"
TRAIN = H200 / "train" / "train.pt.trace.json.gz"
CONV = H200 / "conv" / "conv.pt.trace.json.gz"
REAL = real_kineto_files()


@lru_cache(maxsize=None)
def _events(path: Path) -> tuple[dict, ...]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        doc = json.load(f)
    return tuple(e for e in (doc["traceEvents"] if isinstance(doc, dict) else doc) if isinstance(e, dict))


def _ops(path: Path, names: set[str] | None = None) -> list[dict]:
    return [e for e in _events(path) if e.get("cat") == "cpu_op" and e.get("ph") == "X"
            and (names is None or e.get("name") in names)]


@lru_cache(maxsize=None)
def _parsed(path: Path, engine: str) -> dict[str, pl.DataFrame]:
    """The trace parsed by one engine and its derived tables computed, as ingest does."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        ingest.parse_into(path, out, ingest.ParseOptions(source_name=path.name, trace_id="t" * 20,
                                                         kineto_engine=engine))
        write_derived(out, out)
        return {name: pl.from_arrow(pq.read_table(out / f"{name}.parquet"))  # type: ignore[misc]
                for name in ("host_ops", "op_stats")}


def test_every_operator_whose_cost_reads_concrete_inputs_keeps_them() -> None:
    """Over every operator call of the H200 traces and the real traces: where the cost differs with and without its
    ``Concrete Inputs``, its name is one that keeps them."""
    paths = sorted(H200.glob("*/*.pt.trace.json.gz")) + REAL
    readers: set[str] = set()
    for path in paths:
        for e in _ops(path):
            args = e.get("args", {})
            concrete = args.get("Concrete Inputs")
            if not isinstance(concrete, list) or e.get("name") in readers:
                continue
            dims, types = args.get("Input Dims"), args.get("Input type")
            if op_cost(e["name"], dims, types, concrete) != op_cost(e["name"], dims, types, None):
                readers.add(e["name"])
    assert readers, "no operator in the traces reads Concrete Inputs: the test proves nothing"
    assert readers <= CONCRETE_OPS, sorted(readers - CONCRETE_OPS)


@pytest.mark.parametrize("path", [TRAIN, CONV], ids=["train", "conv"])
def test_host_ops_keep_concrete_inputs_exactly_for_the_named_ops(path: Path) -> None:
    expected: dict[str, int] = {}
    for e in _ops(path):
        if keeps_concrete(e["name"]) and isinstance(e.get("args", {}).get("Concrete Inputs"), list):
            expected[e["name"]] = expected.get(e["name"], 0) + 1
    assert expected
    engines = [_parsed(path, engine)["host_ops"] for engine in ("native", "duckdb")]
    if not kineto_scan.AVAILABLE:
        engines = engines[1:]
    for host in engines:
        kept = host.filter(pl.col("concrete_inputs").is_not_null())
        assert dict(kept.group_by("name").len().iter_rows()) == expected
    if len(engines) == 2:  # both engines keep the same text for the same events
        pairs = [h.filter(pl.col("concrete_inputs").is_not_null()).sort("event_id")
                 .select("event_id", "concrete_inputs") for h in engines]
        assert pairs[0].equals(pairs[1])


def _conv_flops(args: dict) -> int:
    """``aten::cudnn_convolution(input, weight, padding, stride, dilation, groups, ...)``: 2 x output elements x
    input channels per group x kernel elements, output size floor((in + 2p - d(k - 1) - 1) / s) + 1."""
    (n, c_in, *spatial), (c_out, c_per_group, *kernel) = args["Input Dims"][0], args["Input Dims"][1]
    padding, stride, dilation = (json.loads(args["Concrete Inputs"][i]) for i in (2, 3, 4))
    out = [(x + 2 * p - d * (k - 1) - 1) // s + 1
           for x, k, p, s, d in zip(spatial, kernel, padding, stride, dilation, strict=True)]
    assert c_in % c_per_group == 0
    return 2 * n * c_out * math.prod(out) * c_per_group * math.prod(kernel)


def test_convolution_forward_flops_equal_the_textbook_count() -> None:
    calls = _ops(CONV, {"aten::cudnn_convolution"})
    assert len(calls) > 10
    expected = sum(_conv_flops(e["args"]) for e in calls)
    rows = _parsed(CONV, "native" if kineto_scan.AVAILABLE else "duckdb")["op_stats"]
    conv = rows.filter(pl.col("op") == "aten::cudnn_convolution")
    assert conv["count"].sum() == len(calls)
    assert conv["flops"].null_count() == 0 and conv["flops"].sum() == expected


def test_causal_attention_counts_half_the_score_matrix() -> None:
    """The GPT's attention is causal (``is_causal`` True in every call's Concrete Inputs): the forward counts
    2 x B x H x T x T x D for QK^T and PV, halved; the textbook count, not the unmasked one."""
    calls = _ops(TRAIN, {"aten::_cudnn_attention_forward"})  # the innermost op with a cost rule: op_stats' row
    assert calls and all(e["args"]["Concrete Inputs"][8] == "True" for e in calls)  # is_causal
    expected = 0
    for e in calls:
        b, h, t, d = e["args"]["Input Dims"][0]
        expected += 4 * b * h * t * t * d // 2
    rows = _parsed(TRAIN, "native" if kineto_scan.AVAILABLE else "duckdb")["op_stats"]
    forward = rows.filter(pl.col("op") == "aten::_cudnn_attention_forward")
    assert forward["count"].sum() == len(calls)
    assert forward["flops"].sum() == pytest.approx(expected, rel=1e-12)
