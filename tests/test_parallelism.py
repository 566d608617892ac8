"""Communication by parallelism dimension and pipeline bubbles (docs/analyses.md, "Parallelism").

A pipeline generated with a known schedule has the textbook bubble (p - 1) / (m + p - 1) on every
stage; process groups named as device meshes name them, or their operations and ranks tell; the
real gloo pipeline sample is found to be a pipeline with its micro-batches counted from the raw JSON.
"""

from __future__ import annotations

import gzip
import json

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import ROOT
from tracelake.analysis import parallelism
from tracelake.analysis.depgraph import COLLECTIVE_COLUMNS, DEVICE_COLUMNS, HOST_COLUMNS, RankInput
from tracelake.analysis.parallelism import Dimension, dimension_of
from tracelake.warehouse import Warehouse

US = 1000


def _gpipe(p: int, m: int, f: int, b: int) -> tuple[list[RankInput], pl.DataFrame]:
    """An ideal GPipe step: stage s runs forward j at (s + j) f, backward j at T + (p - 1 - s + j) b, where
    T = (m + p - 1) f; each stage's step annotation covers the whole schedule; stage s sends each micro-batch on."""
    total = (m + p - 1) * (f + b)
    ranks, rows = [], []
    for s in range(p):
        host = pl.DataFrame([{"event_id": 1, "tid": 1, "cat": "user_annotation", "name": "ProfilerStep#1", "ts_ns": 0,
                              "dur_ns": total * US, "depth": 0, "parent_id": None, "correlation": None, "step": 1}],
                            schema={c: pl.String if c in ("cat", "name") else pl.Int64 for c in HOST_COLUMNS})
        ops = []
        for j in range(m):
            ops.append(((s + j) * f, f))
            ops.append(((m + p - 1) * f + (p - 1 - s + j) * b, b))
        device = pl.DataFrame([{"event_id": 10 + i, "device": 0, "stream": 7, "kind": "kernel", "category": "compute",
                                "name": "gemm", "ts_ns": t * US, "dur_ns": d * US, "correlation": None, "step": 1}
                               for i, (t, d) in enumerate(ops)],
                              schema={c: pl.String if c in ("kind", "category", "name") else pl.Int64
                                      for c in DEVICE_COLUMNS})
        coll = pl.DataFrame(schema={c: pl.String if c in ("process_group", "collective") else
                                    pl.Boolean if c == "is_async" else pl.Int64 for c in COLLECTIVE_COLUMNS})
        ranks.append(RankInput(f"t{s}", s, host, device, coll))
        for j in range(m):
            if s + 1 < p:
                rows.append({"trace_id": f"t{s}", "rank": s, "collective": "send", "step": 1, "seq": j})
            if s > 0:
                rows.append({"trace_id": f"t{s}", "rank": s, "collective": "recv", "step": 1, "seq": j})
    collectives = pl.DataFrame(rows).with_columns(
        pl.lit("0").alias("process_group"), pl.lit("default_pg").alias("process_group_desc"),
        pl.lit(json.dumps(list(range(p)))).alias("group_ranks"), pl.lit(p).alias("group_size"),
        pl.lit(0).alias("ts_ns"), pl.lit(0).alias("dur_ns"), pl.lit(False).alias("is_async"))
    return ranks, collectives


@settings(max_examples=25, deadline=None)
@given(p=st.integers(2, 6), m=st.integers(1, 12), f=st.integers(1, 50), b=st.integers(1, 50))
def test_an_ideal_pipeline_has_the_textbook_bubble(p: int, m: int, f: int, b: int) -> None:
    ranks, collectives = _gpipe(p, m, f, b)
    groups = parallelism.groups(ranks, collectives, pl.DataFrame(), pl.DataFrame(), p)
    assert groups["dimension"].to_list() == [Dimension.PIPELINE]
    bubbles = parallelism.bubbles(ranks, collectives, groups)
    assert bubbles.height == p
    textbook = (p - 1) / (m + p - 1)
    for row in bubbles.iter_rows(named=True):
        assert (row["stages"], row["microbatches"]) == (p, m)
        assert row["span_ns"] == (m + p - 1) * (f + b) * US
        assert row["busy_ns"] == m * (f + b) * US
        assert row["bubble_pct"] == pytest.approx(100 * textbook, abs=1e-3)
        assert row["schedule_bubble_pct"] == pytest.approx(100 * textbook, abs=1e-3)


@pytest.mark.parametrize(("name", "description", "ops", "ranks", "world", "expected"), [
    ("3", "mesh_tp", ["allreduce"], [0, 1], 8, (Dimension.TENSOR, "name")),
    ("4", "mesh_dp_shard", ["allgather", "reduce_scatter"], [0, 2, 4, 6], 8, (Dimension.DATA, "name")),
    ("5", "mesh_pp", ["send", "recv"], [0, 4], 8, (Dimension.PIPELINE, "name")),
    ("6", "dp_shard_cp", ["allgather"], [0, 1, 2, 3], 8, (Dimension.CONTEXT, "name")),
    ("7", "mesh_ep", ["all_to_all"], [0, 1], 8, (Dimension.EXPERT, "name")),
    ("0", "default_pg", ["send", "recv"], [0, 1, 2, 3], 4, (Dimension.PIPELINE, "operations")),
    ("1", "undefined", ["all_to_all", "all_to_all", "allreduce"], [0, 1], 4, (Dimension.EXPERT, "operations")),
    ("0", "default_pg", ["allreduce"], [0, 1, 2, 3], 4, (Dimension.DATA, "ranks")),
    ("2", "undefined", ["allreduce"], [4, 5, 6, 7], 8, (Dimension.TENSOR, "ranks")),
    ("2", "undefined", ["allreduce"], [1, 3, 5, 7], 8, (Dimension.DATA, "ranks")),
    ("9", "undefined", ["allreduce"], [], None, (None, "unknown")),
])
def test_a_group_is_mapped_by_name_then_operations_then_ranks(
    name: str, description: str, ops: list[str], ranks: list[int], world: int | None,
    expected: tuple[Dimension | None, str],
) -> None:
    assert dimension_of(name, description, ops, ranks, world) == expected


PIPELINE = ROOT / "sample_traces" / "pytorch_gloo" / "pipeline"


def test_the_real_gloo_pipeline_is_a_pipeline_with_its_micro_batches(tmp_path: object) -> None:
    files = sorted(PIPELINE.glob("*.json.gz"))
    wh = Warehouse(tmp_path / "wh")  # type: ignore[operator]
    wh.ingest(files, job="pp")
    a = wh.analyze(job="pp")
    (group,) = a.parallelism.iter_rows(named=True)
    assert group["dimension"] == Dimension.PIPELINE
    # micro-batches per step: the first stage's sends in a profiled step, counted in the raw JSON
    first = json.loads(gzip.decompress(files[0].read_bytes()))
    events = first["traceEvents"]
    steps = [e for e in events if e.get("name", "").startswith("ProfilerStep#")]
    sends = [e for e in events if e.get("name") == "c10d::send"]
    inside = [sum(s["ts"] <= e["ts"] < s["ts"] + s["dur"] for e in sends) for s in steps]
    assert set(a.pipeline_bubbles["microbatches"].to_list()) == set(inside)
    stages = a.pipeline_bubbles["stages"].unique().to_list()
    assert stages == [len(files)]
    assert (a.pipeline_bubbles["busy_ns"] <= a.pipeline_bubbles["span_ns"]).all()
    assert (a.pipeline_bubbles["bubble_ns"] + a.pipeline_bubbles["busy_ns"] == a.pipeline_bubbles["span_ns"]).all()


def test_all_to_all_imbalance_is_the_busiest_ranks_excess_over_the_mean() -> None:
    sizes = {0: [100, 100], 1: [100, 300], 2: [100, 200], 3: [100, 200]}  # per rank: two instances
    rows = [{"trace_id": f"t{r}", "rank": r, "collective": "all_to_all", "process_group": "ep", "seq": i,
             "process_group_desc": "mesh_ep", "group_ranks": "[0, 1, 2, 3]", "group_size": 4, "in_nelems": n,
             "ts_ns": 0, "dur_ns": 10, "is_async": False}
            for r, per in sizes.items() for i, n in enumerate(per)]
    groups = parallelism.groups([], pl.DataFrame(rows), pl.DataFrame(), pl.DataFrame(), 4)
    (row,) = groups.iter_rows(named=True)
    assert row["dimension"] == Dimension.EXPERT
    # instance 0: all equal, 0%; instance 1: 300 against a mean of 200, 50%
    assert row["a2a_imbalance_pct"] == pytest.approx(25.0)
