"""The native NCCL log scanner (``_nccl_scan.c``) and the polars path give the same tables, on every sample log,
on damaged and odd lines, and on random bytes; the engine is chosen by ``TRACELAKE_NCCL_LOG_ENGINE``."""

from __future__ import annotations

import gzip
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tracelake.contracts.errors import InvalidArgument
from tracelake.ingest import ParseOptions, TraceInfo, nccl_log, nccl_log_scan
from tracelake.ingest.nccl_log_coll import coll_rows
from tracelake.sample_traces import generate_nccl
from tracelake.warehouse.settings import Settings

from test_nccl_log_stream import TABLES, _mixed_log, frames_of

SAMPLE = Path(generate_nccl.__file__).parent / "nccl" / "debug_log" / "train-4ranks.log"
native = pytest.mark.skipif(not nccl_log_scan.AVAILABLE, reason="the native NCCL log scanner is not built")
BASE = ("node-a:5100:5107 [0] NCCL INFO AllReduce: opCount 1f sendbuff 0x7f00 recvbuff 0x7f08 count 1024 "
        "datatype 7 op 0 root 0 comm 0x55d0c0a0")


def _tables(path: Path, staging: Path, engine: str,
            **kwargs: int) -> tuple[TraceInfo, dict[str, pl.DataFrame]]:
    staging.mkdir()
    options = ParseOptions(source_name=path.name, trace_id="0123456789abcdef0123", threads=2, nccl_log_engine=engine)
    info = nccl_log.parse(path, staging, options, **kwargs)
    return info, frames_of(staging)


def _same_found(native_found: nccl_log._Found, polars_found: nccl_log._Found) -> None:
    assert (native_found.lines, native_found.version, native_found.version_lines) == \
        (polars_found.lines, polars_found.version, polars_found.version_lines)
    kinds = {k: v for k, v in native_found.kinds.items() if v.height}
    expected = {k: v for k, v in polars_found.kinds.items() if v.height}
    assert sorted(kinds) == sorted(expected)
    for kind, frame in kinds.items():
        assert frame.equals(expected[kind]), kind


def _logs(tmp_path: Path) -> dict[str, Path]:
    logs = {"sample": SAMPLE, "generated": tmp_path / "generated.log", "mixed": tmp_path / "mixed.log"}
    logs["generated"].write_text(generate_nccl.debug_log(), encoding="utf-8")
    logs["mixed"].write_text(_mixed_log(), encoding="utf-8")
    logs["gzip"] = tmp_path / "mixed.log.gz"  # read by source.iter_chunks, not into reused buffers
    logs["gzip"].write_bytes(gzip.compress(_mixed_log().encode()))
    for shape, lines in generate_nccl.debug_log_shapes().items():
        logs[shape] = tmp_path / f"{shape}.log"
        logs[shape].write_text("\n".join(lines) + "\n", encoding="utf-8")
    return logs


@native
@pytest.mark.parametrize("chunk_bytes", [1 << 20, 997])
def test_both_engines_give_the_same_tables_on_every_sample_log(tmp_path: Path, chunk_bytes: int) -> None:
    for name, path in _logs(tmp_path).items():
        got = _tables(path, tmp_path / f"native-{name}", "native", chunk_bytes=chunk_bytes, part_rows=50)
        expected = _tables(path, tmp_path / f"polars-{name}", "polars", chunk_bytes=chunk_bytes,
                           part_rows=50)
        assert got[0] == expected[0], name
        for table in TABLES:
            assert got[1][table].equals(expected[1][table]), (name, table)


@native
def test_the_scanner_takes_well_formed_lines_and_gives_up_on_odd_ones() -> None:
    """Ordinary lines are read natively (not handed to polars); a Unicode or damaged COLL line sends the chunk
    to the polars path, which decides."""
    good = [
        BASE + " [nranks=4] stream 0x55d0d000",
        BASE + " stream 0x55d0d000",
        "[1,3]<stderr>:" + BASE + " [nranks=8] stream 0x1 trailing words",
        "gpu-node-7: [2026-01-01T00:00:00] " + BASE + " stream 0xab",
        "[2026-01-01 00:00:00.5]" + BASE + " stream 0xab",
        "[2024-02-29 23:59:59.123456789] " + BASE.replace("datatype 7", "datatype 12") + " stream 0x1\r",
        "a:1:2:3 [0] NCCL INFO Send: opCount 1 sendbuff 0 recvbuff 0 count 1 datatype 9 op 0 root 3000000000 "
        "comm 0x1 [nranks=99999999999] stream 0x3",
    ]
    scanned = nccl_log_scan.scan("\n".join(good).encode())
    assert scanned is not None and scanned.rows is not None and scanned.lines == len(good)
    assert scanned.rows.equals(coll_rows(pl.Series(good)))
    for odd in [BASE.replace("node-a", "node-é") + " stream 0x1", BASE.replace("opCount 1f", "opCount zz"),
                BASE.replace("count 1024", "count 99999999999999999999999") + " stream 0x1",
                "[2026-02-30 00:00:00] " + BASE + " stream 0x1", "[2026-01-01 00:00:60] " + BASE + " stream 0x1",
                BASE.replace("sendbuff 0x7f00", "sendbuff count") + " stream 0x1"]:
        assert nccl_log_scan.scan(("\n".join(good) + "\n" + odd).encode()) is None, odd


#: Damaged and odd COLL lines (as tests/test_nccl_tests.py's reference check), around well-formed ones.
ODD = [
    BASE + " [nranks=4] stream 0x55d0d000", BASE + " stream 0x55d0d000",
    BASE.replace("count 1024", "count 1x24") + " stream 0x1", BASE.replace("opCount 1f", "opCount zz") + " stream 0x1",
    BASE.replace("root 0", "root") + " stream 0x1", BASE + " [nranks=x] stream 0x1", BASE + " stream 55d0",
    BASE.replace(" [0] ", " [a] ") + " stream 0x1", "node-a:5100:5107 [0] NCCL INFO AllReduce: opCount",
    BASE + " stream 0x55d0d000xyz", BASE.replace("opCount 1f", "opCount ffffffffffffffffffffff") + " stream 0x1",
    BASE.replace("node-a:5100", "node-a:99999999999999999999999") + " stream 0x1",
    BASE + " stream 0x1 NCCL INFO and more", BASE.replace("recvbuff 0x7f08", "recvbuff count") + " stream 0x1",
    BASE.replace("AllReduce", "All-Reduce") + " stream 0x1", BASE.replace("count 1024", "count -1") + " stream 0x1",
    BASE.replace(" NCCL INFO ", " NCCL  INFO ") + " stream 0x1", "[2026-13-01 00:00:00] " + BASE + " stream 0x1",
    "[1500-01-01 00:00:00] " + BASE + " stream 0x1", "[2026-01-01 00:00:00.1234567890] " + BASE + " stream 0x1",
    "[2026-01-01 00:00:00.] " + BASE + " stream 0x1", "node-a:1:2 [0] NCCL WARN opCount is odd",
    "NCCL version 2.21.5+cuda12.4", "[2026-01-01 00:00:00.5] node-é:5100:5107 [0] NCCL INFO Ąll: opCount 1 "
    "sendbuff 0 recvbuff 0 count ١٢ datatype 7 op 0 root 0 comm 0x1 stream 0x1",
]


@native
@pytest.mark.parametrize("odd", ODD)
def test_each_odd_line_among_good_ones_gives_what_polars_gives(odd: str) -> None:
    text = "\n".join([BASE + " stream 0x1", odd, "loss 2.0", BASE + " [nranks=2] stream 0x2"]) + "\n"
    _same_found(nccl_log._scan_native([text.encode()]), nccl_log._scan([text.encode()]))


_SIGNIFICANT = st.sampled_from([" ", "[", "]", ":", "0", "9", "a", "f", "x", "é", "\t", "\r", "\n", "\x0b", "\x1c",
                                "\u00a0", "T", "-", ".",
                                "\x00", "\xff", " count ", " NCCL INFO ", " opCount ", "NCCL WARN "])


@native
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(lines=st.lists(st.sampled_from(ODD + generate_nccl.debug_log().splitlines()), min_size=1, max_size=8),
       edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 3), _SIGNIFICANT), max_size=6),
       cut=st.integers(0, 10_000), raw=st.binary(max_size=64), latin=st.booleans())
def test_fuzz_native_and_polars_agree_on_mutated_and_random_bytes(
    lines: list[str], edits: list[tuple[int, int, str]], cut: int, raw: bytes, latin: bool
) -> None:
    """Lines edited at random places (characters inserted, deleted, replaced), truncated, with random bytes
    (invalid UTF-8 included) put in: the scanner never crashes, and the chunk's lines, kinds and COLL rows are
    those of the polars path."""
    text = "\n".join(lines)
    for at, deleted, insert in edits:
        at %= len(text) + 1
        text = text[:at] + insert + text[at + deleted:]
    data = text.encode("utf-8" if not latin else "latin-1", "replace")
    at = cut % (len(data) + 1)
    data = data[:at] + raw + data[at:]
    _same_found(nccl_log._scan_native([data]), nccl_log._scan([data]))
    _same_found(nccl_log._scan_native([data[:at], data[at:]]), nccl_log._scan([data[:at], data[at:]]))


def test_the_engine_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACELAKE_NCCL_LOG_ENGINE", "fast")
    with pytest.raises(InvalidArgument, match="TRACELAKE_NCCL_LOG_ENGINE='fast'"):
        Settings.from_env()
    monkeypatch.setenv("TRACELAKE_NCCL_LOG_ENGINE", "polars")
    assert Settings.from_env().nccl_log_engine == "polars"
    assert not nccl_log_scan.use_native("polars")
    monkeypatch.setattr(nccl_log_scan, "AVAILABLE", False)
    assert not nccl_log_scan.use_native("auto")
    with pytest.raises(InvalidArgument, match="not built"):
        nccl_log_scan.use_native("native")


def test_without_the_extension_the_polars_path_reads_the_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nccl_log_scan, "AVAILABLE", False)
    monkeypatch.setattr(nccl_log_scan, "_native", None)
    info, tables = _tables(SAMPLE, tmp_path / "staging", "auto")
    assert tables["collectives"].height > 0 and info.world_size == 4
    with pytest.raises(RuntimeError, match="not built"):
        nccl_log_scan.scan(b"")


_DIGITS = st.text("0123456789", min_size=1, max_size=12)
_HEX = st.text("0123456789abcdef", min_size=1, max_size=15)


@st.composite
def _coll_lines(draw: st.DrawFn) -> str:
    """A well-formed COLL line of any shape the scanner takes: launcher prefix, timestamp of any date NCCL could
    print (both separators, 0-9 fraction digits), numbers of any size that fits."""
    stamp = ""
    if draw(st.booleans()):
        year, month = draw(st.integers(1678, 2261)), draw(st.integers(1, 12))
        day = draw(st.integers(1, 29 if month == 2 and year % 4 == 0 and (year % 100 or year % 400 == 0) else
                               28 if month == 2 else 30 if month in (4, 6, 9, 11) else 31))
        fraction = draw(st.text("0123456789", max_size=9))
        stamp = (f"[{year:04d}-{month:02d}-{day:02d}{draw(st.sampled_from(' T'))}{draw(st.integers(0, 23)):02d}:"
                 f"{draw(st.integers(0, 59)):02d}:{draw(st.integers(0, 59)):02d}{'.' + fraction if fraction else ''}]"
                 + draw(st.sampled_from(["", " "])))
    launcher = draw(st.sampled_from(["", "[1,0]<stdout>:", "gpu-7: ", "rank3> "]))
    host = draw(st.text("abz09._-", min_size=1, max_size=8))
    nranks = f" [nranks={draw(_DIGITS)}]" if draw(st.booleans()) else ""
    end = draw(st.sampled_from(["", "\r", " and more"]))
    return (f"{launcher}{stamp}{host}:{draw(st.integers(0, 10**12))}:{draw(_DIGITS)} [{draw(_DIGITS)}] NCCL INFO "
            f"{draw(st.sampled_from(['AllReduce', 'Send', 'Recv', 'AlltoAll', 'x_1']))}: opCount {draw(_HEX)} "
            f"sendbuff {draw(st.sampled_from(['0x7f00', '(nil)', '0']))} recvbuff 0x{draw(_HEX)} "
            f"count {draw(_DIGITS)} datatype {draw(st.integers(0, 14))} op {draw(_DIGITS)} root {draw(_DIGITS)} "
            f"comm 0x{draw(_HEX)}{nranks} stream 0x{draw(_HEX)}{end}")


@native
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(lines=st.lists(_coll_lines(), min_size=1, max_size=10))
def test_fuzz_the_scanner_converts_every_field_as_polars_does(lines: list[str]) -> None:
    """Well-formed lines with random fields are all taken by the scanner, every value as :func:`coll_rows` has it."""
    scanned = nccl_log_scan.scan("\n".join(lines).encode())
    assert scanned is not None and scanned.rows is not None
    assert scanned.rows.equals(coll_rows(pl.Series(lines)))
