"""Tar extraction for :mod:`tracelake.api.archives`: ``tarfile`` hardened against hostile uploads.

``tarfile`` trusts its input in ways an upload service cannot, so here it:

* reads a compressed tar through :class:`~tracelake.api.decompress.Decompressed`, never
  through its own unbounded decompression, and caps the stream's non-member bytes;
* refuses oversized pax and GNU long-name headers (``tarfile`` reads them into memory
  whole), sparse files and over-long header chains;
* reports a damaged or missing header after the first as truncation, where ``tarfile``
  would silently stop as if the archive had ended;
* writes regular files and folders only, through the caller's
  :class:`~tracelake.api.archives.Extractor`, which checks names and counts bytes.
"""

from __future__ import annotations

import tarfile
import zlib
from pathlib import Path
from typing import IO, TYPE_CHECKING, Self

from tracelake.contracts.errors import TooLarge, TraceFormatError

from .decompress import CHUNK, Decompressed, compression_of

if TYPE_CHECKING:
    # Only for annotations: archives imports this module to unpack tars.
    from .archives import Extractor

#: Largest pax or GNU long-name header accepted; tarfile reads these into memory whole.
_TAR_META_BYTES = 64 << 10
_TAR_META_TYPES = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE, tarfile.GNUTYPE_LONGNAME,
                   tarfile.GNUTYPE_LONGLINK)
#: Tar stream bytes (headers, padding) allowed beyond member data: fixed plus per member.
#: The fixed part also covers read-ahead: a member chunk is inflated before it is counted.
_TAR_OVERHEAD_BYTES = 4 << 20
_TAR_OVERHEAD_PER_MEMBER = 2048
# typeshed does not declare these tarfile exceptions, but tarfile raises them.
_TAR_HEADER_SHORT: tuple[type[Exception], ...] = (
    getattr(tarfile, "EmptyHeaderError"),
    getattr(tarfile, "TruncatedHeaderError"),
)
_TAR_HEADER_INVALID: type[Exception] = getattr(tarfile, "InvalidHeaderError")


class _TarProblem(Exception):
    """A hostile or damaged tar header, raised from inside tarfile's reading loop."""

    def __init__(self, reason: str, offset: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.offset = offset


class _GuardedTarInfo(tarfile.TarInfo):
    """A TarInfo that refuses oversized metadata headers and sparse files, and reports truncation.

    tarfile reads pax and GNU long-name headers into memory whole and silently treats a
    damaged or missing header after the first as the end of the archive.
    """

    @classmethod
    def frombuf(cls, buf: bytes | bytearray, encoding: str, errors: str) -> Self:
        """Parse one header block, refusing what could exhaust memory."""
        obj = super().frombuf(buf, encoding, errors)
        if obj.type in _TAR_META_TYPES and obj.size > _TAR_META_BYTES:
            raise _TarProblem(f"has a {obj.size:,}-byte extended header (at most {_TAR_META_BYTES:,} allowed)")
        if obj.type == tarfile.GNUTYPE_SPARSE:
            raise _TarProblem(f"member {obj.name!r} is a sparse file, which tracelake does not unpack")
        return obj

    @classmethod
    def fromtarfile(cls, archive: tarfile.TarFile) -> Self:
        """Read the next header, turning a damaged or truncated one into :class:`_TarProblem`."""
        fileobj = archive.fileobj
        start = fileobj.tell() if fileobj is not None else 0
        try:
            return super().fromtarfile(archive)
        except _TAR_HEADER_SHORT:
            if start == 0:
                raise
            raise _TarProblem("tar archive ends early (truncated upload?)", start) from None
        except _TAR_HEADER_INVALID as e:
            if start == 0:
                raise
            raise _TarProblem(f"has a damaged tar header ({e})", start) from None
        except _TarProblem as e:
            if e.offset is None:
                e.offset = start
            raise


_TAR_READ_ERRORS: tuple[type[BaseException], ...] = (tarfile.TarError, EOFError, zlib.error, _TarProblem)
# A chain of pax or long-name headers makes tarfile recurse once per header.
_TAR_LOOP_ERRORS: tuple[type[BaseException], ...] = (*_TAR_READ_ERRORS, RecursionError)


def unpack_tar(path: Path, out: Extractor) -> None:
    """Extract the tar at ``path`` (plain, or gzip, bzip2 or xz compressed) through ``out``.

    Raises:
        InvalidArgument: A member is unsafe, a duplicate or not a regular file or folder.
        TooLarge: Too many members, too many bytes, or too much header and padding.
        TraceFormatError: The tar or its compressed stream is damaged or truncated.
    """
    with path.open("rb") as raw:
        compression = compression_of(raw.read(8))
    overhead = _TAR_OVERHEAD_BYTES + _TAR_OVERHEAD_PER_MEMBER * out.limits.max_members
    reader: Decompressed | None = None
    fileobj: IO[bytes] | Decompressed
    if compression is None:
        fileobj = path.open("rb")
    else:
        # tarfile's own decompression has no output bound per call (a bzip2 bomb would
        # land in memory whole), so the stream is decompressed here.
        reader = Decompressed(path, compression, source=out.name, limit=overhead,
                              too_large=lambda: _tar_overhead_too_large(out.name, overhead))
        # Member data is the archive budget's business; here only the rest of the stream is capped.
        reader.allowance = lambda: out.written
        fileobj = reader
    try:
        try:
            tf = tarfile.open(fileobj=fileobj, mode="r|", tarinfo=_GuardedTarInfo)  # type: ignore[call-overload]
        except _TAR_READ_ERRORS as e:
            raise _tar_error(out.name, e, "is not a readable tar archive") from None
        with tf:
            try:
                for info in tf:
                    out.count_member()
                    _unpack_tar_member(tf, info, out)
            except _TAR_LOOP_ERRORS as e:
                raise _tar_error(out.name, e, "is a damaged tar archive") from None
        if reader is not None:
            # Read to the end so a truncated or corrupt compressed stream is noticed.
            while reader.read(CHUNK):
                pass
    finally:
        fileobj.close()


def _tar_error(name: str, error: BaseException, what: str) -> TraceFormatError:
    if isinstance(error, _TarProblem):
        return TraceFormatError(name, error.reason, where=f"byte {error.offset}" if error.offset else None)
    if isinstance(error, RecursionError):
        return TraceFormatError(name, "has too deeply chained tar headers; re-create the archive")
    if "unexpected end of data" in str(error):
        return TraceFormatError(name, "tar archive ends early (truncated upload?)")
    return TraceFormatError(name, f"{what} ({error}); re-create it and upload it again")


def _tar_overhead_too_large(name: str, overhead: int) -> TooLarge:
    return TooLarge(f"{name}: tar headers and padding take more than {overhead:,} bytes beyond "
                    f"the members' data; this is not an archive tracelake unpacks")


def _unpack_tar_member(tf: tarfile.TarFile, info: tarfile.TarInfo, out: Extractor) -> None:
    member = info.name
    parts = out.parts(member)
    if info.issym():
        raise out.refuse(member, "is a symbolic link; tracelake unpacks regular files and folders only")
    if info.islnk():
        raise out.refuse(member, "is a hard link; tracelake unpacks regular files and folders only")
    if info.ischr() or info.isblk():
        raise out.refuse(member, "is a device file; tracelake unpacks regular files and folders only")
    if info.isfifo():
        raise out.refuse(member, "is a fifo; tracelake unpacks regular files and folders only")
    if info.isdir():
        out.make_dir(member, parts)
        return
    if not info.isreg() or info.issparse():
        raise out.refuse(member, f"has tar member type {info.type!r}; tracelake unpacks regular files and "
                                 f"folders only")
    src = tf.extractfile(info)
    if src is None:
        raise out.refuse(member, "has no data to read")
    with src:
        out.write_file(member, parts, src, _TAR_READ_ERRORS, f"byte {info.offset}")


def is_tar_header(block: bytes) -> bool:
    """Whether the 512-byte ``block`` parses as a tar header (checksum included)."""
    try:
        tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
    except tarfile.HeaderError:
        return False
    return True
