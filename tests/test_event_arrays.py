"""The positions of event ids (analysis/event_index.py) against a dict made here, on every kind of ids; the flags
of every host event (analysis/event_flags.py) packed and unpacked."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tracelake.analysis.event_flags import EventFlags
from tracelake.analysis.event_index import Builder, build, parent_rows


@st.composite
def _ids(draw: st.DrawFn) -> list[int]:
    """Ids as parsers write them (ascending, dense) and as they may come (any order, repeats, sparse, negative)."""
    form = draw(st.sampled_from(["ascending", "any", "repeats"]))
    if form == "ascending":
        ids = sorted(draw(st.sets(st.integers(0, 300), max_size=80)))
    else:
        ids = draw(st.lists(st.integers(-5, 40 if form == "repeats" else 300), max_size=80,
                            unique=form == "any"))
    spread = draw(st.sampled_from([1, 1, 17, 10**6, 10**9]))  # 17 and on: the sparse form (offsets, not bits)
    return [i * spread for i in ids]


@settings(max_examples=400, deadline=None)
@given(_ids(), st.data(), st.sampled_from([np.int32, np.int64]))
def test_positions_match_a_dict_made_here(ids: list[int], data: st.DataObject, kind: type) -> None:
    """Each asked id's position is the first position of that id (-1: not an id), by a dict made here, whatever
    the pieces the ids come in (the row groups), the chunks they are asked in and the width of either array."""
    big = any(abs(i) >= 2**31 for i in ids)
    first: dict[int, int] = {}
    for at, i in enumerate(ids):
        first.setdefault(i, at)
    asked = data.draw(st.lists(st.sampled_from([-1, 301, 3 * 10**9, *ids]), max_size=60))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(ids)), max_size=5)))
    pieces = [np.array(piece, dtype=np.int64 if big else kind) for piece in np.split(np.array(ids, dtype=np.int64),
                                                                                    cuts)]
    index = build(pieces)
    assert index.size == len(ids)
    wanted = np.array(asked, dtype=np.int64 if big or any(abs(a) >= 2**31 for a in asked) else kind)
    found = index.positions(wanted, chunk=data.draw(st.integers(1, 9)))
    assert found.tolist() == [first.get(a, -1) for a in asked]
    assert found.dtype == np.int32  # positions below 2**31: half the memory of int64
    assert parent_rows(np.array(ids, dtype=np.int64), wanted).tolist() == found.tolist()


def test_dense_ids_are_held_as_bits_not_as_a_table_over_their_span() -> None:
    """A million ascending ids spread over twice their number: the index holds a bit per id of the span and a count
    per 64 (1 MiB here), not 4 bytes per id of the span (8 MiB), and answers like a dict over a sample."""
    rng = np.random.default_rng(7)
    ids = np.sort(rng.choice(2_000_000, 1_000_000, replace=False))
    index = build(np.array_split(ids, 16))
    assert index.nbytes < 2_000_000 // 8 + 2_000_000 // 64 * 8 + 1024
    sample = rng.choice(2_000_000, 5000)
    where = {int(i): at for at, i in enumerate(ids)}
    assert index.positions(sample).tolist() == [where.get(int(i), -1) for i in sample]


@pytest.mark.parametrize("gap", [15, 40])
def test_spread_ids_take_at_most_4_bytes_each(gap: int) -> None:
    """Ids some ``gap`` apart on average, as a trace's launch calls' correlation ids are (CUDA numbers every runtime
    call): bits where those are smaller (15 apart: under 3 bytes an id), else offsets of 4 bytes, not 8; either
    answers like a dict."""
    rng = np.random.default_rng(gap)
    ids = np.cumsum(rng.integers(1, 2 * gap, 1_000_000)) + 5 * 10**9  # past int32: the offsets still fit 4 bytes
    index = build([ids])
    assert index.nbytes <= (3 if gap == 15 else 4) * len(ids)
    sample = np.concatenate([rng.choice(ids, 3000), rng.integers(int(ids[0]) - 10, int(ids[-1]) + 10, 3000)])
    where = {int(i): at for at, i in enumerate(ids)}
    assert index.positions(sample).tolist() == [where.get(int(i), -1) for i in sample]


def test_dense_ids_are_indexed_without_holding_their_pieces() -> None:
    """Four million ascending ids given a row group's worth at a time, their number and span first: the builder's
    allocations (as tracemalloc counts numpy's) stay near the bits and one piece's temporaries, far under the 16 MB
    the pieces would take held, and the index answers like a dict over a sample."""
    rng = np.random.default_rng(3)
    ids = np.sort(rng.choice(6_000_000, 4_000_000, replace=False)).astype(np.int32)
    tracemalloc.start()
    try:
        builder = Builder(len(ids), int(ids[0]), int(ids[-1]))
        for at in range(0, len(ids), 65_536):
            builder.add(ids[at:at + 65_536].copy())  # a fresh piece, as a row group's read is
        assert not builder.again
        index = builder.index()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20
    sample = rng.choice(6_000_000, 5000)
    where = {int(i): at for at, i in enumerate(ids)}
    assert index.positions(sample).tolist() == [where.get(int(i), -1) for i in sample]


def test_ids_out_of_order_are_given_twice_for_their_first_positions() -> None:
    """Dense ids that repeat and come out of order: the builder asks for a second pass, and then answers each id's
    first position, as a dict made here does; an index asked for before that pass is refused."""
    ids = [7, 3, 7, 9, 3, 12, 8, 3]
    pieces = [np.array(ids[:3]), np.array(ids[3:6]), np.array(ids[6:])]
    builder = Builder(len(ids), 3, 12)
    for piece in pieces:
        builder.add(piece)
    assert builder.again
    with pytest.raises(ValueError, match="ids given"):
        builder.index()
    for piece in pieces:
        builder.add_again(piece)
    first: dict[int, int] = {}
    for at, i in enumerate(ids):
        first.setdefault(i, at)
    asked = np.arange(0, 15)
    assert builder.index().positions(asked).tolist() == [first.get(int(i), -1) for i in asked]


@pytest.mark.parametrize(("size", "low", "high", "pieces", "message"), [
    (3, 10, 20, [[10, 11, 21]], "outside"),
    (3, 10, 20, [[9, 11, 12]], "outside"),
    (2, 10, 20, [[10, 11, 12]], "outside"),
    (4, 10, 20, [[10, 11, 12]], "3 ids given of 4"),
    (3, 0, 10**9, [[10], [11, 10**9 + 1]], "outside"),  # sparse: a span over 16 times their number
])
def test_a_builder_refuses_pieces_unlike_what_it_was_given(size: int, low: int, high: int, pieces: list[list[int]],
                                                           message: str) -> None:
    """Ids outside the span given, or more or fewer than the number given, are a bug of the caller's: refused."""
    builder = Builder(size, low, high)
    with pytest.raises(ValueError, match=message):
        for piece in pieces:
            builder.add(np.array(piece, dtype=np.int64))
        builder.index()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.booleans(), st.integers(0, 3), st.integers(0, 3)), max_size=50))
def test_event_flags_unpack_what_was_packed(events: list[tuple[bool, bool, int, int]]) -> None:
    """Each of the four flags comes back as it went in (counted only where a ``cpu_op``), event by event."""
    flags = EventFlags.pack(*(np.array([e[i] for e in events], dtype=kind)
                              for i, kind in enumerate((bool, bool, np.int8, np.int8))))
    assert len(flags) == len(events) and flags.bits.dtype == np.uint8
    assert flags.is_op().tolist() == [e[0] for e in events]
    assert flags.counted_op().tolist() == [e[0] and e[1] for e in events]
    assert flags.kind().tolist() == [e[2] for e in events]
    assert flags.recompute().tolist() == [e[3] for e in events]


def test_event_flags_refuse_a_kind_that_does_not_fit_two_bits() -> None:
    with pytest.raises(ValueError, match="kind takes values 0-3"):
        EventFlags.pack(np.ones(1, dtype=bool), np.ones(1, dtype=bool), np.array([4], dtype=np.int8),
                        np.zeros(1, dtype=np.int8))
