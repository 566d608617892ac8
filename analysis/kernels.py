"""Kernel breakdown: the kernels that take the time, per rank and across ranks (docs/analyses.md, "Kernels").

:class:`KernelStats` counts how many ops of each name took each duration, fed in any
pieces: what exact percentiles need, far smaller than the ops (ops of a name repeat with
few distinct durations). Its rows are the stored ``kernel_stats`` table (docs/analyses.md,
"How the stored figures are computed"). :func:`top_from_stats` ranks such rows; the tail
past ``top`` is grouped as "others", so the shares always add up to 100%. Means and
percentiles are rounded to whole nanoseconds (:mod:`.quantiles`), as ``kernel_stats`` stores them.
"""

from __future__ import annotations

import polars as pl

from tracelake.contracts.classify import Category

from .quantiles import counted_quantile, rounded, rounded_expr

COLUMNS = ("name", "category", "count", "total_ns", "mean_ns", "p50_ns", "p95_ns", "max_ns", "share_pct")

#: The columns of :meth:`KernelStats.add_counts`'s input: a duration and how many ops of a name took it.
_COUNTS_SCHEMA = {"name": pl.String, "category": pl.String, "dur_ns": pl.Int64, "n": pl.Int64}
#: The counts as kept between merges: texts as categorical codes, 4 bytes a row where a kernel's name as text took
#: hundreds (1.15M kernels of the Qwen shape, whose distinct durations repeat: 10 MiB of counts after 28 windows).
_KEPT_SCHEMA = _COUNTS_SCHEMA | {"name": pl.Categorical, "category": pl.Categorical}

#: Rows of counts added between merges: merging when the parts reach twice the merged size keeps it linear.
_MERGE_ROWS = 100_000


class KernelStats:
    """Count, total, mean, p50, p95 (``quantile_cont``) and max duration per kernel name, of ops fed in pieces.

    Sync ops are left out. Memory follows the distinct (name, category, duration) triples, not the ops: 24 bytes
    each, the texts kept as categorical codes.
    """

    def __init__(self) -> None:
        self._parts: list[pl.DataFrame] = []
        self._merged_rows = 0
        self._rows = 0

    def add(self, ops: pl.DataFrame, *, without_sync: bool = False) -> None:
        """Count ``ops`` (``name``, ``category``, ``dur_ns``); ``without_sync``: the caller left out the sync ops
        already (they are not filtered again)."""
        work = ops if without_sync else ops.filter(pl.col("category") != Category.SYNC)
        self._add(work.group_by("name", "category", "dur_ns").agg(pl.len().alias("n")))

    def add_counts(self, counts: pl.DataFrame) -> None:
        """Add counted durations: ``name``, ``category``, ``dur_ns`` and ``n``, how many ops of the name took it."""
        self._add(counts.filter(pl.col("category") != Category.SYNC))

    def _add(self, counts: pl.DataFrame) -> None:
        part = counts.select(pl.col(c).cast(t) for c, t in _KEPT_SCHEMA.items())
        self._parts.append(part)
        self._rows += part.height
        if self._rows > 2 * self._merged_rows + _MERGE_ROWS:
            self._parts = [self._merged()]
            self._merged_rows = self._rows = self._parts[0].height

    def _merged(self) -> pl.DataFrame:
        return pl.concat(self._parts).group_by("name", "category", "dur_ns").agg(pl.col("n").sum())

    def rows(self) -> pl.DataFrame:
        """One row per name: ``name``, ``category``, ``count``, ``total_ns``, ``mean_ns``, ``p50_ns``, ``p95_ns``,
        ``max_ns`` (the figures of ``kernel_stats``, floats where rounded), by name."""
        texts = _COUNTS_SCHEMA  # the names back from their codes, for the sort by name below
        counts = self._merged().cast(texts) if self._parts else pl.DataFrame(schema=texts)  # type: ignore[arg-type]
        values = counts.filter(pl.col("dur_ns").is_not_null()).sort("name", "dur_ns").with_columns(
            pl.col("n").cum_sum().over("name").alias("upto"), (pl.col("n").sum().over("name") - 1).alias("last"))
        per_value = values.group_by("name").agg(
            (pl.col("dur_ns") * pl.col("n")).sum().alias("total_ns"),
            rounded_expr(counted_quantile(0.5, "dur_ns", "upto", "last")).alias("p50_ns"),
            rounded_expr(counted_quantile(0.95, "dur_ns", "upto", "last")).alias("p95_ns"),
            pl.col("dur_ns").max().alias("max_ns"))
        per_name = counts.group_by("name").agg(pl.col("category").first(), pl.col("n").sum().alias("count"))
        return per_name.join(per_value, on="name", how="left").with_columns(
            rounded_expr(pl.col("total_ns") / pl.col("count")).alias("mean_ns")).sort("name")

    def kernel_stats(self, trace_id: str, rank: int) -> pl.DataFrame:
        """:meth:`rows` of one (trace, rank), with its ``trace_id`` and ``rank``: the ``kernel_stats`` rows."""
        return self.rows().with_columns(pl.lit(trace_id).alias("trace_id"), pl.lit(rank, dtype=pl.Int32).alias("rank"))


def top_from_ops(ops: pl.DataFrame, *, top: int = 10) -> pl.DataFrame:
    """The ``top`` kernels of device ops in memory (``name``, ``category``, ``dur_ns``), across ranks."""
    stats = KernelStats()
    stats.add(ops)
    return top_from_stats(stats.rows(), top=top)


def top_from_counts(counts: pl.DataFrame, *, top: int = 10) -> pl.DataFrame:
    """The ``top`` kernels from counted durations (:meth:`KernelStats.add_counts`), across ranks."""
    stats = KernelStats()
    stats.add_counts(counts)
    return top_from_stats(stats.rows(), top=top)


def top_from_stats(stats: pl.DataFrame, *, top: int = 10) -> pl.DataFrame:
    """The ``top`` kernels from ``kernel_stats`` rows (of one trace, or :meth:`KernelStats.rows`) by total time."""
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
             "mean_ns": [rounded(total / count)], "p50_ns": [None], "p95_ns": [None], "max_ns": [longest]},
            schema=head.schema,
        )
        head = pl.concat([head, others])
    return head.with_columns((100.0 * pl.col("total_ns") / all_ns).alias("share_pct")).select(COLUMNS)
