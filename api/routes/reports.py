"""Reports as HTML pages: ``/api/v1/jobs/{job}/report`` and ``/api/v1/reports/fleet``.

Each page is self-contained (plotly.js inline, nothing fetched), the same page
``tracelake report`` writes; the fleet report links every job to its report here.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any

from fastapi import APIRouter, Path as PathParam, Query, Request
from fastapi.responses import HTMLResponse

from tracelake.warehouse.fleet_report import parse_when
from tracelake.warehouse.store import parse_labels

from ..deps import Read, State
from ..models import JOB, ErrorAnswer
from ..reports import fleet_report, job_report

router = APIRouter(tags=["reports"], dependencies=[Read])

_HTML: dict[int | str, dict[str, Any]] = {200: {"content": {"text/html": {}}, "description": "The report page."}}
_WHEN = ("30m, 12h, 7d or 2w back from now, or an ISO date or datetime (UTC unless it says otherwise); "
         "by ingest time")


@router.get(
    "/api/v1/jobs/{job}/report", response_class=HTMLResponse, summary="A job's report (HTML)",
    responses={**_HTML, 404: {"model": ErrorAnswer, "description": "No traces in this job."}},
)
def get_job_report(
    state: State,
    job: Annotated[str, PathParam(pattern=JOB)],
    top: Annotated[int, Query(ge=1, le=100, description="How many kernels to list.")] = 15,
) -> HTMLResponse:
    """The job's findings in plain words, then its per-rank breakdown, steps, idle time by cause, the
    straggler heat map (rank x collective lateness), top kernels and collective bandwidth against the peak."""
    return HTMLResponse(job_report(state.warehouse.job_report(job, top=top)))


@router.get(
    "/api/v1/reports/fleet", response_class=HTMLResponse, summary="The fleet report (HTML)",
    responses={**_HTML, 400: {"model": ErrorAnswer, "description": "A bad time or label."}},
)
def get_fleet_report(
    request: Request,
    state: State,
    since: Annotated[str | None, Query(max_length=64, description=f"Traces ingested since: {_WHEN}.")] = None,
    until: Annotated[str | None, Query(max_length=64, description=f"Traces ingested before: {_WHEN}.")] = None,
    label: Annotated[list[str] | None, Query(description="key=value; every label given must match")] = None,
    top: Annotated[int, Query(ge=1, le=100, description="Offenders, stragglers and collectives to list.")] = 10,
) -> HTMLResponse:
    """Device-hours and utilisation over time, wasted device-hours by job and label, week over week, the top
    offenders (linked to their job reports), the worst stragglers and the slowest collectives."""
    now = dt.datetime.now(dt.timezone.utc)
    fleet = state.warehouse.fleet(since=parse_when(since, now) if since else None,
                                  until=parse_when(until, now) if until else None,
                                  labels=parse_labels(label), top=top, now=now)
    return HTMLResponse(fleet_report(fleet, lambda job: request.url_for("get_job_report", job=job).path))
