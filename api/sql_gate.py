"""Admission to the server's SQL workers, on the event loop: a bounded queue, fair to every token.

* A token may have ``sql_per_token`` queries running or waiting at once; one more is a 429.
* A token runs at most ``sql_workers - 1`` of them at a time (when there are two workers or
  more), so one client never holds every worker and another always finds one free.
* A query waits at most ``sql_queue_seconds`` for a worker; then it is a 503.

Waiting costs a coroutine, never a thread: the routes that share the server's thread pool,
and ``/healthz`` (on the loop), never wait behind SQL. The workers' answers are read on
threads of their own, one per worker.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from tracelake.warehouse import Settings, TooManyRequests, Unavailable
from tracelake.warehouse.readonly import SqlEngine


@dataclass
class _Client:
    running: asyncio.Semaphore
    in_flight: int = 0


class SqlGate:
    """The server's SQL engine, who may use it when, and the threads that read its answers."""

    def __init__(self, engine: SqlEngine, settings: Settings) -> None:
        self.engine = engine
        self.size = engine.pool.size
        self.per_token = settings.sql_per_token
        self.running_per_token = max(1, self.size - 1)
        self.queue_seconds = settings.sql_queue_seconds
        self.threads = ThreadPoolExecutor(max_workers=self.size, thread_name_prefix="tracelake-sql")
        self._closed = False
        self._free: asyncio.Semaphore | None = None
        self._clients: dict[str, _Client] = {}

    def start(self) -> None:
        """Start the workers (in the background); called in the running event loop (the app's lifespan)."""
        if self._closed:  # started again after close(): new threads
            self.threads = ThreadPoolExecutor(max_workers=self.size, thread_name_prefix="tracelake-sql")
            self._closed = False
        self._free = asyncio.Semaphore(self.size)
        self._clients = {}
        self.engine.start()

    def close(self) -> None:
        """Stop the workers and the threads."""
        self.engine.close()
        self.threads.shutdown(wait=False, cancel_futures=True)
        self._closed = True

    async def admit(self, key: str) -> None:
        """Wait for a worker for client ``key`` (a token's digest); :meth:`leave` gives it back.

        Raises:
            TooManyRequests: the client has ``sql_per_token`` queries running or waiting.
            Unavailable: no worker became free within ``sql_queue_seconds``.
        """
        free = self._free if self._free is not None else asyncio.Semaphore(self.size)
        self._free = free
        client = self._clients.setdefault(key, _Client(asyncio.Semaphore(self.running_per_token)))
        if client.in_flight >= self.per_token:
            raise TooManyRequests(f"this token has {self.per_token} SQL queries running or waiting "
                                  "(TRACELAKE_SQL_PER_TOKEN): wait for one to finish")
        client.in_flight += 1
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.queue_seconds
        try:
            await asyncio.wait_for(client.running.acquire(), self.queue_seconds)
            try:
                await asyncio.wait_for(free.acquire(), max(deadline - loop.time(), 0.001))
            except BaseException:
                client.running.release()
                raise
        except BaseException as exc:
            self._forget(key, client)
            if isinstance(exc, TimeoutError):
                raise Unavailable(f"no SQL worker became free within {self.queue_seconds} s "
                                  f"({self.size} workers, TRACELAKE_SQL_QUEUE_SECONDS): try again shortly") from None
            raise

    def leave(self, key: str) -> None:
        """A query admitted by :meth:`admit` ended: its worker and its client's place are free again."""
        if self._free is not None:
            self._free.release()
        client = self._clients.get(key)
        if client is not None:
            client.running.release()
            self._forget(key, client)

    def _forget(self, key: str, client: _Client) -> None:
        client.in_flight -= 1
        if client.in_flight <= 0:
            self._clients.pop(key, None)


__all__ = ["SqlGate"]
