"""The stored analyses' two sweeps in C (``analysis/_sweep.c``) and in numpy: each equals the SQL oracle.

The breakdown (:class:`breakdown.BreakdownParts`) and the idle gaps (:func:`idle.idle_window`) are fed a
rank's ops in random windows of time, as ingest feeds them, with each engine; both must give the rows the
SQL oracles give for the whole timeline at once (``oracles/breakdown.py``, ``oracles/idle.py``). The C
sweeps refuse an order, a step or a stream out of range with an error instead of reading outside their
arrays. And the windows the stored analyses read are whole row groups where one fits, so polars takes them
without copying.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oracles.breakdown import breakdown_sql
from oracles.idle import idle_sql, random_timeline
from tracelake.analysis import breakdown, idle
from tracelake.warehouse import derived

#: The engines there are here: numpy always, C where it was built.
ENGINES = ["numpy", *(["C"] if breakdown.NATIVE else [])]


@contextmanager
def engine(name: str) -> Iterator[None]:
    """The breakdown and idle sweeps in ``name`` ("numpy" or "C") for the block."""
    kept = breakdown._native, idle._native
    if name == "numpy":
        breakdown._native = idle._native = None
    try:
        yield
    finally:
        breakdown._native, idle._native = kept


def test_the_c_sweeps_are_built_where_a_compiler_is() -> None:
    """CI builds the project with gcc: the C sweeps must be in use there, not the fallback silently."""
    assert breakdown.NATIVE
    assert idle._native is not None


def _cuts(rng: random.Random, starts: list[int]) -> list[int]:
    """Window edges between the starts: a few random times, never splitting ops of one start."""
    return sorted({rng.randint(min(starts), max(starts) + 1) for _ in range(rng.randint(0, 4))})


def _timeline(rng: random.Random, n: int) -> pl.DataFrame:
    steps = rng.choice([[1, 2, 3], [5, 40_000, 10**9], [None, 3, 10**12]])
    starts = sorted(rng.randint(0, 300) for _ in range(n))
    ordered = rng.random() < 0.5  # steps follow time (the usual case), or are drawn at random (interleaved)
    return pl.DataFrame({
        "trace_id": ["t"] * n, "rank": [0] * n,
        "step": [steps[min(2, s * 3 // 301)] for s in starts] if ordered else [rng.choice(steps) for _ in starts],
        "category": [rng.choice(["compute", "communication", "memory", "sync", "other"]) for _ in range(n)],
        "ts_ns": starts, "dur_ns": [rng.choice([0, rng.randint(1, 90), -1]) for _ in range(n)],
        "flops": [rng.choice([None, 4.0]) for _ in range(n)],
    }, schema={"trace_id": pl.String, "rank": pl.Int32, "step": pl.Int64, "category": pl.String,
               "ts_ns": pl.Int64, "dur_ns": pl.Int64, "flops": pl.Float64})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rng=st.randoms(), n=st.integers(1, 70))
def test_breakdown_in_windows_equals_the_sql_with_either_engine(rng: random.Random, n: int) -> None:
    """Ops and async windows in random windows of time (intervals carried past a window's end), steps in time
    order or interleaved, sparse or huge step numbers, a window's ops in start order or shuffled: the rows are the
    oracle's for the whole timeline."""
    ops = _timeline(rng, n)
    windows = pl.DataFrame({"trace_id": ["t", "t"], "rank": [0, 0], "step": [ops["step"][0], ops["step"][-1]],
                            "ts_ns": [rng.randint(0, 300) for _ in range(2)], "dur_ns": [25, 70]},
                           schema={"trace_id": pl.String, "rank": pl.Int32, "step": pl.Int64, "ts_ns": pl.Int64,
                                   "dur_ns": pl.Int64}).sort("ts_ns")
    con = duckdb.connect()
    con.register("o", ops.to_arrow())
    con.register("w", windows.to_arrow())
    expected = con.sql(breakdown_sql("o", "w")).pl().drop("flops_utilisation_pct")
    edges = [breakdown.LOWEST, *_cuts(rng, ops["ts_ns"].to_list()), breakdown.HIGHEST]
    seed = rng.randint(0, 2**32 - 1) if rng.random() < 0.5 else None  # None: in start order
    for name in ENGINES:
        with engine(name):
            parts = breakdown.BreakdownParts()
            for low, high in zip(edges, edges[1:]):
                inside = (pl.col("ts_ns") >= low) & (pl.col("ts_ns") < high)
                mine = ops.filter(inside)
                parts.add(mine if seed is None else mine.sample(fraction=1.0, shuffle=True, seed=seed),
                          windows.filter(inside), low, high)
            got = breakdown.rows_frame(parts.rows("t", 0, None)).drop("flops_utilisation_pct")
        assert got.equals(expected), name


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rng=st.randoms(), n=st.integers(1, 60))
def test_idle_in_windows_equals_the_sql_with_either_engine(rng: random.Random, n: int) -> None:
    """Several streams (one of no number), ties, ops inside others, launches before and after the previous
    end, fed in random windows with one carry: the rows are the oracle's."""
    device, host = random_timeline(rng, n, streams=[3, 7, 2**40, None], in_order=True)
    starts = device["ts_ns"].to_list()
    con = duckdb.connect()
    con.register("d", device.to_arrow())
    con.register("h", host.to_arrow())
    expected = con.sql(idle_sql("d", "h")).pl()
    launches = host.group_by("trace_id", "correlation").agg(pl.col("ts_ns").min().alias("launch_ns"))
    work = device.filter(pl.col("category") != "sync").join(
        launches, on=["trace_id", "correlation"], how="left", maintain_order="left").select(
        "trace_id", "rank", "stream", "ts_ns", (pl.col("ts_ns") + pl.col("dur_ns")).alias("end_ns"), "launch_ns")
    edges = [breakdown.LOWEST, *_cuts(rng, starts), breakdown.HIGHEST]
    for name in ENGINES:
        with engine(name):
            carry: dict[int, int] = {}
            parts = [idle.idle_window(work.filter((pl.col("ts_ns") >= low) & (pl.col("ts_ns") < high)), carry)
                     for low, high in zip(edges, edges[1:])]
            got = idle.combine_windows(parts)
        assert _by_stream(got.rows()) == _by_stream(expected.rows()), name


def _by_stream(rows: list[tuple[object, ...]]) -> list[tuple[object, ...]]:
    """Rows in order of their stream, the one of no number last (the oracle and the tables order it apart)."""
    return sorted(rows, key=lambda row: (row[2] is None, row[2] or 0))


@pytest.mark.skipif(not breakdown.NATIVE, reason="the C sweeps are not built here")
def test_the_c_sweeps_refuse_what_lies_outside_their_arrays() -> None:
    from tracelake.analysis import _sweep  # type: ignore[attr-defined]

    ints = np.array([0, 5], dtype=np.int64)
    order = np.array([0, 1], dtype=np.int64)
    floats, valid, none = np.zeros(2), np.ones(2, dtype=bool), np.zeros(0, dtype=np.int64)

    def window(code: np.ndarray, work: int = 20, ts: np.ndarray = ints, flags: np.ndarray = valid) -> object:
        return _sweep.window(ts, ints + 1, code, ints * 0, floats, flags, floats, flags, floats, flags,
                             none, none, none, none, breakdown.LOWEST, breakdown.HIGHEST, np.zeros(work, np.int64))

    assert window(np.array([0, 1]))[3] == 0  # the arguments below are good but for the one named
    with pytest.raises(ValueError, match="category out of range"):
        window(np.array([0, 6]))
    with pytest.raises(ValueError, match="category out of range"):  # an op is never an async window
        window(np.array([3, 0]))
    with pytest.raises(ValueError, match="too little work space"):
        window(order, work=19)
    with pytest.raises(ValueError, match="unequal lengths"):
        window(order, ts=ints[:1])
    with pytest.raises(TypeError, match="int64"):
        window(order, ts=ints.astype(np.int32))
    with pytest.raises(TypeError, match="'[?]' items"):
        window(order, flags=valid.astype(np.int8))
    known, before = np.zeros(1, np.int64), np.zeros(1, np.int64)
    with pytest.raises(ValueError, match="stream out of range"):
        _sweep.idle(order, np.array([0, 1]), ints, ints + 1, ints * 0, ints, known, before, 0, np.zeros(9, np.int64))
    with pytest.raises(ValueError, match="order out of range"):
        _sweep.idle(np.array([0, -1]), ints * 0, ints, ints + 1, ints * 0, ints, known, before, 0,
                    np.zeros(9, np.int64))


def test_windows_are_whole_row_groups_where_one_fits(tmp_path: Path) -> None:
    """Row groups of 70 ops in time order, windows of up to 100: each window is one row group as it was read (not
    100 ops made of pieces of two), every op once, in start order; groups of 30 are taken three at a time."""
    n = 700
    ops = pa.table({"trace_id": ["t"] * n, "rank": pa.array([0] * n, pa.int32()), "stream": [7] * n,
                    "step": [1] * n, "kind": ["kernel"] * n, "category": ["compute"] * n, "name": ["k"] * n,
                    "ts_ns": list(range(0, 10 * n, 10)), "dur_ns": [5] * n, "correlation": [None] * n,
                    "flops": pa.array([None] * n, pa.float64()), "event_id": list(range(n))})
    for group, windows in ((70, 10), (30, 8)):
        path = tmp_path / f"device_ops_{group}.parquet"
        pq.write_table(ops, path, row_group_size=group)
        cut = list(derived._windows(path, "t", 0, 100))
        assert len(cut) == windows
        assert [w.height for _, _, w in cut[:-1]] == [group * (100 // group)] * (windows - 1)
        assert pl.concat([w for _, _, w in cut])["event_id"].to_list() == list(range(n))
        assert [low for low, _, _ in cut][0] == breakdown.LOWEST and cut[-1][1] == breakdown.HIGHEST
