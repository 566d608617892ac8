"""Compare two traces or jobs: what got slower, what appeared or vanished.

Both sides are normalised per rank (totals divided by the number of ranks), so
a job on 8 ranks compares with one on 4. Kernels match by name, with their totals
from the stored ``kernel_stats`` rows (docs/analyses.md, "Kernels"); categories come
from the whole-trace breakdown rows (docs/analyses.md, "Breakdown").
"""

from __future__ import annotations

import polars as pl

from tracelake.contracts.classify import Category

KERNEL_COLUMNS = ("name", "category", "a_ns", "b_ns", "delta_ns", "ratio", "change")
CATEGORY_COLUMNS = ("metric", "a_ns", "b_ns", "delta_ns", "ratio")
METRICS = ("span_ns", "busy_ns", "idle_ns", "compute_ns", "communication_ns", "exposed_communication_ns", "memory_ns")


def _kernel_totals(stats: pl.DataFrame) -> pl.DataFrame:
    """Per kernel name: its category and its time per rank, over the (trace, rank) pairs that ran it."""
    return stats.filter(pl.col("category") != Category.SYNC).group_by("name").agg(
        pl.col("category").first(),
        (pl.col("total_ns").sum() / pl.struct("trace_id", "rank").n_unique()).alias("ns"))


def kernel_diff(a: pl.DataFrame, b: pl.DataFrame) -> pl.DataFrame:
    """Per kernel: time per rank in A and B, the change, largest absolute change first.

    ``a`` and ``b`` are the ``kernel_stats`` rows (``trace_id``, ``rank``, ``name``, ``category``,
    ``total_ns``) of each side.
    """
    left = _kernel_totals(a).rename({"ns": "a_ns", "category": "a_category"})
    right = _kernel_totals(b).rename({"ns": "b_ns", "category": "b_category"})
    joined = left.join(right, on="name", how="full", coalesce=True)
    return (
        joined.with_columns(
            pl.coalesce("a_category", "b_category").alias("category"),
            pl.col("a_ns").fill_null(0.0), pl.col("b_ns").fill_null(0.0),
        )
        .with_columns(
            (pl.col("b_ns") - pl.col("a_ns")).alias("delta_ns"),
            pl.when(pl.col("a_ns") > 0).then(pl.col("b_ns") / pl.col("a_ns")).otherwise(None).alias("ratio"),
            pl.when(pl.col("a_ns") == 0).then(pl.lit("appeared"))
            .when(pl.col("b_ns") == 0).then(pl.lit("vanished"))
            .when(pl.col("b_ns") > pl.col("a_ns")).then(pl.lit("slower"))
            .when(pl.col("b_ns") < pl.col("a_ns")).then(pl.lit("faster"))
            .otherwise(pl.lit("same")).alias("change"),
        )
        .sort(pl.col("delta_ns").abs(), descending=True)
        .select(KERNEL_COLUMNS)
    )


def category_diff(a_breakdown: pl.DataFrame, b_breakdown: pl.DataFrame) -> pl.DataFrame:
    """Whole-trace breakdown metrics per rank (mean over ranks) in A and B."""
    def means(frame: pl.DataFrame) -> dict[str, float]:
        whole = frame.filter(pl.col("step").is_null()) if "step" in frame.columns else frame
        if whole.is_empty():
            return dict.fromkeys(METRICS, 0.0)
        row = whole.select(pl.col(m).cast(pl.Float64).mean() for m in METRICS).row(0, named=True)
        return {m: row[m] or 0.0 for m in METRICS}

    left, right = means(a_breakdown), means(b_breakdown)
    return pl.DataFrame({
        "metric": list(METRICS),
        "a_ns": [left[m] for m in METRICS],
        "b_ns": [right[m] for m in METRICS],
    }).with_columns(
        (pl.col("b_ns") - pl.col("a_ns")).alias("delta_ns"),
        pl.when(pl.col("a_ns") > 0).then(pl.col("b_ns") / pl.col("a_ns")).otherwise(None).alias("ratio"),
    )
