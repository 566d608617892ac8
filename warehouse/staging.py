"""Ingest and recompute in two steps: *stage* (pure work, anywhere) and *publish* (rename, by one client).

Staging parses one input file into a private directory under the warehouse's
``staging/`` folder: its parsed tables, its derived tables and its ``traces`` row
last. It reads the warehouse (to skip traces already there) but never changes
what readers see. Publishing renames the staged files into the table layout,
``traces`` last, which registers the trace. The local ingest runs both steps in
one process; a Dask ingest (:mod:`.distributed`) stages on the workers and
publishes on the client, so workers never contend for the catalog, and a task
retried after its worker died just stages again into a fresh directory.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from tracelake import ingest
from tracelake.analysis import peaks
from tracelake.contracts import schema
from tracelake.contracts.errors import NotFound, TraceFormatError, TracelakeError, WarehouseError
from tracelake.contracts.lazy import duckdb, lazy_module
from tracelake.contracts.status import IngestStatus
from tracelake.ingest.detect import Format
from tracelake.ingest.model import ByteCallback, TraceInfo

from .results import IngestResult
from .settings import Settings
from .store import Store, check_job

if TYPE_CHECKING:
    from . import derived, job_tables
else:  # the stored analyses load polars and the analyses: after the parse (contracts/lazy.py)
    derived, job_tables = (lazy_module(f"tracelake.warehouse.{name}") for name in ("derived", "job_tables"))

log = logging.getLogger(__name__)

@dataclass
class StagedTrace:
    """One input file after staging: its result so far and the directory holding its files.

    ``staging`` is None when there is nothing to publish (the file failed, or its
    trace was already registered: ``result.status`` says which).
    """

    result: IngestResult
    staging: Path | None = None


def stage_file(
    store: Store,
    settings: Settings,
    path: str | Path,
    *,
    job: str = "default",
    labels: dict[str, str] | None = None,
    source_name: str | None = None,
    on_bytes: ByteCallback | None = None,
    staging_root: Path | None = None,
    trace_id: str | None = None,
) -> StagedTrace:
    """Parse one file into a private staging directory, ready to publish; failures are in the result, never raised.

    Args:
        store: The warehouse's layout (only read, and written under ``staging_root``).
        settings: DuckDB threads and memory limit, parser batch size.
        path: The trace file.
        job, labels, source_name: As for :meth:`Warehouse.ingest_file`.
        on_bytes: Called as source bytes are read.
        staging_root: Where the staging directory goes (default: the warehouse's ``staging/``);
            it must be on the warehouse's file system, so that publishing is a rename.
        trace_id: The file's content id where the caller computed it (``ingest.content_id``); else the file is
            hashed here.
    """
    path = Path(path)
    started = time.perf_counter()
    result = IngestResult(path=path, status=IngestStatus.FAILED, job=job)
    staged = StagedTrace(result)
    try:
        check_job(job)
        staged.staging = _stage(store, settings, path, job, labels or {}, source_name or path.name, on_bytes,
                                result, staging_root, trace_id)
    except TracelakeError as exc:
        result.error = str(exc)
    except OSError as exc:
        result.error = f"{path}: cannot read ({exc.strerror or exc})"
    result.seconds = time.perf_counter() - started
    return staged


def _stage(
    store: Store,
    settings: Settings,
    path: Path,
    job: str,
    labels: dict[str, str],
    source_name: str,
    on_bytes: ByteCallback | None,
    result: IngestResult,
    staging_root: Path | None,
    known_id: str | None = None,
) -> Path | None:
    if not path.is_file():
        raise NotFound(f"{path}: no such file")
    result.source_bytes = path.stat().st_size
    detected = _format(path, source_name)
    late = detected is not None and detected.late_id and not known_id
    hashing = _LateId(store, path, source_name) if late else None
    if hashing is None:
        trace_id = known_id or ingest.content_id(path, source_name)
        existing = store.registered_job(trace_id)
        if existing is not None:
            _duplicate(result, trace_id, existing, on_bytes)
            return None
    started = time.perf_counter()
    staging = store.new_staging(hashing.prefix if hashing else trace_id, staging_root)
    try:
        options = ingest.ParseOptions(
            source_name=source_name,
            trace_id="" if hashing else trace_id,
            memory_limit=settings.ingest_memory_limit,
            threads=settings.threads,
            batch_bytes=settings.parse_batch_bytes,
            on_bytes=hashing.watch(on_bytes) if hashing else on_bytes,
            kineto_engine=settings.kineto_engine,
            nccl_log_engine=settings.nccl_log_engine,
            max_expansion_ratio=settings.max_expansion_ratio,
            max_expanded_bytes=settings.max_expanded_bytes,
            pending_trace_id=hashing.trace_id if hashing else None,
        )
        try:
            fmt, info = ingest.parse_into(path, staging, options, detected)
            if hashing:
                trace_id = hashing.trace_id()
        except _Duplicate as dup:
            store.discard(staging)
            _duplicate(result, dup.trace_id, dup.job, None)
            if on_bytes is not None and hashing is not None:  # the bytes the parse did not get to
                on_bytes(max(result.source_bytes - hashing.reported, 0))
            return None
        except BaseException:
            if hashing:
                hashing.raise_its_error()  # the file's own error (a damaged gzip) as hashing names it
            raise
        result.trace_id = trace_id
        derived.write_derived(staging, staging, peaks.parse_overrides(settings.device_peaks), settings.threads)
        rows = {name: pq.read_metadata(staging / f"{name}.parquet").num_rows for name in schema.DATA_TABLES}
        row = traces_row(path, source_name, trace_id, labels, fmt.name, info, rows, started)
        pq.write_table(pa.Table.from_pylist([row], schema=schema.TRACES.arrow_schema),
                       staging / "traces.parquet", compression="zstd")
    except BaseException as exc:
        store.discard(staging)
        if isinstance(exc, (pa.ArrowException, duckdb.Error)):
            raise TraceFormatError(source_name, f"could not convert the trace ({exc})") from exc
        raise
    finally:
        if hashing:
            hashing.stop()
    result.status = IngestStatus.STAGED
    result.format = fmt.name
    result.rank = info.rank
    result.rows = rows
    result.uncompressed_bytes = info.uncompressed_bytes
    result.warnings = list(info.warnings)
    return staging


def _format(path: Path, source_name: str) -> Format | None:
    """The file's format, detected once for the hashing and the parse (an unreadable file: None)."""
    try:
        return ingest.detect(path, source_name)
    except TracelakeError:
        return None  # hashing first says what is wrong with the file, and the parse detects again, as before


def _duplicate(result: IngestResult, trace_id: str, job: str, on_bytes: ByteCallback | None) -> None:
    """Mark ``result`` a duplicate of the trace registered under ``job``; the progress hears of the whole file."""
    result.status = IngestStatus.DUPLICATE
    result.trace_id = trace_id
    result.job = job
    if on_bytes is not None:
        on_bytes(result.source_bytes)


class _Duplicate(Exception):
    """Raised into a parse once hashing finds the trace registered already: the parse stops."""

    def __init__(self, trace_id: str, job: str) -> None:
        super().__init__(trace_id)
        self.trace_id, self.job = trace_id, job


class _LateId:
    """The content id of a file hashed on a thread of its own while the file is parsed.

    Hashing no longer comes before parsing (a second read of the whole file, about a sixth of a Kineto
    ingest's time): the parser asks for the id when it writes its final tables. A trace that turns out
    to be registered already stops its parse at the next chunk read or at that question, so a duplicate
    still costs about one hashing pass.
    """

    def __init__(self, store: Store, path: Path, source_name: str) -> None:
        self.prefix = "pending"
        self._store, self._path, self._name = store, path, source_name
        self._done = threading.Event()
        self._id: str | None = None
        self._job: str | None = None
        self._error: BaseException | None = None
        self.reported = 0  # bytes the parse has read (and reported through ``watch``)
        self._thread = threading.Thread(target=self._run, name="tracelake-content-id", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._id = ingest.content_id(self._path, self._name)
            self._job = self._store.registered_job(self._id)
        except BaseException as exc:  # re-raised on the parsing thread
            self._error = exc
        finally:
            self._done.set()

    def trace_id(self) -> str:
        """The id, once hashed; raises the hashing's error, or :class:`_Duplicate`."""
        self._done.wait()
        self.raise_its_error()
        assert self._id is not None
        if self._job is not None:
            raise _Duplicate(self._id, self._job)
        return self._id

    def raise_its_error(self) -> None:
        """Wait for hashing and raise what went wrong with it, if anything (its errors name the file's fault)."""
        self._done.wait()
        if self._error is not None:
            raise self._error

    def watch(self, on_bytes: ByteCallback | None) -> ByteCallback:
        """``on_bytes``, also stopping the parse as soon as hashing has found the trace registered."""
        def progress(count: int) -> None:
            if self._done.is_set() and self._job is not None and self._id is not None:
                raise _Duplicate(self._id, self._job)
            self.reported += count
            if on_bytes is not None:
                on_bytes(count)
        return progress

    def stop(self) -> None:
        """Wait for the thread (hashing always ends: it reads one file)."""
        self._thread.join()


def publish_staged(store: Store, staged: StagedTrace) -> IngestResult:
    """Register a staged trace by renaming its files into place (``traces`` last); returns the final result.

    Idempotent: when the trace is registered already (the same bytes came in under
    another name, or an earlier attempt got there first), nothing moves and the
    result says ``duplicate``. The staging directory is removed either way.
    """
    result = staged.result
    if staged.staging is None:
        return result
    started = time.perf_counter()
    trace_id, job = result.trace_id or "", result.job or ""  # both set by staging
    try:
        existing = store.publish(staged.staging, job, trace_id)  # checks for a registration under the write lock
        if existing is not None:
            result = IngestResult(path=result.path, status=IngestStatus.DUPLICATE, trace_id=trace_id, job=existing,
                                  source_bytes=result.source_bytes, seconds=result.seconds)
        else:
            result.status = IngestStatus.INGESTED
    except OSError as exc:
        result.status = IngestStatus.FAILED
        result.error = f"{result.path}: cannot publish into {store.home} ({exc.strerror or exc})"
    finally:
        store.discard(staged.staging)
    result.seconds += time.perf_counter() - started
    return result


def traces_row(
    path: Path,
    source_name: str,
    trace_id: str,
    labels: dict[str, str],
    fmt: str,
    info: TraceInfo,
    rows: dict[str, int],
    started: float,
) -> dict[str, Any]:
    """The ``traces`` row that registers one parsed trace."""
    from .core import tracelake_version  # core imports this module

    return {
        "trace_id": trace_id,
        "format": fmt,
        "source_name": source_name,
        "source_path": str(path.resolve()),
        "source_bytes": path.stat().st_size,
        "uncompressed_bytes": info.uncompressed_bytes,
        "labels": list(labels.items()),
        "host": info.host,
        "pid": info.pid,
        "rank": info.rank,
        "rank_source": info.rank_source,
        "world_size": info.world_size,
        "backend": info.backend,
        "nccl_version": info.nccl_version,
        "device_type": info.device_type,
        "device_name": info.device_name,
        "device_count": info.device_count,
        "start_ns": info.start_ns,
        "end_ns": info.end_ns,
        "event_count": info.event_count,
        "device_op_count": rows["device_ops"],
        "host_op_count": rows["host_ops"],
        "collective_count": rows["collectives"],
        "step_count": rows["steps"],
        "counter_count": rows["counters"],
        "warnings": list(info.warnings),
        "ingested_at": dt.datetime.now(dt.timezone.utc),
        "parse_seconds": time.perf_counter() - started,
        "tracelake_version": tracelake_version(),
        "schema_version": schema.SCHEMA_VERSION,
    }


def stage_derived(
    store: Store, settings: Settings, job: str, trace_id: str, staging_root: Path | None = None
) -> Path:
    """Recompute one registered trace's derived tables into a fresh staging directory (published by
    :func:`publish_derived`).

    Raises:
        WarehouseError: the trace's files cannot be read, or DuckDB failed.
    """
    staging = store.new_staging(trace_id, staging_root)
    try:
        for name in derived.INPUTS:
            stored = store.path(name, job, trace_id)
            if stored.exists():
                os.symlink(stored, staging / f"{name}.parquet")
            else:  # a trace ingested before the table existed
                pq.write_table(schema.table(name).arrow_schema.empty_table(), staging / f"{name}.parquet")
        derived.write_derived(staging, staging, peaks.parse_overrides(settings.device_peaks), settings.threads)
    except (duckdb.Error, OSError) as exc:
        store.discard(staging)
        raise WarehouseError(f"cannot recompute trace {trace_id}: {exc}") from exc
    except BaseException:
        store.discard(staging)
        raise
    return staging


def publish_derived(store: Store, staging: Path, job: str, trace_id: str) -> None:
    """Rename a trace's recomputed derived tables into place, each file atomically; removes ``staging``.

    Under the write lock, and only while the trace is registered there: a trace deleted
    while it was recomputed gets no files back.

    Raises:
        WarehouseError: a file could not be moved.
    """
    try:
        with store.write_lock():
            if store.registered_job(trace_id) != job:
                return
            for name in schema.DERIVED_TABLES:
                target = store.path(name, job, trace_id)
                if name in job_tables.PER_RUN and target.exists():  # what the last analysis of the job stored stays
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(staging / f"{name}.parquet", target)
    except OSError as exc:
        raise WarehouseError(f"cannot recompute trace {trace_id}: {exc}") from exc
    finally:
        store.discard(staging)
