"""``/healthz`` and ``/metrics``: for load balancers and Prometheus.

``/healthz`` runs on the event loop itself, never on the thread pool that blocking
routes share, so that it answers however busy that pool is; it waits for nothing
(the ingest queue's depth is read on a thread, and the last one read is reported
while that read waits on the queue's lock).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import weakref

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse

from tracelake.warehouse.core import tracelake_version

from ..deps import Read, State, server
from ..ingest_queue import IngestQueue
from ..models import Health

router = APIRouter(tags=["server"])

#: Longest ``/healthz`` waits for the ingest queue's depth before answering with the last one read.
DEPTH_WAIT_SECONDS = 0.2


class _QueueDepth:
    """Reads an ingest queue's depth off the event loop, one read at a time, remembering the last answer."""

    def __init__(self) -> None:
        self.last = 0
        self._reading: asyncio.Future[int] | None = None

    async def read(self, queue: IngestQueue) -> int:
        """The queue's depth, or the last one read if the queue's lock is busy for more than a moment."""
        loop = asyncio.get_running_loop()
        if self._reading is None or self._reading.get_loop() is not loop:
            self._reading = loop.run_in_executor(None, queue.depth)
            self._reading.add_done_callback(self._done)  # before any waiter's: ``last`` is set when they wake
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._reading), DEPTH_WAIT_SECONDS)
        return self.last

    def _done(self, reading: asyncio.Future[int]) -> None:
        if reading is self._reading:
            self._reading = None
        if not reading.cancelled() and reading.exception() is None:
            self.last = reading.result()


#: One reader per ingest queue (so per app); it goes with its queue.
_depths: weakref.WeakKeyDictionary[IngestQueue, _QueueDepth] = weakref.WeakKeyDictionary()


@functools.cache
def _version() -> str:
    return tracelake_version()  # reads package metadata from disk: once


@router.get("/healthz", response_model=Health, summary="Is the server up")
async def healthz(request: Request) -> Health:
    """Answers 200 while the server runs (no token needed), at once, however busy the server is."""
    queue = server(request).queue
    depth = _depths.setdefault(queue, _QueueDepth())
    return Health(status="ok", version=_version(), queue_depth=await depth.read(queue))


@router.get("/metrics", response_class=PlainTextResponse, dependencies=[Read], summary="Prometheus metrics")
def metrics(state: State) -> PlainTextResponse:
    """Uploads, bytes, ingest durations and outcomes, queue depth, requests: Prometheus text format."""
    return PlainTextResponse(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")
