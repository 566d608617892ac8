"""The operators that launched work on their way from the attribution to the windows (docs/architecture.md,
"Memory"): packed into a log and given back by position (``analysis/op_owners``), written by position and asked
a window at a time (``warehouse/call_table``), a bit per call for the windows' flags (``analysis/op_calls``); each
against a dict or a list made here."""

from __future__ import annotations

import tempfile
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracelake.analysis.op_calls import Bits, CallArrays
from tracelake.analysis.op_owners import POSITION_BITS, SCOPE_BITS, OwnerCursor, OwnerLog, Owners, pack, unpack
from tracelake.analysis.sorted_values import MemoryLog
from tracelake.warehouse import call_table, keyed_groups
from tracelake.warehouse.call_table import CallSink, CallTable
from tracelake.warehouse.spill_log import SpillLog

#: (position, scope, recomputed) of an operator: the same position always with the same scope and flag, as the
#: attribution finds them (an operator's scope is its own).
owners_ = st.lists(st.integers(0, 60), max_size=80).map(
    lambda ps: [(p, (p * 7) % 11 - 1, p % 3 == 0) for p in ps])


@settings(max_examples=100, deadline=None)
@given(position=st.lists(st.integers(0, 2**POSITION_BITS - 1), max_size=20), data=st.data())
def test_packing_keeps_each_operator_and_sorts_by_position(position: list[int], data: st.DataObject) -> None:
    scope = data.draw(st.lists(st.integers(-1, 2**SCOPE_BITS - 2), min_size=len(position), max_size=len(position)))
    flag = data.draw(st.lists(st.booleans(), min_size=len(position), max_size=len(position)))
    packed = pack(np.array(position, dtype=np.int64), np.array(scope, dtype=np.int64), np.array(flag, dtype=bool))
    back = unpack(packed)
    assert back.rows.tolist() == position and back.scope.tolist() == scope and back.recomputed.tolist() == flag
    assert (packed >= 0).all()
    assert [position[i] for i in np.argsort(packed, kind="stable")] == sorted(position)


@pytest.mark.parametrize(("position", "scope"), [(2**POSITION_BITS, 0), (-1, 0), (0, 2**SCOPE_BITS - 1), (0, -2)])
def test_packing_refuses_what_does_not_fit(position: int, scope: int) -> None:
    with pytest.raises(ValueError, match="beyond what the attribution keeps"):
        pack(np.array([position]), np.array([scope]), np.array([False]))


@settings(max_examples=150, deadline=None)
@given(pieces=st.lists(owners_, max_size=6), spilled=st.booleans(), fixes=st.sets(st.integers(0, 60)),
       limits=st.lists(st.integers(0, 70), max_size=6))
def test_the_log_gives_each_operator_once_by_position(pieces: list[list[tuple[int, int, bool]]], spilled: bool,
                                                      fixes: set[int], limits: list[int]) -> None:
    """Pieces in any order, repeats within and across pieces (and across the chunks of a log spilled in runs of 2):
    each operator once, ascending, with the scope fixed where asked; a cursor's ranges cover them once, in order."""
    expected = {p: (s, r) for piece in pieces for p, s, r in piece}
    fixed = sorted(p for p in fixes if p in expected)
    for p in fixed:
        expected[p] = (1000 + p, expected[p][1])
    with tempfile.TemporaryDirectory() as folder:
        log = OwnerLog(SpillLog(Path(folder) / "o.i64", run=2, budget=8, min_block=1) if spilled else MemoryLog())
        for piece in pieces:
            log.add(*(np.array(c, dtype=dt) for c, dt in zip(zip(*piece, strict=True), (np.int64, np.int64, bool),
                                                              strict=True)) if piece else
                    (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, bool)))
        chunks = OwnerCursor(log.chunks((np.array(fixed, dtype=np.int64), 1000 + np.array(fixed, dtype=np.int64))))
        taken = [chunks.below(limit) for limit in sorted(limits)] + [chunks.below(10**9)]
    got = Owners.joined(taken)
    assert got.rows.tolist() == sorted(expected)
    assert list(zip(got.scope.tolist(), got.recomputed.tolist(), strict=True)) == [expected[p] for p in sorted(expected)]
    bounds = [-1, *sorted(limits), 10**9]
    for part, low, high in zip(taken, bounds[:-1], bounds[1:], strict=True):
        assert all(max(low, 0) <= p < high for p in part.rows.tolist())


@settings(max_examples=100, deadline=None)
@given(positions=st.lists(st.integers(0, 200), unique=True, max_size=60).map(sorted), cut=st.integers(1, 5),
       group_rows=st.integers(1, 7), cached=st.integers(1, 3),
       asked=st.lists(st.integers(-1, 210), max_size=30))
def test_the_call_table_finds_each_call_by_position(positions: list[int], cut: int, group_rows: int, cached: int,
                                                    asked: list[int]) -> None:
    """Calls written in pieces, in row groups of any size, a few kept read: each position asked gives its call's
    number, key (through the rank), host time and flag, as a dict made here and as :class:`CallArrays` give them;
    -1 and zeros for a position that is no call."""
    key = [p % 5 for p in positions]
    host = [p * 10 for p in positions]
    flag = [p % 2 == 1 for p in positions]
    rank = np.array([4, 2, 0, 1, 3])
    with tempfile.TemporaryDirectory() as folder, mock.patch.object(call_table, "GROUP_ROWS", group_rows), \
            mock.patch.object(keyed_groups, "CACHED_GROUPS", cached):
        sink = CallSink(Path(folder) / "calls.parquet")
        for at in range(0, len(positions), cut):
            part = slice(at, at + cut)
            sink.add(np.array(positions[part], dtype=np.int64), np.array(key[part], dtype=np.int32),
                     np.array(host[part], dtype=np.int64), np.array(flag[part], dtype=bool))
        sink.close()
        table = CallTable(sink.path, sink.count, rank)
        found = table.find(np.array(asked, dtype=np.int64))
    arrays = CallArrays(np.array(positions, dtype=np.int64), rank[np.array(key, dtype=np.int64)],
                        np.array(host, dtype=np.int64), np.array(flag, dtype=bool)).find(np.array(asked, dtype=np.int64))
    number = {p: i for i, p in enumerate(positions)}
    assert len(table) == len(positions)
    for i, p in enumerate(asked):
        if p in number:
            n = number[p]
            want = (n, int(rank[key[n]]), host[n], flag[n])
        else:
            want = (-1, 0, 0, False)
        for got in (found, arrays):
            assert (int(got.index[i]), int(got.key[i]), int(got.host_ns[i]), bool(got.recomputed[i])) == want


def test_the_call_sink_refuses_calls_out_of_order(tmp_path: Path) -> None:
    sink = CallSink(tmp_path / "calls.parquet")
    one = np.zeros(1, dtype=np.int32)
    sink.add(np.array([5]), one, one, one > 0)
    with pytest.raises(ValueError, match="in the order of their positions"):
        sink.add(np.array([5]), one, one, one > 0)


@settings(max_examples=100, deadline=None)
@given(n=st.integers(0, 70), sets=st.lists(st.lists(st.integers(0, 69)), max_size=5))
def test_bits_hold_what_a_list_of_flags_holds(n: int, sets: list[list[int]]) -> None:
    bits, flags = Bits(n), [False] * n
    for chosen in sets:
        chosen = [c for c in chosen if c < n]
        bits.set(np.array(chosen, dtype=np.int64))
        for c in chosen:
            flags[c] = True
        assert bits.get(np.arange(n)).tolist() == flags
