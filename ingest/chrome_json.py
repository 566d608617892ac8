"""Streaming reader for Chrome-trace JSON objects (``{..., "traceEvents": [...], ...}``).

A profiler trace can be gigabytes of JSON. Parsing it whole costs several times
its size in memory, so this reader cuts the ``traceEvents`` array into batches of
whole events and decodes each batch on its own.

Finding a cut without parsing: between two events there is ``}``, a comma and
``{`` (whitespace allowed). The same bytes can occur inside an event (objects
nested in ``args``, or a string), but then the part left of the cut has an
unclosed bracket or string and does not decode, so a batch that decodes is a
correct cut. The reader tries a few such places from the end of the buffer; when
none works (events full of nested objects, or malformed JSON) it finds the last
element boundary with an exact scan that tracks strings and brackets, and only
then reports malformed JSON, with the byte offset msgspec gives.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import msgspec

from tracelake.contracts.errors import TraceFormatError

from .source import BatchBuffers

T = TypeVar("T")

_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_JSON_BYTE = re.compile(r"\(byte (\d+)\)")
_VALIDATION_AT = re.compile(r"`\$\[(\d+)\](.*)`")
#: Strings (closed, or running to the end of the buffer) and structural characters.
_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*(?:"|\\?\Z)|[\[\]{},]', re.DOTALL)
_WHITESPACE = b" \t\r\n"
#: How much of the file may precede ``traceEvents`` before we give up looking.
MAX_HEADER_BYTES = 256 << 20
#: The largest single event accepted (a bound on the buffer, not a format limit).
MAX_EVENT_BYTES = 1 << 30
#: What a batch checked natively yields per event (``count_events``).
_PLACEHOLDER = msgspec.Raw(b"null")

#: Cuts tried by pattern (each costs a decode) before the exact scan.
QUICK_CUT_ATTEMPTS = 4


@dataclass
class ChromeTraceReader(Generic[T]):
    """Iterate over the events of one Chrome-trace JSON object, batch by batch.

    Attributes set while reading: ``header`` (top-level keys before
    ``traceEvents``), ``tail`` (keys after it, known once iteration ends),
    ``event_count`` and ``json_bytes``.
    """

    chunks: Iterator[bytes]
    event_type: type[T]
    source: str
    batch_bytes: int = 8 << 20
    #: A fast, strict syntax check of a batch (the native one, GIL released): the number of events where it
    #: vouches for the batch, else None and msgspec judges. Only for ``msgspec.Raw`` events, whose values
    #: nobody reads: the events yielded are then placeholders (``batches`` says how many there are).
    count_events: Callable[[bytes], int | None] | None = None
    #: Reads the content that follows what ``chunks`` gave straight into a caller's buffer, filling it but at the
    #: content's end (``source.DecodedStream.readinto``): :meth:`unchecked_batches` then cuts batches in place.
    fill: Callable[[memoryview], int] | None = None
    header: dict[str, Any] = field(default_factory=dict)
    tail: dict[str, Any] = field(default_factory=dict)
    event_count: int = 0
    json_bytes: int = 0

    def __post_init__(self) -> None:
        if self.count_events is not None and self.event_type is not msgspec.Raw:
            raise ValueError("count_events is for msgspec.Raw events only")
        self._decoder = msgspec.json.Decoder(list[self.event_type])  # type: ignore[name-defined]
        self._unchecked = False
        self._buf = bytearray()
        self._base = 0  # offset in the decoded file of self._buf[0]
        self._eof = False
        self._in_events = False  # the header is read: the buffer starts inside traceEvents

    # -- reading -----------------------------------------------------------------
    def _fill(self, want: int) -> None:
        """Read until the buffer holds ``want`` bytes or the file ends."""
        while len(self._buf) < want and not self._eof:
            try:
                block = next(self.chunks)
            except StopIteration:
                self._eof = True
                break
            self.json_bytes += len(block)
            self._buf += block

    def _consume(self, n: int) -> None:
        del self._buf[:n]
        self._base += n

    def _error(self, message: str, offset: int | None = None) -> TraceFormatError:
        where = f"byte {offset}" if offset is not None else None
        return TraceFormatError(self.source, message, where=where)

    # -- before the events -------------------------------------------------------
    def _enter_events(self) -> None:
        """Read up to the start of ``traceEvents`` (the header), once."""
        if not self._in_events:
            self._fill(self.batch_bytes)
            self._read_header()

    def _read_header(self) -> None:
        start = 0
        while True:
            match = _EVENTS_KEY.search(self._buf, start)
            if match is None:
                if self._eof or len(self._buf) > MAX_HEADER_BYTES:
                    raise self._not_a_trace()
                start = max(0, len(self._buf) - 64)
                self._fill(len(self._buf) + (1 << 20))
                continue
            head = bytes(self._buf[: match.start()]).strip()
            if head.startswith(b"{"):
                try:
                    header = msgspec.json.decode(head + b'"traceEvents":[]}')
                except msgspec.DecodeError as exc:
                    # A "traceEvents" key nested deeper than the top level: look further.
                    if "truncated" in str(exc):
                        start = match.end()
                        continue
                    raise self._error(f"invalid JSON before traceEvents ({_short(exc)})", _offset(exc, 0)) from None
                if isinstance(header, dict):
                    header.pop("traceEvents", None)
                    self.header = header
                    self._consume(match.end())
                    self._in_events = True
                    return
            raise self._not_a_trace()

    def _not_a_trace(self) -> TraceFormatError:
        start = bytes(self._buf[:1024]).lstrip()
        if not start:
            return self._error("file holds only whitespace, not a trace", 0)
        if start[:1] not in (b"{", b"["):
            return self._error("not JSON (does not start with '{' or '[')", 0)
        if start[:1] == b"[":
            return self._error('a JSON array, not a trace object with "traceEvents"', 0)
        if self._eof:
            try:
                msgspec.json.decode(bytes(self._buf))
            except msgspec.DecodeError as exc:
                return self._error(f"invalid JSON ({_short(exc)})", _offset(exc, 0, len(self._buf)))
        return self._error('JSON object without a "traceEvents" array: not a PyTorch profiler trace')

    # -- the events --------------------------------------------------------------
    def batches(self) -> Iterator[tuple[int, list[T], bytes]]:
        """Yield ``(index of the first event, events, batch JSON)`` per batch, in file order.

        The batch JSON is the array text the events were decoded from.
        """
        try:
            yield from self._batches()
        except RecursionError:  # msgspec's limit on nesting (an event of ``[[[[...`` or ``{"a":{"a":...``)
            raise self._error("JSON nested too deeply (a thousand levels or more: not trace events)",
                              self._base) from None

    def unchecked_batches(self, buffers: BatchBuffers | None = None) -> Iterator[bytes | memoryview]:
        """The batches' array texts alone, each but the last cut at the last likely boundary without decoding
        or counting its events, for a reader that checks every batch strictly as it goes (the native scanner's
        strict scan).

        A cut inside a string makes a batch that check refuses: the caller then reads the trace again with
        :meth:`batches`, which also names any error. The last batch is checked as :meth:`batches` checks it:
        where the array ends is only known by the events before it decoding (a ``]`` in the keys after
        ``traceEvents`` looks the same). ``event_count`` stays 0 but for the last batch.

        With ``buffers`` (and ``fill``), the batches are cut in place in buffers the content is read straight
        into, and handed out as views of them: the consumer gives each back (:meth:`BatchBuffers.give_back`) once
        it is done with it. A batch read so holds the same bytes as one cut from chunks; where a buffer holds no
        likely boundary, and at the end, the rest is cut from chunks.
        """
        self._unchecked = True
        if buffers is not None and self.fill is not None:
            self._enter_events()
            yield from self._cut_in_place(buffers, self.fill)
        for _, _, data in self.batches():
            yield data

    def _cut_in_place(self, buffers: BatchBuffers, fill: Callable[[memoryview], int]) -> Iterator[bytes | memoryview]:
        """Batches cut in ``buffers``: ``[``, the bytes left from the last cut, the content read after them, and the
        last likely boundary closed by ``]``. Returns with what is left in ``_buf`` at the content's end, or where
        a buffer holds no likely boundary."""
        size = buffers.size
        while not self._eof:
            if 2 * len(self._buf) > size:  # much left (the first batch after the header): cut as from chunks
                cut = self._cut()
                if cut is None:
                    return
                _, data, consumed = cut
                self._consume(consumed)
                yield data
                continue
            buffer = buffers.take()
            view = memoryview(buffer)
            carried = len(self._buf)
            view[0] = 0x5B  # [
            view[1:1 + carried] = self._buf
            read = fill(view[1 + carried:size - 1])  # room left for the closing ]
            self.json_bytes += read
            stop = 1 + carried + read
            found = next(_likely_cuts(buffer, 1, stop), None) if stop == size - 1 else None
            if found is None:  # the content ends in this buffer, or one event fills it: cut as from chunks
                self._buf[:] = view[1:stop]
                buffers.give_back(view)
                return
            end, comma = found
            self._buf[:] = view[comma + 1:stop]
            self._base += comma
            view[end + 1] = 0x5D  # ]
            yield view[:end + 2]

    def _batches(self) -> Iterator[tuple[int, list[T], bytes]]:
        self._enter_events()
        want = self.batch_bytes
        while True:
            self._fill(want)
            if self._eof:
                yield from self._read_last()
                self._buf = bytearray()  # the last batch's text: the reader is kept for its header and tail
                return
            decoded = self._cut()
            if decoded is None:
                # No element boundary in the buffer: one event bigger than it. Read on.
                if len(self._buf) > MAX_EVENT_BYTES:
                    raise self._error(f"an event larger than {MAX_EVENT_BYTES >> 20} MB", self._base)
                want = 2 * len(self._buf)
                continue
            want = self.batch_bytes
            events, data, consumed = decoded
            first = self.event_count
            self.event_count += len(events)
            self._consume(consumed)
            yield first, events, data

    def _cut(self) -> tuple[list[T], bytes, int] | None:
        """Decode the longest run of whole events at the start of the buffer.

        Returns the events, their array text and how many buffer bytes they took
        (separator included), or None when the buffer holds no element boundary.
        """
        buf = self._buf
        for _, (end, comma) in zip(range(QUICK_CUT_ATTEMPTS), _likely_cuts(buf, 0, len(buf)), strict=False):
            if self._unchecked:  # the caller checks the batch (unchecked_batches)
                return [], self._array(end + 1), comma + 1
            decoded = self._try_decode(end + 1)
            if decoded is not None:
                return (*decoded, comma + 1)
        boundary = _last_top_level_comma(buf)
        if boundary is None:
            return None
        if self._unchecked:
            return [], self._array(boundary), boundary + 1
        events, data = self._decode_or_raise(boundary)
        return events, data, boundary + 1

    def _read_last(self) -> Iterator[tuple[int, list[T], bytes]]:
        """Find where ``traceEvents`` closes: the ``]`` after which the object ends validly."""
        fast = self._fast_last()
        if fast is not None:
            yield fast
            return
        buf = self._buf
        truncated = self._error("file ends inside the traceEvents array (truncated?)", self._base + len(buf))
        close = _closing_bracket(buf)
        if close is None:
            # Malformed events, or a truncated file: find a ']' the object could end at,
            # and let the decoder say where the events go wrong.
            close = self._plausible_close()
            if close is None:
                raise truncated
            try:
                self._decode_or_raise(len(bytes(buf[:close]).rstrip()))
            except TraceFormatError as exc:
                if "truncated" in exc.reason:
                    raise truncated from None
                raise
            raise truncated
        tail_text = bytes(buf[close + 1 :])
        prefix = b'{"traceEvents":[]'
        try:
            tail = msgspec.json.decode(prefix + tail_text)
        except msgspec.DecodeError as exc:
            shift = self._base + close + 1 - len(prefix)
            if "trailing characters" in str(exc):
                # msgspec places "trailing characters" one byte past where they start.
                raise self._error("unexpected data after the end of the trace object", _offset(exc, shift - 1)) from None
            if not tail_text.rstrip().endswith(b"}"):
                raise truncated from None
            raise self._error(
                f"invalid JSON after traceEvents ({_short(exc)})", _offset(exc, shift, len(prefix) + len(tail_text))
            ) from None
        body = bytes(buf[:close]).rstrip()
        if body.lstrip().endswith(b","):
            raise self._error("trailing comma after the last event", self._base + len(body) - 1)
        if body.strip():
            events, data = self._decode_or_raise(len(body))
        else:
            events, data = [], b"[]"
        if isinstance(tail, dict):
            tail.pop("traceEvents", None)
            self.tail = tail
        first = self.event_count
        self.event_count += len(events)
        yield first, events, data

    def _fast_last(self) -> tuple[int, list[T], bytes] | None:
        """The usual case, cheaply: one of the last few ``]`` closes the array and both sides decode.

        Returns None (and the exact scan takes over) for anything unusual.
        """
        buf = self._buf
        end = len(buf)
        prefix = b'{"traceEvents":[]'
        for _ in range(8):
            end = buf.rfind(b"]", 0, end)
            if end < 0:
                return None
            try:
                tail = msgspec.json.decode(prefix + bytes(buf[end + 1 :]))
            except msgspec.DecodeError:
                continue
            body = bytes(buf[:end]).rstrip()
            if not isinstance(tail, dict) or body.lstrip().endswith(b","):
                return None
            if body.strip():
                decoded = self._try_decode(len(body))
                if decoded is None:
                    continue
                events, data = decoded
            else:
                events, data = [], b"[]"
            tail.pop("traceEvents", None)
            self.tail = tail
            first = self.event_count
            self.event_count += len(events)
            return first, events, data
        return None

    def _plausible_close(self) -> int | None:
        """The last ``]`` after which the rest of the buffer ends a JSON object."""
        buf = self._buf
        end = len(buf)
        for _ in range(256):
            end = buf.rfind(b"]", 0, end)
            if end < 0:
                return None
            try:
                msgspec.json.decode(b'{"traceEvents":[]' + bytes(buf[end + 1 :]))
            except msgspec.DecodeError:
                continue
            return end
        return None

    # -- decoding ----------------------------------------------------------------
    def _array(self, stop: int) -> bytes:
        """``[`` + the first ``stop`` buffer bytes + ``]``, copied once."""
        with memoryview(self._buf) as view:
            return b"".join((b"[", view[:stop], b"]"))

    def _checked(self, data: bytes) -> list[T] | None:
        """Placeholder events for ``data`` where the fast check vouches for its syntax."""
        if self.count_events is None:
            return None
        count = self.count_events(data)
        return None if count is None else [_PLACEHOLDER] * count  # type: ignore[list-item]

    def _try_decode(self, stop: int) -> tuple[list[T], bytes] | None:
        data = self._array(stop)
        checked = self._checked(data)
        if checked is not None:
            return checked, data
        try:
            return self._decoder.decode(data), data
        except msgspec.ValidationError as exc:
            # Valid JSON but a wrongly typed field: the cut was right, the data is wrong.
            raise self._validation_error(exc) from None
        except msgspec.DecodeError:
            return None

    def _decode_or_raise(self, stop: int) -> tuple[list[T], bytes]:
        data = self._array(stop)
        checked = self._checked(data)
        if checked is not None:
            return checked, data
        try:
            return self._decoder.decode(data), data
        except msgspec.ValidationError as exc:
            raise self._validation_error(exc) from None
        except msgspec.DecodeError as exc:
            offset = _offset(exc, self._base - 1, len(data))
            raise self._error(f"invalid JSON in traceEvents ({_short(exc)})", offset) from None

    def _validation_error(self, exc: msgspec.ValidationError) -> TraceFormatError:
        text = str(exc)
        match = _VALIDATION_AT.search(text)
        if not match:
            return self._error(f"unexpected event content: {text}", self._base)
        index = self.event_count + int(match.group(1))
        what = text.split(" - at ")[0]
        path = match.group(2).lstrip(".")
        missing = re.match(r"Object missing required field `(.+)`", what)
        if missing:
            field = f"{path}.{missing.group(1)}" if path else missing.group(1)
            return TraceFormatError(self.source, f"event has no {field!r}", where=f"traceEvents[{index}]")
        return TraceFormatError(
            self.source, f"{what} in field {path or 'the event'!r}", where=f"traceEvents[{index}]"
        )


def _likely_cuts(buf: bytearray, start: int, stop: int) -> Iterator[tuple[int, int]]:
    """Likely boundaries between events in ``buf[start:stop]``, from the last: where ``}``, a comma and ``{``
    follow one another (whitespace between), the offsets of that ``}`` and that comma."""
    end = stop
    while (end := buf.rfind(b"}", start, end)) > 0:
        comma = _skip_ws(buf, end + 1, stop)
        if comma < stop and buf[comma] == 0x2C and _at(buf, _skip_ws(buf, comma + 1, stop), 0x7B, stop):
            yield end, comma


def _skip_ws(buf: bytearray, pos: int, stop: int | None = None) -> int:
    n = len(buf) if stop is None else stop
    while pos < n and buf[pos] in _WHITESPACE:
        pos += 1
    return pos


def _at(buf: bytearray, pos: int, char: int, stop: int | None = None) -> bool:
    return pos < (len(buf) if stop is None else stop) and buf[pos] == char


def _last_top_level_comma(buf: bytearray) -> int | None:
    """Offset of the last comma between two elements of the array the buffer starts inside."""
    depth = 0
    last = None
    for match in _TOKENS.finditer(buf):
        char = buf[match.start()]
        if char == 0x22:  # a string: skip it whole
            continue
        if char in b"[{":
            depth += 1
        elif char in b"]}":
            depth -= 1
            if depth < 0:  # the array itself closes: only the last batch sees this
                break
        elif depth == 0 and not _at(buf, _skip_ws(buf, match.end()), 0x5D):
            last = match.start()  # a comma followed by "]" is a trailing comma, not a boundary
    return last


def _closing_bracket(buf: bytearray) -> int | None:
    """Offset of the ``]`` closing the array the buffer starts inside, by an exact scan."""
    depth = 0
    for match in _TOKENS.finditer(buf):
        char = buf[match.start()]
        if char in b"[{":
            depth += 1
        elif char in b"]}":
            depth -= 1
            if depth < 0:
                return match.start() if char == 0x5D else None
    return None


def _short(exc: Exception) -> str:
    return _JSON_BYTE.sub("", str(exc)).strip().rstrip(".")


def _offset(exc: Exception, base: int, length: int | None = None) -> int | None:
    """Absolute offset of a msgspec decode error; a truncation is reported at the end of the data."""
    match = _JSON_BYTE.search(str(exc))
    if match:
        return base + int(match.group(1))
    if length is not None and "truncated" in str(exc):
        return base + length
    return None
