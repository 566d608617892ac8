"""Derived tables: analysis results materialised next to each trace's parsed tables.

The analyses are pure SQL/polars functions in :mod:`tracelake.analysis`; this
module only feeds them a trace's files and writes their results, so the SQL
shell, the API and fleet reports read them without recomputing.
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from tracelake.analysis.breakdown import breakdown_sql

from . import schema
from .schema import sql_literal



def write_derived(device_ops: Path, out_dir: Path, *, threads: int = 2, memory_limit: str = "256MB") -> None:
    """Compute every derived table of one trace from its ``device_ops`` file into ``out_dir``.

    Writes ``<table>.parquet`` for each table in :data:`schema.DERIVED_TABLES`.
    """
    con = duckdb.connect(config={"threads": threads, "memory_limit": memory_limit})
    try:
        ops = f"read_parquet({sql_literal(str(device_ops))})"
        tbl = schema.BREAKDOWN
        select = schema.select_list(tbl, {c: c for c in tbl.column_names})
        out = sql_literal(str(out_dir / "breakdown.parquet"))
        con.execute(f"COPY (SELECT {select} FROM ({breakdown_sql(ops)})) TO {out} (FORMAT parquet, COMPRESSION zstd)")
    finally:
        con.close()
