"""The server's background ingestion: uploaded files queued, ingested by worker processes, tracked by trace id.

Each upload lives in a private folder under ``$TRACELAKE_HOME/uploads`` with a
``manifest.json`` written once its files are checked; the folder goes away when
its last file is ingested. A server that stops (or dies) with uploads queued
finds their manifests at the next start and ingests them then: an accepted
upload is never lost. A folder without a manifest is an upload that never
completed, and is removed.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import logging
import os
import shutil
import threading
import time
import uuid
from collections import Counter, OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

from tracelake.contracts.status import IngestStatus, TaskStatus
from tracelake.warehouse import IngestResult
from tracelake.warehouse.executor import IngestTask, PoolExecutor, local_executor
from tracelake.warehouse.store import Store

from .metrics import Metrics
from .settings import ServerSettings

log = logging.getLogger(__name__)

#: Finished tasks remembered for ``GET /traces/{id}`` (failures especially; done ones are in the warehouse).
HISTORY = 10_000
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class QueuedFile:
    """One checked file of an upload, ready to ingest."""

    trace_id: str
    name: str  # the source name recorded in the warehouse
    path: Path


@dataclass
class Task:
    """The state of one trace's ingest, as ``GET /api/v1/traces/{id}`` reports it."""

    trace_id: str
    name: str
    job: str
    status: TaskStatus
    submitted_at: dt.datetime
    finished_at: dt.datetime | None = None
    error: str | None = None
    already_present: bool = False
    future: Future[IngestResult] | None = field(default=None, repr=False)

    @property
    def state(self) -> TaskStatus:
        """The status, with ``ingesting`` for a queued task a worker has picked up."""
        if self.status == TaskStatus.QUEUED and self.future is not None and self.future.running():
            return TaskStatus.INGESTING
        return self.status

    def as_dict(self) -> dict[str, object]:
        """The task as the API shows it."""
        return {
            "trace_id": self.trace_id,
            "name": self.name,
            "job": self.job,
            "status": self.state,
            "error": self.error,
            "submitted_at": self.submitted_at,
            "finished_at": self.finished_at,
            "already_present": self.already_present,
        }


class IngestQueue:
    """Ingests uploaded files in the background, one task per trace id."""

    def __init__(
        self, settings: ServerSettings, metrics: Metrics, on_job_ingested: Callable[[str], None] | None = None
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.on_job_ingested = on_job_ingested
        self.store = Store(settings.home_path)
        self.root = settings.home_path / "uploads"
        self._tasks: OrderedDict[str, Task] = OrderedDict()
        self._pending: Counter[Path] = Counter()  # files still to ingest, per upload folder
        self._changed = threading.Condition()
        self._queued = 0  # tasks whose status is "queued": kept as they change, so depth() never waits
        self._executor: PoolExecutor | None = None
        metrics.set_queue_depth(self.depth)

    # -- life cycle --------------------------------------------------------------------
    def start(self) -> None:
        """Start the workers and pick up uploads a previous server left queued."""
        self.root.mkdir(parents=True, exist_ok=True)
        # ingest_workers processes; 0: one thread of the server process (tests, small set-ups)
        self._executor = local_executor(self.settings.base(), self.settings.ingest_workers)
        self._recover()

    def stop(self) -> None:
        """Stop taking work; queued uploads stay on disk and are ingested at the next start."""
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None

    def new_folder(self) -> Path:
        """A private folder for one incoming upload."""
        folder = self.root / f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:12]}"
        folder.mkdir(parents=True)
        return folder

    # -- work --------------------------------------------------------------------------
    def submit(self, folder: Path, files: list[QueuedFile], job: str, labels: dict[str, str]) -> list[Task]:
        """Queue the checked ``files`` of the upload in ``folder``; one task per file, in order.

        A file whose trace is already in the warehouse, or already queued, is not
        ingested again: its task is the existing one.
        """
        _write_manifest(folder, files, job, labels)
        return self._enqueue(folder, files, job, labels)

    def _enqueue(self, folder: Path, files: list[QueuedFile], job: str, labels: dict[str, str]) -> list[Task]:
        if self._executor is None:
            raise RuntimeError("the ingest queue is not started")
        tasks: list[Task] = []
        now = dt.datetime.now(dt.timezone.utc)
        with self._changed:
            self._pending[folder] += 1  # held while queueing: a task that finishes at once must not remove the folder
            for item in files:
                current = self._tasks.get(item.trace_id)
                if current is not None and current.status == TaskStatus.QUEUED:
                    tasks.append(current)
                    continue
                present = self.store.registered_job(item.trace_id)
                if present is not None:
                    task = Task(item.trace_id, item.name, present, TaskStatus.DONE, now, now, already_present=True)
                    self._remember(task)
                    tasks.append(task)
                    continue
                task = Task(item.trace_id, item.name, job, TaskStatus.QUEUED, now)
                self._queued += 1
                self._remember(task)
                self._pending[folder] += 1
                task.future = self._submit(item, job, labels)
                task.future.add_done_callback(functools.partial(self._finished, folder, task))
                tasks.append(task)
            self._release(folder)
        return tasks

    def _submit(self, item: QueuedFile, job: str, labels: dict[str, str]) -> Future[IngestResult]:
        if self._executor is None:
            raise RuntimeError("the ingest queue is not started")
        # a dead worker's broken pool is replaced by the executor (PoolExecutor.submit)
        # hashed as it arrived: the worker does not hash it again
        return self._executor.submit(IngestTask(item.path, job, labels, item.name, item.trace_id))

    def _release(self, folder: Path) -> None:
        """One file of ``folder`` is done; remove the folder with its last one."""
        self._pending[folder] -= 1
        if self._pending[folder] <= 0:
            del self._pending[folder]
            shutil.rmtree(folder, ignore_errors=True)

    def _finished(self, folder: Path, task: Task, future: Future[IngestResult]) -> None:
        seconds = 0.0
        if future.cancelled():  # the server is stopping: the manifest brings it back at the next start
            return
        try:
            result = future.result()
            seconds = result.seconds
            outcome = result.status
            error = result.error
        except Exception as exc:  # a worker process died (out of memory, killed)
            outcome, error = IngestStatus.FAILED, f"{task.name}: the ingest worker failed ({exc}); upload the file again"
        self.metrics.ingest(outcome, seconds)
        with self._changed:
            if task.status == TaskStatus.QUEUED:
                self._queued -= 1
            task.status = TaskStatus.FAILED if outcome == IngestStatus.FAILED else TaskStatus.DONE
            task.error = error
            task.finished_at = dt.datetime.now(dt.timezone.utc)
            task.future = None
            self._release(folder)
            self._changed.notify_all()
            job_done = not any(t.job == task.job and t.status == TaskStatus.QUEUED for t in self._tasks.values())
        if error:
            log.info("ingest of %s failed: %s", task.name, error)
        elif job_done and outcome == IngestStatus.INGESTED and self.on_job_ingested is not None:
            self.on_job_ingested(task.job)

    def _remember(self, task: Task) -> None:
        self._tasks[task.trace_id] = task
        self._tasks.move_to_end(task.trace_id)
        while len(self._tasks) > HISTORY:
            oldest_id, oldest = next(iter(self._tasks.items()))
            if oldest.status == TaskStatus.QUEUED:  # never forget work in flight
                break
            del self._tasks[oldest_id]

    # -- reading -----------------------------------------------------------------------
    def task(self, trace_id: str) -> Task | None:
        """The task of a trace id this server has seen, if any."""
        with self._changed:
            return self._tasks.get(trace_id)

    def depth(self) -> int:
        """Files queued or being ingested; takes no lock (``/healthz`` reads it on the event loop)."""
        return self._queued

    def recount(self) -> tuple[int, int]:
        """:meth:`depth` and a recount of the tasks whose status is ``queued``, read at one moment (under the lock,
        so no task changes between the two); equal unless the kept depth went wrong. For checks: it waits for the
        lock, which :meth:`depth` never does."""
        with self._changed:
            return self._queued, sum(t.status == TaskStatus.QUEUED for t in self._tasks.values())

    def wait(self, trace_ids: list[str], timeout: float) -> bool:
        """Block until none of ``trace_ids`` is queued any more, or ``timeout`` seconds pass; True if all finished."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                busy = [i for i in trace_ids if (t := self._tasks.get(i)) is not None and t.status == TaskStatus.QUEUED]
                left = deadline - time.monotonic()
                if not busy:
                    return True
                if left <= 0:
                    return False
                self._changed.wait(left)

    # -- recovery ----------------------------------------------------------------------
    def _recover(self) -> None:
        for folder in sorted(p for p in self.root.iterdir() if p.is_dir()):
            manifest = _read_manifest(folder)
            if manifest is None:
                log.info("removing incomplete upload %s", folder.name)
                shutil.rmtree(folder, ignore_errors=True)
                continue
            files, job, labels = manifest
            log.info("resuming upload %s: %d file(s) for job %s", folder.name, len(files), job)
            self._enqueue(folder, files, job, labels)


def _write_manifest(folder: Path, files: list[QueuedFile], job: str, labels: dict[str, str]) -> None:
    doc = {
        "job": job,
        "labels": labels,
        "files": [{"trace_id": f.trace_id, "name": f.name, "path": str(f.path.relative_to(folder))} for f in files],
    }
    tmp = folder / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps(doc), encoding="utf-8")
    os.replace(tmp, folder / MANIFEST)


def _read_manifest(folder: Path) -> tuple[list[QueuedFile], str, dict[str, str]] | None:
    try:
        doc = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        files = [QueuedFile(f["trace_id"], f["name"], folder / f["path"]) for f in doc["files"]]
        return files, str(doc["job"]), {str(k): str(v) for k, v in doc["labels"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
