"""Archives made by hand for the tests of tracelake.api.archives: zips, tars, gzip'd zeros and zip bombs.

Builders write archives with the members, types and names a test needs (unsafe ones included);
``zeros_gzip`` and ``zip_bomb`` make highly compressible data fast (isal), ``files_under`` and
``bytes_under`` read back what was unpacked. Used by ``test_archives.py`` and ``test_archive_limits.py``;
``plain_or_gzip`` writes one file either way, for the readers of decoded content (``test_source_chunks.py``,
``test_cut_in_place.py``).
"""

from __future__ import annotations

import gzip
import io
import stat
import struct
import tarfile
import zipfile
import zlib
from pathlib import Path
from typing import Literal

from isal import isal_zlib
from tracelake.api.archives import UnpackLimits

LIMITS = UnpackLimits(max_expanded_bytes=1 << 30, max_expansion_ratio=200, max_members=100)


def make_zip(path: Path, members: dict[str, bytes], *, dirs: tuple[str, ...] = ()) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for d in dirs:
            zf.writestr(zipfile.ZipInfo(d), b"")
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def tar_member(name: str, data: bytes = b"", type_: bytes = tarfile.REGTYPE, linkname: str = "") -> tuple[
        tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type = type_
    info.linkname = linkname
    info.size = len(data) if type_ == tarfile.REGTYPE else 0
    return info, data


TarMode = Literal["w", "w:gz", "w:bz2", "w:xz"]


def make_tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes]], mode: TarMode = "w") -> Path:
    with tarfile.open(path, mode, format=tarfile.PAX_FORMAT) as tf:
        for info, data in members:
            tf.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return path


def zeros_gzip(size: int) -> bytes:
    """``size`` zero bytes, gzip-compressed fast (isal level 1 packs about 1000:1)."""
    c = isal_zlib.compressobj(1, isal_zlib.DEFLATED, 31)
    chunk = bytes(1 << 20)
    parts = [c.compress(chunk) for _ in range(size >> 20)]
    return b"".join(parts) + c.flush()


def zip_bomb(path: Path, size: int) -> Path:
    """A valid zip of one ``size``-byte member of zeros, deflated about 1000:1, built by hand (fast)."""
    c = isal_zlib.compressobj(1, isal_zlib.DEFLATED, -15)
    chunk = bytes(1 << 20)
    crc = 0
    parts = []
    for _ in range(size >> 20):
        parts.append(c.compress(chunk))
        crc = zlib.crc32(chunk, crc)
    body = b"".join(parts) + c.flush()
    name = b"bomb.bin"
    local = struct.pack("<4s2B4HL2L2H", b"PK\x03\x04", 20, 0, 0, 8, 0, 0x21, crc, len(body), size, len(name), 0)
    central = struct.pack("<4s4B4HL2L5H2L", b"PK\x01\x02", 20, 3, 20, 0, 0, 8, 0, 0x21, crc, len(body), size,
                          len(name), 0, 0, 0, 0, (stat.S_IFREG | 0o644) << 16, 0)
    directory = central + name
    offset = len(local) + len(name) + len(body)
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 1, 1, len(directory), offset, 0)
    path.write_bytes(local + name + body + directory + end)
    return path


def files_under(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def bytes_under(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def plain_or_gzip(path: Path, content: bytes, compressed: bool) -> Path:
    """``content`` written to ``path``, or gzip'd (level 1) to ``path`` with ``.gz`` for its suffix; the file's path."""
    if compressed:
        path = path.with_suffix(".gz")
        path.write_bytes(gzip.compress(content, compresslevel=1))
    else:
        path.write_bytes(content)
    return path
