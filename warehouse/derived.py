"""Derived tables: analysis results materialised next to each trace's parsed tables.

The analyses are pure SQL/polars functions in :mod:`tracelake.analysis`; this
module only feeds them a trace's files and writes their results, so the SQL
shell, the API and fleet reports read them without recomputing.
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from tracelake.analysis.breakdown import breakdown_sql
from tracelake.analysis.idle import idle_sql
from tracelake.analysis.launches import launch_stats_sql, queue_lengths_sql

from . import schema
from .schema import sql_literal


#: The parsed tables the derived ones are computed from.
INPUTS = ("device_ops", "host_ops", "collectives", "devices")


def write_derived(parsed: Path, out_dir: Path, *, threads: int = 2, memory_limit: str = "200MB") -> None:
    """Compute every derived table of one trace from its parsed tables in ``parsed`` into ``out_dir``.

    ``parsed`` holds ``<table>.parquet`` for each table in :data:`INPUTS` (a staging
    directory, or a folder of links to a stored trace's files); writes
    ``<table>.parquet`` for each table in :data:`schema.DERIVED_TABLES`.
    """
    con = duckdb.connect(config={"threads": threads, "memory_limit": memory_limit})
    try:
        for name in INPUTS:
            con.execute(f"CREATE VIEW {name} AS SELECT * FROM read_parquet({sql_literal(str(parsed / f'{name}.parquet'))})")
        async_windows = "(SELECT trace_id, rank, step, ts_ns, dur_ns FROM collectives WHERE is_async)"
        _copy(con, schema.BREAKDOWN, f"({breakdown_sql('device_ops', async_windows, 'devices')})", out_dir)
        _copy(con, schema.KERNEL_STATS, f"({_KERNEL_STATS})", out_dir)
        _copy(con, schema.STREAM_IDLE, f"({idle_sql('device_ops', 'host_ops')})", out_dir)
        _copy(con, schema.LAUNCH_STATS, f"({launch_stats_sql('device_ops', 'host_ops')})", out_dir)
        _copy(con, schema.STREAM_QUEUES, f"({queue_lengths_sql('device_ops', 'host_ops')})", out_dir)
    finally:
        con.close()


_KERNEL_STATS = """
    SELECT trace_id, rank, name, any_value(category) AS category, count(*) AS count, sum(dur_ns) AS total_ns,
           round(sum(dur_ns) / count(*)) AS mean_ns, round(quantile_cont(dur_ns, 0.5)) AS p50_ns,
           round(quantile_cont(dur_ns, 0.95)) AS p95_ns,
           max(dur_ns) AS max_ns
    FROM device_ops WHERE category <> 'sync' GROUP BY ALL
"""


def _copy(con: duckdb.DuckDBPyConnection, tbl: schema.Table, source: str, out_dir: Path) -> None:
    select = schema.select_list(tbl, {c: c for c in tbl.column_names})
    out = sql_literal(str(out_dir / f"{tbl.name}.parquet"))
    con.execute(f"COPY (SELECT {select} FROM {source}) TO {out} (FORMAT parquet, COMPRESSION zstd)")
