"""Kineto traces are hashed while they are parsed (warehouse/staging.py, ``_LateId``).

The id must be the content hash computed on its own (docs/formats.md, "Trace ids"), a trace already
registered must come out ``duplicate`` with nothing left behind and the progress complete, and a
damaged file must fail as hashing names it.
"""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pytest

from tracelake import ingest
from tracelake.contracts.status import IngestStatus
from tracelake.ingest.detect import FORMATS
from tracelake.sample_traces.generate import SCENARIOS, write_trace
from tracelake.warehouse import Warehouse


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("late") / "rank0.json"
    write_trace(path, SCENARIOS["ddp_straggler"], 0, target_bytes=3_000_000)
    return path


def test_the_kineto_format_takes_its_id_late_and_others_do_not() -> None:
    late = {fmt.name for fmt in FORMATS if fmt.late_id}
    assert late == {"pytorch_profiler", "nccl_log"}


def test_the_id_is_the_content_hash(trace: Path, tmp_path: Path) -> None:
    wh = Warehouse(home=tmp_path / "wh")
    result = wh.ingest([trace], job="j").results[0]
    assert result.status == IngestStatus.INGESTED
    assert result.trace_id == ingest.content_id(trace)
    assert wh.query("select trace_id from host_ops limit 1").rows[0][0] == result.trace_id
    assert wh.query("select trace_id from devices limit 1").rows[0][0] == result.trace_id


def test_a_registered_trace_is_a_duplicate_with_progress_complete_and_no_staging_left(
        trace: Path, tmp_path: Path) -> None:
    wh = Warehouse(home=tmp_path / "wh")
    first = wh.ingest([trace], job="j").results[0]
    copy = tmp_path / "again.json.gz"  # the same content, compressed: the same trace
    with open(trace, "rb") as src, gzip.open(copy, "wb") as dst:
        shutil.copyfileobj(src, dst)
    seen: list[int] = []
    again = wh.ingest_file(copy, job="other", on_bytes=seen.append)
    assert again.status == IngestStatus.DUPLICATE
    assert (again.trace_id, again.job) == (first.trace_id, "j")
    assert sum(seen) == copy.stat().st_size
    assert wh.query("select count(*) from traces").rows[0][0] == 1
    staging = tmp_path / "wh" / "staging"
    assert not staging.exists() or not any(staging.iterdir())


def test_a_damaged_gzip_fails_as_hashing_names_it(trace: Path, tmp_path: Path) -> None:
    packed = tmp_path / "t.json.gz"
    with open(trace, "rb") as src, gzip.open(packed, "wb") as dst:
        shutil.copyfileobj(src, dst)
    data = bytearray(packed.read_bytes())
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(bytes(data[: len(data) // 2]))  # ends early
    with pytest.raises(Exception) as hashing:
        ingest.content_id(cut)
    result = Warehouse(home=tmp_path / "wh").ingest([cut], job="j").results[0]
    assert result.status == IngestStatus.FAILED
    assert result.error == str(hashing.value)


def test_an_nccl_log_is_hashed_while_parsed_and_found_again(tmp_path: Path) -> None:
    log = Path(__file__).resolve().parents[1] / "sample_traces" / "nccl" / "debug_log" / "train-4ranks.log"
    wh = Warehouse(home=tmp_path / "wh")
    first = wh.ingest([log], job="j").results[0]
    assert first.status == IngestStatus.INGESTED and first.trace_id == ingest.content_id(log)
    assert wh.query("select distinct trace_id from collectives").rows == [(first.trace_id,)]
    again = wh.ingest([log], job="other").results[0]
    assert (again.status, again.trace_id, again.job) == (IngestStatus.DUPLICATE, first.trace_id, "j")
