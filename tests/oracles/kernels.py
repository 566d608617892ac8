"""Kernel statistics and the top kernels in SQL (docs/analyses.md, "Kernels"): the reference for
``analysis/kernels.py``."""

from __future__ import annotations

from collections.abc import Sequence

import duckdb
import polars as pl

from tracelake.contracts.classify import Category


#: The stored ``kernel_stats`` rows of the ``device_ops`` view.
KERNEL_STATS_SQL = f"""
    SELECT trace_id, rank, name, any_value(category) AS category, count(*) AS count, sum(dur_ns) AS total_ns,
           round(sum(dur_ns) / count(*)) AS mean_ns, round(quantile_cont(dur_ns, 0.5)) AS p50_ns,
           round(quantile_cont(dur_ns, 0.95)) AS p95_ns, max(dur_ns) AS max_ns
    FROM device_ops WHERE category <> '{Category.SYNC}' GROUP BY ALL
"""


def top_kernels(
    con: duckdb.DuckDBPyConnection,
    *,
    where: str = "TRUE",
    params: Sequence[object] | None = None,
    top: int = 10,
    device_ops: str = "device_ops",
    per_rank: bool = False,
) -> pl.DataFrame:
    """The ``top`` kernels by total time (syncs excluded), with the rest as one "others" row.

    Args:
        con: connection holding ``device_ops``.
        where: SQL filter on ``device_ops`` (with ``?`` placeholders bound from ``params``).
        top: how many kernels to list before "others".
        per_rank: one ranking per rank (adds a ``rank`` column) instead of one across ranks.
    """
    by = "rank, " if per_rank else ""
    partition = "PARTITION BY rank" if per_rank else ""
    sql = f"""
    WITH k AS (
        SELECT {by} name, any_value(category) AS category, count(*) AS count, sum(dur_ns) AS total_ns,
               round(sum(dur_ns) / count(*)) AS mean_ns, round(quantile_cont(dur_ns, 0.5)) AS p50_ns,
               round(quantile_cont(dur_ns, 0.95)) AS p95_ns, max(dur_ns) AS max_ns
        FROM {device_ops} WHERE category <> '{Category.SYNC}' AND ({where})
        GROUP BY ALL
    ), ranked AS (
        SELECT *, row_number() OVER ({partition} ORDER BY total_ns DESC, name) AS pos,
               sum(total_ns) OVER ({partition}) AS all_ns
        FROM k
    ), keyed AS (
        SELECT *, pos <= {int(top)} AS is_top FROM ranked
    ), grouped AS (
        SELECT {by} CASE WHEN is_top THEN name ELSE 'others' END AS name,
               CASE WHEN is_top THEN any_value(category) ELSE 'mixed' END AS category,
               sum(count) AS count, sum(total_ns) AS total_ns,
               CASE WHEN is_top THEN any_value(mean_ns) ELSE round(sum(total_ns) / sum(count)) END AS mean_ns,
               CASE WHEN is_top THEN any_value(p50_ns) END AS p50_ns,
               CASE WHEN is_top THEN any_value(p95_ns) END AS p95_ns,
               max(max_ns) AS max_ns, any_value(all_ns) AS all_ns, min(pos) AS pos
        FROM keyed GROUP BY {by} is_top, CASE WHEN is_top THEN name ELSE 'others' END
    )
    SELECT {by} name, category, CAST(count AS BIGINT) AS count, CAST(total_ns AS BIGINT) AS total_ns,
           CAST(mean_ns AS BIGINT) AS mean_ns, CAST(p50_ns AS BIGINT) AS p50_ns, CAST(p95_ns AS BIGINT) AS p95_ns,
           CAST(max_ns AS BIGINT) AS max_ns,
           100.0 * total_ns / all_ns AS share_pct
    FROM grouped ORDER BY {by} pos
    """
    return con.sql(sql, params=list(params or [])).pl()

