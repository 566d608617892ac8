"""The stored tables' readers (warehouse/store.py: ``read_frame``, ``scan``) read each file through one open
descriptor: a file replaced (``os.replace``) or removed while it is read is read whole, as it was when opened.

A job's analysis replaces each trace's ``critical_path`` file while other requests read the job's files; a
reader that opened the file by its path twice (footer, then rows) once took a new file's rows with an old
footer, and polars panicked (a 500 under concurrent uploads).
"""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracelake.contracts import schema
from tracelake.warehouse.store import Store

TABLE = "critical_path"


def _rows(trace_id: str, count: int, first: int = 0) -> pa.Table:
    """``count`` rows of ``trace_id`` whose ``position`` runs from ``first``."""
    arrow = schema.table(TABLE).arrow_schema
    columns = {field.name: pa.nulls(count, field.type) for field in arrow}
    columns["trace_id"] = pa.array([trace_id] * count, pa.string())
    columns["position"] = pa.array(range(first, first + count), pa.int32())
    return pa.table(columns, schema=arrow)


def _write(store: Store, job: str, trace_id: str, table: pa.Table) -> Path:
    target = store.path(TABLE, job, trace_id)
    target.parent.mkdir(parents=True, exist_ok=True)
    Store.write_atomic(table, target)
    return target


def _replace(target: Path, table: pa.Table) -> None:
    """Swap ``target`` for a file holding ``table``, as the analysis does (a rename over it)."""
    scratch = target.with_name(f".{target.name}.swap.tmp")
    pq.write_table(table, scratch, compression="zstd")
    os.replace(scratch, target)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    made = Store(tmp_path / "home")
    made.initialise()
    return made


def test_a_lazy_scan_reads_the_files_as_they_were_when_it_was_made(store: Store) -> None:
    pairs = [("j", "a1"), ("j", "b2")]
    first = _write(store, "j", "a1", _rows("a1", 5))
    second = _write(store, "j", "b2", _rows("b2", 3))
    scan = store.scan(TABLE, pairs)
    assert scan is not None
    _replace(first, _rows("a1", 40_000, first=100))  # a bigger file under the same name
    second.unlink()
    got = scan.select("trace_id", "position").collect()
    assert got.rows() == [("a1", p) for p in range(5)] + [("b2", p) for p in range(3)]
    # A scan made now sees the new file and no removed one.
    now = store.scan(TABLE, pairs)
    assert now is not None
    assert now.select(pl.len()).collect().item() == 40_000


def test_read_frame_reads_files_replaced_between_its_plan_and_its_read_whole(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    pairs = [("j", "a1"), ("j", "b2")]
    first = _write(store, "j", "a1", _rows("a1", 4))
    _write(store, "j", "b2", _rows("b2", 2))
    real_scan = pl.scan_parquet

    def scan_then_replace(*args: object, **kwargs: object) -> pl.LazyFrame:
        planned = real_scan(*args, **kwargs)  # type: ignore[arg-type]
        _replace(first, _rows("a1", 9, first=50))  # lands after the plan, before the rows are read
        return planned

    monkeypatch.setattr(pl, "scan_parquet", scan_then_replace)
    got = store.read_frame(TABLE, pairs, columns=["trace_id", "position"], file_paths="path")
    assert got["position"].to_list() == [0, 1, 2, 3, 0, 1]
    assert got["path"].to_list() == [str(first)] * 4 + [str(store.path(TABLE, "j", "b2"))] * 2


def test_files_missing_or_removed_before_the_read_are_skipped(store: Store) -> None:
    _write(store, "j", "a1", _rows("a1", 2))
    got = store.read_frame(TABLE, [("j", "gone"), ("j", "a1")], columns=["trace_id"], file_paths="path")
    assert got["trace_id"].to_list() == ["a1", "a1"]
    assert store.scan(TABLE, [("j", "gone")]) is None
    empty = store.read_frame(TABLE, [("j", "gone")], columns=["trace_id"], file_paths="path")
    assert empty.columns == ["trace_id", "path"] and empty.height == 0


@settings(max_examples=30, deadline=None)
@given(counts=st.lists(st.integers(0, 70), min_size=1, max_size=6))
def test_each_row_names_the_file_it_came_from(tmp_path_factory: pytest.TempPathFactory, counts: list[int]) -> None:
    store = Store(tmp_path_factory.mktemp("paths") / "home")
    store.initialise()
    pairs = [(f"j{i % 2}", f"{i:x}0") for i in range(len(counts))]
    for (job, trace_id), count in zip(pairs, counts):
        _write(store, job, trace_id, _rows(trace_id, count))
    got = store.read_frame(TABLE, pairs, columns=["trace_id"], file_paths="path")
    assert got.height == sum(counts)
    # Independent of the row counts: each row's file is named after the trace its own column holds.
    for trace_id, path in got.iter_rows():
        job = next(j for j, t in pairs if t == trace_id)
        assert path == str(store.path(TABLE, job, trace_id))
    assert got["trace_id"].to_list() == [t for (_, t), n in zip(pairs, counts) for _ in range(n)]
