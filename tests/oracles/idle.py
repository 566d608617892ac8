"""Idle gaps by cause in SQL (docs/analyses.md, "Idle gaps by cause"): the reference for ``analysis/idle.py``."""

from __future__ import annotations

import random
from collections.abc import Sequence

import duckdb
import polars as pl

from tracelake.analysis.idle import KERNEL_WAIT_NS
from tracelake.contracts.classify import Category


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
        WHERE d.category <> '{Category.SYNC}' AND ({where})
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
    FROM streams s LEFT JOIN classified c  -- the ops of no stream number are a stream too: NULL matches NULL
        ON c.trace_id = s.trace_id AND c.rank = s.rank AND c.stream IS NOT DISTINCT FROM s.stream
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


def random_timeline(rng: random.Random, n: int, *, streams: Sequence[int | None], in_order: bool = False,
                    many: bool = False) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``n`` random device ops on ``streams`` (ties, ops of no length, sync ops, several traces and ranks where
    ``many``; starts sorted where ``in_order``) and six host launch calls: the inputs of :func:`idle_sql`."""
    starts = [rng.randint(0, 40) * 1000 for _ in range(n)]
    device = pl.DataFrame({
        "trace_id": [rng.choice(["t", "u"]) if many else "t" for _ in range(n)],
        "rank": [rng.randint(0, 2) if many else 1 for _ in range(n)],
        "stream": [rng.choice(list(streams)) for _ in range(n)],
        "category": [rng.choice(["compute", "memory", "sync"]) for _ in range(n)],
        "ts_ns": sorted(starts) if in_order else starts,
        "dur_ns": [rng.choice([0, 1000, rng.randint(1, 90) * 1000]) for _ in range(n)],
        "correlation": [rng.choice([None, *range(6)]) for _ in range(n)],
    }, schema={"trace_id": pl.String, "rank": pl.Int32, "stream": pl.Int64, "category": pl.String,
               "ts_ns": pl.Int64, "dur_ns": pl.Int64, "correlation": pl.Int64})
    host = pl.DataFrame({"trace_id": ["t"] * 6, "correlation": list(range(6)),
                         "ts_ns": [rng.randint(0, 40) * 1000 for _ in range(6)]},
                        schema={"trace_id": pl.String, "correlation": pl.Int64, "ts_ns": pl.Int64})
    return device, host
