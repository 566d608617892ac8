"""Derived tables: analysis results materialised next to each trace's parsed tables.

The analyses are pure SQL/polars functions in :mod:`tracelake.analysis`; this
module only feeds them a trace's files and writes their results, so the SQL
shell, the API and fleet reports read them without recomputing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import polars.selectors
import pyarrow as pa
import pyarrow.parquet as pq

from tracelake.analysis import breakdown, idle
from tracelake.analysis.breakdown import breakdown_sql
from tracelake.analysis.classify import Category
from tracelake.analysis.graphs import graph_launches_sql, graph_rows
from tracelake.analysis.idle import idle_sql
from tracelake.analysis.launches import (
    GRAPH_CALL,
    LaunchParts,
    launch_calls,
    launch_stats_sql,
    queue_lengths_sql,
    shared_correlations,
)

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
    with _connect(parsed, out_dir, threads, memory_limit) as con:
        if REFERENCE_SQL:
            _write_in_sql(con, out_dir)
        else:
            _write_per_rank(con, parsed, out_dir)


@contextmanager
def _connect(parsed: Path, out_dir: Path, threads: int, memory_limit: str) -> Iterator[duckdb.DuckDBPyConnection]:
    """A DuckDB connection within the ingest's limits, with a view of each table in :data:`INPUTS`."""
    con = duckdb.connect(config={
        "threads": threads, "memory_limit": memory_limit, "temp_directory": str(out_dir / "duckdb_tmp"),
        "preserve_insertion_order": False,
    })
    try:
        con.execute("SET enable_progress_bar = false")
        for name in INPUTS:
            path = sql_literal(str(parsed / f"{name}.parquet"))
            con.execute(f"CREATE VIEW {name} AS SELECT * FROM read_parquet({path})")
        yield con
    finally:
        con.close()


#: The derived tables are computed rank by rank in windows of time in numpy/polars: at 100,000 ops that
#: takes about 60% of DuckDB's time, at millions DuckDB's windows spill for minutes under the ingest memory
#: limit, its quantiles hold every duration, and its joins of every op with its host call ran out of memory.
#: Their SQL (the readable reference) runs instead when this is True; tests keep both ways equal.
REFERENCE_SQL = False

_KERNEL_STATS_SQL = f"""
    SELECT trace_id, rank, name, any_value(category) AS category, count(*) AS count, sum(dur_ns) AS total_ns,
           round(sum(dur_ns) / count(*)) AS mean_ns, round(quantile_cont(dur_ns, 0.5)) AS p50_ns,
           round(quantile_cont(dur_ns, 0.95)) AS p95_ns, max(dur_ns) AS max_ns
    FROM device_ops WHERE category <> '{Category.SYNC}' GROUP BY ALL
"""


def _write_in_sql(con: duckdb.DuckDBPyConnection, out_dir: Path) -> None:
    async_windows = "(SELECT trace_id, rank, step, ts_ns, dur_ns FROM collectives WHERE is_async)"
    _copy(con, schema.BREAKDOWN, f"({breakdown_sql('device_ops', async_windows, 'devices')})", out_dir)
    _copy(con, schema.KERNEL_STATS, f"({_KERNEL_STATS_SQL})", out_dir)
    _copy(con, schema.STREAM_IDLE, f"({idle_sql('device_ops', 'host_ops')})", out_dir)
    _copy(con, schema.LAUNCH_STATS, f"({launch_stats_sql('device_ops', 'host_ops')})", out_dir)
    _copy(con, schema.STREAM_QUEUES, f"({queue_lengths_sql('device_ops', 'host_ops')})", out_dir)
    _copy(con, schema.GRAPH_LAUNCHES, f"({graph_launches_sql('device_ops', 'host_ops')})", out_dir)


#: Rows of a rank's device ops analysed at once: memory follows this, not the trace.
CHUNK_ROWS = 100_000

#: The device_ops columns the windowed analyses read.
_WINDOW_COLUMNS = ("trace_id", "rank", "stream", "step", "kind", "category", "name", "ts_ns", "dur_ns",
                   "correlation", "flops", "graph_id")


def _write_per_rank(con: duckdb.DuckDBPyConnection, parsed: Path, out_dir: Path) -> None:
    """Every derived table, rank by rank in windows of :data:`CHUNK_ROWS` ops.

    Each analysis adds up exactly over windows of start times (see :func:`_windows`), so memory follows
    the window, plus the host launch calls (24 bytes each), the distinct (name, duration) pairs of a rank
    and what :class:`LaunchParts` keeps of each launched op.
    """
    windows = pl.read_parquet(parsed / "collectives.parquet", columns=["trace_id", "rank", "step", "ts_ns",
                                                                      "dur_ns", "is_async"])
    windows = windows.filter(pl.col("is_async").fill_null(False)).drop("is_async").sort("ts_ns")
    devices = pl.read_parquet(parsed / "devices.parquet", columns=["trace_id", "rank", "peak_tflops"])
    peaks = {(str(t), int(r)): float(p) for t, r, p in devices.drop_nulls().iter_rows()}
    launches, graph_calls = _launch_times(parsed / "host_ops.parquet", parsed / "device_ops.parquet")
    keys = con.sql("SELECT DISTINCT trace_id, rank FROM device_ops WHERE trace_id IS NOT NULL "
                   "AND rank IS NOT NULL ORDER BY ALL").fetchall()
    rows: list[dict[str, object]] = []
    idle_parts: list[pl.DataFrame] = []
    stats_parts: list[pl.DataFrame] = []
    launch_parts: list[pl.DataFrame] = []
    queue_parts: list[pl.DataFrame] = []
    graph_parts: list[pl.DataFrame] = []
    for trace_id, rank in keys:
        parts = breakdown.BreakdownParts()
        carry: dict[int, int] = {}
        counts = _DurationCounts()
        launched = LaunchParts()
        mine = windows.filter((pl.col("trace_id") == trace_id) & (pl.col("rank") == rank))
        for low, high, ops in _windows(parsed / "device_ops.parquet", trace_id, rank, CHUNK_ROWS):
            parts.add(ops, mine.filter((pl.col("ts_ns") >= low) & (pl.col("ts_ns") < high)), low, high)
            ops = ops.with_columns(_launch_of(ops["correlation"], launches.get(trace_id)))
            launched.add(ops)
            work = ops.filter(pl.col("category") != Category.SYNC)
            idle_parts.append(idle.idle_window(work.select(
                "trace_id", "rank", "stream", "ts_ns", (pl.col("ts_ns") + pl.col("dur_ns")).alias("end_ns"),
                "launch_ns"), carry))
            counts.add(work)
        rows.extend(parts.rows(trace_id, rank, peaks.get((trace_id, rank))))
        stats_parts.append(counts.kernel_stats(trace_id, rank))
        launch_parts.append(launched.stats(trace_id, rank))
        queue_parts.append(launched.queues(trace_id, rank))
        graph_parts.append(graph_rows(launched.graph_kernels(), trace_id, rank, graph_calls.get(trace_id, {})))
    results = {"breakdown": breakdown.rows_frame(rows), "stream_idle": idle.combine_windows(idle_parts),
               "kernel_stats": pl.concat(stats_parts) if stats_parts else None,
               "launch_stats": pl.concat(launch_parts) if launch_parts else None,
               "stream_queues": pl.concat(queue_parts) if queue_parts else None,
               "graph_launches": pl.concat(graph_parts) if graph_parts else None}
    for name, frame in results.items():
        tbl = schema.table(name)
        if frame is None:
            arrow = tbl.arrow_schema.empty_table()
        else:
            frame = frame.select(tbl.column_names).with_columns(pl.selectors.categorical().cast(pl.String))
            arrow = (frame.sort("trace_id", "rank", "name") if name == "kernel_stats" else frame).to_arrow()
        pq.write_table(arrow.cast(tbl.arrow_schema), out_dir / f"{name}.parquet", compression="zstd")


#: Per trace: correlation ids (sorted), and the start and duration of the host call carrying each, and
#: whether that call is a graph launch (named like one, or its id is carried by more than one kernel).
_Launches = tuple[np.ndarray, ...]


def _launch_times(host_ops: Path, device_ops: Path) -> tuple[dict[str, _Launches], dict[str, dict[int, str]]]:
    """The host calls of :func:`launch_calls`, per trace: read a row group at a time, 25 bytes per call kept.

    Only host events that carry a correlation id are kept (the runtime's launch calls, a
    fraction of all host events). Also returns, per trace, the name of each graph launch call
    (named like :data:`GRAPH_CALL`) by correlation.
    """
    file = pq.ParquetFile(host_ops, read_dictionary=["trace_id"])
    columns = ("correlation", "ts_ns", "dur_ns", "graph_call")
    calls: dict[str, list[list[np.ndarray]]] = {}  # per trace and column: the row groups' pieces
    names: dict[str, dict[int, str]] = {}
    for group in range(file.num_row_groups):
        part = pl.DataFrame(file.read_row_group(group, columns=["trace_id", "correlation", "ts_ns", "dur_ns",
                                                                "name"])).filter(
            pl.col("correlation").is_not_null() & pl.col("ts_ns").is_not_null() & pl.col("trace_id").is_not_null())
        part = part.with_columns(pl.col("name").cast(pl.String).str.contains(GRAPH_CALL).fill_null(False)
                                 .alias("graph_call"))
        for (trace_id,), mine in part.partition_by("trace_id", as_dict=True).items():
            pieces = calls.setdefault(str(trace_id), [[] for _ in columns])
            for piece, column in zip(pieces, columns, strict=True):
                piece.append(mine[column].fill_null(0).to_numpy())
            named = names.setdefault(str(trace_id), {})
            for correlation, name in mine.filter(pl.col("graph_call")).select("correlation", "name").iter_rows():
                named[int(correlation)] = min(named.get(int(correlation), name), name)
        del part
    shared = _shared_correlations(device_ops)
    found: dict[str, _Launches] = {}
    for trace_id, pieces in calls.items():
        ids, starts, durations, graph = launch_calls(*(np.concatenate(piece) for piece in pieces))
        found[trace_id] = (ids, starts, durations, graph | np.isin(ids, shared.get(trace_id, ids[:0])))
    return found, names


def _shared_correlations(device_ops: Path) -> dict[str, np.ndarray]:
    """Per trace, the correlation ids that more than one kernel carries (:func:`shared_correlations`).

    Reads a row group at a time; holds 8 bytes per kernel of a trace until its ids are counted.
    """
    file = pq.ParquetFile(device_ops, read_dictionary=["trace_id", "kind"])
    pieces: dict[str, list[np.ndarray]] = {}
    for group in range(file.num_row_groups):
        part = pl.DataFrame(file.read_row_group(group, columns=["trace_id", "kind", "correlation", "ts_ns"])).filter(
            (pl.col("kind") == "kernel") & pl.col("correlation").is_not_null() & pl.col("ts_ns").is_not_null()
            & pl.col("trace_id").is_not_null())
        for (trace_id,), mine in part.partition_by("trace_id", as_dict=True).items():
            pieces.setdefault(str(trace_id), []).append(mine["correlation"].to_numpy().astype(np.int64))
        del part
    return {trace_id: shared_correlations(np.concatenate(piece)) for trace_id, piece in pieces.items()}


def _launch_of(correlation: pl.Series, launches: _Launches | None) -> list[pl.Series]:
    """``launch_ns``, ``call_ns`` and ``graph`` of each op: of its correlation's host call, null where none."""
    names = ("launch_ns", "call_ns", "graph")
    if launches is None or not len(launches[0]) or correlation.null_count() == len(correlation):
        return [pl.repeat(None, len(correlation), dtype=pl.Boolean if name == "graph" else pl.Int64,
                          eager=True).alias(name) for name in names]
    keys, *values = launches
    wanted = correlation.fill_null(0).to_numpy().astype(np.int64)
    at = np.minimum(np.searchsorted(keys, wanted), len(keys) - 1)
    missing = ~((keys[at] == wanted) & correlation.is_not_null().to_numpy())
    return [pl.Series(name, pa.array(column[at], mask=missing,
                                     type=pa.bool_() if name == "graph" else pa.int64()))
            for name, column in zip(names, values, strict=True)]


def _row_groups(meta: pq.FileMetaData, rank: int) -> list[tuple[int, int]]:
    """(row group, smallest ``ts_ns``) of the row groups that may hold ``rank``'s ops, earliest first.

    A row group without statistics may hold anything and comes first (smallest start unknown).
    """
    names = meta.schema.to_arrow_schema().names
    rank_col, ts_col = names.index("rank"), names.index("ts_ns")
    found = []
    for i in range(meta.num_row_groups):
        group = meta.row_group(i)
        ranks, ts = group.column(rank_col).statistics, group.column(ts_col).statistics
        if ranks is not None and ranks.has_min_max and not ranks.min <= rank <= ranks.max:
            continue
        found.append((i, int(ts.min) if ts is not None and ts.has_min_max else breakdown.LOWEST))
    return sorted(found, key=lambda pair: pair[1])


def _windows(path: Path, trace_id: str, rank: int, chunk_rows: int) -> Iterator[tuple[int, int, pl.DataFrame]]:
    """One (trace, rank)'s device ops in consecutive windows ``[low, high)`` of start times, each op once.

    The windows run from :data:`breakdown.LOWEST` to :data:`breakdown.HIGHEST` (the last one may hold no
    ops), ops with the same start share a window, and each window's ops are in start order. Row
    groups are read in order of their smallest start (Parquet statistics): once a row group is read,
    the ops starting before the next one's smallest start are all known. The parsers write each
    rank's ops nearly in time order, so few are held back; out of order, up to a whole rank is.
    Ops without a start are left out.
    """
    file = pq.ParquetFile(path, read_dictionary=["trace_id", "category", "name"])
    groups = _row_groups(file.metadata, rank)
    pending: list[pl.DataFrame] = []
    held = 0
    low = breakdown.LOWEST
    for position, (index, _) in enumerate(groups):
        part = _with_graph_id(pl.DataFrame(file.read_row_group(index, columns=_present(file)))).filter(
            (pl.col("rank") == rank) & (pl.col("trace_id") == trace_id) & pl.col("ts_ns").is_not_null())
        pending.append(part)
        held += part.height
        last = position + 1 == len(groups)
        high = breakdown.HIGHEST if last else groups[position + 1][1]
        if last or (held >= chunk_rows and high > low):
            buffer = pl.concat(pending)
            ready = buffer if last else buffer.filter(pl.col("ts_ns") < high)
            pending = [] if last else [buffer.filter(pl.col("ts_ns") >= high)]
            held = sum(p.height for p in pending)
            del buffer
            yield from _cut(ready.sort("ts_ns", maintain_order=True), low, high, chunk_rows)
            low = high
    if not groups:
        yield low, breakdown.HIGHEST, pl.DataFrame(schema=_window_schema(path))


def _window_schema(path: Path) -> dict[str, pl.DataType]:
    empty = pq.read_schema(path).empty_table()
    return dict(_with_graph_id(pl.DataFrame(empty.select([c for c in _WINDOW_COLUMNS if c in empty.column_names])))
                .schema)


def _present(file: pq.ParquetFile) -> list[str]:
    """The :data:`_WINDOW_COLUMNS` the file has: files stored before ``graph_id`` existed lack it."""
    names = set(file.schema_arrow.names)
    return [c for c in _WINDOW_COLUMNS if c in names]


def _with_graph_id(ops: pl.DataFrame) -> pl.DataFrame:
    return ops if "graph_id" in ops.columns else ops.with_columns(pl.lit(None, dtype=pl.Int64).alias("graph_id"))


def _cut(ops: pl.DataFrame, low: int, high: int, chunk_rows: int) -> Iterator[tuple[int, int, pl.DataFrame]]:
    """``[low, high)`` split into windows of about ``chunk_rows`` of ``ops`` (sorted by start), never within a start."""
    ts = ops["ts_ns"].to_numpy()
    done = 0
    while len(ts) - done > chunk_rows:
        at = int(np.searchsorted(ts, ts[done + chunk_rows], side="left"))
        if at <= done:  # one start shared by more than chunk_rows ops: they stay together
            at = int(np.searchsorted(ts, ts[done + chunk_rows], side="right"))
            if at >= len(ts):
                break
        yield low, int(ts[at]), ops[done:at]
        low, done = int(ts[at]), at
    yield low, high, ops[done:]


class _DurationCounts:
    """How many ops of each name took each duration, in one (trace, rank): what exact quantiles need.

    Ops of a name repeat with a few distinct durations, so this stays far smaller than the ops.
    """

    def __init__(self) -> None:
        self._parts: list[pl.DataFrame] = []
        self._merged_rows = 0
        self._rows = 0

    def add(self, ops: pl.DataFrame) -> None:
        """Count the (non-sync) ``ops`` (``name``, ``category``, ``dur_ns``)."""
        part = ops.group_by("name", "category", "dur_ns").agg(pl.len().cast(pl.Int64).alias("n"))
        self._parts.append(part)
        self._rows += part.height
        if self._rows > 2 * self._merged_rows + CHUNK_ROWS:  # merge now and then: linear time overall
            self._parts = [self._merged()]
            self._merged_rows = self._rows = self._parts[0].height

    def _merged(self) -> pl.DataFrame:
        return pl.concat(self._parts).group_by("name", "category", "dur_ns").agg(pl.col("n").sum())

    def kernel_stats(self, trace_id: str, rank: int) -> pl.DataFrame:
        """:data:`_KERNEL_STATS_SQL`'s rows: count, total, mean, p50, p95 (``quantile_cont``), max per name."""
        counts = self._merged() if self._parts else pl.DataFrame(
            schema={"name": pl.String, "category": pl.String, "dur_ns": pl.Int64, "n": pl.Int64})
        values = counts.filter(pl.col("dur_ns").is_not_null()).sort("name", "dur_ns").with_columns(
            pl.col("n").cum_sum().over("name").alias("upto"), (pl.col("n").sum().over("name") - 1).alias("last"))

        def quantile(q: float) -> pl.Expr:
            # linear between the values at floor and ceil of (n - 1) * q, as DuckDB's quantile_cont
            position = pl.col("last").cast(pl.Float64) * q
            lower = pl.col("dur_ns").filter(pl.col("upto") > position.floor()).first().cast(pl.Float64)
            upper = pl.col("dur_ns").filter(pl.col("upto") > position.ceil()).first().cast(pl.Float64)
            fraction = (position - position.floor()).first()
            return _rounded(lower + (upper - lower) * fraction)

        per_value = values.group_by("name").agg(
            (pl.col("dur_ns") * pl.col("n")).sum().alias("total_ns"), quantile(0.5).alias("p50_ns"),
            quantile(0.95).alias("p95_ns"), pl.col("dur_ns").max().alias("max_ns"))
        per_name = counts.group_by("name").agg(pl.col("category").first(), pl.col("n").sum().alias("count"))
        return per_name.join(per_value, on="name", how="left").with_columns(
            pl.lit(trace_id).alias("trace_id"), pl.lit(rank, dtype=pl.Int32).alias("rank"),
            _rounded(pl.col("total_ns") / pl.col("count")).alias("mean_ns"),
        ).sort("name")


def _rounded(value: pl.Expr) -> pl.Expr:
    """Half away from zero, as DuckDB's round() (durations are >= 0)."""
    return (value + 0.5).floor()


def _copy(con: duckdb.DuckDBPyConnection, tbl: schema.Table, source: str, out_dir: Path) -> None:
    select = schema.select_list(tbl, {c: c for c in tbl.column_names})
    out = sql_literal(str(out_dir / f"{tbl.name}.parquet"))
    con.execute(f"COPY (SELECT {select} FROM {source}) TO {out} (FORMAT parquet, COMPRESSION zstd)")
