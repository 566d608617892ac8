"""The registry of traces (every ``traces`` row) in memory, refreshed cheaply from the file system.

Listing traces or jobs through the DuckDB views reads the footer of every
Parquet file of every table; a server answering such requests on a warehouse of
thousands of traces must not. A trace's ``traces`` file is written once and only
ever removed, and a job folder's modification time changes whenever a file is
added to it or removed from it, so a refresh stats the job folders and reads
again only the folders that changed (each in one polars scan).
"""

from __future__ import annotations

import datetime as dt
import os
import threading
from pathlib import Path

import polars as pl

from . import schema
from .store import SCHEMA_JOB, Store


class Registry:
    """Every registered trace's ``traces`` row, with its ``job``; thread-safe."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._folders: dict[str, int] = {}  # job -> folder mtime_ns when last read
        self._jobs: dict[str, pl.DataFrame] = {}  # job -> its traces rows
        self._frame: pl.DataFrame | None = None

    def frame(self) -> pl.DataFrame:
        """Every ``traces`` row (in the declared schema, ``job`` second), as of now."""
        with self._lock:
            if self._refresh() or self._frame is None:
                self._frame = self._build()
            return self._frame

    def _refresh(self) -> bool:
        seen: dict[str, int] = {}
        changed = False
        with os.scandir(self.store.tables / "traces") as entries:
            for entry in entries:
                if not entry.is_dir() or not entry.name.startswith("job=") or entry.name == f"job={SCHEMA_JOB}":
                    continue
                job = entry.name[4:]
                try:
                    mtime = entry.stat().st_mtime_ns
                except FileNotFoundError:  # removed meanwhile
                    continue
                seen[job] = mtime
                if self._folders.get(job) != mtime:
                    self._jobs[job] = self._read_job(job, Path(entry.path))
                    changed = True
        for job in set(self._folders) - set(seen):
            self._jobs.pop(job, None)
            changed = True
        self._folders = seen
        return changed

    def _read_job(self, job: str, folder: Path) -> pl.DataFrame:
        for _ in range(10):
            ids = [p.stem for p in folder.glob("*.parquet")]
            try:
                frame = self.store.read_frame("traces", [(job, i) for i in ids])
            except FileNotFoundError:  # a trace deleted between the listing and the read: list again
                continue
            return frame.with_columns(pl.lit(job, pl.String).alias("job"))
        raise OSError(f"the traces of job {job} keep changing while being read")

    def _build(self) -> pl.DataFrame:
        declared = [c for c in schema.TRACES.column_names if c != "trace_id"]
        frames = list(self._jobs.values()) or [
            self.store.read_frame("traces", []).with_columns(pl.lit(None, pl.String).alias("job"))
        ]
        return pl.concat(frames, how="vertical").select("trace_id", "job", *declared)


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
