"""Kernel launch statistics per rank (docs/analyses.md, "Launches").

Launch delay = kernel start - end of the runtime call that launched it (joined
on correlation), floored at 0. A kernel is *shorter than its launch overhead*
when it runs for less time than its runtime call took: fusing such kernels, or
capturing them in a CUDA graph, removes host time.

A *graph launch* (docs/analyses.md, "Launches", "CUDA/HIP graphs") is a call named like
:data:`GRAPH_CALL`, or any correlation id that more than one kernel of the trace carries.
Its kernels are counted apart: the call once per launch (``graph_launch_ns``), one delay
per launch (first kernel start - end of the call), never "shorter than their launch"
(they are in a graph already). :mod:`tracelake.analysis.graphs` has the per-launch view.

The call that launched an op is the first host event carrying its correlation id
(:func:`launch_calls`); every parser gives that id to one host event only.
:class:`LaunchParts` computes the rows of a rank from its ops fed window by window.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import polars as pl
import pyarrow as pa

from tracelake.contracts.classify import Category

from .event_index import EventIndex
from .quantiles import rounded
from .sorted_values import LogFactory, MemoryLog, ValueLog, deepest_queue, repeated, sorted_quantiles

COLUMNS = (
    "trace_id", "rank", "launches", "mean_delay_ns", "p50_delay_ns", "p95_delay_ns", "max_delay_ns",
    "shorter_than_launch", "shorter_than_launch_pct", "launch_overhead_ns",
    "graph_launches", "graph_kernels", "graph_launch_ns", "graph_mean_delay_ns", "graph_max_delay_ns",
)

#: Runtime and driver calls that launch a CUDA/HIP graph (a regular expression, any suffix:
#: ``cudaGraphLaunch_v10000``, ``cudaGraphLaunch_ptsz``, ``hipGraphLaunch``, ``cuGraphLaunch``).
GRAPH_CALL = r"^(cu|cuda|hip)GraphLaunch"

#: Columns of :meth:`LaunchParts.queues`: launch queue depth per stream, +1 when a runtime call launches
#: an op, -1 when the op starts. ``max_queue`` is the deepest the queue got; ``mean_queue`` its
#: time-weighted mean between the first launch and the last start. A queue that stays near zero means
#: the device waits for the host; a deep one means the host runs ahead (good).
QUEUE_COLUMNS = ("trace_id", "rank", "stream", "launches", "max_queue", "mean_queue")


def launch_calls(
    correlation: np.ndarray, ts_ns: np.ndarray, dur_ns: np.ndarray, graph_call: np.ndarray | None = None,
) -> tuple[np.ndarray, ...]:
    """The call that launched each correlation id, from one trace's host events that carry a correlation and a start.

    That is the first host event with the id (by start, then the shorter); an event without a
    duration counts as instant.

    Args:
        correlation, ts_ns, dur_ns: int64 arrays, one item per host event (a missing duration as 0).
        graph_call: bool array, whether each event is named like :data:`GRAPH_CALL` (none: no event is).

    Returns:
        The distinct correlation ids, sorted, with the ``launch_ns`` and ``call_ns`` of each one's call
        and whether some event with the id is a graph launch call.
    """
    ids, rows = launch_call_rows(correlation, ts_ns, dur_ns)
    # any event of the id a graph call: the graph calls' ids (few), looked up
    graph = np.zeros(len(ids), dtype=bool) if graph_call is None or not graph_call.any() else \
        member(ids, np.unique(correlation[graph_call.astype(bool)]))
    if ids is correlation:  # distinct and in order already: each event is its id's call
        return ids, ts_ns, dur_ns, graph
    return ids, ts_ns[rows], dur_ns[rows], graph


def member(values: np.ndarray, known: np.ndarray) -> np.ndarray:
    """Whether each value is in ``known`` (sorted, distinct): ``np.isin`` by binary search, without its sort of both."""
    if not len(known):
        return np.zeros(len(values), dtype=bool)
    return known[np.minimum(np.searchsorted(known, values), len(known) - 1)] == values


def launch_call_rows(correlation: np.ndarray, ts_ns: np.ndarray, dur_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct correlation ids (sorted) and the row of each one's launch call, chosen as :func:`launch_calls`
    chooses it (the first host event with the id, by start, then the shorter)."""
    if (correlation[1:] > correlation[:-1]).all():
        return correlation, np.arange(len(correlation))
    order, first = _first_of_each(correlation, ts_ns, dur_ns)
    if first.all():  # each id once (the usual case): the order is the choice
        return correlation[order], order
    chosen = order[first]
    return correlation[chosen], chosen


def _first_of_each(correlation: np.ndarray, ts_ns: np.ndarray, dur_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows ordered by id (then start, then duration where an id repeats), and which row is each id's first."""
    order = np.argsort(correlation, kind="stable")
    ids = correlation[order]
    repeated = ids[1:] == ids[:-1]
    if repeated.any():  # several events with one id (no parser writes that): the first by start, then duration
        order = np.lexsort((dur_ns, ts_ns, correlation))
        ids = correlation[order]
        repeated = ids[1:] == ids[:-1]
    first = np.concatenate([[True], ~repeated]) if len(ids) else np.empty(0, dtype=bool)
    return order, first


def shared_correlations(correlation: np.ndarray) -> np.ndarray:
    """The ids (sorted) that occur more than once in one trace's kernels: graph launches whatever the call's name.
    Held in memory and sorted; the stored analyses count them from a log (:func:`.sorted_values.repeated`), which
    holds no more than a chunk at a time."""
    return repeated([np.sort(np.asarray(correlation, dtype=np.int64))])


@dataclass(frozen=True)
class Launched:
    """Of each op, the launch call of its correlation id: whether it has one (``found``), the call's ``launch_ns``,
    ``call_ns``, whether it is a graph launch (``graph``) and the position of the call's operator among the trace's
    host events (``owner``: -1 for none; :class:`~.op_stats.Operators` knows it)."""

    found: np.ndarray
    launch_ns: np.ndarray
    call_ns: np.ndarray
    graph: np.ndarray
    owner: np.ndarray


class LaunchLookup(Protocol):
    """A trace's launch calls, by correlation id: held in memory (:class:`LaunchArrays`) or read a row group at a
    time (``warehouse/launch_table.LaunchTable``)."""

    def __len__(self) -> int:
        """How many launch calls (distinct correlation ids) there are."""

    def find(self, correlation: pl.Series) -> Launched:
        """The launch call of each correlation id (null: none)."""


class LaunchArrays:
    """One trace's launch calls in memory, by correlation id: the ids as an index (:class:`~.event_index.EventIndex`:
    an id's position is its rank; a bit per id of their span where they are dense, else a 4-byte offset),
    ``launch_ns``, ``call_ns``, whether the call is a graph launch (named like one, or its id carried by more than one
    kernel: :func:`shared_correlations`) and its operator's position (``owner``; None: no call has one)."""

    def __init__(self, keys: EventIndex, launch_ns: np.ndarray, call_ns: np.ndarray, graph: np.ndarray,
                 owner: np.ndarray | None = None) -> None:
        self.keys, self.launch_ns, self.call_ns, self.graph, self.owner = keys, launch_ns, call_ns, graph, owner

    def __len__(self) -> int:
        return int(self.keys.size)

    def find(self, correlation: pl.Series) -> Launched:
        if not self.keys.size:
            nothing = np.zeros(len(correlation), dtype=np.int64)
            return Launched(nothing > 0, nothing, nothing, nothing > 0, nothing - 1)
        at = self.keys.positions(correlation.fill_null(0).to_numpy().astype(np.int64))
        found = (at >= 0) & correlation.is_not_null().to_numpy()
        at = np.where(found, at, 0)
        owner = np.where(found, self.owner[at], -1) if self.owner is not None else \
            np.full(len(correlation), -1, dtype=np.int64)
        return Launched(found, self.launch_ns[at].astype(np.int64), self.call_ns[at].astype(np.int64),
                        self.graph[at] & found, owner)


def launch_columns(launched: Launched | None) -> list[pl.Series] | list[pl.Expr]:
    """``launch_ns``, ``call_ns`` and ``graph`` of each op: of its correlation's call, null where none (where no op
    has one, as literals, which a frame holds without a value per row)."""
    names = ("launch_ns", "call_ns", "graph")
    if launched is None or not launched.found.any():
        return [pl.lit(None, dtype=pl.Boolean if name == "graph" else pl.Int64).alias(name) for name in names]
    missing = ~launched.found
    return [pl.Series(name, pa.array(column, mask=missing, type=pa.bool_() if name == "graph" else pa.int64()))
            for name, column in zip(names, (launched.launch_ns, launched.call_ns, launched.graph), strict=True)]


#: The columns of the ops :meth:`LaunchParts.add` reads.
_LAUNCHED_COLUMNS = ("kind", "category", "stream", "ts_ns", "dur_ns", "correlation", "graph_id", "launch_ns",
                     "call_ns", "graph")


class LaunchParts:
    """Launch statistics (:data:`COLUMNS`), queues (:data:`QUEUE_COLUMNS`) and the graph launches of one
    (trace, rank), fed window by window.

    Feed every op of the rank once (in any windows, in any order) to :meth:`add`, then take
    :meth:`stats`, :meth:`queues` and :meth:`graph_kernels`: the rank's rows. What is kept per op goes into
    :class:`~.sorted_values.ValueLog` s made by ``logs`` (in memory where none is given; the warehouse's are on disk):
    the delay of each kernel launched one by one (for the exact quantiles), and each launched op's launch and end per
    stream (for the deepest queue). Besides those, 56 bytes per kernel of a graph launch (what the per-launch view
    needs) and a few sums.
    """

    def __init__(self, logs: LogFactory = MemoryLog) -> None:
        self._logs = logs
        self._delays = logs()
        self._delay_sum = self._delay_max = 0
        self._shorter = 0
        self._overhead_ns = 0
        self._streams: dict[int | None, _Stream] = {}
        self._queues: pl.DataFrame | None = None  # the streams' rows, once made (:meth:`queues`)
        self._stats: pl.DataFrame | None = None  # the rank's row, once made (:meth:`stats`)
        self._graph_kernels: list[pl.DataFrame] = []

    def add(self, ops: pl.DataFrame) -> None:
        """Add ``ops``: ``kind``, ``category``, ``stream``, ``ts_ns`` (not null), ``dur_ns``, ``correlation``,
        ``graph_id`` and, of the host call that launched each (null where none did), ``launch_ns``,
        ``call_ns`` and ``graph`` (the call is a graph launch), as :func:`launch_columns` gives them."""
        if self._queues is not None or self._stats is not None:
            raise ValueError("ops added after the queues or the statistics were made: add every op first")
        launched = ops.select(_LAUNCHED_COLUMNS).filter(pl.col("launch_ns").is_not_null())  # only these copied
        kernels = launched.filter(pl.col("kind") == "kernel")
        single = kernels.filter(~pl.col("graph").fill_null(False)).select(
            pl.max_horizontal(pl.col("ts_ns") - pl.col("launch_ns") - pl.col("call_ns"), 0).alias("delay_ns"),
            (pl.col("dur_ns") < pl.col("call_ns")).fill_null(False).alias("shorter"), "call_ns")
        delays = single["delay_ns"].to_numpy().astype(np.int64)
        if len(delays):
            self._delays.append(delays)
            self._delay_sum += int(delays.sum())
            self._delay_max = max(self._delay_max, int(delays.max()))
        shorter = single.filter(pl.col("shorter"))
        self._shorter += shorter.height
        self._overhead_ns += int(shorter["call_ns"].sum() or 0)
        graph = kernels.filter(pl.col("graph").fill_null(False))
        if graph.height:
            self._graph_kernels.append(graph.select(
                pl.col("correlation").cast(pl.Int64), pl.col("stream").cast(pl.Int64),
                pl.col("graph_id").cast(pl.Int64), pl.col("ts_ns").cast(pl.Int64),
                pl.col("dur_ns").fill_null(0).cast(pl.Int64), pl.col("launch_ns").cast(pl.Int64),
                pl.col("call_ns").cast(pl.Int64)))
        waits = launched.filter(pl.col("category") != Category.SYNC).select(
            "stream", "launch_ns", pl.max_horizontal(pl.col("ts_ns") - pl.col("launch_ns"), 0).alias("wait_ns"))
        for (stream,), part in waits.partition_by("stream", as_dict=True).items():
            key = None if stream is None else int(stream)
            if key not in self._streams:
                self._streams[key] = _Stream(self._logs(), self._logs())
            self._streams[key].add(part["launch_ns"].to_numpy(), part["wait_ns"].to_numpy())

    def graph_kernels(self) -> pl.DataFrame | None:
        """The kernels graph launches started (for :func:`tracelake.analysis.graphs.graph_rows`); None for none.

        Columns ``correlation``, ``stream``, ``graph_id``, ``ts_ns``, ``dur_ns`` (0 where missing),
        ``launch_ns``, ``call_ns``.
        """
        if not self._graph_kernels:
            return None
        self._graph_kernels = [pl.concat(self._graph_kernels)]
        return self._graph_kernels[0]

    def stats(self, trace_id: str, rank: int) -> pl.DataFrame:
        """:data:`COLUMNS` for the rank: one row, none when no kernel was launched by a host call. Made once (the
        delays' log lets them go)."""
        if self._stats is None:
            self._stats = self._stats_row()
        return self._stats.select(pl.lit(trace_id).alias("trace_id"), pl.lit(rank, dtype=pl.Int32).alias("rank"),
                                  pl.all())

    def _stats_row(self) -> pl.DataFrame:
        """:meth:`stats` but ``trace_id`` and ``rank``."""
        launches = len(self._delays)
        kernels = self.graph_kernels()
        graphs = pl.DataFrame(schema={"kernels": pl.Int64, "call_ns": pl.Int64, "delay_ns": pl.Int64}) \
            if kernels is None else kernels.group_by("correlation").agg(
                pl.len().cast(pl.Int64).alias("kernels"), pl.col("call_ns").first(),
                pl.max_horizontal(pl.col("ts_ns").min() - pl.col("launch_ns").first() - pl.col("call_ns").first(), 0)
                .alias("delay_ns"))
        if not launches and not graphs.height:
            return pl.DataFrame(schema=_ROW_SCHEMA)
        row: dict[str, object] = {
            "launches": launches, "shorter_than_launch": self._shorter,
            "shorter_than_launch_pct": 100.0 * self._shorter / launches if launches else None,
            "launch_overhead_ns": self._overhead_ns, "graph_launches": graphs.height,
            "graph_kernels": int(graphs["kernels"].sum()), "graph_launch_ns": int(graphs["call_ns"].sum()),
            "graph_mean_delay_ns": rounded(float(graphs["delay_ns"].sum()) / graphs.height) if graphs.height
            else None,
            "graph_max_delay_ns": int(graphs["delay_ns"].max()) if graphs.height else None,  # type: ignore[arg-type]
        }
        if launches:
            p50, p95 = sorted_quantiles(self._delays.sorted_chunks(), launches, (0.5, 0.95))
            row |= {"mean_delay_ns": rounded(self._delay_sum / launches), "p50_delay_ns": rounded(p50),
                    "p95_delay_ns": rounded(p95), "max_delay_ns": self._delay_max}
        return pl.DataFrame([row], schema=_ROW_SCHEMA)

    def queues(self, trace_id: str, rank: int) -> pl.DataFrame:
        """:data:`QUEUE_COLUMNS` for the rank: a row per stream with launched ops.

        Made once: each stream's launches and ends are read back sorted (their logs let them go), and the rows kept
        instead."""
        if self._queues is None:
            rows = [{"stream": stream, **kept.row()} for stream, kept in self._streams.items()]
            self._streams = {}
            self._queues = pl.DataFrame(rows, schema={"stream": pl.Int64, "launches": pl.Int64,
                                                      "max_queue": pl.Int64, "mean_queue": pl.Float64})
        return self._queues.select(
            pl.lit(trace_id).alias("trace_id"), pl.lit(rank, dtype=pl.Int32).alias("rank"), pl.all(),
        ).sort("stream", nulls_last=True)  # as SQL orders


class _Stream:
    """One stream's launched ops, for its queue: each op's launch and end (launch + wait) in logs, and sums."""

    def __init__(self, launches: ValueLog, ends: ValueLog) -> None:
        self._launches, self._ends = launches, ends
        self._waited = 0  # the integral of the depth is each op's wait, end - launch
        self._first: int | None = None  # the first launch
        self._last: int | None = None  # the last end

    def add(self, launch_ns: np.ndarray, wait_ns: np.ndarray) -> None:
        if not len(launch_ns):
            return
        end = launch_ns.astype(np.int64) + wait_ns
        self._launches.append(launch_ns)
        self._ends.append(end)
        self._waited += int(wait_ns.sum())
        first, last = int(launch_ns.min()), int(end.max())
        self._first = first if self._first is None else min(self._first, first)
        self._last = last if self._last is None else max(self._last, last)

    def row(self) -> dict[str, object]:
        """``launches``, ``max_queue`` and ``mean_queue``: its time-weighted mean between the first launch and the
        last end."""
        span = (self._last or 0) - (self._first or 0)
        return {"launches": len(self._launches),
                "max_queue": deepest_queue(self._launches.sorted_chunks(), self._ends.sorted_chunks()),
                "mean_queue": self._waited / span if span > 0 else None}


_STATS_SCHEMA = {"trace_id": pl.String, "rank": pl.Int32, "launches": pl.Int64, "mean_delay_ns": pl.Int64,
                 "p50_delay_ns": pl.Int64, "p95_delay_ns": pl.Int64, "max_delay_ns": pl.Int64,
                 "shorter_than_launch": pl.Int64, "shorter_than_launch_pct": pl.Float64,
                 "launch_overhead_ns": pl.Int64, "graph_launches": pl.Int64, "graph_kernels": pl.Int64,
                 "graph_launch_ns": pl.Int64, "graph_mean_delay_ns": pl.Int64, "graph_max_delay_ns": pl.Int64}
_ROW_SCHEMA = {name: kind for name, kind in _STATS_SCHEMA.items() if name not in ("trace_id", "rank")}
