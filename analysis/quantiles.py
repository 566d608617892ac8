"""Percentiles and rounding as DuckDB computes them, the one copy every analysis uses.

The stored figures (docs/analyses.md, "How the stored figures are computed": kernel
statistics, launch delays) are exact ``p50``/``p95`` interpolated linearly between the
values at floor and ceil of ``(n - 1) * q`` (DuckDB's ``quantile_cont``), and means and
percentiles rounded half away from zero to whole nanoseconds (DuckDB's ``round``).
"""

from __future__ import annotations

import numpy as np
import polars as pl


def quantile_cont(values: np.ndarray, q: float) -> float:
    """DuckDB's ``quantile_cont`` of ``values`` (not empty): linear between the values at floor and ceil of
    ``(n - 1) * q``, with the same arithmetic."""
    low, high, _ = cont_ranks(len(values), q)
    parted = np.partition(values, [low, high])
    return between(float(parted[low]), float(parted[high]), len(values), q)


def cont_ranks(count: int, q: float) -> tuple[int, int, float]:
    """Of ``count`` values in order, the ranks at floor and ceil of ``(count - 1) * q`` and that position."""
    position = (count - 1) * q
    return int(np.floor(position)), int(np.ceil(position)), position


def between(below: float, above: float, count: int, q: float) -> float:
    """:func:`quantile_cont` from the values at the two ranks of :func:`cont_ranks`."""
    low, _, position = cont_ranks(count, q)
    return below + (above - below) * (position - low)


def counted_quantile(q: float, value: str, upto: str, last: str) -> pl.Expr:
    """:func:`quantile_cont` as an aggregation over counted values, within a group.

    Args:
        q: the quantile, 0 to 1.
        value: the column of distinct values, sorted within the group.
        upto: the running count of values up to and including each row's.
        last: the group's count of values minus one (the same on every row).
    """
    position = pl.col(last).cast(pl.Float64) * q
    lower = pl.col(value).filter(pl.col(upto) > position.floor()).first().cast(pl.Float64)
    upper = pl.col(value).filter(pl.col(upto) > position.ceil()).first().cast(pl.Float64)
    fraction = (position - position.floor()).first()
    return lower + (upper - lower) * fraction


def rounded(value: float) -> int:
    """Half away from zero, as DuckDB's ``round`` (for the figures here, all >= 0)."""
    return int(np.floor(value + 0.5))


def rounded_expr(value: pl.Expr) -> pl.Expr:
    """:func:`rounded` as a polars expression (the result stays a float)."""
    return (value + 0.5).floor()
