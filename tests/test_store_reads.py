"""The stored tables' readers (warehouse/store.py: ``read_frame``, ``aggregate``) read each file through one open
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
from tracelake.warehouse import store as store_module
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


def _positions(scan: pl.LazyFrame) -> pl.LazyFrame:
    return scan.group_by("trace_id").agg(pl.col("position").sort())


def test_an_aggregate_reads_files_replaced_or_removed_after_they_were_opened_whole(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    pairs = [("j", "a1"), ("j", "b2")]
    first = _write(store, "j", "a1", _rows("a1", 5))
    second = _write(store, "j", "b2", _rows("b2", 3))
    real_scan = pl.scan_parquet

    def scan_then_swap(*args: object, **kwargs: object) -> pl.LazyFrame:
        planned = real_scan(*args, **kwargs)  # type: ignore[arg-type]
        if second.exists():  # lands after the files were opened, before the rows are read
            _replace(first, _rows("a1", 40_000, first=100))  # a bigger file under the same name
            second.unlink()
        return planned

    monkeypatch.setattr(pl, "scan_parquet", scan_then_swap)
    got = store.aggregate(TABLE, pairs, _positions)
    assert got is not None
    assert dict(got.iter_rows()) == {"a1": list(range(5)), "b2": list(range(3))}
    # read again now: the new file, and none for the removed one
    now = store.aggregate(TABLE, pairs, _positions)
    assert now is not None and now.height == 1 and len(now.row(0)[1]) == 40_000
    assert store.aggregate(TABLE, [("j", "b2")], _positions) is None


def test_reads_hold_a_bounded_number_of_files_open(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """However many traces a read spans, it holds at most ``OPEN_AT_ONCE`` files open (counted in the kernel's own
    table of this process's descriptors), and the rows are all there."""
    monkeypatch.setattr(store_module, "OPEN_AT_ONCE", 3)
    pairs = [("j", f"{i:x}0") for i in range(8)]
    for i, (job, trace_id) in enumerate(pairs):
        _write(store, job, trace_id, _rows(trace_id, i + 1))
    parquet_open: list[int] = []
    real_scan = pl.scan_parquet

    def counting_scan(*args: object, **kwargs: object) -> pl.LazyFrame:
        held = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
                if _is_link(f"/proc/self/fd/{fd}")]
        parquet_open.append(sum(1 for target in held if target.endswith(".parquet")))
        return real_scan(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(pl, "scan_parquet", counting_scan)
    frame = store.read_frame(TABLE, pairs, columns=["trace_id"], file_paths="path")
    got = store.aggregate(TABLE, pairs, _positions)
    assert frame.height == sum(range(1, 9)) and got is not None and got.height == 8
    assert frame["path"].to_list() == [str(store.path(TABLE, j, t)) for i, (j, t) in enumerate(pairs)
                                       for _ in range(i + 1)]
    if Path("/proc/self/fd").is_dir():
        assert parquet_open == [3, 3, 2] * 2


def _is_link(path: str) -> bool:
    try:
        os.readlink(path)
    except OSError:
        return False
    return True


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
    assert store.aggregate(TABLE, [("j", "gone")], _positions) is None
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
