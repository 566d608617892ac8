"""What every route shares: the server state, and the token check as a dependency per scope."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from tracelake.warehouse import Warehouse

from .auth import Tokens, require
from .ingest_queue import IngestQueue
from .job_cache import JobAnalyses
from .metrics import Metrics
from .scheduler import ReportScheduler
from .settings import ServerSettings
from .sql_gate import SqlGate

#: Documents the bearer scheme in the OpenAPI schema; the check itself is :class:`Tokens`.
bearer = HTTPBearer(auto_error=False, description="An API token: `Authorization: Bearer <token>`.")


@dataclass
class ServerState:
    """One server's warehouse, tokens, ingest queue, metrics, prepared job analyses and report schedule."""

    settings: ServerSettings
    warehouse: Warehouse
    tokens: Tokens
    queue: IngestQueue
    metrics: Metrics
    analyses: JobAnalyses
    #: Runs SQL queries in sandboxed worker processes.
    sql: SqlGate
    #: Makes the scheduled fleet reports; None without ``report_schedule``.
    scheduler: ReportScheduler | None = None


def server(request: Request) -> ServerState:
    """The state of the app serving ``request``."""
    state: ServerState = request.app.state.tracelake
    return state


async def _server(request: Request) -> ServerState:
    """:func:`server` as a dependency, on the event loop (a sync dependency would take a pool thread)."""
    return server(request)


State = Annotated[ServerState, Depends(_server)]


def scope(name: str) -> Callable[..., Awaitable[None]]:
    """A dependency that lets a request through only with a token granting ``name``."""

    async def check(  # on the event loop: a token check never waits for the thread pool
        state: State, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
    ) -> None:
        header = f"{credentials.scheme} {credentials.credentials}" if credentials is not None else None
        require(state.tokens.scopes(header), name)

    check.__name__ = f"needs_{name}_scope"
    return check


Read = Depends(scope("read"))
Write = Depends(scope("write"))
Admin = Depends(scope("admin"))
