"""Receiving uploads: request bodies streamed to disk, never whole in memory, within size limits.

A multipart upload's file parts and a raw ``PUT`` body are written chunk by chunk
into the upload's private folder under names the server chooses (the client's file
name is only ever a label), hashed on the way so that the trace id is known when
the last byte lands: gzip is decompressed as it arrives and its content hashed
(:mod:`.content_hash`), so a re-compressed copy has the same id.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request

from tracelake.ingest import ID_DIGITS
from tracelake.warehouse import InvalidArgument, TooLarge

from .archives import UnpackLimits
from .content_hash import ContentHasher
from .errors import UploadDeadlinePassed, UploadTimedOut
from .settings import ServerSettings

#: Form fields other than files are small; a larger one is refused.
MAX_FIELD_BYTES = 64 << 10
#: Most form fields (files included) one upload request may carry.
MAX_PARTS = 1_000
#: Length of a trace id: the first hex digits of the SHA-256 of the decoded content (see ``ingest.content_id``).
TRACE_ID_DIGITS = ID_DIGITS
_UNSAFE = re.compile(r"[\x00-\x1f\x7f]")
#: A multipart boundary as RFC 2046 (section 5.1.1) defines it: 1 to 70 of these characters, not ending in a space.
#: Every HTTP client's boundary fits; the multipart parser would fail on one past 256 characters.
_BOUNDARY = re.compile(rb"[0-9A-Za-z'()+_,\-./:=? ]{0,69}[0-9A-Za-z'()+_,\-./:=?]")
MAX_BOUNDARY_CHARS = 70


@dataclass(frozen=True)
class UploadLimits:
    """How much one upload may carry, how long it may stall, and how long it may take."""

    max_file_bytes: int
    max_request_bytes: int
    #: Seconds the body may send nothing before the upload is cut off.
    idle_timeout_seconds: float = 60.0
    #: Seconds the whole body may take, from when the server starts reading it, however steadily it arrives.
    deadline_seconds: float = 3600.0
    #: How far a gzip file may expand while it is hashed (default: the default settings').
    expansion: UnpackLimits | None = None

    @classmethod
    def from_settings(cls, settings: ServerSettings) -> UploadLimits:
        """The limits configured in ``settings``."""
        return cls(settings.max_file_bytes, settings.max_request_bytes, settings.upload_idle_timeout_seconds,
                   settings.upload_deadline_seconds, UnpackLimits.from_settings(settings))


@dataclass
class ReceivedFile:
    """One file of an upload, on disk."""

    name: str  # the client's name for it, cleaned up for display
    path: Path  # where the server wrote it
    size: int
    trace_id: str
    #: Bytes it decodes to, when hashing it checked its gzip stream whole and within the expansion limit.
    decoded_bytes: int | None = None


@dataclass
class Received:
    """Everything an upload request carried: its files (on disk) and its other form fields."""

    files: list[ReceivedFile] = field(default_factory=list)
    fields: dict[str, list[str]] = field(default_factory=dict)

    @property
    def bytes(self) -> int:
        """Bytes of every file together."""
        return sum(f.size for f in self.files)


def display_name(raw: str | None, fallback: str = "upload") -> str:
    """A client-given file name reduced to a label: last path component, no control characters, bounded length."""
    name = _UNSAFE.sub("", (raw or "").replace("\\", "/").rsplit("/", 1)[-1]).strip()
    if name in ("", ".", ".."):
        return fallback
    return name[:200]


class _FileSink:
    """Writes one file's bytes to disk, counting them and hashing their decoded content."""

    def __init__(self, path: Path, name: str, limits: UploadLimits) -> None:
        self.path = path
        self.name = name
        self.limits = limits
        self.size = 0
        expansion = limits.expansion or UnpackLimits.from_settings(ServerSettings())
        self.hash = ContentHasher(name, expansion, limits.max_file_bytes)
        self._out: IO[bytes] = open(path, "wb")

    def write(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > self.limits.max_file_bytes:
            raise TooLarge(f"{self.name}: larger than the {_size(self.limits.max_file_bytes)} a file may be "
                           "(TRACELAKE_MAX_FILE_BYTES)")
        self.hash.update(data)
        self._out.write(data)

    def close(self) -> ReceivedFile:
        self._out.close()
        trace_id = self.hash.finish()
        return ReceivedFile(self.name, self.path, self.size, trace_id, self.hash.decoded)

    def abort(self) -> None:
        self._out.close()


#: A chunk at least this large is written (and its gzip decoded and hashed) off the event loop.
OFF_LOOP_BYTES = 32 << 10


async def _off_loop(write: Callable[[bytes], object], chunk: bytes) -> None:
    """``write(chunk)``; a large chunk on a worker thread, so that decoding an upload never stalls the server.

    Calls stay in order: each is awaited before the next chunk is read.
    """
    if len(chunk) >= OFF_LOOP_BYTES:
        await run_in_threadpool(write, chunk)
    else:
        write(chunk)


def _check_length(request: Request, limits: UploadLimits) -> None:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limits.max_request_bytes:
        raise TooLarge(f"the request body ({_size(int(declared))}) is larger than the "
                       f"{_size(limits.max_request_bytes)} an upload may be (TRACELAKE_MAX_REQUEST_BYTES)")


async def _body_chunks(request: Request, limits: UploadLimits) -> AsyncIterator[bytes]:
    """The request body's chunks as they arrive; a client silent for ``idle_timeout_seconds``, or still
    sending ``deadline_seconds`` after the server began reading the body, is cut off.

    Raises:
        UploadTimedOut: no byte arrived for ``limits.idle_timeout_seconds``.
        UploadDeadlinePassed: the body was not complete within ``limits.deadline_seconds``.
        ClientDisconnect: the client went away.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limits.deadline_seconds
    while True:
        left = deadline - loop.time()
        if left <= 0:  # checked here too: a fast client's chunks may come without the receive ever waiting
            raise _deadline_passed(limits)
        try:
            async with asyncio.timeout(min(limits.idle_timeout_seconds, left)):
                message = await request.receive()
        except TimeoutError:
            if left < limits.idle_timeout_seconds:
                raise _deadline_passed(limits) from None
            raise UploadTimedOut(
                f"the upload sent nothing for {limits.idle_timeout_seconds:g} s and was cut off "
                "(TRACELAKE_UPLOAD_IDLE_TIMEOUT_SECONDS); send the body without pausing"
            ) from None
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        body = message.get("body", b"")
        if body:
            yield body
        if not message.get("more_body", False):
            return


def _deadline_passed(limits: UploadLimits) -> UploadDeadlinePassed:
    return UploadDeadlinePassed(
        f"the upload was still sending {limits.deadline_seconds:g} s after it began and was cut off "
        "(TRACELAKE_UPLOAD_DEADLINE_SECONDS); send it faster or split it into smaller uploads"
    )


class _RequestBudget:
    def __init__(self, limits: UploadLimits) -> None:
        self.limits = limits
        self.seen = 0

    def take(self, n: int) -> None:
        self.seen += n
        if self.seen > self.limits.max_request_bytes:
            raise TooLarge(f"the request body is larger than the {_size(self.limits.max_request_bytes)} "
                           "an upload may be (TRACELAKE_MAX_REQUEST_BYTES)")


async def receive_body(request: Request, folder: Path, name: str, limits: UploadLimits) -> Received:
    """Stream a raw request body (``PUT /traces/{name}``) into ``folder`` as one file.

    Raises:
        TooLarge: the body is larger than a file or a request may be.
        UploadTimedOut: the client stalled, or took longer than the upload deadline.
        InvalidArgument: the body is empty or the client went away.
    """
    _check_length(request, limits)
    sink = _FileSink(folder / "body", display_name(name), limits)
    budget = _RequestBudget(limits)  # a chunked body declares no length: count it
    try:
        async for chunk in _body_chunks(request, limits):
            budget.take(len(chunk))
            await _off_loop(sink.write, chunk)
    except ClientDisconnect:
        sink.abort()
        raise InvalidArgument(f"{sink.name}: the client disconnected before the upload was complete") from None
    except BaseException:
        sink.abort()
        raise
    received = sink.close()
    if received.size == 0:
        raise InvalidArgument(f"{received.name}: the request body is empty; send the trace file's bytes")
    return Received(files=[received])


class _MultipartState:
    """Collects one multipart body's parts as the parser reports them."""

    def __init__(self, folder: Path, limits: UploadLimits) -> None:
        self.folder = folder
        self.limits = limits
        self.received = Received()
        self.parts = 0
        self.ended = False
        self._header_field = bytearray()
        self._header_value = bytearray()
        self._headers: dict[str, bytes] = {}
        self._sink: _FileSink | None = None
        self._field_name: str | None = None
        self._field_value = bytearray()

    def callbacks(self) -> dict[str, object]:
        return {
            "on_part_begin": self.part_begin,
            "on_header_field": lambda d, s, e: self._header_field.extend(d[s:e]),
            "on_header_value": lambda d, s, e: self._header_value.extend(d[s:e]),
            "on_header_end": self.header_end,
            "on_headers_finished": self.headers_finished,
            "on_part_data": self.part_data,
            "on_part_end": self.part_end,
            "on_end": self.end,
        }

    def part_begin(self) -> None:
        self.parts += 1
        if self.parts > MAX_PARTS:
            raise InvalidArgument(f"too many form fields in one upload (at most {MAX_PARTS})")
        self._headers = {}
        self._field_name = None
        self._field_value = bytearray()

    def header_end(self) -> None:
        self._headers[self._header_field.decode("latin-1").strip().lower()] = bytes(self._header_value)
        self._header_field.clear()
        self._header_value.clear()

    def headers_finished(self) -> None:
        _, options = parse_options_header(self._headers.get("content-disposition", b""))
        name = options.get(b"name", b"").decode("utf-8", "replace")
        filename = options.get(b"filename")
        if filename is not None:
            index = len(self.received.files)
            label = display_name(filename.decode("utf-8", "replace"), fallback=f"file-{index + 1}")
            self._sink = _FileSink(self.folder / f"part-{index}", label, self.limits)
        else:
            self._field_name = name

    def part_data(self, data: bytes, start: int, end: int) -> None:
        if self._sink is not None:
            self._sink.write(data[start:end])
            return
        self._field_value.extend(data[start:end])
        if len(self._field_value) > MAX_FIELD_BYTES:
            raise InvalidArgument(f"form field {self._field_name!r} is longer than {MAX_FIELD_BYTES} bytes; "
                                  "send files with a file name (filename=...)")

    def part_end(self) -> None:
        if self._sink is not None:
            self.received.files.append(self._sink.close())
            self._sink = None
        elif self._field_name is not None:
            value = self._field_value.decode("utf-8", "replace")
            self.received.fields.setdefault(self._field_name, []).append(value)

    def end(self) -> None:
        self.ended = True

    def abort(self) -> None:
        if self._sink is not None:
            self._sink.abort()


async def receive_multipart(request: Request, folder: Path, limits: UploadLimits) -> Received:
    """Stream a ``multipart/form-data`` body into ``folder``: file parts to disk, other fields in memory.

    Raises:
        TooLarge: a file or the whole body is larger than allowed.
        UploadTimedOut: the client stalled, or took longer than the upload deadline.
        InvalidArgument: the body is not well-formed multipart, or carries no file.
    """
    content_type, options = parse_options_header(request.headers.get("content-type"))
    boundary = options.get(b"boundary")
    if content_type != b"multipart/form-data" or not boundary:
        raise InvalidArgument("send the trace files as multipart/form-data `file` fields "
                              "(or PUT the raw bytes to /api/v1/traces/{name})")
    _check_boundary(boundary)
    _check_length(request, limits)
    state = _MultipartState(folder, limits)
    budget = _RequestBudget(limits)
    parser = MultipartParser(boundary, state.callbacks())  # type: ignore[arg-type]
    try:
        async for chunk in _body_chunks(request, limits):
            budget.take(len(chunk))
            await _off_loop(parser.write, chunk)
        parser.finalize()
    except MultipartParseError as exc:
        raise InvalidArgument(f"malformed multipart body: {exc}") from None
    except ClientDisconnect:
        raise InvalidArgument("the client disconnected before the upload was complete") from None
    finally:
        state.abort()
    if not state.ended:
        raise InvalidArgument("malformed multipart body: it ends before the closing boundary (truncated upload?)")
    if not state.received.files:
        raise InvalidArgument("the upload carries no file: send each trace as a `file` field with a file name")
    return state.received


def _check_boundary(boundary: bytes) -> None:
    """Refuse a boundary RFC 2046 does not allow (too long, or with characters outside its set).

    Raises:
        InvalidArgument: the boundary is not allowed.
    """
    if _BOUNDARY.fullmatch(boundary):
        return
    if len(boundary) > MAX_BOUNDARY_CHARS:
        problem = f"is {len(boundary):,} characters long; RFC 2046 allows at most {MAX_BOUNDARY_CHARS}"
    else:
        problem = ("holds characters RFC 2046 does not allow (only letters, digits, spaces and '()+_,-./:=?, "
                   "not ending in a space)")
    raise InvalidArgument(f"malformed multipart body: the boundary in the Content-Type header {problem}; "
                          "let your HTTP client choose it")


def _size(n: int) -> str:
    value = float(n)
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{n:,} bytes" if unit == "bytes" else f"{value:.3g} {unit}"
        value /= 1024
    return f"{value:.3g} TiB"
