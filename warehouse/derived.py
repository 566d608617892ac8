"""Derived tables: analysis results materialised next to each trace's parsed tables.

The analyses are pure functions in :mod:`tracelake.analysis` (:class:`~tracelake.analysis.derived.DerivedTables`
feeds them); this module only reads a trace's files, rank by rank in windows of time,
and writes their results, so the SQL shell, the API and fleet reports read them
without recomputing (docs/analyses.md, "Stored at ingest").
"""

from __future__ import annotations

import itertools
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import polars as pl
import polars.selectors
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tracelake.analysis import breakdown
from tracelake.analysis.derived import DerivedTables, RankRows, Window
from tracelake.analysis.launches import LaunchLookup
from tracelake.analysis.peaks import Override, Peaks, matches, resolve
from tracelake.analysis.sorted_values import LogFactory
from tracelake.contracts import schema
from tracelake.contracts.allocators import release_free_memory

from . import derived_operators
from .derived_inputs import kernel_correlations, keys, launch_times, only
from .spill_log import SpillLog

#: The parsed tables the derived ones are computed from.
INPUTS = ("device_ops", "host_ops", "collectives", "devices")


#: The dtype of the peak an XLA profile states for its chip (TPUs and GPUs state their bf16 matrix peak).
PROFILE_PEAK_DTYPE = "bf16"


def write_derived(parsed: Path, out_dir: Path, peak_overrides: tuple[Override, ...] = (), threads: int = 1) -> None:
    """Compute every derived table of one trace from its parsed tables in ``parsed`` into ``out_dir``.

    ``parsed`` holds ``<table>.parquet`` for each table in :data:`INPUTS` (a staging
    directory, or a folder of links to a stored trace's files); writes
    ``<table>.parquet`` for each table in :data:`schema.DERIVED_TABLES`. ``peak_overrides``: the device peaks a
    person gave (``TRACELAKE_DEVICE_PEAKS``, :func:`tracelake.analysis.peaks.parse_overrides`). ``threads``: ranks
    computed at once, each on a thread of its own (the analyses spend most of their time in polars, Arrow and
    numpy, which let go of the GIL); the tables are the same whatever the number.

    Rank by rank in windows of :data:`CHUNK_ROWS` ops: memory follows ``threads`` windows, plus a few row groups of
    a trace's launch calls (written into ``out_dir``, in a folder removed before this returns, sorted by correlation
    id by the operators' pass: :mod:`.launch_table`; a trace without operator calls holds its calls, 13 bytes each)
    and of its operator calls that launched work (by position: :mod:`.call_table`; two bits each are kept, whether
    credited and whether run), and the distinct (name, duration) pairs of a rank. What :class:`~tracelake.analysis.launches.LaunchParts` keeps per
    launched op (delays, launches and ends), and the kernels' correlation ids while the ids that repeat are found,
    go to files in the same folder (:mod:`.spill_log`).
    """
    windows = _read(parsed / "collectives.parquet", ["trace_id", "rank", "step", "ts_ns", "dur_ns", "is_async"])
    windows = windows.filter(pl.col("is_async").fill_null(False)).drop("is_async").sort("ts_ns")
    devices = _read(parsed / "devices.parquet", ["trace_id", "rank", "device", "kind", "name", "core_count",
                                                 "memory_bytes", "peak_tflops"])
    hardware = _hardware(devices, peak_overrides)
    # The chip's own peak (XLA; its bf16 matrix peak) is preferred, unless a person gave the device's FLOP/s in
    # the settings: then theirs (docs/analyses.md, "Peaks").
    given = [o for o in peak_overrides if set(o.figures) - {"hbm"}]
    peaks: dict[tuple[str, int], float] = {}
    for t, r, p, name in devices.select("trace_id", "rank", "peak_tflops", "name").drop_nulls(
            ["trace_id", "rank", "peak_tflops"]).iter_rows():
        key = (str(t), int(r))
        mine = hardware.get(key) if any(matches(o, name) for o in given) else None
        figure = mine.flops_for(PROFILE_PEAK_DTYPE) if mine is not None else None
        peaks[key] = figure / 1e12 if figure else float(p)
    with tempfile.TemporaryDirectory(prefix=".launch-calls-", dir=out_dir) as folder:
        # the kernels' shared ids first, through logs on disk in the same folder
        shared = kernel_correlations(parsed / "device_ops.parquet", _spilled(Path(folder), "shared"))
        release_free_memory()
        operators, calls, graph_calls = derived_operators.operators(parsed / "host_ops.parquet", Path(folder), shared)
        release_free_memory()  # the operators' passes freed their row groups: hand them back before the windows
        # the traces without operator calls: their launch calls held in memory (XLA has none)
        held, named = launch_times(parsed / "host_ops.parquet", shared, skip=set(calls))
        lookups: dict[str, LaunchLookup] = {**held, **calls}
        tables = DerivedTables(lookups, {**named, **graph_calls}, windows, peaks, operators, hardware,
                               _spilled(Path(folder)))
        del held, named, shared
        _all_ranks(tables, parsed, threads)
        computed = tables.tables()
        del tables, lookups, calls
    for name in schema.DERIVED_TABLES:  # a table computed per run (critical_path) starts empty: docs/schema.md
        frame = computed.get(name)
        tbl = schema.table(name)
        if frame is None:
            arrow = tbl.arrow_schema.empty_table()
        else:
            frame = frame.select(tbl.column_names).with_columns(pl.selectors.categorical().cast(pl.String))
            arrow = (frame.sort("trace_id", "rank", "name") if name == "kernel_stats" else frame).to_arrow()
        pq.write_table(arrow.cast(tbl.arrow_schema), out_dir / f"{name}.parquet", compression="zstd")


def _spilled(folder: Path, prefix: str = "values") -> LogFactory:
    """Logs in ``folder`` (:class:`.spill_log.SpillLog`), each in a file of its own named ``<prefix>-<n>.i64``: what
    the launch statistics keep per launched op, or the kernels' correlation ids, on disk."""
    numbers = itertools.count()  # next() on it is atomic: the ranks' threads make logs at once

    def made() -> SpillLog:
        return SpillLog(folder / f"{prefix}-{next(numbers)}.i64")

    return made


def _all_ranks(tables: DerivedTables, parsed: Path, threads: int) -> None:
    """Every (trace, rank)'s rows into ``tables``, ``threads`` ranks at once (each on a thread of its own)."""
    ranks = keys(parsed / "device_ops.parquet")

    def rows(key: tuple[str, int]) -> RankRows:
        done = tables.rank_rows(*key, _windows(parsed / "device_ops.parquet", *key, CHUNK_ROWS))
        release_free_memory()  # the rank's windows and accumulators, back before the next rank's
        return done

    if threads > 1 and len(ranks) > 1:
        with ThreadPoolExecutor(min(threads, len(ranks)), thread_name_prefix="tracelake-derived") as pool:
            for done in pool.map(rows, ranks):  # in the ranks' order, whichever finishes first
                tables.add(done)
    else:
        for key in ranks:
            tables.add(rows(key))


def _read(path: Path, columns: list[str]) -> pl.DataFrame:
    """``columns`` of a small parsed table, read by Arrow, which the parse has loaded already. polars' own Parquet
    reader starts its I/O runtime and threads on first use: 15 MB more at the peak of a 30 MB TPU profile's ingest,
    and 40 ms (docs/architecture.md, "Memory"). Read as one file, not by ``pq.read_table``, which loads Arrow's
    datasets (another 15 MB)."""
    with pq.ParquetFile(path) as file:
        return pl.DataFrame(file.read(columns=columns))


def _hardware(devices: pl.DataFrame, overrides: tuple[Override, ...] = ()) -> dict[tuple[str, int], Peaks]:
    """Per (trace, rank), the peaks of its accelerator (the lowest device index that the table of known devices
    matches by name, SM count and memory: :func:`tracelake.analysis.peaks.lookup`), from the ``devices`` rows."""
    frame = devices.select("trace_id", "rank", "device", "kind", "name", "core_count", "memory_bytes")
    found: dict[tuple[str, int], Peaks] = {}
    for trace_id, rank, _, _, name, cores, memory in frame.filter(
            pl.col("trace_id").is_not_null() & pl.col("rank").is_not_null() & (pl.col("kind") != "nic")).sort(
            "trace_id", "rank", "device", nulls_last=True).iter_rows():
        key = (str(trace_id), int(rank))
        if key not in found and (peaks := resolve(name, cores, memory, overrides)) is not None:
            found[key] = peaks
    return found


#: Rows of a rank's device ops analysed at once: memory follows this, not the trace.
CHUNK_ROWS = 100_000

#: The device_ops columns the windowed analyses read.
_WINDOW_COLUMNS = ("trace_id", "rank", "stream", "step", "kind", "category", "name", "ts_ns", "dur_ns",
                   "correlation", "flops", "graph_id", "event_id")


def _row_groups(meta: pq.FileMetaData, trace_id: str, rank: int) -> list[tuple[int, int, bool]]:
    """(row group, smallest ``ts_ns``, whether every row is the rank's with a start) of the row groups that may hold
    ``rank``'s ops, earliest first.

    A row group without statistics may hold anything and comes first (smallest start unknown). The last item
    says, from the statistics, that the group holds no other (trace, rank) and no op without a start, so it
    needs no filter.
    """
    names = meta.schema.to_arrow_schema().names
    rank_col, ts_col, trace_col = names.index("rank"), names.index("ts_ns"), names.index("trace_id")
    found = []
    for i in range(meta.num_row_groups):
        group = meta.row_group(i)
        ranks, ts = group.column(rank_col).statistics, group.column(ts_col).statistics
        if ranks is not None and ranks.has_min_max and not ranks.min <= rank <= ranks.max:
            continue
        found.append((i, int(ts.min) if ts is not None and ts.has_min_max else breakdown.LOWEST,
                      only(ranks, rank) and only(group.column(trace_col).statistics, trace_id)
                      and ts is not None and ts.has_null_count and ts.null_count == 0))
    return sorted(found, key=lambda item: item[1])


def _windows(path: Path, trace_id: str, rank: int, chunk_rows: int) -> Iterator[Window]:
    """One (trace, rank)'s device ops in consecutive windows ``[low, high)`` of start times, each op once.

    The windows run from :data:`breakdown.LOWEST` to :data:`breakdown.HIGHEST` (the last one may hold no
    ops), ops with the same start share a window, and each window's ops are in start order. Row
    groups are read in order of their smallest start (Parquet statistics): once a row group is read,
    the ops starting before the next one's smallest start are all known. Those are cut off as a window
    before the next group would take the ops held past ``chunk_rows``: a window is then most often one
    row group as it was read, which polars takes without copying (a window of pieces of two groups is
    copied into one: 6 ms for 140,000 ops of a TPU trace, with their dictionaries). The parsers write each
    rank's ops nearly in time order, so few are held back; out of order, up to a whole rank is.
    Ops without a start are left out. Ops already in start order (the usual case) are cut, not sorted.
    """
    file = pq.ParquetFile(path, read_dictionary=["trace_id", "kind", "category", "name"])  # texts as codes
    groups = _row_groups(file.metadata, trace_id, rank)
    pending: list[pa.Table] = []  # in Arrow until a window is cut: one conversion to polars per window
    held = 0
    low = breakdown.LOWEST
    for position, (index, _, pure) in enumerate(groups):
        part = file.read_row_group(index, columns=_present(file))
        if not pure:
            part = part.filter(pc.and_(pc.and_(pc.equal(part["rank"], rank), pc.equal(part["trace_id"], trace_id)),
                                       pc.is_valid(part["ts_ns"])))
        pending.append(part)
        held += part.num_rows
        last = position + 1 == len(groups)
        high = breakdown.HIGHEST if last else groups[position + 1][1]
        coming = 0 if last else file.metadata.row_group(groups[position + 1][0]).num_rows
        if last or (held + coming > chunk_rows and high > low):  # cut before the next group would overfill it
            buffer = pa.concat_tables(pending) if len(pending) > 1 else pending[0]
            ts = buffer["ts_ns"].to_numpy()
            if not bool((ts[1:] >= ts[:-1]).all()):  # a stable sort: ops of one start keep the order they came in
                order = np.argsort(ts, kind="stable")  # timsort: linear on the few sorted runs a row group holds
                buffer, ts = buffer.take(order), ts[order]
                del order
            at = len(ts) if last else int(np.searchsorted(ts, high, side="left"))
            ready, pending = buffer.slice(0, at), [] if last else [buffer.slice(at)]
            held = sum(p.num_rows for p in pending)
            del buffer, ts
            yield from _cut(_with_graph_id(pl.DataFrame(ready)), low, high, chunk_rows)
            del ready
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
