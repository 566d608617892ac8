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

Decompression goes through :class:`~tracelake.api.decompress.Decompressed`, which always
asks for bounded output, so no single call can inflate a bomb into memory; compressed
tars are decompressed by it, not by ``tarfile``. Zip extraction lives here, tar
extraction in :mod:`tracelake.api.archives_tar`; both write through :class:`Extractor`.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import struct
import tarfile
import time
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from tracelake.contracts.errors import InvalidArgument, TooLarge, TraceFormatError
from tracelake.ingest.model import MIN_EXPANSION_BYTES, expansion_limit
from tracelake.warehouse.settings import Settings

from .archives_tar import is_tar_header, unpack_tar
from .decompress import CHUNK, GZIP_MAGIC, Decompressed, compression_of
from .settings import ServerSettings

__all__ = ["UnpackLimits", "archive_kind", "check_gzip", "unpack"]

log = logging.getLogger(__name__)

_ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")
#: Central-directory bytes allowed per member before zipfile is even asked to read it
#: (46 fixed bytes plus name, extra field and comment); zipfile reads it all into memory.
_ZIP_DIRECTORY_BYTES_PER_MEMBER = 1024
_ZIP_DIRECTORY_SLACK = 64 << 10
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
    min_expansion_bytes: int = MIN_EXPANSION_BYTES

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
            max_members=ServerSettings.of(settings).max_archive_members,  # a plain Settings: the default
        )

    def expansion_limit(self, compressed_bytes: int) -> int:
        """Most bytes an upload of ``compressed_bytes`` bytes may expand to."""
        return expansion_limit(compressed_bytes, self.max_expansion_ratio, self.max_expanded_bytes,
                               self.min_expansion_bytes)


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
    compression = compression_of(head)
    if compression is not None:
        try:
            reader = Decompressed(path, compression, source=str(path), limit=CHUNK)
            try:
                block = reader.read_exactly(tarfile.BLOCKSIZE)
            finally:
                reader.close()
        except (TraceFormatError, TooLarge):
            return None
    else:
        block = head
    return "tar" if is_tar_header(block) else None


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
    out = Extractor(name=name, root=dest.resolve(), limits=limits,
                     budget=limits.expansion_limit(path.stat().st_size))
    if kind == "zip":
        _unpack_zip(path, out)
    else:
        unpack_tar(path, out)
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
        if f.read(2) != GZIP_MAGIC:
            return size
    limit = limits.expansion_limit(size)
    if budget is not None:
        limit = min(limit, budget)
    reader = Decompressed(path, "gzip", source=name, limit=limit,
                          too_large=lambda: _too_large(name, limit, limits))
    try:
        while reader.read(CHUNK):
            pass
    finally:
        reader.close()
    return reader.produced


# --- extraction ---------------------------------------------------------------------------------


@dataclass
class Extractor:
    """Writes members below ``root``, checking names and counting members and bytes.

    Internal to archive extraction (zip here, tar in :mod:`tracelake.api.archives_tar`).
    """

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
                want = min(CHUNK, self.budget - self.used + 1)
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
        if head[:2] == GZIP_MAGIC:
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


def _unpack_zip(path: Path, out: Extractor) -> None:
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


def _unpack_zip_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, out: Extractor) -> None:
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
