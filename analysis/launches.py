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
(:func:`launch_calls_sql`); every parser gives that id to one host event only.
The SQL functions here are the readable reference; :class:`LaunchParts` computes
the same rows from a rank's ops fed window by window, as ingest does.
"""

from __future__ import annotations

from collections.abc import Sequence

import duckdb
import numpy as np
import polars as pl

from .classify import Category

COLUMNS = (
    "trace_id", "rank", "launches", "mean_delay_ns", "p50_delay_ns", "p95_delay_ns", "max_delay_ns",
    "shorter_than_launch", "shorter_than_launch_pct", "launch_overhead_ns",
    "graph_launches", "graph_kernels", "graph_launch_ns", "graph_mean_delay_ns", "graph_max_delay_ns",
)

#: Runtime and driver calls that launch a CUDA/HIP graph (a regular expression, any suffix:
#: ``cudaGraphLaunch_v10000``, ``cudaGraphLaunch_ptsz``, ``hipGraphLaunch``, ``cuGraphLaunch``).
GRAPH_CALL = r"^(cu|cuda|hip)GraphLaunch"


def launch_stats(
    con: duckdb.DuckDBPyConnection,
    *,
    where: str = "TRUE",
    params: Sequence[object] | None = None,
    device_ops: str = "device_ops",
    host_ops: str = "host_ops",
) -> pl.DataFrame:
    """Launch delay distribution and kernels shorter than their launch, per (trace, rank).

    ``where`` filters device ops (columns prefixed ``d.``).
    """
    return con.sql(launch_stats_sql(device_ops, host_ops, where), params=list(params or [])).pl()


def launch_calls_sql(host_ops: str) -> str:
    """Per (trace, correlation), the host call that launched it: ``launch_ns`` and ``call_ns`` (its duration).

    That is the first host event with the id (by start, then the shorter); an event without
    a duration counts as instant. ``graph_call``: some event with the id is named like
    :data:`GRAPH_CALL`; ``call``: the (smallest) name of those, null when none is.
    """
    return f"""
        SELECT trace_id, correlation, min(ts_ns) AS launch_ns,
               arg_min(coalesce(dur_ns, 0), (ts_ns, coalesce(dur_ns, 0))) AS call_ns,
               coalesce(bool_or(regexp_matches(name, '{GRAPH_CALL}')), FALSE) AS graph_call,
               min(name) FILTER (WHERE regexp_matches(name, '{GRAPH_CALL}')) AS call
        FROM {host_ops} WHERE correlation IS NOT NULL AND ts_ns IS NOT NULL GROUP BY ALL
    """


def shared_correlations_sql(device_ops: str) -> str:
    """Per trace, the correlation ids more than one kernel carries: graph launches whatever the call's name."""
    return f"""
        SELECT trace_id, correlation FROM {device_ops}
        WHERE kind = 'kernel' AND correlation IS NOT NULL AND ts_ns IS NOT NULL
        GROUP BY ALL HAVING count(*) > 1
    """


def launched_kernels_sql(device_ops: str, host_ops: str, where: str = "TRUE") -> str:
    """Every kernel joined to its launch call: ``launch_ns``, ``call_ns``, ``call`` and ``in_graph``.

    ``in_graph``: the call is a graph launch (:data:`GRAPH_CALL`) or the trace has other kernels
    with the same correlation. The shared ids are counted over the whole trace, not only ``where``:
    being in a graph is a property of the launch, not of the selection.
    """
    return f"""
        SELECT d.*, r.launch_ns, r.call_ns, r.call,
               r.graph_call OR s.correlation IS NOT NULL AS in_graph
        FROM {device_ops} d
        JOIN ({launch_calls_sql(host_ops)}) r ON r.trace_id = d.trace_id AND r.correlation = d.correlation
        LEFT JOIN ({shared_correlations_sql(device_ops)}) s
          ON s.trace_id = d.trace_id AND s.correlation = d.correlation
        WHERE d.kind = 'kernel' AND d.correlation IS NOT NULL AND d.ts_ns IS NOT NULL AND ({where})
    """


def launch_stats_sql(device_ops: str, host_ops: str, where: str = "TRUE") -> str:
    """SQL of :func:`launch_stats`: kernels launched one by one, and graph launches (one row each) apart."""
    return f"""
    WITH d AS (
        SELECT trace_id, rank, correlation, ts_ns, dur_ns, call_ns, in_graph, launch_ns + call_ns AS called_ns,
               greatest(ts_ns - (launch_ns + call_ns), 0) AS delay_ns
        FROM ({launched_kernels_sql(device_ops, host_ops, where)})
    ), one AS (
        SELECT trace_id, rank, count(*) AS launches,
               round(avg(delay_ns)) AS mean_delay_ns,
               round(quantile_cont(delay_ns, 0.5)) AS p50_delay_ns,
               round(quantile_cont(delay_ns, 0.95)) AS p95_delay_ns,
               max(delay_ns) AS max_delay_ns,
               count(*) FILTER (WHERE dur_ns < call_ns) AS shorter,
               sum(call_ns) FILTER (WHERE dur_ns < call_ns) AS overhead
        FROM d WHERE NOT in_graph GROUP BY ALL
    ), g AS (
        SELECT trace_id, rank, correlation, count(*) AS kernels, any_value(call_ns) AS call_ns,
               greatest(min(ts_ns) - any_value(called_ns), 0) AS delay_ns
        FROM d WHERE in_graph GROUP BY ALL
    ), graphs AS (
        SELECT trace_id, rank, count(*) AS graph_launches, sum(kernels) AS graph_kernels,
               sum(call_ns) AS graph_launch_ns, round(avg(delay_ns)) AS graph_mean_delay_ns,
               max(delay_ns) AS graph_max_delay_ns
        FROM g GROUP BY ALL
    ), k AS (SELECT DISTINCT trace_id, rank FROM d)
    SELECT k.trace_id, k.rank, coalesce(o.launches, 0) AS launches,
           o.mean_delay_ns, o.p50_delay_ns, o.p95_delay_ns, o.max_delay_ns,
           coalesce(o.shorter, 0) AS shorter_than_launch,
           100.0 * o.shorter / nullif(o.launches, 0) AS shorter_than_launch_pct,
           CAST(coalesce(o.overhead, 0) AS BIGINT) AS launch_overhead_ns,
           coalesce(g.graph_launches, 0) AS graph_launches, coalesce(g.graph_kernels, 0) AS graph_kernels,
           CAST(coalesce(g.graph_launch_ns, 0) AS BIGINT) AS graph_launch_ns,
           g.graph_mean_delay_ns, g.graph_max_delay_ns
    FROM k
    LEFT JOIN one o ON o.trace_id IS NOT DISTINCT FROM k.trace_id AND o.rank IS NOT DISTINCT FROM k.rank
    LEFT JOIN graphs g ON g.trace_id IS NOT DISTINCT FROM k.trace_id AND g.rank IS NOT DISTINCT FROM k.rank
    ORDER BY k.trace_id, k.rank
    """


QUEUE_COLUMNS = ("trace_id", "rank", "stream", "launches", "max_queue", "mean_queue")


def queue_lengths(
    con: duckdb.DuckDBPyConnection,
    *,
    where: str = "TRUE",
    params: Sequence[object] | None = None,
    device_ops: str = "device_ops",
    host_ops: str = "host_ops",
) -> pl.DataFrame:
    """Launch queue depth per stream: +1 when a runtime call launches an op, -1 when the op starts.

    ``max_queue`` is the deepest the queue got; ``mean_queue`` its time-weighted mean
    between the first launch and the last start. A queue that stays near zero means the
    device waits for the host; a deep one means the host runs ahead (good).
    """
    return con.sql(queue_lengths_sql(device_ops, host_ops, where), params=list(params or [])).pl()


def queue_lengths_sql(device_ops: str, host_ops: str, where: str = "TRUE") -> str:
    """SQL of :func:`queue_lengths`."""
    return f"""
    WITH l AS (
        SELECT d.trace_id, d.rank, d.stream, r.launch_ns, d.ts_ns AS start_ns
        FROM {device_ops} d
        JOIN ({launch_calls_sql(host_ops)}) r ON r.trace_id = d.trace_id AND r.correlation = d.correlation
        WHERE d.correlation IS NOT NULL AND d.ts_ns IS NOT NULL AND d.category <> '{Category.SYNC}' AND ({where})
    ), points AS (
        SELECT trace_id, rank, stream, launch_ns AS t, 1 AS delta FROM l
        UNION ALL
        SELECT trace_id, rank, stream, greatest(start_ns, launch_ns), -1 FROM l
    ), summed AS (
        SELECT trace_id, rank, stream, t, sum(delta) AS delta FROM points GROUP BY ALL
    ), depth AS (
        SELECT *, sum(delta) OVER w AS queue,
               lead(t) OVER (PARTITION BY trace_id, rank, stream ORDER BY t) - t AS len
        FROM summed
        WINDOW w AS (PARTITION BY trace_id, rank, stream ORDER BY t ROWS UNBOUNDED PRECEDING)
    )
    SELECT q.trace_id, q.rank, q.stream, n.launches, q.max_queue, q.mean_queue
    FROM (
        SELECT trace_id, rank, stream, CAST(max(queue) AS BIGINT) AS max_queue,
               sum(queue * len) / nullif(sum(len), 0) AS mean_queue
        FROM depth GROUP BY ALL
    ) q JOIN (SELECT trace_id, rank, stream, count(*) AS launches FROM l GROUP BY ALL) n
      ON n.trace_id IS NOT DISTINCT FROM q.trace_id AND n.rank IS NOT DISTINCT FROM q.rank
     AND n.stream IS NOT DISTINCT FROM q.stream
    ORDER BY q.trace_id, q.rank, q.stream
    """


def launch_calls(
    correlation: np.ndarray, ts_ns: np.ndarray, dur_ns: np.ndarray, graph_call: np.ndarray | None = None,
) -> tuple[np.ndarray, ...]:
    """:func:`launch_calls_sql` in numpy, for one trace's host events that carry a correlation and a start.

    Args:
        correlation, ts_ns, dur_ns: int64 arrays, one item per host event (a missing duration as 0).
        graph_call: bool array, whether each event is named like :data:`GRAPH_CALL` (none: no event is).

    Returns:
        The distinct correlation ids, sorted, with the ``launch_ns`` and ``call_ns`` of each one's call
        and whether some event with the id is a graph launch call.
    """
    flags = np.zeros(len(correlation), dtype=bool) if graph_call is None else graph_call.astype(bool)
    if (correlation[1:] > correlation[:-1]).all():  # distinct and in order already: nothing to sort
        return correlation, ts_ns, dur_ns, flags
    order = np.argsort(correlation, kind="stable")
    ids = correlation[order]
    repeated = ids[1:] == ids[:-1]
    if repeated.any():  # several events with one id (no parser writes that): the first by start, then duration
        order = np.lexsort((dur_ns, ts_ns, correlation))
        ids = correlation[order]
        repeated = ids[1:] == ids[:-1]
    first = np.concatenate([[True], ~repeated]) if len(ids) else np.empty(0, dtype=bool)
    chosen = order[first]
    # any event of the id a graph call: OR over each run of equal ids
    graph = np.logical_or.reduceat(flags[order], np.flatnonzero(first)) if len(ids) else flags[:0]
    return ids[first], ts_ns[chosen], dur_ns[chosen], graph


def shared_correlations(correlation: np.ndarray) -> np.ndarray:
    """:func:`shared_correlations_sql` in numpy: the ids (sorted) that occur more than once in one trace's kernels."""
    ids, counts = np.unique(correlation, return_counts=True)
    return ids[counts > 1]


class LaunchParts:
    """:func:`launch_stats`, :func:`queue_lengths` and the graph launches of one (trace, rank), fed window by window.

    Feed every op of the rank once (in any windows, in any order) to :meth:`add`, then take
    :meth:`stats`, :meth:`queues` and :meth:`graph_kernels`: the rows the SQL gives for that rank. What
    is kept is 8 bytes per kernel launched one by one (its delay, for the exact quantiles), 24 per
    launched op (stream, launch, end of its wait) and 56 per kernel of a graph launch (what the
    per-launch view needs), far less than the ops and the joined host calls.
    """

    def __init__(self) -> None:
        self._delays: list[np.ndarray] = []
        self._shorter = 0
        self._overhead_ns = 0
        self._waits: list[pl.DataFrame] = []
        self._graph_kernels: list[pl.DataFrame] = []

    def add(self, ops: pl.DataFrame) -> None:
        """Add ``ops``: ``kind``, ``category``, ``stream``, ``ts_ns`` (not null), ``dur_ns``, ``correlation``,
        ``graph_id`` and, of the host call that launched each (null where none did), ``launch_ns``,
        ``call_ns`` and ``graph`` (the call is a graph launch: :func:`launched_kernels_sql`'s ``in_graph``)."""
        launched = ops.filter(pl.col("launch_ns").is_not_null())
        kernels = launched.filter(pl.col("kind") == "kernel")
        single = kernels.filter(~pl.col("graph").fill_null(False)).select(
            pl.max_horizontal(pl.col("ts_ns") - pl.col("launch_ns") - pl.col("call_ns"), 0).alias("delay_ns"),
            (pl.col("dur_ns") < pl.col("call_ns")).fill_null(False).alias("shorter"), "call_ns")
        self._delays.append(single["delay_ns"].to_numpy().astype(np.int64))
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
        self._waits.append(launched.filter(pl.col("category") != Category.SYNC).select(
            "stream", "launch_ns", pl.max_horizontal("ts_ns", "launch_ns").alias("end_ns")))

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
        """:data:`COLUMNS` for the rank: one row, none when no kernel was launched by a host call."""
        delays = np.concatenate(self._delays) if self._delays else np.empty(0, np.int64)
        kernels = self.graph_kernels()
        graphs = pl.DataFrame(schema={"kernels": pl.Int64, "call_ns": pl.Int64, "delay_ns": pl.Int64}) \
            if kernels is None else kernels.group_by("correlation").agg(
                pl.len().cast(pl.Int64).alias("kernels"), pl.col("call_ns").first(),
                pl.max_horizontal(pl.col("ts_ns").min() - pl.col("launch_ns").first() - pl.col("call_ns").first(), 0)
                .alias("delay_ns"))
        if not len(delays) and not graphs.height:
            return pl.DataFrame(schema=_STATS_SCHEMA)
        row: dict[str, object] = {
            "trace_id": trace_id, "rank": rank, "launches": len(delays), "shorter_than_launch": self._shorter,
            "shorter_than_launch_pct": 100.0 * self._shorter / len(delays) if len(delays) else None,
            "launch_overhead_ns": self._overhead_ns, "graph_launches": graphs.height,
            "graph_kernels": int(graphs["kernels"].sum()), "graph_launch_ns": int(graphs["call_ns"].sum()),
            "graph_mean_delay_ns": _rounded(float(graphs["delay_ns"].sum()) / graphs.height) if graphs.height
            else None,
            "graph_max_delay_ns": int(graphs["delay_ns"].max()) if graphs.height else None,  # type: ignore[arg-type]
        }
        if len(delays):
            row |= {"mean_delay_ns": _rounded(int(delays.sum()) / len(delays)),
                    "p50_delay_ns": _rounded(_quantile_cont(delays, 0.5)),
                    "p95_delay_ns": _rounded(_quantile_cont(delays, 0.95)), "max_delay_ns": int(delays.max())}
        return pl.DataFrame([row], schema=_STATS_SCHEMA)

    def queues(self, trace_id: str, rank: int) -> pl.DataFrame:
        """:data:`QUEUE_COLUMNS` for the rank: a row per stream with launched ops."""
        waits = pl.concat(self._waits) if self._waits else pl.DataFrame(
            schema={"stream": pl.Int64, "launch_ns": pl.Int64, "end_ns": pl.Int64})
        self._waits = [waits]
        rows = []
        for (stream,), one in waits.partition_by("stream", as_dict=True).items():
            launch, end = one["launch_ns"].to_numpy(), one["end_ns"].to_numpy()
            span = int(end.max()) - int(launch.min())
            rows.append({"stream": stream, "launches": len(launch), "max_queue": _deepest(launch, end),
                         # the integral of the depth is each op's wait, end - launch
                         "mean_queue": int((end - launch).sum()) / span if span > 0 else None})
        return pl.DataFrame(rows, schema={"stream": pl.Int64, "launches": pl.Int64, "max_queue": pl.Int64,
                                          "mean_queue": pl.Float64}).select(
            pl.lit(trace_id).alias("trace_id"), pl.lit(rank, dtype=pl.Int32).alias("rank"), pl.all(),
        ).sort("stream", nulls_last=True)  # as SQL orders


def _deepest(launch: np.ndarray, end: np.ndarray) -> int:
    """The deepest queue: the most ops launched by some time and not yet started (or launched) at it.

    The depth only grows at launches, so its maximum is at one: there it is the launches up to
    then minus the ends up to then, changes at the same time all counted.
    """
    launch, end = np.sort(launch), np.sort(end)
    return int((np.searchsorted(launch, launch, side="right") - np.searchsorted(end, launch, side="right")).max())


_STATS_SCHEMA = {"trace_id": pl.String, "rank": pl.Int32, "launches": pl.Int64, "mean_delay_ns": pl.Int64,
                 "p50_delay_ns": pl.Int64, "p95_delay_ns": pl.Int64, "max_delay_ns": pl.Int64,
                 "shorter_than_launch": pl.Int64, "shorter_than_launch_pct": pl.Float64,
                 "launch_overhead_ns": pl.Int64, "graph_launches": pl.Int64, "graph_kernels": pl.Int64,
                 "graph_launch_ns": pl.Int64, "graph_mean_delay_ns": pl.Int64, "graph_max_delay_ns": pl.Int64}


def _quantile_cont(values: np.ndarray, q: float) -> float:
    """DuckDB's ``quantile_cont``: linear between the values at floor and ceil of ``(n - 1) * q``, same arithmetic."""
    position = (len(values) - 1) * q
    low, high = int(np.floor(position)), int(np.ceil(position))
    parted = np.partition(values, [low, high])
    below, above = float(parted[low]), float(parted[high])
    return below + (above - below) * (position - low)


def _rounded(value: float) -> int:
    """Half away from zero, as DuckDB's round() (delays are >= 0)."""
    return int(np.floor(value + 0.5))
