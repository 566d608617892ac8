"""The logs the launch statistics keep their values per launched op in (docs/architecture.md, "Memory"): on disk in
sorted runs merged as read (``warehouse/spill_log``), or in memory (``analysis/sorted_values``), and the figures made
from their sorted chunks, against numpy's sort and quantiles of all the values at once."""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tracelake.analysis.sorted_values import MemoryLog, repeated, sorted_quantiles
from tracelake.warehouse.spill_log import SpillLog

pieces = st.lists(st.lists(st.integers(-2**40, 2**40) | st.integers(-3, 3), max_size=12), max_size=10)


@settings(max_examples=150, deadline=None)
@given(pieces=pieces, run=st.integers(1, 9), budget=st.integers(1, 200), min_block=st.integers(1, 5))
def test_a_spilled_log_gives_every_value_back_sorted(pieces: list[list[int]], run: int, budget: int,
                                                     min_block: int) -> None:
    """Whatever the runs' and blocks' lengths (a run of one value, a block of one), the chunks hold every value
    appended, ascending within and across chunks; the file is gone once read."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "values.i64"
        log = SpillLog(path, run=run, budget=budget, min_block=min_block)
        for piece in pieces:
            log.append(np.array(piece, dtype=np.int64))
        expected = np.sort(np.array([v for piece in pieces for v in piece], dtype=np.int64))
        assert len(log) == len(expected)
        assert path.exists() == (len(expected) >= run)  # on disk once a run's worth came
        chunks = list(log.sorted_chunks())
        assert all(len(c) for c in chunks)
        got = np.concatenate(chunks) if chunks else np.empty(0, dtype=np.int64)
        assert got.tolist() == expected.tolist()
        assert not path.exists()


@settings(max_examples=150, deadline=None)
@given(pieces=pieces.filter(lambda p: any(p)), spilled=st.booleans(), qs=st.lists(st.floats(0, 1), min_size=1,
                                                                                  max_size=4))
def test_quantiles_from_sorted_chunks_equal_numpys_linear_quantiles(pieces: list[list[int]], spilled: bool,
                                                                    qs: list[float]) -> None:
    """``sorted_quantiles`` over a log's chunks (in memory, or spilled in runs of 2) equals numpy's ``quantile``
    (linear between the values at floor and ceil of ``(n - 1) * q``, DuckDB's ``quantile_cont``) of all of them."""
    values = np.array([v for piece in pieces for v in piece], dtype=np.int64)
    with tempfile.TemporaryDirectory() as folder:
        log = SpillLog(Path(folder) / "v.i64", run=2, budget=16, min_block=1) if spilled else MemoryLog()
        for piece in pieces:
            log.append(np.array(piece, dtype=np.int64))
        got = sorted_quantiles(log.sorted_chunks(), len(values), qs)
    expected = [float(np.quantile(values.astype(np.float64), q, method="linear")) for q in qs]
    assert np.allclose(got, expected, rtol=1e-12, atol=1e-6)


def test_the_memory_log_keeps_values_that_fit_in_int32_narrow() -> None:
    """The log in memory keeps a piece as int32 where its values fit (a delay or a wait under 2.1 s), and gives
    int64 back, wide values included."""
    log = MemoryLog()
    log.append(np.array([5, -1, 3], dtype=np.int64))
    log.append(np.array([2**40, 0], dtype=np.int64))
    assert [p.dtype for p in log._pieces] == [np.dtype(np.int32), np.dtype(np.int64)]
    chunks = list(log.sorted_chunks())
    assert [c.dtype for c in chunks] == [np.dtype(np.int64)]
    assert np.concatenate(chunks).tolist() == [-1, 0, 3, 5, 2**40]


@settings(max_examples=200, deadline=None)
@given(pieces=pieces, run=st.integers(1, 5), budget=st.integers(1, 64), spilled=st.booleans())
def test_repeated_values_from_sorted_chunks_equal_a_count(pieces: list[list[int]], run: int, budget: int,
                                                          spilled: bool) -> None:
    """The values given more than once (the kernels' shared correlation ids), from a log's chunks, whatever the
    chunks' cuts (a value repeated across two, three or more chunks), equal a count made here: each once, ascending."""
    counts = Counter(v for piece in pieces for v in piece)
    with tempfile.TemporaryDirectory() as folder:
        log = SpillLog(Path(folder) / "v.i64", run=run, budget=budget, min_block=1) if spilled else MemoryLog()
        for piece in pieces:
            log.append(np.array(piece, dtype=np.int64))
        got = repeated(log.sorted_chunks())
    assert got.dtype == np.int64
    assert got.tolist() == sorted(v for v, n in counts.items() if n > 1)


def test_a_value_repeated_across_chunk_cuts_is_found_once() -> None:
    """A value that ends one chunk, fills the next and starts the one after: once; one only at the cut: found."""
    chunks = [np.array([1, 4, 7]), np.array([7, 7]), np.array([7, 8, 9]), np.array([9]), np.array([], dtype=np.int64),
              np.array([10, 11, 11])]
    assert repeated(chunks).tolist() == [7, 9, 11]
