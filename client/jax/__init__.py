"""JAX profiler integration: upload a ``jax.profiler.trace`` run's profile (docs/integrations/jax.md).

::

    import tracelake.jax

    with tracelake.jax.trace("/tmp/profile", job="gemma-2b", labels={"team": "infra"}):
        train_step(state, batch).block_until_ready()

On exit (an exception included: a failed step's profile matters most), the newest run folder
``<log_dir>/plugins/profile/<run>/`` is found and this host's ``<host>.xplane.pb`` is handed to
the background uploader (:class:`tracelake.client.BackgroundUploader`), labelled
``process_index`` and ``process_count``; what the server does not take is kept in the spool for
``tracelake push --spool``. ``upload_profile(log_dir, job=...)`` does the same for a profile
written earlier. JAX is imported only when these are called.
"""

from __future__ import annotations

import logging
import shutil
import socket
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tracelake.client.uploader import flush, shared_uploader
from tracelake.contracts.errors import NotFound
from tracelake.contracts.names import check_job, check_labels

__all__ = ["flush", "newest_run", "trace", "upload_profile"]

log = logging.getLogger(__name__)


@contextmanager
def trace(log_dir: str | Path | None = None, *, job: str = "default", labels: Mapping[str, str] | None = None,
          url: str | None = None, token: str | None = None, spool: str | Path | None = None, retries: int = 3,
          **options: Any) -> Iterator[Path]:
    """``jax.profiler.trace(log_dir, **options)`` that uploads the profile when it ends; yields the log folder.

    Args:
        log_dir: Where JAX writes the profile (default: a temporary folder, removed once the profile is
            handed over).
        job, labels, url, token, spool, retries: As :func:`upload_profile`.
        options: Passed to ``jax.profiler.trace`` (``create_perfetto_trace``, ...).

    Errors in the upload are logged (logger ``tracelake``), never raised; those of the profiled code pass through.
    """
    import jax

    check_job(job)  # a bad name fails before profiling, not in the upload after it
    check_labels(labels or {})
    own = log_dir is None
    folder = Path(tempfile.mkdtemp(prefix="tracelake-jax-")) if log_dir is None else Path(log_dir)
    try:
        with jax.profiler.trace(str(folder), **options):
            yield folder
    finally:
        try:
            upload_profile(folder, job=job, labels=labels, url=url, token=token, spool=spool, retries=retries,
                           _move=own)
        except Exception:
            log.exception("could not hand the JAX profile in %s to tracelake", folder)
        if own:
            shutil.rmtree(folder, ignore_errors=True)


def upload_profile(log_dir: str | Path, *, job: str = "default", labels: Mapping[str, str] | None = None,
                   url: str | None = None, token: str | None = None, spool: str | Path | None = None,
                   retries: int = 3, _move: bool = False) -> list[Path]:
    """Hand this host's ``.xplane.pb`` of the newest run under ``log_dir`` to the background uploader.

    Each host (JAX process) uploads its own file: ``<hostname>.xplane.pb``, or every ``.xplane.pb``
    of the run when none bears this host's name. The labels get ``process_index`` and
    ``process_count`` (``jax.process_index()``/``process_count()`` when JAX is imported, else 0 and 1).

    Returns:
        The files handed over (sent or spooled on the background thread; ``tracelake.jax.flush()`` waits for them).

    Raises:
        NotFound: ``log_dir`` holds no profile run with an ``.xplane.pb``.
        InvalidArgument: ``job`` or a label key is not valid (contracts/names.py).
    """
    check_job(job)
    labels = check_labels(labels or {})
    run = newest_run(log_dir)
    host = socket.gethostname()
    files = sorted(run.glob(f"{host}.xplane.pb")) or sorted(run.glob("*.xplane.pb"))
    index, count = _process()
    tagged = {**{str(k): str(v) for k, v in (labels or {}).items()}, "process_index": str(index),
              "process_count": str(count)}
    uploader = shared_uploader(url, token, spool, retries)
    for path in files:
        if _move:  # a temporary log folder of ours: the file leaves it before the folder is removed
            moved = Path(tempfile.mkdtemp(dir=uploader.staging())) / path.name
            shutil.move(path, moved)
            path = moved
        uploader.submit(path, job=job, labels=tagged, owned=_move)
    return files


def newest_run(log_dir: str | Path) -> Path:
    """The newest ``<log_dir>/plugins/profile/<run>/`` folder that holds an ``.xplane.pb`` (or ``log_dir`` itself if it does).

    Raises:
        NotFound: there is none.
    """
    folder = Path(log_dir)
    if any(folder.glob("*.xplane.pb")):
        return folder
    runs = [p for p in (folder / "plugins" / "profile").glob("*") if p.is_dir() and any(p.glob("*.xplane.pb"))]
    if not runs:
        raise NotFound(f"{folder}: no profile run with an .xplane.pb under plugins/profile/ "
                       "(was it written by jax.profiler.trace or start_trace/stop_trace?)")
    return max(runs, key=lambda p: (p.stat().st_mtime, p.name))


def _process() -> tuple[int, int]:
    jax = sys.modules.get("jax")
    if jax is None:
        return 0, 1
    try:
        return int(jax.process_index()), int(jax.process_count())
    except Exception:  # a backend that cannot start: the labels are a courtesy
        return 0, 1
