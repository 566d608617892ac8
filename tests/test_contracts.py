"""The shared contracts and how the faces map them: statuses agree across layers, errors map to fixed codes."""

from __future__ import annotations

import typing

import pytest

from tracelake.api import errors as api_errors
from tracelake.api.models import TaskStatusName, TraceDetail, TraceState
from tracelake.contracts import errors
from tracelake.contracts.status import FINAL_INGEST_STATUSES, IngestStatus, TaskStatus


def test_api_task_status_literal_agrees_with_the_enum() -> None:
    assert set(typing.get_args(TaskStatusName)) == {s.value for s in TaskStatus}
    for model in (TraceState, TraceDetail):
        assert model.model_fields["status"].annotation == TaskStatusName


def test_final_ingest_statuses_leave_out_only_staged() -> None:
    assert set(IngestStatus) - set(FINAL_INGEST_STATUSES) == {IngestStatus.STAGED}
    assert IngestStatus.FAILED == "failed" and f"{IngestStatus.INGESTED}" == "ingested"


@pytest.mark.parametrize(("kind", "status"), [
    (errors.TracelakeError, 400),
    (errors.InvalidArgument, 400),
    (errors.QueryError, 400),
    (errors.QueryTimeout, 400),
    (errors.QueryMemoryLimit, 400),
    (errors.NotFound, 404),
    (api_errors.UploadTimedOut, 408),
    (api_errors.UploadDeadlinePassed, 408),
    (errors.TooLarge, 413),
    (errors.TooManyRequests, 429),
    (errors.Unauthorized, 401),
    (errors.Forbidden, 403),
    (errors.WarehouseError, 500),
    (errors.Unavailable, 503),
])
def test_http_status_of_each_error(kind: type[errors.TracelakeError], status: int) -> None:
    assert api_errors.http_status(kind("message")) == status
    assert api_errors.exit_code(kind("message")) == 1


def test_format_errors_answer_422() -> None:
    for kind in (errors.TraceFormatError, errors.UnknownFormatError):
        exc = kind("rank-3.json.gz", "gzip stream ends early", where="byte 1048576")
        assert api_errors.http_status(exc) == 422 and api_errors.exit_code(exc) == 1


def test_domain_errors_carry_no_face_codes() -> None:
    for kind in vars(errors).values():
        if isinstance(kind, type) and issubclass(kind, errors.TracelakeError):
            assert not hasattr(kind, "http_status") and not hasattr(kind, "exit_code"), kind
