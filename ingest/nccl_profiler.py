"""NCCL profiler plugin example output (NCCL >= 2.23) into ``collectives``.

One Chrome-trace JSON array per communicator and rank (``<dump>_<commHash>_<rank>.json``)
of async ``b``/``e`` events, ``ts`` in us since the plugin started, often ending with
``{}]`` (docs/formats.md, section 3). ``COLL`` events carry ``SeqNum``, ``CommHash``, ``Rank``,
``Count``, ``Datatype``, ``Algorithm``, ``Protocol`` and ``nChannels``; ``P2P`` events the
peer. A begin and its end are paired by (category, id). The end of a COLL event marks
when NCCL enqueued the work, not when it completed: the span goes to ``cpu_ts_ns`` /
``cpu_dur_ns`` and ``dur_ns`` stays null (no transfer time, so no bandwidth either). The other categories (``PROXY``, ``NET``, ``KERNEL_LAUNCH``, ``GPU``...)
are counted, not stored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from tracelake.warehouse.errors import TraceFormatError

from .model import ParseOptions, TraceInfo
from .nccl_ops import collective_name, nccl_tests_bytes
from .source import read_whole
from .tables import fit_int, fit_text, write_table

FORMAT = "nccl_profiler"

#: ``ncclFloat32``-style names (and the short ``f32`` ones) -> bytes per element.
DTYPE_BYTES = {"ncclInt8": 1, "ncclUint8": 1, "ncclInt32": 4, "ncclUint32": 4, "ncclInt64": 8, "ncclUint64": 8,
               "ncclFloat16": 2, "ncclFloat32": 4, "ncclFloat64": 8, "ncclBfloat16": 2, "ncclFloat8e4m3": 1,
               "ncclFloat8e5m2": 1, "ncclFloat": 4, "ncclHalf": 2, "ncclDouble": 8, "ncclInt": 4, "ncclChar": 1}


def sniff(head: bytes, filename: str) -> bool:
    """A JSON array of b/e events with NCCL's COLL/P2P arguments."""
    return head.lstrip()[:1] == b"[" and (b'"SeqNum"' in head or b'"CommHash"' in head)


class _Event(msgspec.Struct, gc=False):
    ph: str | None = None
    cat: str | None = None
    name: str | None = None
    id: int | str | None = None
    ts: float | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    args: dict[str, Any] | None = None


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
    try:
        events = msgspec.json.decode(text, type=list[_Event])
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise TraceFormatError(options.source_name, f"not a JSON array of trace events ({exc})") from None
    begins: dict[tuple[str, object], _Event] = {}
    pairs: list[tuple[_Event, _Event | None]] = []
    for index, event in enumerate(events):
        if event.cat not in ("COLL", "P2P") or event.ph not in ("b", "e"):
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
        raise TraceFormatError(options.source_name, f"no COLL or P2P events among {len(events):,} events")
    columns = ("event_id", "rank", "collective", "process_group", "seq", "dtype", "in_nelems", "message_bytes",
               "dst_rank", "ts_ns", "cpu_ts_ns", "cpu_dur_ns", "algorithm", "protocol", "channels", "is_async",
               "source")
    rows: dict[str, list[object]] = {c: [] for c in columns}
    for index, (begin, end) in enumerate(sorted(pairs, key=lambda p: p[0].ts or 0.0)):
        args = begin.args or {}
        collective = collective_name(str(begin.name or fit_text(args.get("Func")) or "unknown"))
        count = fit_int(args.get("Count"))
        size = DTYPE_BYTES.get(str(args.get("Datatype")))
        n_ranks = fit_int(args.get("nRanks"), 32)
        message = fit_int(nccl_tests_bytes(collective, count * size if count is not None and size is not None else None,
                                        n_ranks))
        ts = round(begin.ts * 1000) if begin.ts is not None else None
        dur = round((end.ts - begin.ts) * 1000) if end is not None and end.ts is not None and begin.ts is not None \
            else None
        comm = fit_text(args.get("CommHash"))
        group = None if comm is None else (comm + (":p2p" if begin.cat == "P2P" else ""))
        for column, value in (
            ("event_id", index), ("rank", fit_int(args.get("Rank"), 32)),
            ("collective", collective), ("process_group", group),
            ("seq", fit_int(args.get("SeqNum"))),
            ("dtype", fit_text(args.get("Datatype"))), ("in_nelems", count), ("message_bytes", message),
            ("dst_rank", fit_int(args.get("Peer"), 32)),
            ("ts_ns", ts), ("cpu_ts_ns", ts), ("cpu_dur_ns", fit_int(dur)),
            ("algorithm", fit_text(args.get("Algorithm"))), ("protocol", fit_text(args.get("Protocol"))),
            ("channels", fit_int(args.get("nChannels"), 32)),
            ("is_async", False), ("source", "nccl_profiler"),
        ):
            rows[column].append(value)
    write_table(staging, "collectives", rows, trace_id=options.trace_id)
    info = TraceInfo(format=FORMAT, event_count=len(events), uncompressed_bytes=len(data))
    ranks = sorted({r for r in rows["rank"] if isinstance(r, int)})
    info.rank = ranks[0] if ranks else 0
    info.rank_source = "profiler plugin events"
    info.backend = "nccl"
    unfinished = sum(1 for _, end in pairs if end is None)
    if unfinished:
        info.warnings.append(f"{unfinished} NCCL operations began and never ended in this dump")
    return info
