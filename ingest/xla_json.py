"""The trace-viewer JSON of XLA runs (``<host>.trace.json.gz``, ``perfetto_trace.json.gz``).

XProf writes the same planes and lines as the XSpace, as Chrome-trace processes
(``/device:TPU:0``, ``/host:CPU``) and threads (``XLA Ops``, ``Stream #16(Kernel)``,
``python``) named by ``M`` events; op details are in ``args`` (``hlo_op``,
``hlo_module``, ``long_name``, ``device_ordinal``, ``step_num``). Rows are built
by the same :class:`~tracelake.ingest.xla_rows.RowBuilder` as the XSpace parser,
so the same run gives the same device ops, collectives and steps from either file.
Times are the JSON's (µs, relative to the profile start: this file has no epoch).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgspec

from tracelake.contracts.classify import classify, op_kind
from tracelake.contracts.errors import TraceFormatError

from . import xla_ops
from .chrome_json import ChromeTraceReader
from .model import ParseOptions, TraceInfo
from .source import iter_chunks
from .tables import TableWriter, write_table
from .xla_rows import DEVICE_COLUMNS, HOST_COLUMNS, Columns, RowBuilder, as_float, as_int, as_str, as_uint

FORMAT = "xla_json"

_DEVICE = re.compile(r"^/device:(TPU|GPU):(\d+)")
_STREAM = re.compile(r"^Stream #(\d+)")


def sniff(head: bytes, filename: str) -> bool:
    """A Chrome-trace JSON object whose processes are XLA planes (``/device:...``, ``/host:...``)."""
    if not head.lstrip().startswith(b"{") or b'"traceEvents"' not in head:
        return False
    return b'"/device:' in head or b'"/host:' in head


class _Event(msgspec.Struct, gc=False):
    ph: str | None = None
    name: str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: float | None = None
    dur: float | None = None
    args: dict[str, Any] | None = None


#: Times (µs) beyond this do not fit 64-bit nanoseconds, nor do sums and differences of two of them.
_MAX_US = float(1 << 61) / 1000


def _ns(us: float | None) -> int:
    return round((us or 0.0) * 1000)


class _Parser(RowBuilder):
    def __init__(self, staging: Path, options: ParseOptions, size: int) -> None:
        super().__init__(staging, options, FORMAT, size)
        self.processes: dict[object, str] = {}
        self.threads: dict[tuple[object, object], str] = {}
        self.complete: list[_Event] = []

    def read(self, source: Path) -> None:
        chunks = iter_chunks(source, on_bytes=self.options.on_bytes, name=self.source)
        reader: ChromeTraceReader[_Event] = ChromeTraceReader(
            chunks, _Event, self.source, batch_bytes=self.options.batch_bytes
        )
        for first, events, _ in reader.batches():
            for offset, event in enumerate(events):
                self.events += 1
                if event.ph == "M" and event.args:
                    if event.name == "process_name":
                        self.processes[event.pid] = str(event.args.get("name", ""))
                    elif event.name == "thread_name":
                        self.threads[(event.pid, event.tid)] = str(event.args.get("name", ""))
                elif event.ph == "X":
                    if event.ts is None or event.dur is None:
                        raise TraceFormatError(self.source, "complete event without ts or dur",
                                               where=f"traceEvents[{first + offset}]")
                    if not (-_MAX_US < event.ts < _MAX_US and -_MAX_US < event.dur < _MAX_US):
                        raise TraceFormatError(self.source, f"ts {event.ts!r} or dur {event.dur!r} out of range "
                                               "(not microseconds)", where=f"traceEvents[{first + offset}]")
                    self.complete.append(event)
        self.info.uncompressed_bytes = reader.json_bytes
        if not any(_DEVICE.match(p) or p.startswith("/host:") for p in self.processes.values()):
            raise TraceFormatError(self.source, "no /device: or /host: processes: not the trace-viewer JSON of XLA")

    def steps_and_hosts(self, device_ops: TableWriter) -> None:
        # Step windows first: device Steps lines, else host step_num annotations.
        for event in self.complete:
            process = self.processes.get(event.pid, "")
            match = _DEVICE.match(process)
            if match and self.threads.get((event.pid, event.tid)) == "Steps":
                step = as_int((event.args or {}).get("step_num"))
                self.steps.add(int(match.group(2)), step if step is not None else _digits(event.name),
                               _ns(event.ts), _ns(event.dur))
        if not self.steps.windows:
            for event in self.complete:
                if self.processes.get(event.pid, "").startswith("/host:") and "step_num" in (event.args or {}):
                    step = as_int((event.args or {})["step_num"])
                    if step is not None:
                        self.steps.add(None, step, _ns(event.ts), _ns(event.dur))
        self.steps.finish()
        host = Columns(HOST_COLUMNS)
        cpu_ops = Columns(DEVICE_COLUMNS)
        by_thread: dict[tuple[object, object], list[int]] = {}
        for i, event in enumerate(self.complete):
            if self.processes.get(event.pid, "").startswith("/host:"):
                by_thread.setdefault((event.pid, event.tid), []).append(i)
        for key, indexes in by_thread.items():
            indexes.sort(key=lambda i: (self.complete[i].ts, -(self.complete[i].dur or 0.0)))
            stack: list[tuple[int, int]] = []
            thread = (self.threads.get(key) or "").rsplit("/", 1)[0]
            for i in indexes:
                event = self.complete[i]
                args = event.args or {}
                ts, dur = _ns(event.ts), max(_ns(event.dur), 0)
                event_id = self._event_id()
                self._extent(ts, ts + dur)
                if "hlo_op" in args and "device_ordinal" in args:
                    rank = as_int(args["device_ordinal"]) or 0
                    module = as_str(args.get("hlo_module"))
                    hlo_category = as_str(args.get("hlo_category")) or xla_ops.opcode_of(as_str(args["hlo_op"]))
                    self._device_row(cpu_ops, event_id, rank, rank, _thread_id(key[1]), "xla_op",
                                     classify("xla_op", event.name or "", hlo_category), event.name or "", ts, dur,
                                     None, module, as_uint(args.get("program_id")), hlo_category,
                                     as_str(args.get("long_name")), as_float(args.get("flops")),
                                     as_int(args.get("bytes_accessed")))
                    self.devices.setdefault(rank, {"rank": rank, "device": rank, "kind": "cpu",
                                                   "name": "XLA CPU device"})
                    continue
                while stack and stack[-1][0] <= ts:
                    stack.pop()
                for column, value in (
                    ("event_id", event_id), ("rank", 0), ("pid", as_int(event.pid)), ("tid", _thread_id(key[1])),
                    ("cat", thread), ("name", event.name or ""), ("ts_ns", ts), ("dur_ns", dur),
                    ("depth", len(stack)), ("parent_id", stack[-1][1] if stack else None),
                    ("correlation", as_int(args.get("correlation_id"))), ("step", self.steps.step_at(None, ts)),
                ):
                    host.data[column].append(value)
                stack.append((ts + dur, event_id))
        self._collectives_of(cpu_ops)
        device_ops.write(cpu_ops.take())
        self.host_data = host

    def devices_ops(self, device_ops: TableWriter) -> None:
        rows = Columns(DEVICE_COLUMNS)
        for event in sorted(self.complete, key=lambda e: (str(e.pid), str(e.tid), e.ts or 0.0)):
            match = _DEVICE.match(self.processes.get(event.pid, ""))
            if not match:
                continue
            kind, index = match.group(1).lower(), int(match.group(2))
            thread = self.threads.get((event.pid, event.tid), "")
            args = event.args or {}
            name = event.name or ""
            ts, dur = _ns(event.ts), max(_ns(event.dur), 0)
            hlo_category = as_str(args.get("hlo_category"))
            module = as_str(args.get("hlo_module"))
            self.devices.setdefault(index, {"rank": index, "device": index, "kind": kind})
            if kind == "tpu" and thread == "XLA Ops":
                hlo_category = hlo_category or xla_ops.opcode_of(name) or xla_ops.opcode_of(as_str(args.get("hlo_op")))
                self._device_row(rows, self._event_id(), index, index, _thread_id(event.tid), "xla_op",
                                 classify("xla_op", name, hlo_category), name, ts, dur, None, module,
                                 as_uint(args.get("program_id")), hlo_category, as_str(args.get("long_name")),
                                 as_float(args.get("flops")), as_int(args.get("bytes_accessed")))
            elif kind == "gpu" and _STREAM.match(thread):
                stream_match = _STREAM.match(thread)
                hlo_category = hlo_category or xla_ops.opcode_of(as_str(args.get("hlo_op")))
                self._device_row(rows, self._event_id(), index, index,
                                 int(stream_match.group(1)) if stream_match else _thread_id(event.tid),
                                 op_kind(name), classify(op_kind(name), name, hlo_category),
                                 name, ts, dur, as_int(args.get("correlation_id")), module,
                                 as_uint(args.get("program_id")), hlo_category, as_str(args.get("hlo_op")),
                                 None, None)
        self._collectives_of(rows)
        device_ops.write(rows.take())
        write_table(self.staging, "host_ops", self.host_data.take(), trace_id=self.options.trace_id)


def _digits(name: str | None) -> int:
    found = re.search(r"(\d+)$", name or "")
    return int(found.group(1)) if found else 0


def _thread_id(tid: object) -> int:
    value = as_int(tid)
    return value if value is not None else abs(hash(tid)) % (1 << 62)


def parse(source: Path, staging: Path, options: ParseOptions) -> TraceInfo:
    """Parse the trace-viewer JSON of an XLA run into ``<table>.parquet`` files in ``staging``.

    Raises:
        TraceFormatError: not valid JSON, or no XLA planes in it.
    """
    parser = _Parser(staging, options, source.stat().st_size)
    parser.read(source)
    with TableWriter(staging, "device_ops", trace_id=options.trace_id) as device_ops:
        parser.steps_and_hosts(device_ops)
        parser.devices_ops(device_ops)
    info = parser.finish(device_ops.rows)
    info.event_count = parser.events
    return info
