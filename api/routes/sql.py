"""``/api/v1/sql``: one read-only query over the warehouse views, sandboxed."""

from __future__ import annotations

from fastapi import APIRouter

from ..deps import Read, State
from ..models import ErrorAnswer, SqlAnswer, SqlQuery

router = APIRouter(prefix="/api/v1/sql", tags=["sql"])


@router.post(
    "", response_model=SqlAnswer, dependencies=[Read], summary="Run a read-only SQL query",
    responses={400: {"model": ErrorAnswer, "description": "Not a single query, DuckDB's error, or too slow."}},
)
def run_sql(state: State, query: SqlQuery) -> SqlAnswer:
    """Run one `SELECT` over the warehouse views (`traces`, `device_ops`, `collectives`, ...; see docs/schema.md).

    The query runs with no file or network access and locked settings, under a
    time limit; at most `max_rows` rows (and the server's limit) come back.
    """
    result = state.warehouse.query_readonly(query.sql, max_rows=query.max_rows)
    return SqlAnswer(columns=result.columns, types=result.types, rows=[list(r) for r in result.rows],
                     row_count=len(result.rows), truncated=result.truncated)
