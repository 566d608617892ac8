"""Step statistics per rank and step-to-step outliers (ANALYSES.md, "Steps").

Step time is the ``ProfilerStep#N`` span on the CPU (what the training loop sees).
A step is an outlier when it is more than ``threshold`` robust standard
deviations above its rank's median (median absolute deviation x 1.4826), and at
least 10% longer than the median, so that a perfectly steady rank flags nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import duckdb
import polars as pl

STAT_COLUMNS = ("trace_id", "rank", "steps", "mean_ns", "p50_ns", "p95_ns", "max_ns", "cv")
OUTLIER_COLUMNS = ("trace_id", "rank", "step", "dur_ns", "p50_ns", "excess_ns", "robust_z")


def step_stats(
    con: duckdb.DuckDBPyConnection, *, where: str = "TRUE", params: Sequence[object] | None = None,
    steps: str = "steps",
) -> pl.DataFrame:
    """Mean, p50, p95, max and coefficient of variation of step time, per (trace, rank)."""
    return con.sql(f"""
        SELECT trace_id, rank, count(*) AS steps, avg(dur_ns) AS mean_ns,
               quantile_cont(dur_ns, 0.5) AS p50_ns, quantile_cont(dur_ns, 0.95) AS p95_ns,
               max(dur_ns) AS max_ns,
               CASE WHEN count(*) > 1 AND avg(dur_ns) > 0 THEN stddev_samp(dur_ns) / avg(dur_ns) END AS cv
        FROM {steps} WHERE {where} GROUP BY ALL ORDER BY trace_id, rank
    """, params=list(params or [])).pl()


def step_outliers(
    con: duckdb.DuckDBPyConnection, *, where: str = "TRUE", params: Sequence[object] | None = None,
    steps: str = "steps", threshold: float = 3.0,
) -> pl.DataFrame:
    """Steps much longer than their rank's median step, longest excess first."""
    return con.sql(f"""
        WITH s AS (SELECT trace_id, rank, step, dur_ns FROM {steps} WHERE {where}),
        med AS (
            SELECT trace_id, rank, quantile_cont(dur_ns, 0.5) AS p50_ns FROM s GROUP BY ALL
        ), mad AS (
            SELECT s.trace_id, s.rank, quantile_cont(abs(s.dur_ns - med.p50_ns), 0.5) * 1.4826 AS scale
            FROM s JOIN med USING (trace_id, rank) GROUP BY ALL
        )
        SELECT s.trace_id, s.rank, s.step, s.dur_ns, med.p50_ns, s.dur_ns - med.p50_ns AS excess_ns,
               (s.dur_ns - med.p50_ns) / nullif(mad.scale, 0) AS robust_z
        FROM s JOIN med USING (trace_id, rank) JOIN mad USING (trace_id, rank)
        WHERE s.dur_ns > 1.1 * med.p50_ns
          AND (mad.scale = 0 OR (s.dur_ns - med.p50_ns) / mad.scale > {float(threshold)})
        ORDER BY excess_ns DESC
    """, params=list(params or [])).pl()
