"""Bounded decompression of untrusted gzip, bzip2 and xz files.

:class:`Decompressed` reads a compressed upload's decompressed bytes, every member of a
concatenated file, without ever inflating more than the caller asked for: each
decompressor call passes ``max_length``, so no single call can blow a bomb up in
memory, and past a byte limit it raises :class:`TooLarge`. A truncated, corrupt or
garbage-trailed stream becomes a :class:`TraceFormatError` naming the upload and the
byte offset, never a raw ``zlib``/``bz2``/``lzma`` traceback.

:mod:`tracelake.api.archives` uses it to check gzip uploads and to feed compressed tars
to ``tarfile``, whose own decompression has no output bound.
"""

from __future__ import annotations

import bz2
import lzma
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, cast

from isal import isal_zlib

from tracelake.contracts.errors import TooLarge, TraceFormatError

#: Bytes read or written per step while streaming.
CHUNK = 1 << 20
#: Compressed bytes fed to a decompressor per step.
_FEED = 64 << 10
GZIP_MAGIC = b"\x1f\x8b"
#: Compressed container formats understood here: format -> (magic, label in messages).
_COMPRESSED: dict[str, tuple[bytes, str]] = {
    "gzip": (GZIP_MAGIC, "gzip"),
    "bzip2": (b"BZh", "bzip2"),
    "xz": (b"\xfd7zXZ\x00", "xz"),
}


def compression_of(head: bytes) -> str | None:
    """The compression (``"gzip"``, ``"bzip2"``, ``"xz"``) a file starting with ``head`` uses, or ``None``."""
    for fmt, (magic, _) in _COMPRESSED.items():
        if head.startswith(magic):
            return fmt
    return None


def _nothing() -> int:
    return 0


class _Decompressor(Protocol):
    @property
    def eof(self) -> bool: ...

    @property
    def unused_data(self) -> bytes: ...

    def decompress(self, data: bytes, max_length: int = ..., /) -> bytes: ...


def _decompressor(fmt: str) -> _Decompressor:
    if fmt == "gzip":
        return isal_zlib.decompressobj(wbits=31)
    if fmt == "bzip2":
        return bz2.BZ2Decompressor()
    return lzma.LZMADecompressor(format=lzma.FORMAT_XZ)


# isal's stub declares its error class as an instance.
_ISAL_ERROR = cast(type[Exception], isal_zlib.error)
_DECOMPRESS_ERRORS: tuple[type[BaseException], ...] = (
    _ISAL_ERROR, zlib.error, lzma.LZMAError, OSError, EOFError, ValueError)


class Decompressed:
    """A reader of a gzip, bzip2 or xz file's decompressed bytes, every member of it, bounded.

    Each call inflates at most the bytes asked for. Past ``limit + allowance()`` bytes out it
    raises :class:`TooLarge`; a truncated, corrupt or garbage-trailed stream raises
    :class:`TraceFormatError` with the byte offset.

    Args:
        path: The compressed file.
        fmt: Its compression, as :func:`compression_of` names it.
        source: The client's name for the file, used in error messages only.
        limit: Most decompressed bytes handed out (plus ``allowance()``).
        too_large: Builds the error raised past the limit; a plain one when omitted.
    """

    def __init__(self, path: Path, fmt: str, *, source: str, limit: int,
                 too_large: Callable[[], TooLarge] | None = None) -> None:
        self._file = path.open("rb")
        self._fmt = fmt
        self._magic, self._label = _COMPRESSED[fmt]
        self._source = source
        self._limit = limit
        self._too_large = too_large
        self._d: _Decompressor | None = None
        self._pending = b""
        self._read_pos = 0
        self._file_done = False
        self._streams = 0
        self._finished = False
        #: Bytes handed out so far.
        self.produced = 0
        #: Bytes allowed on top of ``limit``: what the caller accounts for elsewhere.
        self.allowance: Callable[[], int] = _nothing

    def close(self) -> None:
        """Close the underlying file."""
        self._file.close()

    def read(self, size: int = -1) -> bytes:
        """Up to ``size`` decompressed bytes (a chunk for ``-1``); ``b""`` at the end of the last member."""
        want = CHUNK if size is None or size < 0 else max(size, 1)
        while not self._finished:
            if self._d is None:
                if not self._next_stream():
                    self._finished = True
                    break
            d = self._d
            if d is None:
                continue
            if d.eof:
                self._pending = d.unused_data + self._pending
                self._d = None
                continue
            at = self._read_pos - len(self._pending)
            try:
                out = d.decompress(self._pending, want)
            except _DECOMPRESS_ERRORS as e:
                raise TraceFormatError(self._source, f"corrupt {self._label} data ({e})", where=f"byte {at}") from None
            self._pending = getattr(d, "unconsumed_tail", b"")
            if out:
                self.produced += len(out)
                if self.produced > self._limit + self.allowance():
                    raise self._over_limit()
                return out
            if not d.eof and not self._feed():
                raise TraceFormatError(self._source, f"{self._label} stream ends early at byte {self._read_pos} "
                                                     f"(truncated upload?)")
        return b""

    def read_exactly(self, size: int) -> bytes:
        """Up to ``size`` bytes, fewer only at the end of the stream."""
        parts: list[bytes] = []
        got = 0
        while got < size:
            chunk = self.read(size - got)
            if not chunk:
                break
            parts.append(chunk)
            got += len(chunk)
        return b"".join(parts)

    def _feed(self) -> bool:
        if self._file_done:
            return False
        data = self._file.read(_FEED)
        if not data:
            self._file_done = True
            return False
        self._read_pos += len(data)
        self._pending += data
        return True

    def _next_stream(self) -> bool:
        """Start the next concatenated stream; False at a clean end of file."""
        while True:
            if self._streams:
                # Zero padding between and after streams is tolerated, as gzip(1) does.
                self._pending = self._pending.lstrip(b"\0")
            if len(self._pending) >= len(self._magic) or not self._feed():
                break
        if not self._pending:
            return False
        if not self._pending.startswith(self._magic):
            at = self._read_pos - len(self._pending)
            if len(self._pending) < len(self._magic) and self._magic.startswith(self._pending):
                raise TraceFormatError(self._source, f"{self._label} stream ends early at byte {self._read_pos} "
                                                     f"(truncated upload?)")
            raise TraceFormatError(self._source, f"has data that is not {self._label} after the end of the "
                                                 f"compressed stream", where=f"byte {at}")
        self._d = _decompressor(self._fmt)
        self._streams += 1
        return True

    def _over_limit(self) -> TooLarge:
        if self._too_large is not None:
            return self._too_large()
        return TooLarge(f"{self._source}: decompresses to more than {self._limit:,} bytes")
