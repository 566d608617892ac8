"""A stored table's rows for every trace, kept in memory and in a snapshot file, refreshed per job folder.

A warehouse of thousands of traces holds thousands of small files per table, and
reading one costs about half a millisecond however small it is, so reading a table
for every trace takes seconds. A job folder's modification time changes whenever a
file is added to it, removed from it or renamed over (every write of tracelake is a
rename), so rows read from a folder stay valid while its time does. :class:`FolderCache`
keeps each job's rows with the time its folder had when they were read; a refresh
stats the job folders and reads again, in one scan, only those that changed.

The rows are also written to ``$TRACELAKE_HOME/cache/<name>.parquet`` (the folder
times in its metadata), so a fresh process (a CLI command, a restarted server) reads
one file and the changed folders instead of every file. The snapshot is only a cache:
it is replaced atomically, ignored when unreadable or written by another schema, and
may be deleted at any time.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
from collections.abc import Callable, Collection
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tracelake.contracts import schema
from tracelake.contracts.errors import WarehouseError
from tracelake.contracts.lazy import polars as pl

from .store import SCHEMA_JOB, Store

log = logging.getLogger(__name__)

_META = b"tracelake.folder_cache"


class FolderCache:
    """The rows of ``table`` (``columns`` of them, those matching ``where``) of every job, with ``job``; thread-safe.

    Args:
        store: The warehouse's files.
        table: A declared table.
        columns: The columns to keep (default: all).
        where: Keep only the rows this is true for (e.g. ``pl.col("step").is_null()``).
        summarise: Keep this of the rows instead of the rows: a pure function of rows with ``job``
            that summarises each job on its own, returning rows with ``job`` (what is kept then stays small).
        version: Changes when ``summarise`` changes what it returns (older snapshots are then ignored).
        name: The snapshot's name under ``cache/``; None keeps the rows in memory only.
    """

    def __init__(self, store: Store, table: str, *, columns: list[str] | None = None, where: pl.Expr | None = None,
                 summarise: Callable[[pl.DataFrame], pl.DataFrame] | None = None, version: int = 0,
                 name: str | None = None) -> None:
        self.store = store
        self.table = table
        self.columns = columns
        self.where = where
        self.summarise = summarise
        self.snapshot = store.home / "cache" / f"{name}.parquet" if name else None
        self._lock = threading.Lock()
        self._folders: dict[str, int] = {}  # job -> folder mtime_ns when its rows were read
        self._jobs: dict[str, pl.DataFrame] = {}
        self._frame: pl.DataFrame | None = None
        self._loaded = False
        #: Identifies what a snapshot holds, so that one written for other columns or another schema is not used.
        self._key = json.dumps({"schema": schema.SCHEMA_VERSION, "table": table, "columns": columns,
                                "where": str(where) if where is not None else None,
                                "summarise": f"{summarise.__module__}.{summarise.__qualname__}" if summarise else None,
                                "version": version})

    def frame(self, jobs: Collection[str] | None = None) -> pl.DataFrame:
        """The rows of ``jobs`` (default: every job) as of now: the selected columns, then ``job``.

        Only the folders of ``jobs`` are read when they changed; the others wait until asked for.
        """
        with self._lock:
            if not self._loaded:
                self._load_snapshot()
                self._loaded = True
            changed = self._refresh(None if jobs is None else set(jobs))
            if changed:
                self._frame = None
                if self.snapshot is not None:
                    self._save_snapshot()
            if jobs is not None:
                return self._build([job for job in jobs if job in self._jobs])
            if self._frame is None:
                self._frame = self._build()
            return self._frame

    # -- refresh ------------------------------------------------------------------------
    def _refresh(self, wanted: set[str] | None) -> bool:
        seen: dict[str, int] = {}
        stale: dict[str, Path] = {}
        folder = self.store.tables / self.table
        with os.scandir(folder) as entries:
            for entry in entries:
                if not entry.is_dir() or not entry.name.startswith("job=") or entry.name == f"job={SCHEMA_JOB}":
                    continue
                job = entry.name[4:]
                try:
                    mtime = entry.stat().st_mtime_ns
                except FileNotFoundError:  # removed meanwhile
                    continue
                seen[job] = mtime
                if (self._folders.get(job) != mtime or job not in self._jobs) and (wanted is None or job in wanted):
                    stale[job] = Path(entry.path)
        if stale:
            self._jobs.update(self._read(stale))
            self._folders.update({job: seen[job] for job in stale})
        gone = set(self._jobs) - set(seen)
        for job in gone:
            self._jobs.pop(job, None)
            self._folders.pop(job, None)
        return bool(stale or gone)

    def _read(self, folders: dict[str, Path]) -> dict[str, pl.DataFrame]:
        """The rows of several job folders, read in one scan."""
        for _ in range(10):
            pairs = [(job, p.stem) for job, folder in folders.items() for p in folder.glob("*.parquet")]
            try:
                frame = self.store.read_frame(self.table, pairs, columns=self.columns, file_paths="_path")
            except FileNotFoundError:  # a trace deleted between the listing and the read: list again
                continue
            except (pl.exceptions.PolarsError, pa.ArrowException) as exc:
                raise WarehouseError(
                    f"the {self.table} files of job(s) {', '.join(sorted(folders))} cannot be read "
                    f"({str(exc).strip().splitlines()[0]}): a file was changed outside tracelake; "
                    "`tracelake check --repair` moves it aside") from None
            if self.where is not None:
                frame = frame.filter(self.where)
            frame = frame.with_columns(
                pl.col("_path").str.extract(r"job=([^/\\]+)[/\\][^/\\]+$").alias("job")).drop("_path")
            if self.summarise is not None:  # all the jobs at once: it keeps jobs apart, and one call is cheaper
                frame = self.summarise(frame)
            jobs = {job: frame.head(0) for job in folders}
            jobs.update({str(key[0]): part for key, part in frame.partition_by("job", as_dict=True).items()})
            return jobs
        raise OSError(f"the {self.table} files of {len(folders)} job(s) keep changing while being read")

    def _build(self, jobs: list[str] | None = None) -> pl.DataFrame:
        frames = list(self._jobs.values()) if jobs is None else [self._jobs[job] for job in jobs]
        if frames:
            return pl.concat(frames, how="vertical")
        empty = self.store.read_frame(self.table, [], columns=self.columns)
        empty = empty.with_columns(pl.lit(None, pl.String).alias("job"))
        return self.summarise(empty) if self.summarise is not None else empty

    # -- snapshot -----------------------------------------------------------------------
    def _load_snapshot(self) -> None:
        if self.snapshot is None or not self.snapshot.exists():
            return
        try:
            table = pq.read_table(self.snapshot)
            meta = json.loads((table.schema.metadata or {})[_META])
            if meta["key"] != self._key:
                return
            frame = pl.from_arrow(table)
            assert isinstance(frame, pl.DataFrame)
            folders = {str(job): int(mtime) for job, mtime in meta["folders"].items()}
        except (OSError, KeyError, ValueError, TypeError, pa.ArrowException) as exc:
            log.debug("ignoring the cache %s: %s", self.snapshot, exc)
            return
        jobs = {job: frame.head(0) for job in folders}
        if frame.height:
            jobs.update({str(key[0]): part for key, part in frame.partition_by("job", as_dict=True).items()})
        self._jobs = {job: jobs[job] for job in folders}
        self._folders = folders

    def _save_snapshot(self) -> None:
        assert self.snapshot is not None
        frame = self._build()
        meta = json.dumps({"key": self._key, "folders": {job: self._folders[job] for job in self._jobs}})
        table = frame.to_arrow()
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), _META: meta.encode()})
        try:
            self.snapshot.parent.mkdir(parents=True, exist_ok=True)
            handle, tmp = tempfile.mkstemp(prefix=f".{self.snapshot.name}.", dir=self.snapshot.parent)
            os.close(handle)
            try:
                pq.write_table(table, tmp, compression="zstd")
                os.replace(tmp, self.snapshot)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        except OSError as exc:  # a read-only warehouse: the cache stays in memory
            log.debug("cannot write the cache %s: %s", self.snapshot, exc)
