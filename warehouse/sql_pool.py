"""SQL worker processes seen from the server or the CLI: start them, lend them out, stop them at a deadline.

Each worker (:mod:`.sql_worker`) is a process of its own that confines itself before its
first query, so what a query does (memory, files, time) is bounded by the operating
system and never by the server's own process: the server stays flat however a query
behaves. A :class:`SqlPool` keeps up to ``size`` workers started; a query borrows one
(:meth:`SqlPool.acquire`), and :class:`QueryStream` reads its answer while a watchdog
kills the worker if it outlives its deadline (DuckDB's own interrupt comes first; the
kill is for a query that does not listen). A worker that was killed, failed, or grew
is replaced by a fresh one.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import IO, Any

from tracelake.contracts.errors import QueryError, QueryMemoryLimit, QueryTimeout, Unavailable

log = logging.getLogger(__name__)

#: Seconds a worker has to start and close its sandbox.
START_SECONDS = 60.0
#: Seconds past a query's timeout before its worker is killed (DuckDB's interrupt should end it first).
KILL_GRACE_SECONDS = 2.0
#: The largest frame a worker may send (rows come in pieces of at most this size).
MAX_FRAME = 4 << 20
#: The frame kinds of the protocol (:mod:`.sql_worker`).
_KINDS = frozenset({b"R", b"H", b"D", b"E", b"X"})


@dataclass(frozen=True)
class WorkerSpec:
    """How a worker is started and confined (sent to it as its first line)."""

    #: Folders it may read (Landlock), besides the interpreter's own.
    read: tuple[str, ...]
    #: ``CREATE VIEW`` statements run before each query (trusted: built by tracelake).
    views: tuple[str, ...] = ()
    #: DuckDB threads per query.
    threads: int = 1
    #: Bytes it may map beyond its idle size (RLIMIT_DATA); None: no cap.
    memory_bytes: int | None = None
    #: DuckDB's own memory limit, below the cap so DuckDB fails first with its own message.
    duckdb_memory: int | None = None
    #: DuckDB's ``allowed_directories`` (external access off); None: DuckDB may open any file it can read.
    allowed_directories: tuple[str, ...] | None = None
    #: Folders it may write in (an export's scratch folder); none: no file may even grow.
    scratch: tuple[str, ...] = ()
    #: Refuse to start where the kernel has no Landlock.
    require_landlock: bool = True
    #: Lock DuckDB's configuration before the query (tests switch it off to reach the OS wall).
    lock: bool = True


class SqlWorker:
    """One started worker process and the pipes to it."""

    def __init__(self, spec: WorkerSpec) -> None:
        env = {"PATH": os.defpath, "LANG": "C.UTF-8", "HOME": "/nonexistent"}  # never the server's tokens
        if "TZ" in os.environ:
            env["TZ"] = os.environ["TZ"]
        self.process = subprocess.Popen(
            [sys.executable, "-I", "-B", "-m", "tracelake.warehouse.sql_worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, close_fds=True, cwd="/",
        )
        self.killed_for: str | None = None
        self.ready: dict[str, Any] = {}
        assert self.process.stdin is not None and self.process.stdout is not None
        self._in: IO[bytes] = self.process.stdin
        self._out: IO[bytes] = self.process.stdout
        watchdog = threading.Timer(START_SECONDS, self.kill, args=("start",))
        watchdog.daemon = True
        watchdog.start()
        try:
            self._write(asdict(spec))
            kind, payload = self.frame()
        except QueryError as exc:
            self.kill()
            raise Unavailable(f"SQL is unavailable: its worker process did not start ({exc})") from None
        finally:
            watchdog.cancel()
        info = json.loads(payload)
        if kind != b"R":
            self.kill()
            raise Unavailable(f"SQL is unavailable: {info.get('error') or 'its worker process did not start'}")
        self.ready = info

    @property
    def pid(self) -> int:
        return self.process.pid

    def request(self, payload: dict[str, Any]) -> None:
        """Send one query request."""
        self._write(payload)

    def frame(self) -> tuple[bytes, bytes]:
        """The next frame (kind, payload); :class:`QueryError` when the worker is gone or breaks the protocol.

        Frames are at most :data:`MAX_FRAME` bytes (the worker splits rows): a worker that
        announces more is killed, so nothing it sends can make the server hold more.
        """
        head = self._read(5)
        kind, length = head[:1], struct.unpack(">I", head[1:])[0]
        if kind not in _KINDS or length > MAX_FRAME:
            self.kill("protocol")
            raise QueryError("the SQL worker broke its protocol")
        return kind, self._read(length)

    def kill(self, reason: str = "stopped") -> None:
        """Stop the worker now (SIGKILL) and reap it."""
        if self.killed_for is None:
            self.killed_for = reason
        try:
            self.process.send_signal(signal.SIGKILL)
        except (ProcessLookupError, OSError):
            pass
        for stream in (self._in, self._out):
            try:
                stream.close()
            except OSError:
                pass
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL is not refused
            log.warning("SQL worker %d did not stop", self.pid)

    def _write(self, payload: dict[str, Any]) -> None:
        try:
            self._in.write(json.dumps(payload).encode() + b"\n")
            self._in.flush()
        except (OSError, ValueError):
            raise QueryError("the SQL worker is gone") from None

    def _read(self, size: int) -> bytes:
        data = bytearray()
        while len(data) < size:
            try:
                piece = self._out.read(size - len(data))
            except (OSError, ValueError):
                piece = b""
            if not piece:
                raise QueryError("the SQL worker is gone")
            data += piece
        return bytes(data)


class QueryStream:
    """One query's answer from one borrowed worker: :meth:`head`, then :meth:`chunks`, then :meth:`close`."""

    def __init__(self, pool: SqlPool, worker: SqlWorker, request: dict[str, Any], deadline: float) -> None:
        self.pool = pool
        self.worker = worker
        self.timeout = float(request.get("timeout") or 0)
        self.end: dict[str, Any] = {}
        self.deadline = deadline
        self._done = False
        self._watchdog = threading.Timer(deadline, worker.kill, args=("deadline",))
        self._watchdog.daemon = True
        self._watchdog.start()
        worker.request(request)

    def head(self) -> tuple[list[str], list[str]]:
        """The columns and their DuckDB types; raises the query's error instead when it failed."""
        kind, payload = self._next()
        info = json.loads(payload)
        if kind != b"H":
            self._fail(kind, info)
        return list(info["columns"]), list(info["types"])

    def chunks(self) -> Iterator[bytes]:
        """Rows as JSON arrays separated by commas, a frame at a time; :attr:`end` is set after the last."""
        while True:
            kind, payload = self._next()
            if kind == b"D":
                yield payload
                continue
            info = json.loads(payload)
            if kind != b"E":
                self._fail(kind, info)
            self.end = info
            self._done = True
            return

    def close(self) -> None:
        """Give the worker back (a fresh one replaces it if the answer was not read to its end)."""
        self._watchdog.cancel()
        reuse = self._done and not self.end.get("recycle") and self.worker.killed_for is None
        self.pool.release(self.worker, reuse=reuse)

    def __enter__(self) -> QueryStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _next(self) -> tuple[bytes, bytes]:
        try:
            return self.worker.frame()
        except QueryError:
            if self.worker.killed_for == "deadline":
                raise QueryTimeout(f"the query was stopped after {self.deadline:g} s: it ran past its "
                                   f"{self.timeout:g} s (TRACELAKE_SQL_TIMEOUT_SECONDS) and did not stop when "
                                   "asked, or its answer was not read in time") from None
            if self.worker.killed_for == "protocol":
                raise QueryError("the query's worker process broke its protocol and was stopped") from None
            try:
                code: int | None = self.worker.process.wait(5)
            except subprocess.TimeoutExpired:
                code = None
            self.worker.kill("died")
            if code is None or code == -signal.SIGKILL:
                raise QueryMemoryLimit("the query's worker process was killed: most likely the query needed more "
                                       "memory than TRACELAKE_SQL_MEMORY_LIMIT allows") from None
            how = f"signal {_signal_name(-code)}" if code < 0 else f"exit status {code}"
            raise QueryError(f"the query's worker process stopped ({how}); the server goes on") from None

    def _fail(self, kind: bytes, info: dict[str, Any]) -> None:
        self._done = kind == b"X"
        self.end = info
        message, what = str(info.get("error") or "the query failed"), info.get("kind")
        if what == "memory":
            raise QueryMemoryLimit(f"the query needed more memory than it may use (TRACELAKE_SQL_MEMORY_LIMIT): "
                                   f"{message}")
        if what == "timeout":
            raise QueryTimeout(f"query cancelled after {self.timeout:g} s (the limit is "
                               "TRACELAKE_SQL_TIMEOUT_SECONDS)")
        raise QueryError(message)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


class SqlPool:
    """Up to ``size`` started workers of one :class:`WorkerSpec`, lent out one query at a time."""

    def __init__(self, spec: WorkerSpec, size: int) -> None:
        if size < 1:
            raise ValueError("a SQL pool needs at least one worker")
        self.spec = spec
        self.size = size
        self._idle: list[SqlWorker] = []
        self._count = 0  # started or starting, lent or idle
        self._closed = False
        self._cond = threading.Condition()

    def prewarm(self) -> None:
        """Start workers in the background until ``size`` are up (so the first queries do not wait).

        A pool that was closed is open again.
        """
        with self._cond:
            self._closed = False
            missing = self.size - self._count
            self._count += max(missing, 0)
        for _ in range(max(missing, 0)):
            threading.Thread(target=self._start_idle, name="tracelake-sql-start", daemon=True).start()

    def acquire(self, timeout: float) -> SqlWorker:
        """A worker for one query, started if none is idle; waits up to ``timeout`` seconds for one.

        Raises:
            Unavailable: every worker stayed busy for ``timeout`` seconds.
            Unavailable: a worker could not be started (its sandbox failed).
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self._idle and self._count >= self.size:
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    raise Unavailable(f"all {self.size} SQL workers stayed busy for {timeout:g} s "
                                      "(TRACELAKE_SQL_WORKERS, TRACELAKE_SQL_QUEUE_SECONDS): try again shortly")
                self._cond.wait(left)
            if self._idle:
                return self._idle.pop()
            self._count += 1
        try:
            return SqlWorker(self.spec)
        except BaseException:
            with self._cond:
                self._count -= 1
                self._cond.notify()
            raise

    def release(self, worker: SqlWorker, *, reuse: bool) -> None:
        """Take a worker back: idle again, or killed and replaced in the background."""
        if reuse and not self._closed and worker.process.poll() is None:
            with self._cond:
                self._idle.append(worker)
                self._cond.notify()
            return
        worker.kill()
        with self._cond:
            self._count -= 1
            self._cond.notify()
        if not self._closed:
            self.prewarm()

    def query(self, request: dict[str, Any], *, queue_seconds: float) -> QueryStream:
        """Borrow a worker and start ``request`` on it; the stream gives the worker back when closed."""
        worker = self.acquire(queue_seconds)
        timeout = float(request.get("timeout") or 0)
        deadline = (2 * timeout + KILL_GRACE_SECONDS) if timeout else 365 * 86400.0
        try:
            return QueryStream(self, worker, request, deadline)
        except BaseException:
            self.release(worker, reuse=False)
            raise

    def idle_workers(self) -> int:
        """Workers started and waiting for a query (none once the pool is closed)."""
        with self._cond:
            return len(self._idle)

    def close(self) -> None:
        """Stop every idle worker; lent ones stop when they come back."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._count -= len(idle)
            self._cond.notify_all()
        for worker in idle:
            worker.kill()

    def _start_idle(self) -> None:
        try:
            worker = SqlWorker(self.spec)
        except (Unavailable, OSError) as exc:
            log.warning("cannot start a SQL worker: %s", exc)
            with self._cond:
                self._count -= 1
                self._cond.notify()
            return
        with self._cond:
            if self._closed:
                self._count -= 1
                worker_to_stop: SqlWorker | None = worker
            else:
                self._idle.append(worker)
                worker_to_stop = None
            self._cond.notify()
        if worker_to_stop is not None:
            worker_to_stop.kill()


__all__ = ["QueryStream", "SqlPool", "SqlWorker", "WorkerSpec"]
