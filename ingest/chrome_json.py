"""Streaming reader for Chrome-trace JSON objects (``{..., "traceEvents": [...], ...}``).

A profiler trace can be gigabytes of JSON. Parsing it whole costs several times
its size in memory, so this reader cuts the ``traceEvents`` array into batches of
whole events and decodes each batch with a typed msgspec decoder.

Cutting without a full parse: a batch ends at a ``}`` followed by ``,`` and ``{``.
Such a place can also occur inside an event (objects nested in ``args``, or a
string), but then the left part has an unclosed bracket or string and does not
decode; the reader then tries an earlier cut. A batch that decodes is therefore a
correct cut, and a batch that decodes at no cut is malformed JSON, reported with
its byte offset.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import msgspec

from tracelake.warehouse.errors import TraceFormatError

T = TypeVar("T")

_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_JSON_BYTE = re.compile(r"\(byte (\d+)\)")
_VALIDATION_AT = re.compile(r"`\$\[(\d+)\](.*)`")
#: How much of the file may precede ``traceEvents`` before we give up looking.
MAX_HEADER_BYTES = 256 << 20
#: How many alternative cuts to try before declaring a batch malformed.
MAX_CUT_ATTEMPTS = 64


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
    header: dict[str, Any] = field(default_factory=dict)
    tail: dict[str, Any] = field(default_factory=dict)
    event_count: int = 0
    json_bytes: int = 0

    def __post_init__(self) -> None:
        self._decoder = msgspec.json.Decoder(list[self.event_type])  # type: ignore[name-defined]
        self._buf = bytearray()
        self._base = 0  # offset in the decoded file of self._buf[0]
        self._eof = False

    # -- reading -----------------------------------------------------------------
    def _fill(self, want: int) -> bool:
        """Read until the buffer holds ``want`` bytes or the file ends; False at EOF."""
        while len(self._buf) < want and not self._eof:
            try:
                block = next(self.chunks)
            except StopIteration:
                self._eof = True
                break
            self.json_bytes += len(block)
            self._buf += block
        return not self._eof

    def _consume(self, n: int) -> None:
        del self._buf[:n]
        self._base += n

    def _error(self, message: str, offset: int | None = None) -> TraceFormatError:
        where = f"byte {offset}" if offset is not None else None
        return TraceFormatError(self.source, message, where=where)

    # -- the three parts of the object ------------------------------------------
    def _read_header(self) -> None:
        searched = 0
        while True:
            match = _EVENTS_KEY.search(self._buf, max(0, searched - 32))
            if match:
                break
            searched = len(self._buf)
            if self._eof or searched > MAX_HEADER_BYTES:
                raise self._not_a_trace()
            self._fill(len(self._buf) + (1 << 20))
        head = bytes(self._buf[: match.start()]).strip()
        if not head.startswith(b"{"):
            raise self._not_a_trace()
        try:
            self.header = msgspec.json.decode(head + b'"traceEvents":[]}')
        except msgspec.DecodeError as exc:
            raise self._error(f"invalid JSON before traceEvents ({_short(exc)})", _offset(exc, 0)) from None
        self._consume(match.end())

    def _not_a_trace(self) -> TraceFormatError:
        start = bytes(self._buf[:1024]).lstrip()
        if not start:
            return self._error("file holds only whitespace, not a trace", 0)
        if start[:1] not in (b"{", b"["):
            return self._error("not JSON (does not start with '{' or '[')", 0)
        if start[:1] == b"[":
            return self._error("a JSON array, not a PyTorch profiler trace object (no \"traceEvents\")", 0)
        # Is it at least valid JSON? Say which, so the user knows what to fix.
        if self._eof:
            try:
                msgspec.json.decode(bytes(self._buf))
            except msgspec.DecodeError as exc:
                return self._error(f"invalid JSON ({_short(exc)})", _offset(exc, 0))
        return self._error('JSON object without a "traceEvents" array: not a PyTorch profiler trace')

    def batches(self) -> Iterator[tuple[int, list[T], bytes]]:
        """Yield ``(index of the first event, events, batch JSON)`` per batch, in file order.

        The batch JSON is the array text the events were decoded from, for a
        parser that needs a second, differently typed look at a few events.
        """
        self._fill(self.batch_bytes)
        self._read_header()
        while True:
            self._fill(self.batch_bytes)
            if self._eof:
                yield from self._read_last()
                return
            cut = self._buf.rfind(b"},")
            decoded = None
            attempts = 0
            while cut > 0 and attempts < MAX_CUT_ATTEMPTS:
                if _next_is_object(self._buf, cut + 2):
                    decoded = self._try_decode(0, cut + 1)
                    if decoded is not None:
                        break
                    attempts += 1
                cut = self._buf.rfind(b"},", 0, cut)
            if decoded is None:
                # No usable cut in this batch: one huge event, or malformed JSON.
                if len(self._buf) > 16 * self.batch_bytes:
                    self._decode_or_raise(0, len(self._buf))
                self._fill(len(self._buf) * 2)
                continue
            events, data = decoded
            first = self.event_count
            self.event_count += len(events)
            self._consume(cut + 2)
            yield first, events, data

    def _read_last(self) -> Iterator[tuple[int, list[T], bytes]]:
        """Find where ``traceEvents`` closes: the ``]`` after which the object ends validly."""
        buf = self._buf
        end = len(buf)
        attempts = 0
        first_error: TraceFormatError | None = None
        while attempts <= MAX_CUT_ATTEMPTS:
            end = buf.rfind(b"]", 0, end)
            if end < 0:
                break
            attempts += 1
            try:
                tail = msgspec.json.decode(b'{"traceEvents":[]' + bytes(buf[end + 1 :]))
            except msgspec.DecodeError:
                continue
            if not isinstance(tail, dict):
                continue
            body = bytes(buf[:end]).rstrip()
            if body.lstrip().endswith(b","):
                first_error = first_error or self._error(
                    "trailing comma after the last event", self._base + len(body) - 1
                )
                continue
            if not body.strip():
                events: list[T] = []
                data = b"[]"
            else:
                decoded = self._try_decode(0, len(body))
                if decoded is None:
                    if first_error is None:
                        try:
                            self._decode_or_raise(0, len(body))
                        except TraceFormatError as exc:
                            first_error = exc
                    continue
                events, data = decoded
            self.tail = tail
            first = self.event_count
            self.event_count += len(events)
            yield first, events, data
            return
        raise first_error or self._error(
            "file ends inside the traceEvents array (truncated?)", self._base + len(buf)
        )

    # -- decoding ----------------------------------------------------------------
    def _try_decode(self, start: int, stop: int) -> tuple[list[T], bytes] | None:
        data = b"[" + self._buf[start:stop] + b"]"
        try:
            return self._decoder.decode(data), data
        except msgspec.ValidationError as exc:
            # Valid JSON but a wrongly typed field: the cut was right, the data is wrong.
            raise self._validation_error(exc) from None
        except msgspec.DecodeError:
            return None

    def _decode_or_raise(self, start: int, stop: int) -> tuple[list[T], bytes]:
        data = b"[" + self._buf[start:stop] + b"]"
        try:
            return self._decoder.decode(data), data
        except msgspec.ValidationError as exc:
            raise self._validation_error(exc) from None
        except msgspec.DecodeError as exc:
            raise self._error(f"invalid JSON in traceEvents ({_short(exc)})", _offset(exc, self._base - 1)) from None

    def _validation_error(self, exc: msgspec.ValidationError) -> TraceFormatError:
        text = str(exc)
        match = _VALIDATION_AT.search(text)
        if not match:
            return self._error(f"unexpected event content: {text}", self._base)
        index = self.event_count + int(match.group(1))
        what = text.split(" - at ")[0]
        path = match.group(2).lstrip(".") or "the event"
        return TraceFormatError(
            self.source, f"{what} in field {path!r}", where=f"traceEvents[{index}]"
        )


def _next_is_object(buf: bytearray, pos: int) -> bool:
    n = len(buf)
    while pos < n and buf[pos] in b" \t\r\n":
        pos += 1
    return pos < n and buf[pos] == 0x7B  # "{"


def _short(exc: Exception) -> str:
    return _JSON_BYTE.sub("", str(exc)).strip().rstrip(".")


def _offset(exc: Exception, base: int) -> int | None:
    match = _JSON_BYTE.search(str(exc))
    return base + int(match.group(1)) if match else None
