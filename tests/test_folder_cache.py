"""FolderCache (warehouse/folder_cache.py): rows of every trace per job folder, in memory and in a snapshot file."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from support import SAMPLES
from tracelake.warehouse import Warehouse
from tracelake.warehouse.folder_cache import FolderCache
from tracelake.warehouse.store import Store

COLUMNS = ["trace_id", "rank", "step", "span_ns", "idle_ns"]
WHOLE = pl.col("step").is_null()


def _direct(wh: Warehouse) -> pl.DataFrame:
    """The whole-trace breakdown rows of every registered trace, read file by file (the reference)."""
    traces = wh.registry.frame()
    frame = wh.store.read_frame("breakdown", list(zip(traces["job"], traces["trace_id"])), columns=COLUMNS)
    jobs = traces.select("trace_id", "job")
    return frame.filter(WHOLE).join(jobs, on="trace_id").sort("trace_id", "rank")


def _cache(wh: Warehouse, name: str | None = "test") -> FolderCache:
    return FolderCache(wh.store, "breakdown", columns=COLUMNS, where=WHOLE, name=name)


class _CountingStore(Store):
    """A store that counts the files its scans open."""

    def __init__(self, home: Path) -> None:
        super().__init__(home)
        self.files_read = 0

    def read_frame(self, table, traces, columns=None, file_paths=None):  # type: ignore[no-untyped-def]
        pairs = list(traces)
        self.files_read += len(pairs)
        return super().read_frame(table, pairs, columns=columns, file_paths=file_paths)


def test_rows_follow_ingests_and_deletes(warehouse: Warehouse) -> None:
    cache = _cache(warehouse, name=None)
    assert cache.frame().is_empty() and "job" in cache.frame().columns
    warehouse.ingest([SAMPLES / "ddp_straggler"], job="ddp")
    assert cache.frame().sort("trace_id", "rank").equals(_direct(warehouse))
    report = warehouse.ingest([SAMPLES / "launch_bound"], job="launch")
    assert cache.frame().sort("trace_id", "rank").equals(_direct(warehouse))
    warehouse.delete(report.results[0].trace_id or "")
    assert set(cache.frame()["job"].to_list()) == {"ddp"}
    first = cache.frame()
    assert cache.frame() is first  # nothing changed: the same frame, nothing read


def test_a_fresh_process_reads_the_snapshot_and_only_changed_folders(warehouse: Warehouse) -> None:
    warehouse.ingest([SAMPLES / "ddp_straggler"], job="ddp")
    warehouse.ingest([SAMPLES / "launch_bound"], job="launch")
    _cache(warehouse).frame()
    snapshot = warehouse.home / "cache" / "test.parquet"
    assert snapshot.exists()

    store = _CountingStore(warehouse.home)
    fresh = FolderCache(store, "breakdown", columns=COLUMNS, where=WHOLE, name="test")
    assert fresh.frame().sort("trace_id", "rank").equals(_direct(warehouse))
    assert store.files_read == 0  # everything came from the snapshot

    warehouse.ingest([SAMPLES.parent / "xla" / "tpu_allreduce"], job="tpu")
    store = _CountingStore(warehouse.home)
    fresh = FolderCache(store, "breakdown", columns=COLUMNS, where=WHOLE, name="test")
    assert fresh.frame().sort("trace_id", "rank").equals(_direct(warehouse))
    assert store.files_read == 1  # only the new job's folder


@pytest.mark.parametrize("damage", ["garbage", "other key"])
def test_a_damaged_or_foreign_snapshot_is_ignored(warehouse: Warehouse, damage: str) -> None:
    warehouse.ingest([SAMPLES / "launch_bound"], job="launch")
    snapshot = warehouse.home / "cache" / "test.parquet"
    if damage == "garbage":
        snapshot.parent.mkdir(parents=True, exist_ok=True)
        snapshot.write_bytes(b"not parquet")
    else:  # written for other columns
        FolderCache(warehouse.store, "breakdown", columns=["trace_id", "rank", "step"], name="test").frame()
    assert _cache(warehouse).frame().sort("trace_id", "rank").equals(_direct(warehouse))


def test_registry_matches_the_traces_files(warehouse: Warehouse) -> None:
    warehouse.ingest([SAMPLES / "ddp_straggler"], job="ddp", labels={"team": "infra"})
    warehouse.registry.frame()  # writes the snapshot
    fresh = Warehouse(warehouse.home).registry.frame()  # a new process: from the snapshot
    direct = warehouse.store.read_frame("traces", [("ddp", t) for t in warehouse.store.job_traces("ddp")])
    assert fresh.columns[:2] == ["trace_id", "job"]
    assert fresh.drop("job").select(direct.columns).sort("trace_id").equals(direct.sort("trace_id"))


def test_a_read_only_cache_folder_keeps_working(warehouse: Warehouse) -> None:
    warehouse.ingest([SAMPLES / "launch_bound"], job="launch")
    (warehouse.home / "cache").mkdir(exist_ok=True)
    (warehouse.home / "cache" / "test.parquet").mkdir()  # cannot be replaced by a file
    assert _cache(warehouse).frame().sort("trace_id", "rank").equals(_direct(warehouse))


def test_only_the_folders_asked_for_are_read(warehouse: Warehouse) -> None:
    warehouse.ingest([SAMPLES / "ddp_straggler"], job="ddp")
    warehouse.ingest([SAMPLES / "launch_bound"], job="launch")
    store = _CountingStore(warehouse.home)
    cache = FolderCache(store, "breakdown", columns=COLUMNS, where=WHOLE, name=None)
    assert set(cache.frame(["launch"])["job"].to_list()) == {"launch"}
    assert store.files_read == 1
    assert cache.frame(["launch", "nope"]).height == cache.frame(["launch"]).height
    assert store.files_read == 1  # unchanged: not read again
    assert cache.frame().sort("trace_id", "rank").equals(_direct(warehouse))
    assert store.files_read == 1 + 4  # the other job's four traces, once asked for


def test_an_ingest_leaves_the_snapshots_current(warehouse: Warehouse) -> None:
    """A new process after `tracelake ingest` reads the snapshots, not one file per trace."""
    report = warehouse.ingest([SAMPLES / "ddp_straggler"], job="ddp")
    assert report.ok
    cache = warehouse.home / "cache"
    registry = pl.read_parquet(cache / "traces.parquet")
    assert sorted(registry["trace_id"].to_list()) == sorted(r.trace_id for r in report.results)
    breakdown = pl.read_parquet(cache / "fleet-breakdown.parquet")
    assert set(breakdown["trace_id"].to_list()) == set(registry["trace_id"].to_list())
    # a fresh warehouse object reads no traces or breakdown files (the collectives once, for their summaries)
    fresh = Warehouse(warehouse.home)
    reads = []
    original = fresh.store.read_frame
    fresh.store.read_frame = lambda *a, **k: reads.append(a[0]) or original(*a, **k)  # type: ignore[method-assign]
    fresh.fleet()
    assert "traces" not in reads and "breakdown" not in reads and reads.count("collectives") == 1
    summaries = pl.read_parquet(cache / "fleet-collectives.parquet")
    assert summaries["job"].to_list() == ["ddp"] and len(summaries["trace_ids"][0]) == 4
    reads.clear()
    fresh.fleet()
    assert not {"traces", "breakdown", "collectives"} & set(reads)
