"""PyTorch Flight Recorder dumps (JSON or pickle) into ``collectives`` and ``flight_recorder_status``.

A dump (docs/formats.md, section 3) is one rank's record of its last N collectives:
``pg_config`` (process groups), ``pg_status`` (per group, the seq of the last
collective enqueued, started and completed: what a hang analysis compares across
ranks) and ``entries`` (``profiling_name`` like ``nccl:all_reduce``,
``collective_seq_id``, ``time_created_ns``, ``duration_ms``, sizes and dtypes, state).

Pickles come from uploads and are untrusted: :class:`PlainUnpickler` builds only
plain containers and scalars and refuses any reference to a class or function, so a
pickle that would run code is rejected before anything runs. A small pickle can still
stand for a huge document (4,000 entries that are one shared dict, a process group of
40,000 ranks that every entry names): :class:`Budget` counts the bytes its rows would
take, every shared value each time it is reached, and refuses the dump before any row
is built when they pass the expansion limit uploads are held to.
"""

from __future__ import annotations

import io
import json
import math
import pickle
import pickletools
import re
from pathlib import Path
from typing import Any

from tracelake.contracts.errors import TraceFormatError

from .model import MIN_EXPANSION_BYTES, ParseOptions, TraceInfo
from .source import iter_chunks
from .tables import fit_int, fit_text, write_table

FORMAT = "flight_recorder"

_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)
_P2P = re.compile(r"^(?:nccl:)?(send|recv)\s+(\d+)\s*->\s*(\d+)")
#: Bytes per element by the dtype names Flight Recorder writes.
DTYPE_BYTES = {"Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Int": 4, "Long": 8, "Byte": 1, "Char": 1,
               "Bool": 1, "Short": 2, "Float8_e4m3fn": 1, "Float8_e5m2": 1}
#: A dump larger than this is refused (Flight Recorder keeps the last few thousand entries).
MAX_BYTES = 512 << 20
#: Bytes a row's numbers take (14 columns of 8 bytes), counted with its strings and listed ranks.
_ROW_BYTES = 14 * 8


class PlainUnpickler(pickle.Unpickler):
    """Unpickles dicts, lists, tuples, sets, strings, bytes and numbers; refuses every class and function."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(
            f"the pickle refers to {module}.{name}; tracelake reads pickles of plain containers and scalars only "
            "(Flight Recorder dumps, allocator snapshots), so it was refused without running anything"
        )


def sniff(head: bytes, filename: str) -> bool:
    """A Flight Recorder dump: JSON or pickle with its top-level keys."""
    markers = (b"pg_config", b"pg_status", b"comm_lib_version")
    if head[:1] == b"\x80":  # pickle protocol 2+
        return any(m in head for m in markers)
    return head.lstrip()[:1] == b"{" and b'"entries"' in head and any(m in head for m in markers)


class Budget:
    """The bytes of rows a dump may make: ``min(max_expanded_bytes, max(ratio x its size, 1 MiB))``.

    Charged while counting, before anything is built, so a pickle whose shared references
    would expand without bound is refused after work proportional to the limit.
    """

    def __init__(self, source: str, size: int, options: ParseOptions) -> None:
        self.source, self.size, self.options = source, size, options
        self.limit = options.expansion_limit(size)
        self.used = 0

    def charge(self, nbytes: int, where: str) -> None:
        """Count ``nbytes`` more.

        Raises:
            TraceFormatError: the rows would pass the limit.
        """
        self.used += nbytes
        if self.used > self.limit:
            o = self.options
            raise TraceFormatError(
                self.source, f"its {self.size:,} bytes would make more than {self.limit:,} bytes of rows, the "
                f"expansion limit ({o.max_expansion_ratio}x its size, at least {MIN_EXPANSION_BYTES:,} and at most "
                f"{o.max_expanded_bytes:,} bytes; TRACELAKE_MAX_EXPANSION_RATIO, TRACELAKE_MAX_EXPANDED_BYTES): "
                "its entries refer to the same large values over and over (a pickle bomb?)", where=where)


def _load(source: Path, options: ParseOptions) -> tuple[dict[str, Any], int]:
    """The dump's document and its size in bytes (decompressed)."""
    if source.stat().st_size > MAX_BYTES:
        raise TraceFormatError(options.source_name, f"larger than {MAX_BYTES >> 20} MB: not a Flight Recorder dump")
    parts, size = [], 0
    for chunk in iter_chunks(source, on_bytes=options.on_bytes, name=options.source_name):
        size += len(chunk)
        if size > MAX_BYTES:  # a gzip file expands up to 1000-fold: stop before it fills memory
            raise TraceFormatError(options.source_name, f"expands to more than {MAX_BYTES >> 20} MB: "
                                   "not a Flight Recorder dump (a gzip bomb?)", where=f"decompressed byte {size}")
        parts.append(chunk)
    data = b"".join(parts)
    if data[:1] == b"\x80":
        check_memo(data, options.source_name)
        try:
            stream = io.BytesIO(data)
            doc = PlainUnpickler(stream).load()
        except pickle.UnpicklingError as exc:
            raise TraceFormatError(options.source_name, f"unsafe or damaged pickle: {exc}",
                                   where=f"byte {stream.tell()}") from None
        except Exception as exc:  # noqa: BLE001 - a damaged pickle can fail in any way (FRAME overflow, bad memo...)
            raise TraceFormatError(options.source_name, f"damaged pickle ({type(exc).__name__}: {exc})",
                                   where=f"byte {stream.tell()}") from None
    else:
        try:
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise TraceFormatError(options.source_name, f"invalid JSON ({exc})") from None
        except RecursionError:
            raise TraceFormatError(options.source_name, "JSON nested too deeply: not a Flight Recorder dump") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("entries"), list):
        raise TraceFormatError(options.source_name, "no 'entries' list: not a Flight Recorder dump")
    return doc, len(data)


def check_memo(data: bytes, source: str) -> None:
    """Walk the pickle's opcodes without building anything; refuse memo indexes the pickle cannot need.

    A ``LONG_BINPUT 4294967295`` makes C's unpickler grow its memo table to that index (tens of GB)
    before anything fails; a real pickle's indexes count up from 0, one per stored object.
    """
    pos: int | None = 0
    try:
        for opcode, arg, pos in pickletools.genops(data):
            if opcode.name in ("PUT", "BINPUT", "LONG_BINPUT") and isinstance(arg, int) and not 0 <= arg < len(data):
                raise TraceFormatError(source, f"damaged pickle (memo index {arg} in a {len(data)}-byte pickle)",
                                       where=f"byte {pos}")
            if opcode.name == "STOP":
                return
    except TraceFormatError:
        raise
    except Exception as exc:  # noqa: BLE001 - genops fails in many ways on damaged opcodes
        raise TraceFormatError(source, f"damaged pickle ({type(exc).__name__}: {exc})",
                               where=f"the opcode after byte {pos}") from None


def _duration_ns(duration_ms: object) -> int | None:
    if not isinstance(duration_ms, int | float) or isinstance(duration_ms, bool):
        return None
    try:
        ns = float(duration_ms) * 1e6
    except OverflowError:
        return None
    return fit_int(round(ns)) if math.isfinite(ns) else None


def _bytes(sizes: object, dtypes: object) -> int | None:
    if not isinstance(sizes, list | tuple) or not isinstance(dtypes, list | tuple):
        return None
    total = 0
    for shape, dtype in zip(sizes, dtypes, strict=False):
        if not isinstance(shape, list | tuple) or not all(isinstance(d, int) for d in shape):
            return None
        total += math.prod(shape) * DTYPE_BYTES.get(dtype, 0) if isinstance(dtype, str) else 0
    return total


def _group(value: object) -> str | None:
    if isinstance(value, list | tuple) and value:
        return fit_text(value[0])
    return fit_text(value)


def _group_of(entry: dict[str, Any]) -> str:
    return _group(entry.get("process_group")) or fit_text(entry.get("pg_id")) or ""


def _text_bytes(value: object) -> int:
    return len(value) if isinstance(value, str) else 0


def _check_expansion(doc: dict[str, Any], configs: dict[str, Any], budget: Budget) -> None:
    """Charge ``budget`` with the rows (and the work) ``parse`` will make of ``doc``, before any is made.

    Every entry counts its numbers, its strings by length and each rank of its group's
    list; a value a pickle shares counts each time an entry reaches it. The sizes lists
    that message sizes are computed from count too (a shared list of 40,000 shapes is work).
    """
    for index, entry in enumerate(doc["entries"]):
        if not isinstance(entry, dict):
            return  # parse() refuses it where it stands
        where = f"entries[{index}]"
        group = _group_of(entry)
        config = configs.get(group)
        ranks = config.get("ranks") if isinstance(config, dict) else None
        desc = config.get("desc") if isinstance(config, dict) else None
        name = entry.get("profiling_name")
        budget.charge(_ROW_BYTES + 2 * _text_bytes(name) + len(group) + _text_bytes(desc)
                      + (8 * len(ranks) if isinstance(ranks, list | tuple) else 0), where)
        for key in ("input_sizes", "output_sizes"):
            sizes = entry.get(key)
            if isinstance(sizes, list | tuple):
                budget.charge(8 * len(sizes), f"{where}.{key}")
                for shape in sizes:
                    if isinstance(shape, list | tuple):
                        budget.charge(8 * len(shape), f"{where}.{key}")
    pg_status = doc.get("pg_status")
    if isinstance(pg_status, dict):
        budget.charge(5 * 8 * len(pg_status), "pg_status")


def _reached(entries: list[Any]) -> dict[str, dict[str, int]]:
    """Per process group (as ``pg_status`` names it), the highest collective seq whose entry says it
    started or completed: ``pg_status`` lags the entries (the watchdog updates it when it next looks, so a
    healthy dump can say 64 of 192 completed while every entry says completed; docs/formats.md)."""
    out: dict[str, dict[str, int]] = {}
    for entry in entries:
        if not isinstance(entry, dict) or entry.get("is_p2p"):
            continue
        seq, state = entry.get("collective_seq_id"), entry.get("state")
        if not isinstance(seq, int) or isinstance(seq, bool) or state not in ("started", "completed"):
            continue
        mine = out.setdefault(_group_of(entry), {})
        for reached in ("started", "completed") if state == "completed" else ("started",):
            mine[reached] = max(mine.get(reached, seq), seq)
    return out


def _latest(status: object, entries: int | None) -> object:
    """The later of ``pg_status``'s seq and the entries' (when both are numbers)."""
    if entries is None or not isinstance(status, int) or isinstance(status, bool):
        return status if status is not None else entries
    return max(status, entries)


def parse(source: Path, staging: Path, options: ParseOptions) -> TraceInfo:
    """Parse one rank's Flight Recorder dump.

    Raises:
        TraceFormatError: not a dump, a damaged one, or a pickle that refers to anything but plain data.
    """
    doc, size = _load(source, options)
    configs: dict[str, Any] = doc["pg_config"] if isinstance(doc.get("pg_config"), dict) else {}
    _check_expansion(doc, configs, Budget(options.source_name, size, options))
    rank = fit_int(doc.get("rank"), 32)
    rank_source = "dump"
    if rank is None:
        match = _RANK_IN_NAME.search(options.source_name)
        named = fit_int(int(match.group(1)), 32) if match else None
        rank, rank_source = (named, "file name") if named is not None else (0, "default")
    columns = ("event_id", "rank", "collective", "process_group", "process_group_desc", "group_ranks", "group_size",
               "seq", "message_bytes", "src_rank", "dst_rank", "ts_ns", "dur_ns", "is_async", "source")
    rows: dict[str, list[object]] = {c: [] for c in columns}
    for index, entry in enumerate(doc["entries"]):
        if not isinstance(entry, dict):
            raise TraceFormatError(options.source_name, "an entry that is not a record", where=f"entries[{index}]")
        name = fit_text(entry.get("profiling_name")) or ""
        p2p = _P2P.match(name)
        collective = p2p.group(1) if p2p else name.split(":", 1)[-1].strip() or "unknown"
        group = _group_of(entry)
        config: dict[str, Any] = configs[group] if isinstance(configs.get(group), dict) else {}
        seq = entry.get("p2p_seq_id") if entry.get("is_p2p") or p2p else entry.get("collective_seq_id")
        duration = entry.get("duration_ms")
        ranks = config.get("ranks")
        if not isinstance(ranks, list | tuple) or not all(isinstance(r, int) for r in ranks):
            ranks = None  # only a list of ranks is written (and a pickle's shared containers never str()-ed)
        for column, value in (
            ("event_id", index), ("rank", rank), ("collective", collective),
            ("process_group", f"{group}:p2p" if p2p or entry.get("is_p2p") else group),
            ("process_group_desc", fit_text(config.get("desc"))),
            ("group_ranks", str(list(ranks)) if ranks is not None else None),
            ("group_size", fit_int(len(ranks), 32) if ranks is not None else None),
            ("seq", fit_int(seq)),
            ("message_bytes", fit_int(max(filter(None, (_bytes(entry.get("input_sizes"), entry.get("input_dtypes")),
                                                     _bytes(entry.get("output_sizes"), entry.get("output_dtypes")))),
                                       default=None))),
            ("src_rank", fit_int(int(p2p.group(2)), 32) if p2p else None),
            ("dst_rank", fit_int(int(p2p.group(3)), 32) if p2p else None),
            ("ts_ns", fit_int(entry.get("time_discovered_started_ns") or entry.get("time_created_ns"))),
            ("dur_ns", _duration_ns(duration)), ("is_async", False), ("source", "flight_recorder"),
        ):
            rows[column].append(value)
    write_table(staging, "collectives", rows, trace_id=options.trace_id)
    status: dict[str, list[object]] = {c: [] for c in (
        "rank", "process_group", "last_enqueued", "last_started", "last_completed")}
    pg_status: dict[str, Any] = doc["pg_status"] if isinstance(doc.get("pg_status"), dict) else {}
    reached = _reached(doc["entries"])
    for group, state in pg_status.items():
        if not isinstance(state, dict) or fit_text(group) is None:
            continue
        seen = reached.get(str(group), {})
        for column, value in (("rank", rank), ("process_group", fit_text(group)),
                              ("last_enqueued", state.get("last_enqueued_collective")),
                              ("last_started", _latest(state.get("last_started_collective"), seen.get("started"))),
                              ("last_completed", _latest(state.get("last_completed_collective"),
                                                         seen.get("completed")))):
            status[column].append(value if column in ("rank", "process_group") else fit_int(value))
    write_table(staging, "flight_recorder_status", status, trace_id=options.trace_id)
    info = TraceInfo(format=FORMAT, event_count=len(doc["entries"]), uncompressed_bytes=source.stat().st_size)
    info.rank, info.rank_source = rank, rank_source
    info.backend = "nccl"
    info.nccl_version = fit_text(doc.get("comm_lib_version")) or None
    starts = [t for t in rows["ts_ns"] if isinstance(t, int)]
    info.start_ns, info.end_ns = (min(starts), max(starts)) if starts else (None, None)
    return info
