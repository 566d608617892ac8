"""A kernel's time per rank in SQL over ``device_ops``: the reference for ``analysis/diff.py``'s totals from the
stored ``kernel_stats``."""

from __future__ import annotations

from collections.abc import Sequence

import duckdb
import polars as pl

from tracelake.contracts.classify import Category


def kernel_totals(con: duckdb.DuckDBPyConnection, where: str, params: Sequence[object]) -> pl.DataFrame:
    """Per kernel name: ``category`` and ``ns``, its time summed over the ops selected by ``where`` divided by the
    number of (trace, rank) pairs that ran it."""
    return con.sql(f"""
        SELECT name, any_value(category) AS category,
               sum(dur_ns) / count(DISTINCT trace_id || ':' || rank) AS ns
        FROM device_ops WHERE category <> '{Category.SYNC}' AND ({where}) GROUP BY name
    """, params=list(params)).pl()
