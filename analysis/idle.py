"""Idle time between consecutive ops on one stream, by cause (ANALYSES.md, "Idle time breakdown").

For each gap on a stream (the next op starts after the previous one ended):
``host_wait`` when the runtime call that launched the next op started after the
previous op had ended (the CPU was late), else ``kernel_wait`` when the gap is at
most ``kernel_wait_ns`` (back-to-back launch gaps), else ``other``.
"""

from __future__ import annotations

from collections.abc import Sequence

import duckdb
import polars as pl

#: Gaps up to this long, with the launch already issued, are launch-to-launch gaps.
KERNEL_WAIT_NS = 30_000

COLUMNS = ("trace_id", "rank", "stream", "ops", "op_ns", "gaps", "idle_ns", "host_wait_ns", "kernel_wait_ns",
           "other_ns")


def idle_sql(device_ops: str, host_ops: str, where: str = "TRUE", kernel_wait_ns: int = KERNEL_WAIT_NS) -> str:
    """SQL for the idle breakdown per (trace, rank, stream) of ``device_ops`` filtered by ``where``."""
    return f"""
    WITH ops AS (
        SELECT d.trace_id, d.rank, d.stream, d.ts_ns, d.ts_ns + d.dur_ns AS end_ns, r.ts_ns AS launch_ns
        FROM {device_ops} d
        LEFT JOIN (
            SELECT trace_id, correlation, min(ts_ns) AS ts_ns FROM {host_ops}
            WHERE correlation IS NOT NULL GROUP BY ALL
        ) r ON r.trace_id = d.trace_id AND r.correlation = d.correlation
        WHERE d.category <> 'sync' AND ({where})
    ), gaps AS (
        SELECT trace_id, rank, stream, ts_ns, launch_ns,
               max(end_ns) OVER (PARTITION BY trace_id, rank, stream ORDER BY ts_ns, end_ns
                                 ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
        FROM ops
    ), classified AS (
        SELECT trace_id, rank, stream, ts_ns - prev_end AS gap,
               CASE WHEN launch_ns IS NOT NULL AND launch_ns > prev_end THEN 'host_wait'
                    WHEN ts_ns - prev_end <= {int(kernel_wait_ns)} THEN 'kernel_wait'
                    ELSE 'other' END AS cause
        FROM gaps WHERE prev_end IS NOT NULL AND ts_ns > prev_end
    ), streams AS (
        SELECT trace_id, rank, stream, count(*) AS ops, CAST(sum(end_ns - ts_ns) AS BIGINT) AS op_ns
        FROM ops GROUP BY ALL
    )
    SELECT s.trace_id, s.rank, s.stream, any_value(s.ops) AS ops, any_value(s.op_ns) AS op_ns, count(c.gap) AS gaps,
           CAST(coalesce(sum(c.gap), 0) AS BIGINT) AS idle_ns,
           CAST(coalesce(sum(c.gap) FILTER (WHERE cause = 'host_wait'), 0) AS BIGINT) AS host_wait_ns,
           CAST(coalesce(sum(c.gap) FILTER (WHERE cause = 'kernel_wait'), 0) AS BIGINT) AS kernel_wait_ns,
           CAST(coalesce(sum(c.gap) FILTER (WHERE cause = 'other'), 0) AS BIGINT) AS other_ns
    FROM streams s LEFT JOIN classified c USING (trace_id, rank, stream)
    GROUP BY ALL ORDER BY s.trace_id, s.rank, s.stream
    """


def idle_breakdown(
    con: duckdb.DuckDBPyConnection,
    *,
    where: str = "TRUE",
    params: Sequence[object] | None = None,
    device_ops: str = "device_ops",
    host_ops: str = "host_ops",
    kernel_wait_ns: int = KERNEL_WAIT_NS,
) -> pl.DataFrame:
    """Idle time per (trace, rank, stream), split into host_wait / kernel_wait / other.

    ``where`` filters device ops (columns prefixed ``d.``, e.g. ``d.job = ?``).
    """
    return con.sql(idle_sql(device_ops, host_ops, where, kernel_wait_ns), params=list(params or [])).pl()


def idle_frame(ops: pl.DataFrame, launches: pl.DataFrame | None = None,
               kernel_wait_ns: int = KERNEL_WAIT_NS) -> pl.DataFrame:
    """:func:`idle_sql`'s rows from frames, in polars (what ingest stores; a test keeps the two equal).

    ``ops``: device ops (``trace_id``, ``rank``, ``stream``, ``category``, ``ts_ns``,
    ``dur_ns``, ``correlation``); ``launches``: the first host event per (``trace_id``,
    ``correlation``) as ``launch_ns``.
    """
    keys = ["trace_id", "rank", "stream"]
    work = ops.filter(pl.col("category") != "sync").select(
        *keys, "ts_ns", (pl.col("ts_ns") + pl.col("dur_ns")).alias("end_ns"), "correlation")
    if launches is not None and launches.height:
        work = work.join(launches, on=["trace_id", "correlation"], how="left")
    else:
        work = work.with_columns(pl.lit(None, dtype=pl.Int64).alias("launch_ns"))
    work = work.sort([*keys, "ts_ns", "end_ns"]).with_columns(
        pl.col("end_ns").cum_max().shift(1).over(keys).alias("prev_end"))
    gap = pl.col("ts_ns") - pl.col("prev_end")
    is_gap = pl.col("prev_end").is_not_null() & (pl.col("ts_ns") > pl.col("prev_end"))
    cause = (pl.when(pl.col("launch_ns").is_not_null() & (pl.col("launch_ns") > pl.col("prev_end"))).then(0)
             .when(gap <= kernel_wait_ns).then(1).otherwise(2))
    return work.group_by(keys).agg(
        pl.len().cast(pl.Int64).alias("ops"),
        (pl.col("end_ns") - pl.col("ts_ns")).sum().cast(pl.Int64).alias("op_ns"),
        is_gap.sum().cast(pl.Int64).alias("gaps"),
        gap.filter(is_gap).sum().cast(pl.Int64).alias("idle_ns"),
        gap.filter(is_gap & (cause == 0)).sum().cast(pl.Int64).alias("host_wait_ns"),
        gap.filter(is_gap & (cause == 1)).sum().cast(pl.Int64).alias("kernel_wait_ns"),
        gap.filter(is_gap & (cause == 2)).sum().cast(pl.Int64).alias("other_ns"),
    ).sort(keys).select(COLUMNS)
