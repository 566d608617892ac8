"""The operators' attribution made a row group at a time (analysis/op_attribution.py, through
warehouse/derived_operators.py) against the walk up every event's parent chain (``Operators(host)``: op_scope's
``nearest``, ``scopes`` and ``chains``, recompute's ``recomputed``), on generated forests of host events in row groups
of a few rows, in order and shuffled (children before their parents, parents many groups before), and on every real
Kineto trace at hand."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings, strategies as st
from support import real_kineto_files

from tracelake import ingest
from tracelake.analysis.op_attribution import BackRefs
from tracelake.analysis.op_stats import Operators
from tracelake.warehouse.derived_operators import operators

NAMES = {  # category: names, chosen for the rules they touch
    "cpu_op": ["aten::mm", "aten::addmm", "aten::view", "aten::add", "CheckpointFunctionBackward",
               "AddmmBackward0", "aten::copy_"],
    "python_function": ["nn.Module: Encoder_0", "nn.Module: Linear_1", "nn.Module: ", "model.py(12): forward",
                        "torch/nn/functional.py(3): linear", "<built-in method mm>"],
    "user_annotation": ["ProfilerStep#1", "recompute layer 3", "## forward ##"],
    "cuda_runtime": ["cudaLaunchKernel", "cudaGraphLaunch"],
}
COLUMNS = {"trace_id": pl.String, "event_id": pl.Int64, "rank": pl.Int32, "cat": pl.String, "name": pl.String,
           "ts_ns": pl.Int64, "dur_ns": pl.Int64, "parent_id": pl.Int64, "correlation": pl.Int64,
           "sequence_number": pl.Int64, "fwd_thread_id": pl.Int64, "input_dims": pl.String, "input_types": pl.String,
           "concrete_inputs": pl.String}


def _answers(ops: Operators, ids: np.ndarray, correlations: list[int]) -> dict[int, tuple[object, ...]]:
    """Per correlation id: the event id of its operator, that operator's module and whether it is recomputed."""
    found = ops.targets(pl.Series(correlations, dtype=pl.Int64))
    shown = {}
    for correlation, call in zip(correlations, found.tolist(), strict=True):
        if call < 0:
            shown[correlation] = None
            continue
        key = int(ops.key_of(np.array([call]))[0])
        shown[correlation] = (int(ids[int(ops.rows[call])]), ops.kinds["module"][key], bool(ops.recomputed[call]))
    return shown


def _compare(host: pl.DataFrame, path: Path, row_group: int) -> dict[int, tuple[object, ...]]:
    host = host.filter(pl.col("event_id").is_not_null())
    expected = Operators(host)
    pq.write_table(host.to_arrow(), path, row_group_size=row_group)
    got = operators(path).get("t")  # none where no event is a cpu_op
    correlations = sorted(set(host["correlation"].drop_nulls().to_list()))
    ids = host["event_id"].to_numpy()
    want = _answers(expected, ids, correlations)
    assert (_answers(got, ids, correlations) if got is not None else dict.fromkeys(correlations)) == want
    return want


@st.composite
def forests(draw: st.DrawFn) -> pl.DataFrame:
    n = draw(st.integers(2, 80))
    rows = []
    for i in range(n):
        cat = draw(st.sampled_from(sorted(NAMES)))
        # mostly one of the last few events: chains as deep as real stacks, across many row groups
        parent = draw(st.one_of(st.integers(max(0, i - 3), i - 1), st.integers(max(0, i - 3), i - 1),
                                st.integers(0, i - 1), st.just(-1), st.just(10**6))) if i else -1
        backward = draw(st.integers(0, 3))  # 0: no sequence number; 1: a forward event; 2-3: a backward one
        rows.append({
            "trace_id": "t", "event_id": 100 + 3 * i, "rank": 0, "cat": cat,
            "name": draw(st.sampled_from(NAMES[cat])), "ts_ns": draw(st.integers(0, 50)), "dur_ns": draw(
                st.integers(0, 9)),
            "parent_id": 100 + 3 * parent if 0 <= parent < i else (None if parent < 0 else parent),
            "correlation": draw(st.integers(0, 12)) if cat == "cuda_runtime" else None,
            "sequence_number": draw(st.integers(0, 4)) if backward and cat == "cpu_op" else None,
            "fwd_thread_id": 1 if backward >= 2 and cat == "cpu_op" else None,
            "input_dims": None, "input_types": None, "concrete_inputs": None,
        })
    host = pl.DataFrame(rows, schema=COLUMNS)
    if draw(st.booleans()):  # children before parents, ids no longer ascending
        host = host[draw(st.permutations(list(range(n))))]
    return host


@settings(max_examples=150, deadline=None)
@given(host=forests(), row_group=st.integers(1, 9))
def test_the_attribution_a_row_group_at_a_time_equals_the_walks(host: pl.DataFrame, row_group: int,
                                                                 tmp_path_factory: pytest.TempPathFactory) -> None:
    _compare(host, tmp_path_factory.mktemp("attribution") / "host_ops.parquet", row_group)


def test_a_small_tree_by_hand(tmp_path: Path) -> None:
    """Module GPT (Block (aten::linear (launch 1))); a frame (aten::add (launch 2)); a backward event of sequence 9
    (aten::mm (launch 3)) whose forward (sequence 9) sits under Block; a checkpoint's recomputation (aten::mm (launch
    4)); a launch with no operator (5). Written children first, in row groups of two."""
    rows = [  # event id, category, name, parent, correlation, sequence number, backward
        (1, "python_function", "nn.Module: GPT_0", None, None, None, None),
        (2, "python_function", "nn.Module: Block_1", 1, None, None, None),
        (3, "cpu_op", "aten::linear", 2, None, None, None),
        (4, "cuda_runtime", "cudaLaunchKernel", 3, 1, None, None),
        (5, "python_function", "train.py(4): step", None, None, None, None),
        (6, "cpu_op", "aten::add", 5, None, None, None),
        (7, "cuda_runtime", "cudaLaunchKernel", 6, 2, None, None),
        (8, "cpu_op", "autograd::engine::evaluate_function: MmBackward0", None, None, 9, 1),
        (9, "cpu_op", "aten::mm", 8, None, None, None),
        (10, "cuda_runtime", "cudaLaunchKernel", 9, 3, None, None),
        (11, "cpu_op", "aten::linear", 2, None, 9, 0),
        (12, "cpu_op", "CheckpointFunctionBackward", None, None, None, None),
        (13, "cpu_op", "aten::mm", 12, None, None, None),
        (14, "cuda_runtime", "cudaLaunchKernel", 13, 4, None, None),
        (15, "cuda_runtime", "cudaLaunchKernel", None, 5, None, None),
    ]
    host = pl.DataFrame([{"trace_id": "t", "event_id": e, "rank": 0, "cat": c, "name": n, "ts_ns": e, "dur_ns": 1,
                          "parent_id": p, "correlation": k, "sequence_number": s, "fwd_thread_id": b,
                          "input_dims": None, "input_types": None, "concrete_inputs": None}
                         for e, c, n, p, k, s, b in reversed(rows)], schema=COLUMNS)
    got = _compare(host, tmp_path / "host_ops.parquet", 2)
    assert got == {1: (3, "GPT_0/Block_1", False), 2: (6, "train.py(4): step", False),
                   3: (9, "GPT_0/Block_1", False), 4: (13, None, True), 5: None}


def test_back_refs_keep_each_parent_until_its_last_later_piece() -> None:
    # piece 0 holds positions 0-2, piece 1 3-4, piece 2 5-6: 0 is named by pieces 1 and 2, 1 by piece 1 only
    refs = BackRefs.of([(0, 0, np.array([-1, 0, 1])), (1, 3, np.array([0, 1])), (2, 5, np.array([0, 5]))])
    assert refs.positions.tolist() == [0, 1] and refs.last.tolist() == [2, 1]
    assert refs.until(np.array([0, 1, 2, 5])).tolist() == [2, 1, -1, -1]


@pytest.mark.parametrize("path", real_kineto_files(), ids=lambda p: p.name)
def test_real_traces_attribute_alike_both_ways(path: Path, tmp_path: Path) -> None:
    """Every real Kineto trace at hand, its host events in row groups of 4,999 as parsed."""
    ingest.parse_into(path, tmp_path, ingest.ParseOptions(source_name=path.name, trace_id="t"))
    host = pl.read_parquet(tmp_path / "host_ops.parquet")
    if host.is_empty() or not (host["cat"] == "cpu_op").any():
        pytest.skip("no operator calls")
    host = host.select([c for c in COLUMNS if c in host.columns])
    got = _compare(host, tmp_path / "host_ops_again.parquet", 4999)
    assert any(v is not None for v in got.values()) or not got
