"""``/healthz`` and ``/metrics``: for load balancers and Prometheus."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse

from tracelake.warehouse.core import tracelake_version

from ..deps import Read, State
from ..models import Health

router = APIRouter(tags=["server"])


@router.get("/healthz", response_model=Health, summary="Is the server up")
def healthz(state: State) -> Health:
    """Answers 200 while the server runs (no token needed)."""
    return Health(status="ok", version=tracelake_version(), queue_depth=state.queue.depth())


@router.get("/metrics", response_class=PlainTextResponse, dependencies=[Read], summary="Prometheus metrics")
def metrics(state: State) -> PlainTextResponse:
    """Uploads, bytes, ingest durations and outcomes, queue depth, requests: Prometheus text format."""
    return PlainTextResponse(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")
