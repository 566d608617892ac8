"""Reading an XSpace (``.xplane.pb``) piece by piece.

The file is memory-mapped and split with :mod:`.protowire`: planes, then each
plane's header (everything but its lines) and the byte ranges of its lines. Lines
are decoded one at a time by protobuf's C decoder, and a line larger than
:data:`LINE_CHUNK_BYTES` in slices of events, so memory follows the largest
slice, not the file.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from google.protobuf.message import DecodeError

from tracelake.warehouse.errors import TraceFormatError

from . import protowire
from .xplane_proto import HloProto, XLine, XPlaneHeader, XSpace

#: Lines bigger than this are decoded in slices of about this many bytes of events.
LINE_CHUNK_BYTES = 4 << 20

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

    @property
    def name(self) -> str:
        return str(self.header.name)

    def stats(self) -> dict[str, object]:
        """The plane's own stats by name."""
        return {self.stat_names.get(s.metadata_id, str(s.metadata_id)): stat_value(s, self.stat_names)
                for s in self.header.stats}

    def metadata_stats(self, metadata_id: int) -> dict[str, object]:
        """The stats of an event metadata entry by name (cached: many events share one)."""
        found = self._metadata_stats.get(metadata_id)
        if found is None:
            md = self.header.event_metadata.get(metadata_id)
            found = {} if md is None else {
                self.stat_names.get(s.metadata_id, str(s.metadata_id)): stat_value(s, self.stat_names)
                for s in md.stats
            }
            self._metadata_stats[metadata_id] = found
        return found


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
                continue
            if end - start <= LINE_CHUNK_BYTES:
                yield self._decode_line(plane, bytes(self._map[start:end]), start)
            else:
                yield from self._sliced_line(plane, start, end)

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

    def _sliced_line(self, plane: Plane, start: int, end: int) -> Iterator[Any]:
        """A big line as ``XLine`` slices of about :data:`LINE_CHUNK_BYTES` of events, each with the line's header.

        The walk only hops from event to event (tag, length) and keeps no per-event
        state. Header fields written after the events (``duration_ps``,
        ``display_name``...) reach the last slice only; the ones tracelake reads
        (id, name, timestamp) come before the events in every writer we know.
        """
        buf = self._map
        header = bytearray()
        pos = start
        first_event = events_end = -1
        try:
            while pos < end:
                tag_at = pos
                if buf[pos] == _EVENT_TAG:
                    size = buf[pos + 1] if pos + 1 < end else 0x80
                    if size < 0x80:  # the usual one-byte length
                        pos += 2 + size
                    else:
                        length, pos = protowire.varint(buf, pos + 1, end)
                        pos += length
                    if pos > end:
                        raise protowire.WireError("an event runs past the end of its line (file cut short?)", tag_at)
                    events_end = pos
                    if first_event < 0:
                        first_event = tag_at
                    elif pos - first_event > LINE_CHUNK_BYTES:
                        yield self._decode_line(plane, bytes(header) + bytes(buf[first_event:tag_at]), first_event)
                        first_event = tag_at
                    continue
                for _, _, field_at, _, field_end in protowire.fields(buf, pos, end):
                    header += buf[field_at:field_end]
                    pos = field_end
                    break
        except protowire.WireError as exc:
            raise self._error(f"plane {plane.name!r}: damaged line ({exc})", exc.offset) from None
        if first_event >= 0:
            yield self._decode_line(plane, bytes(header) + bytes(buf[first_event:events_end]), first_event)

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
