"""Limits of tracelake.api.archives: member counts, expansion ratios and bombs, and ``check_gzip``.

Too many members (also where the zip's own count lies), zip, tar.gz, tar.bz2 and gzip-member bombs
stop at the limit quickly, small compressible archives pass the floor, large members are not taken
for overhead; ``check_gzip`` measures, bounds and rejects single gzip files.
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import os
import struct
import tarfile
import time
from pathlib import Path

import pytest

from support.archives import LIMITS, bytes_under, files_under, make_tar, make_zip, tar_member, zeros_gzip, zip_bomb
from tracelake.api.archives import UnpackLimits, check_gzip, unpack
from tracelake.contracts.errors import TooLarge, TraceFormatError

#: A tight ratio so bombs are caught after a few MiB.
TIGHT = UnpackLimits(max_expanded_bytes=1 << 30, max_expansion_ratio=10, max_members=100)


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
