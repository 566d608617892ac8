"""The library facade: ``Warehouse(home).ingest(...)``, ``.query(sql)``, ``.traces()``.

The CLI and the REST API are thin adapters over this class.
"""

from __future__ import annotations

import datetime as dt
import logging
import multiprocessing
import os
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

from . import analysis_report, catalog, fleet_report, job_report, schema
from .analysis_report import Analysis
from .derived import INPUTS, write_derived
from .errors import InvalidArgument, NotFound, QueryError, TraceFormatError, TracelakeError, WarehouseError
from .fleet_report import Fleet
from .inputs import expand_inputs, file_size
from .job_report import JobReport
from .readonly import readonly_query
from .registry import Registry, job_summaries, select_traces
from .results import IngestProgress, IngestReport, IngestResult, QueryResult
from .settings import Settings
from .store import Store, check_job

log = logging.getLogger(__name__)

#: Up to this many device ops, an analysis ranks kernels across ranks in memory (three columns: ~50 MB).
IN_MEMORY_TOP_OPS = 2_000_000


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
        self.registry = Registry(self.store)
        self._fleet_rows = fleet_report.FleetRows(self.store)
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
            progress.start([(f, file_size(f)) for f in files])
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
            futures = {pool.submit(ingest_in_process, settings, path, job, labels): path for path in files}
            for future in as_completed(futures):
                path = futures[future]
                try:
                    result = future.result()
                except Exception as exc:  # a worker died: report the file, keep going
                    result = IngestResult(path=path, status="failed", job=job, error=f"{path}: worker failed ({exc})")
                results[path] = result
                if progress is not None:
                    progress.file_started(path)
                    progress.advance(file_size(path))
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
        names = ("breakdown", "kernel_stats", *analysis_report.STORED)
        stored = {name: self._stored(name, selection) for name in names}
        whole = self._whole(stored.pop("breakdown"))
        stats = stored.pop("kernel_stats")
        if stats.select(pl.struct("trace_id", "rank").n_unique()).item() <= 1:
            top_kernels = kernels.top_from_stats(stats, top=top)
        elif stats["count"].sum() <= IN_MEMORY_TOP_OPS:  # percentiles across ranks need every duration
            ops = self.store.read_frame("device_ops", selection.traces, columns=["name", "category", "dur_ns"])
            top_kernels = kernels.top_from_ops(ops, top=top)
        else:  # many ops: DuckDB, which spills to disk past its memory limit
            with self._session(selection, tables=("device_ops",)) as con:
                top_kernels = kernels.top_kernels(con, where=selection.where, params=selection.params, top=top)
        return analysis_report.compute(whole, stored, top_kernels, self._link_peaks())

    def _link_peaks(self) -> dict[str, float]:
        try:
            return nccl_analysis.link_peaks(self.settings.link_peaks)
        except ValueError as exc:
            raise InvalidArgument(f"TRACELAKE_LINK_PEAKS: {exc}") from None

    def job_report(self, job: str, *, top: int = 15) -> JobReport:
        """What a job report shows: :meth:`analyze` of ``job`` plus its steps and collective lateness per rank.

        Raises:
            NotFound: the job has no traces.
        """
        selection = self._selection(None, job)
        return job_report.compute(job, self._traces_frame(job, None, None, None), self.analyze(job=job, top=top),
                                  self._stored("breakdown", selection), self._stored("collectives", selection),
                                  self._link_peaks())

    def fleet(
        self,
        *,
        since: dt.datetime | None = None,
        until: dt.datetime | None = None,
        labels: dict[str, str] | None = None,
        top: int = 10,
        now: dt.datetime | None = None,
    ) -> Fleet:
        """Device-hours, utilisation and waste of every job with all ``labels``, ingested in ``[since, until)``.

        Per job, day, week, label and accelerator; the ``top`` jobs by wasted device-hours;
        week over week (the 7 days up to ``until``, else ``now``, against the 7 before);
        the worst stragglers and slowest collectives. Works on the per-trace analyses stored at
        ingest, kept per job folder between calls (docs/analyses.md, "Fleet"). Naive datetimes
        are taken as UTC.
        """
        return fleet_report.read(self.store, self.registry.frame(), since=since, until=until, labels=labels,
                                 now=now, top=top, rows=self._fleet_rows)

    def _breakdown(self, selection: _Selection, *, steps: bool) -> pl.DataFrame:
        frame = self._stored("breakdown", selection)
        return frame.sort("rank", "step", "trace_id", nulls_last=False) if steps else self._whole(frame)

    @staticmethod
    def _whole(breakdown: pl.DataFrame) -> pl.DataFrame:
        """The whole-trace rows of stored ``breakdown`` rows (``step`` null), in rank order."""
        return breakdown.filter(pl.col("step").is_null()).sort("rank", "step", "trace_id", nulls_last=False)

    def _stored(self, table: str, selection: _Selection) -> pl.DataFrame:
        """A stored table's rows for the selection, read straight from its Parquet files."""
        return self.store.read_frame(table, selection.traces)

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

    def traces(
        self,
        job: str | None = None,
        *,
        labels: dict[str, str] | None = None,
        since: dt.datetime | None = None,
        until: dt.datetime | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[dict[str, Any]]:
        """Registered traces, newest first, optionally of one job, with all ``labels``, ingested in ``[since, until)``.

        Naive datetimes are taken as UTC.
        """
        frame = self._traces_frame(job, labels, since, until)
        if limit is not None:
            frame = frame.slice(offset, limit)
        elif offset:
            frame = frame.slice(offset)
        return frame.to_dicts()

    def count_traces(
        self,
        job: str | None = None,
        *,
        labels: dict[str, str] | None = None,
        since: dt.datetime | None = None,
        until: dt.datetime | None = None,
    ) -> int:
        """How many registered traces :meth:`traces` would list without a limit."""
        return self._traces_frame(job, labels, since, until).height

    def jobs(self) -> list[dict[str, Any]]:
        """One summary row per job (traces, ranks, formats, bytes, time span), most recently ingested first."""
        return job_summaries(self.registry.frame()).to_dicts()

    def _traces_frame(
        self, job: str | None, labels: dict[str, str] | None, since: dt.datetime | None, until: dt.datetime | None
    ) -> pl.DataFrame:
        return select_traces(self.registry.frame(), job=job, labels=labels, since=since, until=until)

    def delete(self, trace_id: str) -> str:
        """Remove a trace and all its rows from the warehouse; returns the job it was in.

        Its registration goes first, so queries stop seeing it at once.

        Raises:
            NotFound: no trace has this id.
        """
        job = self.store.registered_job(trace_id)
        if job is None:
            raise NotFound(f"no trace with id {trace_id!r}")
        try:
            self.store.remove(job, trace_id)
        except OSError as exc:
            raise WarehouseError(f"cannot delete trace {trace_id}: {exc}") from exc
        return job

    def query_readonly(self, sql: str, *, max_rows: int | None = None) -> QueryResult:
        """Run one untrusted SQL query in a sandbox: read-only, no file or network access, time and row limits.

        At most ``max_rows`` rows (never more than the ``sql_max_rows`` setting) come back;
        ``truncated`` says when there were more.

        Raises:
            QueryError: the statement is not a single query, DuckDB rejected it, or it ran too long.
        """
        limit = self.settings.sql_max_rows if max_rows is None else min(max_rows, self.settings.sql_max_rows)
        return readonly_query(
            self.store, sql, max_rows=limit, timeout_seconds=self.settings.sql_timeout_seconds,
            memory_limit=self.settings.sql_memory_limit, threads=self.settings.threads,
        )

    def trace(self, trace_id: str) -> dict[str, Any]:
        """One trace's registry row (read from its own file: as fast with 10,000 traces as with one).

        Raises:
            NotFound: no trace has this id.
        """
        job = self.store.registered_job(trace_id)
        rows = self.store.read("traces", [(job, trace_id)]).to_pylist() if job is not None else []
        if not rows:
            raise NotFound(f"no trace with id {trace_id!r}")
        row = rows[0]
        row["labels"] = dict(row["labels"] or [])
        return {"trace_id": trace_id, "job": job, **{k: v for k, v in row.items() if k != "trace_id"}}


def ingest_in_process(
    settings: Settings, path: Path, job: str, labels: dict[str, str] | None, source_name: str | None = None
) -> IngestResult:
    """Ingest one file with a warehouse opened from ``settings`` (a picklable entry point for worker processes)."""
    return Warehouse(settings=settings).ingest_file(path, job=job, labels=labels, source_name=source_name)


@dataclass(frozen=True)
class _Selection:
    """What an analysis reads: its registered ``(job, trace_id)`` pairs, and the SQL filter with its parameters."""

    traces: tuple[tuple[str, str], ...]
    where: str
    params: list[Any]
