"""The native nesting of a Kineto trace's host events (and the op of each memory instant), slice by slice of time.

:class:`.kineto_scan.HostNesting` sweeps each thread's host events in order of
``ts_ns, dur_ns DESC, event_id`` (memory instants after the host events of their time).
DuckDB sorts them from the Parquet parts. One sort of a whole 1 GB trace's 2.2M rows went out of
core and set the ingest's peak memory (docs/architecture.md, "Memory"); so the rows are sorted a
slice of time at a time (:data:`SLICE_ROWS` rows or so each, in memory), each slice reading only the
parts whose times reach into it (their Parquet statistics), and each thread's rows go to a sweep
of its own that carries on from slice to slice. Where slicing does not apply (a host event
without a time, a part without statistics, many threads), the whole is sorted at once.

The sliced sweep also writes the host events' facts (depth, parent, step) in order of event id, the order the
final ``host_ops`` merges them in (``kineto_sql_tables._write_merged``), which would otherwise sort them again: a
part holds consecutive events, so the least id of each slice is known from the parts' statistics, and a slice's
facts, sorted once it is swept, wait only until no later slice can hold a smaller id.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tracelake.contracts.allocators import release_free_memory
from tracelake.contracts.lazy import duckdb

from . import kineto_scan, kineto_sql_tables
from .encoding import EncodingWriter
from .source import read_ahead

#: Rows sorted at once, about: a slice of a 1 GB trace's 2.2M host events and instants.
SLICE_ROWS = 200_000
#: Most threads for slices (each a sweep of its own, fed its share of every batch); more are sorted whole.
MAX_THREADS = 256
#: Rows per batch from DuckDB and per row group written: DuckDB holds each batch it hands over besides its sort.
BATCH_ROWS = 65_536
#: Which host events may hold a memory instant (its ``op``): the same rule for the native sweep and the fallback.
IS_CPU_OP = "lower({table}cat) = 'cpu_op'"
_IDS_SCHEMA = pa.schema([("event_id", pa.int64()), ("op_id", pa.int64())])
_HOST_SCHEMA = pa.schema([("event_id", pa.int64()), ("pid", pa.int64()), ("tid", pa.int64()), ("ts_ns", pa.int64()),
                          ("dur_ns", pa.int64()), ("correlation", pa.int64()), ("depth", pa.int32()),
                          ("step", pa.int64()), ("parent_id", pa.int64())])
_FACTS_SCHEMA = pa.schema([_HOST_SCHEMA.field(name) for name in ("event_id", *kineto_sql_tables.HOST_FACTS)])
#: Points per part where its rows are assumed spread evenly over its times, to cut slices of like size.
_POINTS = 16
#: Facts held back, beyond the slice just swept, before the facts are left to be sorted after the sweep instead
#: (slices whose events' ids overlap much: parts spanning long times).
HELD_ROWS = SLICE_ROWS
#: A slice's least id where it holds no host event: above every id.
NO_ID = 2**63 - 1


@dataclass(frozen=True)
class _Part:
    """A Parquet part: its path, its least and greatest ``ts_ns``, its rows and its least ``event_id`` (None:
    unknown)."""

    path: Path
    low: int
    high: int
    rows: int
    first_id: int | None = None


@dataclass(frozen=True)
class _Slice:
    """Times ``[start, stop)`` (None: unbounded), the parts holding any, and the least event id its host parts
    hold (None: unknown; larger than any id where it has none)."""

    start: int | None
    stop: int | None
    host: list[Path]
    memory: list[Path]
    first_id: int | None = None


def _part(path: Path, *, nulls_allowed: bool) -> _Part | None:
    """``path`` with its times from its statistics; None where it has none, or null times where none are allowed."""
    meta = pq.ParquetFile(path).metadata
    column = meta.schema.to_arrow_schema().get_field_index("ts_ns")
    low: int | None = None
    high: int | None = None
    for group in range(meta.num_row_groups):
        stats = meta.row_group(group).column(column).statistics
        if stats is None or (stats.null_count and not nulls_allowed) or not stats.has_null_count:
            return None
        if not stats.has_min_max:
            if stats.null_count == meta.row_group(group).num_rows:
                continue  # no times at all: instants the sweep leaves out
            return None
        low = stats.min if low is None else min(low, stats.min)
        high = stats.max if high is None else max(high, stats.max)
    if low is None or high is None:
        return _Part(path, 0, -1, 0)  # nothing to sweep
    return _Part(path, int(low), int(high), meta.num_rows, _least_id(meta))


def _least_id(meta: pq.FileMetaData) -> int | None:
    """A part's least ``event_id``, from its statistics; None where a row group holding rows has none."""
    column = meta.schema.to_arrow_schema().get_field_index("event_id")
    least: int | None = None
    for group in range(meta.num_row_groups):
        if not meta.row_group(group).num_rows:
            continue
        stats = meta.row_group(group).column(column).statistics
        if stats is None or not stats.has_min_max:
            return None
        least = int(stats.min) if least is None else min(least, int(stats.min))
    return least


def _edges(parts: list[_Part], slices: int) -> list[int]:
    """Up to ``slices - 1`` increasing times cutting the parts' rows into slices of about equal size."""
    points = np.array([p.low + (p.high - p.low) * i // (_POINTS - 1) for p in parts if p.rows
                       for i in range(_POINTS)], dtype=np.int64)
    weights = np.repeat([p.rows / _POINTS for p in parts if p.rows], _POINTS)
    order = np.argsort(points, kind="stable")
    cumulative = np.cumsum(weights[order])
    at = np.searchsorted(cumulative, cumulative[-1] * np.arange(1, slices) / slices)
    edges = np.unique(points[order][np.minimum(at, len(order) - 1)])
    return [int(edge) for edge in edges[edges > points.min()]]


def slices(parts: Path, threads: int) -> list[_Slice]:
    """The slices of time the parts in ``parts`` are swept in: one, unbounded, where slicing does not apply."""
    host, memory = kineto_sql_tables.part_files(parts, "host"), kineto_sql_tables.part_files(parts, "memory")
    whole = [_Slice(None, None, host, memory)]
    if threads > MAX_THREADS:
        return whole
    found = [_part(path, nulls_allowed=False) for path in host] + [_part(path, nulls_allowed=True) for path in memory]
    known = [part for part in found if part is not None]
    if len(known) < len(found):
        return whole
    total = sum(part.rows for part in known)
    count = -(-total // SLICE_ROWS)
    if count <= 1:
        return whole
    bounds: list[int | None] = [None, *_edges(known, count), None]
    cut = []
    for start, stop in zip(bounds, bounds[1:]):
        def within(part: _Part, start: int | None = start, stop: int | None = stop) -> bool:
            return part.rows > 0 and (start is None or part.high >= start) and (stop is None or part.low < stop)
        mine = [p for p in known[:len(host)] if within(p)]
        ids = [p.first_id for p in mine if p.first_id is not None]
        first_id = min(ids, default=NO_ID) if len(ids) == len(mine) else None
        cut.append(_Slice(start, stop, [p.path for p in mine], [p.path for p in known[len(host):] if within(p)],
                          first_id))
    return cut


def _floors(cut: list[_Slice]) -> list[int] | None:
    """After each slice, the least event id any later slice may hold (:data:`NO_ID` after the last); None where the
    sweep is not sliced or a slice's least id is unknown (the facts are then not written in id order)."""
    if len(cut) < 2 or any(piece.first_id is None for piece in cut):
        return None
    floors, least = [], NO_ID
    for piece in reversed(cut):
        floors.append(least)
        least = min(least, NO_ID if piece.first_id is None else piece.first_id)
    return floors[::-1]


def _query(piece: _Slice, *, with_memory: bool) -> str | None:
    """The slice's host events (and memory instants) in the sweep's order; None where it holds no rows."""
    times = " AND ".join([f"ts_ns >= {piece.start}"] * (piece.start is not None)
                         + [f"ts_ns < {piece.stop}"] * (piece.stop is not None)) or "TRUE"
    files = kineto_sql_tables.parquet_files
    if not with_memory:
        return f"""SELECT event_id, pid, tid, ts_ns, dur_ns, correlation FROM {files(piece.host)} WHERE {times}
                   ORDER BY pid, tid, ts_ns, dur_ns DESC, event_id""" if piece.host else None
    selects = []
    if piece.host:
        selects.append(f"""SELECT event_id, pid, tid, ts_ns, dur_ns, correlation,
                                  CAST(CASE WHEN {IS_CPU_OP.format(table='')} THEN 1 ELSE 0 END AS UTINYINT) AS kind
                           FROM {files(piece.host)} WHERE {times}""")
    if piece.memory:
        selects.append(f"""SELECT event_id, pid, tid, ts_ns, NULL::BIGINT AS dur_ns, NULL::BIGINT AS correlation,
                                  CAST(2 AS UTINYINT) AS kind
                           FROM {files(piece.memory)}
                           WHERE ts_ns IS NOT NULL AND pid IS NOT NULL AND tid IS NOT NULL AND {times}""")
    if not selects:
        return None
    return " UNION ALL ".join(selects) + " ORDER BY pid, tid, ts_ns, kind = 2, dur_ns DESC, event_id"


class _Sweeps:
    """One :class:`.kineto_scan.HostNesting` per thread, or one for all where the rows come in one sorted stream."""

    def __init__(self, steps: pa.Table, *, per_thread: bool) -> None:
        self._spans = kineto_scan.step_spans(steps)
        self._per_thread = per_thread
        self._sweeps: dict[tuple[object, ...], kineto_scan.HostNesting] = {}

    def pieces(self, batch: pa.RecordBatch) -> list[tuple[kineto_scan.HostNesting, pa.RecordBatch]]:
        """``batch`` (sorted by thread) cut where its thread changes, each piece with its thread's sweep."""
        if not self._per_thread:
            return [(self._sweep(()), batch)] if batch.num_rows else []
        thread = kineto_scan.thread_columns(batch)
        change = np.zeros(max(batch.num_rows - 1, 0), dtype=bool)
        for values in thread:
            change |= values[1:] != values[:-1]
        starts = [0, *(np.flatnonzero(change) + 1).tolist()]
        stops = [*starts[1:], batch.num_rows]
        return [(self._sweep(tuple(values[start].item() for values in thread)), batch.slice(start, stop - start))
                for start, stop in zip(starts, stops) if stop > start]

    def _sweep(self, key: tuple[object, ...]) -> kineto_scan.HostNesting:
        sweep = self._sweeps.get(key)
        if sweep is None:
            sweep = self._sweeps[key] = kineto_scan.HostNesting(self._spans)
        return sweep


class _InIdOrder:
    """The host events' facts (``event_id`` and ``kineto_sql_tables.HOST_FACTS``) into a file in event-id order.

    A slice's facts come in the sweep's order (by thread and time); once the slice is swept they are sorted (with
    those held from slices before), those below the least id a later slice may hold are written and the rest held.
    Where more than :data:`HELD_ROWS` would be held, the file is given up (removed) and the final table sorts the
    facts as before.

    The sorting runs on the sweep's own thread, between its slices. On a thread of its own, beside the next slice's
    sweep, the rows it held from slice to slice lay among that thread's passing buffers in a heap of their own, and
    the holes they left grew with the slices: alone on the 8 GB Qwen shape's parts the nesting peaked at 193-201 MiB
    against 164-168 at 1 GB; on the sweep's thread at 172-176 against 151-154 (docs/architecture.md, "Memory").
    """

    def __init__(self, out: Path, floors: list[int]) -> None:
        self._out: EncodingWriter | None = EncodingWriter(out, _FACTS_SCHEMA, compression="lz4", use_dictionary=False)
        self._path = out
        self._floors = floors
        self._slice: list[pa.RecordBatch] = []
        self._held = _FACTS_SCHEMA.empty_table()
        self._ready = _FACTS_SCHEMA.empty_table()  # in order, written once a row group's worth

    def write(self, nested: pa.RecordBatch) -> None:
        if self._out is not None:  # copied out: a selection would hold on to every column of the sweep's batch
            self._slice.append(pa.RecordBatch.from_arrays(
                [pa.concat_arrays([nested.column(name)]) for name in _FACTS_SCHEMA.names], schema=_FACTS_SCHEMA))

    def end_slice(self, index: int) -> None:
        """The slice's facts with those held, sorted; those below the least id of every later slice written."""
        batches, self._slice = self._slice, []
        if self._out is None:
            return
        rows = pa.concat_tables([self._held, pa.Table.from_batches(batches, schema=_FACTS_SCHEMA)])
        del batches
        ids = rows.column("event_id").to_numpy()
        order = np.argsort(ids, kind="stable")  # timsort: the held rows and each thread's rows are sorted runs
        at = int(np.searchsorted(ids[order], self._floors[index], side="left"))
        self._held = rows.take(order[at:])
        if self._held.num_rows > HELD_ROWS:
            self._give_up()
            return
        # row groups of BATCH_ROWS exactly, as the merge reads them (larger ones took 20-30 MB more at its peak)
        ready = pa.concat_tables([self._ready, rows.take(order[:at])])
        whole = ready.num_rows - ready.num_rows % BATCH_ROWS
        if whole:
            self._out.write_table(ready.slice(0, whole), row_group_size=BATCH_ROWS)
        self._ready = ready.slice(whole).combine_chunks()

    def close(self) -> None:
        if self._out is not None:
            out, self._out = self._out, None
            out.write_table(pa.concat_tables([self._ready, self._held]), row_group_size=BATCH_ROWS)
            out.close()

    def abandon(self) -> None:
        self._give_up()
        self._slice = []

    def _give_up(self) -> None:
        """Close and remove the file; the merge sorts the facts instead."""
        if self._out is not None:
            out, self._out = self._out, None
            with suppress(Exception):  # a failed write of a file being removed
                out.close()
            self._path.unlink(missing_ok=True)
        self._held, self._ready = _FACTS_SCHEMA.empty_table(), _FACTS_SCHEMA.empty_table()


class _Rows:
    """A Parquet file written in row groups of about :data:`BATCH_ROWS` rows from batches of any size, each encoded
    while the next is swept."""

    def __init__(self, out: Path, schema: pa.Schema) -> None:
        self._writer = EncodingWriter(out, schema, compression="lz4", use_dictionary=False)
        self._held: list[pa.RecordBatch] = []
        self._count = 0

    def write(self, batch: pa.RecordBatch) -> None:
        self._held.append(batch)
        self._count += batch.num_rows
        if self._count >= BATCH_ROWS:
            self.flush()

    def flush(self) -> None:
        if self._count:
            self._writer.write_table(pa.Table.from_batches(self._held), row_group_size=self._count)
        self._held, self._count = [], 0

    def close(self) -> None:
        self.flush()
        self._writer.close()


def _sorted(con: duckdb.DuckDBPyConnection, cut: list[_Slice], *, with_memory: bool
            ) -> Iterator[tuple[int, pa.RecordBatch | None]]:
    """The slices' rows in the sweep's order, slice after slice, each batch with its slice's index; after each
    slice, its index with None."""
    for index, piece in enumerate(cut):
        query = _query(piece, with_memory=with_memory)
        if query is not None:
            for batch in con.sql(query).to_arrow_reader(BATCH_ROWS):
                yield index, batch
        yield index, None


def sweep(con: duckdb.DuckDBPyConnection, out: Path, steps: pa.Table, threads: int) -> None:
    """The host events (and memory instants) of the parts beside ``out`` through the sweeps, slice by slice, sorted
    on ``con`` (a connection of its own), into ``out``; each instant's op into ``mem_op_ids.parquet`` beside it.
    ``threads``: how many threads the rows are on.

    Where the sweep is sliced, the host events' facts also go to ``kineto_sql_tables.facts_file`` beside
    ``out`` in event-id order (:class:`_InIdOrder`); the file is there only where that order was kept to the end.
    """
    parts = out.parent
    with_memory = any(parts.glob("memory-*.parquet"))
    cut = slices(parts, threads)
    release_free_memory()  # every part's footer read for its statistics: 12 MiB of holes at 8 GB (1,900 parts)
    sweeps = _Sweeps(steps, per_thread=len(cut) > 1)
    nested = _Rows(out, _HOST_SCHEMA)
    ids = _Rows(parts / "mem_op_ids.parquet", _IDS_SCHEMA) if with_memory else None
    floors = _floors(cut)
    by_id = _InIdOrder(kineto_sql_tables.facts_file(parts, "host"), floors) if floors is not None else None
    outputs = [nested] if ids is None else [nested, ids]
    try:  # DuckDB sorts the next slice while this one is swept
        for index, batch in read_ahead(_sorted(con, cut, with_memory=with_memory), depth=4,
                                       name="tracelake-nesting-sort"):
            if batch is None:
                if by_id is not None:
                    by_id.end_slice(index)
                continue
            for nesting, rows in sweeps.pieces(batch):
                if ids is None:
                    host = nesting.add(rows).cast(_HOST_SCHEMA)
                else:
                    host, instants = nesting.add_with_instants(rows)
                    host = host.cast(_HOST_SCHEMA)
                    ids.write(instants.cast(_IDS_SCHEMA))
                nested.write(host)
                if by_id is not None:
                    by_id.write(host)
    except BaseException:
        for output in outputs:
            with suppress(Exception):  # the error under way is the one to report
                output.close()
        if by_id is not None:
            by_id.abandon()
        raise
    for output in outputs:
        output.close()
    if by_id is not None:
        by_id.close()
