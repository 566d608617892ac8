"""Safe handling of untrusted uploads: archive sniffing, bounded extraction, gzip checks.

The REST API writes every upload into a private folder and calls these functions
before anything is ingested. Uploads are hostile until proven otherwise, so:

* archives are recognised from their content (:func:`archive_kind`), never their name;
* :func:`unpack` writes regular files and folders only, refuses any member that could
  land outside the destination (``..``, absolute paths, drive letters, backslashes,
  control characters, links, devices, fifos) and refuses duplicate names;
* every byte written is counted while it is streamed, so a zip or tar bomb stops at the
  limit after writing no more than the limit, whatever sizes the archive declares;
* gzip files, and gzip members of archives, are decompressed once by
  :func:`check_gzip` with the same bounds before a parser ever sees them;
* damaged or truncated input becomes a :class:`TraceFormatError` naming the upload and
  the byte offset, never a raw ``zipfile``/``tarfile``/``zlib`` traceback.

Decompression always asks for bounded output (``max_length``), so no single call can
inflate a bomb into memory; compressed tars are decompressed here, not by ``tarfile``.
"""

from __future__ import annotations

import bz2
import logging
import lzma
import os
import re
import stat
import struct
import tarfile
import time
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol, Self, cast

from isal import isal_zlib

from tracelake.warehouse.errors import InvalidArgument, TooLarge, TraceFormatError
from tracelake.warehouse.settings import Settings

log = logging.getLogger(__name__)

#: Bytes read or written per step while streaming.
_CHUNK = 1 << 20
#: Compressed bytes fed to a decompressor per step.
_FEED = 64 << 10
_GZIP_MAGIC = b"\x1f\x8b"
#: Compressed container formats a tar may come in: format -> (magic, label in messages).
_COMPRESSED: dict[str, tuple[bytes, str]] = {
    "gzip": (_GZIP_MAGIC, "gzip"),
    "bzip2": (b"BZh", "bzip2"),
    "xz": (b"\xfd7zXZ\x00", "xz"),
}
_ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")
#: Central-directory bytes allowed per member before zipfile is even asked to read it
#: (46 fixed bytes plus name, extra field and comment); zipfile reads it all into memory.
_ZIP_DIRECTORY_BYTES_PER_MEMBER = 1024
_ZIP_DIRECTORY_SLACK = 64 << 10
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
#: Exclusive creation, never through a link: nothing already there is overwritten or followed.
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_DRIVE = re.compile(r"^[A-Za-z]:")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class UnpackLimits:
    """How far an uploaded archive or gzip file may expand, and how many members it may hold.

    The expansion limit of an upload of ``n`` bytes is
    ``min(max_expanded_bytes, max(max_expansion_ratio * n, min_expansion_bytes))``: the
    ratio stops bombs, the floor lets tiny, highly compressible legitimate files through.
    """

    #: Most bytes all members (or one decompressed stream) may expand to, in all.
    max_expanded_bytes: int
    #: Most bytes written per byte uploaded.
    max_expansion_ratio: int
    #: Most members (files, folders, anything) an archive may hold.
    max_members: int
    #: Expansion always allowed, whatever the ratio says, so tiny uploads pass.
    min_expansion_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        for name in ("max_expanded_bytes", "max_expansion_ratio", "max_members", "min_expansion_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise InvalidArgument(f"UnpackLimits.{name} must be a whole number of at least 1, not {value!r}; "
                                      f"check the matching TRACELAKE_ setting")

    @classmethod
    def from_settings(cls, settings: Settings) -> UnpackLimits:
        """The limits configured by ``TRACELAKE_MAX_EXPANDED_BYTES``, ``..._EXPANSION_RATIO``, ``..._ARCHIVE_MEMBERS``."""
        return cls(
            max_expanded_bytes=settings.max_expanded_bytes,
            max_expansion_ratio=settings.max_expansion_ratio,
            max_members=settings.max_archive_members,
        )

    def expansion_limit(self, compressed_bytes: int) -> int:
        """Most bytes an upload of ``compressed_bytes`` bytes may expand to."""
        by_ratio = max(self.max_expansion_ratio * compressed_bytes, self.min_expansion_bytes)
        return min(self.max_expanded_bytes, by_ratio)


def archive_kind(path: Path) -> str | None:
    """Say whether the file at ``path`` is an archive, from its content, never its name.

    Returns:
        ``"zip"``, ``"tar"`` (plain, or compressed with gzip, bzip2 or xz) or ``None``
        for anything else, a gzip-compressed JSON trace included. Only the first tar
        header is decompressed, so probing a bomb costs nothing.
    """
    with path.open("rb") as f:
        head = f.read(512)
    if head.startswith(_ZIP_MAGICS):
        return "zip"
    compression = _compression_of(head)
    if compression is not None:
        try:
            reader = _Decompressed(path, compression, source=str(path), limit=_CHUNK)
            try:
                block = reader.read_exactly(tarfile.BLOCKSIZE)
            finally:
                reader.close()
        except (TraceFormatError, TooLarge):
            return None
    else:
        block = head
    return "tar" if _is_tar_header(block) else None


def unpack(path: Path, dest: Path, *, name: str, limits: UnpackLimits) -> list[Path]:
    """Extract the regular files of the archive at ``path`` into the empty folder ``dest``.

    Folders inside the archive are kept (a trace directory's layout matters); links,
    devices and fifos are refused. The first bad member fails the whole archive; the
    caller removes ``dest`` on any error.

    Args:
        path: The uploaded archive (zip, or tar plain or compressed with gzip, bzip2, xz).
        dest: An existing, empty folder to extract into.
        name: The client's name for the upload, used in error messages only.
        limits: Expansion and member-count limits.

    Returns:
        The paths of the extracted files, sorted.

    Raises:
        InvalidArgument: A member is unsafe (escapes ``dest``, is a link or device, ...)
            or a duplicate, or the archive uses a compression tracelake refuses.
        TooLarge: The archive holds too many members or expands past the limit.
        TraceFormatError: The file is not an archive, or it is damaged or truncated.
    """
    if not dest.is_dir() or any(dest.iterdir()):
        raise InvalidArgument(f"{dest}: unpack needs an existing, empty folder to extract {name} into")
    kind = archive_kind(path)
    if kind is None:
        raise TraceFormatError(name, "is not a zip or tar archive (tracelake unpacks .zip, .tar, .tar.gz, "
                                     ".tar.bz2 and .tar.xz, recognised by content)")
    started = time.perf_counter()
    out = _Extractor(name=name, root=dest.resolve(), limits=limits,
                     budget=limits.expansion_limit(path.stat().st_size))
    if kind == "zip":
        _unpack_zip(path, out)
    else:
        _unpack_tar(path, out)
    log.debug("unpacked %s: %d members, %d files, %d bytes in %.3f s", name, out.members, len(out.files),
              out.used, time.perf_counter() - started)
    return sorted(out.files)


def check_gzip(path: Path, *, name: str, limits: UnpackLimits, budget: int | None = None) -> int:
    """Decompress the gzip file at ``path`` once, counting bytes, to prove it is whole and bounded.

    Every member of a concatenated gzip file is read (that is legal gzip); nothing is kept.

    Args:
        path: The file; one that does not start with the gzip magic is left alone.
        name: The client's name for the file, used in error messages only.
        limits: Expansion limits; the file may expand to ``limits.expansion_limit(size)``.
        budget: A tighter cap, e.g. what is left of an archive's expansion budget.

    Returns:
        The decompressed size, or the file's own size when it is not gzip.

    Raises:
        TooLarge: It expands past the limit.
        TraceFormatError: The stream is truncated, corrupt or followed by garbage.
    """
    size = path.stat().st_size
    with path.open("rb") as f:
        if f.read(2) != _GZIP_MAGIC:
            return size
    limit = limits.expansion_limit(size)
    if budget is not None:
        limit = min(limit, budget)
    reader = _Decompressed(path, "gzip", source=name, limit=limit, limits=limits)
    try:
        while reader.read(_CHUNK):
            pass
    finally:
        reader.close()
    return reader.produced


# --- extraction ---------------------------------------------------------------------------------


@dataclass
class _Extractor:
    """Writes members below ``root``, checking names and counting members and bytes."""

    name: str
    root: Path
    limits: UnpackLimits
    budget: int
    used: int = 0
    #: Bytes written to disk, gzip members counted as stored (``used`` counts them expanded).
    written: int = 0
    members: int = 0
    files: list[Path] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)

    def count_member(self) -> None:
        """Count one more member; refuse the archive past ``max_members``."""
        self.members += 1
        if self.members > self.limits.max_members:
            raise TooLarge(f"{self.name}: holds more than {self.limits.max_members:,} members; upload fewer "
                           f"files per archive or raise TRACELAKE_MAX_ARCHIVE_MEMBERS")

    def refuse(self, member: str, why: str) -> InvalidArgument:
        """The error for an unsafe or unusable member; nothing of the archive is kept."""
        return InvalidArgument(f"{self.name}: member {member!r} {why}; nothing was unpacked")

    def bad_name(self, member: str, why: str) -> InvalidArgument:
        """The error for a member name that could land outside the destination."""
        return self.refuse(member, f"{why}; re-create the archive with plain relative paths")

    def parts(self, member: str) -> tuple[str, ...]:
        """The safe relative path components of ``member`` (empty for the archive's root)."""
        if member == "":
            raise self.bad_name(member, "has an empty name")
        if _CONTROL.search(member):
            raise self.bad_name(member, "has a control character in its name")
        try:
            member.encode("utf-8")
        except UnicodeEncodeError:
            raise self.bad_name(member, "has a name that is not valid UTF-8") from None
        if "\\" in member:
            raise self.bad_name(member, "has a backslash in its name (a Windows path?)")
        if member.startswith("/"):
            raise self.bad_name(member, "has an absolute path")
        if _DRIVE.match(member):
            raise self.bad_name(member, "starts with a drive letter")
        parts = tuple(p for p in member.split("/") if p not in ("", "."))
        if ".." in parts:
            raise self.bad_name(member, "has a '..' component")
        return parts

    def target(self, member: str, parts: tuple[str, ...]) -> Path:
        """Where ``member`` goes, after checking it is new and stays inside ``root``."""
        key = "/".join(parts)
        if key in self.seen:
            raise self.refuse(member, "is a duplicate of an earlier member")
        self.seen.add(key)
        target = self.root.joinpath(*parts)
        resolved = target.resolve()
        if resolved == self.root or not resolved.is_relative_to(self.root):
            raise self.refuse(member, "would be written outside the destination folder")
        return target

    def make_dir(self, member: str, parts: tuple[str, ...]) -> None:
        """Create a folder member (the root itself is allowed and ignored)."""
        if not parts:
            return
        target = self.target(member, parts)
        try:
            target.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise self.refuse(member, "clashes with a file member of the same name") from None

    def write_file(self, member: str, parts: tuple[str, ...], src: IO[bytes],
                   read_errors: tuple[type[BaseException], ...], where: str) -> None:
        """Stream a regular-file member to disk in chunks, counting every byte written."""
        if not parts:
            raise self.refuse(member, "is a file without a name")
        target = self.target(member, parts)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(target, _CREATE_FLAGS, 0o600)
        except (FileExistsError, NotADirectoryError, IsADirectoryError):
            raise self.refuse(member, "clashes with another member of the same name") from None
        except OSError as e:
            raise self.refuse(member, f"cannot be written ({e.strerror})") from None
        written = 0
        head = b""
        with os.fdopen(fd, "wb") as out:
            while True:
                # One byte more than the budget allows, so overflow shows before it is written.
                want = min(_CHUNK, self.budget - self.used + 1)
                try:
                    chunk = src.read(want)
                except read_errors as e:
                    raise _damaged(self.name, member, e, where) from None
                if not chunk:
                    break
                if self.used + len(chunk) > self.budget:
                    raise self.too_large()
                out.write(chunk)
                self.used += len(chunk)
                self.written += len(chunk)
                written += len(chunk)
                if len(head) < 2:
                    head += chunk[:2]
        if head[:2] == _GZIP_MAGIC:
            # A gzip member may be a bomb of its own; it spends the archive's budget too.
            left = self.budget - (self.used - written)
            expanded = check_gzip(target, name=f"{self.name}: member {member!r}", limits=self.limits,
                                  budget=left)
            self.used += expanded - written
        self.files.append(target)

    def too_large(self) -> TooLarge:
        """The error for an archive whose contents expand past the budget."""
        return _too_large(self.name, self.budget, self.limits)


def _damaged(name: str, member: str, error: BaseException, where: str) -> TraceFormatError:
    if isinstance(error, EOFError) or "unexpected end of data" in str(error):
        return TraceFormatError(name, f"member {member!r} ends early (truncated upload?)", where=where)
    return TraceFormatError(name, f"member {member!r} is damaged ({error}); re-create the archive", where=where)


def _too_large(source: str, limit: int, limits: UnpackLimits) -> TooLarge:
    return TooLarge(
        f"{source}: expands to more than {limit:,} bytes, the limit for this upload "
        f"({limits.max_expansion_ratio}x its size, at least {limits.min_expansion_bytes:,} and at most "
        f"{limits.max_expanded_bytes:,} bytes); upload smaller files, or ask the operator to raise "
        f"TRACELAKE_MAX_EXPANSION_RATIO or TRACELAKE_MAX_EXPANDED_BYTES"
    )


# --- zip ----------------------------------------------------------------------------------------

_ZIP_READ_ERRORS: tuple[type[BaseException], ...] = (
    zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, NotImplementedError, RuntimeError)
_ZIP_OPEN_ERRORS: tuple[type[BaseException], ...] = (*_ZIP_READ_ERRORS, struct.error)


def _unpack_zip(path: Path, out: _Extractor) -> None:
    declared = _zip_directory(path)
    if declared is not None:
        entries, directory_bytes = declared
        if entries > out.limits.max_members or directory_bytes > (
                out.limits.max_members * _ZIP_DIRECTORY_BYTES_PER_MEMBER + _ZIP_DIRECTORY_SLACK):
            raise TooLarge(f"{out.name}: its directory lists {entries:,} members in {directory_bytes:,} bytes, more "
                           f"than {out.limits.max_members:,} members may take; upload fewer files per archive or "
                           f"raise TRACELAKE_MAX_ARCHIVE_MEMBERS")
    try:
        zf = zipfile.ZipFile(path)
    except _ZIP_OPEN_ERRORS as e:
        raise TraceFormatError(out.name, f"is not a readable zip archive ({e}); re-create it and upload it "
                                         f"again") from None
    with zf:
        for info in zf.infolist():
            out.count_member()
            _unpack_zip_member(zf, info, out)


def _unpack_zip_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, out: _Extractor) -> None:
    member = info.orig_filename  # .filename silently stops at a NUL
    parts = out.parts(member)
    kind = stat.S_IFMT(info.external_attr >> 16)
    if kind == stat.S_IFLNK:
        raise out.refuse(member, "is a symbolic link; tracelake unpacks regular files and folders only")
    if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
        raise out.refuse(member, "is a device, fifo or socket; tracelake unpacks regular files and folders only")
    if member.endswith("/") or kind == stat.S_IFDIR:
        out.make_dir(member, parts)
        return
    if info.flag_bits & 0x1:
        raise out.refuse(member, "is encrypted; upload an archive without a password")
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        # bzip2 and lzma members decompress without an output bound inside zipfile.
        raise out.refuse(member, f"uses compression method {info.compress_type}; re-create the zip with "
                                 f"the usual deflate compression")
    where = f"byte {info.header_offset}"
    try:
        src = zf.open(info)
    except _ZIP_READ_ERRORS as e:
        raise _damaged(out.name, member, e, where) from None
    with src:
        out.write_file(member, parts, src, _ZIP_READ_ERRORS, where)


def _zip_directory(path: Path) -> tuple[int, int] | None:
    """The member count and central-directory size a zip declares, as zipfile will read them."""
    with path.open("rb") as f:
        size = f.seek(0, os.SEEK_END)
        if size < 22:
            return None
        f.seek(size - 22)
        record = f.read(22)
        end_at = size - 22
        if not (record.startswith(b"PK\x05\x06") and record.endswith(b"\0\0")):
            start = max(size - 65535 - 22, 0)
            f.seek(start)
            tail = f.read()
            found = tail.rfind(b"PK\x05\x06")
            if found < 0 or len(tail) - found < 22:
                return None
            record = tail[found:found + 22]
            end_at = start + found
        entries, directory_bytes = struct.unpack("<10xHL6x", record)
        if end_at >= 76:
            f.seek(end_at - 76)
            zip64 = f.read(76)
            if zip64[56:60] == b"PK\x06\x07" and zip64[:4] == b"PK\x06\x06":
                entries, directory_bytes = struct.unpack("<QQ", zip64[32:48])
    return int(entries), int(directory_bytes)


# --- tar ----------------------------------------------------------------------------------------


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


def _unpack_tar(path: Path, out: _Extractor) -> None:
    with path.open("rb") as raw:
        compression = _compression_of(raw.read(8))
    overhead = _TAR_OVERHEAD_BYTES + _TAR_OVERHEAD_PER_MEMBER * out.limits.max_members
    reader: _Decompressed | None = None
    fileobj: IO[bytes] | _Decompressed
    if compression is None:
        fileobj = path.open("rb")
    else:
        # tarfile's own decompression has no output bound per call (a bzip2 bomb would
        # land in memory whole), so the stream is decompressed here.
        reader = _Decompressed(path, compression, source=out.name, limit=overhead)
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
            while reader.read(_CHUNK):
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


def _unpack_tar_member(tf: tarfile.TarFile, info: tarfile.TarInfo, out: _Extractor) -> None:
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


def _is_tar_header(block: bytes) -> bool:
    try:
        tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
    except tarfile.HeaderError:
        return False
    return True


# --- bounded decompression ----------------------------------------------------------------------


def _compression_of(head: bytes) -> str | None:
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


class _Decompressed:
    """A reader of a gzip, bzip2 or xz file's decompressed bytes, every member of it, bounded.

    Each call inflates at most the bytes asked for. Past ``limit + allowance()`` bytes out it
    raises :class:`TooLarge`; a truncated, corrupt or garbage-trailed stream raises
    :class:`TraceFormatError` with the byte offset.
    """

    def __init__(self, path: Path, fmt: str, *, source: str, limit: int, limits: UnpackLimits | None = None) -> None:
        self._file = path.open("rb")
        self._fmt = fmt
        self._magic, self._label = _COMPRESSED[fmt]
        self._source = source
        self._limit = limit
        self._limits = limits
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
        want = _CHUNK if size is None or size < 0 else max(size, 1)
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
                    raise self._too_large()
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

    def _too_large(self) -> TooLarge:
        if self._limits is not None:
            return _too_large(self._source, self._limit, self._limits)
        return TooLarge(f"{self._source}: tar headers and padding take more than {self._limit:,} bytes beyond "
                        f"the members' data; this is not an archive tracelake unpacks")

