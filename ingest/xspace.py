"""Reading an XSpace (``.xplane.pb``) piece by piece.

The file is memory-mapped and split with :mod:`.protowire`: planes, then each
plane's header (everything but its lines) and the byte ranges of its lines.
Lines are read in windows of at most :data:`LINE_CHUNK_BYTES` (see
:meth:`Space.batches`): the events of a window are located and decoded as arrays
by :mod:`.xspace_events` (their stats too, by name: :meth:`EventBatch.stats`), or
by protobuf's C decoder (:meth:`Space.lines`). Memory follows the window, not
the file: windows are read with ``pread``, and the pages of the memory map that
walking tags and line headers touched are unmapped as each line is done (see
:meth:`Space._release`), so the file's pages do not pile up in the process's
memory either.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError

from tracelake.contracts.errors import TraceFormatError

from . import protowire, xspace_events
from .source import read_ahead
from .xplane_proto import HloProto, XLine, XPlaneHeader, XSpace
from .xspace_events import EventFields, StatFields
from .xspace_stats import BatchStats

#: Lines are read in windows of at most this many bytes (more only for a single bigger event). Decoding a
#: window takes about 100x its size in transient arrays and Arrow columns (1 MB: ~70,000 TPU ops); beyond
#: about 1 MB a bigger window only adds memory, not speed.
LINE_CHUNK_BYTES = 1 << 20

#: Batches :meth:`Space.decoded` reads and decodes ahead of its caller (each some 100 KB to a few MB once
#: decoded).
AHEAD = 2

#: Pages the kernel maps around a touched one (fault-around, 64 KiB by default), released with it.
_RELEASE_MARGIN = 1 << 20
_DONTNEED: int | None = getattr(mmap, "MADV_DONTNEED", None)  # not on Windows: pages are then left mapped
_SPACE_PLANES, _SPACE_HOSTNAMES = 1, 4
_PLANE_LINES = 3
_LINE_NAME, _LINE_EVENTS = 2, 4
_EVENT_TAG = _LINE_EVENTS << 3 | protowire.LEN


def stat_value(stat: Any, names: dict[int, str]) -> object:
    """The value of an ``XStat``; a ``ref_value`` is resolved to the name it refers to."""
    kind = stat.WhichOneof("value")
    if kind is None:
        return None
    value = getattr(stat, kind)
    if kind == "ref_value":
        return names.get(value)
    return value


@dataclass
class Plane:
    """One XPlane: its header decoded, its lines as byte ranges of the file."""

    position: int
    offset: int
    header: Any
    line_ranges: list[tuple[int, int]]
    stat_names: dict[int, str] = field(default_factory=dict)
    _metadata_stats: dict[int, dict[str, object]] = field(default_factory=dict)
    #: Stats (and ``ref_value`` s) seen that refer to a stat metadata id the plane does not declare: id -> count.
    unknown_stat_ids: dict[int, int] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.header.name)

    def named_stats(self, stats: Any) -> dict[str, object]:
        """``XStat`` s by name (a later one of the same name wins, as in XProf).

        Stats whose metadata id the plane does not declare are left out, and a
        ``ref_value`` to an undeclared id reads None; both are counted in
        :attr:`unknown_stat_ids` (profilers add stat types all the time, and a
        damaged file may refer to ids it never wrote: neither is a reason to fail).
        """
        names = self.stat_names
        out: dict[str, object] = {}
        for s in stats:
            name = names.get(s.metadata_id)
            if name is None:
                self._unknown(s.metadata_id)
                continue
            value = stat_value(s, names)
            if value is None and s.WhichOneof("value") == "ref_value":
                self._unknown(s.ref_value)
            out[name] = value
        return out

    def _unknown(self, metadata_id: int, count: int = 1) -> None:
        self.unknown_stat_ids[metadata_id] = self.unknown_stat_ids.get(metadata_id, 0) + count

    def stats(self) -> dict[str, object]:
        """The plane's own stats by name (see :meth:`named_stats`)."""
        return self.named_stats(self.header.stats)

    def metadata_stats(self, metadata_id: int) -> dict[str, object]:
        """The stats of an event metadata entry by name (cached: many events share one)."""
        found = self._metadata_stats.get(metadata_id)
        if found is None:
            md = self.header.event_metadata.get(metadata_id)
            found = {} if md is None else self.named_stats(md.stats)
            self._metadata_stats[metadata_id] = found
        return found


_NO_BYTES = np.zeros(8, dtype=np.uint8)
_NO_EVENTS = np.zeros(0, dtype=np.int64)


@dataclass
class EventBatch:
    """A run of one line's events: located in a window of the file, decoded on demand.

    ``header`` is the line's ``XLine`` without its events (see :meth:`Space.batches`
    for which header fields it holds); ``data`` the window's bytes, from file offset
    ``base``, and 8 bytes of padding; the events' bodies are ``data[starts[i]:ends[i]]``
    and the events take ``data[:stop]``.
    """

    source: str
    base: int
    data: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    stop: int
    header: Any = None
    header_bytes: bytes = b""
    #: The last run of its line.
    last: bool = False
    #: Its line came in one window (:data:`LINE_CHUNK_BYTES`): the line's runs, if several, are split only by
    #: header fields written between events; :meth:`Space.lines` decodes such a line as one ``XLine``.
    whole: bool = False
    #: What :meth:`decode` decoded ahead: the events' fields, and their stats' fields.
    _fields: EventFields | None = field(default=None, repr=False)
    _stat_fields: StatFields | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.starts)

    def fields(self) -> EventFields:
        """The events' integers and stat ranges as arrays (see :func:`.xspace_events.event_fields`).

        Raises:
            TraceFormatError: a damaged event, with its byte offset in the file.
        """
        if self._fields is not None:
            return self._fields
        try:
            return xspace_events.event_fields(self.data, self.starts, self.ends)
        except protowire.WireError as exc:
            raise TraceFormatError(self.source, f"line {self._name()!r}: damaged event ({exc})",
                                   where=f"byte {self.base + exc.offset}") from None

    def decode(self, stats: bool) -> None:
        """Decode the events' fields (and with ``stats``, their stats' fields) now, for :meth:`fields` and
        :meth:`stats` to return: on :meth:`Space.decoded`'s thread, ahead of the reader. Bytes that cannot be
        decoded are left to those two, which say what is wrong when the reader gets to them."""
        try:
            fields = xspace_events.event_fields(self.data, self.starts, self.ends)
            if stats:
                who, starts, ends = fields.stats
                self._stat_fields = xspace_events.stat_fields(self.data, who, starts, ends)
            self._fields = fields
        except protowire.WireError:
            self._stat_fields = None

    def stats(self, plane: Plane, fields: EventFields) -> BatchStats:
        """The events' stats (``fields.stats``) decoded in bulk, by name (see :class:`BatchStats`).

        Raises:
            TraceFormatError: a damaged stat, with its byte offset in the file.
        """
        if self._stat_fields is not None and fields is self._fields:
            return BatchStats(plane, self, self._stat_fields, len(self))
        who, starts, ends = fields.stats
        try:
            decoded = xspace_events.stat_fields(self.data, who, starts, ends)
        except protowire.WireError as exc:
            raise TraceFormatError(self.source, f"line {self._name()!r}: damaged event stat ({exc})",
                                   where=f"byte {self.base + exc.offset}") from None
        return BatchStats(plane, self, decoded, len(self))

    def xline(self, *more: EventBatch) -> Any:
        """The run as a protobuf ``XLine`` (header and these events), for code that wants event objects;
        with ``more`` (later runs of the same line), their events follow.

        Raises:
            TraceFormatError: the events are not valid XEvent data.
        """
        events = b"".join(run.data[: run.stop].tobytes() for run in (self, *more))
        try:
            return XLine.FromString(self.header_bytes + events)
        except DecodeError as exc:
            raise TraceFormatError(self.source, f"line {self._name()!r} is not valid XLine data ({exc})",
                                   where=f"byte {self.base}") from None

    def _name(self) -> str:
        return str(self.header.name) if self.header is not None else "?"


class Space:
    """An open ``.xplane.pb``: hostnames and planes; lines decoded on demand.

    Raises (on open and while reading):
        TraceFormatError: not protobuf, not an XSpace, or cut short; with the byte offset.
    """

    def __init__(self, path: Path, source: str) -> None:
        self.source = source
        self._file = open(path, "rb")  # noqa: SIM115 - closed by close()
        try:
            self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:
            self._file.close()
            raise TraceFormatError(source, "file is empty (0 bytes)", where="byte 0") from None
        self.size = len(self._map)
        self.hostnames: list[str] = []
        self.planes: list[Plane] = []
        try:
            self._read()
            self._release(0, self.size)  # the walk over the planes touched pages all through the file
        except BaseException:
            self.close()
            raise

    def _error(self, message: str, offset: int) -> TraceFormatError:
        return TraceFormatError(self.source, message, where=f"byte {offset}")

    def _read(self) -> None:
        buf = self._map
        extra = bytearray()
        try:
            for number, wire, tag_at, start, end in protowire.fields(buf, 0, self.size):
                if number == _SPACE_PLANES and wire == protowire.LEN:
                    self.planes.append(self._plane(len(self.planes), start, end))
                else:
                    extra += buf[tag_at:end]
        except protowire.WireError as exc:
            raise self._error(f"not a readable XSpace protobuf: {exc}", exc.offset) from None
        try:
            rest = XSpace.FromString(bytes(extra))
        except DecodeError as exc:
            raise self._error(f"not a readable XSpace protobuf ({exc})", 0) from None
        self.hostnames = [str(h) for h in rest.hostnames]

    def _plane(self, position: int, start: int, end: int) -> Plane:
        buf = self._map
        header = bytearray()
        lines: list[tuple[int, int]] = []
        for number, wire, tag_at, value_at, value_end in protowire.fields(buf, start, end):
            if number == _PLANE_LINES and wire == protowire.LEN:
                lines.append((value_at, value_end))
            else:
                header += buf[tag_at:value_end]
        try:
            decoded = XPlaneHeader.FromString(bytes(header))
        except DecodeError as exc:
            raise self._error(f"plane {position} is not a valid XPlane ({exc})", start) from None
        names = {key: str(md.name) for key, md in decoded.stat_metadata.items()}
        return Plane(position, start, decoded, lines, names)

    def lines(self, plane: Plane, only: str | None = None) -> Iterator[Any]:
        """Decode the plane's lines in order; a large line comes as several ``XLine`` slices (same header).

        With ``only``, just the lines of that name (the others are skipped undecoded).
        """
        for start, end in plane.line_ranges:
            if only is not None and self._line_name(start, end) != only:
                self._release(start, end)
                continue
            if end - start <= LINE_CHUNK_BYTES:
                data = bytes(self._map[start:end])
                self._release(start, end)
                yield self._decode_line(plane, data, start)
            else:
                for batch in self._line_batches(plane, start, end):
                    yield batch.xline()

    def _line_name(self, start: int, end: int) -> str | None:
        """A line's name, read without decoding its events (they come after it)."""
        try:
            for number, wire, _, value_at, value_end in protowire.fields(self._map, start, end):
                if number == _LINE_NAME and wire == protowire.LEN:
                    return bytes(self._map[value_at:value_end]).decode("utf-8", "replace")
                if number == _LINE_EVENTS:
                    return None
        except protowire.WireError as exc:
            raise self._error(f"damaged line ({exc})", exc.offset) from None
        return None

    def batches(self, plane: Plane) -> Iterator[EventBatch]:
        """The plane's lines in order as runs of located events (at least one run per line, maybe empty).

        A line within :data:`LINE_CHUNK_BYTES` comes whole, with every header field;
        a larger one in runs of about that many bytes, each with the header fields
        written before the next run, so header fields written after the events
        (``duration_ps``, ``display_name``...) reach the last run only; the ones
        tracelake reads (id, name, timestamp) come before the events in every writer
        we know.

        Raises:
            TraceFormatError: a damaged line (with the byte offset).
        """
        for start, end in plane.line_ranges:
            yield from self._line_batches(plane, start, end)

    def decoded(self, plane: Plane, wanted: Callable[[EventBatch], bool], *,
                stats: bool) -> Generator[EventBatch, None, None]:
        """:meth:`batches`, read and decoded on a thread of their own up to :data:`AHEAD` batches ahead of the
        caller: each batch ``wanted`` picks (by its header, say) comes with its events' fields decoded (and with
        ``stats``, their stats' fields; see :meth:`EventBatch.decode`), while the caller works on the one before.

        The decoding (C, or numpy over whole arrays: :mod:`.xspace_events`) lets go of the GIL; the same batches
        come in the same order, and an error reading one is raised when the caller gets to it. Nothing else may use
        this :class:`Space` until the iterator is done or closed: a caller that may leave early (an error of its own)
        closes it on the way out (``contextlib.closing``), so that the thread stops before the file is closed,
        not whenever the garbage collector gets to the iterator.
        """
        def work() -> Iterator[EventBatch]:
            for batch in self.batches(plane):
                if len(batch) and wanted(batch):
                    batch.decode(stats)
                yield batch

        return read_ahead(work(), AHEAD, "tracelake-xspace-decode")

    def _line_batches(self, plane: Plane, start: int, end: int) -> Iterator[EventBatch]:
        """One line's runs (see :meth:`batches`): header fields walked one by one, events a window at a time."""
        whole = end - start <= LINE_CHUNK_BYTES
        header = bytearray()
        held: list[EventBatch] = []  # runs whose header is not complete yet
        pos = start
        while pos < end:
            try:
                if self._map[pos] == xspace_events.EVENT_TAG:
                    batch = self._events_at(plane, pos, end)
                    pos = batch.base + batch.stop
                    if not whole and held:  # a big line: the run before goes out with the header so far
                        yield from self._with_header(plane, held, bytes(header), start)
                        held = []
                    batch.whole = whole
                    held.append(batch)
                    self._release(batch.base, pos)
                    continue
                for _, _, field_at, _, field_end in protowire.fields(self._map, pos, end):
                    header += self._map[field_at:field_end]
                    pos = field_end
                    break
            except protowire.WireError as exc:
                raise self._error(f"plane {plane.name!r}: damaged line ({exc})", exc.offset) from None
        self._release(start, end)
        empty = EventBatch(self.source, start, _NO_BYTES, _NO_EVENTS, _NO_EVENTS, 0, whole=whole)
        held = held or [empty]
        held[-1].last = True
        yield from self._with_header(plane, held, bytes(header), start)

    def _with_header(self, plane: Plane, runs: list[EventBatch], header: bytes, start: int) -> Iterator[EventBatch]:
        decoded = self._decode_line(plane, header, start)
        for run in runs:
            run.header_bytes, run.header = header, decoded
            yield run

    def _events_at(self, plane: Plane, pos: int, end: int) -> EventBatch:
        """The run of events starting at ``pos`` that fits in a window of :data:`LINE_CHUNK_BYTES` (at least one).

        Raises:
            protowire.WireError: the first event's length is damaged or runs past ``end``.
        """
        window_end = min(pos + LINE_CHUNK_BYTES, end)
        while True:
            data = self._read_bytes(pos, window_end)
            found = xspace_events.find_events(data, window_end - pos)
            if len(found.starts):
                return EventBatch(self.source, pos, data, found.starts, found.ends, found.stop)
            # The first event does not end inside the window: read it alone, or say why it cannot be.
            length, body = protowire.varint(self._map, pos + 1, end)
            if window_end >= end or body + length > end:
                raise protowire.WireError("an event runs past the end of its line (file cut short?)", pos)
            window_end = body + length

    def _release(self, start: int, end: int) -> None:
        """Unmap the pages of ``[start, end)`` (and the ones around it the kernel mapped with them) from the process.

        The memory map is only walked for tags and line headers, yet each touch maps a
        block of pages that stays counted in the process's memory until unmapped: over a
        whole file, about a third of it. The data stays in the page cache (the file is
        mapped read-only), so this costs nothing but the call.
        """
        first = max(0, start - _RELEASE_MARGIN) // mmap.PAGESIZE * mmap.PAGESIZE
        last = min(self.size, end + _RELEASE_MARGIN)
        if last > first and _DONTNEED is not None:
            self._map.madvise(_DONTNEED, first, last - first)

    def _read_bytes(self, start: int, end: int) -> np.ndarray:
        """``[start, end)`` of the file and 8 zero bytes as a uint8 array, read with ``pread``.

        Read rather than taken from the memory map, so that no mapped pages of the
        file stay behind in the process's memory; the padding is for :mod:`.xspace_events`.
        """
        data = np.zeros(end - start + 8, dtype=np.uint8)
        got = os.preadv(self._file.fileno(), [data.data[: end - start]], start)
        if got != end - start:
            raise self._error("the file changed while it was read (shorter than it was)", start + got)
        return data

    def _decode_line(self, plane: Plane, data: bytes, offset: int) -> Any:
        try:
            return XLine.FromString(data)
        except DecodeError as exc:
            raise self._error(f"plane {plane.name!r}: a line is not valid XLine data ({exc})", offset) from None

    def hlo_opcodes(self) -> tuple[dict[tuple[int, str], str], dict[int, str]]:
        """From ``/host:metadata``: ``(program id, instruction name) -> opcode`` and ``program id -> module name``."""
        opcodes: dict[tuple[int, str], str] = {}
        modules: dict[int, str] = {}
        for plane in self.planes:
            if plane.name != "/host:metadata":
                continue
            for md in plane.header.event_metadata.values():
                stats = {plane.stat_names.get(s.metadata_id): s for s in md.stats}
                proto, program = stats.get("Hlo Proto"), stats.get("program_id")
                if proto is None or program is None:
                    continue
                program_id = int(stat_value(program, plane.stat_names) or 0)  # type: ignore[call-overload]
                try:
                    hlo = HloProto.FromString(proto.bytes_value)
                except DecodeError:
                    continue  # a damaged HLO proto only loses opcodes; categories fall back to names
                modules[program_id] = str(hlo.hlo_module.name)
                for computation in hlo.hlo_module.computations:
                    for instruction in computation.instructions:
                        opcodes[(program_id, str(instruction.name))] = str(instruction.opcode)
        return opcodes, modules

    def close(self) -> None:
        """Release the mapping and the file."""
        try:
            self._map.close()
        finally:
            self._file.close()

    def __enter__(self) -> Space:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
