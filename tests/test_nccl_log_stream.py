"""NCCL debug logs read in chunks: any chunk size, part size and thread count gives the same tables."""

from __future__ import annotations

from pathlib import Path

import duckdb
import polars as pl
import pyarrow.parquet as pq
import pytest

from tracelake.ingest import ParseOptions, TraceInfo, nccl_log
from tracelake.ingest.nccl_log_writer import Parts
from tracelake.sample_traces import generate_nccl

TABLES = ("communicators", "comm_channels", "collectives")
PREFIX = "node-c:77:78 [0] NCCL INFO "


def _mixed_log() -> str:
    """The sample log, then what a long job adds: more COLL lines of every kind, an init and a TUNING line
    that come after the COLL lines they describe, WARN lines past those kept, timestamps in both forms,
    damaged lines, Unicode, a CRLF line, and no newline at the end."""
    sample = generate_nccl.debug_log().splitlines()
    coll = PREFIX + "{op}: opCount {seq:x} sendbuff 0x1 recvbuff 0x2 count {count} datatype 9 op 0 root 3 comm 0xabc " \
                    "{nranks}stream 0x9"
    lines = [*sample]
    for seq in range(300):
        op = ("AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Send", "Recv")[seq % 6]
        stamp = ("", "[2026-01-01 00:00:01.5] ", "[2026-01-01T00:00:02] ")[seq % 3]
        lines.append(stamp + coll.format(op=op, seq=seq, count=1024 * (seq % 4 + 1),
                                         nranks="[nranks=8] " if seq % 2 else ""))
        if seq % 50 == 7:
            lines += ["", f"node-c:77:78 [0] misc.cc:{seq} NCCL WARN warning number {seq}"]
        if seq % 40 == 3:
            lines += ["héllo wörld: ünïcode between the lines", "loss 2.3\r", sample[-1]]
    lines += [
        PREFIX + "ncclCommInitRank comm 0xabc rank 5 nranks 8 cudaDev 0 nvmlDev 0 busId 1 commId 0x1234 "
                 "- Init COMPLETE",
        PREFIX + "AllReduce: 2048 Bytes -> Algo TREE proto LL channel{Lo..Hi}={0..3}",
        PREFIX + "AllReduce: opCount zz sendbuff 0x1 recvbuff 0x2 count 4 datatype 7 op 0 root 0 comm 0xabc stream 0x1",
        PREFIX + "AllReduce: opCount 1f sendbuff count recvbuff 0x2 count 4 datatype 7 op 0 root 0 comm 0xabc "
                 "stream 0x1",
        "[2026-01-01 00:00:00.5] node-é:5100:5107 [0] NCCL INFO Ąll: opCount 1 sendbuff 0 recvbuff 0 count ١٢ "
        "datatype 7 op 0 root 0 comm 0x1 stream 0x1",
        PREFIX + "AllReduce: opCount 2a sendbuff 0x1 recvbuff 0x2 count 512 datatype 7 op 0 root 0 comm 0xabc stream 0x1",
    ]
    return "\n".join(lines)


def _parse(path: Path, staging: Path, **kwargs: int) -> tuple[TraceInfo, dict[str, pl.DataFrame]]:
    staging.mkdir()
    threads = kwargs.pop("threads", 2)
    options = ParseOptions(source_name=path.name, trace_id="0123456789abcdef0123", threads=threads)
    info = nccl_log.parse(path, staging, options, **kwargs)
    assert sorted(p.name for p in staging.iterdir()) == sorted(f"{t}.parquet" for t in TABLES)  # no parts left
    return info, frames_of(staging)


def frames_of(staging: Path) -> dict[str, pl.DataFrame]:
    """The parsed tables in ``staging``, as polars frames."""
    frames = {}
    for table in TABLES:
        frame = pl.from_arrow(pq.read_table(staging / f"{table}.parquet"))
        assert isinstance(frame, pl.DataFrame)
        frames[table] = frame
    return frames


@pytest.fixture
def mixed_log(tmp_path: Path) -> Path:
    path = tmp_path / "mixed.log"
    path.write_text(_mixed_log(), encoding="utf-8")
    return path


@pytest.mark.parametrize("chunk_bytes, part_rows, threads", [
    (509, 3, 2), (4096, 64, 1), (4096, 64, 3), (1 << 20, 1, 2),
])
def test_chunks_parts_and_threads_give_the_tables_of_one_chunk(
    mixed_log: Path, tmp_path: Path, chunk_bytes: int, part_rows: int, threads: int
) -> None:
    whole_info, whole = _parse(mixed_log, tmp_path / "whole", chunk_bytes=64 << 20, part_rows=1 << 30, threads=1)
    info, tables = _parse(mixed_log, tmp_path / "chunked", chunk_bytes=chunk_bytes, part_rows=part_rows,
                          threads=threads)
    assert info == whole_info
    for table in TABLES:
        assert tables[table].equals(whole[table]), table


def test_lines_read_later_describe_the_collectives_before_them(mixed_log: Path, tmp_path: Path) -> None:
    """The init and TUNING lines at the end of the log give rank, group and algorithm to COLL rows in every part."""
    info, tables = _parse(mixed_log, tmp_path / "staging", chunk_bytes=512, part_rows=16)
    colls = tables["collectives"]
    assert colls["event_id"].to_list() == list(range(colls.height))
    late = colls.filter(pl.col("process_group") == "0x1234")
    assert late.height == 300 + 2 and set(late["rank"].to_list()) == {5}
    assert set(late.filter(pl.col("collective") == "send")["src_rank"].to_list()) == {5}
    assert late.filter(pl.col("group_size").is_null()).is_empty()  # from [nranks=8] or the init line
    tuned = late.filter(pl.col("algorithm").is_not_null())
    # 2048 bytes: 1024 bf16 elements (every 12th opCount) and the last line's 512 float32 ones
    assert tuned.height == 25 + 1 and set(tuned["collective"].to_list()) == {"all_reduce"}
    assert set(tuned.select("algorithm", "protocol", "channels").rows()) == {("TREE", "LL", 4)}
    assert info.warnings[:2] == ["NCCL WARN on node-b:5103: NET/IB : Got async event : port error",
                                 "NCCL WARN on node-c:77: warning number 7"]
    assert info.warnings[5] == "2 more NCCL WARN lines"  # 1 + 6 WARN lines, 5 kept


def test_a_character_cut_by_the_chunk_end_is_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "unicode.log"
    line = "node-é:1:2 [0] NCCL INFO AllReduce: opCount 1 sendbuff 0 recvbuff 0 count 1 datatype 7 op 0 root 0 " \
           "comm 0x1 stream 0x1\n"
    path.write_text(line * 3, encoding="utf-8")
    cut = line.encode().index("é".encode()) + 1  # the first chunk ends inside the two bytes of "é"
    for chunk_bytes in (cut, 1):
        _, tables = _parse(path, tmp_path / f"staging-{chunk_bytes}", chunk_bytes=chunk_bytes)
        assert tables["collectives"]["process_group"].to_list() == ["0x1"] * 3


def test_collectives_are_written_a_row_group_per_part(mixed_log: Path, tmp_path: Path) -> None:
    """Each part becomes one row group, and DuckDB reads the file (delta-coded counters, dictionaries)."""
    _, tables = _parse(mixed_log, tmp_path / "staging", chunk_bytes=4096, part_rows=100)
    path = tmp_path / "staging" / "collectives.parquet"
    metadata = pq.read_metadata(path)
    rows = [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
    assert sum(rows) == tables["collectives"].height and len(rows) > 3 and min(rows[:-1]) >= 100
    with duckdb.connect() as con:
        got = con.execute("SELECT count(*), sum(event_id), min(ts_ns), max(seq), count(DISTINCT process_group) "
                          "FROM read_parquet(?)", [str(path)]).fetchone()
    colls = tables["collectives"]
    assert got == (colls.height, colls["event_id"].sum(), colls["ts_ns"].min(), colls["seq"].max(),
                   colls["process_group"].n_unique())


def test_a_log_without_collectives_writes_an_empty_table(tmp_path: Path) -> None:
    path = tmp_path / "init.log"
    path.write_text(PREFIX + "ncclCommInitRank comm 0xabc rank 0 nranks 1 cudaDev 0 busId 1 - Init COMPLETE\n")
    info, tables = _parse(path, tmp_path / "staging", chunk_bytes=7, part_rows=1)
    assert tables["collectives"].is_empty() and tables["communicators"].height == 1 and info.world_size == 1


def test_the_parts_are_removed_when_the_log_is_not_nccl(tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    path.write_text("epoch 1\n" * 100)
    staging = tmp_path / "staging"
    staging.mkdir()
    with pytest.raises(nccl_log.TraceFormatError, match="train.log: no NCCL INFO/WARN lines in 100 lines"):
        nccl_log.parse(path, staging, ParseOptions(source_name="train.log"), chunk_bytes=64, part_rows=1)
    assert not any(staging.iterdir())


def test_parts_are_written_compressed_and_read_back_as_they_were(tmp_path: Path) -> None:
    """Staged COLL rows take a few bytes each on disk (uncompressed: over 100) and come back unchanged."""
    lines = pl.Series([PREFIX + f"AllReduce: opCount {seq:x} sendbuff 0x7f00{seq:04x} recvbuff 0x2 count 1024 "
                                f"datatype 9 op 0 root 0 comm 0x55d0c0a0beef0123 stream 0x9" for seq in range(20_000)])
    rows = nccl_log.coll_rows(lines)
    parts = Parts(tmp_path / "parts", part_rows=5_000)
    for start in range(0, rows.height, 2_500):
        parts.add(rows.slice(start, 2_500))
    files = sorted((tmp_path / "parts").iterdir())
    assert len(files) == 4 and parts.rows == rows.height
    assert sum(f.stat().st_size for f in files) < 10 * rows.height
    assert pl.concat(list(parts)).equals(rows)
    parts.remove()
    assert not (tmp_path / "parts").exists()
