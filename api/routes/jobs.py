"""``/api/v1/jobs``: the jobs in the warehouse and every analysis of one job."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path as PathParam, Query
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from ..deps import Read, State
from ..models import JOB, ErrorAnswer, JobAnalysis, JobList, JobSummary
from ..user_input import parse_speedups

router = APIRouter(prefix="/api/v1/jobs", tags=["jobs"], dependencies=[Read])


@router.get("", response_model=JobList, summary="List jobs")
def list_jobs(state: State) -> JobList:
    """Every job: traces, ranks, formats, bytes and time span, most recently ingested first."""
    return JobList(jobs=[JobSummary(**row) for row in state.warehouse.jobs()])


@router.get(
    "/{job}", summary="Every analysis of a job",
    responses={200: {"model": JobAnalysis}, 404: {"model": ErrorAnswer, "description": "No traces in this job."}},
)
async def get_job(
    state: State,
    job: Annotated[str, PathParam(pattern=JOB)],
    top: Annotated[int, Query(ge=1, le=100, description="How many kernels to rank.")] = 8,
    what_if: Annotated[list[str] | None, Query(
        max_length=220, description="Also replay every step with these device ops FACTOR times as fast: "
        "`TARGET=FACTOR`, a category (compute, communication, memory) or op names with * and ?, e.g. "
        "`what_if=gemm*=2`; repeatable, at most 8.")] = None,
) -> Response:
    """Breakdown per rank, findings (largest gain first), stragglers, top kernels, and the rest.

    Answers come from the analyses stored at ingest, and are kept ready while the
    job's traces stay the same (and prepared as soon as an upload's ingest is done).
    """
    body = await run_in_threadpool(state.analyses.get, job, top, parse_speedups(what_if))
    return Response(body, media_type="application/json")
