"""Uploads on a background thread, for the profiler hooks: the training thread only hands a file over.

:class:`BackgroundUploader` owns one daemon thread and a bounded queue. ``submit`` never blocks and
never raises: it puts the file on the queue (or, when the queue is full, straight into the spool).
The thread gzips what asks for it, uploads with :class:`~tracelake.client.Client` (a few quick
retries), and keeps in the spool (:mod:`tracelake.client.spool`) whatever the server did not
confirm. After a connection failure it spools without trying for ``cooldown`` seconds, so a down
server costs the queue one round of retries, not one per trace. At interpreter exit every uploader
drains (``drain_timeout`` seconds at most) and spools what is left, so a short script's last trace
is not lost. Nothing here raises into the caller's thread; problems are logged under ``tracelake``.
The behaviour is described in docs/integrations/pytorch.md.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import shutil
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass, replace
from pathlib import Path

from tracelake.contracts.errors import ServerError

from .core import Client
from .spool import add_to_spool, default_spool, gzip_file

__all__ = ["BackgroundUploader", "flush", "shared_uploader"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Item:
    path: Path
    job: str
    labels: dict[str, str]
    #: Gzip ``path`` to this name (on the background thread) before sending it.
    gzip_as: str | None
    #: The file is ours (a temporary export): removed once sent or spooled. Else the user's: copied, never removed.
    owned: bool


class BackgroundUploader:
    """A daemon thread that uploads handed-over trace files, spooling what the server does not confirm.

    Args:
        url: The server (default ``$TRACELAKE_URL``, as :class:`~tracelake.client.Client`).
        token: Its token (default ``$TRACELAKE_TOKEN``).
        spool: Where unsent traces are kept (default :func:`~tracelake.client.spool.default_spool`).
        retries: Tries again per request before a trace is spooled (the backoff starts at ``backoff`` s).
        queue_size: Traces that may wait for the thread; past that, they go to the spool at once.
        cooldown: Seconds after a connection failure during which traces are spooled without trying.
        drain_timeout: The longest wait at interpreter exit for the queue to empty.
    """

    def __init__(self, url: str | None = None, token: str | None = None, *, spool: str | Path | None = None,
                 retries: int = 3, backoff: float = 0.5, timeout: float = 60.0, queue_size: int = 8,
                 cooldown: float = 30.0, drain_timeout: float = 60.0) -> None:
        self.url, self.token = url, token
        self.spool = Path(spool).expanduser() if spool is not None else default_spool()
        self.retries, self.backoff, self.timeout = retries, backoff, timeout
        self.cooldown, self.drain_timeout = cooldown, drain_timeout
        #: What became of the traces: ``sent``, ``present`` (the server had it), ``spooled``, ``lost``.
        self.counts = {"sent": 0, "present": 0, "spooled": 0, "lost": 0}
        #: Ids of the threads that ran uploads (only ever this uploader's own; the tests and benchmark check it).
        self.upload_threads: set[int] = set()
        self._queue: queue.Queue[_Item] = queue.Queue(queue_size)
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._pending = 0
        self._current: _Item | None = None
        self._thread: threading.Thread | None = None
        self._client: Client | None = None
        self._down_until = 0.0
        self._staging: Path | None = None
        self._pid = os.getpid()  # a forked child (a DataLoader worker) has the object but not the thread
        _LIVE.add(self)

    def __repr__(self) -> str:
        return f"BackgroundUploader(url={self.url!r}, spool={str(self.spool)!r})"

    def staging(self) -> Path:
        """A private temporary folder for exports on their way (made on first use)."""
        with self._lock:
            if self._staging is None or not self._staging.is_dir():
                self._staging = Path(tempfile.mkdtemp(prefix="tracelake-staging-"))
            return self._staging

    def submit(self, path: str | Path, *, job: str = "default", labels: dict[str, str] | None = None,
               gzip_as: str | None = None, owned: bool = False) -> bool:
        """Hand a trace file to the background thread; never blocks, never raises.

        Args:
            path: The file.
            job: The job to file it under.
            labels: Its labels.
            gzip_as: Gzip it to this name first (on the background thread), e.g. ``rank-0.4.pt.trace.json.gz``.
            owned: The file is a temporary one of ours, to remove once sent or spooled (else it is left as it is).

        Returns:
            True when queued; False when the queue was full and the file went to the spool directly
            (as it is, not gzipped, to keep the caller's thread quick) or could not be handled.
        """
        queued = False
        try:
            item = _Item(Path(path), job, dict(labels or {}), gzip_as, owned)
            with self._lock:
                self._pending += 1
            try:
                with self._lock:
                    if self._thread is None or not self._thread.is_alive():
                        self._thread = threading.Thread(target=self._run, name="tracelake-uploader", daemon=True)
                        self._thread.start()
                self._queue.put_nowait(item)
                queued = True
                return True
            except queue.Full:
                log.warning("the upload queue is full (%d traces waiting): %s goes to the spool %s as it is",
                            self._queue.maxsize, item.path.name, self.spool)
                self._spool(replace(item, gzip_as=_plain_name(item.gzip_as) if item.gzip_as else None),
                            compress=False)
                return False
            finally:
                if not queued:
                    self._finished()
        except Exception:  # the training loop must go on whatever happens here
            log.exception("could not hand %s to the uploader", path)
            return False

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every trace handed over is sent or spooled; False if ``timeout`` seconds ran out first."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def close(self, timeout: float | None = None) -> bool:
        """Flush (``timeout``: default ``drain_timeout``), then spool whatever is still waiting; False if anything was.

        The trace being uploaded, if any, is copied into the spool too: the server ingests nothing
        twice, so one both sent and spooled costs only a skipped file at the next ``push --spool``.
        """
        if self.flush(self.drain_timeout if timeout is None else timeout):
            return True
        left = []
        while True:
            try:
                left.append(self._queue.get_nowait())
            except queue.Empty:
                break
        current = self._current
        for item in left + ([current] if current is not None and current.path.is_file() else []):
            try:
                self._spool(item, copy=item is current)
            except Exception:
                log.exception("could not spool %s at exit", item.path)
        for _ in left:
            self._finished()
        log.warning("%d traces were still waiting at exit; they are in the spool %s (`tracelake push --spool`)",
                    len(left) + (current is not None), self.spool)
        return False

    # -- the background thread -------------------------------------------------------------------------------------

    def _run(self) -> None:
        _lower_priority()
        while True:
            item = self._queue.get()
            self._current = item
            try:
                self._handle(item)
            except Exception:
                log.exception("the uploader failed on %s", item.path)
            finally:
                self._current = None
                self._finished()

    def _handle(self, item: _Item) -> None:
        if item.gzip_as is not None:
            folder = Path(tempfile.mkdtemp(dir=self.staging()))
            gzip_file(item.path, folder / item.gzip_as)
            if item.owned:
                item.path.unlink(missing_ok=True)
            item = self._current = _Item(folder / item.gzip_as, item.job, item.labels, None, True)
        if time.monotonic() < self._down_until:
            self._spool(item)
            return
        self.upload_threads.add(threading.get_ident())
        try:
            if self._client is None:
                self._client = Client(self.url, self.token, retries=self.retries, backoff=self.backoff,
                                      timeout=self.timeout, max_delay=5.0)
            # a fresh export the server cannot have: no trace id to compute and ask for first (push --spool asks)
            report = self._client.upload(item.path, job=item.job, labels=item.labels, ask_first=not item.owned)
        except ServerError as exc:
            if exc.status is None or exc.status >= 500:
                self._down_until = time.monotonic() + self.cooldown
            log.warning("could not upload %s: %s; it is kept in the spool %s for `tracelake push --spool`",
                        item.path.name, exc, self.spool)
            self._spool(item)
            return
        if report.ok and report.items:
            self.counts["sent" if report.items[0].sent else "present"] += 1
            log.debug("uploaded %s as %s (%s)", item.path.name, report.items[0].trace_id, report.items[0].status)
            if item.owned:
                _remove(item.path)
            return
        reason = "; ".join(str(i.error) for i in report.failed) or "the server recognised no trace in it"
        log.error("the server refused %s: %s; it is kept in the spool %s", item.path.name, reason, self.spool)
        self._spool(item)

    def _spool(self, item: _Item, *, compress: bool | None = None, copy: bool = False) -> None:
        """Keep ``item`` in the spool (gzipping it first if it asks for that and ``compress`` allows)."""
        gzip_now = item.gzip_as is not None if compress is None else compress
        try:
            entry = add_to_spool(self.spool, item.path, job=item.job, labels=item.labels, name=item.gzip_as,
                                 compress=gzip_now, move=item.owned and not copy)
        except OSError as exc:
            self.counts["lost"] += 1
            log.error("could not keep %s in the spool %s: %s; the trace is lost", item.path.name, self.spool, exc)
            return
        self.counts["spooled"] += 1
        log.info("spooled %s in %s", item.path.name, entry)
        if item.owned and not copy:
            _remove(item.path)

    def _finished(self) -> None:
        with self._idle:
            self._pending -= 1
            if self._pending <= 0:
                self._idle.notify_all()


def _lower_priority() -> None:
    """Nice this thread (Linux schedules threads on their own): where cores are short, training goes first."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
    except (AttributeError, OSError):
        pass  # not Linux, or not allowed: the uploader runs at the process's priority


def _plain_name(gzip_name: str) -> str:
    return gzip_name[: -len(".gz")] if gzip_name.endswith(".gz") else gzip_name


def _remove(path: Path) -> None:
    """Remove a file of ours, and its folder when that was made for it alone (a staging folder)."""
    path.unlink(missing_ok=True)
    try:
        path.parent.rmdir()
    except OSError:
        pass  # not empty, or not ours to remove


#: Every uploader alive, drained at interpreter exit.
_LIVE: weakref.WeakSet[BackgroundUploader] = weakref.WeakSet()
#: The uploaders the hooks share, one per (url, token, spool, retries): one thread each, however often a hook is made.
_SHARED: dict[tuple[str | None, str | None, str | None, int], BackgroundUploader] = {}
_SHARED_LOCK = threading.Lock()


def shared_uploader(url: str | None = None, token: str | None = None, spool: str | Path | None = None,
                    retries: int = 3) -> BackgroundUploader:
    """The uploader of this server, token, spool and retries, made on first use (the hooks use it)."""
    key = (url, token, str(spool) if spool is not None else None, retries)
    with _SHARED_LOCK:
        uploader = _SHARED.get(key)
        if uploader is None:
            uploader = _SHARED[key] = BackgroundUploader(url, token, spool=spool, retries=retries)
        return uploader


def flush(timeout: float | None = None) -> bool:
    """Wait until every uploader has sent or spooled what it was handed; False if ``timeout`` seconds ran out first."""
    deadline = None if timeout is None else time.monotonic() + timeout
    done = True
    for uploader in list(_LIVE):
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        done = uploader.flush(left) and done
    return done


@atexit.register
def _drain_at_exit() -> None:
    for uploader in list(_LIVE):
        if uploader._pid != os.getpid():
            continue
        try:
            uploader.close()
        except Exception:
            log.exception("could not drain %r at exit", uploader)
        if uploader._staging is not None:
            shutil.rmtree(uploader._staging, ignore_errors=True)
