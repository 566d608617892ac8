"""PyTorch CUDA caching allocator snapshots into ``allocator_segments`` and ``allocator_events``.

``torch.cuda.memory._snapshot()`` (pickled by ``_dump_snapshot(path)``, maybe gzipped) is a
dict (docs/formats.md, "PyTorch CUDA allocator snapshots"): ``segments``, what the allocator
holds from cudaMalloc at the time of the snapshot, each with its ``blocks``; and, when the
history was recorded (``torch.cuda.memory._record_memory_history()``), ``device_traces``: per
device, the allocator's actions (``alloc``, ``free_requested``, ``free_completed``,
``segment_alloc``, ``segment_free``, ``oom``, ...) with their stacks. A block or an action is
stored with its first Python frame outside torch (:func:`user_frame`), not its whole stack.

Pickles come from uploads and are untrusted: they are read with Flight Recorder's
:class:`~.flight_recorder.PlainUnpickler` (plain containers and scalars only, any class
refused before anything runs) after :func:`~.flight_recorder.check_memo`, and every row and
every frame a row's stack makes the parser look at is charged to the same expansion
:class:`~.flight_recorder.Budget` before a row is built, so a small pickle whose entries share
one huge stack is refused (docs/security.md).

A snapshot says nothing of the rank: the file name gives it (``rank-3``), else 0 with a warning.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

from tracelake.contracts.errors import TraceFormatError

from .flight_recorder import Budget, PlainUnpickler, check_memo
from .memory_timeline import rank_from_name
from .model import ParseOptions, TraceInfo
from .source import read_whole
from .tables import fit_int, fit_text, write_table

FORMAT = "allocator_snapshot"

#: A snapshot larger than this (decompressed) is refused: it is unpickled whole.
MAX_BYTES = 512 << 20
#: The actions PyTorch's allocator writes (``torch/cuda/memory.py``, ``_snapshot``; ``segment_map`` and
#: ``segment_unmap`` with expandable segments). Others are kept as written, with a warning.
ACTIONS = frozenset({"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
                     "segment_unmap", "oom", "snapshot", "annotate"})
#: Bytes a row's numbers take (``allocator_segments``: 13, ``allocator_events``: 8 numbers of 8 bytes).
_SEGMENT_ROW_BYTES = 13 * 8
_EVENT_ROW_BYTES = 8 * 8
#: Bytes charged for each frame of a stack the parser looks through.
_FRAME_BYTES = 16

_SEGMENT_COLUMNS = ("rank", "device", "segment_index", "segment_address", "segment_bytes", "segment_allocated_bytes",
                    "segment_active_bytes", "segment_requested_bytes", "stream", "segment_type", "is_expandable",
                    "block_index", "block_address", "block_bytes", "block_requested_bytes", "block_state",
                    "block_frame")
_EVENT_COLUMNS = ("event_id", "rank", "device", "action", "addr", "bytes", "stream", "ts_ns", "device_free_bytes",
                  "frame")


def sniff(head: bytes, filename: str) -> bool:
    """A pickle (protocol 2+) of a dict whose first key is ``segments``, with segments or a history after it.

    Flight Recorder pickles start with ``version`` and hold ``pg_config``: the two are never confused.
    """
    return head[:1] == b"\x80" and b"segments" in head[:64] and (b"total_size" in head or b"device_traces" in head)


def user_frame(frames: object) -> str | None:
    """``file.py:line function`` of the first Python frame not inside a ``torch/`` folder; None without one.

    Stacks list the innermost frame first; C++ frames (``CUDACachingAllocator.cpp``, ``??``) are skipped.
    """
    frame = _scan(frames)[1]
    if frame is None:
        return None
    base = frame["filename"].replace("\\", "/").rsplit("/", 1)[-1]
    line, name = fit_int(frame.get("line")), fit_text(frame.get("name"))
    return f"{base}:{line if line is not None else '?'} {name or '?'}"


def _scan(frames: object) -> tuple[int, dict[str, Any] | None]:
    """The bytes of work :func:`user_frame` does on ``frames`` (what the budget is charged), and the frame it finds."""
    if not isinstance(frames, list | tuple):
        return 0, None
    cost = 0
    for frame in frames:
        cost += _FRAME_BYTES
        if not isinstance(frame, dict):
            continue
        filename = frame.get("filename")
        if not isinstance(filename, str) or not filename.endswith(".py"):
            continue
        cost += len(filename)
        path = filename.replace("\\", "/")
        if "/torch/" in path or path.startswith("torch/"):
            continue
        name = frame.get("name")
        return cost + (len(name) if isinstance(name, str) else 0), frame
    return cost, None


def _load(source: Path, options: ParseOptions) -> tuple[dict[str, Any], int]:
    """The snapshot's document and its size in bytes (decompressed)."""
    name = options.source_name
    data = read_whole(source, on_bytes=options.on_bytes, name=name, limit=MAX_BYTES)
    if data[:1] != b"\x80":
        raise TraceFormatError(name, "not a pickle (protocol 2 or later): not an allocator snapshot", where="byte 0")
    check_memo(data, name)
    stream = io.BytesIO(data)
    try:
        doc = PlainUnpickler(stream).load()
    except pickle.UnpicklingError as exc:
        raise TraceFormatError(name, f"unsafe or damaged pickle: {exc}", where=f"byte {stream.tell()}") from None
    except Exception as exc:  # noqa: BLE001 - a damaged pickle can fail in any way (FRAME overflow, bad memo...)
        raise TraceFormatError(name, f"damaged pickle ({type(exc).__name__}: {exc})",
                               where=f"byte {stream.tell()}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("segments"), list):
        raise TraceFormatError(name, "no 'segments' list: not an allocator snapshot", where="segments")
    traces = doc.get("device_traces")
    if traces is not None and not isinstance(traces, list):
        raise TraceFormatError(name, "'device_traces' is not a list (one list of actions per device)",
                               where="device_traces")
    return doc, len(data)


def _record(value: object, name: str, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TraceFormatError(name, f"expected a record (dict), found {type(value).__name__}", where=where)
    return value


def _number(record: dict[str, Any], key: str, name: str, where: str, *, required: bool) -> int | None:
    """``record[key]`` as a 64-bit integer; a missing or wrong one is an error when ``required``, else null."""
    value = fit_int(record.get(key))
    if value is None and required:
        found = "missing" if key not in record else f"not a 64-bit integer ({type(record[key]).__name__})"
        raise TraceFormatError(name, f"'{key}' is {found}", where=f"{where}.{key}")
    return value


def _check_expansion(doc: dict[str, Any], budget: Budget, name: str) -> None:
    """Check the shape of ``doc`` and charge ``budget`` with the rows and frames :func:`parse` will make of it."""
    for index, raw in enumerate(doc["segments"]):
        where = f"segments[{index}]"
        segment = _record(raw, name, where)
        blocks = segment.get("blocks", [])
        if not isinstance(blocks, list | tuple):
            raise TraceFormatError(name, "'blocks' is not a list", where=f"{where}.blocks")
        budget.charge(_SEGMENT_ROW_BYTES + _text(segment.get("segment_type")), where)
        for number, block in enumerate(blocks):
            at = f"{where}.blocks[{number}]"
            block = _record(block, name, at)
            budget.charge(_SEGMENT_ROW_BYTES + _text(block.get("state")) + _scan(block.get("frames"))[0], at)
    for device, entries in enumerate(doc.get("device_traces") or []):
        if not isinstance(entries, list | tuple):
            raise TraceFormatError(name, "a device's trace is not a list of actions", where=f"device_traces[{device}]")
        for number, entry in enumerate(entries):
            at = f"device_traces[{device}][{number}]"
            entry = _record(entry, name, at)
            budget.charge(_EVENT_ROW_BYTES + _text(entry.get("action")) + _scan(entry.get("frames"))[0], at)


def _text(value: object) -> int:
    return len(value) if isinstance(value, str) else 0


def parse(source: Path, staging: Path, options: ParseOptions) -> TraceInfo:
    """Parse one allocator snapshot pickle.

    Raises:
        TraceFormatError: not a snapshot, a damaged one, a pickle that refers to anything but plain data,
            one that would expand past the limit, or a record of the wrong shape (the error names its key path).
    """
    name = options.source_name
    doc, size = _load(source, options)
    _check_expansion(doc, Budget(name, size, options), name)
    info = TraceInfo(format=FORMAT, uncompressed_bytes=size, device_type="cuda")
    rank = info.rank = rank_from_name(name, info, "an allocator snapshot")
    segments: dict[str, list[object]] = {c: [] for c in _SEGMENT_COLUMNS}
    devices: set[int] = set()
    for index, segment in enumerate(doc["segments"]):
        where = f"segments[{index}]"
        device = _number(segment, "device", name, where, required=False)
        if device is not None:
            devices.add(device)
        expandable = segment.get("is_expandable")
        shared = (rank, fit_int(device, 32), index, _number(segment, "address", name, where, required=True),
                  _number(segment, "total_size", name, where, required=True),
                  _number(segment, "allocated_size", name, where, required=False),
                  _number(segment, "active_size", name, where, required=False),
                  _number(segment, "requested_size", name, where, required=False),
                  _number(segment, "stream", name, where, required=False), fit_text(segment.get("segment_type")),
                  expandable if isinstance(expandable, bool) else None)
        blocks = segment.get("blocks", [])
        for number, block in enumerate(blocks or [None]):
            at = f"{where}.blocks[{number}]"
            own = (None,) * 6 if block is None else (
                number, _number(block, "address", name, at, required=True),
                _number(block, "size", name, at, required=True),
                _number(block, "requested_size", name, at, required=False), fit_text(block.get("state")),
                user_frame(block.get("frames")))
            for column, value in zip(_SEGMENT_COLUMNS, (*shared, *own), strict=True):
                segments[column].append(value)
    events: dict[str, list[object]] = {c: [] for c in _EVENT_COLUMNS}
    unknown: dict[str, int] = {}
    for device, entries in enumerate(doc.get("device_traces") or []):
        if entries:
            devices.add(device)
        for number, entry in enumerate(entries):
            at = f"device_traces[{device}][{number}]"
            action = entry.get("action")
            if not isinstance(action, str):
                raise TraceFormatError(name, "an action that is not a string", where=f"{at}.action")
            if action not in ACTIONS:
                unknown[action] = unknown.get(action, 0) + 1
            time_us = _number(entry, "time_us", name, at, required=False)
            for column, value in zip(_EVENT_COLUMNS, (
                len(events["event_id"]), rank, fit_int(device, 32), action,
                _number(entry, "addr", name, at, required=False), _number(entry, "size", name, at, required=False),
                _number(entry, "stream", name, at, required=False),
                fit_int(time_us * 1000) if time_us is not None else None,
                _number(entry, "device_free", name, at, required=False), user_frame(entry.get("frames")),
            ), strict=True):
                events[column].append(value)
    write_table(staging, "allocator_segments", segments, trace_id=options.trace_id)
    write_table(staging, "allocator_events", events, trace_id=options.trace_id)
    info.event_count = len(events["event_id"]) + len(segments["segment_index"])
    info.device_count = len(devices) or None
    stamps = [t for t in events["ts_ns"] if isinstance(t, int)]
    info.start_ns, info.end_ns = (min(stamps), max(stamps)) if stamps else (None, None)
    if unknown:
        listed = ", ".join(f"{action} ({count})" for action, count in sorted(unknown.items())[:10])
        info.warnings.append(f"actions this version of tracelake does not know, kept as written: {listed}")
    if not doc.get("device_traces"):
        info.warnings.append("no allocation history (device_traces): record it with "
                             "torch.cuda.memory._record_memory_history() before the snapshot")
    return info
