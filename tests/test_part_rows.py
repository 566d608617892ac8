"""The parts' rows as a final table's batches, read by Arrow for the merges (``ingest/part_rows``).

The hash join that takes over where a merge cannot reads the same parts through DuckDB, by the SQL the same
declaration gives. Both must make the same rows: checked against DuckDB's own casts on generated parts (nulls,
lists, texts, times shifted), and on values that fit neither.
"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tracelake.contracts import schema
from tracelake.ingest import kineto_sql_tables
from tracelake.ingest.part_rows import PartColumns, UnfitValue
from tracelake.warehouse import Warehouse

DEVICE = schema.table("device_ops")
#: The device ops' parts as the scanners write them (``ingest/kineto_sql_events.DEVICE_PART``).
PART_SCHEMA = pa.schema([("event_id", pa.int64()), ("name", pa.string()), ("kind", pa.string()),
                         ("device", pa.int32()), ("stream", pa.int64()), ("ts_ns", pa.int64()),
                         ("dur_ns", pa.int64()), ("correlation", pa.int64()), ("external_id", pa.int64()),
                         ("bytes", pa.int64()), ("grid", pa.list_(pa.int32())), ("block", pa.list_(pa.int32())),
                         ("regs", pa.int64()), ("smem", pa.int64()), ("occupancy", pa.float64()),
                         ("graph_id", pa.int64())])
SOURCES = kineto_sql_tables.PART_SOURCES["device_ops"]

small = st.none() | st.integers(-(2**31), 2**31 - 1)
big = st.none() | st.integers(-(2**62), 2**62)
dims = st.none() | st.lists(st.integers(0, 2**31 - 1), max_size=3)
row = st.fixed_dictionaries({
    "name": st.none() | st.text(max_size=12), "kind": st.none() | st.sampled_from(["kernel", "memcpy"]),
    "device": small, "stream": big, "ts_ns": st.none() | st.integers(0, 2**61), "dur_ns": big, "correlation": big,
    "external_id": big, "bytes": big, "grid": dims, "block": dims, "regs": small, "smem": big,
    "occupancy": st.none() | st.floats(allow_nan=False), "graph_id": big,
})


def write_parts(folder: Path, parts: list[list[dict[str, object]]]) -> list[Path]:
    files = []
    first = 0
    for n, rows in enumerate(parts):
        table = pa.Table.from_pylist([{"event_id": first + i, **r} for i, r in enumerate(rows)], schema=PART_SCHEMA)
        first += len(rows)
        pq.write_table(table, path := folder / f"device-{n:06d}.parquet")
        files.append(path)
    return files


def through_duckdb(columns: PartColumns, files: list[Path]) -> pa.Table:
    relation = "read_parquet([" + ", ".join(schema.sql_literal(str(f)) for f in files) + "])"
    con = duckdb.connect(config={"preserve_insertion_order": True})
    return con.sql(f"SELECT {schema.select_list(columns.table, columns.sql())} FROM {relation}").to_arrow_table()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(st.lists(row, max_size=20), min_size=1, max_size=4), base=st.integers(0, 2**60),
       rank=st.integers(0, 4096), trace_id=st.text(min_size=1, max_size=8))
def test_the_parts_read_by_arrow_are_the_rows_duckdb_reads_by_the_same_declaration(
    parts: list[list[dict[str, object]]], base: int, rank: int, trace_id: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    files = write_parts(tmp_path_factory.mktemp("parts"), parts)
    columns = PartColumns(DEVICE, SOURCES, {"trace_id": trace_id, "rank": rank}, frozenset({"ts_ns"}), base)
    got = pa.Table.from_batches(list(columns.batches(files)), schema=DEVICE.arrow_schema)
    want = through_duckdb(columns, files)
    assert got.num_rows == want.num_rows == sum(len(p) for p in parts)
    for name in DEVICE.column_names:
        assert got.column(name).to_pylist() == want.column(name).to_pylist(), name
    written = [r for p in parts for r in p]  # and against the rows as written, for the shift and the constants
    assert got.column("ts_ns").to_pylist() == [None if r["ts_ns"] is None else r["ts_ns"] + base for r in written]
    assert set(got.column("rank").to_pylist()) <= {rank} and set(got.column("trace_id").to_pylist()) <= {trace_id}
    assert got.column("category").null_count == got.num_rows  # the facts' columns: the merge fills them


@pytest.mark.parametrize(("column", "value", "base"), [("regs", 2**40, 0), ("ts_ns", 2**62, 2**62)])
def test_a_value_that_fits_no_column_is_refused_by_both_readers(column: str, value: int, base: int,
                                                                tmp_path: Path) -> None:
    files = write_parts(tmp_path, [[{name: None for name in PART_SCHEMA.names[1:]} | {column: value}]])
    columns = PartColumns(DEVICE, SOURCES, {"trace_id": "t", "rank": 0}, frozenset({"ts_ns"}), base)
    with pytest.raises(UnfitValue) as refused:
        list(columns.batches(files))
    assert str(refused.value).startswith(f"device_ops.{'registers_per_thread' if column == 'regs' else 'ts_ns'}")
    with pytest.raises(duckdb.Error):
        through_duckdb(columns, files)


def test_a_column_the_table_lacks_is_refused_when_declared() -> None:
    with pytest.raises(KeyError, match="no_such"):
        PartColumns(DEVICE, {"no_such": "name"})


def test_a_trace_whose_kernel_registers_fit_no_column_fails_by_name_and_the_store_keeps_working(
    tmp_path: Path,
) -> None:
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 50,
         "args": {"External id": 1}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 20, "dur": 5,
         "args": {"correlation": 7, "External id": 1}},
        {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 30, "dur": 10,
         "args": {"correlation": 7, "device": 0, "stream": 7, "registers per thread": 2**40}},
    ]
    bad, good = tmp_path / "bad.json", tmp_path / "good.json"
    bad.write_text(json.dumps({"traceEvents": events}))
    events[2]["args"]["registers per thread"] = 96  # type: ignore[index]
    good.write_text(json.dumps({"traceEvents": events}))
    warehouse = Warehouse(tmp_path / "home")
    report = warehouse.ingest([bad, good], job="j")
    assert [r.ok for r in report.results] == [False, True]
    message = report.results[0].error or ""
    assert "bad.json" in message and "registers_per_thread" in message and str(2**40) in message, message
    assert "Traceback" not in message
    assert warehouse.query("SELECT registers_per_thread FROM device_ops").rows == [(96,)]
    assert warehouse.query("SELECT count(*) FROM traces").rows == [(1,)]  # nothing of the bad one written
