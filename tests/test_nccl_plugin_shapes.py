"""NCCL profiler plugin and Inspector output as NCCL really writes it (docs/formats.md, section 3)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from tracelake import ingest
from tracelake.contracts.errors import TraceFormatError
from tracelake.ingest.detect import detect
from tracelake.sample_traces import generate_nccl


def _collectives(tmp_path: Path, name: str, text: str) -> tuple[str, pl.DataFrame]:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    staging = tmp_path / f"{name}.staging"
    staging.mkdir()
    fmt, _ = ingest.parse_into(path, staging, ingest.ParseOptions(source_name=name, trace_id="t"))
    return fmt.name, pl.read_parquet(staging / "collectives.parquet")


def test_unquoted_datatype_and_stream_parse_like_quoted(tmp_path: Path) -> None:
    bare = generate_nccl.profiler_plugin_228_dump(0)
    assert '"datatype": ncclFloat32' in bare and '"Stream": 0x7f3a5c001230' in bare
    fmt, rows = _collectives(tmp_path, "nccl_profile_4242424242_0.json", bare)
    assert fmt == "nccl_profiler"
    _, quoted = _collectives(tmp_path, "quoted_0.json", generate_nccl.profiler_plugin_228_dump(0, quoted=True))
    assert rows.equals(quoted)
    assert rows["collective"].to_list() == ["all_reduce", "send"]
    assert rows["message_bytes"][0] == 262144 * 4


def test_nil_stream_parses(tmp_path: Path) -> None:
    text = generate_nccl.profiler_plugin_228_dump(1)
    assert '"Stream": (nil)' in text
    _, rows = _collectives(tmp_path, "nccl_profile_4242424242_1.json", text)
    assert rows["collective"].to_list() == ["all_reduce", "recv"]


def test_send_and_recv_peers_land_in_dst_and_src(tmp_path: Path) -> None:
    _, send = _collectives(tmp_path, "r0.json", generate_nccl.profiler_plugin_228_dump(0))
    _, recv = _collectives(tmp_path, "r1.json", generate_nccl.profiler_plugin_228_dump(1))
    send_row = send.filter(pl.col("collective") == "send").row(0, named=True)
    recv_row = recv.filter(pl.col("collective") == "recv").row(0, named=True)
    assert (send_row["src_rank"], send_row["dst_rank"]) == (0, 1)
    assert (recv_row["src_rank"], recv_row["dst_rank"]) == (0, 1)
    assert send.filter(pl.col("collective") == "all_reduce")["dst_rank"].to_list() == [None]


def test_copy_engine_collectives_become_rows(tmp_path: Path) -> None:
    _, rows = _collectives(tmp_path, "ce_1.json", generate_nccl.profiler_plugin_ce_dump(1))
    ce = rows.filter(pl.col("collective") == "all_gather").row(0, named=True)
    assert rows.height == 2 and ce["rank"] == 1 and ce["dtype"] == "ncclBfloat16"
    assert ce["dur_ns"] == 37_000 and ce["cpu_dur_ns"] == 4_500
    assert ce["message_bytes"] == 1048576 * 2  # count x bf16: CE_COLL names no nRanks to scale by


def test_only_allow_listed_fields_may_be_bare(tmp_path: Path) -> None:
    text = generate_nccl.profiler_plugin_228_dump(0).replace('"Algorithm": "RING"', '"Algorithm": RING')
    line = next(n for n, s in enumerate(text.splitlines(), 1) if '"Algorithm": RING' in s)
    with pytest.raises(TraceFormatError, match=rf"r0\.json: not a JSON array.* at line {line}$"):
        _collectives(tmp_path, "r0.json", text)


def test_broken_file_names_its_line(tmp_path: Path) -> None:
    lines = generate_nccl.profiler_plugin_228_dump(0).splitlines()
    lines[5] = lines[5][:40]  # a line cut short, as by a crash mid-write
    with pytest.raises(TraceFormatError, match=r"cut\.json: .* at line (6|7)$"):
        _collectives(tmp_path, "cut.json", "\n".join(lines) + "\n")


@pytest.mark.parametrize("indent", [1, 2, 4])
def test_pretty_printed_inspector_equals_json_lines(tmp_path: Path, indent: int) -> None:
    fmt, pretty = _collectives(tmp_path, "pretty.log", generate_nccl.inspector_pretty(2, indent))
    assert fmt == "nccl_inspector"
    _, flat = _collectives(tmp_path, "flat.log", generate_nccl.inspector_lines(2))
    assert pretty.height == 17 and pretty.equals(flat)


def test_pretty_printed_inspector_is_detected_by_content(tmp_path: Path) -> None:
    path = tmp_path / "node-a-pid4102.log"
    path.write_text(generate_nccl.inspector_pretty(2), encoding="utf-8")
    assert detect(path).name == "nccl_inspector"


def _ingest(tmp_path: Path, name: str, text: str) -> tuple[ingest.TraceInfo, pl.DataFrame]:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    staging = tmp_path / f"{name}.staging"
    staging.mkdir()
    _, info = ingest.parse_into(path, staging, ingest.ParseOptions(source_name=name, trace_id="t"))
    return info, pl.read_parquet(staging / "collectives.parquet")


def test_a_record_cut_off_by_the_files_end_is_left_out_with_a_warning(tmp_path: Path) -> None:
    # a killed job leaves the record it was writing half written: the whole records before it are read
    text = generate_nccl.inspector_pretty(0)
    kept = text[: text.rindex("\n{") + 1]
    whole = kept.count('"header"')
    first = kept.count("\n") + 1
    info, rows = _ingest(tmp_path, "cut.log", kept + '{\n  "header": {\n')
    assert rows.height == whole > 0
    assert any(f"last record (from line {first}) is cut off" in w for w in info.warnings), info.warnings
    # the same for JSON lines: a last line without its end
    lines = generate_nccl.inspector_pretty(0).count('"header"')
    _, full = _ingest(tmp_path, "full.log", text)
    assert full.height == lines


def test_a_file_of_only_a_cut_record_is_refused_and_names_its_line(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match=r"cut\.log: a record is never closed.* at line 2$"):
        _collectives(tmp_path, "cut.log", '\n{\n  "header": {"id": 1}, "coll_perf": {\n')


def test_a_record_missing_its_brace_mid_file_is_refused(tmp_path: Path) -> None:
    text = generate_nccl.inspector_pretty(0)
    second = text.index("\n{", text.index("\n{") + 1) + 1  # the second record starts here
    end = text.index("\n}", second)  # its last closing brace
    broken = text[:end] + text[end + 2:]
    first = text.count("\n", 0, second) + 1
    with pytest.raises(TraceFormatError, match=rf"broken\.log: a record is never closed \(a missing '}}'\) at line {first}$"):
        _collectives(tmp_path, "broken.log", broken)


def test_broken_pretty_printed_inspector_record_names_its_first_line(tmp_path: Path) -> None:
    text = generate_nccl.inspector_pretty(0)
    second = text.index("\n{", text.index("\n{") + 1) + 1  # the second record
    broken = text[:second] + text[second:].replace('"coll_sn": 2,', '"coll_sn": 2 2,', 1)
    first = text.count("\n", 0, second) + 1
    expected = rf"broken\.log: a record spanning lines is not valid JSON .* at line {first}$"
    with pytest.raises(TraceFormatError, match=expected):
        _collectives(tmp_path, "broken.log", broken)
