"""The host part of the XLA parser: the lines of ``/host:...`` planes into ``host_ops``.

Every line is a thread. Its events are sorted by start (the longer first when two
start together), numbered in that order and nested with a stack: an event's parent
is the innermost earlier event still open when it starts (touching is not nesting).
Events carrying ``step_num`` are host step annotations; events carrying ``hlo_op``
and ``device_ordinal`` are the XLA ops of the CPU back-end, which go to ``device_ops``.

A line is sorted as :meth:`Space.lines <tracelake.ingest.xspace.Space.lines>` gives it:
whole, or a big line (over :data:`~tracelake.ingest.xspace.LINE_CHUNK_BYTES`) a window of
events at a time; the events still open at the end of a window stay on the stack for the
next one, so a line in time order nests as if read whole. Each such unit is decoded in bulk
(:meth:`HostLines.host_columns`: per event only integers, the stats as arrays, names
once per event metadata entry; only the events that overlap others go through a
loop, for their nesting). Units holding CPU back-end ops, and data the bulk decoder
does not take, go through protobuf one event at a time (:meth:`HostLines._host_line`),
which gives the same rows (or says what is wrong). The parser itself is
:mod:`tracelake.ingest.xla`.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Iterator, Mapping
from contextlib import closing
from pathlib import Path
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tracelake.contracts.classify import classify
from tracelake.contracts.errors import TraceFormatError

from . import xla_ops
from .xla_memory import MemoryRows
from .tables import BackgroundWriter, ColumnValues, TableWriter, arrow_table, fit_int
from .xla_gpu import GpuStreams, event_stats, steps_array
from .xla_rows import (DEVICE_COLUMNS, HOST_COLUMNS, Columns, as_float, as_int, as_str, as_uint, distinct_inverse,
                       stat_ints, writer_options)
from .xspace import EventBatch, Plane, Space

#: Host rows held before a part is written to the scratch file.
HOST_FLUSH_ROWS = 50_000
#: Where host rows wait for their steps, under the staging directory.
_HOST_SCRATCH = "host_ops.unstepped"


class HostLines(GpuStreams):
    """Row building for host lines; the XLA parser (:mod:`tracelake.ingest.xla`) derives from it."""

    #: Set by the parser: the open file, its host planes and the rank their rows get.
    space: Space
    host_planes: list[Plane]
    host_rank: int
    #: Allocator events met on the host lines (:mod:`.xla_memory`), written by the parser at the end.
    memory: MemoryRows

    def read_hosts(self, device_ops: BackgroundWriter) -> None:
        """Host planes: ``host_ops`` written in parts as the lines are read, XLA ops of the CPU back-end held.

        A host row's step is known only once every host step annotation is, so the
        parts go to a scratch file first and get their steps when copied into place
        (see :meth:`_write_host_steps`): memory follows a part, not the file.
        """
        rows = _HostRows(self.options.trace_id)
        cpu_ops = Columns(DEVICE_COLUMNS)
        host_steps = not self.steps.windows
        scratch = self.staging / _HOST_SCRATCH
        scratch.mkdir(exist_ok=True)
        try:
            with BackgroundWriter(TableWriter(scratch, "host_ops", trace_id=self.options.trace_id,
                                              **writer_options("host_ops"))) as unstepped:
                for plane in self.host_planes:
                    pid = plane.stats().get("process_id")
                    still_open: Stack = []
                    with closing(self.space.decoded(plane, _every, stats=True)) as batches:  # see Space.decoded
                        for unit in _units(batches):
                            still_open = self._host_unit(plane, unit, pid if isinstance(pid, int) else None, rows,
                                                         cpu_ops, host_steps, still_open)
                            if unit[-1].last:  # the line's end: the next unit starts another
                                still_open = []
                            if rows.rows >= HOST_FLUSH_ROWS:
                                unstepped.write(rows.take())
                unstepped.write(rows.take())
            self.steps.finish()
            self._write_host_steps(scratch / "host_ops.parquet")
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        # Host step annotations are only all known now: assign steps and count device ops per step again.
        self.steps.device.clear()
        ranks_of = cast(list[int], cpu_ops.data["rank"])
        ranks = sorted(set(ranks_of))
        durations = cast(list[int], cpu_ops.data["dur_ns"])
        for i, ts in enumerate(cast(list[int], cpu_ops.data["ts_ns"])):
            step = self.steps.step_at(ranks_of[i], ts)
            cpu_ops.data["step"][i] = step
            self.steps.count(ranks_of[i], step, ts, ts + durations[i])
        self._collectives_of(cpu_ops)
        device_ops.write(cpu_ops.take())
        for rank in ranks:
            self.devices.setdefault(rank, {"rank": rank, "device": rank, "kind": "cpu", "name": "XLA CPU device"})

    def _write_host_steps(self, unstepped: Path) -> None:
        """Copy the host rows of ``unstepped`` into ``host_ops``, a row group at a time, each with its step."""
        with BackgroundWriter(TableWriter(self.staging, "host_ops", trace_id=self.options.trace_id,
                                          **writer_options("host_ops"))) as out:
            source = pq.ParquetFile(unstepped)
            for group in range(source.num_row_groups):
                part = source.read_row_group(group, columns=list(HOST_COLUMNS))
                columns: dict[str, ColumnValues] = {name: part.column(name) for name in HOST_COLUMNS}
                ts = part.column("ts_ns").to_numpy()
                columns["step"] = steps_array(self.steps.steps_of(None, ts))
                out.write(columns)
                del part, columns

    def _host_unit(
        self, plane: Plane, unit: list[EventBatch], pid: int | None, rows: _HostRows, cpu_ops: Columns,
        host_steps: bool, still_open: Stack,
    ) -> Stack:
        """One unit of a line (see :func:`_units`): in bulk (:meth:`host_columns`) where it can be, else one event
        at a time through protobuf (:meth:`_host_line`), which decodes it or says what is wrong.

        ``still_open`` is the stack the line's units before left; returns the one this unit leaves.
        """
        if len(unit) == 1:
            try:
                done = self.host_columns(plane, unit[0], pid, host_steps, still_open)
            except (TraceFormatError, UnicodeDecodeError):
                done = None
            if done is not None:
                part, still_open = done
                rows.add(part)
                return still_open
        one_by_one = Columns(HOST_COLUMNS)
        still_open = self._host_line(plane, unit[0].xline(*unit[1:]), pid, one_by_one, cpu_ops, host_steps,
                                     still_open)
        rows.add(one_by_one.take())
        return still_open

    def host_columns(
        self, plane: Plane, batch: EventBatch, pid: int | None, host_steps: bool, still_open: Stack
    ) -> tuple[dict[str, pa.Array], Stack] | None:
        """The ``host_ops`` rows of a unit of a line, as :meth:`_host_line` makes them, as Arrow arrays (strings
        dictionary-encoded), and the stack it leaves; host step annotations added to the steps.

        None if the unit holds XLA ops of the CPU back-end (they go one by one). Nothing
        is changed (ids, steps, counts) unless it succeeds.

        Raises:
            TraceFormatError, UnicodeDecodeError: data the bulk decoder does not take.
        """
        header = batch.header
        origin = self._origin_ns(header)
        n = len(batch)
        if not n:
            return {}, still_open
        fields = batch.fields()
        stats = batch.stats(plane, fields)
        stats.check_strings()
        if ((stats.last("hlo_op") >= 0) & (stats.last("device_ordinal") >= 0)).any():
            return None
        order = np.lexsort((~fields.duration_ps, fields.offset_ps))  # stable: as sorted() by (offset, -duration)
        ts = origin + fields.offset_ps[order] // 1000  # whole ns: floor((origin * 1000 + ps) / 1000)
        dur = np.maximum(fields.duration_ps[order] // 1000, 0)
        first_id = self.next_id
        depth, parent, left_open = stacked_nesting(ts, ts + dur, first_id, still_open)
        correlation, has_correlation = stat_ints(stats, "correlation_id")
        step_annotations: list[tuple[int, int, int]] = []
        if host_steps:
            step_num, is_step = stat_ints(stats, "step_num")
            annotated = np.flatnonzero(is_step[order])
            step_annotations = list(zip(step_num[order[annotated]].tolist(), ts[annotated].tolist(),
                                        dur[annotated].tolist(), strict=True))
        kinds, which = distinct_inverse(fields.metadata_id[order])
        names = [self._kernel_name(plane, int(k)) for k in kinds.tolist()]
        name = str(header.name)

        stats.count_unknown()
        for step, start, length in step_annotations:
            self.steps.add(None, step, start, length)
        self.events += n
        self.next_id += n
        self._extent(int(ts.min()), int((ts + dur).max()))
        self.memory.add_batch(plane, stats, fields.metadata_id[order], order, ts, first_id, pid, int(header.id))
        return {
            "event_id": pa.array(np.arange(first_id, first_id + n, dtype=np.int64)),
            "rank": pa.array(np.full(n, self.host_rank, dtype=np.int32)),
            "pid": pa.repeat(pa.array([pid], type=pa.int64())[0], n),
            "tid": pa.array(np.full(n, int(header.id), dtype=np.int64)),
            "cat": pa.DictionaryArray.from_arrays(np.zeros(n, dtype=np.int32),
                                                  pa.array([name.rsplit("/", 1)[0] or name])),
            "name": pa.DictionaryArray.from_arrays(which.reshape(-1).astype(np.int32), pa.array(names, pa.string())),
            "ts_ns": pa.array(ts),
            "dur_ns": pa.array(dur),
            "depth": pa.array(depth),
            "parent_id": pa.array(parent, mask=parent < 0, type=pa.int64()),
            "correlation": pa.array(correlation[order], mask=~has_correlation[order], type=pa.int64()),
        }, left_open

    def _host_line(
        self, plane: Plane, line: Any, pid: int | None, rows: Columns, cpu_ops: Columns, host_steps: bool,
        still_open: Stack,
    ) -> Stack:
        """A unit of a line one event at a time through protobuf (see :meth:`_host_unit`); returns the stack it
        leaves, having started from ``still_open``."""
        origin = self._origin_ns(line) * 1000
        thread = str(line.name).rsplit("/", 1)[0] or str(line.name)
        order = sorted(range(len(line.events)), key=lambda i: (line.events[i].offset_ps, -line.events[i].duration_ps))
        stack = list(still_open)  # (end_ns, event_id) of open events
        for i in order:
            event = line.events[i]
            self.events += 1
            md = plane.header.event_metadata.get(event.metadata_id)
            name = str(md.display_name or md.name) if md is not None else ""
            ts = (origin + event.offset_ps) // 1000
            dur = max(event.duration_ps // 1000, 0)
            stats = event_stats(plane, event) if event.stats else {}
            event_id = self._event_id()
            self._extent(ts, ts + dur)
            memory_kind = self.memory.kinds(plane).get(event.metadata_id)
            if memory_kind is not None:
                self.memory.add(memory_kind, event_id, ts, pid, int(line.id), stats)
            if "hlo_op" in stats and "device_ordinal" in stats:
                self._cpu_op(plane, event_id, name, ts, dur, stats, line, cpu_ops)
                continue
            if host_steps and "step_num" in stats:
                step = as_int(stats["step_num"])
                if step is not None:
                    self.steps.add(None, step, ts, dur)
            while stack and stack[-1][0] <= ts:  # touching is not nesting
                stack.pop()
            data = rows.data
            data["event_id"].append(event_id)
            data["rank"].append(self.host_rank)
            data["pid"].append(pid)
            data["tid"].append(int(line.id))
            data["cat"].append(thread)
            data["name"].append(name)
            data["ts_ns"].append(ts)
            data["dur_ns"].append(dur)
            data["depth"].append(len(stack))
            data["parent_id"].append(stack[-1][1] if stack else None)
            data["correlation"].append(as_int(stats.get("correlation_id")))
            data["step"].append(None)
            stack.append((ts + dur, event_id))
        return stack

    def _cpu_op(
        self, plane: Plane, event_id: int, name: str, ts: int, dur: int, stats: dict[str, object], line: Any,
        out: Columns,
    ) -> None:
        rank = as_int(stats.get("device_ordinal")) or 0
        if fit_int(rank, 31) is None:
            raise TraceFormatError(self.source, f"XLA op {name!r} has device_ordinal {rank}, not a device index",
                                   where=f"plane {plane.name!r}, line {str(line.name)!r}")
        module = as_str(stats.get("hlo_module"))
        hlo_op = as_str(stats.get("hlo_op")) or name
        opcode = self.opcodes_by_module.get((module or "", hlo_op)) or xla_ops.opcode_of(hlo_op)
        hlo_category = as_str(stats.get("hlo_category")) or opcode
        self._device_row(out, event_id, rank, rank, int(line.id), "xla_op", classify("xla_op", name, hlo_category),
                         name, ts, dur, None, module, as_uint(stats.get("program_id")), hlo_category, None,
                         as_float(stats.get("flops")), as_int(stats.get("bytes_accessed")))


#: The events still open on a line, as (end_ns, event_id), outermost first.
Stack = list[tuple[int, int]]


def stacked_nesting(ts: np.ndarray, end: np.ndarray, first_id: int,
                    still_open: Stack) -> tuple[np.ndarray, np.ndarray, Stack]:
    """:func:`nesting` of a run of a line's events (ids from ``first_id`` on) over the events ``still_open`` from the
    runs before it: each event's depth and parent id (-1: none), and the stack after the run.

    The open events go first, all at a start before every event and before their own ends (so
    none pops another): the stack is then theirs when the run starts. After the run it holds
    the last event and its ancestors, as the stack only ever changes at its top.
    """
    if not len(ts):
        return np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int64), still_open
    below = len(still_open)
    ids = np.arange(first_id - below, first_id + len(ts), dtype=np.int64)
    if below:
        open_ends = np.array([e for e, _ in still_open], dtype=np.int64)
        ts = np.concatenate([np.full(below, min(int(ts[0]), int(open_ends.min()) - 1), dtype=np.int64), ts])
        end = np.concatenate([open_ends, end])
        ids[:below] = [i for _, i in still_open]
    depth, parent = nesting(ts, end)
    chain = []
    at = len(ts) - 1
    while at >= 0:
        chain.append((int(end[at]), int(ids[at])))
        at = int(parent[at])
    return depth[below:], np.where(parent >= 0, ids[np.maximum(parent, 0)], -1)[below:], chain[::-1]


def nesting(ts: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each event's depth and parent (its position, -1: none), the events sorted as :meth:`HostLines._host_line`
    sorts them, as its stack nests them: the events on top of the stack that end by an event's start are popped
    (touching is not nesting), what is left is above it.

    An event that starts once every earlier one has ended finds the stack empty. When
    events nest properly (see :func:`proper_nesting`) the rest is done on whole arrays too;
    otherwise the runs of events that overlap go through the stack, one event at a time.
    """
    n = len(ts)
    depth = np.zeros(n, dtype=np.int32)
    parent = np.full(n, -1, dtype=np.int64)
    if n < 2:
        return depth, parent
    alone = np.empty(n, dtype=bool)
    alone[0] = True
    np.greater_equal(ts[1:], np.maximum.accumulate(end)[:-1], out=alone[1:])
    if alone.all():
        return depth, parent
    nested = proper_nesting(ts, end)
    if nested is not None:
        return nested
    run = np.cumsum(alone) - 1
    busy = np.flatnonzero(np.bincount(run)[run] > 1)  # the events of runs of more than one event
    at, starts, ends, fresh = busy.tolist(), ts[busy].tolist(), end[busy].tolist(), alone[busy].tolist()
    depths = [0] * len(at)
    parents = [-1] * len(at)
    open_ends: list[int] = []
    open_at: list[int] = []
    for k, start in enumerate(starts):
        if fresh[k]:  # every open event has ended
            open_ends.clear()
            open_at.clear()
        else:
            while open_ends and open_ends[-1] <= start:
                open_ends.pop()
                open_at.pop()
            if open_at:
                depths[k] = len(open_at)
                parents[k] = open_at[-1]
        open_ends.append(ends[k])
        open_at.append(at[k])
    depth[busy] = depths
    parent[busy] = parents
    return depth, parent


def proper_nesting(ts: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """:func:`nesting` on whole arrays, exact where the stack's ends never grow from bottom to top (None otherwise).

    Then the stack, once an event's start has popped what ended, holds exactly the
    earlier events that end after that start, each at the depth it was pushed at: an
    event's depth is how many earlier events end after its start, its parent the last
    earlier event one level up. Whether the stack's ends never grow is checked as it
    would be built: each event must end by its parent's end, given that all before it did.
    """
    n = len(ts)
    at = np.arange(n, dtype=np.int64)
    # Earlier events ended by an event's start: all events that end by it, less the ones from the event on
    # (those can only be of no length, starting at the same ns).
    ended = np.searchsorted(np.sort(end), ts, side="right")
    no_length = np.r_[0, np.cumsum(end == ts)]
    ended -= no_length[np.searchsorted(ts, ts, side="right")] - no_length[:-1]
    depth = at - ended
    if (depth < 0).any():
        return None
    keys = np.sort(depth * n + at)  # by depth, then position
    inner = np.flatnonzero(depth > 0)
    found = np.searchsorted(keys, (depth[inner] - 1) * n + inner) - 1
    parent_key = keys[np.maximum(found, 0)]
    parent = np.full(n, -1, dtype=np.int64)
    parent[inner] = parent_key % n
    if ((found < 0) | (parent_key // n != depth[inner] - 1) | (end[inner] > end[parent[inner]])).any():
        return None
    return depth.astype(np.int32), parent


def _every(batch: EventBatch) -> bool:
    """Every line of a host plane is read (a thread's events each)."""
    return True


def _units(batches: Iterable[EventBatch]) -> Iterator[list[EventBatch]]:
    """The runs of each line grouped as :meth:`Space.lines` decodes them: a whole line's runs together, a big line's
    one by one."""
    unit: list[EventBatch] = []
    for batch in batches:
        unit.append(batch)
        if batch.last or not batch.whole:
            yield unit
            unit = []
    if unit:
        yield unit


class _HostRows:
    """Host rows waiting to be written, in parts (Arrow arrays or lists), in the order they were read."""

    def __init__(self, trace_id: str) -> None:
        self.trace_id = trace_id
        self.parts: list[Mapping[str, ColumnValues]] = []
        self.rows = 0

    def add(self, part: Mapping[str, ColumnValues]) -> None:
        """Hold a part (empty ones are dropped)."""
        n = len(part["event_id"]) if part else 0
        if n:
            self.parts.append(part)
            self.rows += n

    def take(self) -> Mapping[str, ColumnValues]:
        """The parts held, as one (columns of Arrow arrays, or lists), and forget them."""
        parts, self.parts, self.rows = self.parts, [], 0
        if len(parts) == 1:
            return parts[0]
        if not parts:
            return {}
        table = pa.concat_tables([arrow_table("host_ops", part, trace_id=self.trace_id) for part in parts])
        return {name: table.column(name) for name in HOST_COLUMNS}
