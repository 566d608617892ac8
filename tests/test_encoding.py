"""Parquet row groups encoded on a thread of their own (ingest/encoding.py)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tracelake.ingest.encoding import EncodingWriter

SCHEMA = pa.schema([("n", pa.int64()), ("text", pa.string())])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(0, 300), max_size=12), group=st.sampled_from([None, 7, 100]))
def test_the_file_is_the_one_pyarrow_writes_itself(sizes: list[int], group: int | None,
                                                   tmp_path_factory: pytest.TempPathFactory) -> None:
    """The same rows in the same order and row groups as a plain ``ParquetWriter`` given the same tables."""
    folder = tmp_path_factory.mktemp("encoding")
    tables, start = [], 0
    for size in sizes:
        tables.append(pa.table({"n": list(range(start, start + size)), "text": [f"t{i}" for i in range(size)]},
                               schema=SCHEMA))
        start += size
    with EncodingWriter(folder / "threaded.parquet", SCHEMA, compression="zstd") as writer:
        for table in tables:
            writer.write_table(table, row_group_size=group)
    with pq.ParquetWriter(folder / "plain.parquet", SCHEMA, compression="zstd") as plain:
        for table in tables:
            plain.write_table(table, row_group_size=group)
    threaded, reference = pq.ParquetFile(folder / "threaded.parquet"), pq.ParquetFile(folder / "plain.parquet")
    assert threaded.read().equals(reference.read())
    assert threaded.read().column("n").to_pylist() == list(range(start))
    assert [threaded.metadata.row_group(i).num_rows for i in range(threaded.metadata.num_row_groups)] == \
        [reference.metadata.row_group(i).num_rows for i in range(reference.metadata.num_row_groups)]


def test_a_failed_write_is_raised_and_the_file_closed(tmp_path: Path) -> None:
    writer = EncodingWriter(tmp_path / "bad.parquet", SCHEMA)
    writer.write_table(pa.table({"n": [1]}, schema=pa.schema([("n", pa.int64())])))  # not the file's schema
    with pytest.raises(ValueError, match="schema"):
        writer.close()
    writer.close()  # once closed, closing again does nothing
    with pytest.raises(ValueError, match="closed"):
        writer.write_table(pa.table({"n": [1], "text": ["a"]}, schema=SCHEMA))


def test_one_row_group_is_encoded_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write waits for the one before it: never two groups in the encoder at once, so memory holds one group
    being encoded beside the one the caller prepares; each is encoded off the caller's thread."""
    inside, most, done, threads = 0, 0, 0, set()
    lock = threading.Lock()
    original = pq.ParquetWriter.write_table

    def counted(self: pq.ParquetWriter, table: pa.Table, row_group_size: int | None = None) -> None:
        nonlocal inside, most, done
        with lock:
            inside += 1
            most = max(most, inside)
        threads.add(threading.get_ident())
        try:
            time.sleep(0.005)  # slower than the caller: without the wait, writes would pile up in the queue
            original(self, table, row_group_size=row_group_size)
        finally:
            with lock:
                inside -= 1
                done += 1

    monkeypatch.setattr(pq.ParquetWriter, "write_table", counted)
    with EncodingWriter(tmp_path / "one.parquet", SCHEMA) as writer:
        for call, start in enumerate(range(0, 20_000, 1000), start=1):
            writer.write_table(pa.table({"n": list(range(start, start + 1000)), "text": ["x"] * 1000}, schema=SCHEMA))
            assert done >= call - 1  # every write before this one is written
    assert most == 1
    assert threading.get_ident() not in threads
    assert pq.read_table(tmp_path / "one.parquet").num_rows == 20_000
