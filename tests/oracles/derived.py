"""The derived tables of one trace computed in SQL, as ingest once could (``REFERENCE_SQL``): the oracle that
``warehouse/derived.py``'s windowed tables are compared with (docs/analyses.md, "Stored at ingest")."""

from __future__ import annotations

from pathlib import Path

import duckdb

from tracelake.contracts import schema
from tracelake.contracts.schema import sql_literal
from tracelake.warehouse.derived import INPUTS

from .breakdown import breakdown_sql
from .idle import idle_sql
from .kernels import KERNEL_STATS_SQL
from .launches import graph_launches_sql, launch_stats_sql, queue_lengths_sql
from .op_stats import attribution_sql, op_stats_sql, peaks_sql, register


def write_derived_sql(parsed: Path, out_dir: Path) -> None:
    """:func:`tracelake.warehouse.derived.write_derived`'s tables from the same files, each one SQL query."""
    con = duckdb.connect(config={"threads": 2, "preserve_insertion_order": False})
    try:
        con.execute("SET enable_progress_bar = false")
        for name in INPUTS:
            path = sql_literal(str(parsed / f"{name}.parquet"))
            con.execute(f"CREATE VIEW {name} AS SELECT * FROM read_parquet({path})")
        async_windows = "(SELECT trace_id, rank, step, ts_ns, dur_ns FROM collectives WHERE is_async)"
        register(con)
        con.execute(f"CREATE TABLE attributed AS {attribution_sql('device_ops', 'host_ops')}")
        credited = ("(SELECT * REPLACE (coalesce(flops, credit_flops) AS flops), "
                    "coalesce(flops, credit_model_flops) AS model_flops, "
                    "CASE WHEN flops IS NULL THEN credit_recomputed_flops END AS recomputed_flops FROM attributed)")
        peaks = f"({peaks_sql('attributed')})"
        breakdown = breakdown_sql(credited, async_windows, peaks, model_flops="model_flops",
                                  recomputed_flops="recomputed_flops")
        _copy(con, schema.BREAKDOWN, f"({breakdown})", out_dir)
        _copy(con, schema.OP_STATS, f"({op_stats_sql('attributed', 'host_ops')})", out_dir)
        _copy(con, schema.KERNEL_STATS, f"({KERNEL_STATS_SQL})", out_dir)
        _copy(con, schema.STREAM_IDLE, f"({idle_sql('device_ops', 'host_ops')})", out_dir)
        _copy(con, schema.LAUNCH_STATS, f"({launch_stats_sql('device_ops', 'host_ops')})", out_dir)
        _copy(con, schema.STREAM_QUEUES, f"({queue_lengths_sql('device_ops', 'host_ops')})", out_dir)
        _copy(con, schema.GRAPH_LAUNCHES, f"({graph_launches_sql('device_ops', 'host_ops')})", out_dir)
    finally:
        con.close()


def _copy(con: duckdb.DuckDBPyConnection, tbl: schema.Table, source: str, out_dir: Path) -> None:
    select = schema.select_list(tbl, {c: c for c in tbl.column_names})
    out = sql_literal(str(out_dir / f"{tbl.name}.parquet"))
    con.execute(f"COPY (SELECT {select} FROM {source}) TO {out} (FORMAT parquet, COMPRESSION zstd)")
