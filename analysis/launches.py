"""Kernel launch statistics per rank (docs/analyses.md, "Launches").

Launch delay = kernel start - end of the runtime call that launched it (joined
on correlation), floored at 0. A kernel is *shorter than its launch overhead*
when it runs for less time than its runtime call took: fusing such kernels, or
capturing them in a CUDA graph, removes host time.

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

COLUMNS = (
    "trace_id", "rank", "launches", "mean_delay_ns", "p50_delay_ns", "p95_delay_ns", "max_delay_ns",
    "shorter_than_launch", "shorter_than_launch_pct", "launch_overhead_ns",
)


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
    a duration counts as instant.
    """
    return f"""
        SELECT trace_id, correlation, min(ts_ns) AS launch_ns,
               arg_min(coalesce(dur_ns, 0), (ts_ns, coalesce(dur_ns, 0))) AS call_ns
        FROM {host_ops} WHERE correlation IS NOT NULL AND ts_ns IS NOT NULL GROUP BY ALL
    """


def launch_stats_sql(device_ops: str, host_ops: str, where: str = "TRUE") -> str:
    """SQL of :func:`launch_stats`."""
    return f"""
    WITH l AS (
        SELECT d.trace_id, d.rank, d.dur_ns,
               greatest(d.ts_ns - (r.launch_ns + r.call_ns), 0) AS delay_ns, r.call_ns
        FROM {device_ops} d
        JOIN ({launch_calls_sql(host_ops)}) r ON r.trace_id = d.trace_id AND r.correlation = d.correlation
        WHERE d.kind = 'kernel' AND d.correlation IS NOT NULL AND d.ts_ns IS NOT NULL AND ({where})
    )
    SELECT trace_id, rank, count(*) AS launches,
           round(avg(delay_ns)) AS mean_delay_ns,
           round(quantile_cont(delay_ns, 0.5)) AS p50_delay_ns,
           round(quantile_cont(delay_ns, 0.95)) AS p95_delay_ns,
           max(delay_ns) AS max_delay_ns,
           count(*) FILTER (WHERE dur_ns < call_ns) AS shorter_than_launch,
           100.0 * count(*) FILTER (WHERE dur_ns < call_ns) / count(*) AS shorter_than_launch_pct,
           CAST(coalesce(sum(call_ns) FILTER (WHERE dur_ns < call_ns), 0) AS BIGINT) AS launch_overhead_ns
    FROM l GROUP BY ALL ORDER BY trace_id, rank
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
        WHERE d.correlation IS NOT NULL AND d.ts_ns IS NOT NULL AND d.category <> 'sync' AND ({where})
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


def launch_calls(correlation: np.ndarray, ts_ns: np.ndarray, dur_ns: np.ndarray) -> tuple[np.ndarray, ...]:
    """:func:`launch_calls_sql` in numpy, for one trace's host events that carry a correlation and a start.

    Args:
        correlation, ts_ns, dur_ns: int64 arrays, one item per host event (a missing duration as 0).

    Returns:
        The distinct correlation ids, sorted, with the ``launch_ns`` and ``call_ns`` of each one's call.
    """
    if (correlation[1:] > correlation[:-1]).all():  # distinct and in order already: nothing to sort
        return correlation, ts_ns, dur_ns
    order = np.argsort(correlation, kind="stable")
    ids = correlation[order]
    repeated = ids[1:] == ids[:-1]
    if repeated.any():  # several events with one id (no parser writes that): the first by start, then duration
        order = np.lexsort((dur_ns, ts_ns, correlation))
        ids = correlation[order]
        repeated = ids[1:] == ids[:-1]
    first = np.concatenate([[True], ~repeated]) if len(ids) else np.empty(0, dtype=bool)
    chosen = order[first]
    return ids[first], ts_ns[chosen], dur_ns[chosen]


class LaunchParts:
    """:func:`launch_stats` and :func:`queue_lengths` of one (trace, rank), fed its ops window by window.

    Feed every op of the rank once (in any windows, in any order) to :meth:`add`, then take
    :meth:`stats` and :meth:`queues`: the rows the SQL gives for that rank. What is kept is 8
    bytes per launched kernel (its delay, for the exact quantiles) and 24 per launched op
    (stream, launch, end of its wait), far less than the ops and the joined host calls.
    """

    def __init__(self) -> None:
        self._delays: list[np.ndarray] = []
        self._shorter = 0
        self._overhead_ns = 0
        self._waits: list[pl.DataFrame] = []

    def add(self, ops: pl.DataFrame) -> None:
        """Add ``ops``: ``kind``, ``category``, ``stream``, ``ts_ns`` (not null), ``dur_ns`` and ``launch_ns``,
        ``call_ns`` of the host call that launched each (null where none did)."""
        launched = ops.filter(pl.col("launch_ns").is_not_null())
        kernels = launched.filter(pl.col("kind") == "kernel").select(
            pl.max_horizontal(pl.col("ts_ns") - pl.col("launch_ns") - pl.col("call_ns"), 0).alias("delay_ns"),
            (pl.col("dur_ns") < pl.col("call_ns")).fill_null(False).alias("shorter"), "call_ns")
        self._delays.append(kernels["delay_ns"].to_numpy().astype(np.int64))
        shorter = kernels.filter(pl.col("shorter"))
        self._shorter += shorter.height
        self._overhead_ns += int(shorter["call_ns"].sum() or 0)
        self._waits.append(launched.filter(pl.col("category") != "sync").select(
            "stream", "launch_ns", pl.max_horizontal("ts_ns", "launch_ns").alias("end_ns")))

    def stats(self, trace_id: str, rank: int) -> pl.DataFrame:
        """:data:`COLUMNS` for the rank: one row, none when no kernel was launched by a host call."""
        delays = np.concatenate(self._delays) if self._delays else np.empty(0, np.int64)
        if not len(delays):
            return pl.DataFrame(schema=_STATS_SCHEMA)
        p50, p95 = _quantile_cont(delays, 0.5), _quantile_cont(delays, 0.95)
        row = {
            "trace_id": trace_id, "rank": rank, "launches": len(delays),
            "mean_delay_ns": _rounded(int(delays.sum()) / len(delays)), "p50_delay_ns": _rounded(p50),
            "p95_delay_ns": _rounded(p95), "max_delay_ns": int(delays.max()), "shorter_than_launch": self._shorter,
            "shorter_than_launch_pct": 100.0 * self._shorter / len(delays), "launch_overhead_ns": self._overhead_ns,
        }
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
                 "launch_overhead_ns": pl.Int64}


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
