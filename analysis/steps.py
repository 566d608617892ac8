"""Step statistics per rank and step-to-step outliers (docs/analyses.md, "Steps").

Step time is the ``ProfilerStep#N`` span on the CPU (what the training loop sees).
A step is an outlier when it is more than ``threshold`` robust standard
deviations above its rank's median (median absolute deviation x 1.4826), and at
least 10% longer than the median, so that a perfectly steady rank flags nothing.

The first profiled step of each (trace, rank) is a warm-up more often than not (compilation,
autotuning, allocator and cache warm-up): it is left out of the median and spread the others are
judged by, and when it is slow it comes back flagged ``warmup`` rather than as an outlier.

Both functions take rows of the ``steps`` table (at least ``trace_id``, ``rank``,
``step``, ``dur_ns``); quantiles interpolate linearly, like DuckDB's ``quantile_cont``.
"""

from __future__ import annotations

import polars as pl

STAT_COLUMNS = ("trace_id", "rank", "steps", "mean_ns", "p50_ns", "p95_ns", "max_ns", "cv")
OUTLIER_COLUMNS = ("trace_id", "rank", "step", "dur_ns", "p50_ns", "excess_ns", "robust_z", "warmup")
#: Below this many steps on a rank, the first is judged like the others (too few to set it apart).
WARMUP_MIN_STEPS = 3
_KEY = ("trace_id", "rank")


def step_stats(steps: pl.DataFrame) -> pl.DataFrame:
    """Mean, p50, p95, max and coefficient of variation of step time, per (trace, rank)."""
    dur = pl.col("dur_ns")
    return (
        steps.group_by(_KEY)
        .agg(
            pl.len().cast(pl.Int64).alias("steps"),
            dur.mean().alias("mean_ns"),
            dur.quantile(0.5, interpolation="linear").alias("p50_ns"),
            dur.quantile(0.95, interpolation="linear").alias("p95_ns"),
            dur.max().alias("max_ns"),
            pl.when((pl.len() > 1) & (dur.mean() > 0)).then(dur.std(ddof=1) / dur.mean()).alias("cv"),
        )
        .sort(_KEY)
        .select(STAT_COLUMNS)
    )


def step_outliers(steps: pl.DataFrame, *, threshold: float = 3.0) -> pl.DataFrame:
    """Steps much longer than their rank's median step, longest excess first.

    The median and the spread leave out each rank's first step (when it has at least
    :data:`WARMUP_MIN_STEPS`); a slow first step is returned with ``warmup`` true: a warm-up,
    not an outlier (docs/analyses.md, "Steps").
    """
    dur, med = pl.col("dur_ns"), pl.col("p50_ns")
    first = (pl.col("step") == pl.col("step").min().over(_KEY)) & (pl.len().over(_KEY) >= WARMUP_MIN_STEPS)
    marked = steps.select(*_KEY, "step", "dur_ns").with_columns(first.alias("warmup"))
    steady = pl.when(~pl.col("warmup")).then(dur)
    with_median = marked.with_columns(steady.quantile(0.5, interpolation="linear").over(_KEY).alias("p50_ns"))
    scaled = with_median.with_columns(
        (pl.when(~pl.col("warmup")).then((dur - med).abs()).quantile(0.5, interpolation="linear").over(_KEY)
         * 1.4826).alias("scale"),
        (dur - med).alias("excess_ns"),
    )
    scale = pl.col("scale")
    return (
        scaled.with_columns(pl.when(scale != 0).then(pl.col("excess_ns") / scale).alias("robust_z"))
        .filter((dur > 1.1 * med) & ((scale == 0) | (pl.col("excess_ns") / scale > float(threshold))))
        .sort("excess_ns", descending=True)
        .select(OUTLIER_COLUMNS)
    )
