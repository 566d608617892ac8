"""Derived tables: analysis results materialised next to each trace's parsed tables.

The analyses are pure functions in :mod:`tracelake.analysis` (:class:`~tracelake.analysis.derived.DerivedTables`
feeds them); this module only reads a trace's files, rank by rank in windows of time,
and writes their results, so the SQL shell, the API and fleet reports read them
without recomputing (docs/analyses.md, "Stored at ingest").
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import polars as pl
import polars.selectors
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tracelake.analysis import breakdown
from tracelake.analysis.derived import DerivedTables, Window
from tracelake.analysis.launches import GRAPH_CALL, LaunchCalls, launch_calls, shared_correlations
from tracelake.analysis.flops import counted
from tracelake.analysis.op_stats import Operators
from tracelake.analysis.peaks import Peaks, lookup
from tracelake.contracts import schema
from tracelake.ingest.kineto_scan import release_free_memory

#: The parsed tables the derived ones are computed from.
INPUTS = ("device_ops", "host_ops", "collectives", "devices")


def write_derived(parsed: Path, out_dir: Path) -> None:
    """Compute every derived table of one trace from its parsed tables in ``parsed`` into ``out_dir``.

    ``parsed`` holds ``<table>.parquet`` for each table in :data:`INPUTS` (a staging
    directory, or a folder of links to a stored trace's files); writes
    ``<table>.parquet`` for each table in :data:`schema.DERIVED_TABLES`.

    Rank by rank in windows of :data:`CHUNK_ROWS` ops: memory follows the window, plus the host
    launch calls (25 bytes each), the distinct (name, duration) pairs of a rank and what
    :class:`~tracelake.analysis.launches.LaunchParts` keeps of each launched op.
    """
    windows = pl.read_parquet(parsed / "collectives.parquet", columns=["trace_id", "rank", "step", "ts_ns",
                                                                      "dur_ns", "is_async"])
    windows = windows.filter(pl.col("is_async").fill_null(False)).drop("is_async").sort("ts_ns")
    devices = pl.read_parquet(parsed / "devices.parquet", columns=["trace_id", "rank", "peak_tflops"])
    peaks = {(str(t), int(r)): float(p) for t, r, p in devices.drop_nulls().iter_rows()}
    operators = _operators(parsed / "host_ops.parquet")
    release_free_memory()  # the operators' passes freed their row groups: hand them back before the windows
    launches, graph_calls = _launch_times(parsed / "host_ops.parquet", parsed / "device_ops.parquet")
    tables = DerivedTables(launches, graph_calls, windows, peaks, operators, _hardware(parsed / "devices.parquet"))
    for trace_id, rank in _keys(parsed / "device_ops.parquet"):
        tables.add_rank(trace_id, rank, _windows(parsed / "device_ops.parquet", trace_id, rank, CHUNK_ROWS))
    computed = tables.tables()
    for name in schema.DERIVED_TABLES:  # a table computed per run (critical_path) starts empty: docs/schema.md
        frame = computed.get(name)
        tbl = schema.table(name)
        if frame is None:
            arrow = tbl.arrow_schema.empty_table()
        else:
            frame = frame.select(tbl.column_names).with_columns(pl.selectors.categorical().cast(pl.String))
            arrow = (frame.sort("trace_id", "rank", "name") if name == "kernel_stats" else frame).to_arrow()
        pq.write_table(arrow.cast(tbl.arrow_schema), out_dir / f"{name}.parquet", compression="zstd")


def _hardware(devices: Path) -> dict[tuple[str, int], Peaks]:
    """Per (trace, rank), the peaks of its accelerator (the lowest device index that the table of known devices
    matches by name, SM count and memory: :func:`tracelake.analysis.peaks.lookup`)."""
    frame = pl.read_parquet(devices, columns=["trace_id", "rank", "device", "kind", "name", "core_count",
                                              "memory_bytes"])
    found: dict[tuple[str, int], Peaks] = {}
    for trace_id, rank, _, _, name, cores, memory in frame.filter(
            pl.col("trace_id").is_not_null() & pl.col("rank").is_not_null() & (pl.col("kind") != "nic")).sort(
            "trace_id", "rank", "device", nulls_last=True).iter_rows():
        key = (str(trace_id), int(rank))
        if key not in found and (peaks := lookup(name, cores, memory)) is not None:
            found[key] = peaks
    return found


def _operators(host_ops: Path) -> dict[str, Operators]:
    """Per trace, its operator calls and what each launch call is attributed to (:class:`Operators`).

    Two passes a row group at a time, in Arrow and numpy: the first keeps 18 bytes per host event (the chain from
    a launch call up to its operator runs through Python functions and annotations, so every event's parent is
    needed) and 32 per launch call; the second the names and shapes of the calls that launched device ops only.
    """
    names = set(pq.read_schema(host_ops).names)
    # shapes repeat (a few hundred distinct in 100,000s of calls): read as dictionaries, they stay small
    file = pq.ParquetFile(host_ops, read_dictionary=[c for c in ("trace_id", "cat", "name", "input_dims",
                                                                 "input_types") if c in names])
    arrays: dict[str, list[list[np.ndarray]]] = {}
    sizes: dict[str, int] = {}
    known: dict[str, bool] = {}
    for group in range(file.num_row_groups):
        part = file.read_row_group(group, columns=["trace_id", "event_id", "parent_id", "cat", "name", "correlation",
                                                   "ts_ns", "dur_ns"])
        if part["trace_id"].null_count or part["event_id"].null_count:
            part = part.filter(pc.and_(pc.is_valid(part["trace_id"]), pc.is_valid(part["event_id"])))
        traces = pc.unique(part["trace_id"]).to_pylist()
        for trace_id in traces:
            mine = part if len(traces) == 1 else part.filter(pc.equal(part["trace_id"], trace_id))
            is_op = pc.fill_null(pc.equal(mine["cat"], "cpu_op"), False).to_numpy(zero_copy_only=False)
            name = pc.dictionary_encode(mine["name"]).combine_chunks()
            words = name.dictionary.to_pylist()
            flags = np.array([known.setdefault(w, counted(w)) if w else False for w in words] + [False], dtype=bool)
            codes = pc.fill_null(name.indices, len(words)).to_numpy(zero_copy_only=False)
            calls = np.flatnonzero(pc.and_(pc.is_valid(mine["correlation"]), pc.is_valid(mine["ts_ns"]))
                                   .to_numpy(zero_copy_only=False))
            offset = sizes.get(str(trace_id), 0)
            sizes[str(trace_id)] = offset + mine.num_rows
            columns = (_ints(mine["event_id"], -1), _ints(mine["parent_id"], -1), is_op, is_op & flags[codes],
                       calls + offset, *(_ints(mine[c], 0)[calls] for c in ("correlation", "ts_ns", "dur_ns")))
            pieces = arrays.setdefault(str(trace_id), [[] for _ in columns])
            for piece, column in zip(pieces, columns, strict=True):
                piece.append(column)
        del part
    found = {}
    for trace_id in list(arrays):
        pieces = arrays.pop(trace_id)
        found[trace_id] = Operators.from_arrays(*(np.concatenate(piece) for piece in pieces))
        del pieces
    wanted = [c for c in ("trace_id", "event_id", "name", "rank", "dur_ns", "input_dims", "input_types") if c in names]
    kept: dict[str, list[pa.Table]] = {}
    for group in range(file.num_row_groups):
        ids = file.read_row_group(group, columns=["trace_id", "event_id"])
        for trace_id, operators in found.items():
            keep = pc.fill_null(pc.and_(pc.equal(ids["trace_id"], trace_id),
                                        pc.is_in(ids["event_id"], pa.array(operators.events))), False)
            if pc.any(keep).as_py():
                kept.setdefault(trace_id, []).append(file.read_row_group(group, columns=wanted).filter(keep))
        del ids
    for trace_id, parts in kept.items():
        frame = pl.DataFrame(pa.concat_tables(parts))
        found[trace_id].add_calls(frame.with_columns(*(pl.lit(None, dtype=pl.String).alias(c) for c in
                                                       ("input_dims", "input_types") if c not in frame.columns)))
    return found


def _ints(column: pa.ChunkedArray, missing: int) -> np.ndarray:
    return pc.fill_null(column, missing).to_numpy().astype(np.int64, copy=False)


#: Rows of a rank's device ops analysed at once: memory follows this, not the trace.
CHUNK_ROWS = 100_000

#: The device_ops columns the windowed analyses read.
_WINDOW_COLUMNS = ("trace_id", "rank", "stream", "step", "kind", "category", "name", "ts_ns", "dur_ns",
                   "correlation", "flops", "graph_id", "event_id")


def _keys(device_ops: Path) -> list[tuple[str, int]]:
    """The (trace, rank) pairs of the device ops, both known, sorted; read a row group at a time."""
    file = pq.ParquetFile(device_ops, read_dictionary=["trace_id"])
    found: set[tuple[str, int]] = set()
    for group in range(file.num_row_groups):
        part = pl.DataFrame(file.read_row_group(group, columns=["trace_id", "rank"])).drop_nulls().unique()
        found.update((str(trace_id), int(rank)) for trace_id, rank in part.iter_rows())
    return sorted(found)


def _launch_times(host_ops: Path, device_ops: Path) -> tuple[dict[str, LaunchCalls], dict[str, dict[int, str]]]:
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
    found: dict[str, LaunchCalls] = {}
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


def _windows(path: Path, trace_id: str, rank: int, chunk_rows: int) -> Iterator[Window]:
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


def _cut(ops: pl.DataFrame, low: int, high: int, chunk_rows: int) -> Iterator[Window]:
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
