"""XLA profiles (``<host>.xplane.pb``, an XSpace protobuf) into the warehouse tables.

Mapping (docs/formats.md, section 2):

- ``/device:TPU:N``: the ``XLA Ops`` line -> ``device_ops`` (kind ``xla_op``); ``XLA Modules``
  wraps them and is not counted again; ``Async XLA Ops`` windows of collectives ->
  ``collectives`` (async spans); ``Steps`` -> ``steps``.
- ``/device:GPU:N``: the ``Stream #...`` lines -> ``device_ops`` (kernels, memcpys); the
  lines derived from them (``XLA Ops``, ``TensorFlow Ops``, ``XLA Modules``...) are skipped.
- ``/host:CPU``: every line is a thread -> ``host_ops`` (with nesting per line); on the
  CPU back-end, events carrying ``hlo_op`` and ``device_ordinal`` are the XLA ops ->
  ``device_ops``. Events with a ``step_num`` stat are steps when no device gives them.
  See :mod:`.xla_host`.
- ``/host:metadata``: HLO protos, for opcodes when an op has no ``hlo_category``.
- ``Task Environment``: ``profile_start_time``; line times relative to it are made absolute.

Each op's stats are its own merged with its metadata's (``flops``, ``bytes_accessed``,
``hlo_category`` live on the metadata on TPU). Each device is a rank, so one file
holds several ranks: its index, plus (multi-host runs: one xplane per host, side by
side in the run folder) the file's position among the folder's xplanes times the
devices per host, so that ranks do not collide across hosts.
"""

from __future__ import annotations

import re
from contextlib import closing
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow as pa
from isal import igzip

from tracelake.contracts.classify import Category, classify
from tracelake.contracts.errors import TraceFormatError

from . import xla_ops
from .model import ParseOptions, TraceInfo
from .source import MAX_WHOLE_BYTES, is_gzip
from .tables import BackgroundWriter, TableWriter, fit_int
from .xla_gpu import MAX_NS, STREAM_LINE, StreamRows, event_stats, steps_array
from .xla_host import HostLines
from .xla_memory import MemoryRows
from .xla_rows import as_float, as_int, as_str, as_uint, distinct_inverse, writer_options
from .xspace import EventBatch, Plane, Space

FORMAT = "xla"

_DEVICE_PLANE = re.compile(r"^/device:(TPU|GPU):(\d+)$")
#: Rows buffered before a part of ``device_ops`` is written.
FLUSH_ROWS = 200_000


def sniff(head: bytes, filename: str) -> bool:
    """An XSpace: a protobuf whose first field is a plane, with plane names we know near the start."""
    if filename.endswith((".xplane.pb", ".xplane.pb.gz")):
        return True
    if not head or head[0] not in (0x0A, 0x22):
        return False
    return any(marker in head for marker in (b"/device:", b"/host:", b"Task Environment"))


# -- the rows being built --------------------------------------------------------------

@dataclass(frozen=True)
class _Op:
    """An XLA op kind (one event metadata entry) as the tables need it."""

    name: str
    long_name: str | None
    hlo_category: str | None
    category: Category
    program: int | None
    module: str | None
    flops: float | None
    bytes_accessed: int | None
    collective: str | None
    message_bytes: int | None


class _Parser(HostLines):
    def __init__(self, space: Space, staging: Path, options: ParseOptions) -> None:
        super().__init__(staging, options, FORMAT, space.size)
        self.space = space
        self.opcodes, modules = space.hlo_opcodes()
        self.module_names = modules
        self.opcodes_by_module = {(modules.get(p, ""), name): op for (p, name), op in self.opcodes.items()}
        self.time_base = 0
        self.device_planes: list[tuple[Plane, str, int]] = []
        self.host_planes: list[Plane] = []
        self.host_rank = 0
        self._op_cache: dict[tuple[int, int], _Op] = {}
        self.host_position = 0
        self.local_index: dict[int, int] = {}
        self.memory = MemoryRows()
        #: Collective rows of the line being read, numbered when the line ends (see :meth:`_number_collectives`).
        self._line_collectives: list[dict[str, pa.Array]] = []

    # ---- overview
    def survey(self) -> None:
        for plane in self.space.planes:
            match = _DEVICE_PLANE.match(plane.name)
            if match:
                index = fit_int(int(match.group(2)), 31)  # room for the host offset added below
                if index is None:
                    raise TraceFormatError(self.source, f"device plane {plane.name!r}: index out of range",
                                           where=f"byte {plane.offset}")
                self.device_planes.append((plane, match.group(1).lower(), index))
            elif plane.name.startswith("/host:") and plane.name != "/host:metadata":
                self.host_planes.append(plane)
            elif plane.name == "Task Environment":
                start = plane.stats().get("profile_start_time")
                if isinstance(start, int) and 0 <= start < MAX_NS:
                    self.time_base = start
        # One xplane per host: ranks continue across the hosts of a run folder, in file-name order.
        offset = self.host_position * len(self.device_planes)
        self.local_index = {offset + index: index for _, _, index in self.device_planes}
        self.device_planes = [(plane, kind, offset + index) for plane, kind, index in self.device_planes]
        self.host_rank = min((rank for _, _, rank in self.device_planes), default=0)
        if not self.device_planes and not self.host_planes:
            names = ", ".join(repr(p.name) for p in self.space.planes) or "none"
            raise TraceFormatError(
                self.source, f"an XSpace with no device planes and no host planes (planes: {names}): nothing to analyse"
            )


    # ---- steps: device Steps lines, then host step annotations
    def read_device_steps(self) -> None:
        for plane, _, index in self.device_planes:
            for line in self.space.lines(plane, only="Steps"):
                origin = self._origin_ns(line) * 1000
                by_name: dict[int, int | None] = {}  # metadata id -> the step number its name gives
                for n, event in enumerate(line.events):
                    if event.metadata_id not in by_name:
                        md = plane.header.event_metadata.get(event.metadata_id)
                        digits = re.search(r"(\d+)$", str(md.display_name or md.name)) if md is not None else None
                        by_name[event.metadata_id] = fit_int(int(digits.group(1))) if digits else None
                    named = by_name[event.metadata_id]
                    if event.stats or named is None:
                        step = _step_number("", event_stats(plane, event), n) if event.stats else n
                        step = named if step == n and named is not None else step
                    else:
                        step = named
                    ts = (origin + event.offset_ps) // 1000
                    self.steps.add(index, step, ts, event.duration_ps // 1000)

    # ---- device planes
    def read_devices(self, device_ops: BackgroundWriter) -> None:
        """Device planes line by line: TPU op lines and GPU streams as arrays, the rest only counted."""
        rows = StreamRows()
        for plane, kind, index in self.device_planes:
            self.devices[index] = _device_row(plane, kind, index, self.local_index.get(index, index))
            # closed on the way out, errors included (see Space.decoded)
            with closing(self.space.decoded(plane, partial(_decoded_line, kind), stats=kind == "gpu")) as batches:
                for batch in batches:
                    if not _decoded_line(kind, batch):
                        self.events += len(batch)
                    elif kind == "gpu":
                        self._gpu_stream(plane, index, batch, rows)
                    elif str(batch.header.name) == "XLA Ops":
                        self._tpu_ops(plane, index, batch, device_ops)
                    else:
                        self._tpu_async(plane, index, batch)
                    if batch.last:
                        self._number_collectives()
                    if rows.rows >= FLUSH_ROWS:
                        self._flush_streams(rows, device_ops)
        self._number_collectives()
        self._flush_streams(rows, device_ops)

    def _flush_streams(self, rows: StreamRows, device_ops: BackgroundWriter) -> None:
        """Write the buffered GPU stream rows, after making collectives of their communication kernels."""
        self._collectives_of(rows.communication)
        for part in rows.parts:
            device_ops.write(part)
        rows.clear()

    def _number_collectives(self) -> None:
        """Give the line's collective rows their event ids, after all of the line's ops, and write them.

        So the ids do not depend on the windows the line was read in.
        """
        for part in self._line_collectives:
            n = len(part["rank"])
            part["event_id"] = pa.array(np.arange(self.next_id, self.next_id + n, dtype=np.int64))
            self.next_id += n
            self.collective_writer.write(part)
        self._line_collectives = []

    def _tpu_ops(self, plane: Plane, index: int, line: EventBatch, device_ops: BackgroundWriter) -> None:
        """The ``XLA Ops`` line, vectorised (see :meth:`_tpu_events`)."""
        decoded = self._tpu_events(plane, line)
        if decoded is None:
            return
        ops, which, ts, dur = decoded
        n = len(ts)
        steps = self.steps.steps_of(index, ts)
        first_id = self.next_id
        self.next_id += n
        self._extent(int(ts.min()), int((ts + dur).max()))
        self.steps.count_many(index, steps, ts, ts + dur)
        take = pa.array(which.astype(np.int32, copy=False))

        def per_op(values: list[object], kind: pa.DataType) -> pa.Array:
            # Strings stay dictionary-encoded (an index per row) until the writer thread casts them to the
            # declared type: a part waiting to be written holds no per-row copies of the op names and HLO text.
            if kind == pa.string():
                return pa.DictionaryArray.from_arrays(take, pa.array(values, type=kind))
            return pa.array(values, type=kind).take(take)

        table = {
            "event_id": pa.array(np.arange(first_id, first_id + n, dtype=np.int64)),
            "rank": pa.array(np.full(n, index, dtype=np.int32)),
            "device": pa.array(np.full(n, self.local_index.get(index, index), dtype=np.int32)),
            "stream": pa.array(np.full(n, int(line.header.id), dtype=np.int64)),
            "kind": pa.DictionaryArray.from_arrays(np.zeros(n, dtype=np.int32), pa.array(["xla_op"])),
            "category": per_op([o.category for o in ops], pa.string()),
            "name": per_op([o.name for o in ops], pa.string()),
            "ts_ns": pa.array(ts),
            "dur_ns": pa.array(dur),
            "step": steps_array(steps),
            "hlo_module": per_op([o.module for o in ops], pa.string()),
            "program_id": per_op([o.program for o in ops], pa.uint64()),
            "hlo_category": per_op([o.hlo_category for o in ops], pa.string()),
            "long_name": per_op([o.long_name for o in ops], pa.string()),
            "flops": per_op([o.flops for o in ops], pa.float64()),
            "bytes_accessed": per_op([o.bytes_accessed for o in ops], pa.int64()),
        }
        device_ops.write(table)
        self._tpu_collectives(index, int(line.header.id), ops, which, ts, dur, steps, first_id)

    def _tpu_events(
        self, plane: Plane, line: EventBatch
    ) -> tuple[list[_Op], np.ndarray, np.ndarray, np.ndarray] | None:
        """A run of a TPU line's events as arrays: the op kinds, each event's kind, start and duration (ns).

        None if the run is empty. Per event only three integers are read (decoded in
        bulk, see :mod:`.xspace_events`); everything else is per op kind.
        """
        n = len(line)
        self.events += n
        if not n:
            return None
        fields = line.fields()
        kinds, which = distinct_inverse(fields.metadata_id)
        ops = [self._tpu_op(plane, int(mid)) for mid in kinds]
        ts = self._origin_ns(line.header) + fields.offset_ps // 1000  # whole ns: floor((origin * 1000 + ps) / 1000)
        return ops, which, ts, np.maximum(fields.duration_ps // 1000, 0)

    def _tpu_op(self, plane: Plane, metadata_id: int) -> _Op:
        """What one event metadata entry says about its op (computed once per entry)."""
        found = self._op_cache.get((plane.position, metadata_id))
        if found is not None:
            return found
        md = plane.header.event_metadata.get(metadata_id)
        mstats = plane.metadata_stats(metadata_id)
        name = str(md.display_name or md.name) if md is not None else ""
        long_name = str(md.name) if md is not None else None
        hlo_category = as_str(mstats.get("hlo_category"))
        program = as_uint(mstats.get("program_id"))
        if hlo_category is None and program is not None:
            hlo_category = self.opcodes.get((program, name))
        if hlo_category is None:
            hlo_category = xla_ops.opcode_of(name)
        bytes_accessed = as_int(mstats.get("bytes_accessed"))
        collective = xla_ops.collective_name(hlo_category)
        op = _Op(
            name=name, long_name=long_name, hlo_category=hlo_category,
            category=classify("xla_op", name, hlo_category),
            program=program, module=self.module_names.get(program) if program is not None else None,
            flops=as_float(mstats.get("flops")), bytes_accessed=bytes_accessed, collective=collective,
            message_bytes=xla_ops.message_bytes(xla_ops.result_bytes(long_name), bytes_accessed)
            if collective else None,
        )
        self._op_cache[(plane.position, metadata_id)] = op
        return op

    def _tpu_async(self, plane: Plane, index: int, line: EventBatch) -> None:
        """``Async XLA Ops`` windows of collectives become async spans in ``collectives`` (copies are left out)."""
        decoded = self._tpu_events(plane, line)
        if decoded is None:
            return
        ops, which, ts, dur = decoded
        self._tpu_collectives(index, int(line.header.id), ops, which, ts, dur, self.steps.steps_of(index, ts), 0,
                              is_async=True)

    def _tpu_collectives(
        self, rank: int, stream: int, ops: list[_Op], which: np.ndarray, ts: np.ndarray, dur: np.ndarray,
        steps: np.ndarray, first_id: int, *, is_async: bool = False,
    ) -> None:
        """Each collective op (or async window) of a line is a ``collectives`` row; seq counts per (chip, module)."""
        rows = np.flatnonzero(np.array([o.collective is not None for o in ops], dtype=bool)[which])
        if not len(rows):
            return
        kinds = which[rows]
        prefix = "async:" if is_async else ""
        groups = [prefix + (o.module or str(o.program or "")) for o in ops]
        group_of_row = np.array([groups[k] for k in kinds.tolist()], dtype=object)
        seq = np.empty(len(rows), dtype=np.int64)
        for group in dict.fromkeys(group_of_row.tolist()):
            members = np.flatnonzero(group_of_row == group)  # in time order within the line
            start = self.collective_seq.get((rank, group), 0)
            seq[members] = start + 1 + np.arange(len(members))
            self.collective_seq[(rank, group)] = start + len(members)
        take = pa.array(kinds)
        self._line_collectives.append({
            "rank": pa.array(np.full(len(rows), rank, dtype=np.int32)),
            "collective": pa.array([o.collective for o in ops], type=pa.string()).take(take),
            "process_group": pa.array(group_of_row.tolist(), type=pa.string()),
            "seq": pa.array(seq),
            "message_bytes": pa.array([o.message_bytes for o in ops], type=pa.int64()).take(take),
            "ts_ns": pa.array(ts[rows]),
            "dur_ns": pa.array(dur[rows]),
            "kernel_event_id": pa.nulls(len(rows), pa.int64()) if is_async else pa.array(first_id + rows),
            "kernel_name": pa.array([o.name for o in ops], type=pa.string()).take(take),
            "stream": pa.array(np.full(len(rows), stream, dtype=np.int64)),
            "step": steps_array(steps[rows]),
            "is_async": pa.array(np.full(len(rows), is_async, dtype=bool)),
            "source": pa.array(["xla"] * len(rows), type=pa.string()),
        })


def _decoded_line(kind: str, batch: EventBatch) -> bool:
    """Whether :meth:`_Parser.read_devices` reads the events of the batch's line on a ``kind`` plane (TPU: its
    ops and async ops; GPU: its streams), decoded ahead; the others are only counted."""
    name = str(batch.header.name)
    if kind == "tpu":
        return name in ("XLA Ops", "Async XLA Ops")
    return kind == "gpu" and STREAM_LINE.match(name) is not None


# ---- the small tables and the trace facts
def _device_row(plane: Plane, kind: str, rank: int, index: int) -> dict[str, object]:
    stats = plane.stats()
    row: dict[str, object] = {"rank": rank, "device": index, "kind": kind}
    row["name"] = as_str(stats.get("device_type_string")) or (
        f"{stats['device_vendor']} GPU" if stats.get("device_vendor") else None)
    row["vendor"] = as_str(stats.get("device_vendor")) or ("Google" if kind == "tpu" else None)
    row["peak_tflops"] = as_float(stats.get("peak_teraflops_per_second"))
    hbm = as_float(stats.get("peak_hbm_bw_gigabytes_per_second"))
    bandwidth = as_float(stats.get("memory_bandwidth"))  # bytes/s on GPU planes
    row["peak_hbm_gbps"] = hbm if hbm is not None else (bandwidth / 1e9 if bandwidth else None)
    row["core_count"] = as_int(stats.get("core_count"))
    clock = as_float(stats.get("clock_rate"))  # kHz
    row["clock_mhz"] = clock / 1000 if clock else None
    row["memory_bytes"] = as_int(stats.get("memory_size"))
    major, minor = stats.get("compute_cap_major"), stats.get("compute_cap_minor")
    row["compute_capability"] = f"{major}.{minor}" if major is not None and minor is not None else None
    return row


def _unknown_stats(space: Space) -> str | None:
    """A warning counting the stats that refer to stat metadata ids their plane does not declare (None if none)."""
    counts: dict[int, int] = {}
    planes = []
    for plane in space.planes:
        if plane.unknown_stat_ids:
            planes.append(plane.name)
        for metadata_id, n in plane.unknown_stat_ids.items():
            counts[metadata_id] = counts.get(metadata_id, 0) + n
    if not counts:
        return None
    ids = ", ".join(str(i) for i in sorted(counts)[:5]) + (", ..." if len(counts) > 5 else "")
    return (f"{sum(counts.values()):,} stats refer to stat metadata ids that their plane does not declare "
            f"(ids {ids}; planes {', '.join(repr(p) for p in planes[:3])}{', ...' if len(planes) > 3 else ''}): "
            "ignored")


def _step_number(name: str, stats: dict[str, object], position: int) -> int:
    for key in ("step_num", "group_id", "step_id"):
        value = as_int(stats.get(key))
        if value is not None:
            return value
    digits = re.search(r"(\d+)$", name)
    number = fit_int(int(digits.group(1))) if digits else None
    return number if number is not None else position


def _host_position(source: Path) -> int:
    """This file's place among the ``*.xplane.pb`` of its folder (one per host of a multi-host run)."""
    try:
        names = sorted(p.name for p in source.parent.iterdir() if p.name.endswith((".xplane.pb", ".xplane.pb.gz")))
    except OSError:
        return 0
    return names.index(source.name) if source.name in names else 0


#: A gzipped XSpace may expand to this many times its compressed size (protobuf compresses some 5-20 fold)...
GZIP_MAX_RATIO = 64
#: ...and in any case to this much (small profiles compress best; the cap on formats read whole); past
#: both it is taken for a gzip bomb, before it fills the staging disk.
GZIP_MIN_LIMIT = MAX_WHOLE_BYTES


def _gunzip(source: Path, target: Path, name: str) -> None:
    """Decompress ``source`` into ``target``, up to :data:`GZIP_MAX_RATIO` times its size (or :data:`GZIP_MIN_LIMIT`).

    Raises:
        TraceFormatError: damaged or truncated gzip data, or more than the limit once decompressed
            (``target`` is removed then).
    """
    limit = max(GZIP_MIN_LIMIT, GZIP_MAX_RATIO * source.stat().st_size)
    written = 0
    try:
        with igzip.open(source, "rb") as compressed, open(target, "wb") as out:
            while True:
                try:
                    block = compressed.read(8 << 20)
                except (OSError, EOFError) as exc:  # igzip: EOFError when truncated, OSError when damaged
                    raise TraceFormatError(name, f"damaged gzip data ({exc})",
                                           where=f"decompressed byte {written:,}") from None
                if not block:
                    return
                written += len(block)
                if written > limit:
                    raise TraceFormatError(
                        name, f"expands to more than {limit >> 20:,} MB ({GZIP_MAX_RATIO}x its compressed size, at "
                        f"least {GZIP_MIN_LIMIT >> 20:,} MB): a gzip bomb? (ingest it decompressed if it is genuine)",
                        where=f"decompressed byte {limit:,}")
                out.write(block)
    except BaseException:
        target.unlink(missing_ok=True)
        raise


def _open(source: Path, staging: Path, name: str) -> Space:
    """Open the XSpace, decompressing a gzipped one into the staging directory first (see :func:`_gunzip`)."""
    if not is_gzip(source):
        return Space(source, name)
    plain = staging / "xplane.pb"
    _gunzip(source, plain, name)
    return Space(plain, name)


def parse(source: Path, staging: Path, options: ParseOptions) -> TraceInfo:
    """Parse one ``.xplane.pb`` into ``<table>.parquet`` files in ``staging``.

    Raises:
        TraceFormatError: not an XSpace, damaged, or without device and host planes.
    """
    with _open(source, staging, options.source_name) as space:
        parser = _Parser(space, staging, options)
        parser.host_position = _host_position(source)
        parser.survey()
        parser.read_device_steps()
        with BackgroundWriter(TableWriter(staging, "device_ops", trace_id=options.trace_id, dictionaries=True,
                                          **writer_options("device_ops"))) as device_ops:
            parser.read_hosts(device_ops)
            parser.read_devices(device_ops)
        if not device_ops.rows and not parser.device_planes:
            raise TraceFormatError(options.source_name, "an XSpace with no device planes and no XLA ops on the "
                                   "host (a profile of the host only?): nothing to analyse")
        parser.hostnames = space.hostnames
        memory_warnings = parser.memory.write(staging, options.trace_id, parser.devices, parser.steps,
                                              parser.host_position * len(parser.device_planes))
        info = parser.finish(device_ops.rows)
        info.warnings.extend(memory_warnings)
        unknown = _unknown_stats(space)
        if unknown:
            info.warnings.append(unknown)
        if parser.host_position:
            info.rank_source = f"device index + host {parser.host_position} of the run folder"
    if options.on_bytes is not None:
        options.on_bytes(source.stat().st_size)
    (staging / "xplane.pb").unlink(missing_ok=True)
    return info
