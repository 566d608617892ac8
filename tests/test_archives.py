"""Tests of tracelake.api.archives: hostile uploads are refused, bounded and reported clearly.

Good archives, hostile names and member types, damaged archives, sniffing and settings; the limits
(member counts, bombs, ``check_gzip``) are in ``test_archive_limits.py``, the archive builders in
``support/archives.py``.
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import stat
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from support.archives import LIMITS, TarMode, files_under, make_tar, make_zip, tar_member, zeros_gzip
from tracelake.api.archives import UnpackLimits, archive_kind, unpack
from tracelake.api.settings import ServerSettings
from tracelake.contracts.errors import InvalidArgument, TooLarge, TraceFormatError

TRACE_DIR = {
    "run1/host0.trace.json.gz": gzip.compress(json.dumps({"traceEvents": [{"ph": "X", "ts": 1}]}).encode()),
    "run1/plugins/profile/run1/host0.xplane.pb": bytes(range(256)) * 40,
    "run1/notes.txt": b"hello\n",
    "top.json": b'{"traceEvents": []}',
}


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
