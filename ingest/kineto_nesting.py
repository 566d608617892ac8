"""The native nesting of a Kineto trace's host events (and the op of each memory instant), slice by slice of time.

:class:`.kineto_scan.HostNesting` sweeps each thread's host events in order of
``ts_ns, dur_ns DESC, event_id`` (memory instants after the host events of their time).
DuckDB sorts them from the Parquet parts. One sort of a whole 1 GB trace's 2.2M rows went out of
core and set the ingest's peak memory (docs/architecture.md, "Memory"); so the rows are sorted a
slice of time at a time (:data:`SLICE_ROWS` rows or so each, in memory), each slice reading only the
parts whose times reach into it (their Parquet statistics), and each thread's rows go to a sweep
of its own that carries on from slice to slice. Where slicing does not apply (a host event
without a time, a part without statistics, many threads), the whole is sorted at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tracelake.contracts.schema import sql_literal

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
#: Points per part where its rows are assumed spread evenly over its times, to cut slices of like size.
_POINTS = 16


@dataclass(frozen=True)
class _Part:
    """A Parquet part: its path, its least and greatest ``ts_ns`` and its rows."""

    path: Path
    low: int
    high: int
    rows: int


@dataclass(frozen=True)
class _Slice:
    """Times ``[start, stop)`` (None: unbounded) and the parts holding any."""

    start: int | None
    stop: int | None
    host: list[Path]
    memory: list[Path]


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
    return _Part(path, int(low), int(high), meta.num_rows)


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
        cut.append(_Slice(start, stop, [p.path for p in known[:len(host)] if within(p)],
                          [p.path for p in known[len(host):] if within(p)]))
    return cut


def _files(paths: list[Path]) -> str:
    return "read_parquet([" + ", ".join(sql_literal(str(path)) for path in paths) + "])"


def _query(piece: _Slice, *, with_memory: bool) -> str | None:
    """The slice's host events (and memory instants) in the sweep's order; None where it holds no rows."""
    times = " AND ".join([f"ts_ns >= {piece.start}"] * (piece.start is not None)
                         + [f"ts_ns < {piece.stop}"] * (piece.stop is not None)) or "TRUE"
    if not with_memory:
        return f"""SELECT event_id, pid, tid, ts_ns, dur_ns, correlation FROM {_files(piece.host)} WHERE {times}
                   ORDER BY pid, tid, ts_ns, dur_ns DESC, event_id""" if piece.host else None
    selects = []
    if piece.host:
        selects.append(f"""SELECT event_id, pid, tid, ts_ns, dur_ns, correlation,
                                  CAST(CASE WHEN {IS_CPU_OP.format(table='')} THEN 1 ELSE 0 END AS UTINYINT) AS kind
                           FROM {_files(piece.host)} WHERE {times}""")
    if piece.memory:
        selects.append(f"""SELECT event_id, pid, tid, ts_ns, NULL::BIGINT AS dur_ns, NULL::BIGINT AS correlation,
                                  CAST(2 AS UTINYINT) AS kind
                           FROM {_files(piece.memory)}
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


def _sorted(con: duckdb.DuckDBPyConnection, cut: list[_Slice], *, with_memory: bool) -> Iterator[pa.RecordBatch]:
    """The slices' rows in the sweep's order, slice after slice."""
    for piece in cut:
        query = _query(piece, with_memory=with_memory)
        if query is not None:
            yield from con.sql(query).to_arrow_reader(BATCH_ROWS)


def sweep(con: duckdb.DuckDBPyConnection, out: Path, steps: pa.Table, threads: int) -> None:
    """The host events (and memory instants) of the parts beside ``out`` through the sweeps, slice by slice, sorted
    on ``con`` (a connection of its own), into ``out``; each instant's op into ``mem_op_ids.parquet`` beside it.
    ``threads``: how many threads the rows are on."""
    parts = out.parent
    with_memory = any(parts.glob("memory-*.parquet"))
    cut = slices(parts, threads)
    sweeps = _Sweeps(steps, per_thread=len(cut) > 1)
    host_schema = pa.schema([("event_id", pa.int64()), ("pid", pa.int64()), ("tid", pa.int64()),
                             ("ts_ns", pa.int64()), ("dur_ns", pa.int64()), ("correlation", pa.int64()),
                             ("depth", pa.int32()), ("step", pa.int64()), ("parent_id", pa.int64())])
    nested = _Rows(out, host_schema)
    ids = _Rows(parts / "mem_op_ids.parquet", _IDS_SCHEMA) if with_memory else None
    outputs = [nested] if ids is None else [nested, ids]
    try:  # DuckDB sorts the next slice while this one is swept
        for batch in read_ahead(_sorted(con, cut, with_memory=with_memory), depth=4, name="tracelake-nesting-sort"):
            for nesting, rows in sweeps.pieces(batch):
                if ids is None:
                    nested.write(nesting.add(rows).cast(host_schema))
                    continue
                host, instants = nesting.add_with_instants(rows)
                nested.write(host.cast(host_schema))
                ids.write(instants.cast(_IDS_SCHEMA))
    except BaseException:
        for output in outputs:
            with suppress(Exception):  # the error under way is the one to report
                output.close()
        raise
    for output in outputs:
        output.close()
