"""XLA profiles (``<host>.xplane.pb``, an XSpace protobuf) into the warehouse tables.

Mapping (FORMATS.md section 2):

- ``/device:TPU:N``: the ``XLA Ops`` line -> ``device_ops`` (kind ``xla_op``); ``XLA Modules``
  wraps them and is not counted again; ``Async XLA Ops`` windows of collectives ->
  ``collectives`` (async spans); ``Steps`` -> ``steps``.
- ``/device:GPU:N``: the ``Stream #...`` lines -> ``device_ops`` (kernels, memcpys); the
  lines derived from them (``XLA Ops``, ``TensorFlow Ops``, ``XLA Modules``...) are skipped.
- ``/host:CPU``: every line is a thread -> ``host_ops`` (with nesting per line); on the
  CPU back-end, events carrying ``hlo_op`` and ``device_ordinal`` are the XLA ops ->
  ``device_ops``. Events with a ``step_num`` stat are steps when no device gives them.
- ``/host:metadata``: HLO protos, for opcodes when an op has no ``hlo_category``.
- ``Task Environment``: ``profile_start_time``; line times relative to it are made absolute.

Each op's stats are its own merged with its metadata's (``flops``, ``bytes_accessed``,
``hlo_category`` live on the metadata on TPU). A trace's rank is the device index
(``rank`` in every table), so one file holds several ranks.
"""

from __future__ import annotations

import bisect
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from isal import igzip

from tracelake.warehouse.errors import TraceFormatError

from . import xla_ops
from .model import ParseOptions, TraceInfo
from .tables import TableWriter, write_table
from .xspace import Plane, Space, stat_value

FORMAT = "xla"

_DEVICE_PLANE = re.compile(r"^/device:(TPU|GPU):(\d+)$")
_STREAM_LINE = re.compile(r"^Stream #(\d+)")
_PROGRAM_IN_NAME = re.compile(r"\((\d+)\)$")
#: Rows buffered before a part of ``device_ops`` is written.
FLUSH_ROWS = 200_000
#: Line timestamps below this (about 1973 in epoch ns) are relative to the profile start.
_RELATIVE_BEFORE_NS = 10**17


def sniff(head: bytes, filename: str) -> bool:
    """An XSpace: a protobuf whose first field is a plane, with plane names we know near the start."""
    if filename.endswith((".xplane.pb", ".xplane.pb.gz")):
        return True
    if not head or head[0] not in (0x0A, 0x22):
        return False
    return any(marker in head for marker in (b"/device:", b"/host:", b"Task Environment"))


# -- the rows being built --------------------------------------------------------------

@dataclass
class _Columns:
    """Column lists of one table, appended row by row."""

    names: tuple[str, ...]
    data: dict[str, list[object]] = field(init=False)

    def __post_init__(self) -> None:
        self.data = {n: [] for n in self.names}

    def __len__(self) -> int:
        return len(self.data[self.names[0]])

    def take(self) -> dict[str, list[object]]:
        data, self.data = self.data, {n: [] for n in self.names}
        return data


_DEVICE_COLUMNS = (
    "event_id", "rank", "device", "stream", "kind", "category", "name", "ts_ns", "dur_ns", "correlation",
    "step", "bytes", "hlo_module", "program_id", "hlo_category", "long_name", "flops", "bytes_accessed",
)
_HOST_COLUMNS = ("event_id", "rank", "pid", "tid", "cat", "name", "ts_ns", "dur_ns", "depth", "parent_id",
                 "correlation", "step")
_COLLECTIVE_COLUMNS = ("event_id", "rank", "collective", "process_group", "seq", "message_bytes", "ts_ns",
                       "dur_ns", "kernel_event_id", "kernel_name", "stream", "step", "is_async")


@dataclass
class _Steps:
    """Step windows per rank (``None``: for every rank of the file), and device figures per step."""

    windows: dict[int | None, list[tuple[int, int, int]]] = field(default_factory=dict)
    device: dict[tuple[int, int], list[int]] = field(default_factory=dict)

    def add(self, rank: int | None, step: int, ts_ns: int, dur_ns: int) -> None:
        self.windows.setdefault(rank, []).append((ts_ns, dur_ns, step))

    def finish(self) -> None:
        for windows in self.windows.values():
            windows.sort()

    def step_at(self, rank: int | None, ts_ns: int) -> int | None:
        windows = self.windows.get(rank) if rank in self.windows else self.windows.get(None)
        if not windows:
            return None
        i = bisect.bisect_right(windows, (ts_ns, float("inf"), 0)) - 1
        if i < 0:
            return None
        start, dur, step = windows[i]
        return step if ts_ns < start + dur else None

    def count(self, rank: int, step: int | None, ts_ns: int, end_ns: int) -> None:
        if step is None:
            return
        figures = self.device.get((rank, step))
        if figures is None:
            self.device[(rank, step)] = [ts_ns, end_ns, 1]
        else:
            figures[0] = min(figures[0], ts_ns)
            figures[1] = max(figures[1], end_ns)
            figures[2] += 1


# -- parsing ---------------------------------------------------------------------------

class _Parser:
    def __init__(self, space: Space, staging: Path, options: ParseOptions) -> None:
        self.space = space
        self.staging = staging
        self.options = options
        self.source = options.source_name
        self.next_id = 0
        self.events = 0
        self.steps = _Steps()
        self.opcodes, modules = space.hlo_opcodes()
        self.module_names = modules
        self.opcodes_by_module = {(modules.get(p, ""), name): op for (p, name), op in self.opcodes.items()}
        self.time_base = 0
        self.devices: dict[int, dict[str, object]] = {}
        self.device_planes: list[tuple[Plane, str, int]] = []
        self.host_planes: list[Plane] = []
        self.first_ns: int | None = None
        self.last_ns: int | None = None
        self.collective_seq: dict[tuple[int, str], int] = {}
        self.collectives = _Columns(_COLLECTIVE_COLUMNS)
        self.info = TraceInfo(format=FORMAT, uncompressed_bytes=space.size)

    # ---- overview
    def survey(self) -> None:
        for plane in self.space.planes:
            match = _DEVICE_PLANE.match(plane.name)
            if match:
                self.device_planes.append((plane, match.group(1).lower(), int(match.group(2))))
            elif plane.name.startswith("/host:") and plane.name != "/host:metadata":
                self.host_planes.append(plane)
            elif plane.name == "Task Environment":
                start = plane.stats().get("profile_start_time")
                if isinstance(start, int):
                    self.time_base = start
        self.host_rank = min((index for _, _, index in self.device_planes), default=0)
        if not self.device_planes and not self.host_planes:
            names = ", ".join(repr(p.name) for p in self.space.planes) or "none"
            raise TraceFormatError(self.source, f"an XSpace with no device or host planes (planes: {names})")

    def _origin_ns(self, line: Any) -> int:
        ts = int(line.timestamp_ns)
        return ts + self.time_base if ts < _RELATIVE_BEFORE_NS else ts

    def _event_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def _extent(self, ts_ns: int, end_ns: int) -> None:
        if self.first_ns is None or ts_ns < self.first_ns:
            self.first_ns = ts_ns
        if self.last_ns is None or end_ns > self.last_ns:
            self.last_ns = end_ns

    # ---- steps: device Steps lines, then host step annotations
    def read_device_steps(self) -> None:
        for plane, _, index in self.device_planes:
            for line in self.space.lines(plane, only="Steps"):
                origin = self._origin_ns(line) * 1000
                for n, event in enumerate(line.events):
                    md = plane.header.event_metadata.get(event.metadata_id)
                    name = str(md.display_name or md.name) if md is not None else ""
                    step = _step_number(name, _event_stats(plane, event), n)
                    ts = (origin + event.offset_ps) // 1000
                    self.steps.add(index, step, ts, event.duration_ps // 1000)

    # ---- host planes
    def read_hosts(self, device_ops: TableWriter) -> None:
        rows = _Columns(_HOST_COLUMNS)
        cpu_ops = _Columns(_DEVICE_COLUMNS)
        host_steps = not self.steps.windows
        for plane in self.host_planes:
            pid = plane.stats().get("process_id")
            for line in self.space.lines(plane):
                self._host_line(plane, line, pid if isinstance(pid, int) else None, rows, cpu_ops, host_steps)
        self.steps.finish()
        ranks = sorted({int(r) for r in cpu_ops.data["rank"]})  # type: ignore[call-overload]
        for i, ts in enumerate(rows.data["ts_ns"]):
            rows.data["step"][i] = self.steps.step_at(None, ts)  # type: ignore[arg-type]
        for i, ts in enumerate(cpu_ops.data["ts_ns"]):
            rank = int(cpu_ops.data["rank"][i])  # type: ignore[call-overload]
            step = self.steps.step_at(rank, ts)  # type: ignore[arg-type]
            cpu_ops.data["step"][i] = step
            self.steps.count(rank, step, ts, ts + int(cpu_ops.data["dur_ns"][i]))  # type: ignore[call-overload,operator]
        self._collectives_of(cpu_ops)
        device_ops.write(cpu_ops.take())
        for rank in ranks:
            self.devices.setdefault(rank, {"rank": rank, "device": rank, "kind": "cpu", "name": "XLA CPU device"})
        write_table(self.staging, "host_ops", rows.take(), trace_id=self.options.trace_id)

    def _host_line(
        self, plane: Plane, line: Any, pid: int | None, rows: _Columns, cpu_ops: _Columns, host_steps: bool
    ) -> None:
        origin = self._origin_ns(line) * 1000
        thread = str(line.name).rsplit("/", 1)[0] or str(line.name)
        order = sorted(range(len(line.events)), key=lambda i: (line.events[i].offset_ps, -line.events[i].duration_ps))
        stack: list[tuple[int, int]] = []  # (end_ns, event_id) of open events
        for i in order:
            event = line.events[i]
            self.events += 1
            md = plane.header.event_metadata.get(event.metadata_id)
            name = str(md.display_name or md.name) if md is not None else ""
            ts = (origin + event.offset_ps) // 1000
            dur = max(event.duration_ps // 1000, 0)
            stats = _event_stats(plane, event) if event.stats else {}
            event_id = self._event_id()
            self._extent(ts, ts + dur)
            if "hlo_op" in stats and "device_ordinal" in stats:
                self._cpu_op(plane, event_id, name, ts, dur, stats, line, cpu_ops)
                continue
            if host_steps and "step_num" in stats:
                step = _as_int(stats["step_num"])
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
            data["correlation"].append(_as_int(stats.get("correlation_id")))
            data["step"].append(None)
            stack.append((ts + dur, event_id))

    def _cpu_op(
        self, plane: Plane, event_id: int, name: str, ts: int, dur: int, stats: dict[str, object], line: Any,
        out: _Columns,
    ) -> None:
        rank = _as_int(stats.get("device_ordinal")) or 0
        module = _as_str(stats.get("hlo_module"))
        hlo_op = _as_str(stats.get("hlo_op")) or name
        opcode = self.opcodes_by_module.get((module or "", hlo_op)) or xla_ops.opcode_of(hlo_op)
        hlo_category = _as_str(stats.get("hlo_category")) or opcode
        self._device_row(out, event_id, rank, rank, int(line.id), "xla_op", xla_ops.category(hlo_category, name),
                         name, ts, dur, None, module, _as_uint(stats.get("program_id")), hlo_category, None,
                         _as_float(stats.get("flops")), _as_int(stats.get("bytes_accessed")))

    # ---- device planes
    def read_devices(self, device_ops: TableWriter) -> None:
        rows = _Columns(_DEVICE_COLUMNS)
        for plane, kind, index in self.device_planes:
            self.devices[index] = _device_row(plane, kind, index)
            for line in self.space.lines(plane):
                if kind == "tpu" and line.name == "XLA Ops":
                    self._tpu_ops(plane, index, line, rows)
                elif kind == "tpu" and line.name == "Async XLA Ops":
                    self._tpu_async(plane, index, line)
                elif kind == "gpu" and _STREAM_LINE.match(str(line.name)):
                    self._gpu_ops(plane, index, line, rows)
                else:
                    self.events += len(line.events)
                if len(rows) >= FLUSH_ROWS:
                    self._collectives_of(rows)
                    device_ops.write(rows.take())
        self._collectives_of(rows)
        device_ops.write(rows.take())

    def _tpu_ops(self, plane: Plane, index: int, line: Any, rows: _Columns) -> None:
        origin = self._origin_ns(line) * 1000
        stream = int(line.id)
        for event in line.events:
            self.events += 1
            md = plane.header.event_metadata.get(event.metadata_id)
            mstats = plane.metadata_stats(event.metadata_id)
            name = str(md.display_name or md.name) if md is not None else ""
            long_name = str(md.name) if md is not None else None
            hlo_category = _as_str(mstats.get("hlo_category"))
            program = _as_uint(mstats.get("program_id"))
            if hlo_category is None and program is not None:
                hlo_category = self.opcodes.get((program, name))
            ts = (origin + event.offset_ps) // 1000
            dur = max(event.duration_ps // 1000, 0)
            self._device_row(rows, self._event_id(), index, index, stream, "xla_op",
                             xla_ops.category(hlo_category, name), name, ts, dur, None,
                             self.module_names.get(program) if program is not None else None, program,
                             hlo_category, long_name, _as_float(mstats.get("flops")),
                             _as_int(mstats.get("bytes_accessed")))

    def _tpu_async(self, plane: Plane, index: int, line: Any) -> None:
        """``Async XLA Ops`` windows of collectives become async spans in ``collectives``."""
        origin = self._origin_ns(line) * 1000
        for event in line.events:
            self.events += 1
            mstats = plane.metadata_stats(event.metadata_id)
            md = plane.header.event_metadata.get(event.metadata_id)
            collective = xla_ops.collective_name(_as_str(mstats.get("hlo_category")))
            if collective is None or md is None:
                continue  # async copies and other non-collective windows
            ts = (origin + event.offset_ps) // 1000
            program = _as_uint(mstats.get("program_id"))
            module = self.module_names.get(program) if program is not None else None
            data = self.collectives.data
            data["event_id"].append(self._event_id())
            data["rank"].append(index)
            data["collective"].append(collective)
            data["process_group"].append(f"async:{module or program or ''}")
            data["seq"].append(self._seq(index, f"async:{module or program or ''}"))
            data["message_bytes"].append(xla_ops.message_bytes(
                xla_ops.result_bytes(str(md.name)), _as_int(mstats.get("bytes_accessed"))))
            data["ts_ns"].append(ts)
            data["dur_ns"].append(max(event.duration_ps // 1000, 0))
            data["kernel_event_id"].append(None)
            data["kernel_name"].append(str(md.display_name or md.name))
            data["stream"].append(int(line.id))
            data["step"].append(self.steps.step_at(index, ts))
            data["is_async"].append(True)

    def _gpu_ops(self, plane: Plane, index: int, line: Any, rows: _Columns) -> None:
        origin = self._origin_ns(line) * 1000
        match = _STREAM_LINE.match(str(line.name))
        stream = int(match.group(1)) if match else int(line.id)
        for event in line.events:
            self.events += 1
            md = plane.header.event_metadata.get(event.metadata_id)
            name = str(md.display_name or md.name) if md is not None else ""
            stats = _event_stats(plane, event)
            module = _as_str(stats.get("hlo_module"))
            hlo_op = _as_str(stats.get("hlo_op"))
            program = _as_uint(stats.get("program_id"))
            hlo_category = _as_str(stats.get("hlo_category"))
            if hlo_category is None and hlo_op is not None:
                hlo_category = (self.opcodes.get((program, hlo_op)) if program is not None else None) \
                    or self.opcodes_by_module.get((module or "", hlo_op)) or xla_ops.opcode_of(hlo_op)
            ts = (origin + event.offset_ps) // 1000
            dur = max(event.duration_ps // 1000, 0)
            kind = xla_ops.gpu_kind(name)
            category = xla_ops.category(hlo_category, name, gpu_kernel=True)
            self._device_row(rows, self._event_id(), index, index, stream, kind, category, name, ts, dur,
                             _as_int(stats.get("correlation_id")), module, program, hlo_category,
                             hlo_op, None, None)

    def _device_row(
        self, rows: _Columns, event_id: int, rank: int, device: int, stream: int, kind: str, category: str,
        name: str, ts: int, dur: int, correlation: int | None, module: str | None, program: int | None,
        hlo_category: str | None, long_name: str | None, flops: float | None, bytes_accessed: int | None,
    ) -> None:
        step = self.steps.step_at(rank, ts)
        self.steps.count(rank, step, ts, ts + dur)
        self._extent(ts, ts + dur)
        data = rows.data
        for key, value in (
            ("event_id", event_id), ("rank", rank), ("device", device), ("stream", stream), ("kind", kind),
            ("category", category), ("name", name), ("ts_ns", ts), ("dur_ns", dur), ("correlation", correlation),
            ("step", step), ("bytes", None), ("hlo_module", module), ("program_id", program),
            ("hlo_category", hlo_category), ("long_name", long_name), ("flops", flops),
            ("bytes_accessed", bytes_accessed),
        ):
            data[key].append(value)

    def _seq(self, rank: int, group: str) -> int:
        key = (rank, group)
        self.collective_seq[key] = self.collective_seq.get(key, 0) + 1
        return self.collective_seq[key]

    def _collectives_of(self, rows: _Columns) -> None:
        """Each communication op is also a collective: module = process group, order in it = seq."""
        data = rows.data
        order = sorted(
            (i for i, c in enumerate(data["category"]) if c == "communication"),
            key=lambda i: (data["rank"][i], data["ts_ns"][i]),  # type: ignore[return-value]
        )
        out = self.collectives.data
        for i in order:
            hlo_category = data["hlo_category"][i]
            name = str(data["name"][i])
            collective = xla_ops.collective_name(hlo_category if isinstance(hlo_category, str) else None) \
                or xla_ops.collective_name(xla_ops.opcode_of(name)) or _nccl_collective(name)
            if collective is None:
                continue
            rank = int(data["rank"][i])  # type: ignore[call-overload]
            group = str(data["hlo_module"][i] or data["program_id"][i] or "")
            long_name = data["long_name"][i]
            out["event_id"].append(self._event_id())
            out["rank"].append(rank)
            out["collective"].append(collective)
            out["process_group"].append(group)
            out["seq"].append(self._seq(rank, group))
            out["message_bytes"].append(xla_ops.message_bytes(
                xla_ops.result_bytes(long_name if isinstance(long_name, str) else None),
                data["bytes_accessed"][i]))  # type: ignore[arg-type]
            out["ts_ns"].append(data["ts_ns"][i])
            out["dur_ns"].append(data["dur_ns"][i])
            out["kernel_event_id"].append(data["event_id"][i])
            out["kernel_name"].append(name)
            out["stream"].append(data["stream"][i])
            out["step"].append(data["step"][i])
            out["is_async"].append(False)

    # ---- the small tables and the trace facts
    def finish(self, device_rows: int) -> TraceInfo:
        write_table(self.staging, "collectives", self.collectives.take(), trace_id=self.options.trace_id)
        steps = _Columns(("rank", "step", "ts_ns", "dur_ns", "device_start_ns", "device_end_ns", "device_op_count"))
        ranks = sorted(self.devices) or [0]
        for owner, windows in sorted(self.steps.windows.items(), key=lambda kv: -1 if kv[0] is None else kv[0]):
            for rank in ranks if owner is None else [owner]:
                for ts, dur, step in windows:
                    figures = self.steps.device.get((rank, step))
                    for key, value in (("rank", rank), ("step", step), ("ts_ns", ts), ("dur_ns", dur),
                                       ("device_start_ns", figures[0] if figures else None),
                                       ("device_end_ns", figures[1] if figures else None),
                                       ("device_op_count", figures[2] if figures else 0)):
                        steps.data[key].append(value)
        write_table(self.staging, "steps", steps.take(), trace_id=self.options.trace_id)
        write_table(self.staging, "counters", {}, trace_id=self.options.trace_id)
        devices = _Columns(("rank", "device", "kind", "name", "vendor", "peak_tflops", "peak_hbm_gbps",
                            "core_count", "clock_mhz", "memory_bytes", "compute_capability"))
        for index in sorted(self.devices):
            for key in devices.names:
                devices.data[key].append(self.devices[index].get(key))
        write_table(self.staging, "devices", devices.take(), trace_id=self.options.trace_id)

        info = self.info
        info.event_count = self.events
        info.rank = ranks[0]
        info.rank_source = "device index"
        info.device_count = len(self.devices) if device_rows else 0
        info.start_ns, info.end_ns = self.first_ns, self.last_ns
        kinds = {str(d.get("kind")) for d in self.devices.values()}
        vendors = {str(d.get("vendor") or "").lower() for d in self.devices.values()}
        info.device_type = "tpu" if "tpu" in kinds else ("rocm" if "amd" in vendors else "cuda") if "gpu" in kinds \
            else "cpu"
        names = [str(d["name"]) for d in self.devices.values() if d.get("name")]
        info.device_name = names[0] if names else None
        info.host = self.space.hostnames[0] if self.space.hostnames else _host_from_name(self.source)
        return info


def _device_row(plane: Plane, kind: str, index: int) -> dict[str, object]:
    stats = plane.stats()
    row: dict[str, object] = {"rank": index, "device": index, "kind": kind}
    row["name"] = _as_str(stats.get("device_type_string")) or (
        f"{stats['device_vendor']} GPU" if stats.get("device_vendor") else None)
    row["vendor"] = _as_str(stats.get("device_vendor")) or ("Google" if kind == "tpu" else None)
    row["peak_tflops"] = _as_float(stats.get("peak_teraflops_per_second"))
    hbm = _as_float(stats.get("peak_hbm_bw_gigabytes_per_second"))
    bandwidth = _as_float(stats.get("memory_bandwidth"))  # bytes/s on GPU planes
    row["peak_hbm_gbps"] = hbm if hbm is not None else (bandwidth / 1e9 if bandwidth else None)
    row["core_count"] = _as_int(stats.get("core_count"))
    clock = _as_float(stats.get("clock_rate"))  # kHz
    row["clock_mhz"] = clock / 1000 if clock else None
    row["memory_bytes"] = _as_int(stats.get("memory_size"))
    major, minor = stats.get("compute_cap_major"), stats.get("compute_cap_minor")
    row["compute_capability"] = f"{major}.{minor}" if major is not None and minor is not None else None
    return row


def _event_stats(plane: Plane, event: Any) -> dict[str, object]:
    names = plane.stat_names
    return {names.get(s.metadata_id, str(s.metadata_id)): stat_value(s, names) for s in event.stats}


def _step_number(name: str, stats: dict[str, object], position: int) -> int:
    for key in ("step_num", "group_id", "step_id"):
        value = _as_int(stats.get(key))
        if value is not None:
            return value
    digits = re.search(r"(\d+)$", name)
    return int(digits.group(1)) if digits else position


def _nccl_collective(name: str) -> str | None:
    match = re.search(r"(AllReduce|AllGather|ReduceScatter|AllToAll|Broadcast|Reduce|SendRecv|Send|Recv)", name)
    if not match or not re.match(r"^(nccl|rccl)", name, re.IGNORECASE):
        return None
    return {"AllReduce": "all_reduce", "AllGather": "all_gather", "ReduceScatter": "reduce_scatter",
            "AllToAll": "all_to_all", "Broadcast": "broadcast", "Reduce": "reduce", "SendRecv": "send",
            "Send": "send", "Recv": "recv"}[match.group(1)]


def _host_from_name(source: str) -> str | None:
    name = Path(source).name
    for suffix in (".xplane.pb.gz", ".xplane.pb"):
        if name.endswith(suffix):
            return name[: -len(suffix)] or None
    return None


def _as_int(value: object) -> int | None:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value if -(1 << 63) <= value < (1 << 63) else None
    if isinstance(value, float):
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
        return int(value)
    return None


def _as_uint(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value % (1 << 64)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value) % (1 << 64)
    return None


def _as_float(value: object) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return float(value)
    return None


def _as_str(value: object) -> str | None:
    if value is None or value == "":
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _open(source: Path, staging: Path, name: str) -> Space:
    """Open the XSpace, decompressing a gzipped one into the staging directory first."""
    with open(source, "rb") as f:
        gzipped = f.read(2) == b"\x1f\x8b"
    if not gzipped:
        return Space(source, name)
    plain = staging / "xplane.pb"
    try:
        with igzip.open(source, "rb") as compressed, open(plain, "wb") as out:
            shutil.copyfileobj(compressed, out, 8 << 20)
    except (OSError, EOFError) as exc:
        raise TraceFormatError(name, f"damaged gzip data ({exc})") from None
    return Space(plain, name)


def parse(source: Path, staging: Path, options: ParseOptions) -> TraceInfo:
    """Parse one ``.xplane.pb`` into ``<table>.parquet`` files in ``staging``.

    Raises:
        TraceFormatError: not an XSpace, damaged, or without device and host planes.
    """
    with _open(source, staging, options.source_name) as space:
        parser = _Parser(space, staging, options)
        parser.survey()
        parser.read_device_steps()
        with TableWriter(staging, "device_ops", trace_id=options.trace_id) as device_ops:
            parser.read_hosts(device_ops)
            parser.read_devices(device_ops)
        info = parser.finish(device_ops.rows)
    if options.on_bytes is not None:
        options.on_bytes(source.stat().st_size)
    (staging / "xplane.pb").unlink(missing_ok=True)
    return info


def iter_planes(source: Path) -> Iterator[str]:
    """The plane names of an XSpace (for quick looks and tests)."""
    with Space(source, source.name) as space:
        for plane in space.planes:
            yield plane.name
