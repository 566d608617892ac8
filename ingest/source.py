"""Reading input files: transparent gzip, bounded chunks, byte progress, clear errors."""

from __future__ import annotations

import io
import queue
import threading
import zlib
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, TypeVar

from isal import igzip_threaded

from tracelake.contracts.errors import TraceFormatError

GZIP_MAGIC = b"\x1f\x8b"
CHUNK_BYTES = 4 << 20

#: Called with the number of (compressed) source bytes read since the last call.
ByteCallback = Callable[[int], None]


class _CountingReader(io.RawIOBase):
    """Wraps a file and reports every read to a callback, for progress bars."""

    def __init__(self, raw: BinaryIO, on_bytes: ByteCallback | None) -> None:
        self._raw = raw
        self._on_bytes = on_bytes
        self.position = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        n = self._raw.readinto(buffer)  # type: ignore[attr-defined]
        self.count(n or 0)
        return n or 0

    def count(self, n: int) -> None:
        """Count ``n`` bytes read from the file (by :meth:`readinto`, or by the caller from the file itself)."""
        if n:
            self.position += n
            if self._on_bytes is not None:
                self._on_bytes(n)

    def close(self) -> None:
        self._raw.close()
        super().close()


def is_gzip(path: Path) -> bool:
    """True when the file starts with the gzip magic bytes (whatever its name)."""
    with open(path, "rb") as f:
        return f.read(2) == GZIP_MAGIC


def read_head(path: Path, n: int = 64 << 10, name: str | None = None) -> bytes:
    """Return up to ``n`` decoded bytes from the start of the file, for format detection."""
    try:
        with open(path, "rb") as f:
            if f.read(2) != GZIP_MAGIC:
                f.seek(0)
                return f.read(n)
            f.seek(0)
            decoder = zlib.decompressobj(wbits=31)
            out = bytearray()
            while len(out) < n:
                block = f.read(64 << 10)
                if not block:
                    break
                out += decoder.decompress(block, n - len(out))
                if decoder.eof:
                    break
            return bytes(out)
    except zlib.error as exc:
        raise TraceFormatError(name or path.name, f"not a valid gzip file ({exc})", where="byte 0") from None


def iter_chunks(
    path: Path,
    *,
    chunk_bytes: int = CHUNK_BYTES,
    on_bytes: ByteCallback | None = None,
    name: str | None = None,
) -> Iterator[bytes]:
    """Yield the decoded content of ``path`` in chunks of about ``chunk_bytes``.

    Gzip files (by content, not by name) are decompressed on a background thread
    with ISA-L, which releases the GIL, so decompression overlaps parsing.

    Raises:
        TraceFormatError: the file is empty, or its gzip stream is damaged or ends early.
    """
    with DecodedStream(path, on_bytes=on_bytes, name=name) as stream:
        yield from stream.chunks(chunk_bytes)


class DecodedStream:
    """The decoded content of one file, read in order: as new bytes (:meth:`read`, :meth:`chunks`) or into the
    caller's own buffer (:meth:`readinto`), which takes no new memory per read: a gigabyte read into fresh
    bytes faults in a gigabyte of pages (0.3-0.4 s of the kernel's time) where reading into one reused buffer
    takes 0.1 s. Gzip files (by content, not by name) are decompressed by ISA-L on a thread of its own. Every
    read is counted for progress (``on_bytes``: bytes of the file itself, compressed or not).

    Raises (when made or read):
        TraceFormatError: the file is empty, or its gzip stream is damaged or ends early.
    """

    def __init__(self, path: Path, *, on_bytes: ByteCallback | None = None, name: str | None = None) -> None:
        self.label = name or path.name
        if path.stat().st_size == 0:
            raise TraceFormatError(self.label, "file is empty (0 bytes)", where="byte 0")
        self._file = open(path, "rb")  # noqa: SIM115 - closed by close()
        self._counter = _CountingReader(self._file, on_bytes)
        gzip = self._file.read(2) == GZIP_MAGIC
        self._file.seek(0)
        # ISA-L's threaded reader decompresses ahead of us on its own thread.
        self._gzip = igzip_threaded.open(self._counter, "rb", threads=1, block_size=1 << 20) if gzip else None

    def read(self, size: int) -> bytes:
        """Up to ``size`` bytes of the content (fewer only at its end; none after it)."""
        if self._gzip is None:
            # From the file itself: ``read`` on the counting wrapper (io.RawIOBase's) would read into a bytearray
            # and copy it into the bytes returned, a second pass over every byte of the trace.
            block = self._file.read(size)
            self._counter.count(len(block))
            return block
        with self._gzip_errors():
            block = self._gzip.read(size)
        return block

    def readinto(self, view: memoryview) -> int:
        """Fill ``view`` with the next bytes of the content; returns how many (fewer only at its end)."""
        filled = 0
        while filled < len(view):
            if self._gzip is None:
                read = self._file.readinto(view[filled:])
                self._counter.count(read)
            else:
                with self._gzip_errors():
                    read = self._gzip.readinto(view[filled:])
            if not read:
                break
            filled += read
        return filled

    def chunks(self, size: int = CHUNK_BYTES) -> Iterator[bytes]:
        """The rest of the content in chunks of ``size`` bytes (the last shorter)."""
        while block := self.read(size):
            yield block

    @contextmanager
    def _gzip_errors(self) -> Iterator[None]:
        try:
            yield
        except EOFError:
            raise TraceFormatError(self.label, "gzip stream ends early (truncated file or upload?)",
                                   where=f"compressed byte {self._counter.position}") from None
        except (OSError, zlib.error) as exc:
            raise TraceFormatError(self.label, f"damaged gzip data ({exc})",
                                   where=f"compressed byte {self._counter.position}") from None

    def close(self) -> None:
        """Stop the decompressing thread (if any) and close the file."""
        if self._gzip is not None:
            self._gzip.close()
            self._gzip = None  # and its blocks with it: a reader keeps the stream (its ``fill``) for its header
        self._counter.close()

    def __enter__(self) -> DecodedStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class BatchBuffers:
    """Buffers of ``size`` bytes, reused for batches cut in place (``chrome_json.ChromeTraceReader.unchecked_batches``):
    each batch's buffer comes back (:meth:`give_back`) once its batch is read, and a later batch is read into it,
    so no new memory is faulted in per batch. A new buffer is made when none is free: how many batches are in
    flight is for the consumer to bound."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._free: list[bytearray] = []
        self._lock = threading.Lock()

    def take(self) -> bytearray:
        """A free buffer (its old bytes still in it), or a new one."""
        with self._lock:
            if self._free:
                return self._free.pop()
        return bytearray(self.size)

    def give_back(self, batch: object) -> None:
        """The buffer a batch (a view of it) was cut in is free again; anything else (a batch cut from chunks)
        is left alone."""
        if isinstance(batch, memoryview) and isinstance(batch.obj, bytearray) and len(batch.obj) == self.size:
            with self._lock:
                self._free.append(batch.obj)


Item = TypeVar("Item")


def read_ahead(chunks: Iterator[Item], depth: int = 2, name: str = "tracelake-read-ahead"
               ) -> Generator[Item, None, None]:
    """``chunks`` as they are, produced on a background thread (called ``name``) up to ``depth`` chunks ahead.

    Reading (and decompressing) releases the GIL, so the consumer's parsing overlaps
    it. Errors reach the consumer where the chunk would have; stopping early (closing the
    generator) stops the thread and closes ``chunks``. ``chunks`` never yields None.
    """
    ready: queue.Queue[tuple[Item | None, BaseException | None]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def hand_over(item: tuple[Item | None, BaseException | None]) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for chunk in chunks:
                if not hand_over((chunk, None)):
                    return
        except BaseException as exc:  # re-raised on the consuming thread
            hand_over((None, exc))
            return
        hand_over((None, None))

    thread = threading.Thread(target=produce, name=name, daemon=True)
    thread.start()
    try:
        while True:
            chunk, error = ready.get()
            if error is not None:
                raise error
            if chunk is None:
                return
            yield chunk
    finally:
        stop.set()
        thread.join()
        close = getattr(chunks, "close", None)
        if close is not None:
            close()


#: The most a format read whole (a JSON document) may hold once decompressed.
MAX_WHOLE_BYTES = 1 << 30


def read_whole(path: Path, *, on_bytes: ByteCallback | None = None, name: str | None = None,
               limit: int | None = None) -> bytes:
    """The decoded content of ``path`` at once, for formats parsed as one document.

    Raises:
        TraceFormatError: as :func:`iter_chunks`, or the content is over ``limit`` bytes
            (a gzip file expands up to 1000-fold: stop before it fills memory); default
            :data:`MAX_WHOLE_BYTES`.
    """
    limit = MAX_WHOLE_BYTES if limit is None else limit
    parts: list[bytes] = []
    size = 0
    for chunk in iter_chunks(path, on_bytes=on_bytes, name=name):
        size += len(chunk)
        if size > limit:
            raise TraceFormatError(name or path.name, f"expands to more than {limit >> 20} MB, more than tracelake "
                                   "reads of this format at once (a gzip bomb?)", where=f"byte {limit}")
        parts.append(chunk)
    return b"".join(parts)
