"""Vectorised decoding of an XLine's events: protobuf wire format read with numpy, many messages at once.

An ``XLine`` holds its events as a run of length-delimited fields (tag ``0x22``,
a varint length, an ``XEvent``). Decoding them through protobuf's Python objects
costs about half a microsecond per event; here the work is done on whole arrays:

1. :func:`find_events` locates the events of a window of the line: every byte
   ``0x22`` is a candidate tag, each candidate's length gives the next one, and
   the real events are the candidates reachable from the first (the others are
   ``0x22`` bytes inside an event's body). No per-event Python.
2. :func:`scan_fields` decodes the fields of many messages at once, one field
   of every message per round (an ``XEvent`` has three or four fields), and
   :func:`event_fields` reads an ``XEvent``'s integers out of it.

Positions are relative to the window's bytes; errors are :class:`WireError`
with the relative offset, which the caller turns into a file offset.

The three decoders (:func:`find_events`, :func:`event_fields`, :func:`stat_fields`) run in C
(``_xspace.c``: one pass, with the GIL released) where that is built; the numpy versions here
are the reference, run where it is not, and say where the bytes are damaged when the C one finds
they are (it only says whether). Tests keep the two equal.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import ModuleType

import numpy as np

from .protowire import I32, I64, LEN, VARINT, WireError, padded, varints

EVENT_TAG = 0x22  # XLine.events: field 4, length-delimited
_XEVENT_METADATA_ID, _XEVENT_OFFSET_PS, _XEVENT_DURATION_PS, _XEVENT_STATS, _XEVENT_NUM_OCCURRENCES = 1, 2, 3, 4, 5
#: Rounds of the "reachable from the first event" sweep before falling back to following the chain in Python.
SWEEP_ROUNDS = 64

_EMPTY = np.empty(0, dtype=np.int64)

_native: ModuleType | None
try:
    _native = importlib.import_module(f"{__package__}._xspace")
except ImportError:  # no compiler where it was installed: the numpy decoders
    _native = None


def native() -> bool:
    """Whether the C decoders are in use."""
    return _native is not None


def _int64s(data: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(data, dtype=np.int64)


@dataclass
class Located:
    """The events :func:`find_events` found at the start of a window.

    ``starts``/``ends`` are each event's body (relative to the window); the events
    run from offset 0 to ``stop``, where the next field (or the part of the line
    past the window) begins. ``cut`` is True when the event at ``stop`` was left
    out because it does not end inside the window (or its tag or length is damaged).
    """

    starts: np.ndarray
    ends: np.ndarray
    stop: int
    cut: bool


def find_events(data: np.ndarray, size: int) -> Located:
    """Locate the run of events at the start of ``data[:size]`` (``data[0]`` is an event tag); in C where it is
    built, else :func:`find_events_numpy`."""
    if _native is None:
        return find_events_numpy(data, size)
    starts, ends, stop, cut = _native.find_events(data, size)
    return Located(np.frombuffer(starts, dtype=np.int64), np.frombuffer(ends, dtype=np.int64), stop, cut)


def find_events_numpy(data: np.ndarray, size: int) -> Located:
    """Locate the run of events at the start of ``data[:size]`` (``data[0]`` is an event tag).

    ``data`` has at least 8 bytes of padding after ``size`` (see :func:`padded`).

    Every ``0x22`` byte is a candidate tag; a candidate's length varint says where
    the next field begins. The real tags are those reachable from the first one;
    the others (``0x22`` bytes inside events) are dropped by a sweep that keeps only
    candidates that some kept candidate points at, until nothing changes.
    """
    cand = np.flatnonzero(data[:size] == EVENT_TAG)
    if not len(cand) or cand[0] != 0:
        raise ValueError("find_events: data must start with an event tag")
    lengths, body, ok = varints(data, cand + 1, size, strict=False)
    fits = ok & (lengths <= np.uint64(size))
    nxt = np.where(fits, body + np.where(fits, lengths, 0).astype(np.int64), size + 1)
    fits &= nxt <= size
    j = np.searchsorted(cand, nxt)
    inside = j < len(cand)
    succ = np.where(inside, j, 0)
    succ = np.where(fits & inside & (cand[succ] == nxt), succ, -1)
    path = _reachable(succ)
    last = int(path[-1])
    if fits[last]:
        keep = path
        stop, cut = int(nxt[last]), False
    else:
        keep = path[:-1]
        stop, cut = int(cand[last]), True
    return Located(body[keep], nxt[keep], stop, cut)


def _reachable(succ: np.ndarray) -> np.ndarray:
    """Indices of the nodes on the path from node 0 (``succ[i]`` > i, or -1 at the end), in order."""
    n = len(succ)
    alive = np.ones(n, dtype=bool)
    count = n
    linked = succ >= 0
    for _ in range(SWEEP_ROUNDS):
        nxt = np.zeros(n, dtype=bool)
        nxt[succ[alive & linked]] = True
        nxt[0] = True
        kept = int(np.count_nonzero(nxt))
        alive = nxt
        if kept == count:  # the sweep only ever removes nodes: same count, same set
            return np.flatnonzero(alive)
        count = kept
    # Long runs of false tags (not seen in real files): follow the chain itself.
    chain: list[int] = []
    step = succ.tolist()
    i = 0
    while i >= 0:
        chain.append(i)
        i = step[i]
    return np.array(chain, dtype=np.int64)


@dataclass
class Scanned:
    """Fields of many messages decoded at once by :func:`scan_fields`.

    Per wanted varint or fixed64 field: the value in each message (the last one
    written, as protobuf keeps it; 0 where absent) and where it was written (-1
    where absent; the order matters for oneofs). Per wanted length-delimited
    field: every occurrence as (message index, start, end), in file order.
    """

    values: dict[int, np.ndarray] = field(default_factory=dict)
    written_at: dict[int, np.ndarray] = field(default_factory=dict)
    ranges: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=dict)


def scan_fields(
    data: np.ndarray, starts: np.ndarray, ends: np.ndarray, *,
    varint_fields: tuple[int, ...] = (), fixed64_fields: tuple[int, ...] = (), len_fields: tuple[int, ...] = (),
) -> Scanned:
    """Decode the fields of the messages ``data[starts[i]:ends[i]]``, one field of each per round.

    ``data`` has at least 8 bytes of padding after the last message (see :func:`padded`).

    Fields not asked for, and asked-for fields with another wire type, are skipped as
    protobuf skips unknown fields.

    Raises:
        WireError: a truncated varint, a field number 0, a group or other unsupported
            wire type, or a field running past the end of its message.
    """
    n = len(starts)
    out = Scanned()
    for f in varint_fields + fixed64_fields:
        out.values[f] = np.zeros(n, dtype=np.uint64)
        out.written_at[f] = np.full(n, -1, dtype=np.int64)
    found: dict[int, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {f: [] for f in len_fields}
    pos = starts.astype(np.int64, copy=True)
    active = np.flatnonzero(pos < ends)
    while active.size:
        lim = ends[active]
        tag_at = pos[active]
        tag_byte = data[tag_at]
        if not (tag_byte & 0x87).any() and tag_byte.all():
            # The usual round: one-byte tags of varint fields only (an XEvent without stats).
            number = tag_byte >> 3
            var_values, after, _ = varints(data, tag_at + 1, lim)
            _store(out, varint_fields, number, active, n, var_values, tag_at + 1)
            pos[active] = after
            active = active[after < lim]
            continue
        tag, at, _ = varints(data, tag_at, lim)
        number = (tag >> np.uint64(3)).astype(np.int64)
        wire = (tag & np.uint64(7)).astype(np.int64)
        if not number.all():
            raise WireError("field number 0 (not protobuf data)", int(tag_at[np.argmin(number)]))
        known = (wire == VARINT) | (wire == LEN) | (wire == I64) | (wire == I32)
        if not known.all():
            bad = int(np.argmin(known))
            raise WireError(f"unsupported wire type {int(wire[bad])} (corrupt event?)", int(tag_at[bad]))
        after = at + np.where(wire == I64, 8, 4)
        is_var = np.flatnonzero(wire == VARINT)
        var_values, after[is_var], _ = varints(data, at[is_var], lim[is_var])
        is_len = np.flatnonzero(wire == LEN)
        length, body, _ = varints(data, at[is_len], lim[is_len])
        room = (lim[is_len] - body).astype(np.uint64)
        past = length > room
        if past.any():
            raise WireError("a field runs past the end of its event (file cut short?)", int(tag_at[is_len[np.argmax(past)]]))
        after[is_len] = body + length.astype(np.int64)
        past = after > lim
        if past.any():
            raise WireError("a field runs past the end of its event (file cut short?)", int(tag_at[np.argmax(past)]))
        _store(out, varint_fields, number[is_var], active[is_var], n, var_values, at[is_var])
        if fixed64_fields:
            is_64 = np.flatnonzero(wire == I64)
            for f in fixed64_fields:
                sel = is_64[number[is_64] == f]
                if sel.size:
                    raw = data[at[sel][:, None] + np.arange(8)]
                    out.values[f][active[sel]] = np.ascontiguousarray(raw).view("<u8").ravel()
                    out.written_at[f][active[sel]] = at[sel]
        len_numbers = number[is_len]
        for f in len_fields:
            sel = np.flatnonzero(len_numbers == f)
            if sel.size:
                found[f].append((active[is_len[sel]], body[sel], after[is_len[sel]]))
        pos[active] = after
        active = active[after < lim]
    for f, parts in found.items():
        if not parts:
            out.ranges[f] = (_EMPTY, _EMPTY, _EMPTY)
            continue
        who, start, end = (np.concatenate(p) for p in zip(*parts, strict=True))
        order = np.argsort(start, kind="stable")  # file order: by message, then within it
        out.ranges[f] = (who[order], start[order], end[order])
    return out


def _store(
    out: Scanned, wanted: tuple[int, ...], number: np.ndarray, who: np.ndarray, n: int, values: np.ndarray,
    at: np.ndarray,
) -> None:
    """Keep the varint ``values`` (written at ``at``) of the fields ``number`` of the messages ``who`` that are
    ``wanted``. A round usually reads the same field of every message: then with no per-field selection, and
    no scatter if it reads every one of the ``n`` messages."""
    if not len(who):
        return
    if number.min() == number.max():  # one field in every message of the round
        f = int(number[0])
        if f in wanted:
            if len(who) == n:  # each message once, in order
                out.values[f][:] = values
                out.written_at[f][:] = at
            else:
                out.values[f][who] = values
                out.written_at[f][who] = at
        return
    for f in wanted:
        sel = np.flatnonzero(number == f)
        if sel.size:
            out.values[f][who[sel]] = values[sel]
            out.written_at[f][who[sel]] = at[sel]


@dataclass
class EventFields:
    """The integers of many ``XEvent`` s, as protobuf reads them (0 where absent), and where their stats are."""

    metadata_id: np.ndarray
    offset_ps: np.ndarray
    duration_ps: np.ndarray
    num_occurrences: np.ndarray
    #: Each ``XStat`` of the events: (event index, start, end) relative to the window, in file order.
    stats: tuple[np.ndarray, np.ndarray, np.ndarray]


def event_fields(data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> EventFields:
    """:func:`event_fields_numpy`, in C where it is built (damaged bytes: the numpy decoder says where).

    Raises:
        WireError: damaged event bytes.
    """
    if _native is not None:
        got = _native.event_fields(data, _int64s(starts), _int64s(ends))
        if got is not None:
            md, offset, duration, occurrences, who, start, end = (np.frombuffer(x, dtype=np.int64) for x in got)
            return EventFields(md, offset, duration, occurrences, (who, start, end))
    return event_fields_numpy(data, starts, ends)


def event_fields_numpy(data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> EventFields:
    """Decode ``XEvent`` bodies (``data[starts[i]:ends[i]]``, padded): ids, offsets, durations, occurrences, stats.

    ``offset_ps`` and ``num_occurrences`` are a oneof: the one written last wins and
    the other reads 0.

    Raises:
        WireError: damaged event bytes (see :func:`scan_fields`).
    """
    scanned = scan_fields(
        data, starts, ends,
        varint_fields=(_XEVENT_METADATA_ID, _XEVENT_OFFSET_PS, _XEVENT_DURATION_PS, _XEVENT_NUM_OCCURRENCES),
        len_fields=(_XEVENT_STATS,),
    )
    values, at = scanned.values, scanned.written_at
    occurrences_last = at[_XEVENT_NUM_OCCURRENCES] > at[_XEVENT_OFFSET_PS]
    offset = values[_XEVENT_OFFSET_PS].view(np.int64)
    occurrences = values[_XEVENT_NUM_OCCURRENCES].view(np.int64)
    return EventFields(
        metadata_id=values[_XEVENT_METADATA_ID].view(np.int64),
        offset_ps=np.where(occurrences_last, 0, offset),
        duration_ps=values[_XEVENT_DURATION_PS].view(np.int64),
        num_occurrences=np.where(occurrences_last, occurrences, 0),
        stats=scanned.ranges[_XEVENT_STATS],
    )


_XSTAT_METADATA_ID = 1
#: ``XStat.value``'s oneof members by field number: double, uint64, int64, string, bytes, reference.
STAT_DOUBLE, STAT_UINT64, STAT_INT64, STAT_STR, STAT_BYTES, STAT_REF = 2, 3, 4, 5, 6, 7
STAT_NONE = 0


@dataclass
class StatFields:
    """Many ``XStat`` s decoded at once (see :func:`stat_fields`), one entry per stat, in file order.

    ``kind`` is the field number of the value the stat holds (``STAT_*``; :data:`STAT_NONE`
    when it holds none); ``value`` the raw 64 bits of an integer, reference or double value;
    ``start``/``end`` the bytes of a string or bytes value (relative to the window).
    """

    event: np.ndarray
    metadata_id: np.ndarray
    kind: np.ndarray
    value: np.ndarray
    start: np.ndarray
    end: np.ndarray


def stat_fields(data: np.ndarray, event: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> StatFields:
    """:func:`stat_fields_numpy`, in C where it is built (damaged bytes: the numpy decoder says where).

    Raises:
        WireError: damaged stat bytes.
    """
    if _native is not None:
        got = _native.stat_fields(data, _int64s(starts), _int64s(ends))
        if got is not None:
            md, kind, value, start, end = got
            return StatFields(event, np.frombuffer(md, dtype=np.int64), np.frombuffer(kind, dtype=np.int64),
                              np.frombuffer(value, dtype=np.uint64), np.frombuffer(start, dtype=np.int64),
                              np.frombuffer(end, dtype=np.int64))
    return stat_fields_numpy(data, event, starts, ends)


def stat_fields_numpy(data: np.ndarray, event: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> StatFields:
    """Decode ``XStat`` bodies (``data[starts[i]:ends[i]]``, padded; ``event[i]`` the event each belongs to).

    The value is a oneof: of the value fields, the one written last wins, as in protobuf.

    Raises:
        WireError: damaged stat bytes (see :func:`scan_fields`).
    """
    n = len(starts)
    scanned = scan_fields(
        data, starts, ends, varint_fields=(_XSTAT_METADATA_ID, STAT_UINT64, STAT_INT64, STAT_REF),
        fixed64_fields=(STAT_DOUBLE,), len_fields=(STAT_STR, STAT_BYTES),
    )
    kinds = (STAT_DOUBLE, STAT_UINT64, STAT_INT64, STAT_STR, STAT_BYTES, STAT_REF)
    value_start = np.zeros(n, dtype=np.int64)
    value_end = np.zeros(n, dtype=np.int64)
    kind = np.full(n, STAT_NONE, dtype=np.int64)
    latest = np.full(n, -1, dtype=np.int64)  # where the value kept so far was written (-1: none)
    for number in kinds:  # a tie (none written) keeps the earlier kind
        if number in (STAT_STR, STAT_BYTES):
            who, start, end = scanned.ranges[number]
            if len(who):
                last = np.r_[who[1:] != who[:-1], True]  # ranges are in file order: the last one per stat
                who, start = who[last], start[last]
                later = start > latest[who]
                latest[who[later]] = start[later]
                kind[who[later]] = number
        else:
            at = scanned.written_at[number]
            later = np.flatnonzero(at > latest)
            if later.size:
                latest[later] = at[later]
                kind[later] = number
    value = np.zeros(n, dtype=np.uint64)
    for k in (STAT_DOUBLE, STAT_UINT64, STAT_INT64, STAT_REF):
        sel = kind == k
        value[sel] = scanned.values[k][sel]
    for k in (STAT_STR, STAT_BYTES):
        who, start, end = scanned.ranges[k]
        if len(who):
            last = np.r_[who[1:] != who[:-1], True]
            who, start, end = who[last], start[last], end[last]
            mine = kind[who] == k
            value_start[who[mine]], value_end[who[mine]] = start[mine], end[mine]
    return StatFields(event=event, metadata_id=scanned.values[_XSTAT_METADATA_ID].view(np.int64), kind=kind,
                      value=value, start=value_start, end=value_end)
