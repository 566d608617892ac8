"""Where per-file ingest tasks run: this thread, worker processes, one background thread, or a Dask cluster.

Every caller that ingests files goes through one abstraction, :class:`IngestExecutor`:

* ``Warehouse.ingest`` picks one with :func:`executor_for`: :class:`InlineExecutor` (one
  worker: this thread, with byte-level progress), :class:`ProcessExecutor` (``workers`` > 1)
  or, given a Dask client, :class:`~tracelake.warehouse.distributed.DaskExecutor`; then
  :func:`ingest_all` collects the results in input order.
* The server's ingest queue uses :func:`local_executor` (``ingest_workers`` processes, or
  one thread of the server with ``ingest_workers=0``) and :meth:`PoolExecutor.submit`, whose
  futures it follows one by one.

Each file is one :class:`IngestTask`, run by :func:`ingest_in_process` (locally) or staged by a
Dask task and published by the client (:mod:`.distributed`). A file whose worker died is a
failed result, never an exception: the other files go on.
"""

from __future__ import annotations

import logging
import multiprocessing
from collections.abc import Iterator, Sequence
from concurrent.futures import BrokenExecutor, Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from tracelake.contracts.status import IngestStatus

from .results import IngestProgress, IngestReport, IngestResult, report_whole_file
from .settings import Settings

if TYPE_CHECKING:
    from distributed import Client as DaskClient

    from .core import Warehouse

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class IngestTask:
    """One input file to ingest, with what its trace is registered under."""

    path: Path
    job: str
    labels: dict[str, str] | None = None
    #: The name recorded in the warehouse instead of the path (the server's uploads).
    source_name: str | None = None
    #: The file's content id where the caller hashed it already (the server hashes uploads as they arrive):
    #: it must be ``ingest.content_id`` of the file; the file is then not hashed again.
    trace_id: str | None = None


class IngestExecutor(Protocol):
    """Runs ingest tasks somewhere and hands back their results as they complete."""

    def run(
        self, tasks: Sequence[IngestTask], progress: IngestProgress | None = None
    ) -> Iterator[tuple[IngestTask, IngestResult]]:
        """Ingest every task; yield each with its result as it finishes (a dead worker: a failed result).

        ``progress`` hears of each file (its start, bytes and end) in the order files finish.
        Tasks not finished when the caller stops iterating are cancelled where they can be.
        """
        ...

    def shutdown(self, *, wait: bool = True, cancel_futures: bool = False) -> None:
        """Release the workers; ``wait`` for running tasks, ``cancel_futures`` drops queued ones."""
        ...


def ingest_in_process(
    settings: Settings, path: Path, job: str, labels: dict[str, str] | None, source_name: str | None = None,
    trace_id: str | None = None,
) -> IngestResult:
    """Ingest one file with a warehouse opened from ``settings`` (a picklable entry point for worker processes)."""
    from .core import Warehouse  # the facade imports this module

    return Warehouse(settings=settings).ingest_file(path, job=job, labels=labels, source_name=source_name,
                                                    trace_id=trace_id)


def ingest_all(
    executor: IngestExecutor, tasks: Sequence[IngestTask], progress: IngestProgress | None = None
) -> IngestReport:
    """Run ``tasks`` on ``executor``; the report lists their results in task order."""
    results = {task.path: result for task, result in executor.run(tasks, progress)}  # paths are distinct
    return IngestReport([results[task.path] for task in tasks])


def executor_for(warehouse: Warehouse, files: int, *, workers: int = 1,
                 client: DaskClient | None = None) -> IngestExecutor:
    """How ``Warehouse.ingest`` runs ``files`` files: on Dask with a ``client``, else ``workers`` processes, else here.

    Each worker process gets its share of the warehouse's DuckDB ``threads``.
    """
    if client is not None:
        from .distributed import DaskExecutor  # on use: it imports this module, and Dask itself is optional

        return DaskExecutor(warehouse, client)
    if workers > 1 and files > 1:
        threads = max(1, warehouse.settings.threads // min(workers, files))
        settings = replace(warehouse.settings.base(), home=warehouse.home, threads=threads)
        return ProcessExecutor(settings, workers)
    return InlineExecutor(warehouse)


def local_executor(settings: Settings, workers: int) -> PoolExecutor:
    """The server's executor: ``workers`` processes side by side, or with 0, one thread of this process."""
    if workers > 0:
        return ProcessExecutor(settings, workers)
    return ThreadExecutor(settings)  # tests, small set-ups


class InlineExecutor:
    """Ingests the tasks one after the other in the calling thread, reporting progress byte by byte."""

    def __init__(self, warehouse: Warehouse) -> None:
        self.warehouse = warehouse

    def run(
        self, tasks: Sequence[IngestTask], progress: IngestProgress | None = None
    ) -> Iterator[tuple[IngestTask, IngestResult]]:
        """Ingest each task in turn (see :meth:`IngestExecutor.run`)."""
        for task in tasks:
            if progress is not None:
                progress.file_started(task.path)
            on_bytes = progress.advance if progress is not None else None
            result = self.warehouse.ingest_file(task.path, job=task.job, labels=task.labels,
                                                source_name=task.source_name, on_bytes=on_bytes,
                                                trace_id=task.trace_id)
            if progress is not None:
                progress.file_done(result)
            yield task, result

    def shutdown(self, *, wait: bool = True, cancel_futures: bool = False) -> None:
        """Nothing to release."""


class PoolExecutor:
    """Runs :func:`ingest_in_process` on a ``concurrent.futures`` pool; a broken pool is replaced."""

    def __init__(self, settings: Settings) -> None:
        #: What each task opens the warehouse with.
        self.settings = settings
        self._pool = self._new_pool()

    def _new_pool(self) -> Executor:
        raise NotImplementedError

    def submit(self, task: IngestTask) -> Future[IngestResult]:
        """Start ``task``; its future holds the result, or the exception of a worker that died."""
        args = (self.settings, task.path, task.job, task.labels, task.source_name, task.trace_id)
        try:
            return self._pool.submit(ingest_in_process, *args)
        except BrokenExecutor:  # a worker died (killed, out of memory): start a fresh pool
            log.warning("an ingest worker died; starting new workers")
            self._pool.shutdown(wait=False, cancel_futures=False)
            self._pool = self._new_pool()
            return self._pool.submit(ingest_in_process, *args)

    def run(
        self, tasks: Sequence[IngestTask], progress: IngestProgress | None = None
    ) -> Iterator[tuple[IngestTask, IngestResult]]:
        """Submit every task, then yield each as it finishes (see :meth:`IngestExecutor.run`)."""
        futures = {self.submit(task): task for task in tasks}
        try:
            for future in as_completed(futures):
                task = futures[future]
                try:
                    result = future.result()
                except Exception as exc:  # a worker died: report the file, keep going
                    result = IngestResult(path=task.path, status=IngestStatus.FAILED, job=task.job,
                                          error=f"{task.path}: worker failed ({exc})")
                report_whole_file(progress, task.path, result)
                yield task, result
        finally:
            for future in futures:
                future.cancel()  # the caller stopped early: queued files are not ingested behind its back

    def shutdown(self, *, wait: bool = True, cancel_futures: bool = False) -> None:
        """Shut the pool down (see :meth:`IngestExecutor.shutdown`)."""
        self._pool.shutdown(wait=wait, cancel_futures=cancel_futures)


class ProcessExecutor(PoolExecutor):
    """Ingests in ``workers`` spawned processes side by side."""

    def __init__(self, settings: Settings, workers: int) -> None:
        self.workers = workers
        super().__init__(settings)

    def _new_pool(self) -> Executor:
        context = multiprocessing.get_context("spawn")  # no fork of a process holding DuckDB threads
        return ProcessPoolExecutor(max_workers=self.workers, mp_context=context)


class ThreadExecutor(PoolExecutor):
    """Ingests on one background thread of this process."""

    def _new_pool(self) -> Executor:
        return ThreadPoolExecutor(max_workers=1, thread_name_prefix="tracelake-ingest")
