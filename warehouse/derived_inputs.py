"""What :func:`~tracelake.warehouse.derived.write_derived` reads of a trace before its windows: the (trace, rank)
pairs, the host calls that launched device ops, and the correlation ids kernels share.

Each is read a row group at a time, in Arrow and numpy, and a row group is skipped, or read with fewer columns,
where its Parquet statistics already answer (one trace and rank, no correlation, no kernel, no null start).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tracelake.analysis import event_index
from tracelake.analysis.launches import GRAPH_CALL, LaunchArrays, launch_calls, member
from tracelake.analysis.sorted_values import LogFactory, MemoryLog, ValueLog, repeated
from tracelake.contracts.allocators import release_free_memory


def keys(device_ops: Path) -> list[tuple[str, int]]:
    """The (trace, rank) pairs of the device ops, both known, sorted; a row group that its statistics pin to one
    pair is not read, the others a row group at a time."""
    file = pq.ParquetFile(device_ops, read_dictionary=["trace_id"])
    names = file.schema_arrow.names
    found: set[tuple[str, int]] = set()
    for group in range(file.num_row_groups):
        meta = file.metadata.row_group(group)
        ranks = meta.column(names.index("rank")).statistics
        pinned = pinned_trace(file, group)
        if meta.num_rows and pinned is not None and ranks is not None and ranks.has_min_max \
                and only(ranks, ranks.min):
            found.add((pinned, int(ranks.min)))
            continue
        part = pl.DataFrame(file.read_row_group(group, columns=["trace_id", "rank"])).drop_nulls().unique()
        found.update((str(trace_id), int(rank)) for trace_id, rank in part.iter_rows())
    return sorted(found)


def pinned_trace(file: pq.ParquetFile, group: int) -> str | None:
    """The one trace a row group holds, where its statistics say so (no null ``trace_id`` either); else None."""
    stats = file.metadata.row_group(group).column(file.schema_arrow.names.index("trace_id")).statistics
    return stats.min if stats is not None and stats.has_min_max and isinstance(stats.min, str) \
        and only(stats, stats.min) else None


def _by_trace(part: pa.Table, pinned: str | None) -> Iterator[tuple[str, pa.Table]]:
    """The rows of each trace in ``part`` (rows without a ``trace_id`` left out); ``pinned``: the one trace it holds."""
    if pinned is not None:
        yield pinned, part
        return
    part = part.filter(pc.is_valid(part["trace_id"]))
    for trace_id in pc.unique(part["trace_id"]).to_pylist():
        yield str(trace_id), part.filter(pc.equal(part["trace_id"], trace_id))


def _all_null(file: pq.ParquetFile, group: int, column: str) -> bool:
    """Whether the statistics say that ``column`` holds nothing but nulls in the row group (it need not be read)."""
    meta = file.metadata.row_group(group)
    stats = meta.column(file.schema_arrow.names.index(column)).statistics
    return stats is not None and stats.has_null_count and stats.null_count == meta.num_rows


def launch_times(host_ops: Path, shared: dict[str, np.ndarray], skip: Collection[str] = ()
                 ) -> tuple[dict[str, LaunchArrays], dict[str, dict[int, str]]]:
    """The host calls of :func:`launch_calls`, per trace (but those in ``skip``, whose calls the operators' pass
    found: ``derived_operators``): read a row group at a time, 13 bytes per call kept and the ids' index (a bit per
    id of their span where they are dense, else a 4-byte offset each). ``shared``: :func:`kernel_correlations`.

    Only host events that carry a correlation id are kept (the runtime's launch calls, a
    fraction of all host events): a row group without any is not read. Also returns, per trace, the name of
    each graph launch call (named like :data:`GRAPH_CALL`: the pattern runs once per distinct name) by
    correlation.
    """
    file = pq.ParquetFile(host_ops, read_dictionary=["trace_id", "name"])
    calls: dict[str, list[list[np.ndarray]]] = {}  # per trace and column: the row groups' pieces
    names: dict[str, dict[int, str]] = {}
    for group in range(file.num_row_groups):
        if _all_null(file, group, "correlation") or _all_null(file, group, "ts_ns"):
            continue
        pinned = pinned_trace(file, group)
        if pinned is not None and pinned in skip:  # one trace's, whose calls are found already: not read
            continue
        part = file.read_row_group(group, columns=["correlation", "ts_ns", "dur_ns", "name",
                                                   *(["trace_id"] if pinned is None else [])])
        part = part.filter(pc.and_(pc.is_valid(part["correlation"]), pc.is_valid(part["ts_ns"])))
        for trace_id, mine in _by_trace(part, pinned):
            if trace_id in skip:
                continue
            graph = _graph_calls(mine["name"])
            pieces = calls.setdefault(trace_id, [[], [], [], []])
            for piece, column in zip(pieces, (*(ints(mine[c], 0) for c in ("correlation", "ts_ns", "dur_ns")),
                                              graph), strict=True):
                piece.append(column)
            named = names.setdefault(trace_id, {})
            if graph.any():
                chosen = mine.take(pa.array(np.flatnonzero(graph)))
                for correlation, name in zip(chosen["correlation"].to_pylist(),
                                             chosen["name"].cast(pa.string()).to_pylist(), strict=True):
                    named[int(correlation)] = min(named.get(int(correlation), name), name)
        del part
    release_free_memory()  # the row groups' Arrow buffers: back before the sorts below allocate theirs
    found: dict[str, LaunchArrays] = {}
    for trace_id in list(calls):
        pieces = calls.pop(trace_id)  # each column's pieces let go as it is joined: one copy at a time
        columns = [_joined(piece) for piece in pieces]
        del pieces
        release_free_memory()  # the pieces' heap, before the sort's large arrays (mapped apart) stack on it
        ids, starts, durations, graph = launch_calls(*columns)
        del columns
        graph |= member(ids, shared.get(trace_id, ids[:0]))
        found[trace_id] = LaunchArrays(event_index.build([ids]), starts, event_index.narrow(durations), graph)
        del ids, starts, durations, graph
    # The sorts' and joins' freed buffers: glibc keeps them (about 2.5x the calls' arrays) into the windows, where
    # the stored analyses peak (GPU 300 MB profile: 621 MB to 452 MB with two ranks at once).
    release_free_memory()
    return found, names


def _joined(pieces: list[np.ndarray]) -> np.ndarray:
    """The pieces as one array, emptying the list: the pieces are let go as soon as they are copied."""
    joined = np.concatenate(pieces)
    pieces.clear()
    return joined


def _graph_calls(name: pa.ChunkedArray) -> np.ndarray:
    """Whether each name (a dictionary column) is a graph launch call's (:data:`GRAPH_CALL`); a missing one is not."""
    flags = []
    for chunk in name.chunks:
        if not pa.types.is_dictionary(chunk.type):
            chunk = pc.dictionary_encode(chunk)
        known = pc.fill_null(pc.match_substring_regex(chunk.dictionary.cast(pa.string()), GRAPH_CALL), False)
        flags.append(pc.fill_null(known.take(chunk.indices), False).to_numpy(zero_copy_only=False))
    return np.concatenate(flags) if flags else np.zeros(0, dtype=bool)


def kernel_correlations(device_ops: Path, logs: LogFactory = MemoryLog) -> dict[str, np.ndarray]:
    """Per trace, the correlation ids that more than one kernel carries (the rule of
    :func:`~tracelake.analysis.launches.shared_correlations`).

    Reads a row group at a time (none whose statistics say it holds no correlation, or no kernel), each trace's ids
    into a log of its own (``logs``; the stored analyses' are on disk), and finds the ids that repeat as the log
    gives them back sorted (:func:`~tracelake.analysis.sorted_values.repeated`): on disk, nothing per kernel is held.
    Held in memory they took 8 bytes a kernel and, while counted, three times that (190 MiB at 16 GB of Kineto
    trace, the stored analyses' peak).
    """
    file = pq.ParquetFile(device_ops, read_dictionary=["trace_id", "kind"])
    names = file.schema_arrow.names
    found: dict[str, ValueLog] = {}
    for group in range(file.num_row_groups):
        kinds, ts = (file.metadata.row_group(group).column(names.index(c)).statistics for c in ("kind", "ts_ns"))
        if _all_null(file, group, "correlation") or _all_null(file, group, "ts_ns") or (
                kinds is not None and kinds.has_min_max and not kinds.min <= "kernel" <= kinds.max):
            continue
        pinned = pinned_trace(file, group)
        # only the columns the statistics leave in doubt
        tests = {"kind": not only(kinds, "kernel"), "ts_ns": not (ts is not None and ts.has_null_count
                                                                   and ts.null_count == 0)}
        part = file.read_row_group(group, columns=["correlation", *(c for c, read in tests.items() if read),
                                                   *(["trace_id"] if pinned is None else [])])
        keep = pc.is_valid(part["correlation"])
        if tests["kind"]:
            keep = pc.and_(keep, pc.equal(part["kind"], "kernel"))
        if tests["ts_ns"]:
            keep = pc.and_(keep, pc.is_valid(part["ts_ns"]))
        part = part.filter(keep)
        for trace_id, mine in _by_trace(part, pinned):
            log = found.get(trace_id)
            if log is None:
                log = found[trace_id] = logs()
            log.append(ints(mine["correlation"], 0))
        del part
    return {trace_id: repeated(log.sorted_chunks()) for trace_id, log in found.items()}


def only(stats: pq.Statistics | None, value: object) -> bool:
    """Whether a column chunk's statistics say that it holds ``value`` and nothing else (no null either)."""
    return stats is not None and stats.has_min_max and stats.has_null_count and stats.null_count == 0 \
        and stats.min == value and stats.max == value


def ints(column: pa.ChunkedArray, missing: int) -> np.ndarray:
    """The column as int64, ``missing`` for nulls (a column without nulls is not copied to fill them)."""
    filled = pc.fill_null(column, missing) if column.null_count else column
    return filled.to_numpy().astype(np.int64, copy=False)
