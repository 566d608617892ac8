"""The library facade: ``Warehouse(home).ingest(...)``, ``.query(sql)``, ``.traces()``.

The CLI and the REST API are thin adapters over this class.
"""

from __future__ import annotations

import datetime as dt
import logging
import multiprocessing
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from tracelake import ingest
from tracelake.analysis import diff as diff_analysis
from tracelake.analysis import kernels
from tracelake.analysis import nccl as nccl_analysis
from tracelake.ingest.model import ByteCallback, TraceInfo

from . import analysis_report, catalog, schema
from .analysis_report import Analysis
from .derived import INPUTS, write_derived
from .errors import InvalidArgument, NotFound, QueryError, TraceFormatError, TracelakeError, WarehouseError
from .results import IngestProgress, IngestReport, IngestResult, QueryResult
from .settings import Settings
from .store import Store, check_job

log = logging.getLogger(__name__)

#: File name endings taken from a directory given to ``ingest`` (files named
#: explicitly are always tried, whatever their name).
TRACE_SUFFIXES = (".json", ".json.gz", ".pt.trace.json", ".pt.trace.json.gz", ".xplane.pb", ".xplane.pb.gz")
#: The JSON renderings XProf writes beside an ``.xplane.pb``: skipped in a directory that has the XSpace.
_XLA_JSON = re.compile(r"^(?P<host>.+)\.trace\.json(\.gz)?$|^perfetto_trace\.json(\.gz)?$")


def tracelake_version() -> str:
    """The installed tracelake version."""
    try:
        return version("tracelake")
    except PackageNotFoundError:  # running from a source tree
        return "0+unknown"


class Warehouse:
    """A tracelake warehouse: Parquet tables plus a DuckDB catalog in one directory.

    Args:
        home: Warehouse directory; default from ``settings`` (``TRACELAKE_HOME``,
            else ``~/.tracelake``). Created if missing.
        settings: Settings to use; default read from the environment.
    """

    def __init__(self, home: str | Path | None = None, *, settings: Settings | None = None) -> None:
        base = settings or Settings.from_env()
        self.settings = base if home is None else Settings(**{**base.__dict__, "home": Path(home)})
        self.home = self.settings.home_path
        self.store = Store(self.home)
        try:
            self.store.initialise()
            if not catalog.catalog_is_current(self.store):
                catalog.write_catalog(self.store)
        except OSError as exc:
            raise WarehouseError(f"cannot use warehouse directory {self.home}: {exc.strerror or exc}") from exc

    def __repr__(self) -> str:
        return f"Warehouse({str(self.home)!r})"

    # -- ingest ----------------------------------------------------------------------
    def ingest(
        self,
        paths: Iterable[str | Path],
        *,
        job: str = "default",
        labels: dict[str, str] | None = None,
        progress: IngestProgress | None = None,
        workers: int = 1,
    ) -> IngestReport:
        """Ingest trace files (and directories of them) under ``job``.

        Every input is tried; a bad file is reported in its result and does not
        stop the others. Files already in the warehouse are skipped. With
        ``workers`` > 1, files are ingested by that many processes at once (each
        file is still written atomically; results come back in input order).
        """
        check_job(job)
        files = expand_inputs(paths)
        if progress is not None:
            progress.start([(f, _size(f)) for f in files])
        if workers > 1 and len(files) > 1:
            return self._ingest_parallel(files, job, labels, progress, workers)
        report = IngestReport()
        for path in files:
            if progress is not None:
                progress.file_started(path)
            on_bytes = progress.advance if progress is not None else None
            result = self.ingest_file(path, job=job, labels=labels, on_bytes=on_bytes)
            report.results.append(result)
            if progress is not None:
                progress.file_done(result)
        return report

    def _ingest_parallel(
        self,
        files: list[Path],
        job: str,
        labels: dict[str, str] | None,
        progress: IngestProgress | None,
        workers: int,
    ) -> IngestReport:
        # Each process gets its share of the cores for DuckDB; progress advances per file.
        threads = max(1, self.settings.threads // min(workers, len(files)))
        settings = Settings(**{**self.settings.__dict__, "home": self.home, "threads": threads})
        results: dict[Path, IngestResult] = {}
        context = multiprocessing.get_context("spawn")  # no fork of a process holding DuckDB threads
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            futures = {pool.submit(_ingest_in_worker, settings, path, job, labels): path for path in files}
            for future in as_completed(futures):
                path = futures[future]
                try:
                    result = future.result()
                except Exception as exc:  # a worker died: report the file, keep going
                    result = IngestResult(path=path, status="failed", job=job, error=f"{path}: worker failed ({exc})")
                results[path] = result
                if progress is not None:
                    progress.file_started(path)
                    progress.advance(_size(path))
                    progress.file_done(result)
        return IngestReport([results[path] for path in files])

    def ingest_file(
        self,
        path: str | Path,
        *,
        job: str = "default",
        labels: dict[str, str] | None = None,
        source_name: str | None = None,
        on_bytes: ByteCallback | None = None,
    ) -> IngestResult:
        """Ingest one file; failures are returned in the result, never raised."""
        path = Path(path)
        started = time.perf_counter()
        result = IngestResult(path=path, status="failed", job=job)
        try:
            check_job(job)
            self._ingest_one(path, job, labels or {}, source_name or path.name, on_bytes, result)
        except TracelakeError as exc:
            result.error = str(exc)
        except OSError as exc:
            result.error = f"{path}: cannot read ({exc.strerror or exc})"
        result.seconds = time.perf_counter() - started
        if result.error:
            log.info("ingest failed: %s", result.error)
        return result

    def _ingest_one(
        self,
        path: Path,
        job: str,
        labels: dict[str, str],
        source_name: str,
        on_bytes: ByteCallback | None,
        result: IngestResult,
    ) -> None:
        if not path.is_file():
            raise NotFound(f"{path}: no such file")
        result.source_bytes = path.stat().st_size
        trace_id = ingest.content_id(path)
        result.trace_id = trace_id
        existing = self.store.registered_job(trace_id)
        if existing is not None:
            result.status = "duplicate"
            result.job = existing
            if on_bytes is not None:
                on_bytes(result.source_bytes)
            return
        started = time.perf_counter()
        staging = self.store.new_staging(trace_id)
        try:
            options = ingest.ParseOptions(
                source_name=source_name,
                trace_id=trace_id,
                memory_limit=self.settings.ingest_memory_limit,
                threads=self.settings.threads,
                batch_bytes=self.settings.parse_batch_bytes,
                on_bytes=on_bytes,
            )
            fmt, info = ingest.parse_into(path, staging, options)
            write_derived(staging, staging, threads=self.settings.threads,
                          memory_limit=self.settings.ingest_memory_limit)
            rows = {name: pq.read_metadata(staging / f"{name}.parquet").num_rows for name in schema.DATA_TABLES}
            row = self._traces_row(path, source_name, trace_id, labels, fmt.name, info, rows, started)
            pq.write_table(pa.Table.from_pylist([row], schema=schema.TRACES.arrow_schema),
                           staging / "traces.parquet", compression="zstd")
            self.store.publish(staging, job, trace_id)
        except TraceFormatError:
            raise
        except (pa.ArrowException, duckdb.Error) as exc:
            raise TraceFormatError(source_name, f"could not convert the trace ({exc})") from exc
        finally:
            self.store.discard(staging)
        result.status = "ingested"
        result.format = fmt.name
        result.rank = info.rank
        result.rows = rows
        result.uncompressed_bytes = info.uncompressed_bytes
        result.warnings = list(info.warnings)

    def _traces_row(
        self,
        path: Path,
        source_name: str,
        trace_id: str,
        labels: dict[str, str],
        fmt: str,
        info: TraceInfo,
        rows: dict[str, int],
        started: float,
    ) -> dict[str, Any]:
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

    # -- reading ----------------------------------------------------------------------
    def connect(self) -> duckdb.DuckDBPyConnection:
        """A fresh in-memory DuckDB connection with a view per table (no catalog lock)."""
        return catalog.connect(self.store, threads=self.settings.threads)

    def query(self, sql: str, params: list[Any] | None = None) -> QueryResult:
        """Run SQL over the warehouse views and return all rows.

        Raises:
            QueryError: DuckDB rejected or failed the query; the message is DuckDB's.
        """
        if not sql.strip():
            raise InvalidArgument("empty SQL query")
        con = self.connect()
        try:
            rel = con.execute(sql, params or [])
            if rel.description is None:
                return QueryResult([], [], [])
            columns = [d[0] for d in rel.description]
            types = [str(d[1]) for d in rel.description]
            return QueryResult(columns, types, rel.fetchall())
        except duckdb.Error as exc:
            raise QueryError(str(exc).strip()) from None
        finally:
            con.close()

    # -- analyses ---------------------------------------------------------------------
    def recompute(self, *, job: str | None = None, on_trace: Callable[[str], None] | None = None) -> int:
        """Recompute the derived tables (``breakdown``, ...) of every registered trace.

        Each trace's results are written to staging and renamed into place, so
        readers see the old or the new results, never a mix. Returns the count.
        """
        done = 0
        for row in self.traces(job=job):
            trace_id, trace_job = row["trace_id"], row["job"]
            staging = self.store.new_staging(trace_id)
            try:
                for name in INPUTS:
                    stored = self.store.path(name, trace_job, trace_id)
                    if stored.exists():
                        os.symlink(stored, staging / f"{name}.parquet")
                    else:  # a trace ingested before the table existed
                        pq.write_table(schema.table(name).arrow_schema.empty_table(), staging / f"{name}.parquet")
                write_derived(staging, staging,
                              threads=self.settings.threads, memory_limit=self.settings.ingest_memory_limit)
                for name in schema.DERIVED_TABLES:
                    target = self.store.path(name, trace_job, trace_id)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(staging / f"{name}.parquet", target)
            except (duckdb.Error, OSError) as exc:
                raise WarehouseError(f"cannot recompute trace {trace_id}: {exc}") from exc
            finally:
                self.store.discard(staging)
            done += 1
            if on_trace is not None:
                on_trace(trace_id)
        return done

    def breakdown(self, *, trace_id: str | None = None, job: str | None = None, steps: bool = False) -> pl.DataFrame:
        """The time breakdown per rank (and per step with ``steps=True``) of one trace or job.

        Raises:
            NotFound: nothing matches ``trace_id`` / ``job``.
        """
        return self._breakdown(self._selection(trace_id, job), steps=steps)

    def analyze(self, *, trace_id: str | None = None, job: str | None = None, top: int = 8) -> Analysis:
        """Every analysis of one trace or job: breakdown, findings, kernels, idle, launches, steps, collectives.

        Raises:
            NotFound: nothing matches ``trace_id`` / ``job``.
        """
        selection = self._selection(trace_id, job)
        whole = self._breakdown(selection, steps=False)
        stored = {name: self._stored(name, selection) for name in analysis_report.STORED}
        stats = self._stored("kernel_stats", selection)
        if stats.select(pl.struct("trace_id", "rank").n_unique()).item() <= 1:
            top_kernels = kernels.top_from_stats(stats, top=top)
        else:  # percentiles across ranks need every duration
            with self._session(selection, tables=("device_ops",)) as con:
                top_kernels = kernels.top_kernels(con, where=selection.where, params=selection.params, top=top)
        try:
            peaks = nccl_analysis.link_peaks(self.settings.link_peaks)
        except ValueError as exc:
            raise InvalidArgument(f"TRACELAKE_LINK_PEAKS: {exc}") from None
        return analysis_report.compute(whole, stored, top_kernels, peaks)

    def _breakdown(self, selection: _Selection, *, steps: bool) -> pl.DataFrame:
        frame = self._stored("breakdown", selection)
        if not steps:
            frame = frame.filter(pl.col("step").is_null())
        return frame.sort("rank", "step", "trace_id", nulls_last=False)

    def _stored(self, table: str, selection: _Selection) -> pl.DataFrame:
        """A stored table's rows for the selection, read straight from its Parquet files."""
        frame = pl.from_arrow(self.store.read(table, selection.traces))
        assert isinstance(frame, pl.DataFrame)
        return frame

    def diff(self, a: str, b: str) -> tuple[pl.DataFrame, pl.DataFrame]:
        """Compare two traces or jobs (each a trace id or a job name): (kernels, categories).

        Raises:
            NotFound: ``a`` or ``b`` is neither a trace id nor a job.
        """
        left, right = self._resolve(a), self._resolve(b)
        with self._session(left, right, tables=("device_ops",)) as con:
            kernels_frame = diff_analysis.kernel_diff(con, (left.where, left.params), (right.where, right.params))
        categories = diff_analysis.category_diff(
            self._breakdown(left, steps=False), self._breakdown(right, steps=False)
        )
        return kernels_frame, categories

    @contextmanager
    def _session(
        self, *selections: _Selection, tables: Iterable[str] | None = None
    ) -> Iterator[duckdb.DuckDBPyConnection]:
        """One query connection for a whole analysis, with views (of ``tables``) over the selected traces only."""
        traces = sorted({pair for selection in selections for pair in selection.traces})
        con = catalog.session(self.store, traces, tables, threads=self.settings.threads)
        try:
            yield con
        except duckdb.Error as exc:
            raise QueryError(str(exc).strip()) from None
        finally:
            con.close()

    def _selection(self, trace_id: str | None, job: str | None) -> _Selection:
        """The SQL filter for one trace or one job, checked to match something (on the file system)."""
        if trace_id is not None:
            found = self.store.registered_job(trace_id)
            if found is None:
                raise NotFound(f"no trace with id {trace_id!r}")
            return _Selection(((found, trace_id),), "trace_id = ?", [trace_id])
        if job is not None:
            ids = self.store.job_traces(job)
            if not ids:
                raise NotFound(f"no traces in job {job!r}")
            return _Selection(tuple((job, i) for i in ids), "job = ?", [job])
        raise InvalidArgument("give a trace id or a job")

    def _resolve(self, name: str) -> _Selection:
        """The selection ``name`` stands for: a trace id, else a job name."""
        found = self.store.registered_job(name)
        if found is not None:
            return _Selection(((found, name),), "trace_id = ?", [name])
        ids = self.store.job_traces(name)
        if ids:
            return _Selection(tuple((name, i) for i in ids), "job = ?", [name])
        raise NotFound(f"{name!r} is neither a trace id nor a job (see `tracelake traces`)")

    def traces(self, job: str | None = None) -> list[dict[str, Any]]:
        """Registered traces, newest first (optionally of one job)."""
        sql = "SELECT * FROM traces"
        params: list[Any] = []
        if job is not None:
            sql += " WHERE job = ?"
            params.append(job)
        sql += " ORDER BY ingested_at DESC, job, rank"
        return self.query(sql, params).as_dicts()

    def trace(self, trace_id: str) -> dict[str, Any]:
        """One trace's registry row.

        Raises:
            NotFound: no trace has this id.
        """
        rows = self.query("SELECT * FROM traces WHERE trace_id = ?", [trace_id]).as_dicts()
        if not rows:
            raise NotFound(f"no trace with id {trace_id!r}")
        return rows[0]


def _ingest_in_worker(settings: Settings, path: Path, job: str, labels: dict[str, str] | None) -> IngestResult:
    """Ingest one file in a worker process."""
    return Warehouse(settings=settings).ingest_file(path, job=job, labels=labels)


@dataclass(frozen=True)
class _Selection:
    """What an analysis reads: its registered ``(job, trace_id)`` pairs, and the SQL filter with its parameters."""

    traces: tuple[tuple[str, str], ...]
    where: str
    params: list[Any]


def expand_inputs(paths: Iterable[str | Path]) -> list[Path]:
    """Files named directly, plus trace files found under directories, sorted and de-duplicated.

    A path that does not exist is kept, so that ingest reports it as a failure.
    """
    out: list[Path] = []
    seen: set[Path] = set()
    for raw in paths:
        path = Path(raw)
        found = _traces_in(path) if path.is_dir() else [path]
        for p in found:
            key = p.resolve()
            if key not in seen:
                seen.add(key)
                out.append(p)
    return out


def _traces_in(folder: Path) -> list[Path]:
    """Trace files under ``folder``; XLA's JSON renderings are left out where their ``.xplane.pb`` is there."""
    found = sorted(p for p in folder.rglob("*") if p.is_file() and _looks_like_trace(p))
    xspaces: dict[Path, set[str]] = {p.parent: set() for p in found if p.name.endswith((".xplane.pb", ".xplane.pb.gz"))}
    for p in found:
        if p.parent in xspaces:
            xspaces[p.parent].add(p.name.split(".xplane.pb")[0])
    kept = []
    for p in found:
        match = _XLA_JSON.match(p.name)
        if match and p.parent in xspaces and (match.group("host") is None or match.group("host") in xspaces[p.parent]):
            continue
        kept.append(p)
    return kept


#: Text outputs (nccl-tests, NCCL logs) are taken from a directory only when their content is recognised.
_TEXT_SUFFIXES = (".txt", ".log", ".out")


def _looks_like_trace(path: Path) -> bool:
    if path.name.startswith("."):
        return False
    if path.name.endswith(_TEXT_SUFFIXES) or ("." not in path.name and "rank" in path.name.lower()):
        # text outputs, and Flight Recorder dumps (``nccl_trace_rank_3``): only when recognised
        try:
            ingest.detect(path)
        except TracelakeError:
            return False
        return True
    return path.name.endswith(TRACE_SUFFIXES)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
