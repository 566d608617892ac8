"""The registry of traces (every ``traces`` row) in memory, refreshed cheaply from the file system.

Listing traces or jobs through the DuckDB views reads the footer of every
Parquet file of every table; a server answering such requests on a warehouse of
thousands of traces must not. A trace's ``traces`` file is written once and only
ever removed, and a job folder's modification time changes whenever a file is
added to it or removed from it, so a refresh stats the job folders and reads
again only the folders that changed, in one polars scan (:mod:`.folder_cache`).
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Collection

from tracelake.contracts import schema
from tracelake.contracts.lazy import polars as pl

from .folder_cache import FolderCache
from .store import Store


class Registry:
    """Every registered trace's ``traces`` row, with its ``job``; thread-safe.

    The rows are kept per job folder and snapshotted under ``cache/`` (:class:`FolderCache`),
    so a fresh process lists thousands of traces without reading thousands of files.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self._cache = FolderCache(store, "traces", name="traces")
        self._lock = threading.Lock()
        self._source: pl.DataFrame | None = None
        self._frame: pl.DataFrame | None = None

    def frame(self) -> pl.DataFrame:
        """Every ``traces`` row (in the declared schema, ``job`` second), as of now."""
        rows = self._cache.frame()
        with self._lock:
            if self._frame is None or rows is not self._source:
                declared = [c for c in schema.TRACES.column_names if c != "trace_id"]
                self._frame = rows.select("trace_id", "job", *declared)
                self._source = rows
            return self._frame

    def refresh(self, jobs: Collection[str]) -> None:
        """Read again the folders of ``jobs`` that changed (and update the snapshot), not the others."""
        self._cache.frame(jobs)


def select_traces(
    frame: pl.DataFrame,
    *,
    job: str | None = None,
    labels: dict[str, str] | None = None,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
) -> pl.DataFrame:
    """The ``traces`` rows of one job, with all ``labels``, ingested in ``[since, until)``, newest first.

    Naive datetimes are taken as UTC.
    """
    if job is not None:
        frame = frame.filter(pl.col("job") == job)
    if since is not None:
        frame = frame.filter(pl.col("ingested_at") >= _utc(since))
    if until is not None:
        frame = frame.filter(pl.col("ingested_at") < _utc(until))
    if labels:
        wanted = labels.items()
        keep = [all((row or {}).get(k) == v for k, v in wanted) for row in frame["labels"].to_list()]
        frame = frame.filter(pl.Series(keep, dtype=pl.Boolean))
    return frame.sort(["ingested_at", "job", "rank", "trace_id"], descending=[True, False, False, False],
                      nulls_last=True)


def job_summaries(frame: pl.DataFrame) -> pl.DataFrame:
    """One row per job of ``traces`` rows: traces, ranks, formats, bytes, time span; most recently ingested first."""
    summary = frame.group_by("job").agg(
        pl.len().alias("traces"),
        pl.col("rank").drop_nulls().n_unique().alias("ranks"),
        pl.col("format").unique().sort().alias("formats"),
        pl.col("source_bytes").sum(),
        pl.col("device_op_count").sum().alias("device_ops"),
        pl.col("start_ns").min(),
        pl.col("end_ns").max(),
        pl.col("ingested_at").min().alias("first_ingested_at"),
        pl.col("ingested_at").max().alias("last_ingested_at"),
    )
    return summary.sort(["last_ingested_at", "job"], descending=[True, False], nulls_last=True)


def _utc(moment: dt.datetime) -> dt.datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=dt.timezone.utc)
