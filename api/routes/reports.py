"""Reports as HTML pages: ``/api/v1/jobs/{job}/report``, ``/api/v1/reports/fleet`` and the history; the fleet's
figures as JSON at ``/api/v1/reports/fleet.json``.

Each page is self-contained (plotly.js inline, nothing fetched), the same page
``tracelake report`` writes, gzip-compressed for clients that accept it; the fleet
report links every job to its report here. ``/api/v1/reports`` lists the scheduled
fleet reports kept in ``$TRACELAKE_HOME/reports/`` and serves them.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Annotated, Any

from fastapi import APIRouter, Header, Path as PathParam, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from tracelake.contracts.errors import NotFound

from ..deps import Read, State
from ..models import JOB, ArchivedReportInfo, ErrorAnswer, FleetAnswer, ReportList
from ..output import jsonable
from ..reports import fleet_report, job_report
from ..reports.archive import NAME
from ..responses import html_page
from ..scheduler import archive_of
from ..user_input import parse_labels, parse_when

router = APIRouter(tags=["reports"], dependencies=[Read])

_HTML: dict[int | str, dict[str, Any]] = {200: {"content": {"text/html": {}}, "description": "The report page."}}
_REPORT = NAME.pattern
_NO_REPORT: dict[int | str, dict[str, Any]] = {404: {"model": ErrorAnswer, "description": "No such report."}}
AcceptEncoding = Annotated[str | None, Header(include_in_schema=False)]
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
    accept_encoding: AcceptEncoding = None,
) -> Response:
    """The job's findings in plain words, then its per-rank breakdown, steps, idle time by cause, the
    straggler heat map (rank x collective lateness), top kernels and collective bandwidth against the peak."""
    return html_page(job_report(state.warehouse.job_report(job, top=top)), accept_encoding)


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
    accept_encoding: AcceptEncoding = None,
) -> Response:
    """Device-hours and utilisation over time, wasted device-hours by job and label, week over week, the top
    offenders (linked to their job reports), the worst stragglers and the slowest collectives."""
    now = dt.datetime.now(dt.timezone.utc)
    fleet = state.warehouse.fleet(since=parse_when(since, now) if since else None,
                                  until=parse_when(until, now) if until else None,
                                  labels=parse_labels(label), top=top, now=now)
    page = fleet_report(fleet, lambda job: request.url_for("get_job_report", job=job).path)
    return html_page(page, accept_encoding)


@router.get(
    "/api/v1/reports/fleet.json", summary="The fleet's figures (JSON)",
    responses={200: {"model": FleetAnswer}, 400: {"model": ErrorAnswer, "description": "A bad time or label."}},
)
def get_fleet_figures(
    state: State,
    since: Annotated[str | None, Query(max_length=64, description=f"Traces ingested since: {_WHEN}.")] = None,
    until: Annotated[str | None, Query(max_length=64, description=f"Traces ingested before: {_WHEN}.")] = None,
    label: Annotated[list[str] | None, Query(description="key=value; every label given must match")] = None,
    top: Annotated[int, Query(ge=1, le=100, description="Offenders, stragglers and collectives to list.")] = 10,
) -> Response:
    """What the fleet report shows, as JSON: device-hours, busy, useful (x MFU) and wasted per job, day, week,
    label and accelerator, jobs ranked by waste and by useful work lost, week over week, and per job with a
    lifecycle file its goodput with its scheduling, runtime and program factors."""
    now = dt.datetime.now(dt.timezone.utc)
    fleet = state.warehouse.fleet(since=parse_when(since, now) if since else None,
                                  until=parse_when(until, now) if until else None,
                                  labels=parse_labels(label), top=top, now=now)
    return Response(json.dumps(jsonable(fleet.as_dict())), media_type="application/json")


@router.get("/api/v1/reports", summary="The history of scheduled fleet reports")
def list_reports(state: State) -> ReportList:
    """The fleet reports kept in `$TRACELAKE_HOME/reports/`, newest first: made on the schedule
    (`TRACELAKE_REPORT_SCHEDULE`), at start-up for a run the server was down for, or by
    `tracelake report scheduled` (cron, systemd timer); and when the next one is due."""
    scheduler = state.scheduler
    reports = [ArchivedReportInfo.model_validate({**r.as_json(), "url": f"/api/v1/reports/{r.name}/index.html"})
               for r in archive_of(state.settings).list()]
    return ReportList(
        reports=reports,
        schedule=scheduler.cron.expression if scheduler else None,
        timezone=state.settings.report_timezone,
        next_run=scheduler.next_run if scheduler else None,
        last_error=scheduler.last_error if scheduler else None,
    )


@router.get("/api/v1/reports/latest", summary="The newest fleet report of the history", status_code=307,
            response_class=RedirectResponse, responses=_NO_REPORT)
def latest_report(state: State) -> RedirectResponse:
    """Redirects to the newest fleet report in the history."""
    latest = archive_of(state.settings).latest()
    if latest is None:
        raise NotFound("no fleet report has been made yet: set TRACELAKE_REPORT_SCHEDULE, or run "
                       "`tracelake report scheduled`")
    return RedirectResponse(f"/api/v1/reports/{latest.name}/index.html", status_code=307)


@router.get("/api/v1/reports/{name}/index.html", response_class=HTMLResponse, summary="A fleet report of the history",
            responses={**_HTML, **_NO_REPORT})
def get_archived_report(
    state: State,
    name: Annotated[str, PathParam(pattern=_REPORT, description="The report's name, from GET /api/v1/reports.")],
    accept_encoding: AcceptEncoding = None,
) -> Response:
    """A fleet report as it was made; its top offenders link to their job reports beside it."""
    return html_page(archive_of(state.settings).page(name).read_bytes(), accept_encoding)


@router.get("/api/v1/reports/{name}/jobs/{job}.html", response_class=HTMLResponse,
            summary="A job report kept with a fleet report", responses={**_HTML, **_NO_REPORT})
def get_archived_job_report(
    state: State,
    name: Annotated[str, PathParam(pattern=_REPORT, description="The fleet report's name.")],
    job: Annotated[str, PathParam(pattern=JOB)],
    accept_encoding: AcceptEncoding = None,
) -> Response:
    """The job report of one of the fleet report's top offenders, as it was when the fleet report was made."""
    return html_page(archive_of(state.settings).page(name, job).read_bytes(), accept_encoding)
