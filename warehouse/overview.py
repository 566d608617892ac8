"""First-look listings over the catalog's views, for ``tracelake demo`` and ``tracelake traces``.

Queries over stored tables (a DuckDB connection holding the warehouse views in, a frame or
rows out), reached through the facade (:meth:`Warehouse.rank_summary`, :meth:`Warehouse.trace_listing`).
Sums here are plain sums of op durations per category; the overlap-aware breakdown (unions,
exposed communication) is :mod:`tracelake.analysis.breakdown`'s.
"""

from __future__ import annotations

import polars as pl

from tracelake.contracts.classify import Category
from tracelake.contracts.lazy import duckdb


def rank_summary(con: duckdb.DuckDBPyConnection, job: str) -> pl.DataFrame:
    """Per rank of ``job``: steps, device ops, op time per category (ms) and mean step time (ms).

    A rank is a (trace, rank) pair with device ops (an XLA trace holds one per device),
    or a trace without any.
    """
    return con.sql(
        f"""
        WITH ops AS (
            SELECT trace_id, rank,
                   count(*) AS device_ops,
                   sum(dur_ns) FILTER (WHERE category = '{Category.COMPUTE}') / 1e6 AS compute_ms,
                   sum(dur_ns) FILTER (WHERE category = '{Category.COMMUNICATION}') / 1e6 AS communication_ms,
                   sum(dur_ns) FILTER (WHERE category = '{Category.MEMORY}') / 1e6 AS memory_ms
            FROM device_ops WHERE job = $job GROUP BY ALL
        ), st AS (
            SELECT trace_id, rank, count(*) AS steps, avg(dur_ns) / 1e6 AS mean_step_ms
            FROM steps WHERE job = $job GROUP BY ALL
        ), ranks AS (
            SELECT trace_id, rank FROM ops
            UNION ALL
            SELECT trace_id, rank FROM traces WHERE job = $job AND trace_id NOT IN (SELECT trace_id FROM ops)
        )
        SELECT r.rank, coalesce(st.steps, 0) AS steps, coalesce(ops.device_ops, 0) AS device_ops,
               round(coalesce(ops.compute_ms, 0), 3) AS compute_ms,
               round(coalesce(ops.communication_ms, 0), 3) AS comm_ms,
               round(coalesce(ops.memory_ms, 0), 3) AS memory_ms, round(st.mean_step_ms, 3) AS step_ms
        FROM ranks r LEFT JOIN ops USING (trace_id, rank) LEFT JOIN st USING (trace_id, rank)
        ORDER BY r.rank, r.trace_id
        """,
        params={"job": job},
    ).pl()


#: ``tracelake traces``' columns; ``ranks`` from the stored breakdown: an XLA profile holds a rank per device
#: (docs/formats.md).
TRACE_LISTING = (
    "SELECT trace_id, job, rank, coalesce(r.ranks, [rank]) AS ranks, format, source_name, device_name, "
    "device_op_count, round((end_ns - start_ns) / 1e6, 3) AS span_ms, ingested_at FROM traces LEFT JOIN ("
    "SELECT trace_id, list(DISTINCT rank ORDER BY rank) AS ranks FROM breakdown WHERE step IS NULL "
    "GROUP BY trace_id) r USING (trace_id)"
)
