"""The per-trace analyses stored at ingest, computed rank by rank in windows of time.

docs/analyses.md, "Stored at ingest" and "How the stored figures are computed": each
(trace, rank)'s device ops come in consecutive windows of start times; every analysis
adds up exactly over the windows, so memory follows the window, not the trace. This
module only feeds the analyses' accumulators (:class:`breakdown.BreakdownParts`,
:func:`idle.idle_window`, :class:`kernels.KernelStats`, :class:`launches.LaunchParts`,
:func:`graphs.graph_rows`, :class:`op_stats.OpParts`); reading the windows and writing the tables is the
warehouse's (``warehouse/derived.py``).

Operator FLOPs (docs/analyses.md, "Operators") reach the breakdown through the device ops: each op that is
the first device op of an estimated operator call carries the call's ``flops`` and ``model_flops`` where the
trace gives none of its own (XLA gives its ops' FLOPs, which stay as they are).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import polars as pl

from tracelake.contracts.classify import Category

from . import breakdown, idle
from .graphs import graph_rows
from .kernels import KernelStats
from .launches import LaunchLookup, LaunchParts, launch_columns
from .op_stats import OpParts, Operators, peak_for
from .peaks import Peaks
from .sorted_values import LogFactory, MemoryLog

@dataclass(frozen=True)
class RankRows:
    """One (trace, rank)'s rows of the derived tables (:meth:`DerivedTables.rank_rows`)."""

    breakdown: list[dict[str, object]]
    idle: list[pl.DataFrame]
    op_stats: pl.DataFrame
    kernel_stats: pl.DataFrame
    launch_stats: pl.DataFrame
    stream_queues: pl.DataFrame
    graph_launches: pl.DataFrame


#: A window of one rank's device ops: ``[low, high)`` and the ops starting in it, in start order.
Window = tuple[int, int, pl.DataFrame]


class DerivedTables:
    """Every derived table (``breakdown``, ``kernel_stats``, ``stream_idle``, ``launch_stats``, ``stream_queues``,
    ``graph_launches``, ``op_stats``) of the ranks added (:meth:`rank_rows`, then :meth:`add`).

    Args:
        calls: per trace, the host calls that launched device ops by correlation id (a
            :class:`launches.LaunchLookup`: :func:`launches.launch_calls`' choice, with ``graph`` set also where more
            than one kernel carries the id, and each call's operator), asked once per window.
        graph_calls: per trace, the name of each graph launch call, by correlation.
        async_windows: async collective spans (``trace_id``, ``rank``, ``step``, ``ts_ns``, ``dur_ns``).
        peaks: the device's peak TFLOP/s per (trace, rank), where the trace gives it (XLA); preferred.
        operators: per trace, its operator calls (:class:`op_stats.Operators`), for ``op_stats`` and FLOPs.
        hardware: per (trace, rank), the device's :class:`peaks.Peaks` from the table of known devices: the
            roofline of ``op_stats``, and the breakdown's peak (of the dtype of most model FLOPs) where ``peaks``
            has none.
        logs: makes the logs :class:`launches.LaunchParts` keeps its values per launched op in (in memory where
            none is given).
    """

    def __init__(self, calls: dict[str, LaunchLookup], graph_calls: dict[str, dict[int, str]],
                 async_windows: pl.DataFrame, peaks: dict[tuple[str, int], float],
                 operators: dict[str, Operators] | None = None,
                 hardware: dict[tuple[str, int], Peaks] | None = None, logs: LogFactory = MemoryLog) -> None:
        self._calls = calls
        self._logs = logs
        self._operators = operators or {}
        self._hardware = hardware or {}
        self._op_stats: list[pl.DataFrame] = []
        self._graph_calls = graph_calls
        self._async = async_windows
        self._peaks = peaks
        self._breakdown: list[dict[str, object]] = []
        self._idle: list[pl.DataFrame] = []
        self._stats: list[pl.DataFrame] = []
        self._launches: list[pl.DataFrame] = []
        self._queues: list[pl.DataFrame] = []
        self._graphs: list[pl.DataFrame] = []

    def rank_rows(self, trace_id: str, rank: int, windows: Iterable[Window]) -> RankRows:
        """One (trace, rank)'s rows of every derived table, from its device ops in consecutive windows of start
        times; nothing is added to the tables (:meth:`add` does), so ranks can be computed side by side, each on a
        thread of its own: this reads the shared inputs only.

        The windows run from :data:`breakdown.LOWEST` to :data:`breakdown.HIGHEST`, each op in one
        window, ops with the same start in the same one. The ops have ``trace_id``, ``rank``,
        ``stream``, ``step``, ``kind``, ``category``, ``name``, ``ts_ns`` (not null), ``dur_ns``,
        ``correlation``, ``flops``, ``graph_id`` and ``event_id``.
        """
        parts = breakdown.BreakdownParts()
        carry: dict[int, int] = {}
        counts = KernelStats()
        launched = LaunchParts(self._logs)
        operators = OpParts(self._operators.get(trace_id))
        idle_parts: list[pl.DataFrame] = []
        mine = self._async.filter((pl.col("trace_id") == trace_id) & (pl.col("rank") == rank))
        calls = self._calls.get(trace_id)
        for low, high, ops in windows:
            found = calls.find(ops["correlation"]) if calls is not None else None
            credited = operators.credit(ops, found)
            if credited is not None:  # else no call credited: the breakdown takes each op's own FLOPs as its model's
                flops, model, again = credited
                ops = ops.with_columns(pl.coalesce(pl.col("flops"), pl.lit(flops)).alias("flops"),
                                       pl.coalesce(pl.col("flops"), pl.lit(model)).alias("model_flops"),
                                       pl.when(pl.col("flops").is_null()).then(pl.lit(again))
                                       .alias("recomputed_flops"))
            parts.add(ops, mine.filter((pl.col("ts_ns") >= low) & (pl.col("ts_ns") < high)), low, high)
            ops = ops.with_columns(launch_columns(found))
            if calls is not None and len(calls):  # else no op has a launch call: nothing to add
                launched.add(ops)
            work = ops.select("trace_id", "rank", "stream", "name", "category", "ts_ns", "dur_ns", "launch_ns").filter(
                pl.col("category") != Category.SYNC)  # only the columns idle and kernel stats read are copied
            idle_parts.append(idle.idle_window(work.select(
                "trace_id", "rank", "stream", "ts_ns", (pl.col("ts_ns") + pl.col("dur_ns")).alias("end_ns"),
                "launch_ns"), carry))
            counts.add(work, without_sync=True)
        queues = launched.queues(trace_id, rank)  # first: its waits, the largest part kept, go before the rest
        hardware = self._hardware.get((trace_id, rank))
        peak = self._peaks.get((trace_id, rank))
        if peak is None and (figure := peak_for(hardware, operators.dominant_dtype(), "matmul")):
            peak = figure / 1e12
        return RankRows(breakdown=parts.rows(trace_id, rank, peak), idle=idle_parts,
                        op_stats=operators.rows(trace_id, rank, hardware),
                        kernel_stats=counts.kernel_stats(trace_id, rank),
                        launch_stats=launched.stats(trace_id, rank), stream_queues=queues,
                        graph_launches=graph_rows(launched.graph_kernels(), trace_id, rank,
                                                  self._graph_calls.get(trace_id, {})))

    def add(self, rows: RankRows) -> None:
        """Add one rank's rows (:meth:`rank_rows`); the tables keep the order ranks are added in."""
        self._breakdown.extend(rows.breakdown)
        self._idle.extend(rows.idle)
        self._op_stats.append(rows.op_stats)
        self._stats.append(rows.kernel_stats)
        self._launches.append(rows.launch_stats)
        self._queues.append(rows.stream_queues)
        self._graphs.append(rows.graph_launches)

    def tables(self) -> dict[str, pl.DataFrame | None]:
        """Each derived table's rows, by table name; None where no rank was added."""
        def joined(parts: list[pl.DataFrame]) -> pl.DataFrame | None:
            return pl.concat(parts) if parts else None

        return {"breakdown": breakdown.rows_frame(self._breakdown), "stream_idle": idle.combine_windows(self._idle),
                "kernel_stats": joined(self._stats), "launch_stats": joined(self._launches),
                "stream_queues": joined(self._queues), "graph_launches": joined(self._graphs),
                "op_stats": joined(self._op_stats)}
