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


def last_arrivals(con: duckdb.DuckDBPyConnection, where: str, params: list[object]) -> pl.DataFrame:
    """How often each rank is the last to start a collective (by process group and seq).

    ``where`` selects the collectives (``?`` bound from ``params``), e.g. ``job = ?``.
    The last rank to arrive makes every other rank wait inside the collective.
    """
    return _last_arrivals(con, where, *params)


def _last_arrivals(con: duckdb.DuckDBPyConnection, where: str, *values: object) -> pl.DataFrame:
    return con.sql(
        f"""
        WITH c AS (
            SELECT rank, process_group, seq, ts_ns FROM collectives
            WHERE {where} AND seq IS NOT NULL AND ts_ns IS NOT NULL
        ), inst AS (
            SELECT process_group, seq, max(ts_ns) AS last_ns, min(ts_ns) AS first_ns, count(*) AS ranks
            FROM c GROUP BY ALL HAVING count(*) > 1
        )
        SELECT c.rank, count(*) AS times_last,
               (SELECT count(*) FROM inst) AS collectives,
               round(avg(inst.last_ns - inst.first_ns) / 1e3, 1) AS mean_skew_us
        FROM c JOIN inst USING (process_group, seq)
        WHERE c.ts_ns = inst.last_ns
        GROUP BY c.rank ORDER BY times_last DESC, c.rank
        """,
        params=list(values),
    ).pl()
