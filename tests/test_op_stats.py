"""Operator attribution, ``op_stats`` and MFU (analysis/op_stats.py) against counts made here from the raw traces.

Truth (docs/analyses.md, "Operators"): on the project's H200 traces and every real Kineto trace of
../shared/real_traces, the device time of ``op_stats`` (the ``(no operator)`` row included) equals the
trace's kernel, memcpy and memset time summed here from the JSON; every mm/addmm/bmm row's FLOPs equal
2*m*n*k (times the batch) from its ``Input Dims``, times its calls; the GPT step's MFU equals
(6*N*D + attention) / (step time x 989.5 TFLOP/s) within 10%, N and D from the model in
sample_traces/capture_gpu.py; ``mfu_pct`` stays within [0, 100] and no matmul exceeds its roofline.
The SQL twin of the table (tests/oracles/op_stats.py) is compared in tests/test_derived_tables.py.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from functools import lru_cache
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings, strategies as st
from support import ROOT, real_kineto_files

from tracelake import ingest
from tracelake.analysis.event_flags import EventFlags
from tracelake.analysis.op_stats import NO_OPERATOR, OpParts, Operators, peak_for
from tracelake.analysis.peaks import lookup
from tracelake.warehouse.derived import write_derived

H200 = ROOT / "sample_traces" / "gpu_h200"
H200_TRACES = {p.parent.name: p for p in sorted(H200.glob("*/*.pt.trace.json.gz"))}
MATMULS = ("aten::mm", "aten::addmm", "aten::bmm")
H200_BF16 = 989.5e12  # H200 SXM dense bf16 (NVIDIA datasheet), FLOP/s


@lru_cache(maxsize=None)
def _events(path: Path) -> tuple[dict, ...]:
    with (gzip.open(path, "rt") if path.name.endswith(".gz") else path.open()) as f:
        data = json.load(f)
    return tuple(data["traceEvents"] if isinstance(data, dict) else data)


@lru_cache(maxsize=None)
def _derived(path: Path) -> dict[str, pl.DataFrame]:
    """The trace parsed and its derived tables computed, as ingest does."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        ingest.parse_into(path, out, ingest.ParseOptions(source_name=path.name, trace_id="t" * 20))
        write_derived(out, out)
        return {name: pl.read_parquet(out / f"{name}.parquet") for name in ("op_stats", "breakdown", "device_ops")}


def _device_ns_from_json(path: Path) -> tuple[int, int]:
    """Summed duration (ns) of the kernels, memcpys and memsets in the raw JSON, and how many there are."""
    durations = [e.get("dur", 0) for e in _events(path)
                 if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    return round(sum(durations) * 1000), len(durations)


def _textbook(name: str, dims: list) -> int:
    if name == "aten::mm":
        (m, k), (_, n) = dims[0][-2:], dims[1][-2:]
        return 2 * m * k * n
    if name == "aten::addmm":
        (m, k), (_, n) = dims[1], dims[2]
        return 2 * m * k * n
    (b, m, k), (_, _, n) = dims[0], dims[1]
    return 2 * b * m * k * n


def _traces() -> list[Path]:
    return [*H200_TRACES.values(), *real_kineto_files()]


def _ids(path: Path) -> str:
    return f"{path.parent.name}/{path.name}"


@pytest.mark.parametrize("path", _traces(), ids=_ids)
def test_device_time_adds_up_to_the_raw_trace(path: Path) -> None:
    """Every kernel, memcpy and memset lands in exactly one row: op_stats sums to the trace's device time."""
    stats = _derived(path)["op_stats"]
    expected_ns, count = _device_ns_from_json(path)
    if not count:
        pytest.skip("no device ops")
    assert abs(int(stats["device_ns"].sum()) - expected_ns) <= count  # us -> ns: at most 1 ns per op
    assert int(stats["kernels"].sum()) == count
    assert stats.filter(pl.col("op") == NO_OPERATOR).height <= 1
    named = stats.filter(pl.col("op") != NO_OPERATOR)
    assert (named["count"] > 0).all() and (named["kernels"] >= 1).all()
    assert stats.filter(pl.col("flops") == 0, pl.col("kind").is_null()).height == 0  # unknown is never 0


@pytest.mark.parametrize("path", _traces(), ids=_ids)
def test_matmul_flops_equal_two_m_n_k(path: Path) -> None:
    """Each mm/addmm/bmm row: calls x 2*m*n*k from its recorded Input Dims; calls as many as the trace's launching
    matmul events with those dims."""
    stats = _derived(path)["op_stats"].filter(pl.col("op").is_in(MATMULS))
    launched = Counter()
    correlations = {e["args"]["correlation"] for e in _events(path)
                    if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "correlation" in e.get("args", {})}
    for row in stats.iter_rows(named=True):
        if row["input_shapes"] is None:  # profiled without record_shapes: no estimate, never 0
            assert row["flops"] is None
        else:
            assert row["flops"] == row["count"] * _textbook(row["op"], json.loads(row["input_shapes"])), row
        launched[(row["op"], (row["input_shapes"] or "null").replace(" ", ""))] += row["count"]
    # independently: the matmul cpu_ops whose time span holds a launch call of a kernel in the trace
    calls = [e for e in _events(path) if e.get("cat") in ("cuda_runtime", "cuda_driver", "hip_runtime")
             and e.get("args", {}).get("correlation") in correlations]
    ops = [e for e in _events(path) if e.get("cat") == "cpu_op" and e.get("name") in MATMULS and "dur" in e]
    by_thread: dict[object, list[tuple[float, float]]] = {}
    for c in calls:
        by_thread.setdefault(c.get("tid"), []).append((c["ts"], c["ts"] + c.get("dur", 0)))
    found = Counter()
    for op in ops:
        starts = by_thread.get(op.get("tid"), [])
        if any(op["ts"] <= s and e <= op["ts"] + op["dur"] for s, e in starts):
            found[(op["name"], json.dumps(op["args"].get("Input Dims")).replace(" ", ""))] += 1
    assert launched == found


@pytest.mark.parametrize("path", _traces(), ids=_ids)
def test_mfu_is_bounded_and_matmuls_stay_under_their_roof(path: Path) -> None:
    tables = _derived(path)
    for column in ("mfu_pct", "flops_utilisation_pct"):
        values = tables["breakdown"][column].drop_nulls()
        assert ((values >= 0) & (values <= 100)).all(), (column, values.max())
    heavy = tables["op_stats"].filter(pl.col("kind").is_in(["matmul", "conv", "attention"]))
    assert not heavy["above_roofline"].fill_null(False).any(), heavy.filter(pl.col("above_roofline"))


def test_h200_big_gemms_run_below_the_bf16_peak() -> None:
    """The big GEMMs of the GPT reach 60-95% of the dense bf16 peak: not more (the estimate or peak would be wrong),
    not absurdly less (the attribution would be)."""
    stats = _derived(H200_TRACES["train"])["op_stats"]
    big = stats.filter(pl.col("kind") == "matmul", pl.col("flops") / pl.col("count") >= 5e10)
    assert big.height >= 8
    achieved = big["achieved_tflops"] * 1e12
    assert (achieved <= H200_BF16).all() and (achieved >= 0.6 * H200_BF16).all()
    assert set(big["dtype"]) == {"bf16"} and set(big["bound"]) == {"compute"}


def _gpt_model_flops_per_step() -> tuple[float, float]:
    """6*N*D and the attention term (forward + backward = 3x forward, causal halves it) of sample_traces' GPT:
    6 layers, d=1024, vocabulary 8192, batch 8 x 1024 tokens (sample_traces/capture_gpu.py)."""
    layers, d, vocab, batch, seq = 6, 1024, 8192, 8, 1024
    n = layers * (3 * d * d + d * d + 4 * d * d + 4 * d * d) + d * vocab  # qkv, proj, fc1, fc2 and the head
    tokens = batch * seq
    attention = layers * 3 * (4 * batch * seq * seq * d) / 2
    return 6 * n * tokens, attention


def test_gpt_step_mfu_equals_six_n_d() -> None:
    path = H200_TRACES["train"]
    rows = _derived(path)["breakdown"].filter(pl.col("step").is_not_null())
    six_nd, attention = _gpt_model_flops_per_step()
    for row in rows.iter_rows(named=True):
        expected = 100 * (six_nd + attention) / (row["span_ns"] / 1e9 * H200_BF16)
        assert row["mfu_pct"] == pytest.approx(expected, rel=0.10)
        # the part over 6*N*D + attention is exactly what is known to be over: the causal mask is read from
        # `Concrete Inputs` (halved), and attention's backward counts 2.5x its forward (it recomputes QK^T), not 2x
        model = row["mfu_pct"] / 100 * row["span_ns"] / 1e9 * H200_BF16
        assert model == pytest.approx(six_nd + attention * 3.5 / 3, rel=0.005)


def test_graph_replays_go_to_no_operator() -> None:
    """The CUDA-graph MLP: its kernels share their cudaGraphLaunch's correlation, and no cpu_op encloses the launch
    (only the ProfilerStep annotation): all of them are one (no operator) row."""
    path = H200_TRACES["graphs"]
    launches = {e["args"]["correlation"] for e in _events(path)
                if e.get("name", "").startswith("cudaGraphLaunch") and "correlation" in e.get("args", {})}
    graph_ns = sum(e["dur"] for e in _events(path) if e.get("cat") == "kernel"
                   and e.get("args", {}).get("correlation") in launches)
    graph_kernels = sum(1 for e in _events(path) if e.get("cat") == "kernel"
                        and e.get("args", {}).get("correlation") in launches)
    assert graph_kernels > 2 * len(launches) > 0
    row = _derived(path)["op_stats"].filter(pl.col("op") == NO_OPERATOR).row(0, named=True)
    assert row["kernels"] >= graph_kernels and row["device_ns"] >= round(graph_ns * 1000) - graph_kernels
    named = _derived(path)["op_stats"].filter(pl.col("op") != NO_OPERATOR)
    assert named["kernels"].sum() + row["kernels"] == _device_ns_from_json(path)[1]  # none counted twice


# -- the rule on small hand-made traces ------------------------------------------------------------------------

def _host(rows: list[tuple]) -> pl.DataFrame:
    """(event_id, parent_id, cat, name, correlation, input_dims) -> a host_ops frame on one thread."""
    return pl.DataFrame([{"event_id": r[0], "rank": 0, "cat": r[2], "name": r[3], "ts_ns": 10 * r[0],
                          "dur_ns": 100 - r[0], "parent_id": r[1], "correlation": r[4], "input_dims": r[5],
                          "input_types": '["float","float"]' if r[5] else None} for r in rows],
                        schema={"event_id": pl.Int64, "rank": pl.Int32, "cat": pl.String, "name": pl.String,
                                "ts_ns": pl.Int64, "dur_ns": pl.Int64, "parent_id": pl.Int64, "correlation": pl.Int64,
                                "input_dims": pl.String, "input_types": pl.String})


def _device(correlations: list[int | None], start: int = 0) -> pl.DataFrame:
    n = len(correlations)
    return pl.DataFrame({"category": ["compute"] * n, "ts_ns": list(range(start, start + n)), "dur_ns": [5] * n,
                         "correlation": correlations, "event_id": list(range(start, start + n))},
                        schema={"category": pl.String, "ts_ns": pl.Int64, "dur_ns": pl.Int64,
                                "correlation": pl.Int64, "event_id": pl.Int64})


def _rule_host() -> pl.DataFrame:
    mm = "[[4,8],[8,2]]"
    return _host([
        (1, None, "cpu_op", "aten::linear", None, None),      # composite: not counted
        (2, 1, "cpu_op", "aten::mm", None, mm),                # counted
        (3, 2, "python_function", "torch/x.py", None, None),   # a Python frame between op and call
        (4, 3, "cpu_op", "aten::unknown_helper", None, None),  # innermost, but no cost rule
        (5, 4, "cuda_runtime", "cudaLaunchKernel", 100, None),
        (6, 1, "cuda_runtime", "cudaLaunchKernel", 101, None),  # launched by the composite itself
        (7, None, "user_annotation", "ProfilerStep#1", None, None),
        (8, 7, "cuda_runtime", "cudaGraphLaunch", 102, None),   # no cpu_op around it
    ])


def test_the_innermost_op_with_a_cost_rule_wins() -> None:
    ops = Operators(_rule_host())
    calls = ops.find(ops.owners_of(pl.Series([100, 101, 102, 999, None], dtype=pl.Int64)))
    names = [ops.kinds["op"][int(k)] if i >= 0 else None for i, k in zip(calls.index, calls.key, strict=True)]
    assert names == ["aten::mm", "aten::linear", None, None, None]


def test_each_call_is_credited_once_across_windows() -> None:
    """A graph-like launch of 3 kernels cut across two windows: the call's FLOPs land on its first kernel only."""
    ops = Operators(_rule_host())
    parts = OpParts(ops)
    first, _, again = parts.credit(_device([100, 100], start=0))
    second, model, _ = parts.credit(_device([100, 102, None], start=2))
    assert again.to_list() == [0.0, None]  # nothing here runs as a recomputation
    assert first.to_list() == [2 * 4 * 8 * 2, None]
    assert second.to_list() == [None, None, None] and model.null_count() == 3
    rows = parts.rows("t", 0, lookup("NVIDIA H200", 132))
    by_op = {r["op"]: r for r in rows.iter_rows(named=True)}
    assert by_op["aten::mm"]["kernels"] == 3 and by_op["aten::mm"]["device_ns"] == 15
    assert by_op["aten::mm"]["flops"] == 128 and by_op["aten::mm"]["count"] == 1
    assert by_op[NO_OPERATOR]["kernels"] == 2 and by_op[NO_OPERATOR]["count"] is None
    assert parts.dominant_dtype() == "fp32"


def test_a_parent_cycle_does_not_hang() -> None:
    host = _host([(1, 2, "python_function", "a", None, None), (2, 1, "python_function", "b", None, None),
                  (3, 1, "cuda_runtime", "cudaLaunchKernel", 7, None)])
    ops = Operators(host)
    assert ops.find(ops.owners_of(pl.Series([7], dtype=pl.Int64))).index.tolist() == [-1]


def test_roofline_columns() -> None:
    """A memory-bound op over the HBM bandwidth is flagged, not clamped; fp32 matmuls are held to the TF32 peak."""
    h100 = lookup("NVIDIA H100 80GB HBM3", 132)
    assert peak_for(h100, "fp32", "matmul") == h100.flops_for("tf32")
    assert peak_for(h100, "fp32", "elementwise") == h100.flops_for("fp32")
    parts = OpParts(None)
    parts.credit(_device([None] * 2))
    assert parts.rows("t", 0, h100)["bound"].to_list() == [None]
    from tracelake.analysis.op_stats import roofline

    frame = pl.DataFrame({"flops": [1e9, 1e12], "bytes": [4e9, 1e9], "device_ns": [1_000_000, 2_000_000],
                          "dtype": ["bf16", "bf16"], "kind": ["elementwise", "matmul"]})
    out = roofline(frame, h100)
    assert out["bound"].to_list() == ["memory", "compute"]
    assert out["pct_of_roofline"][0] == pytest.approx(100 * 4e12 / h100.hbm)  # 4 TB/s over 3.35: above
    assert out["above_roofline"].to_list() == [True, False]
    assert out["achieved_tflops"][1] == pytest.approx(500.0)
    assert np.isclose(out["arithmetic_intensity"][1], 1000.0)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_op_stats_equal_sums_per_kind_made_call_by_call(data: st.DataObject) -> None:
    """:class:`OpParts` fed a rank's device ops in windows (1-4 drawn cuts), against sums per (op, shapes) made here
    call by call: a call counts once, with its host time, if any of its ops is not a sync; its ops' device time and
    number are summed; ops of no call (an unknown or missing correlation) go to the no-operator row."""
    from tracelake.analysis import event_index
    from tracelake.analysis.op_stats import GROUP_COLUMNS

    kinds = data.draw(st.integers(1, 5))
    calls = data.draw(st.lists(st.tuples(st.integers(0, kinds - 1), st.integers(0, 10**12)), min_size=1,
                               max_size=12))
    n = len(calls)
    # call i (a cpu_op at position i) owns launch n + i, of correlation 100 + i
    parent = np.concatenate([np.full(n, -1), np.arange(n)])
    flags = EventFlags.pack(np.arange(2 * n) < n, np.arange(2 * n) < n, np.zeros(2 * n, dtype=np.int8),
                            np.zeros(2 * n, dtype=np.int8))
    ops = Operators.from_arrays(parent, flags, (event_index.build([np.arange(100, 100 + n)]), np.arange(n, 2 * n)))
    distinct = pl.DataFrame({c: [f"aten::op{k}" if c == "name" else None for k in range(kinds)] for c in GROUP_COLUMNS},
                            schema={c: pl.String for c in GROUP_COLUMNS})
    ops.set_keyed(np.array([k for k, _ in calls]), distinct, np.array([h for _, h in calls]))
    device = data.draw(st.lists(st.tuples(st.sampled_from([*range(100, 100 + n), 7, None]),
                                          st.sampled_from(["compute", "memory", "sync"]), st.integers(0, 10**9)),
                                max_size=40))
    frame = pl.DataFrame({"category": [c for _, c, _ in device], "ts_ns": list(range(len(device))),
                          "dur_ns": [d for *_, d in device], "correlation": [c for c, *_ in device],
                          "event_id": list(range(len(device)))},
                         schema={"category": pl.String, "ts_ns": pl.Int64, "dur_ns": pl.Int64,
                                 "correlation": pl.Int64, "event_id": pl.Int64})
    parts = OpParts(ops)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(device)), max_size=3)))
    for low, high in zip([0, *cuts], [*cuts, len(device)], strict=True):
        parts.credit(frame[low:high])
    expected: dict[str, list[int]] = {}
    ran: set[int] = set()
    for correlation, category, dur in device:
        if category == "sync":
            continue
        call = correlation - 100 if correlation is not None and 100 <= correlation < 100 + n else None
        row = expected.setdefault(NO_OPERATOR if call is None else f"aten::op{calls[call][0]}", [0, 0, 0, 0])
        if call is not None and call not in ran:
            ran.add(call)
            row[0] += 1
            row[1] += calls[call][1]
        row[2] += dur
        row[3] += 1
    got = parts.rows("t", 0, None)
    assert {r["op"]: [r["count"] or 0, r["host_ns"] or 0, r["device_ns"], r["kernels"]]
            for r in got.iter_rows(named=True)} == expected


def test_arrays_are_narrowed_only_where_every_value_fits() -> None:
    """A launch call's duration (a delay, a wait) is kept as int32 only when every one fits, values unchanged."""
    from tracelake.analysis.event_index import narrow

    fits, wide = np.array([0, 5, 2**31 - 1, -3]), np.array([1, 2**31])
    assert narrow(fits).dtype == np.int32 and narrow(fits).tolist() == fits.tolist()
    assert narrow(wide).dtype == np.int64 and narrow(wide).tolist() == wide.tolist()


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.tuples(*(st.sampled_from([None, "a", "b", "[[2, 3]]"]) for _ in range(4)),
                               st.integers(-1, 4)), max_size=60),
       chunks=st.integers(1, 4), missing=st.sampled_from([(), ("concrete_inputs",), ("input_types", "name")]))
def test_the_calls_key_names_each_calls_own_row(rows: list[tuple[str | None, str | None, str | None, str | None,
                                                                  int]], chunks: int,
                                                 missing: tuple[str, ...]) -> None:
    """``CallNames`` (the calls' key, from each row group's dictionary codes): each call's row of ``distinct`` holds
    its own name, shapes, types, concrete inputs and module; ``distinct`` has each combination once, in the order of
    the values' first places in the row groups' dictionaries, one after the other (as Arrow's ``unify_dictionaries``
    numbers them), a null last, and of the modules' texts (sorted, none last); row groups of their own dictionaries,
    columns absent (a column the trace lacks: null), scopes of one text under two ids."""
    import pyarrow as pa

    from tracelake.warehouse.derived_names import CallNames

    texts: list[str | None] = ["enc.0", "dec", "enc.0", None, "a/b"]  # scope ids 0 and 2 show the same text
    size = len(rows) // chunks + 1
    names = ("name", "input_dims", "input_types", "concrete_inputs")
    calls = CallNames(texts)
    order: dict[str, list[str]] = {n: [] for n in names}  # each column's values in the order the groups list them
    keys: list[np.ndarray] = []
    hosts: list[np.ndarray] = []
    for at in range(0, len(rows), size):
        group = rows[at:at + size]
        columns = {}
        for i, name in enumerate(names):
            if name in missing:
                continue
            column = pa.array([r[i] for r in group], pa.string()).dictionary_encode()
            order[name] += [w for w in column.dictionary.to_pylist() if w not in order[name]]
            columns[name] = column
        columns["dur_ns"] = pa.array([7] * len(group), pa.int64())
        got = calls.add(pa.table(columns), np.array([r[4] for r in group], dtype=np.int64))
        keys.append(got[0])
        hosts.append(got[1])
    rank, distinct = calls.ranked()
    none = [np.zeros(0, dtype=np.int64)]  # no row group at all
    key, host = rank[np.concatenate(keys or none)], np.concatenate(hosts or none)
    assert len(key) == len(rows) and distinct.height == len(set(distinct.rows())) and host.tolist() == [7] * len(rows)
    expected = [tuple(None if n in missing else r[i] for i, n in enumerate(names)) + (texts[r[4]] if r[4] >= 0
                                                                                        else None,) for r in rows]
    assert [distinct.row(int(k)) for k in key] == expected
    assert set(distinct.rows()) == set(expected)
    shown = sorted({t for t in texts if t is not None})

    def codes(row: tuple[str | None, ...]) -> tuple[int, ...]:  # each value's place in its column's numbering
        places = tuple(order[n].index(v) if v is not None else len(order[n]) for n, v in zip(names, row, strict=False))
        return (*places, shown.index(row[4]) if row[4] is not None else len(shown))

    assert distinct.rows() == sorted(distinct.rows(), key=codes)
