"""``/api/v1/sql``: one read-only query over the warehouse views, in a sandboxed worker process.

The route never blocks the server: it waits for a worker on the event loop (at most
``sql_queue_seconds``, then 503), talks to the worker on threads of its own (one per
worker, never the pool other routes share), and streams the answer as it comes. Each
token has at most ``sql_per_token`` queries running or waiting (429 beyond); admission is
:mod:`..sql_gate`'s.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from fastapi.routing import APIRoute
from starlette.types import Receive, Scope, Send

from tracelake.warehouse.sql_pool import QueryStream

from ..deps import Read, State
from ..models import ErrorAnswer, SqlAnswer, SqlQuery
from ..sql_gate import SqlGate



class _JsonBody(APIRoute):
    """Reads the body as JSON whatever its Content-Type says (docs/api.md, "SQL").

    ``curl -d '{"sql": ...}'`` labels its body ``application/x-www-form-urlencoded``, and a body
    without the header is as plainly JSON: the one body this route takes is a JSON object.
    """

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def as_json(request: Request) -> Response:
            headers = [(k, v) for k, v in request.scope["headers"] if k != b"content-type"]
            request.scope["headers"] = [*headers, (b"content-type", b"application/json")]
            return await handler(Request(request.scope, request.receive))

        return as_json


router = APIRouter(prefix="/api/v1/sql", tags=["sql"], route_class=_JsonBody)


@router.post(
    "", response_model=SqlAnswer, dependencies=[Read], summary="Run a read-only SQL query",
    responses={
        400: {"model": ErrorAnswer, "description": "Not a single allowed query, DuckDB's error, or past a limit "
                                                   "(time, memory: the message names the setting)."},
        429: {"model": ErrorAnswer, "description": "This token runs as many queries as it may at once."},
        503: {"model": ErrorAnswer, "description": "Every SQL worker stayed busy, or SQL is unavailable here."},
    },
)
async def run_sql(state: State, request: Request, query: SqlQuery) -> StreamingResponse:
    """Run one `SELECT` over the warehouse views (`traces`, `device_ops`, `collectives`, ...; see docs/schema.md).

    The query runs in a worker process that can read the warehouse's tables and nothing
    else, write nothing, and use limited memory and time; at most `max_rows` rows (and
    the server's row and byte limits) come back, and `truncated_by` says which limit cut them.
    """
    gate = state.sql
    loop = asyncio.get_running_loop()
    client = _client_key(request)
    await gate.admit(client)  # 429 past sql_per_token, 503 past sql_queue_seconds
    stream: QueryStream | None = None
    try:
        stream = await loop.run_in_executor(gate.threads, functools.partial(gate.engine.stream, query.sql,
                                                                            max_rows=query.max_rows))
        columns, types = await loop.run_in_executor(gate.threads, stream.head)
    except BaseException:
        if stream is not None:
            await loop.run_in_executor(gate.threads, stream.close)
        gate.leave(client)
        raise
    opened = stream

    async def done() -> None:
        await loop.run_in_executor(gate.threads, opened.close)
        gate.leave(client)

    return _Answer(_body(gate, opened, {"columns": columns, "types": types}), done)


class _Answer(StreamingResponse):
    """A streamed answer that gives its worker back however it ends (finished, failed, client gone)."""

    def __init__(self, content: AsyncIterator[bytes], done: Callable[[], Awaitable[None]]) -> None:
        super().__init__(content, media_type="application/json")
        self._done: Callable[[], Awaitable[None]] | None = done

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            done, self._done = self._done, None
            if done is not None:
                await done()


async def _body(gate: SqlGate, stream: QueryStream, head: dict[str, list[str]]) -> AsyncIterator[bytes]:
    """The answer's JSON: the head, the rows a frame at a time as the worker sends them, the counts."""
    loop = asyncio.get_running_loop()
    chunks = stream.chunks()
    yield json.dumps(head)[:-1].encode() + b', "rows": ['
    while (piece := await loop.run_in_executor(gate.threads, next, chunks, None)) is not None:
        yield piece
    end = stream.end
    yield b"], " + json.dumps({"row_count": end.get("row_count", 0), "truncated": bool(end.get("truncated")),
                               "truncated_by": end.get("truncated_by")})[1:].encode()


def _client_key(request: Request) -> str:
    """Who runs a query, for the per-token limit: the token's digest (every client alike without tokens)."""
    header = request.headers.get("authorization", "")
    return hashlib.sha256(header.encode("utf-8", "replace")).hexdigest() if header else "anonymous"
