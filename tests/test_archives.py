"""Tests of tracelake.api.archives: hostile uploads are refused, bounded and reported clearly."""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import os
import stat
import struct
import tarfile
import time
import zipfile
import zlib
from pathlib import Path
from typing import Literal

import pytest
from isal import isal_zlib

from tracelake.api.archives import UnpackLimits, archive_kind, check_gzip, unpack
from tracelake.api.settings import ServerSettings
from tracelake.contracts.errors import InvalidArgument, TooLarge, TraceFormatError

LIMITS = UnpackLimits(max_expanded_bytes=1 << 30, max_expansion_ratio=200, max_members=100)
#: A tight ratio so bombs are caught after a few MiB.
TIGHT = UnpackLimits(max_expanded_bytes=1 << 30, max_expansion_ratio=10, max_members=100)

TRACE_DIR = {
    "run1/host0.trace.json.gz": gzip.compress(json.dumps({"traceEvents": [{"ph": "X", "ts": 1}]}).encode()),
    "run1/plugins/profile/run1/host0.xplane.pb": bytes(range(256)) * 40,
    "run1/notes.txt": b"hello\n",
    "top.json": b'{"traceEvents": []}',
}


# --- helpers ------------------------------------------------------------------------------------


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


@pytest.fixture
def dest(tmp_path: Path) -> Path:
    d = tmp_path / "box" / "dest"
    d.mkdir(parents=True)
    return d


def assert_nothing_escaped(tmp_path: Path, dest: Path) -> None:
    """Nothing beside ``dest`` or the archive, nor at the absolute path the tests try."""
    assert list(dest.parent.iterdir()) == [dest]
    assert {p.name for p in tmp_path.iterdir()} <= {"box", "up.zip", "up.tar", "up.tar.gz"}
    assert not Path("/tmp/tracelake-evil").exists()


# --- good archives ------------------------------------------------------------------------------


def test_zip_with_nested_folders_extracts_same_bytes(tmp_path: Path, dest: Path) -> None:
    archive = make_zip(tmp_path / "up.zip", TRACE_DIR, dirs=("run1/", "run1/plugins/"))
    paths = unpack(archive, dest, name="up.zip", limits=LIMITS)
    assert files_under(dest) == TRACE_DIR
    assert paths == sorted(paths) and len(paths) == len(TRACE_DIR)
    assert all(p.is_file() and dest.resolve() in p.parents for p in paths)


@pytest.mark.parametrize("mode", ["w", "w:gz", "w:bz2", "w:xz"])
def test_tar_with_nested_folders_extracts_same_bytes(tmp_path: Path, dest: Path, mode: TarMode) -> None:
    members = [tar_member("./", type_=tarfile.DIRTYPE), tar_member("./run1", type_=tarfile.DIRTYPE)]
    members += [tar_member(f"./{name}", data) for name, data in TRACE_DIR.items()]
    archive = make_tar(tmp_path / "up.tar", members, mode)
    paths = unpack(archive, dest, name="up.tar", limits=LIMITS)
    assert files_under(dest) == TRACE_DIR
    assert [p.relative_to(dest.resolve()).as_posix() for p in paths] == sorted(TRACE_DIR)


def test_concatenated_gzip_tar_members_are_all_read(tmp_path: Path, dest: Path) -> None:
    plain = make_tar(tmp_path / "plain.tar", [tar_member("a.json", b"{}" * 5000)]).read_bytes()
    archive = tmp_path / "up.tar.gz"
    archive.write_bytes(gzip.compress(plain[:4096]) + gzip.compress(plain[4096:]))
    unpack(archive, dest, name="up.tar.gz", limits=LIMITS)
    assert files_under(dest) == {"a.json": b"{}" * 5000}


# --- hostile names and member types -------------------------------------------------------------

BAD_NAMES = ["../evil", "a/../../evil", "/tmp/tracelake-evil", "C:/evil", "a\\..\\evil", "a/\x01b", "ok/../x"]


@pytest.mark.parametrize("bad", BAD_NAMES)
def test_zip_unsafe_names_are_refused(tmp_path: Path, dest: Path, bad: str) -> None:
    archive = make_zip(tmp_path / "up.zip", {"fine.json": b"{}", bad: b"x"})
    with pytest.raises(InvalidArgument) as e:
        unpack(archive, dest, name="up.zip", limits=LIMITS)
    assert str(e.value).startswith("up.zip: member ") and repr(bad) in str(e.value)
    assert not isinstance(e.value, TooLarge)
    assert_nothing_escaped(tmp_path, dest)


@pytest.mark.parametrize("bad", BAD_NAMES)
def test_tar_unsafe_names_are_refused(tmp_path: Path, dest: Path, bad: str) -> None:
    archive = make_tar(tmp_path / "up.tar.gz", [tar_member("fine.json", b"{}"), tar_member(bad, b"x")], "w:gz")
    with pytest.raises(InvalidArgument, match=r"^up\.tar\.gz: member "):
        unpack(archive, dest, name="up.tar.gz", limits=LIMITS)
    assert_nothing_escaped(tmp_path, dest)


def test_empty_member_names_are_refused(tmp_path: Path, dest: Path) -> None:
    archive = tmp_path / "up.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr(zipfile.ZipInfo(""), b"x")
    with pytest.raises(InvalidArgument, match="up.zip: member '' has an empty name"):
        unpack(archive, dest, name="up.zip", limits=LIMITS)
    tar = make_tar(tmp_path / "up.tar", [tar_member("", b"x")])
    with pytest.raises(InvalidArgument, match="up.tar: member '' has an empty name"):
        unpack(tar, dest, name="up.tar", limits=LIMITS)
    assert list(dest.iterdir()) == []


@pytest.mark.parametrize(
    ("member", "why"),
    [
        (tar_member("link", type_=tarfile.SYMTYPE, linkname="/etc/passwd"), "symbolic link"),
        (tar_member("link", type_=tarfile.SYMTYPE, linkname="../../evil"), "symbolic link"),
        (tar_member("hard", type_=tarfile.LNKTYPE, linkname="a.json"), "hard link"),
        (tar_member("fifo", type_=tarfile.FIFOTYPE), "fifo"),
        (tar_member("dev", type_=tarfile.CHRTYPE), "device"),
        (tar_member("disk", type_=tarfile.BLKTYPE), "device"),
    ],
)
def test_tar_links_and_special_files_are_refused(tmp_path: Path, dest: Path,
                                                 member: tuple[tarfile.TarInfo, bytes], why: str) -> None:
    archive = make_tar(tmp_path / "up.tar", [tar_member("a.json", b"{}"), member, tar_member("z.json", b"{}")])
    with pytest.raises(InvalidArgument, match=why) as e:
        unpack(archive, dest, name="up.tar", limits=LIMITS)
    assert repr(member[0].name) in str(e.value)
    assert not (dest / member[0].name).exists() and not (dest / "z.json").exists()
    assert_nothing_escaped(tmp_path, dest)


def test_zip_symlink_member_is_refused(tmp_path: Path, dest: Path) -> None:
    archive = tmp_path / "up.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        info = zipfile.ZipInfo("link")
        info.create_system = 3
        info.external_attr = (stat.S_IFLNK | 0o777) << 16
        zf.writestr(info, "../../evil")
    with pytest.raises(InvalidArgument, match="symbolic link"):
        unpack(archive, dest, name="up.zip", limits=LIMITS)
    assert list(dest.iterdir()) == []


def test_duplicate_names_are_refused(tmp_path: Path, dest: Path) -> None:
    archive = make_tar(tmp_path / "up.tar", [tar_member("a/b.json", b"1"), tar_member("./a//b.json", b"2")])
    with pytest.raises(InvalidArgument, match="duplicate"):
        unpack(archive, dest, name="up.tar", limits=LIMITS)
    assert (dest / "a" / "b.json").read_bytes() == b"1"


def test_duplicate_zip_names_are_refused(tmp_path: Path, dest: Path) -> None:
    archive = tmp_path / "up.zip"
    with pytest.warns(UserWarning, match="Duplicate name"), zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("a.json", b"1")
        zf.writestr("a.json", b"2")
    with pytest.raises(InvalidArgument, match="'a.json' is a duplicate"):
        unpack(archive, dest, name="up.zip", limits=LIMITS)


def test_file_and_folder_of_the_same_name_are_refused(tmp_path: Path, dest: Path) -> None:
    archive = make_zip(tmp_path / "up.zip", {"a": b"1", "a/b": b"2"})
    with pytest.raises(InvalidArgument, match="'a/b' clashes"):
        unpack(archive, dest, name="up.zip", limits=LIMITS)


def test_bzip2_zip_members_are_refused(tmp_path: Path, dest: Path) -> None:
    archive = tmp_path / "up.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_BZIP2) as zf:
        zf.writestr("a.json", b"{}")
    with pytest.raises(InvalidArgument, match="compression method 12"):
        unpack(archive, dest, name="up.zip", limits=LIMITS)


# --- limits -------------------------------------------------------------------------------------


def test_too_many_members(tmp_path: Path, dest: Path) -> None:
    few = UnpackLimits(max_expanded_bytes=1 << 30, max_expansion_ratio=200, max_members=5)
    members = {f"f{i}.json": b"{}" for i in range(6)}
    with pytest.raises(TooLarge, match="more than 5 members"):
        unpack(make_zip(tmp_path / "up.zip", members), dest, name="up.zip", limits=few)
    tar = make_tar(tmp_path / "up.tar", [tar_member(n, d) for n, d in members.items()])
    dest2 = tmp_path / "dest2"
    dest2.mkdir()
    with pytest.raises(TooLarge, match="TRACELAKE_MAX_ARCHIVE_MEMBERS"):
        unpack(tar, dest2, name="up.tar", limits=few)
    assert len(list(dest2.iterdir())) == 5
    dest3 = tmp_path / "dest3"
    dest3.mkdir()
    five = make_zip(tmp_path / "five.zip", dict(list(members.items())[:5]))
    assert len(unpack(five, dest3, name="five.zip", limits=few)) == 5


def test_member_counts_the_zip_declares_are_not_trusted(tmp_path: Path, dest: Path) -> None:
    few = UnpackLimits(max_expanded_bytes=1 << 30, max_expansion_ratio=200, max_members=5)
    raw = bytearray(make_zip(tmp_path / "up.zip", {f"f{i}.json": b"{}" for i in range(8)}).read_bytes())
    raw[-14:-10] = struct.pack("<HH", 1, 1)  # the end record claims one member
    lying = tmp_path / "lying.zip"
    lying.write_bytes(bytes(raw))
    with pytest.raises(TooLarge, match="more than 5 members"):
        unpack(lying, dest, name="lying.zip", limits=few)
    assert len(list(dest.iterdir())) == 5


def test_zip_bomb_stops_at_the_limit_quickly(tmp_path: Path, dest: Path) -> None:
    archive = zip_bomb(tmp_path / "bomb.zip", 1 << 30)
    size = archive.stat().st_size
    assert size < 4 << 20
    started = time.perf_counter()
    with pytest.raises(TooLarge, match=r"^bomb\.zip: expands to more than"):
        unpack(archive, dest, name="bomb.zip", limits=TIGHT)
    assert time.perf_counter() - started < 2
    assert 0 < bytes_under(dest) <= TIGHT.expansion_limit(size)


def test_small_archives_of_compressible_data_pass_the_floor(tmp_path: Path, dest: Path) -> None:
    data = b"0" * (512 << 10)
    archive = make_zip(tmp_path / "up.zip", {"a.json": data})
    assert archive.stat().st_size * TIGHT.max_expansion_ratio < len(data)
    unpack(archive, dest, name="up.zip", limits=TIGHT)
    assert (dest / "a.json").read_bytes() == data


def test_tar_gz_bomb_stops_at_the_limit(tmp_path: Path, dest: Path) -> None:
    archive = tmp_path / "bomb.tar.gz"
    with gzip.open(archive, "wb", compresslevel=1) as gz, tarfile.open(fileobj=gz, mode="w|") as tf:
        info = tarfile.TarInfo("zeros.bin")
        info.size = 64 << 20
        tf.addfile(info, io.BytesIO(bytes(info.size)))
    with pytest.raises(TooLarge):
        unpack(archive, dest, name="bomb.tar.gz", limits=TIGHT)
    assert bytes_under(dest) <= TIGHT.expansion_limit(archive.stat().st_size)


def test_tar_bz2_bomb_stops_at_the_limit(tmp_path: Path, dest: Path) -> None:
    archive = tmp_path / "bomb.tar.bz2"
    with bz2.open(archive, "wb") as bz, tarfile.open(fileobj=bz, mode="w|") as tf:
        info = tarfile.TarInfo("zeros.bin")
        info.size = 16 << 20
        tf.addfile(info, io.BytesIO(bytes(info.size)))
    assert archive.stat().st_size < 1024  # bzip2 packs runs of zeros better than 10000:1
    with pytest.raises(TooLarge, match="expands to more than 1,048,576 bytes"):
        unpack(archive, dest, name="bomb.tar.bz2", limits=LIMITS)
    assert bytes_under(dest) <= LIMITS.min_expansion_bytes


def test_large_members_of_a_compressed_tar_are_not_mistaken_for_overhead(tmp_path: Path, dest: Path) -> None:
    few = UnpackLimits(max_expanded_bytes=1 << 30, max_expansion_ratio=200, max_members=2)
    data = os.urandom(3 << 20)
    archive = make_tar(tmp_path / "up.tar.gz", [tar_member("a.bin", data), tar_member("b.bin", data)], "w:gz")
    unpack(archive, dest, name="up.tar.gz", limits=few)
    assert files_under(dest) == {"a.bin": data, "b.bin": data}


def test_gzip_member_bomb_inside_a_tar(tmp_path: Path, dest: Path) -> None:
    bomb = zeros_gzip(256 << 20)
    archive = make_tar(tmp_path / "up.tar", [tar_member("ok.json", b"{}"), tar_member("rank0.json.gz", bomb)])
    with pytest.raises(TooLarge, match=r"^up\.tar: member 'rank0\.json\.gz': expands to more than"):
        unpack(archive, dest, name="up.tar", limits=LIMITS)


def test_gzip_members_count_against_the_archive_budget(tmp_path: Path, dest: Path) -> None:
    trace = gzip.compress(b'{"traceEvents": []}' * 1000)
    archive = make_tar(tmp_path / "up.tar", [tar_member("run/a.json.gz", trace)])
    [path] = unpack(archive, dest, name="up.tar", limits=LIMITS)
    assert path.read_bytes() == trace


def test_check_gzip_bomb(tmp_path: Path) -> None:
    path = tmp_path / "bomb.json.gz"
    path.write_bytes(zeros_gzip(1 << 30))
    started = time.perf_counter()
    with pytest.raises(TooLarge, match=r"^bomb\.json\.gz: expands to more than"):
        check_gzip(path, name="bomb.json.gz", limits=TIGHT)
    with pytest.raises(TooLarge):
        check_gzip(path, name="bomb.json.gz", limits=LIMITS, budget=1 << 20)
    assert time.perf_counter() - started < 2


def test_check_gzip_sizes(tmp_path: Path) -> None:
    multi = tmp_path / "multi.json.gz"
    multi.write_bytes(gzip.compress(b"a" * 1000) + gzip.compress(b"b" * 234) + b"\0" * 8)
    assert check_gzip(multi, name="multi.json.gz", limits=LIMITS) == 1234
    plain = tmp_path / "plain.json"
    plain.write_bytes(b'{"traceEvents": []}')
    assert check_gzip(plain, name="plain.json", limits=LIMITS) == plain.stat().st_size


def test_check_gzip_truncated(tmp_path: Path) -> None:
    whole = gzip.compress(bytes(range(256)) * 4000)
    path = tmp_path / "rank-3.json.gz"
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(TraceFormatError, match="truncated") as e:
        check_gzip(path, name="rank-3.json.gz", limits=LIMITS)
    assert str(e.value) == f"rank-3.json.gz: gzip stream ends early at byte {len(whole) // 2} (truncated upload?)"
    path.write_bytes(whole + whole[:1])
    with pytest.raises(TraceFormatError, match="truncated"):
        check_gzip(path, name="rank-3.json.gz", limits=LIMITS)


def test_check_gzip_corrupt(tmp_path: Path) -> None:
    whole = bytearray(gzip.compress(json.dumps({"traceEvents": list(range(5000))}).encode()))
    whole[20:40] = b"\xff" * 20
    path = tmp_path / "bad.json.gz"
    path.write_bytes(bytes(whole))
    with pytest.raises(TraceFormatError, match=r"^bad\.json\.gz: corrupt gzip data .* at byte \d+$"):
        check_gzip(path, name="bad.json.gz", limits=LIMITS)
    path.write_bytes(gzip.compress(b"{}") + b"garbage")
    with pytest.raises(TraceFormatError, match="not gzip after the end"):
        check_gzip(path, name="bad.json.gz", limits=LIMITS)


# --- damaged archives ---------------------------------------------------------------------------


def test_corrupt_and_truncated_zip(tmp_path: Path, dest: Path) -> None:
    good = make_zip(tmp_path / "good.zip", {"a.json": bytes(range(256)) * 400}).read_bytes()
    archive = tmp_path / "up.zip"
    archive.write_bytes(good[: len(good) - 30])
    with pytest.raises(TraceFormatError, match=r"^up\.zip: is not a readable zip archive"):
        unpack(archive, dest, name="up.zip", limits=LIMITS)
    damaged = bytearray(good)
    damaged[100:400] = bytes(300)
    archive.write_bytes(bytes(damaged))
    with pytest.raises(TraceFormatError, match=r"^up\.zip: member 'a\.json' is damaged .* at byte 0$"):
        unpack(archive, dest, name="up.zip", limits=LIMITS)


def test_corrupt_and_truncated_tar(tmp_path: Path, dest: Path) -> None:
    good = make_tar(tmp_path / "good.tar", [tar_member("a.json", b"{}" * 600), tar_member("b.json", b"{}")])
    raw = good.read_bytes()
    archive = tmp_path / "up.tar"
    damaged = bytearray(raw)
    header_b = raw.index(b"b.json") // 512 * 512
    damaged[header_b + 148: header_b + 156] = b"9999999\0"  # bad checksum in the second header
    archive.write_bytes(bytes(damaged))
    with pytest.raises(TraceFormatError, match=rf"damaged tar header .* at byte {header_b}$"):
        unpack(archive, dest, name="up.tar", limits=LIMITS)
    assert header_b == 2048
    for cut in (header_b, header_b + 100, 700, 1800):  # at a header, in one, in data, in padding
        archive.write_bytes(raw[:cut])
        fresh = tmp_path / f"dest-{cut}"
        fresh.mkdir()
        with pytest.raises(TraceFormatError, match=r"ends early.*\(truncated upload\?\)"):
            unpack(archive, fresh, name="up.tar", limits=LIMITS)


def test_truncated_tar_gz(tmp_path: Path, dest: Path) -> None:
    good = make_tar(tmp_path / "good.tar.gz", [tar_member("a.bin", bytes(range(256)) * 2000)], "w:gz").read_bytes()
    archive = tmp_path / "up.tar.gz"
    archive.write_bytes(good[: len(good) * 2 // 3])
    with pytest.raises(TraceFormatError, match=r"^up\.tar\.gz: gzip stream ends early at byte \d+ \(truncated"):
        unpack(archive, dest, name="up.tar.gz", limits=LIMITS)


def test_truncated_gzip_member_of_a_tar(tmp_path: Path, dest: Path) -> None:
    whole = gzip.compress(bytes(range(256)) * 400)
    archive = make_tar(tmp_path / "up.tar", [tar_member("run/rank0.json.gz", whole[:-9])])
    with pytest.raises(TraceFormatError) as e:
        unpack(archive, dest, name="up.tar", limits=LIMITS)
    assert str(e.value) == (f"up.tar: member 'run/rank0.json.gz': gzip stream ends early at byte {len(whole) - 9} "
                            f"(truncated upload?)")


def test_encrypted_zip_members_are_refused(tmp_path: Path, dest: Path) -> None:
    raw = bytearray(make_zip(tmp_path / "plain.zip", {"secret.json": b"not really encrypted"}).read_bytes())
    central = raw.index(b"PK\x01\x02")
    raw[6] |= 0x1  # the "encrypted" flag, in the local header and in the central directory
    raw[central + 8] |= 0x1
    archive = tmp_path / "up.zip"
    archive.write_bytes(bytes(raw))
    with pytest.raises(InvalidArgument, match="'secret.json' is encrypted"):
        unpack(archive, dest, name="up.zip", limits=LIMITS)


def test_not_an_archive(tmp_path: Path, dest: Path) -> None:
    path = tmp_path / "trace.zip"
    path.write_bytes(b'{"traceEvents": []}')
    with pytest.raises(TraceFormatError, match=r"^trace\.zip: is not a zip or tar archive"):
        unpack(path, dest, name="trace.zip", limits=LIMITS)


def test_oversized_pax_header_is_refused(tmp_path: Path, dest: Path) -> None:
    info = tarfile.TarInfo("a.json")
    info.pax_headers = {"comment": "x" * (200 << 10)}
    info.size = 2
    archive = tmp_path / "up.tar"
    with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as tf:
        tf.addfile(info, io.BytesIO(b"{}"))
    with pytest.raises(TraceFormatError, match="extended header"):
        unpack(archive, dest, name="up.tar", limits=LIMITS)


# --- sniffing and settings ----------------------------------------------------------------------


def test_archive_kind_reads_content_not_names(tmp_path: Path) -> None:
    data = b'{"traceEvents": []}'
    members = [tar_member("a.json", data)]
    cases = {
        "zip": make_zip(tmp_path / "a.json", {"a.json": data}),
        "tar": make_tar(tmp_path / "b.zip", members),
        "tar.gz": make_tar(tmp_path / "c.json.gz", members, "w:gz"),
        "tar.bz2": make_tar(tmp_path / "d", members, "w:bz2"),
        "tar.xz": make_tar(tmp_path / "e", members, "w:xz"),
    }
    assert {k: archive_kind(p) for k, p in cases.items()} == {
        "zip": "zip", "tar": "tar", "tar.gz": "tar", "tar.bz2": "tar", "tar.xz": "tar"}
    plain = tmp_path / "f.tar"
    plain.write_bytes(data)
    gz = tmp_path / "g.tar.gz"
    gz.write_bytes(gzip.compress(data * 100))
    bz = tmp_path / "h.tar.bz2"
    bz.write_bytes(bz2.compress(data))
    xz = tmp_path / "i.tar.xz"
    xz.write_bytes(lzma.compress(data))
    empty = tmp_path / "j"
    empty.write_bytes(b"")
    assert [archive_kind(p) for p in (plain, gz, bz, xz, empty)] == [None] * 5


def test_archive_kind_does_not_inflate_bombs(tmp_path: Path) -> None:
    path = tmp_path / "bomb.gz"
    path.write_bytes(zeros_gzip(1 << 30))
    started = time.perf_counter()
    assert archive_kind(path) is None
    assert time.perf_counter() - started < 0.5


def test_limits_from_settings() -> None:
    settings = ServerSettings(max_expanded_bytes=1000, max_expansion_ratio=7, max_archive_members=3)
    limits = UnpackLimits.from_settings(settings)
    assert (limits.max_expanded_bytes, limits.max_expansion_ratio, limits.max_members) == (1000, 7, 3)
    assert limits.expansion_limit(10) == 1000  # the floor, capped by the maximum
    big = UnpackLimits(max_expanded_bytes=1 << 40, max_expansion_ratio=7, max_members=3)
    assert big.expansion_limit(10) == big.min_expansion_bytes
    assert big.expansion_limit(1 << 30) == 7 << 30
    with pytest.raises(InvalidArgument, match="max_members"):
        UnpackLimits(max_expanded_bytes=1, max_expansion_ratio=1, max_members=0)


def test_unpack_needs_an_empty_folder(tmp_path: Path, dest: Path) -> None:
    archive = make_zip(tmp_path / "up.zip", {"a.json": b"{}"})
    (dest / "old").write_bytes(b"")
    with pytest.raises(InvalidArgument, match="empty folder"):
        unpack(archive, dest, name="up.zip", limits=LIMITS)
