"""Derived tables: analysis results materialised next to each trace's parsed tables.

The analyses are pure SQL/polars functions in :mod:`tracelake.analysis`; this
module only feeds them a trace's files and writes their results, so the SQL
shell, the API and fleet reports read them without recomputing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb

import polars as pl
import polars.selectors
import pyarrow.parquet as pq

from tracelake.analysis.breakdown import breakdown_frame, breakdown_sql
from tracelake.analysis.idle import idle_frame, idle_sql
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
    con = duckdb.connect(config={
        "threads": threads, "memory_limit": memory_limit, "temp_directory": str(out_dir / "duckdb_tmp"),
        "preserve_insertion_order": False,
    })
    try:
        con.execute("SET enable_progress_bar = false")
        for name in INPUTS:
            con.execute(f"CREATE VIEW {name} AS SELECT * FROM read_parquet({sql_literal(str(parsed / f'{name}.parquet'))})")
        if pq.read_metadata(parsed / "device_ops.parquet").num_rows <= SQL_MAX_OPS:
            _write_in_sql(con, out_dir)
        else:
            _write_per_rank(parsed, out_dir)
        _copy(con, schema.LAUNCH_STATS, f"({launch_stats_sql('device_ops', 'host_ops')})", out_dir)
        _copy(con, schema.STREAM_QUEUES, f"({queue_lengths_sql('device_ops', 'host_ops')})", out_dir)
    finally:
        con.close()


#: Up to this many device ops, ``breakdown``, ``kernel_stats`` and ``stream_idle`` are computed in DuckDB
#: within the ingest memory limit; past it, per rank in numpy/polars (DuckDB's windows spill for minutes there,
#: while the vectorised sweep needs memory in proportion to one rank's ops). Tests keep both ways equal.
SQL_MAX_OPS = 2_000_000

_KERNEL_STATS_SQL = """
    SELECT trace_id, rank, name, any_value(category) AS category, count(*) AS count, sum(dur_ns) AS total_ns,
           round(sum(dur_ns) / count(*)) AS mean_ns, round(quantile_cont(dur_ns, 0.5)) AS p50_ns,
           round(quantile_cont(dur_ns, 0.95)) AS p95_ns, max(dur_ns) AS max_ns
    FROM device_ops WHERE category <> 'sync' GROUP BY ALL
"""


def _write_in_sql(con: duckdb.DuckDBPyConnection, out_dir: Path) -> None:
    async_windows = "(SELECT trace_id, rank, step, ts_ns, dur_ns FROM collectives WHERE is_async)"
    _copy(con, schema.BREAKDOWN, f"({breakdown_sql('device_ops', async_windows, 'devices')})", out_dir)
    _copy(con, schema.KERNEL_STATS, f"({_KERNEL_STATS_SQL})", out_dir)
    _copy(con, schema.STREAM_IDLE, f"({idle_sql('device_ops', 'host_ops')})", out_dir)


def _kernel_stats(ops: pl.DataFrame) -> pl.DataFrame:
    """Per (trace, rank, name): count, total, mean, p50, p95 (linear, like ``quantile_cont``), max; rounded to ns."""
    dur = pl.col("dur_ns")

    def rounded(value: pl.Expr) -> pl.Expr:  # half away from zero, as DuckDB's round() (durations are >= 0)
        return (value + 0.5).floor()

    return ops.lazy().filter(pl.col("category") != "sync").group_by("trace_id", "rank", "name").agg(
        pl.col("category").first(), pl.len().alias("count"), dur.sum().alias("total_ns"),
        rounded(dur.sum() / pl.len()).alias("mean_ns"),
        rounded(dur.quantile(0.5, interpolation="linear")).alias("p50_ns"),
        rounded(dur.quantile(0.95, interpolation="linear")).alias("p95_ns"),
        dur.max().alias("max_ns"),
    ).collect()


#: The device_ops columns the per-rank analyses read.
_RANK_COLUMNS = ("trace_id", "rank", "stream", "step", "category", "name", "ts_ns", "dur_ns", "correlation", "flops")


def _rank_frames(path: Path) -> Iterator[tuple[int, pl.DataFrame]]:
    """Each rank's device ops (only the columns the analyses need), read once, in ascending rank order.

    The rank filter goes into the scan, so only row groups whose statistics allow that rank are decoded
    (the parsers write ranks in runs); repeated strings are read as categoricals.
    """
    ops = pl.scan_parquet(path)
    for rank in sorted(ops.select(pl.col("rank").unique()).collect()["rank"].drop_nulls().to_list()):
        yield rank, ops.filter(pl.col("rank") == rank).select(_RANK_COLUMNS).with_columns(
            pl.col("trace_id", "category", "name").cast(pl.Categorical)).collect()


def _write_per_rank(parsed: Path, out_dir: Path) -> None:
    """``breakdown``, ``kernel_stats`` and ``stream_idle``, one rank at a time (memory follows the largest rank)."""
    windows = pl.read_parquet(parsed / "collectives.parquet", columns=["trace_id", "rank", "step", "ts_ns",
                                                                      "dur_ns", "is_async"])
    windows = windows.filter(pl.col("is_async").fill_null(False)).drop("is_async")
    devices = pl.read_parquet(parsed / "devices.parquet", columns=["trace_id", "rank", "peak_tflops"])
    peaks = {(str(t), int(r)): float(p) for t, r, p in devices.drop_nulls().iter_rows()}
    launches = pl.scan_parquet(parsed / "host_ops.parquet").filter(pl.col("correlation").is_not_null()).group_by(
        "trace_id", "correlation").agg(pl.col("ts_ns").min().alias("launch_ns")).collect()
    parts: dict[str, list[pl.DataFrame]] = {"breakdown": [], "kernel_stats": [], "stream_idle": []}
    launches = launches.with_columns(pl.col("trace_id").cast(pl.Categorical))
    for rank, mine in _rank_frames(parsed / "device_ops.parquet"):
        parts["kernel_stats"].append(_kernel_stats(mine.select("trace_id", "rank", "category", "name", "dur_ns")))
        parts["stream_idle"].append(idle_frame(
            mine.select("trace_id", "rank", "stream", "category", "ts_ns", "dur_ns", "correlation"), launches))
        parts["breakdown"].append(breakdown_frame(
            mine.select("trace_id", "rank", "step", "category", "ts_ns", "dur_ns", "flops"),
            windows.filter(pl.col("rank") == rank), peaks))
        del mine
    for name, frames in parts.items():
        tbl = schema.table(name)
        frame = pl.concat(frames).select(tbl.column_names).with_columns(pl.selectors.categorical().cast(pl.String)) \
            if frames else None
        if frame is not None and name == "kernel_stats":
            frame = frame.sort("trace_id", "rank", "name")  # group_by's order is arbitrary
        arrow = frame.to_arrow().cast(tbl.arrow_schema) if frame is not None else tbl.arrow_schema.empty_table()
        pq.write_table(arrow, out_dir / f"{name}.parquet", compression="zstd")


def _copy(con: duckdb.DuckDBPyConnection, tbl: schema.Table, source: str, out_dir: Path) -> None:
    select = schema.select_list(tbl, {c: c for c in tbl.column_names})
    out = sql_literal(str(out_dir / f"{tbl.name}.parquet"))
    con.execute(f"COPY (SELECT {select} FROM {source}) TO {out} (FORMAT parquet, COMPRESSION zstd)")
