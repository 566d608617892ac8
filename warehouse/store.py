"""The warehouse directory layout and atomic publication of a trace's files.

Layout under the warehouse home::

    tracelake.duckdb                      DuckDB catalog: one view per table
    tables/<table>/job=<job>/<trace_id>.parquet
    tables/<table>/job=_schema/_schema.parquet   empty file fixing the schema
    staging/<trace_id>-<random>/          work area of an ingest in progress

A trace becomes visible when its ``traces`` file appears; every other view joins
on ``traces`` (by job and trace id), so files published earlier by an ingest that
died are never seen. Crash safety, in short:

* every file lands by a rename, from a staging folder or a hidden ``.*.tmp`` name
  that no glob matches, so a reader sees a file whole or not at all;
* publishing and removing hold the warehouse's write lock (``.write.lock``, an
  ``flock`` the kernel drops when its holder dies), so two ingests of one file never
  register it twice and ``tracelake check --repair`` never takes a publication in
  progress for the leftovers of a dead one;
* work in progress stays in ``staging/`` (or in hidden temporary files), which no
  view reads; a staging folder nothing has written to for a while is left over.

What a killed process leaves (staging folders, temporary files, data files of a
trace it had not registered yet or had started to remove) is invisible to queries
and is listed, and removed, by :mod:`.check`.
"""

from __future__ import annotations

import functools
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import pyarrow as pa
import pyarrow.parquet as pq

from tracelake.contracts import schema
from tracelake.contracts.lazy import polars as pl
from tracelake.contracts.lazy import pyarrow_dataset as ds
from tracelake.contracts.names import JOB_NAME, RESERVED_JOB, check_job  # check_job: the warehouse's too

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no advisory locks, single writer assumed
    fcntl = None  # type: ignore[assignment]

SCHEMA_JOB = RESERVED_JOB
#: The lock file that publishing, removing and repairing hold (under the warehouse home).
WRITE_LOCK = ".write.lock"
#: How temporary files are named: ``.<name>.<pid>-<random>.tmp`` (the pid tells a dead writer's from a live one's).
TEMP_FILE = re.compile(r"^\..+\.(?P<pid>[0-9]+)(?:-[0-9a-f]+)?\.tmp(?:\.wal)?$")
_TRACE_ID = re.compile(r"^[0-9a-f]{1,64}$")


def _has_schema(path: Path, expected: pa.Schema) -> bool:
    """True when ``path`` is a Parquet file with exactly ``expected``'s columns and types (False when unreadable)."""
    try:
        found = pq.read_schema(path)
    except (OSError, pa.ArrowException):
        return False
    return [(f.name, f.type) for f in found] == [(f.name, f.type) for f in expected]


def is_warehouse(home: Path) -> bool:
    """Whether ``home`` holds a tracelake warehouse (its catalog or its tables), so a reader need not create one."""
    return (home / "tracelake.duckdb").is_file() or (home / "tables").is_dir()


class Store:
    """Paths and file operations of one warehouse directory."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.tables = home / "tables"
        self.staging_root = home / "staging"
        self.catalog_path = home / "tracelake.duckdb"
        self.catalog_stamp = home / "tracelake.duckdb.stamp"
        self.lock_path = home / WRITE_LOCK

    def initialise(self) -> None:
        """Create the directory tree and the empty schema file of every table."""
        for tbl in schema.TABLES.values():
            target = self.schema_file(tbl.name)
            target.parent.mkdir(parents=True, exist_ok=True)
            if not _has_schema(target, tbl.arrow_schema):
                self.write_atomic(tbl.arrow_schema.empty_table(), target)
        self.staging_root.mkdir(parents=True, exist_ok=True)

    def glob(self, table: str) -> str:
        """The glob the catalog views read for ``table`` (absolute)."""
        return str(self.tables / table / "*" / "*.parquet")

    def schema_file(self, table: str) -> Path:
        """The empty file that fixes ``table``'s schema (and makes every glob match something)."""
        return self.tables / table / f"job={SCHEMA_JOB}" / f"{SCHEMA_JOB}.parquet"

    def job_traces(self, job: str) -> list[str]:
        """The ids of the traces registered under ``job``, sorted (none for an unknown or invalid job)."""
        if not JOB_NAME.match(job) or job == SCHEMA_JOB:
            return []
        return sorted(p.stem for p in (self.tables / "traces" / f"job={job}").glob("*.parquet"))

    def path(self, table: str, job: str, trace_id: str) -> Path:
        """Where ``table``'s file of one trace lives."""
        return self.tables / table / f"job={job}" / f"{trace_id}.parquet"

    def read(self, table: str, traces: Iterable[tuple[str, str]]) -> pa.Table:
        """``table``'s rows of the given ``(job, trace_id)`` pairs, in the declared schema.

        Files written under an older schema get nulls for columns they lack.
        """
        files = [str(p) for job, trace_id in traces if (p := self.path(table, job, trace_id)).exists()]
        tbl = schema.table(table)
        if not files:
            return tbl.arrow_schema.empty_table()
        return ds.dataset(files, schema=tbl.arrow_schema, format="parquet").to_table()

    def read_frame(
        self, table: str, traces: Iterable[tuple[str, str]], columns: list[str] | None = None,
        file_paths: str | None = None,
    ) -> pl.DataFrame:
        """:meth:`read` as a polars frame (of ``columns`` only, if given), read by polars from the files.

        Several times faster than going through Arrow datasets on the small files of stored analyses. Each
        file is read through one open descriptor (:func:`_opened`), so a file replaced meanwhile is read
        whole, as it was when opened. With ``file_paths``, a last column of that name holds each row's file.
        """
        frames = [self._read_open(table, paths, handles, columns, file_paths)
                  for paths, handles in _opened(self._paths(table, traces)) if handles]
        if frames:
            return _stacked(frames)
        frame = pl.DataFrame(schema=_polars_schema(table))
        frame = frame.select(columns) if columns else frame
        return frame.with_columns(pl.lit(None, pl.String).alias(file_paths)) if file_paths else frame

    @staticmethod
    def _read_open(table: str, paths: list[str], handles: list[IO[bytes]], columns: list[str] | None,
                   file_paths: str | None) -> pl.DataFrame:
        rows = [pq.read_metadata(handle).num_rows for handle in handles] if file_paths else []
        for handle in handles:
            handle.seek(0)
        scan = _scan(table, handles)
        frame = (scan.select(columns) if columns else scan).collect()
        if file_paths:
            files = pl.DataFrame({file_paths: paths, "rows": rows}, schema={file_paths: pl.String, "rows": pl.UInt32})
            per_row = files.filter(pl.col("rows") > 0).select(pl.col(file_paths).repeat_by("rows").explode())
            frame = frame.with_columns(per_row.to_series())
        return frame

    def aggregate(self, table: str, traces: Iterable[tuple[str, str]],
                  query: Callable[[pl.LazyFrame], pl.LazyFrame]) -> pl.DataFrame | None:
        """``query`` over ``table``'s rows of the given ``(job, trace_id)`` pairs, in the declared schema, without
        loading them (a lazy scan); None where none of them has a file of it.

        The files are read :data:`OPEN_AT_ONCE` at a time (each through one open descriptor, as
        :meth:`read_frame` reads them) and the query's results put together: it must keep traces apart (group by
        ``trace_id``, say), since each batch holds whole traces.
        """
        results = []
        for _, handles in _opened(self._paths(table, traces)):
            if handles:
                scan = _scan(table, handles)
                results.append(query(scan).collect())
                del scan  # it holds polars' copies of the batch's descriptors
        return _stacked(results) if results else None

    def _paths(self, table: str, traces: Iterable[tuple[str, str]]) -> list[Path]:
        return [self.path(table, job, trace_id) for job, trace_id in traces]

    def registered_job(self, trace_id: str) -> str | None:
        """The job a trace is registered under, or None if it is not registered."""
        if not _TRACE_ID.match(trace_id):
            return None
        for found in (self.tables / "traces").glob(f"job=*/{trace_id}.parquet"):
            return found.parent.name.partition("=")[2]
        return None

    def new_staging(self, trace_id: str, root: Path | None = None) -> Path:
        """A fresh private directory for one trace under ``root`` (default: ``staging/``, made if missing).

        A given ``root`` must exist: a run that removed its folder has been abandoned,
        and a task still running for it must not recreate it.
        """
        if root is None:
            root = self.staging_root
            root.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f"{trace_id}-", dir=root))

    @contextmanager
    def write_lock(self) -> Iterator[bool]:
        """Hold the warehouse's write lock (across processes and threads); yields whether it is held.

        Held only for renames and unlinks (milliseconds); readers never take it. A
        read-only warehouse (no lock file, and none can be created) yields False.
        """
        if fcntl is None:
            yield True
            return
        try:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            try:
                fd = os.open(self.lock_path, os.O_RDONLY)
            except OSError:
                yield False
                return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield True
        finally:
            os.close(fd)  # closing drops the lock

    def publish(self, staging: Path, job: str, trace_id: str) -> str | None:
        """Move a trace's staged table files into place, ``traces`` last; returns None, or the job it is already in.

        Each move is an atomic rename within one file system, so a reader sees a
        file whole or not at all, and the trace only once its registration lands.
        Under the write lock, so when two processes ingest the same file at once,
        the second finds the first's registration and publishes nothing (its
        caller reports a duplicate).
        """
        with self.write_lock():
            existing = self.registered_job(trace_id)
            if existing is not None:
                return existing
            for name in (*schema.DATA_TABLES, "traces"):
                source = staging / f"{name}.parquet"
                target = self.path(name, job, trace_id)
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(source, target)
        return None

    def remove(self, job: str, trace_id: str) -> None:
        """Delete a trace's files, its registration (``traces``) first so that no query sees it half removed.

        A process killed half way leaves unregistered data files, which no view
        shows and ``tracelake check --repair`` removes.
        """
        with self.write_lock():
            for name in ("traces", *schema.DATA_TABLES):
                self.path(name, job, trace_id).unlink(missing_ok=True)

    @staticmethod
    def write_atomic(table: pa.Table, target: Path) -> None:
        """Write a Parquet file under a name no view matches, then rename it into place."""
        tmp = temp_name(target)
        try:
            pq.write_table(table, tmp, compression="zstd")
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def discard(self, staging: Path) -> None:
        """Remove a staging directory and everything in it."""
        shutil.rmtree(staging, ignore_errors=True)


#: Files one read holds open at once (:func:`_opened`; twice as many descriptors while polars holds its copies):
#: far under any open-file limit, however many traces a read spans.
OPEN_AT_ONCE = 256


def _opened(files: Iterable[Path]) -> Iterator[tuple[list[str], list[IO[bytes]]]]:
    """Open ``files`` for reading, :data:`OPEN_AT_ONCE` at a time; yields each batch's paths and handles, which are
    closed before the next batch is opened.

    A file read by its path can be replaced (``os.replace``: a job's analysis storing its critical path) between
    a reader's look at its footer and its read of the rows, which are then a different file's: polars' Parquet
    reader panicked on that under concurrent requests. An open descriptor keeps the file it was opened on,
    so every read through it sees one file whole. A file removed before it is opened is skipped, as if the
    listing had come after the removal.
    """
    batch: list[Path] = []
    for path in files:
        batch.append(path)
        if len(batch) == OPEN_AT_ONCE:
            yield from _open_batch(batch)
            batch = []
    if batch:
        yield from _open_batch(batch)


def _open_batch(files: list[Path]) -> Iterator[tuple[list[str], list[IO[bytes]]]]:
    paths: list[str] = []
    handles: list[IO[bytes]] = []
    try:
        for path in files:
            try:
                handles.append(open(path, "rb"))  # noqa: SIM115 - closed below, after the read
            except FileNotFoundError:
                continue
            paths.append(str(path))
        yield paths, handles
    finally:
        for handle in handles:
            handle.close()


def _scan(table: str, handles: list[IO[bytes]]) -> pl.LazyFrame:
    """A lazy scan of open files in ``table``'s declared schema: columns a file lacks come as nulls, others are
    left out."""
    return pl.scan_parquet(handles, schema=_polars_schema(table), missing_columns="insert", extra_columns="ignore")


def _stacked(frames: list[pl.DataFrame]) -> pl.DataFrame:
    """The batches' frames one under another (the one frame as it is)."""
    return pl.concat(frames, how="vertical") if len(frames) > 1 else frames[0]


def temp_name(target: Path) -> Path:
    """A hidden name beside ``target`` that no view's glob matches, unique to this process and call."""
    return target.with_name(f".{target.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")


@functools.cache
def _polars_schema(table: str) -> pl.Schema:
    """The polars types of a declared table (what ``pl.from_arrow`` makes of its Arrow schema)."""
    frame = pl.from_arrow(schema.table(table).arrow_schema.empty_table())
    assert isinstance(frame, pl.DataFrame)
    return frame.schema
