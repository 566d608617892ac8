"""The operators' attribution made a row group at a time (analysis/op_attribution.py, through
warehouse/derived_operators.py) against the walk up every event's parent chain (``Operators(host)``: op_scope's
``nearest``, ``scopes`` and ``chains``, recompute's ``recomputed``), on generated forests of host events in row groups
of a few rows, in order and shuffled (children before their parents, parents many groups before), and on every real
Kineto trace at hand."""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path
from unittest import mock

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
from hypothesis import example, given, settings, strategies as st
from support import real_kineto_files

from tracelake import ingest
from tracelake.analysis.launches import GRAPH_CALL, launch_calls
from tracelake.analysis.op_attribution import BackRefs, LaunchRows
from tracelake.analysis.op_stats import Operators
from tracelake.warehouse import call_table, derived_operators, keyed_groups
from tracelake.warehouse.derived_operators import _id_spans, _indexes, operators
from tracelake.warehouse.spill_log import SpillLog
from tracelake.warehouse.launch_table import LaunchSink, LaunchTable

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


def _answers(ops: Operators, owners: np.ndarray, ids: np.ndarray, correlations: list[int]
             ) -> dict[int, tuple[object, ...] | None]:
    """Per correlation id (``owners``: its operator's position; -1 for none): the event id of its operator, that
    operator's module and whether it is recomputed."""
    calls = ops.find(owners)
    shown: dict[int, tuple[object, ...] | None] = {}
    for at, correlation in enumerate(correlations):
        if calls.index[at] < 0:
            shown[correlation] = None
            continue
        shown[correlation] = (int(ids[int(owners[at])]), ops.kinds["module"][int(calls.key[at])],
                              bool(calls.recomputed[at]))
    return shown


def _compare(host: pl.DataFrame, path: Path, row_group: int, statistics: bool = True, small: bool = False
             ) -> dict[int, tuple[object, ...] | None]:
    """The answers of both ways, asserted equal; the launch calls as the windows find them (the table written
    sorted by correlation id, read a row group at a time), against those the walks found. ``statistics``: whether
    the file has row-group statistics (the events' ids are counted from them, else read); ``small``: the operators
    logged in runs of 2 values merged a block of 1 at a time, and their calls written in row groups of 2, one kept
    read at a time (every cut the sizes of real traces make, in a few events)."""
    host = host.filter(pl.col("event_id").is_not_null())
    expected = Operators(host)
    pq.write_table(host.to_arrow(), path, row_group_size=row_group, write_statistics=statistics)
    folder = path.parent / "calls"
    folder.mkdir()
    with contextlib.ExitStack() as sizes:
        if small:
            sizes.enter_context(mock.patch.object(derived_operators, "SpillLog",
                                                  functools.partial(SpillLog, run=2, budget=8, min_block=1)))
            sizes.enter_context(mock.patch.object(call_table, "GROUP_ROWS", 2))
            sizes.enter_context(mock.patch.object(keyed_groups, "CACHED_GROUPS", 1))
        got, tables, _ = operators(path, folder, {})
        correlations = sorted(set(host["correlation"].drop_nulls().to_list()))
        asked = pl.Series(correlations, dtype=pl.Int64)
        ids = host["event_id"].to_numpy()
        want = _answers(expected, expected.owners_of(asked), ids, correlations)
        if "t" not in got:  # no event is a cpu_op
            assert all(v is None for v in want.values())
            return want
        found = tables["t"].find(asked)
        assert _answers(got["t"], found.owner, ids, correlations) == want
    # each id's call, start, duration and graph flag as launch_calls picks them from the host events at once
    launching = host.filter(pl.col("correlation").is_not_null() & pl.col("ts_ns").is_not_null())
    keys, starts, durations, graph = launch_calls(
        launching["correlation"].to_numpy(), launching["ts_ns"].to_numpy(),
        launching["dur_ns"].fill_null(0).to_numpy(),
        launching["name"].str.contains(GRAPH_CALL).fill_null(False).to_numpy())
    assert found.found.all() and found.launch_ns.tolist() == starts.tolist()
    assert found.call_ns.tolist() == durations.tolist() and found.graph.tolist() == graph.tolist()
    assert keys.tolist() == correlations
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
@given(host=forests(), row_group=st.integers(1, 9), statistics=st.booleans(), small=st.booleans())
def test_the_attribution_a_row_group_at_a_time_equals_the_walks(host: pl.DataFrame, row_group: int, statistics: bool,
                                                                 small: bool,
                                                                 tmp_path_factory: pytest.TempPathFactory) -> None:
    _compare(host, tmp_path_factory.mktemp("attribution") / "host_ops.parquet", row_group, statistics, small)


@settings(max_examples=80, deadline=None)
@given(rows=st.lists(st.tuples(st.sampled_from(["a", "b", None]), st.one_of(st.none(), st.integers(-50, 10**10))),
                     max_size=40),
       row_group=st.integers(1, 9), statistics=st.booleans())
@example(rows=[("a", 1), ("b", 5), ("a", 3)], row_group=2, statistics=True)  # one row group of two traces
def test_id_spans_equal_a_count_made_here(rows: list[tuple[str | None, int | None]], row_group: int,
                                          statistics: bool, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Per trace, the events with a trace and an id, and their lowest and highest id: from the row groups'
    statistics or read (row groups of two traces, rows without either, no statistics), as counted here."""
    path = tmp_path_factory.mktemp("spans") / "host_ops.parquet"
    pq.write_table(pl.DataFrame(rows, schema={"trace_id": pl.String, "event_id": pl.Int64}, orient="row").to_arrow(),
                   path, row_group_size=row_group, write_statistics=statistics)
    expected: dict[str, tuple[int, int, int]] = {}
    for trace_id, event_id in rows:
        if trace_id is not None and event_id is not None:
            count, low, high = expected.get(trace_id, (0, event_id, event_id))
            expected[trace_id] = (count + 1, min(low, event_id), max(high, event_id))
    file = pq.ParquetFile(path)
    assert _id_spans(file, range(file.num_row_groups)) == expected


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


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_launch_table_equals_launch_calls_whatever_the_pieces(data: st.DataObject,
                                                             tmp_path_factory: pytest.TempPathFactory) -> None:
    """Calls fed to :class:`LaunchSink` in pieces, each with a floor no later call goes under (or none: unknown),
    read back by :class:`LaunchTable` in row groups of any size: each id's call, start, duration, graph flag and
    operator equal :func:`launch_calls` over all the calls at once (ids repeated; starts and durations tied)."""
    n = data.draw(st.integers(0, 60))
    ids = np.array(data.draw(st.lists(st.integers(0, 40), min_size=n, max_size=n)), dtype=np.int64)
    ts = np.array(data.draw(st.lists(st.integers(0, 5), min_size=n, max_size=n)), dtype=np.int64)
    dur = np.array(data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)), dtype=np.int64)
    graph = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool)
    owner = np.arange(n, dtype=np.int64) * 7  # each call's own operator: the choice shows in it
    cuts = sorted(data.draw(st.lists(st.integers(0, n), max_size=6)))
    path = tmp_path_factory.mktemp("calls") / "calls.parquet"
    sink = LaunchSink(path)
    for low, high in zip([0, *cuts], [*cuts, n], strict=True):
        rest = ids[high:]
        honest = int(rest.min()) if len(rest) else 10**9
        floor = data.draw(st.sampled_from([None, honest, max(honest - 3, 0)]))  # a floor at or below the truth
        sink.add(LaunchRows(ids[low:high], ts[low:high], dur[low:high], owner[low:high],
                            np.arange(low, high, dtype=np.int64), graph[low:high]), floor)
    sink.close()
    shared = np.array(sorted(data.draw(st.sets(st.integers(0, 40), max_size=4))), dtype=np.int64)
    table = LaunchTable(path, sink.count, shared)
    keys, starts, durations, graphs = launch_calls(ids, ts, dur, graph)
    assert len(table) == len(keys)
    asked = pl.Series([*range(-2, 43), None], dtype=pl.Int64)
    found = table.find(asked)
    known = {int(k): i for i, k in enumerate(keys.tolist())}
    for row, value in enumerate(asked.to_list()):
        i = known.get(value) if value is not None else None
        assert bool(found.found[row]) == (i is not None)
        if i is None:
            continue
        assert found.launch_ns[row] == starts[i] and found.call_ns[row] == durations[i]
        assert bool(found.graph[row]) == bool(graphs[i] or value in shared.tolist())
        chosen = [r for r in range(n) if ids[r] == value]  # the first call of the id: by start, then the shorter
        assert found.owner[row] == owner[min(chosen, key=lambda r: (ts[r], dur[r], r))]


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 60)), min_size=1, max_size=40),
       row_group=st.integers(1, 9), statistics=st.booleans())
def test_each_traces_index_answers_like_a_dict_made_here(rows: list[tuple[str, int]], row_group: int,
                                                         statistics: bool,
                                                         tmp_path_factory: pytest.TempPathFactory) -> None:
    """Two traces' events interleaved in the row groups (ids repeating, out of order, or not): each trace's index,
    built a row group at a time, gives each id's first position among that trace's own events."""
    path = tmp_path_factory.mktemp("indexes") / "host_ops.parquet"
    pq.write_table(pl.DataFrame(rows, schema={"trace_id": pl.String, "event_id": pl.Int64}, orient="row").to_arrow(),
                   path, row_group_size=row_group, write_statistics=statistics)
    file = pq.ParquetFile(path)
    indexes = _indexes(file, range(file.num_row_groups))
    for trace_id in ("a", "b"):
        first: dict[int, int] = {}
        for at, event_id in enumerate(e for t, e in rows if t == trace_id):
            first.setdefault(event_id, at)
        if not first:
            assert trace_id not in indexes
            continue
        asked = np.arange(-1, 62)
        assert indexes[trace_id].positions(asked).tolist() == [first.get(int(i), -1) for i in asked]
