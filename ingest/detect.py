"""Content-based format detection: the registry of parsers.

A parser registers a :class:`Format`; :func:`detect` reads the first bytes of a
file (decompressed if gzip) and asks each format in turn. Nothing outside a
parser module knows format details, so XLA and NCCL parsers plug in here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tracelake.contracts.errors import TraceFormatError, UnknownFormatError

from . import (
    allocator_snapshot, execution_trace, flight_recorder, lifecycle, memory_timeline, nccl_inspector, nccl_log,
    nccl_profiler, nccl_tests, pytorch_profiler, xla, xla_json,
)
from .model import ParseFunction
from .source import read_head


@dataclass(frozen=True)
class Format:
    """A trace format tracelake can ingest."""

    name: str
    description: str
    sniff: Callable[[bytes, str], bool]
    parse: ParseFunction
    #: Its parser needs the trace id only at the end (``ParseOptions.final_trace_id``), so the warehouse hashes
    #: the file while it parses instead of before.
    late_id: bool = False


#: Formats in the order they are tried; the most specific first.
FORMATS: list[Format] = [
    Format(xla_json.FORMAT, "XLA trace-viewer JSON (.trace.json.gz, perfetto_trace.json.gz)", xla_json.sniff,
           xla_json.parse),
    Format(
        pytorch_profiler.FORMAT,
        "PyTorch profiler / Kineto Chrome-trace JSON (.json, .json.gz)",
        pytorch_profiler.sniff,
        pytorch_profiler.parse,
        late_id=True,
    ),
    Format(xla.FORMAT, "XLA profile: XSpace protobuf (.xplane.pb)", xla.sniff, xla.parse),
    Format(lifecycle.FORMAT, 'Job lifecycle JSON (a "tracelake_lifecycle" object: submitted, started, checkpoints, '
           "restarts, ended)", lifecycle.sniff, lifecycle.parse),
    Format(nccl_tests.FORMAT, "nccl-tests output (stdout or -J JSON)", nccl_tests.sniff, nccl_tests.parse),
    Format(nccl_inspector.FORMAT, "NCCL Inspector records (JSON lines or pretty-printed)", nccl_inspector.sniff,
           nccl_inspector.parse),
    Format(nccl_profiler.FORMAT, "NCCL profiler plugin trace (JSON array of b/e events, 2.23-2.28 shapes)",
           nccl_profiler.sniff, nccl_profiler.parse),
    Format(allocator_snapshot.FORMAT, "PyTorch CUDA allocator snapshot (torch.cuda.memory._dump_snapshot pickle)",
           allocator_snapshot.sniff, allocator_snapshot.parse),
    Format(flight_recorder.FORMAT, "PyTorch Flight Recorder dump (JSON or pickle)", flight_recorder.sniff,
           flight_recorder.parse),
    Format(memory_timeline.FORMAT, "PyTorch profiler memory timeline export (export_memory_timeline, *raw.json.gz)",
           memory_timeline.sniff, memory_timeline.parse),
    Format(execution_trace.FORMAT, "PyTorch execution trace (Chakra ET JSON from ExecutionTraceObserver)",
           execution_trace.sniff, execution_trace.parse),
    Format(nccl_log.FORMAT, "NCCL debug log (NCCL_DEBUG=INFO)", nccl_log.sniff, nccl_log.parse, late_id=True),
]


def detect(path: Path, name: str | None = None) -> Format:
    """Return the format of the file at ``path``, judged by its content.

    Raises:
        TraceFormatError: the file is empty or unreadable.
        UnknownFormatError: no registered format recognises it.
    """
    label = name or path.name
    if path.stat().st_size == 0:
        raise TraceFormatError(label, "file is empty (0 bytes)", where="byte 0")
    head = read_head(path, name=label)
    for fmt in FORMATS:
        if fmt.sniff(head, label):
            return fmt
    stripped = head.lstrip()
    if not stripped:
        raise UnknownFormatError(label, "file holds only whitespace, not a trace", where="byte 0")
    if stripped[:1] == b"[":
        hint = 'a JSON array, not a trace object with "traceEvents"'
    elif stripped[:1] == b"{":
        hint = 'JSON, but not a trace tracelake knows (no "traceEvents")'
    else:
        hint = "not a trace format tracelake knows"
    known = ", ".join(f.description for f in FORMATS)
    raise UnknownFormatError(label, f"{hint}; supported: {known}", where="byte 0")
