"""The library facade: ``Warehouse(home).ingest(...)``, ``.query(sql)``, ``.traces()``; the CLI and API adapt it."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from functools import cached_property
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracelake.contracts.critical import Speedup
from tracelake.contracts.errors import InvalidArgument, NotFound, QueryError, WarehouseError
from tracelake.contracts.lazy import duckdb, lazy_module, polars as pl
from tracelake.contracts.status import IngestStatus
from tracelake.ingest.model import ByteCallback

from . import catalog, staging
from .check import STALE_AFTER, CheckReport
from .check import check as check_warehouse
from .inputs import expand_inputs, file_size
from .readonly import SqlEngine, local_query, query_once
from .registry import Registry, job_summaries, select_traces
from . import selection as selections
from .selection import Selection
from .executor import IngestTask, executor_for, ingest_all
from .results import IngestProgress, IngestReport, IngestResult, QueryResult
from .settings import Settings
from .store import Store, check_job

if TYPE_CHECKING:
    from distributed import Client as DaskClient

    from tracelake.analysis import assemble, job_view
    from tracelake.analysis import diff as diff_analysis
    from tracelake.analysis import kernels
    from tracelake.analysis import nccl as nccl_analysis
    from tracelake.analysis.assemble import Analysis
    from tracelake.analysis.fleet_view import Fleet
    from tracelake.analysis.job_view import JobReport

    from . import critical_inputs, fleet_data, job_tables, overview, perfetto, runs
else:
    # The analysis side loads on first use: an ingest's parse needs none of it (contracts/lazy.py).
    assemble, job_view, diff_analysis, kernels, nccl_analysis = (
        lazy_module(f"tracelake.analysis.{name}") for name in ("assemble", "job_view", "diff", "kernels", "nccl"))
    critical_inputs, fleet_data, job_tables, overview, perfetto, runs = (
        lazy_module(f"tracelake.warehouse.{name}")
        for name in ("critical_inputs", "fleet_data", "job_tables", "overview", "perfetto", "runs"))

log = logging.getLogger(__name__)


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
        self.settings = base if home is None else replace(base, home=Path(home))
        self.home = self.settings.home_path
        self.store = Store(self.home)
        self.registry = Registry(self.store)
        try:
            self.store.initialise()
            if not catalog.catalog_is_current(self.store):
                catalog.write_catalog(self.store)
        except OSError as exc:
            raise WarehouseError(f"cannot use warehouse directory {self.home}: {exc.strerror or exc}") from exc

    def __repr__(self) -> str:
        return f"Warehouse({str(self.home)!r})"

    @cached_property
    def _fleet_rows(self) -> fleet_data.FleetRows:
        return fleet_data.FleetRows(self.store)

    @cached_property
    def _runs(self) -> runs.RunCache:
        """Each trace's run within its job (docs/analyses.md, "Runs within a job")."""
        return runs.RunCache()

    # -- ingest ----------------------------------------------------------------------
    def ingest(
        self,
        paths: Iterable[str | Path],
        *,
        job: str = "default",
        labels: dict[str, str] | None = None,
        progress: IngestProgress | None = None,
        workers: int = 1,
        client: DaskClient | None = None,
    ) -> IngestReport:
        """Ingest trace files (and directories of them) under ``job``.

        Every input is tried; a bad file is reported in its result and does not
        stop the others. Files already in the warehouse are skipped. Afterwards the
        snapshots under ``cache/`` are brought up to date with the job (:meth:`refresh_caches`). With
        ``workers`` > 1, files are ingested by that many processes at once (each
        file is still written atomically; results come back in input order).
        With a Dask ``client`` (``dask.distributed.Client``), each file is parsed by a
        task on the cluster and registered here as its task finishes; workers must
        see the inputs and the warehouse at the same paths (see :mod:`.distributed`).
        Each of these ways is an executor of :mod:`.executor`.
        """
        check_job(job)
        files = expand_inputs(paths)
        if progress is not None:
            progress.start([(f, file_size(f)) for f in files])
        executor = executor_for(self, len(files), workers=workers, client=client)
        try:
            report = ingest_all(executor, [IngestTask(path, job, labels) for path in files], progress)
        finally:
            executor.shutdown(wait=True)
        if any(r.status == IngestStatus.INGESTED for r in report.results):
            self.refresh_caches({job})
            runs.warn_repeats(self._runs.runs(self.registry.frame()), report.results)  # docs/analyses.md
        return report

    def ingest_file(
        self,
        path: str | Path,
        *,
        job: str = "default",
        labels: dict[str, str] | None = None,
        source_name: str | None = None,
        on_bytes: ByteCallback | None = None,
        trace_id: str | None = None,
    ) -> IngestResult:
        """Ingest one file; failures are returned in the result, never raised.

        ``trace_id``: the file's content id (``ingest.content_id``) where the caller computed it already (the
        server, as an upload arrives); the file is then not hashed again.
        """
        staged = staging.stage_file(self.store, self.settings, path, job=job, labels=labels,
                                    source_name=source_name, on_bytes=on_bytes, trace_id=trace_id)
        result = staging.publish_staged(self.store, staged)
        if result.error:
            log.info("ingest failed: %s", result.error)
        return result

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
    def recompute(
        self,
        *,
        job: str | None = None,
        on_trace: Callable[[str], None] | None = None,
        client: DaskClient | None = None,
    ) -> int:
        """Recompute the derived tables (``breakdown``, ...) of every registered trace.

        Each trace's results are written to staging and renamed into place, so
        readers see the old or the new results, never a mix. Returns the count.
        With a Dask ``client``, the traces are recomputed on its workers, which must
        see the warehouse at the same path (see :mod:`.distributed`).

        Raises:
            WarehouseError: a trace could not be recomputed (on Dask: after every other trace was).
        """
        rows = [(row["job"], row["trace_id"]) for row in self.traces(job=job)]
        if client is not None:
            from .distributed import recompute_on_dask

            return recompute_on_dask(self, rows, client, on_trace=on_trace)
        for trace_job, trace_id in rows:
            staged = staging.stage_derived(self.store, self.settings, trace_job, trace_id)
            staging.publish_derived(self.store, staged, trace_job, trace_id)
            if on_trace is not None:
                on_trace(trace_id)
        return len(rows)

    def breakdown(self, *, trace_id: str | None = None, job: str | None = None, steps: bool = False) -> pl.DataFrame:
        """The time breakdown per rank (and per step with ``steps=True``) of one trace or job.

        Raises:
            NotFound: nothing matches ``trace_id`` / ``job``.
        """
        return self._breakdown(selections.of(self.store, trace_id, job), steps=steps)

    def analyze(self, *, trace_id: str | None = None, job: str | None = None, top: int = 8,
                speedups: Sequence[Speedup] = ()) -> Analysis:
        """Every analysis of one trace or job: breakdown, findings, kernels, idle, launches, steps, collectives,
        critical paths and what-if answers (a scenario per ``speedups`` besides the standard ones).

        Raises:
            NotFound: nothing matches ``trace_id`` / ``job``.
        """
        selection = selections.of(self.store, trace_id, job)
        whole_runs = trace_id is None  # a job's runs, each whole: their critical paths are stored (job_tables)
        # nccl-tests output anywhere in the selection (its own run, often) gives every run's collectives a curve
        curves = nccl_analysis.bandwidth_curves(self._stored("nccl_benchmarks", selection))
        return runs.analyze_by_run(self._runs.runs(self.registry.frame()), selection.traces,
                                   lambda pairs: self._analyze(runs.narrow(selection, pairs), top, whole_runs,
                                                               speedups, curves))

    def _analyze(self, selection: Selection, top: int, whole_runs: bool = False,
                 speedups: Sequence[Speedup] = (), curves: dict[str, nccl_analysis.Curve] | None = None) -> Analysis:
        names = ("breakdown", "kernel_stats", *assemble.STORED)
        stored = {name: self._stored(name, selection) for name in names}
        whole = self._whole(stored.pop("breakdown"))
        stats = stored.pop("kernel_stats")
        if stats.select(pl.struct("trace_id", "rank").n_unique()).item() <= 1:
            top_kernels = kernels.top_from_stats(stats, top=top)
        else:  # percentiles across ranks need every duration: counted in DuckDB, which spills past its memory limit
            with self._session(selection, tables=("device_ops",)) as con:
                counts = con.sql(f"SELECT name, category, dur_ns, count(*) AS n FROM device_ops WHERE {selection.where}"
                                 " GROUP BY ALL", params=selection.params).pl()
            top_kernels = kernels.top_from_counts(counts, top=top)
        paths = critical_inputs.analyse(self.store, selection.traces, stored["traces"], stored["collectives"],
                                        speedups, curves)
        if whole_runs and selection.traces:
            run = self._runs.run_of(self.registry.frame(), selection.traces[0][1])
            job_tables.store_critical_path(self.store, selection.traces, paths.path, run,
                                           stored["traces"]["rank"].n_unique())
        calls = None
        if stored["memory_events"].height:  # allocator churn (docs/analyses.md, "Memory"): a few named host calls
            called = list(assemble.ALLOCATOR_CALLS)
            with self._session(selection, tables=("host_ops",)) as con:
                calls = con.sql(f"SELECT trace_id, rank, name, step, dur_ns FROM host_ops WHERE ({selection.where}) "
                                f"AND name IN ({', '.join('?' * len(called))})",
                                params=[*selection.params, *called]).pl()
        return assemble.compute(whole, stored, top_kernels, self._link_peaks(), paths, calls, top=top)

    def _link_peaks(self) -> dict[str, float]:
        try:
            return nccl_analysis.link_peaks(self.settings.link_peaks)
        except ValueError as exc:
            raise InvalidArgument(f"TRACELAKE_LINK_PEAKS: {exc}") from None

    def export_perfetto(self, job: str, out: Path, *, step: int | None = None) -> perfetto.Exported:
        """Every rank of ``job`` (or one ``step``) on one timeline, with its critical path and findings, into
        ``out`` (docs/formats.md, "Perfetto export"). Raises NotFound: no traces, or no events in ``step``."""
        selection, analysis = selections.of(self.store, None, job), self.analyze(job=job)
        ranks = {str(t): int(r or 0) for t, r in self._stored("traces", selection).select("trace_id", "rank").rows()}
        done = perfetto.export(self.store, selection.traces, ranks, out, step=step,
                               path=analysis.critical_path_stretches, findings=analysis.findings)
        if step is not None and not done.ops:
            out.unlink(missing_ok=True)
            raise NotFound(f"job {job!r} has no events in step {step}")
        return done

    def job_report(self, job: str, *, top: int = 15) -> JobReport:
        """What a job report shows: :meth:`analyze` of ``job`` plus its steps and collective lateness per rank.

        Raises:
            NotFound: the job has no traces.
        """
        selection = selections.of(self.store, None, job)
        return job_view.compute(job, self._traces_frame(job, None, None, None), self.analyze(job=job, top=top),
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
        return fleet_data.read(self.store, self.registry.frame(), since=since, until=until, labels=labels,
                               now=now, top=top, rows=self._fleet_rows)

    def refresh_caches(self, jobs: Collection[str]) -> None:
        """Bring the snapshots under ``cache/`` up to date with ``jobs``' folders (after they were written to).

        The registry of traces and the fleet's breakdown rows (one small row per trace and
        rank) are snapshotted there so that a new process reads a file instead of one per
        trace; refreshing them right after an ingest reads only the job's folders, and spares
        the next ``tracelake report fleet`` (or listing) from reading every file of a
        warehouse that no reader has seen yet. The per-job collective summaries are left to
        the next fleet report: making one reads every collective of the job, which an
        ingest of one more rank should not pay. Only a cache: a failure is logged, not raised.
        """
        wanted = set(jobs)
        if not wanted:
            return
        try:
            self.registry.refresh(wanted)
            self._fleet_rows.breakdown.frame(wanted)
        except (OSError, pl.exceptions.PolarsError) as exc:
            log.warning("could not refresh the caches under %s: %s", self.home / "cache", exc)

    def _breakdown(self, selection: Selection, *, steps: bool) -> pl.DataFrame:
        frame = self._stored("breakdown", selection)
        return frame.sort("rank", "step", "trace_id", nulls_last=False) if steps else self._whole(frame)

    @staticmethod
    def _whole(breakdown: pl.DataFrame) -> pl.DataFrame:
        """The whole-trace rows of stored ``breakdown`` rows (``step`` null), in rank order."""
        return breakdown.filter(pl.col("step").is_null()).sort("rank", "step", "trace_id", nulls_last=False)

    def _stored(self, table: str, selection: Selection) -> pl.DataFrame:
        """A stored table's rows for the selection, read straight from its Parquet files."""
        return self.store.read_frame(table, selection.traces)

    def diff(self, a: str, b: str) -> tuple[pl.DataFrame, pl.DataFrame]:
        """Compare two traces or jobs (each a trace id or a job name): (kernels, categories).

        Raises:
            NotFound: ``a`` or ``b`` is neither a trace id nor a job.
        """
        left, right = selections.resolve(self.store, a), selections.resolve(self.store, b)
        kernels_frame = diff_analysis.kernel_diff(self._stored("kernel_stats", left),
                                                  self._stored("kernel_stats", right))
        categories = diff_analysis.category_diff(
            self._breakdown(left, steps=False), self._breakdown(right, steps=False)
        )
        return kernels_frame, categories

    @contextmanager
    def _session(
        self, *selections: Selection, tables: Iterable[str] | None = None
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

    def trace_listing(self, job: str | None = None) -> QueryResult:
        """What ``tracelake traces`` lists: one row per trace (of ``job``), with its run and the ranks it holds."""
        sql, params = overview.TRACE_LISTING, []
        if job:
            sql += " WHERE job = ?"
            params.append(job)
        result = self.query(sql + " ORDER BY job, rank, source_name", params)
        run_of = {t["trace_id"]: t["run"] for t in self.traces(job)}  # docs/analyses.md, "Runs within a job"
        return QueryResult([*result.columns[:2], "run", *result.columns[2:]], [*result.types[:2], "VARCHAR",
                           *result.types[2:]], [(*row[:2], run_of.get(row[0]), *row[2:]) for row in result.rows])

    def rank_summary(self, job: str) -> pl.DataFrame:
        """Per rank of ``job``: steps, device ops, op time per category and mean step time (:mod:`.overview`)."""
        con = self.connect()
        try:
            return overview.rank_summary(con, job)
        finally:
            con.close()

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
        frame = self.registry.frame()
        return self._runs.with_run(select_traces(frame, job=job, labels=labels, since=since, until=until), frame)

    def delete(self, trace_id: str) -> str:
        """Remove a trace and all its rows from the warehouse; returns the job it was in.

        Its registration goes first, so queries stop seeing it at once. ``trace_id`` may be a unique prefix.
        """
        job, trace_id = selections.trace(self.store, trace_id)
        try:
            self.store.remove(job, trace_id)
        except OSError as exc:
            raise WarehouseError(f"cannot delete trace {trace_id}: {exc}") from exc
        return job

    def check(self, *, repair: bool = False, stale_after: float = STALE_AFTER) -> CheckReport:
        """Verify traces, files, schemas and the catalog; ``repair`` tidies up, quarantines, rewrites the catalog.

        Registered traces are never rewritten. ``stale_after``: seconds without a write after
        which a staging folder counts as left over. See :mod:`.check`.

        Raises:
            WarehouseError: a file cannot be read or removed.
        """
        try:
            return check_warehouse(self.store, repair=repair, stale_after=stale_after)
        except OSError as exc:
            raise WarehouseError(f"cannot check warehouse {self.home}: {exc}") from exc

    def query_readonly(self, sql: str, *, max_rows: int | None = None) -> QueryResult:
        """One untrusted query as the API runs it: checked, in a sandboxed worker, under the ``sql_*`` limits.

        Raises:
            QueryError: not one allowed query, DuckDB's error, or past a limit (:class:`QueryLimit`).
            Unavailable: no worker could be started (no OS sandbox).
        """
        return query_once(self.store, self.settings, sql, max_rows=max_rows)

    def sql_engine(self) -> SqlEngine:
        """Sandboxed SQL worker processes over this warehouse, kept started (the server's; call ``start``)."""
        return SqlEngine(self.store, self.settings)

    def query_local(self, sql: str, *, out: Path | None = None) -> QueryResult:
        """``tracelake sql``: the API's checks, the user's own files readable, nothing writable but ``out``.

        Raises:
            QueryError: not one allowed query, or DuckDB's error.
            InvalidArgument: ``out`` is not a .parquet/.csv/.json file outside the warehouse.
        """
        return local_query(self.store, self.settings, sql, out=out)

    def trace(self, trace_id: str) -> dict[str, Any]:
        """One trace's registry row, by id or unique prefix (one file read: as fast with 10,000 traces as with one)."""
        job, trace_id = selections.trace(self.store, trace_id)
        rows = self.store.read("traces", [(job, trace_id)]).to_pylist()
        if not rows:
            raise NotFound(f"no trace with id {trace_id!r}")
        row = rows[0]
        row["labels"] = dict(row["labels"] or [])
        row["run"] = self._runs.run_of(self.registry.frame(), trace_id)
        return {"trace_id": trace_id, "job": job, **{k: v for k, v in row.items() if k != "trace_id"}}
