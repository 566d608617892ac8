"""The REST API: ``create_app(settings)`` builds the FastAPI app that ``tracelake serve`` runs.

Routes are thin: each calls the :class:`~tracelake.warehouse.Warehouse` facade
(or the ingest queue in front of it) and maps :class:`TracelakeError` to an HTTP
status in one exception handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tracelake.warehouse import Settings, TracelakeError, Warehouse
from tracelake.warehouse.core import tracelake_version

from .auth import Tokens
from .deps import ServerState
from .errors import http_status
from .ingest_queue import IngestQueue
from .job_cache import JobAnalyses
from .metrics import Metrics
from .responses import FastJSONResponse
from .routes import health, jobs, reports, sql, traces
from .scheduler import ReportScheduler, schedule_of
from .settings import ServerSettings
from .sql_gate import SqlGate

log = logging.getLogger(__name__)

DESCRIPTION = """\
Upload ML profiler traces (PyTorch profiler / Kineto JSON, XLA `.xplane.pb`, NCCL
logs, nccl-tests output, Flight Recorder dumps), follow their ingestion, read each
job's analyses and reports (HTML), the fleet report, and query the warehouse with SQL.

Send `Authorization: Bearer <token>` when the server has tokens configured
(scopes: `read`, `write`, `admin`).
"""


def create_app(settings: Settings | None = None) -> FastAPI:
    """A FastAPI app over the warehouse in ``settings`` (default: from the environment).

    The ingest queue and, with ``report_schedule`` set, the scheduled fleet reports start
    with the app (its lifespan) and stop with it.

    Raises:
        InvalidArgument: the token settings cannot be read, or the report schedule is not valid.
    """
    settings = ServerSettings.of(settings) if settings is not None else ServerSettings.from_env()
    tokens = Tokens.from_settings(settings)
    warehouse = Warehouse(settings=settings)
    metrics = Metrics()
    analyses = JobAnalyses(warehouse)
    queue = IngestQueue(settings, metrics, on_job_ingested=analyses.warm)
    cron = schedule_of(settings)
    scheduler = ReportScheduler(warehouse, cron) if cron is not None else None
    sql_gate = SqlGate(warehouse.sql_engine(), warehouse.settings)
    state = ServerState(settings, warehouse, tokens, queue, metrics, analyses, sql_gate, scheduler)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        state.queue.start()
        state.sql.start()
        # read the registry of traces now, not on the first listing request
        threading.Thread(target=_load_registry, args=(warehouse,), name="tracelake-registry", daemon=True).start()
        schedule = asyncio.create_task(scheduler.run(), name="tracelake-reports") if scheduler else None
        try:
            yield
        finally:
            if schedule is not None:
                schedule.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await schedule
            state.queue.stop()
            state.sql.close()
            analyses.close()

    app = FastAPI(
        title="tracelake",
        version=tracelake_version(),
        description=DESCRIPTION,
        lifespan=lifespan,
        default_response_class=FastJSONResponse,
    )
    app.state.tracelake = state
    app.add_exception_handler(TracelakeError, _tracelake_error)  # type: ignore[arg-type]
    app.add_middleware(_RequestMetrics, metrics=metrics)
    for module in (traces, jobs, reports, sql, health):
        app.include_router(module.router)
    return app


def _load_registry(warehouse: Warehouse) -> None:
    try:
        warehouse.registry.frame()
    except (OSError, TracelakeError) as exc:
        log.warning("cannot read the registry of traces: %s", exc)


async def _tracelake_error(request: Request, exc: TracelakeError) -> JSONResponse:
    """Every tracelake error becomes its HTTP status with the message, never a traceback."""
    status = http_status(exc)
    if status >= 500:
        log.error("%s %s failed: %s", request.method, request.url.path, exc)
    headers = {"Retry-After": "1"} if status in (429, 503) else None  # busy, not broken: try again
    return JSONResponse({"error": str(exc), "kind": type(exc).__name__}, status_code=status, headers=headers)


class _RequestMetrics:
    """Counts each request by method, route template and status (pure ASGI: uploads stream through untouched).

    Labels never come from the request as sent: the route is the template of the app's route
    that matched (else ``unmatched``), the method one of :data:`~.metrics.HTTP_METHODS` (else
    ``other``), so no client can add label values to ``/metrics``.
    """

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    @staticmethod
    def _template(scope: Scope) -> str:
        route = scope.get("route")  # set by the router to one of the app's own route objects, never the path sent
        template = getattr(route, "path", None) if isinstance(route, BaseRoute) else None
        return template if isinstance(template, str) else "unmatched"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            self.metrics.request(scope["method"], self._template(scope), status, time.perf_counter() - started)


__all__ = ["create_app"]
