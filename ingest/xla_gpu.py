"""The GPU part of the XLA parser: ``Stream #`` lines of ``/device:GPU:N`` planes into ``device_ops``.

GPU kernels carry their details (``hlo_op``, ``hlo_module``, ``program_id``,
``correlation_id``, ``hlo_category``) as stats of each event, not of shared event
metadata as TPU ops do. A run of a stream line is decoded in bulk: per event only
integers are read (ids, times, and the stats as metadata id, kind and value), and
the strings an event refers to are looked at once per distinct combination
(:meth:`GpuStreams.gpu_columns`). Damaged or unusual data falls back to protobuf,
one event at a time (:meth:`GpuStreams._gpu_ops`), which decodes it or says what is
wrong. The parser itself is :mod:`tracelake.ingest.xla`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from tracelake.contracts.classify import Category, classify, op_kind
from tracelake.contracts.errors import TraceFormatError

from . import xla_ops
from .tables import ColumnValues
from .xla_rows import DEVICE_COLUMNS, Columns, RowBuilder, as_int, as_str, as_uint, distinct_inverse, stat_ints
from .xspace import EventBatch, Plane

STREAM_LINE = re.compile(r"^Stream #(\d+)")
#: Line timestamps below this (about 1973 in epoch ns) are relative to the profile start.
RELATIVE_BEFORE_NS = 10**17
#: Line origins (ns) must lie within this of zero (year 2116), so that ns plus ps stays within 64 bits.
MAX_NS = 1 << 62


class GpuStreams(RowBuilder):
    """Row building for GPU stream lines; the XLA parser (:mod:`tracelake.ingest.xla`) derives from it."""

    #: Set by the parser: the profile start (``Task Environment``), HLO opcodes by (program, instruction)
    #: and by (module, instruction), and each rank's device index on its host.
    time_base: int
    opcodes: dict[tuple[int, str], str]
    opcodes_by_module: dict[tuple[str, str], str]
    local_index: dict[int, int]

    def _origin_ns(self, line: Any) -> int:
        """The epoch ns a line's event offsets count from (TPU lines too); relative times get the profile start."""
        ts = int(line.timestamp_ns)
        origin = ts + self.time_base if ts < RELATIVE_BEFORE_NS else ts
        if not -MAX_NS < origin < MAX_NS:  # picoseconds added to it would not fit 64-bit nanoseconds
            raise TraceFormatError(self.source, f"line {str(line.name)!r}: timestamp_ns {ts} is out of range "
                                   "(not nanoseconds since the epoch or the profile start)")
        return origin

    def _gpu_stream(self, plane: Plane, index: int, batch: EventBatch, rows: StreamRows) -> None:
        """A run of a GPU ``Stream #`` line: decoded in bulk (:meth:`gpu_columns`), or, where that fails
        (damaged or unusual data), through protobuf (:meth:`_gpu_ops`), which decodes it or says what is wrong."""
        try:
            decoded = self.gpu_columns(plane, index, batch)
        except (TraceFormatError, UnicodeDecodeError):
            one_by_one = Columns(DEVICE_COLUMNS)
            self._gpu_ops(plane, index, batch.xline(), one_by_one)
            rows.add_lists(one_by_one.take())
            return
        if decoded is not None:
            rows.add(*decoded)

    def gpu_columns(
        self, plane: Plane, index: int, batch: EventBatch
    ) -> tuple[dict[str, pa.Array], np.ndarray, dict[str, list[object]]] | None:
        """The device op rows of a run of a GPU stream, as :meth:`_gpu_ops` makes them: Arrow arrays (strings
        dictionary-encoded), which rows are communication kernels, and those rows as lists (for the collectives).

        Per event only integers are read in bulk (ids, times, and the stats as
        metadata id, kind and value); the strings an event refers to (its kernel
        name, ``hlo_op``, ``hlo_module``...) are looked at once per distinct combination.
        None if the run is empty. Nothing is changed (ids, steps, counts) unless it succeeds.

        Raises:
            TraceFormatError, UnicodeDecodeError: data the bulk decoder does not take.
        """
        origin = self._origin_ns(batch.header)
        n = len(batch)
        if not n:
            return None
        fields = batch.fields()
        stats = batch.stats(plane, fields)
        stats.check_strings()
        named = {key: stats.values(stats.last(key))
                 for key in ("hlo_module", "hlo_op", "program_id", "hlo_category")}
        correlation, has_correlation = stat_ints(stats, "correlation_id")
        kinds, which_kind = distinct_inverse(fields.metadata_id)
        keys = np.stack([which_kind.reshape(-1)] + [codes for _, codes in named.values()])
        combos, which = distinct_columns(keys)
        kernel_names = [self._kernel_name(plane, int(k)) for k in kinds.tolist()]
        ops = [self._gpu_op(kernel_names[c[0]], *(values[code] if code >= 0 else None
                                                 for (values, _), code in zip(named.values(), c[1:], strict=True)))
               for c in combos.T.tolist()]
        ts = origin + fields.offset_ps // 1000  # whole ns: floor((origin * 1000 + ps) / 1000)
        dur = np.maximum(fields.duration_ps // 1000, 0)
        steps = self.steps.steps_of(index, ts)
        match = STREAM_LINE.match(str(batch.header.name))
        stream = int(match.group(1)) if match else int(batch.header.id)

        stats.count_unknown()
        self.events += n
        first_id = self.next_id
        self.next_id += n
        self._extent(int(ts.min()), int((ts + dur).max()))
        self.steps.count_many(index, steps, ts, ts + dur)
        take = pa.array(which.astype(np.int32, copy=False))

        def per_op(i: int, kind: pa.DataType = pa.string()) -> pa.Array:
            # Strings stay dictionary-encoded until the writer thread casts them (as for TPU ops).
            values = pa.array([op[i] for op in ops], type=kind)
            return pa.DictionaryArray.from_arrays(take, values) if kind == pa.string() else values.take(take)

        table = {
            "event_id": pa.array(np.arange(first_id, first_id + n, dtype=np.int64)),
            "rank": pa.array(np.full(n, index, dtype=np.int32)),
            "device": pa.array(np.full(n, self.local_index.get(index, index), dtype=np.int32)),
            "stream": pa.array(np.full(n, stream, dtype=np.int64)),
            "kind": per_op(0), "category": per_op(1), "name": per_op(2),
            "ts_ns": pa.array(ts), "dur_ns": pa.array(dur),
            "correlation": pa.array(correlation, mask=~has_correlation, type=pa.int64()),
            "step": steps_array(steps),
            "hlo_module": per_op(3), "program_id": per_op(4, pa.uint64()), "hlo_category": per_op(5),
            "long_name": per_op(6),
        }
        communication = np.flatnonzero(np.array([op[1] == Category.COMMUNICATION for op in ops], dtype=bool)[which])
        comm_rows = {name: table[name].take(pa.array(communication)).to_pylist()
                     for name in _COLLECTIVE_INPUTS}
        return table, communication, comm_rows

    def _kernel_name(self, plane: Plane, metadata_id: int) -> str:
        md = plane.header.event_metadata.get(metadata_id)
        return str(md.display_name or md.name) if md is not None else ""

    def _gpu_op(
        self, name: str, module_stat: object, hlo_op_stat: object, program_stat: object, category_stat: object,
    ) -> tuple[str, str, str, str | None, int | None, str | None, str | None]:
        """What a kernel's name and stats make of it: (kind, category, name, module, program, hlo_category, hlo_op)."""
        module = as_str(module_stat)
        hlo_op = as_str(hlo_op_stat)
        program = as_uint(program_stat)
        hlo_category = as_str(category_stat)
        if hlo_category is None and hlo_op is not None:
            hlo_category = (self.opcodes.get((program, hlo_op)) if program is not None else None) \
                or self.opcodes_by_module.get((module or "", hlo_op)) or xla_ops.opcode_of(hlo_op)
        kind = op_kind(name)
        return kind, classify(kind, name, hlo_category), name, module, program, hlo_category, hlo_op

    def _gpu_ops(self, plane: Plane, index: int, line: Any, rows: Columns) -> None:
        """A GPU stream's events one by one through protobuf (see :meth:`_gpu_stream`)."""
        origin = self._origin_ns(line) * 1000
        match = STREAM_LINE.match(str(line.name))
        stream = int(match.group(1)) if match else int(line.id)
        for event in line.events:
            self.events += 1
            md = plane.header.event_metadata.get(event.metadata_id)
            name = str(md.display_name or md.name) if md is not None else ""
            stats = event_stats(plane, event)
            module = as_str(stats.get("hlo_module"))
            hlo_op = as_str(stats.get("hlo_op"))
            program = as_uint(stats.get("program_id"))
            hlo_category = as_str(stats.get("hlo_category"))
            if hlo_category is None and hlo_op is not None:
                hlo_category = (self.opcodes.get((program, hlo_op)) if program is not None else None) \
                    or self.opcodes_by_module.get((module or "", hlo_op)) or xla_ops.opcode_of(hlo_op)
            ts = (origin + event.offset_ps) // 1000
            dur = max(event.duration_ps // 1000, 0)
            kind = op_kind(name)
            category = classify(kind, name, hlo_category)
            self._device_row(rows, self._event_id(), index, self.local_index.get(index, index), stream, kind,
                             category, name, ts, dur,
                             as_int(stats.get("correlation_id")), module, program, hlo_category,
                             hlo_op, None, None)


#: The device op columns :meth:`RowBuilder._collectives_of` reads.
_COLLECTIVE_INPUTS = ("event_id", "rank", "category", "name", "ts_ns", "dur_ns", "step", "stream", "hlo_module",
                      "program_id", "hlo_category", "long_name")


class StreamRows:
    """GPU stream rows waiting to be written, and their communication kernels as lists.

    Collectives are made (and numbered) from the communication rows when the rows
    are written, every :data:`FLUSH_ROWS` rows, as when every row was held as lists.
    """

    def __init__(self) -> None:
        self.parts: list[Mapping[str, ColumnValues]] = []
        self.rows = 0
        self.communication = Columns(DEVICE_COLUMNS)

    def add(self, part: Mapping[str, ColumnValues], communication: np.ndarray, lists: dict[str, list[object]]) -> None:
        """Buffer a part; ``lists`` are its ``communication`` rows (indices) in the :data:`_COLLECTIVE_INPUTS`."""
        self.parts.append(part)
        self.rows += len(part["event_id"])
        data = self.communication.data
        for name in DEVICE_COLUMNS:
            data[name].extend(lists[name] if name in lists else [None] * len(communication))

    def add_lists(self, part: dict[str, list[object]]) -> None:
        """Buffer a part of column lists."""
        rows = [i for i, c in enumerate(part["category"]) if c == Category.COMMUNICATION]
        self.add(part, np.array(rows, dtype=np.int64), {k: [part[k][i] for i in rows] for k in DEVICE_COLUMNS})

    def clear(self) -> None:
        """Forget the buffered parts (they have been written)."""
        self.parts = []
        self.rows = 0
        self.communication.take()


def distinct_columns(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(keys, axis=1, return_inverse=True)`` (the inverse flat) for rows of integer codes from -1 up, about
    10x faster: each column's codes are packed into one int64 (mixed radix, which keeps their order) when that fits,
    and only those are sorted."""
    sizes = keys.max(axis=1).astype(np.int64) + 2  # codes run from -1
    if float(np.prod(sizes.astype(np.float64))) >= 2.0**62:
        combos, which = np.unique(keys, axis=1, return_inverse=True)
        return combos, which.reshape(-1)
    packed = np.zeros(keys.shape[1], dtype=np.int64)
    for row, size in zip(keys, sizes.tolist(), strict=True):
        packed = packed * size + (row.astype(np.int64) + 1)
    _, first, which = np.unique(packed, return_index=True, return_inverse=True)
    return keys[:, first], which.reshape(-1)


def steps_array(steps: np.ndarray) -> pa.Array:
    """Step numbers with -1 (outside every step) as null."""
    return pa.array(steps, mask=steps < 0, type=pa.int64())


def event_stats(plane: Plane, event: Any) -> dict[str, object]:
    """A protobuf event's stats by name."""
    return plane.named_stats(event.stats)
