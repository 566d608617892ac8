"""``/api/v1/jobs``: the jobs in the warehouse and every analysis of one job."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path as PathParam, Query
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from tracelake.warehouse import NotFound

from ..deps import Read, ServerState, State
from ..models import JOB, ErrorAnswer, JobAnalysis, JobList, JobSummary
from ..responses import encode

router = APIRouter(prefix="/api/v1/jobs", tags=["jobs"], dependencies=[Read])

#: Analyses kept ready to answer again while the job's traces are unchanged.
CACHE_ENTRIES = 128


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
) -> Response:
    """Breakdown per rank, findings (largest gain first), stragglers, top kernels, and the rest.

    Answers come from the analyses stored at ingest, and are kept ready while the
    job's traces stay the same.
    """
    key = _cache_key(state, job, top)
    body = state.cache.get(key)
    if body is None:
        body = await run_in_threadpool(_analysis_json, state, job, top)
        if len(state.cache) >= CACHE_ENTRIES:
            state.cache.pop(next(iter(state.cache)))
        state.cache[key] = body
    return Response(body, media_type="application/json")


def _cache_key(state: ServerState, job: str, top: int) -> tuple[object, ...]:
    """The job's traces and when their stored analyses were last written: a new, deleted or recomputed trace misses."""
    store = state.warehouse.store
    ids = store.job_traces(job)
    if not ids:
        raise NotFound(f"no traces in job {job!r}")
    stamps = []
    for trace_id in ids:
        try:
            stamps.append(store.path("breakdown", job, trace_id).stat().st_mtime_ns)
        except OSError:
            stamps.append(0)
    return ("job", job, top, tuple(ids), tuple(stamps))


def _analysis_json(state: ServerState, job: str, top: int) -> bytes:
    analysis = state.warehouse.analyze(job=job, top=top).as_dict()
    traces = len(state.warehouse.store.job_traces(job))
    main = {name: analysis.pop(name) for name in ("findings", "breakdown", "last_arrivals", "top_kernels")}
    return encode({"job": job, "traces": traces, **main, "analysis": analysis})
