"""The trace id of an upload, computed as its bytes arrive: the SHA-256 of its decoded content.

A trace's id hashes what the file decodes to, not its bytes (:func:`tracelake.ingest.content_id`,
docs/formats.md "Trace ids"), so a gzip upload is decompressed on the fly, every member of it,
as the chunks land; nothing decoded is kept. The same rules as the rest of the gzip readers
apply: zero padding between and after members is tolerated (as gzip(1) does), anything else
after a member is an error, and the decoded size is bounded by the expansion rule
(:meth:`tracelake.api.archives.UnpackLimits.expansion_limit`): while the upload arrives by what
the largest file allowed may expand to, and at its end by what this file's size allows.
"""

from __future__ import annotations

import hashlib
from typing import cast

from isal import isal_zlib
from tracelake.contracts.errors import TraceFormatError
from tracelake.ingest import ID_DIGITS

from .archives import UnpackLimits, _too_large
from .decompress import GZIP_MAGIC

#: Most decoded bytes one decompress call makes (bounds memory per step).
STEP = 4 << 20
_ISAL_ERROR = cast(type[Exception], isal_zlib.error)  # isal's stub declares its error class as an instance


class ContentHasher:
    """Feeds of a file's bytes in, its trace id out; gzip is hashed decompressed.

    Args:
        name: The client's name for the file, for error messages.
        limits: The expansion rule.
        most_bytes: The largest the file may be (bounds the expansion while it arrives).
    """

    def __init__(self, name: str, limits: UnpackLimits, most_bytes: int) -> None:
        self.name = name
        self.limits = limits
        self._ceiling = limits.expansion_limit(most_bytes)
        self._digest = hashlib.sha256()
        self._head = b""
        self._gzip: bool | None = None
        self._d: object | None = None
        self._pending = b""
        self._members = 0
        #: Bytes received, and decoded bytes hashed.
        self.received = 0
        self.decoded = 0

    def update(self, data: bytes) -> None:
        """Hash the next bytes of the file.

        Raises:
            TraceFormatError: the gzip data is corrupt, or followed by something that is not gzip.
            TooLarge: it decompresses past what the largest file allowed may.
        """
        self.received += len(data)
        if self._gzip is None:
            self._head += data
            if len(self._head) < len(GZIP_MAGIC):
                return
            self._gzip = self._head.startswith(GZIP_MAGIC)
            data, self._head = self._head, b""
        if not self._gzip:
            self._digest.update(data)
            self.decoded += len(data)
            return
        self._pending += data
        self._drain(final=False)

    def finish(self) -> str:
        """The trace id, once every byte was fed.

        Raises:
            TraceFormatError: the gzip stream ends early (a truncated upload).
            TooLarge: it decompresses past what its size allows.
        """
        if self._gzip is None:  # fewer bytes than the magic: plain
            self._digest.update(self._head)
            self.decoded += len(self._head)
        elif self._gzip:
            self._drain(final=True)
            if self._d is not None:
                raise TraceFormatError(self.name, f"gzip stream ends early at byte {self.received} "
                                                  "(truncated upload?)")
            limit = self.limits.expansion_limit(self.received)
            if self.decoded > limit:
                raise _too_large(self.name, limit, self.limits)
        return self._digest.hexdigest()[:ID_DIGITS]

    def _drain(self, *, final: bool) -> None:
        while True:
            if self._d is None:
                if self._members:
                    self._pending = self._pending.lstrip(b"\0")
                if not self._pending:
                    return
                at = self.received - len(self._pending)
                if not self._pending.startswith(GZIP_MAGIC[: len(self._pending)]) or (
                        len(self._pending) >= len(GZIP_MAGIC) and not self._pending.startswith(GZIP_MAGIC)):
                    raise TraceFormatError(self.name, "has data that is not gzip after the end of the compressed "
                                                      "stream", where=f"byte {at}")
                if len(self._pending) < len(GZIP_MAGIC):
                    if final:
                        raise TraceFormatError(self.name, f"gzip stream ends early at byte {self.received} "
                                                          "(truncated upload?)")
                    return
                self._d = isal_zlib.decompressobj(wbits=31)
                self._members += 1
            d = self._d
            at = self.received - len(self._pending)
            try:
                out = d.decompress(self._pending, STEP)  # type: ignore[attr-defined]
            except _ISAL_ERROR as exc:
                raise TraceFormatError(self.name, f"corrupt gzip data ({exc})", where=f"byte {at}") from None
            self._pending = d.unconsumed_tail  # type: ignore[attr-defined]
            if out:
                self.decoded += len(out)
                if self.decoded > self._ceiling:
                    raise _too_large(self.name, self._ceiling, self.limits)
                self._digest.update(out)
            if d.eof:  # type: ignore[attr-defined]
                self._pending = d.unused_data + self._pending  # type: ignore[attr-defined]
                self._d = None
            elif not out and not self._pending:
                return
