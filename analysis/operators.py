"""The operators that cost the most device time, over every rank: what ``analyze`` and the job report show.

docs/analyses.md, "Operators (`op_stats` table, `analysis/op_stats.py`) and MFU": ``op_stats`` rows (per trace,
rank, operator, input shapes and dtype) summed over traces and ranks per (``op``, ``input_shapes``, ``dtype``), the
``top`` by device time, then one :data:`OTHER_OPERATORS` row holding the rest, so ``share_pct`` adds up to 100 and
``device_ns`` to the selection's attributed device time (the ``(no operator)`` row included). Pure: a frame in, a
frame out.
"""

from __future__ import annotations

from typing import Any

import polars as pl

#: The ``op`` of the row holding every operator past the top ones.
OTHER_OPERATORS = "(other operators)"

#: Columns of :func:`top_operators`, in order.
COLUMNS = ("op", "input_shapes", "dtype", "kind", "count", "device_ns", "host_ns", "kernels", "flops",
           "achieved_tflops", "pct_of_roofline", "bound", "share_pct")

SCHEMA: dict[str, Any] = {
    "op": pl.String, "input_shapes": pl.String, "dtype": pl.String, "kind": pl.String, "count": pl.Int64,
    "device_ns": pl.Int64, "host_ns": pl.Int64, "kernels": pl.Int64, "flops": pl.Float64,
    "achieved_tflops": pl.Float64, "pct_of_roofline": pl.Float64, "bound": pl.String, "share_pct": pl.Float64,
}

_KEY = ("op", "input_shapes", "dtype")


def _flops_sum() -> pl.Expr:
    """Summed FLOPs, null when no row has an estimate (unknown is never 0)."""
    return pl.when(pl.col("flops").is_not_null().any()).then(pl.col("flops").sum()).otherwise(None)


def top_operators(op_stats: pl.DataFrame, *, top: int = 8) -> pl.DataFrame:
    """The ``top`` operators by device time, summed over ranks, and one :data:`OTHER_OPERATORS` row for the rest.

    Args:
        op_stats: rows of the ``op_stats`` table (any traces and ranks).
        top: how many operators to keep before the rest are summed into one row.

    Returns:
        :data:`COLUMNS`: ``count``, ``device_ns``, ``host_ns``, ``kernels`` and ``flops`` summed (``flops`` null
        without any estimate); ``achieved_tflops`` = flops / device time; ``pct_of_roofline`` the rows'
        device-time-weighted mean (exact where the ranks share a device, as their peaks are then the same);
        ``bound`` the one holding most device time; ``share_pct`` of the summed device time. The rest row has
        its counts and times but no rate, roofline or bound. Empty (with these columns) without rows.
    """
    if op_stats.is_empty():
        return pl.DataFrame(schema=SCHEMA)
    rows = op_stats.with_columns(pl.col(c).cast(pl.Int64) for c in ("count", "device_ns", "host_ns", "kernels"))
    weighted = pl.col("pct_of_roofline").is_not_null() & (pl.col("device_ns") > 0)
    grouped = rows.group_by(*_KEY).agg(
        pl.col("kind").drop_nulls().first(),
        pl.col("count").sum(), pl.col("device_ns").sum(), pl.col("host_ns").sum(), pl.col("kernels").sum(),
        _flops_sum().alias("flops"),
        pl.when(weighted.any())
        .then((pl.col("pct_of_roofline") * pl.col("device_ns")).filter(weighted).sum()
              / pl.col("device_ns").filter(weighted).sum())
        .otherwise(None).alias("pct_of_roofline"),
        pl.col("bound").sort_by("device_ns", descending=True).drop_nulls().first(),
    ).with_columns(
        pl.when(pl.col("device_ns") > 0).then(pl.col("flops") / pl.col("device_ns") / 1e3).otherwise(None)
        .alias("achieved_tflops"))
    ranked = grouped.sort(["device_ns", *_KEY], descending=[True, False, False, False], nulls_last=True)
    head = ranked.head(top).select(c for c in COLUMNS if c != "share_pct")
    tail = ranked.slice(top)
    if tail.height:
        rest = tail.select(
            pl.lit(OTHER_OPERATORS).alias("op"), pl.lit(None, pl.String).alias("input_shapes"),
            pl.lit(None, pl.String).alias("dtype"), pl.lit(None, pl.String).alias("kind"),
            pl.col("count").sum(), pl.col("device_ns").sum(), pl.col("host_ns").sum(), pl.col("kernels").sum(),
            _flops_sum().alias("flops"), pl.lit(None, pl.Float64).alias("achieved_tflops"),
            pl.lit(None, pl.Float64).alias("pct_of_roofline"), pl.lit(None, pl.String).alias("bound"))
        head = pl.concat([head, rest], how="vertical_relaxed")
    total = ranked["device_ns"].sum()
    return head.with_columns(
        (100.0 * pl.col("device_ns") / total if total else pl.lit(None, pl.Float64)).alias("share_pct")
    ).select(pl.col(c).cast(t) for c, t in SCHEMA.items())


#: The ``module`` of the row holding the modules past the top ones, and of the ops with no module.
OTHER_MODULES = "(other modules)"
NO_MODULE = "(no module)"

#: Columns of :func:`top_modules`, in order.
MODULE_COLUMNS = ("module", "count", "device_ns", "kernels", "flops", "achieved_tflops", "share_pct")


def top_modules(op_stats: pl.DataFrame, *, top: int = 8) -> pl.DataFrame:
    """The ``top`` module paths by device time (``op_stats.module``: the innermost path, so rows never overlap),
    summed over ranks, then one :data:`OTHER_MODULES` row and one :data:`NO_MODULE` row (device ops of calls with no
    module and of no operator); ``share_pct`` adds up to 100. Empty where no row has a module (no Python events)."""
    if op_stats.is_empty() or "module" not in op_stats.columns or op_stats["module"].is_null().all():
        return pl.DataFrame(schema={c: SCHEMA.get(c, pl.String) for c in MODULE_COLUMNS})
    rows = op_stats.with_columns(pl.col(c).cast(pl.Int64) for c in ("count", "device_ns", "kernels"))
    sums = (pl.col("count").sum(), pl.col("device_ns").sum(), pl.col("kernels").sum(), _flops_sum().alias("flops"))
    grouped = rows.filter(pl.col("module").is_not_null()).group_by("module").agg(*sums).sort(
        ["device_ns", "module"], descending=[True, False])
    parts = [grouped.head(top)]
    if grouped.height > top:
        parts.append(grouped.slice(top).select(pl.lit(OTHER_MODULES).alias("module"), *sums))
    unknown = rows.filter(pl.col("module").is_null())
    if unknown.height:
        parts.append(unknown.select(pl.lit(NO_MODULE).alias("module"), *sums))
    total = rows["device_ns"].sum()
    return pl.concat(parts, how="vertical_relaxed").with_columns(
        pl.when(pl.col("device_ns") > 0).then(pl.col("flops") / pl.col("device_ns") / 1e3).alias("achieved_tflops"),
        (100.0 * pl.col("device_ns") / total if total else pl.lit(None, pl.Float64)).alias("share_pct"),
    ).select(pl.col(c).cast(SCHEMA.get(c, pl.String)) for c in MODULE_COLUMNS)
