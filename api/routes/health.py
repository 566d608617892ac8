"""``/healthz`` and ``/metrics``: for load balancers and Prometheus.

``/healthz`` runs on the event loop itself, never on the thread pool that blocking
routes share, so that it answers however busy that pool is; it waits for nothing
(the ingest queue keeps its depth as a count that is read without a lock).
"""

from __future__ import annotations

import functools

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse

from tracelake.warehouse.core import tracelake_version

from ..deps import Read, State, server
from ..models import Health

router = APIRouter(tags=["server"])


@functools.cache
def _version() -> str:
    return tracelake_version()  # reads package metadata from disk: once


@router.get("/healthz", response_model=Health, summary="Is the server up")
async def healthz(request: Request) -> Health:
    """Answers 200 while the server runs (no token needed), at once, however busy the server is."""
    return Health(status="ok", version=_version(), queue_depth=server(request).queue.depth())


@router.get("/metrics", response_class=PlainTextResponse, dependencies=[Read], summary="Prometheus metrics")
def metrics(state: State) -> PlainTextResponse:
    """Uploads, bytes, ingest durations and outcomes, queue depth, requests: Prometheus text format."""
    return PlainTextResponse(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")
