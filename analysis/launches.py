"""Kernel launch statistics per rank (ANALYSES.md, "Launches").

Launch delay = kernel start - end of the runtime call that launched it (joined
on correlation), floored at 0. A kernel is *shorter than its launch overhead*
when it runs for less time than its runtime call took: fusing such kernels, or
capturing them in a CUDA graph, removes host time.
"""

from __future__ import annotations

from collections.abc import Sequence

import duckdb
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


def launch_stats_sql(device_ops: str, host_ops: str, where: str = "TRUE") -> str:
    """SQL of :func:`launch_stats`."""
    return f"""
    WITH l AS (
        SELECT d.trace_id, d.rank, d.dur_ns,
               greatest(d.ts_ns - (r.ts_ns + r.dur_ns), 0) AS delay_ns, r.dur_ns AS call_ns
        FROM {device_ops} d
        JOIN {host_ops} r ON r.trace_id = d.trace_id AND r.correlation = d.correlation
        WHERE d.kind = 'kernel' AND d.correlation IS NOT NULL AND ({where})
    )
    SELECT trace_id, rank, count(*) AS launches,
           avg(delay_ns) AS mean_delay_ns,
           quantile_cont(delay_ns, 0.5) AS p50_delay_ns,
           quantile_cont(delay_ns, 0.95) AS p95_delay_ns,
           max(delay_ns) AS max_delay_ns,
           count(*) FILTER (WHERE dur_ns < call_ns) AS shorter_than_launch,
           100.0 * count(*) FILTER (WHERE dur_ns < call_ns) / count(*) AS shorter_than_launch_pct,
           CAST(sum(call_ns) FILTER (WHERE dur_ns < call_ns) AS BIGINT) AS launch_overhead_ns
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
        SELECT d.trace_id, d.rank, d.stream, r.ts_ns AS launch_ns, d.ts_ns AS start_ns
        FROM {device_ops} d
        JOIN {host_ops} r ON r.trace_id = d.trace_id AND r.correlation = d.correlation
        WHERE d.correlation IS NOT NULL AND d.category <> 'sync' AND ({where})
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
    SELECT trace_id, rank, stream, CAST(sum(delta) FILTER (WHERE delta > 0) AS BIGINT) AS launches,
           CAST(max(queue) AS BIGINT) AS max_queue,
           sum(queue * len) / nullif(sum(len), 0) AS mean_queue
    FROM depth GROUP BY ALL ORDER BY trace_id, rank, stream
    """
