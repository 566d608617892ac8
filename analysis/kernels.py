"""Kernel breakdown: the kernels that take the time, per rank and across ranks.

:func:`top_kernels` is a pure function over device ops (a DuckDB connection
holding a ``device_ops`` relation in, a polars frame out); :func:`top_from_stats`
gives the same ranking from one trace's stored ``kernel_stats`` rows. The tail
past ``top`` is grouped as "others", so the shares always add up to 100%. Means
and percentiles are rounded to whole nanoseconds, as ``kernel_stats`` stores them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import duckdb
import polars as pl

from .classify import Category

COLUMNS = ("name", "category", "count", "total_ns", "mean_ns", "p50_ns", "p95_ns", "max_ns", "share_pct")


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


def top_from_ops(ops: pl.DataFrame, *, top: int = 10) -> pl.DataFrame:
    """:func:`top_kernels` across ranks from device ops in memory (``name``, ``category``, ``dur_ns``).

    The same figures as the SQL (percentiles interpolated linearly, like ``quantile_cont``),
    for selections small enough to hold three columns of their device ops.
    """
    dur = pl.col("dur_ns")
    stats = ops.filter(pl.col("category") != Category.SYNC).group_by("name").agg(
        pl.col("category").first(),
        pl.len().alias("count"),
        dur.sum().alias("total_ns"),
        (dur.sum() / pl.len() + 0.5).floor().alias("mean_ns"),
        (dur.quantile(0.5, "linear") + 0.5).floor().alias("p50_ns"),
        (dur.quantile(0.95, "linear") + 0.5).floor().alias("p95_ns"),
        dur.max().alias("max_ns"),
    )
    return top_from_stats(stats, top=top)


def top_from_stats(stats: pl.DataFrame, *, top: int = 10) -> pl.DataFrame:
    """:func:`top_kernels` of one trace from its ``kernel_stats`` rows (no pass over the device ops)."""
    ranked = stats.filter(pl.col("category") != Category.SYNC).sort(
        ["total_ns", "name"], descending=[True, False]
    )
    all_ns = ranked["total_ns"].sum()
    head = ranked.head(top).select(
        "name", "category", pl.col("count").cast(pl.Int64), pl.col("total_ns").cast(pl.Int64),
        pl.col("mean_ns").cast(pl.Int64), pl.col("p50_ns").cast(pl.Int64), pl.col("p95_ns").cast(pl.Int64),
        pl.col("max_ns").cast(pl.Int64),
    )
    tail = ranked.slice(top)
    if tail.height:
        count, total, longest = tail.select(
            pl.col("count").sum(), pl.col("total_ns").sum(), pl.col("max_ns").max()
        ).row(0)
        others = pl.DataFrame(
            {"name": ["others"], "category": ["mixed"], "count": [count], "total_ns": [total],
             "mean_ns": [math.floor(total / count + 0.5)], "p50_ns": [None], "p95_ns": [None], "max_ns": [longest]},
            schema=head.schema,
        )
        head = pl.concat([head, others])
    return head.with_columns((100.0 * pl.col("total_ns") / all_ns).alias("share_pct")).select(COLUMNS)
