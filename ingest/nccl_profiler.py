"""NCCL profiler plugin example output (NCCL >= 2.23) into ``collectives``.

One Chrome-trace JSON array per communicator and rank (``<dump>_<commHash>_<rank>.json``)
of async ``b``/``e`` events, ``ts`` in us since the plugin started, often ending with
``{}]`` (docs/formats.md, section 3). ``COLL`` events carry ``SeqNum``, ``CommHash``, ``Rank``,
``Count``, ``Datatype``, ``Algorithm``, ``Protocol`` and ``nChannels``; ``P2P`` events the
peer. A begin and its end are paired by (category, id). The end of a COLL event marks
when NCCL enqueued the work, not when it completed: the span goes to ``cpu_ts_ns`` /
``cpu_dur_ns`` and ``dur_ns`` stays null (no transfer time, so no bandwidth either).
NCCL 2.29's copy-engine collectives (``CE_COLL``: ``count``, ``datatype``, and in GPU timing
mode ``duration_gpu_us``, which becomes ``dur_ns``) are stored too; they name no rank or
communicator, so they take the dump's one rank. The other categories (``PROXY``, ``NET``, ``KERNEL_LAUNCH``, ``GPU``...)
are counted, not stored.

NCCL 2.28's example prints ``"datatype": %s`` and ``"Stream": %p`` without quotes in
``COLL_API``, ``P2P_API`` and ``KERNEL_LAUNCH`` events, so its files are not JSON as written.
:func:`_quote_bare_values` quotes exactly those two fields when they hold the token shapes
printf gives them (an NCCL datatype name; a pointer ``0x...`` or glibc's ``(nil)``) and
nothing else (docs/formats.md, section 3, "Profiler plugin"). ``P2P`` events: a ``Send``'s
``Peer`` is the ``dst_rank`` (``src_rank`` = ``Rank``), a ``Recv``'s the ``src_rank``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgspec

from tracelake.contracts.errors import TraceFormatError

from .model import ParseOptions, TraceInfo
from .nccl_ops import collective_name, nccl_tests_bytes
from .source import read_whole
from .tables import fit_int, fit_text, write_table

FORMAT = "nccl_profiler"
NEWLINE = b"\n"

#: ``ncclFloat32``-style names (and the short ``f32`` ones) -> bytes per element.
DTYPE_BYTES = {"ncclInt8": 1, "ncclUint8": 1, "ncclInt32": 4, "ncclUint32": 4, "ncclInt64": 8, "ncclUint64": 8,
               "ncclFloat16": 2, "ncclFloat32": 4, "ncclFloat64": 8, "ncclBfloat16": 2, "ncclFloat8e4m3": 1,
               "ncclFloat8e5m2": 1, "ncclFloat": 4, "ncclHalf": 2, "ncclDouble": 8, "ncclInt": 4, "ncclChar": 1}


def sniff(head: bytes, filename: str) -> bool:
    """A JSON array of b/e events with NCCL's COLL/P2P arguments."""
    return head.lstrip()[:1] == b"[" and (b'"SeqNum"' in head or b'"CommHash"' in head
                                          or _API_CATEGORY.search(head) is not None)


#: The 2.28 API-level categories; a dump may open with them before any COLL event.
_API_CATEGORY = re.compile(rb'"cat": ?"(?:COLL_API|P2P_API|GROUP_API|KERNEL_LAUNCH)"')

#: The only fields the plugin may print unquoted, and the token each may then hold
#: (docs/formats.md, section 3): ``%s`` of an NCCL datatype name, ``%p`` of a stream.
_BARE_VALUES = re.compile(rb'("datatype": ?)(nccl[A-Za-z0-9]{1,24})(?=\s*[,}])'
                          rb'|("Stream": ?)(0x[0-9a-fA-F]{1,16}|\(nil\))(?=\s*[,}])')


def _quote_bare_values(text: bytes) -> bytes:
    """Quote the allow-listed bare ``datatype``/``Stream`` values; leaves line numbers as they are."""
    return _BARE_VALUES.sub(lambda m: (m.group(1) or m.group(3)) + b'"' + (m.group(2) or m.group(4)) + b'"', text)


def _decode_error_place(text: bytes, message: str) -> str | None:
    """``line N`` for the ``(byte N)`` msgspec names in ``message``; None when it names none."""
    found = re.search(r"\(byte (\d+)\)", message)
    if found is None:
        return None
    offset = min(int(found.group(1)), len(text))
    return f"line {text.count(NEWLINE, 0, offset) + 1}"


class _Event(msgspec.Struct, gc=False):
    ph: str | None = None
    cat: str | None = None
    name: str | None = None
    id: int | str | None = None
    ts: float | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    args: dict[str, Any] | None = None


#: Categories that become ``collectives`` rows (docs/formats.md, section 3, "Profiler plugin").
_ROW_CATEGORIES = ("COLL", "P2P", "CE_COLL")


def _gpu_ns(value: object) -> int | None:
    """CE_COLL's ``duration_gpu_us`` (GPU timing mode only) as nanoseconds."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < _MAX_TS_US:
        return None  # a duration is never negative
    return round(value * 1000)


#: Timestamps (µs) beyond this do not fit 64-bit nanoseconds, nor do spans between two of them.
_MAX_TS_US = float(1 << 63) / 1000 / 2


def parse(source: Path, staging: Path, options: ParseOptions) -> TraceInfo:
    """Parse one profiler-plugin dump.

    Raises:
        TraceFormatError: not a JSON array of events, or no COLL/P2P events in it.
    """
    data = read_whole(source, on_bytes=options.on_bytes, name=options.source_name)
    text = data.rstrip()
    if text.endswith(b"{}]"):  # the plugin closes the array with an empty object
        text = text[:-3].rstrip().rstrip(b",") + b"]"
    text = _quote_bare_values(text)
    try:
        events = msgspec.json.decode(text, type=list[_Event])
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise TraceFormatError(options.source_name, f"not a JSON array of trace events ({exc})",
                               where=_decode_error_place(text, str(exc))) from None
    begins: dict[tuple[str, object], _Event] = {}
    pairs: list[tuple[_Event, _Event | None]] = []
    for index, event in enumerate(events):
        if event.cat not in _ROW_CATEGORIES or event.ph not in ("b", "e"):
            continue
        if event.ts is not None and not -_MAX_TS_US < event.ts < _MAX_TS_US:
            raise TraceFormatError(options.source_name, f"ts {event.ts!r} is out of range (not microseconds)",
                                   where=f"event [{index}]")
        key = (event.cat, event.id)
        if event.ph == "b":
            begins[key] = event
        elif key in begins:
            pairs.append((begins.pop(key), event))
    pairs.extend((begin, None) for begin in begins.values())  # begun, never ended (a hang?)
    if not pairs:
        raise TraceFormatError(options.source_name, f"no COLL, P2P or CE_COLL events among {len(events):,} events")
    columns = ("event_id", "rank", "collective", "process_group", "seq", "dtype", "in_nelems", "message_bytes",
               "src_rank", "dst_rank", "ts_ns", "dur_ns", "cpu_ts_ns", "cpu_dur_ns", "algorithm", "protocol",
               "channels", "is_async", "source")
    rows: dict[str, list[object]] = {c: [] for c in columns}
    for index, (begin, end) in enumerate(sorted(pairs, key=lambda p: p[0].ts or 0.0)):
        args = begin.args or {}
        collective = collective_name(str(begin.name or fit_text(args.get("Func")) or "unknown"))
        count = fit_int(args.get("Count", args.get("count")))  # CE_COLL args are lower case
        dtype = fit_text(args.get("Datatype", args.get("datatype")))
        size = DTYPE_BYTES.get(str(dtype))
        n_ranks = fit_int(args.get("nRanks"), 32)
        message = fit_int(nccl_tests_bytes(collective, count * size if count is not None and size is not None else None,
                                        n_ranks))
        ts = round(begin.ts * 1000) if begin.ts is not None else None
        dur = round((end.ts - begin.ts) * 1000) if end is not None and end.ts is not None and begin.ts is not None \
            else None
        comm = fit_text(args.get("CommHash"))
        group = None if comm is None else (comm + (":p2p" if begin.cat == "P2P" else ""))
        src, dst = _peers(begin.cat, collective, fit_int(args.get("Rank"), 32), fit_int(args.get("Peer"), 32))
        for column, value in (
            ("event_id", index), ("rank", fit_int(args.get("Rank"), 32)),
            ("collective", collective), ("process_group", group),
            ("seq", fit_int(args.get("SeqNum"))),
            ("dtype", dtype), ("in_nelems", count), ("message_bytes", message),
            ("src_rank", src), ("dst_rank", dst),
            ("ts_ns", ts), ("dur_ns", _gpu_ns(args.get("duration_gpu_us"))), ("cpu_ts_ns", ts),
            ("cpu_dur_ns", fit_int(dur)),
            ("algorithm", fit_text(args.get("Algorithm"))), ("protocol", fit_text(args.get("Protocol"))),
            ("channels", fit_int(args.get("nChannels", args.get("nMaxChannels")), 32)),
            ("is_async", False), ("source", "nccl_profiler"),
        ):
            rows[column].append(value)
    ranks = sorted({r for r in rows["rank"] if isinstance(r, int)})
    if len(ranks) == 1:  # one dump is one rank's; CE_COLL events do not repeat it
        rows["rank"] = [ranks[0] if r is None else r for r in rows["rank"]]
    write_table(staging, "collectives", rows, trace_id=options.trace_id)
    info = TraceInfo(format=FORMAT, event_count=len(events), uncompressed_bytes=len(data))
    info.rank = ranks[0] if ranks else 0
    info.rank_source = "profiler plugin events"
    info.backend = "nccl"
    unfinished = sum(1 for _, end in pairs if end is None)
    if unfinished:
        info.warnings.append(f"{unfinished} NCCL operations began and never ended in this dump")
    return info


def _peers(category: str | None, collective: str, rank: int | None, peer: int | None) -> tuple[int | None, int | None]:
    """(src_rank, dst_rank) of a P2P event: a Send goes from its rank to the peer, a Recv the other way."""
    if category != "P2P":
        return None, None
    if collective == "send":
        return rank, peer
    if collective == "recv":
        return peer, rank
    return None, None
