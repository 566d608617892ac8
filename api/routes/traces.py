"""``/api/v1/traces``: upload traces, follow their ingestion, list and delete them."""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Path as PathParam, Query, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from tracelake.contracts.status import TaskStatus
from tracelake.warehouse import InvalidArgument, NotFound
from tracelake.warehouse.store import check_job

from ..deps import Admin, Read, State, Write
from ..ingest_queue import Task
from ..intake import check_upload
from ..models import JOB, TRACE_ID, ErrorAnswer, TraceDetail, TracePage, TraceState, UploadAnswer
from ..uploads import Received, UploadLimits, receive_body, receive_multipart
from ..user_input import parse_labels

router = APIRouter(prefix="/api/v1/traces", tags=["traces"])

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorAnswer, "description": text}
    for code, text in {
        400: "Malformed upload, unsafe archive member, bad job name or label.",
        401: "No valid API token.",
        403: "The token lacks the `write` scope.",
        413: "A file, the request or an archive's expansion is over the limit.",
        422: "A file is damaged or in no format tracelake reads (with `wait`: also when its ingest failed; "
             "the answer then also lists the traces).",
    }.items()
}
#: How long ``wait`` may hold an upload request open.
MAX_WAIT_SECONDS = 600

Wait = Annotated[float, Query(
    ge=0, le=MAX_WAIT_SECONDS,
    description="Seconds to wait for the ingest to finish before answering (0: answer at once with 202).",
)]

_MULTIPART_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file"],
                    "properties": {
                        "file": {"type": "array", "items": {"type": "string", "format": "binary"},
                                 "description": "Trace files (.json, .json.gz, .xplane.pb, NCCL logs) or "
                                                ".zip/.tar.gz archives of a trace directory."},
                        "job": {"type": "string", "pattern": JOB, "default": "default"},
                        "labels": {"type": "string", "description": "key=value pairs, comma-separated, "
                                   "or a JSON object: team=infra,cluster=a"},
                    },
                },
            }
        },
    }
}


@router.post(
    "", status_code=202, response_model=UploadAnswer, responses=_ERRORS, dependencies=[Write],
    summary="Upload trace files", openapi_extra=_MULTIPART_BODY,
)
async def upload(request: Request, state: State, wait: Wait = 0) -> UploadAnswer:
    """Upload one or more traces as multipart `file` fields, with `job` and `labels` form fields.

    The files are streamed to disk and checked (archives unpacked safely, gzip
    bounded, format recognised); then 202 with one trace id per trace, ingested in
    the background. Uploading the same bytes again answers with the same trace id.
    With `wait`, the answer comes when ingestion is done (or `wait` seconds passed).
    """
    folder = state.queue.new_folder()
    try:
        received = await receive_multipart(request, folder, UploadLimits.from_settings(state.settings))
        job = _single(received.fields.get("job"), "job") or "default"
        labels = _labels(received.fields.get("labels", []) + received.fields.get("label", []))
    except BaseException:
        _discard(state, folder)
        raise
    return await _accept(state, folder, received, job, labels, wait)


@router.put(
    "/{name}", status_code=202, response_model=UploadAnswer, responses=_ERRORS, dependencies=[Write],
    summary="Upload one trace file as the raw request body",
    openapi_extra={"requestBody": {"required": True, "content": {"application/octet-stream": {
        "schema": {"type": "string", "format": "binary"}}}}},
)
async def upload_raw(
    request: Request,
    state: State,
    name: Annotated[str, PathParam(min_length=1, max_length=200, description="The file's name (a label only).")],
    job: Annotated[str, Query(pattern=JOB)] = "default",
    labels: Annotated[list[str] | None, Query(description="key=value pairs, e.g. team=infra")] = None,
    wait: Wait = 0,
) -> UploadAnswer:
    """Upload one trace (or archive) as the raw body: `curl -T rank-0.json.gz "$URL/api/v1/traces/rank-0.json.gz?job=llama"`."""
    folder = state.queue.new_folder()
    try:
        parsed = _labels(labels or [])
        received = await receive_body(request, folder, name, UploadLimits.from_settings(state.settings))
    except BaseException:
        _discard(state, folder)
        raise
    return await _accept(state, folder, received, job, parsed, wait)


async def _accept(
    state: State, folder: Path, received: Received, job: str, labels: dict[str, str], wait: float
) -> UploadAnswer:
    try:
        check_job(job)
        files = await run_in_threadpool(check_upload, received.files, state.settings)
        tasks = state.queue.submit(folder, files, job, labels)
    except BaseException:
        _discard(state, folder)
        raise
    state.metrics.upload(received.bytes)
    if wait > 0:
        await run_in_threadpool(state.queue.wait, [t.trace_id for t in tasks], wait)
    answer = UploadAnswer(job=job, labels=labels, files=len(received.files), bytes=received.bytes,
                          traces=[_state(t) for t in tasks])
    failed = [t for t in answer.traces if t.status == TaskStatus.FAILED]
    if failed:  # only known when the client waited: the upload was bad after all
        content = {"error": "; ".join(t.error or t.name for t in failed), "kind": "IngestFailed",
                   **answer.model_dump(mode="json")}
        return JSONResponse(content, status_code=422)  # type: ignore[return-value]
    return answer


@router.get("", response_model=TracePage, dependencies=[Read], summary="List traces")
def list_traces(
    request: Request,
    state: State,
    job: Annotated[str | None, Query(pattern=JOB)] = None,
    label: Annotated[list[str] | None, Query(description="key=value; every label given must match")] = None,
    since: Annotated[dt.datetime | None, Query(description="Ingested at or after (ISO 8601)")] = None,
    until: Annotated[dt.datetime | None, Query(description="Ingested before (ISO 8601)")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0,
) -> TracePage:
    """Registered traces, newest first, filtered by job, labels and ingest time, a page at a time."""
    labels = parse_labels(label)
    warehouse = state.warehouse
    rows = warehouse.traces(job, labels=labels, since=since, until=until, limit=limit, offset=offset)
    total = warehouse.count_traces(job, labels=labels, since=since, until=until)
    following = None
    if offset + len(rows) < total:
        params = [(k, v) for k, v in request.query_params.multi_items() if k != "offset"]
        following = f"{request.url.path}?{urlencode(params + [('offset', str(offset + limit))])}"
    return TracePage(traces=rows, total=total, limit=limit, offset=offset, next=following)


TraceId = Annotated[str, PathParam(pattern=TRACE_ID, description="A trace id, as an upload answered it, or a unique "
                                                                  "prefix of one (at least 4 characters).")]


@router.get("/{trace_id}", response_model=TraceDetail, dependencies=[Read],
            responses={404: {"model": ErrorAnswer}}, summary="One trace and its ingest status")
def get_trace(state: State, trace_id: TraceId) -> TraceDetail:
    """A trace's status (queued, ingesting, done, failed with the error) and, once done, its `traces` row."""
    try:
        row = state.warehouse.trace(trace_id)  # a whole id or a unique prefix (warehouse/trace_ids.py)
        return TraceDetail(trace_id=row["trace_id"], job=row["job"], status="done", error=None, trace=row)
    except NotFound:  # not in the warehouse: queued, failed, deleted or unknown
        pass
    task = state.queue.task(trace_id)
    if task is None:
        raise NotFound(f"no trace with id {trace_id!r}")
    if task.status == TaskStatus.DONE:  # ingested, then deleted
        raise NotFound(f"no trace with id {trace_id!r} (it was deleted)")
    return TraceDetail(trace_id=trace_id, job=task.job, status=task.state, error=task.error, trace=None)  # type: ignore[arg-type]


@router.delete("/{trace_id}", dependencies=[Admin], responses={404: {"model": ErrorAnswer}},
               summary="Delete a trace")
def delete_trace(state: State, trace_id: TraceId) -> dict[str, Any]:
    """Remove a trace and all its rows from the warehouse (needs the `admin` scope)."""
    full = state.warehouse.trace(trace_id)["trace_id"]  # a unique prefix names one trace
    job = state.warehouse.delete(full)
    return {"trace_id": full, "job": job, "deleted": True}


def _state(task: Task) -> TraceState:
    return TraceState(url=f"/api/v1/traces/{task.trace_id}", **task.as_dict())  # type: ignore[arg-type]


def _single(values: list[str] | None, name: str) -> str | None:
    if not values:
        return None
    if len(values) > 1:
        raise InvalidArgument(f"the form field {name!r} is given {len(values)} times; give it once")
    return values[0].strip()


def _labels(values: list[str]) -> dict[str, str]:
    """Labels from form or query values: each a JSON object or comma-separated ``key=value`` pairs."""
    labels: dict[str, str] = {}
    for value in values:
        text = value.strip()
        if text.startswith("{"):
            try:
                doc = json.loads(text)
            except ValueError as exc:
                raise InvalidArgument(f"labels: not a JSON object ({exc})") from None
            if not isinstance(doc, dict) or not all(isinstance(v, str | int | float) for v in doc.values()):
                raise InvalidArgument('labels: expected a JSON object of strings, e.g. {"team": "infra"}')
            pairs = [f"{k}={v}" for k, v in doc.items()]
        else:
            pairs = [p for p in text.split(",") if p.strip()]
        labels.update(parse_labels(pairs))
    return labels


def _discard(state: State, folder: Path) -> None:
    state.metrics.rejected()
    shutil.rmtree(folder, ignore_errors=True)
