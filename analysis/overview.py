"""First-look figures per rank, used by ``tracelake demo`` and quick checks.

Pure functions: a DuckDB connection holding the warehouse views in, a polars
frame out. Sums here are plain sums of op durations per category; the
overlap-aware breakdown (unions, exposed communication) lives in the breakdown
analysis.
"""

from __future__ import annotations

import duckdb
import polars as pl


def rank_summary(con: duckdb.DuckDBPyConnection, job: str) -> pl.DataFrame:
    """Per rank of ``job``: steps, device ops, op time per category (ms) and mean step time (ms)."""
    return con.sql(
        """
        WITH ops AS (
            SELECT trace_id, rank,
                   count(*) AS device_ops,
                   sum(dur_ns) FILTER (WHERE category = 'compute') / 1e6 AS compute_ms,
                   sum(dur_ns) FILTER (WHERE category = 'communication') / 1e6 AS communication_ms,
                   sum(dur_ns) FILTER (WHERE category = 'memory') / 1e6 AS memory_ms
            FROM device_ops WHERE job = ? GROUP BY ALL
        ), st AS (
            SELECT trace_id, count(*) AS steps, avg(dur_ns) / 1e6 AS mean_step_ms
            FROM steps WHERE job = ? GROUP BY ALL
        )
        SELECT t.rank, coalesce(st.steps, 0) AS steps, coalesce(ops.device_ops, 0) AS device_ops,
               round(coalesce(ops.compute_ms, 0), 3) AS compute_ms,
               round(coalesce(ops.communication_ms, 0), 3) AS comm_ms,
               round(coalesce(ops.memory_ms, 0), 3) AS memory_ms, round(st.mean_step_ms, 3) AS step_ms
        FROM traces t LEFT JOIN ops USING (trace_id) LEFT JOIN st USING (trace_id)
        WHERE t.job = ?
        ORDER BY t.rank
        """,
        params=[job, job, job],
    ).pl()
