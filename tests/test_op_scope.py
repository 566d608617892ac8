"""The ``module`` of ``op_stats``: the nn.Module path around each operator call, a backward call's from its forward,
checked on the H200 GPT trace against a count made here from the raw JSON by time containment."""

from __future__ import annotations

import gzip
import json
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from support import ROOT
from tracelake import ingest
from tracelake.analysis import op_scope
from tracelake.analysis.op_scope import FRAME, MODULE, NONE, Autograd, chains, nearest, scope_kind, scopes
from tracelake.warehouse.derived import write_derived

TRAIN = ROOT / "sample_traces" / "gpu_h200" / "train" / "train.pt.trace.json.gz"


def _enclosing(events: list[dict], tid: object, ts: float) -> list[dict]:
    """The events of thread ``tid`` whose [ts, ts + dur) holds ``ts``, outermost first."""
    return sorted((e for e in events if e["tid"] == tid and e["ts"] <= ts < e["ts"] + e["dur"]),
                  key=lambda e: (e["ts"], -e["dur"]))


def _expected_kernels_per_module() -> dict[str, int]:
    """Device ops (kernels, memcpys, memsets) per nn.Module path, from the raw JSON: the modules enclosing the launch on its thread; on the autograd
    thread, those enclosing the forward event with the sequence number of the innermost event that has a
    ``Fwd thread id`` above 0."""
    with gzip.open(TRAIN, "rt") as f:
        trace = json.load(f)["traceEvents"]
    host = [e for e in trace if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "python_function",
                                                                         "user_annotation", "cuda_runtime",
                                                                         "cuda_driver")]
    launches = {e["args"]["correlation"]: e for e in host if e["cat"] in ("cuda_runtime", "cuda_driver")
                and "correlation" in e.get("args", {})}
    modules = [e for e in host if e["cat"] == "python_function" and e["name"].startswith("nn.Module: ")]
    forward: dict[int, dict] = {}
    for e in sorted(host, key=lambda e: e["ts"]):
        seq = e.get("args", {}).get("Sequence number")
        if seq is not None and not e["args"].get("Fwd thread id"):
            forward.setdefault(seq, e)

    def path(at: dict) -> str | None:
        names = [m["name"][len("nn.Module: "):] for m in _enclosing(modules, at["tid"], at["ts"])]
        return "/".join(names) or None

    counts: dict[str, int] = defaultdict(int)
    for kernel in (e for e in trace if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")):
        launch = launches.get(kernel.get("args", {}).get("correlation"))
        if launch is None:
            continue
        where = path(launch)
        if where is None:
            marked = [e for e in _enclosing(host, launch["tid"], launch["ts"])
                      if e.get("args", {}).get("Fwd thread id", 0) > 0]
            if marked and (origin := forward.get(marked[-1]["args"]["Sequence number"])) is not None:
                where = path(origin)
        if where is not None:
            counts[where] += 1
    return dict(counts)


@pytest.mark.parametrize("layout", ["as parsed", "row groups of 499", "shuffled"])
def test_kernels_per_module_path_equal_the_raw_trace(layout: str) -> None:
    """Also with the host events in row groups of 499 rows (each group's names come with a dictionary of their own,
    which the module paths' names are read through, and the attribution carries parents from group to group); and
    with the host events shuffled (their ids no longer ascend: each parent's position is found through the first
    position of each id, and children come before their parents)."""
    expected = _expected_kernels_per_module()
    assert len(expected) > 20 and any(p.count("/") >= 2 for p in expected)
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        ingest.parse_into(TRAIN, out, ingest.ParseOptions(source_name=TRAIN.name, trace_id="t" * 20))
        host = pq.read_table(out / "host_ops.parquet")
        if layout == "row groups of 499":
            pq.write_table(host, out / "host_ops.parquet", row_group_size=499)
            assert pq.ParquetFile(out / "host_ops.parquet").num_row_groups > 10
        elif layout == "shuffled":
            host = host.take(np.random.default_rng(3).permutation(host.num_rows))
            assert not (np.diff(host["event_id"].to_numpy()) > 0).all()
            pq.write_table(host, out / "host_ops.parquet", row_group_size=4999)
        write_derived(out, out)
        rows = pl.read_parquet(out / "op_stats.parquet")
    got = dict(rows.filter(pl.col("module").str.starts_with("GPT_0")).group_by("module")
               .agg(pl.col("kernels").sum()).iter_rows())
    assert got == expected


def test_the_scope_rules_on_a_small_tree() -> None:
    """Positions: 0 nn.Module GPT (1 Block (2 aten::linear (3 launch))); 4 train.py frame (5 aten::add (6 launch));
    autograd thread: 7 backward event of seq 9 (8 aten::mm (9 launch)); 10 forward event of seq 9 under 1."""
    kinds = [MODULE, MODULE, NONE, NONE, FRAME, NONE, NONE, NONE, NONE, NONE, NONE]
    parent = np.array([-1, 0, 1, 2, -1, 4, 5, -1, 7, 8, 1])
    autograd = Autograd(np.array([7, 10]), np.array([9, 9]), np.array([True, False]), np.array([7, 10]))
    calls = np.array([2, 5, 8])
    found = scopes(calls, parent, np.array(kinds, dtype=np.int8), autograd)
    assert found.tolist() == [1, 4, 1]  # the Block; the frame; the forward's Block
    assert chains(np.array([1, 4]), parent, np.array(kinds, dtype=np.int8) == MODULE).as_dict() == \
        {1: (0, 1), 4: (4,)}


def test_paths_are_found_by_their_scope_event_alone() -> None:
    """:class:`Paths` answers for the scope events it was made for, in any order, and for no other event."""
    kinds = np.array([MODULE, MODULE, MODULE, FRAME, NONE], dtype=np.int8)
    parent = np.array([-1, 0, 1, 2, 3])
    paths = chains(np.array([3, 2, 0]), parent, kinds == MODULE)  # unsorted, as the calls' scopes come
    assert paths.starts.tolist() == [0, 2, 3] and len(paths) == 3
    assert paths.of(2) == (0, 1, 2) and paths.of(0) == (0,) and paths.of(3) == (3,)
    for missing in (1, 4, -1):
        with pytest.raises(KeyError):
            paths.of(missing)
    assert np.all(np.diff(paths.offsets) >= 1) and paths.offsets[-1] == len(paths.members)
    empty = chains(np.zeros(0, dtype=np.int64), parent, kinds == MODULE)
    assert len(empty) == 0 and empty.as_dict() == {}


def test_what_counts_as_a_scope() -> None:
    assert scope_kind("python_function", "nn.Module: Linear_3") == MODULE
    assert scope_kind("python_function", "train.py(42): step") == FRAME
    assert scope_kind("python_function", "torch/nn/modules/linear.py(125): forward") == NONE
    assert scope_kind("python_function", "<built-in method linear>") == NONE
    assert scope_kind("cpu_op", "nn.Module: Linear_3") == NONE


def test_top_modules_add_up_to_the_device_time() -> None:
    """Module rows never overlap (innermost paths): with the rest and no-module rows they hold every device op."""
    from tracelake.analysis.operators import NO_MODULE, OTHER_MODULES, top_modules

    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        ingest.parse_into(TRAIN, out, ingest.ParseOptions(source_name=TRAIN.name, trace_id="t" * 20))
        write_derived(out, out)
        rows = pl.read_parquet(out / "op_stats.parquet")
    top = top_modules(rows, top=5)
    assert top["device_ns"].sum() == rows["device_ns"].sum() and top["kernels"].sum() == rows["kernels"].sum()
    assert top["share_pct"].sum() == pytest.approx(100.0)
    assert top["module"].to_list()[-2:] == [OTHER_MODULES, NO_MODULE] and top.height == 7
    named = top.filter(~pl.col("module").is_in([OTHER_MODULES, NO_MODULE]))
    assert named["device_ns"].is_sorted(descending=True)
    assert top_modules(rows.with_columns(pl.lit(None, pl.String).alias("module"))).is_empty()


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_nearest_equals_a_walk_event_by_event(data: st.DataObject) -> None:
    """:func:`nearest`, a chunk of starts at a time (chunks of 1-9 drawn), against a plain walk up each chain, on
    random forests with cycles and parents outside the events; the walk stops after as many steps as the function
    allows (a longer chain is a cycle)."""
    n = data.draw(st.integers(1, 60))
    parent = np.array(data.draw(st.lists(st.integers(-2, n + 2), min_size=n, max_size=n)), dtype=np.int32)
    parent[(parent >= n)] = -1  # a parent outside the events: none
    parent[parent == -2] = -1
    mask = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    start = np.array(data.draw(st.lists(st.integers(-1, n - 1), max_size=40)), dtype=np.int64)
    chunk = data.draw(st.integers(1, 9))

    def walk(at: int) -> int:
        for _ in range(op_scope._MAX_DEPTH):
            if at < 0:
                return -1
            if mask[at]:
                return at
            at = int(parent[at])
        return -1

    got = nearest(start, parent, mask, chunk=chunk)
    assert got.dtype == np.int64
    assert got.tolist() == [walk(int(s)) for s in start]
