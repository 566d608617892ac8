"""Ingest and recompute on a Dask cluster (``dask.distributed``), for fleets one machine cannot keep up with.

Where the work runs follows the convention of Nsight Systems' recipes:

* ``--scheduler ADDRESS`` (or ``DASK_SCHEDULER_ADDRESS``): a running cluster
  (``dask scheduler`` plus ``dask worker`` processes);
* ``--workers N``: a ``LocalCluster`` of N worker processes on this machine;
* nothing: the in-process path, no Dask at all.

Each input file is one task: :func:`stage_task` parses it into a private
directory under the warehouse's ``staging/`` folder (its parsed tables, derived
tables and ``traces`` row) and returns the result. The client registers each
trace as its task finishes, by renaming the staged files into the table layout
(:func:`tracelake.warehouse.staging.publish_staged`), so workers never contend for
the catalog and only one process ever publishes. When a worker dies, Dask runs
its tasks again elsewhere; a retried task stages into a fresh directory, and the
client publishes each file once (a trace already registered is skipped), so no
trace is written twice or half. The run's staging folder, with whatever a killed
worker left in it, is removed at the end.

Workers must see the input files and the warehouse at the same paths as the
client (a shared file system), and have the same tracelake installed. Dask is an
optional dependency (``pip install 'tracelake[dask]'``), imported only here and
only when a cluster is asked for.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from tracelake.contracts.errors import InvalidArgument, TracelakeError, WarehouseError
from tracelake.contracts.status import IngestStatus

from . import staging
from .executor import IngestTask
from .results import IngestProgress, IngestResult, report_whole_file
from .settings import Settings
from .store import Store

if TYPE_CHECKING:
    from distributed import Client, Future

    from .core import Warehouse

log = logging.getLogger(__name__)

#: The environment variable that names a running Dask scheduler (Dask's and Nsight recipes' convention).
SCHEDULER_ENV = "DASK_SCHEDULER_ADDRESS"
#: Seconds to wait for a scheduler to answer before giving up.
CONNECT_TIMEOUT_S = 20
_INSTALL_HINT = "install it with: pip install 'tracelake[dask]'"


@dataclass(frozen=True)
class ClusterTarget:
    """Where ingest and recompute run: a scheduler's address, a LocalCluster of ``workers`` processes, or here."""

    scheduler: str | None = None
    workers: int | None = None

    @property
    def in_process(self) -> bool:
        """True when no cluster is asked for."""
        return self.scheduler is None and self.workers is None

    def describe(self) -> str:
        """A few words for messages: where the work runs."""
        if self.scheduler is not None:
            return f"the Dask cluster at {self.scheduler}"
        if self.workers is not None:
            return f"a local Dask cluster of {self.workers} worker processes"
        return "this process"


def resolve_target(scheduler: str | None, workers: int | None, environ: Mapping[str, str]) -> ClusterTarget:
    """Where to run, from the ``--scheduler`` and ``--workers`` options, then ``DASK_SCHEDULER_ADDRESS``.

    An option beats the environment; ``--workers 1`` (or less) means this process.

    Raises:
        InvalidArgument: both options were given.
    """
    if scheduler and workers is not None:
        raise InvalidArgument("give --scheduler (a running Dask cluster) or --workers (a local one), not both")
    if scheduler:
        return ClusterTarget(scheduler=scheduler.strip())
    if workers is not None:
        return ClusterTarget(workers=workers) if workers > 1 else ClusterTarget()
    address = environ.get(SCHEDULER_ENV, "").strip()
    return ClusterTarget(scheduler=address) if address else ClusterTarget()


def dask_available() -> bool:
    """True when ``dask.distributed`` can be imported."""
    try:
        return importlib.util.find_spec("distributed") is not None
    except (ImportError, ValueError):
        return False


def warehouse_path(location: str | Path) -> Path:
    """The directory a warehouse location names: a path, or a ``file://`` URL.

    The warehouse is published by renames and read by DuckDB globs, so it must
    be a file system every worker mounts at the same path (NFS, Lustre, a
    FUSE mount of a bucket). Other fsspec URLs are refused with a pointer to the
    docs rather than half supported.

    Raises:
        InvalidArgument: ``location`` is a URL of another scheme (``s3://``, ``gs://``, ``memory://``...).
    """
    text = str(location)
    # Path() folds "scheme://x" into "scheme:/x"; both spellings are URLs here.
    scheme, sep, rest = text.partition(":")
    if not sep or not rest.startswith("/") or len(scheme) < 2 \
            or not scheme.replace("+", "").replace("-", "").replace(".", "").isalnum():
        return Path(location)
    if scheme.lower() == "file":
        parts = urlsplit(text)
        if parts.netloc not in ("", "localhost"):
            raise InvalidArgument(f"{text}: a file:// URL must name a local path (file:///shared/warehouse)")
        return Path(unquote(parts.path))
    shown = text if rest.startswith("//") else f"{scheme}:/{rest}"
    raise InvalidArgument(
        f"{shown}: the warehouse must be a directory every worker mounts at the same path (or a file:// URL); "
        f"{scheme}:// object storage is not written directly: mount the bucket (s3fs, mountpoint-s3, gcsfuse) "
        "and give the mount point (docs/scale-out.md)"
    )


@contextmanager
def dask_client(target: ClusterTarget) -> Iterator[Client | None]:
    """A Dask client for ``target`` (None for in-process), closed (with its LocalCluster) on exit.

    Raises:
        InvalidArgument: Dask is not installed, or the scheduler cannot be reached.
    """
    if target.in_process:
        yield None
        return
    try:
        import distributed
    except ImportError:
        raise InvalidArgument(f"running on {target.describe()} needs Dask; {_INSTALL_HINT}") from None
    if target.scheduler is not None:
        try:
            client = distributed.Client(target.scheduler, timeout=CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError, ValueError) as exc:
            raise InvalidArgument(
                f"cannot reach the Dask scheduler at {target.scheduler} ({exc}); is `dask scheduler` running "
                f"there? (the address comes from --scheduler or {SCHEDULER_ENV})"
            ) from None
        with client:
            yield client
        return
    # One thread per worker: each task runs DuckDB with its own share of the cores.
    with distributed.LocalCluster(n_workers=target.workers, threads_per_worker=1, processes=True,
                                  dashboard_address=None, silence_logs=logging.ERROR) as cluster:
        with distributed.Client(cluster) as client:
            yield client


def stage_task(
    settings: Settings, path: Path, job: str, labels: dict[str, str] | None, staging_root: Path,
    source_name: str | None = None,
) -> staging.StagedTrace:
    """The Dask task of one input file: parse it into a staging directory under ``staging_root``.

    Pure as far as readers can tell: it reads the warehouse and writes only under
    ``staging_root``; the client publishes. Failures are in the result.
    """
    return staging.stage_file(Store(settings.home_path), settings, path, job=job, labels=labels,
                              source_name=source_name, staging_root=staging_root)


@dataclass
class _StagedDerived:
    """What a recompute task hands back: the staging directory, or why there is none."""

    staging: Path | None
    error: str | None = None


def recompute_task(settings: Settings, job: str, trace_id: str, staging_root: Path) -> _StagedDerived:
    """The Dask task of one trace's recompute: its derived tables into a staging directory."""
    try:
        return _StagedDerived(staging.stage_derived(Store(settings.home_path), settings, job, trace_id,
                                                    staging_root))
    except TracelakeError as exc:  # returned, not raised: the message must survive pickling as it is
        return _StagedDerived(None, str(exc))


class DaskExecutor:
    """The :class:`~.executor.IngestExecutor` of a Dask cluster: workers stage each file, this process publishes it.

    One Dask task per file (:func:`stage_task`) parses it into the run's staging folder; as
    each task finishes, the trace is registered here (renamed into the table layout), so only
    one process ever publishes. A file whose task failed for good (its workers kept dying) is
    a failed result, like a bad file. The client belongs to the caller and stays open.
    """

    def __init__(self, warehouse: Warehouse, client: Client) -> None:
        self.warehouse = warehouse
        self.client = client

    def run(
        self, tasks: Sequence[IngestTask], progress: IngestProgress | None = None
    ) -> Iterator[tuple[IngestTask, IngestResult]]:
        """Stage every task on the cluster, publish each here as it finishes (see :meth:`IngestExecutor.run`)."""
        settings = _task_settings(self.warehouse, self.client)
        store = self.warehouse.store
        with _run_folder(store, "ingest") as run:
            futures: dict[Future, IngestTask] = {}
            for i, task in enumerate(tasks):  # workers have another working directory: absolute paths
                future = self.client.submit(stage_task, settings, task.path.absolute(), task.job, task.labels,
                                            run.folder, task.source_name,
                                            key=f"tracelake-ingest-{run.id}-{i}", pure=False)
                futures[future] = task
            for future, value, error in _finished(futures):
                task = futures[future]
                path = task.path
                if error is not None:
                    result = IngestResult(path=path, status=IngestStatus.FAILED, job=task.job, error=f"{path}: {error}")
                else:
                    staged: staging.StagedTrace = value
                    # Name the file as the caller did, like the local path does.
                    if staged.result.error and path != path.absolute():
                        staged.result.error = staged.result.error.replace(str(path.absolute()), str(path))
                    staged.result.path = path
                    result = staging.publish_staged(store, staged)
                if result.error:
                    log.info("ingest failed: %s", result.error)
                report_whole_file(progress, path, result)
                yield task, result

    def shutdown(self, *, wait: bool = True, cancel_futures: bool = False) -> None:
        """Nothing to release: the run's tasks end with :meth:`run`, and the client is the caller's."""


def recompute_on_dask(
    warehouse: Warehouse,
    traces: Sequence[tuple[str, str]],
    client: Client,
    *,
    on_trace: Callable[[str], None] | None = None,
) -> int:
    """Recompute the derived tables of ``traces`` (``(job, trace_id)`` pairs) with one Dask task each.

    Every trace is tried; each is renamed into place here as its task finishes.

    Raises:
        WarehouseError: some traces could not be recomputed (the message names them).
    """
    settings = _task_settings(warehouse, client)
    errors: list[str] = []
    with _run_folder(warehouse.store, "recompute") as run:
        futures: dict[Future, tuple[str, str]] = {}
        for i, (job, trace_id) in enumerate(traces):
            future = client.submit(recompute_task, settings, job, trace_id, run.folder,
                                   key=f"tracelake-recompute-{run.id}-{i}", pure=False)
            futures[future] = (job, trace_id)
        for future, value, error in _finished(futures):
            job, trace_id = futures[future]
            staged: _StagedDerived | None = value
            if error is None and staged is not None and staged.staging is not None:
                try:
                    staging.publish_derived(warehouse.store, staged.staging, job, trace_id)
                except WarehouseError as exc:
                    error = str(exc)
            elif error is None:
                error = staged.error if staged is not None else "no result"
            else:
                error = f"cannot recompute trace {trace_id}: {error}"
            if error is not None:
                errors.append(error)
                continue
            if on_trace is not None:
                on_trace(trace_id)
    if errors:
        shown = "; ".join(errors[:5]) + (f"; and {len(errors) - 5} more" if len(errors) > 5 else "")
        raise WarehouseError(f"{len(errors)} of {len(traces)} traces could not be recomputed: {shown}")
    return len(traces)


def _task_settings(warehouse: Warehouse, client: Client) -> Settings:
    """The settings the tasks get: this warehouse's absolute home, no API tokens, DuckDB threads per worker.

    Workers of a LocalCluster share this machine's cores, so each task gets its
    share of ``threads``; workers of a remote cluster keep the setting as it is.
    """
    threads = warehouse.settings.threads
    if getattr(client, "cluster", None) is not None:  # a cluster this process started: same machine
        workers = max(1, len(client.scheduler_info().get("workers", {})))
        threads = max(1, threads // workers)
    return dataclasses.replace(warehouse.settings.base(), home=warehouse.home, threads=threads)


@dataclass(frozen=True)
class _Run:
    id: str
    folder: Path


@contextmanager
def _run_folder(store: Store, kind: str) -> Iterator[_Run]:
    """A staging folder for one distributed run, removed at the end with whatever dead workers left in it."""
    run_id = uuid.uuid4().hex[:12]
    folder = store.staging_root / f"dask-{kind}-{run_id}"
    try:
        folder.mkdir(parents=True)
    except OSError as exc:
        raise WarehouseError(f"cannot create a staging folder in {store.staging_root}: {exc.strerror or exc}") from exc
    try:
        yield _Run(run_id, folder)
    finally:
        store.discard(folder)


def _finished(futures: Mapping[Future, Any]) -> Iterator[tuple[Future, Any, str | None]]:
    """Each future as it finishes: ``(future, value, None)``, or ``(future, None, why it failed)``.

    Futures left unfinished (the caller stopped, or the client lost its scheduler)
    are cancelled, so that no task outlives the run.
    """
    from distributed import as_completed

    try:
        for future in as_completed(list(futures)):
            try:
                value = future.result()
            except Exception as exc:  # noqa: BLE001 - a task's failure is reported, not raised
                yield future, None, _task_failure(exc)
                continue
            yield future, value, None
    finally:
        pending = [f for f in futures if not f.done()]
        if pending:
            futures_client = pending[0].client
            futures_client.cancel(pending)


def _task_failure(exc: BaseException) -> str:
    """Why a task failed, for a person: Dask's KilledWorker gets a hint."""
    name = type(exc).__name__
    if name == "KilledWorker":
        return (f"the Dask workers running it kept dying ({exc}); a worker may lack memory for this file: "
                "give workers more (dask worker --memory-limit) or fewer threads")
    if name in ("CancelledError", "FutureCancelledError"):
        return "its Dask task was cancelled (did the scheduler go away?)"
    return f"Dask task failed ({name}: {exc})"
