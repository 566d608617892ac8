"""Property-based checks of the REST API against its own OpenAPI schema (schemathesis): no request makes it fail with a 5xx."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error

from tracelake.api.app import create_app
from tracelake.api.settings import ServerSettings

from support import SAMPLES

pytestmark = pytest.mark.slow  # schemathesis: generated requests for every operation


@pytest.fixture(scope="module")
def api_schema(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The schema of a running app (its ingest queue started) over a warehouse holding one job."""
    home = tmp_path_factory.mktemp("schemathesis") / "warehouse"
    app = create_app(ServerSettings(home=home, ingest_workers=0, sql_timeout_seconds=5))
    with TestClient(app) as client:  # runs the lifespan: the ingest queue is up for the generated requests
        trace = SAMPLES / "ddp_straggler" / "rank-0.json.gz"
        answer = client.post("/api/v1/traces", params={"wait": 60}, data={"job": "ddp"},
                             files=[("file", (trace.name, trace.read_bytes()))])
        assert answer.json()["traces"][0]["status"] == "done"
        yield schemathesis.openapi.from_asgi("/openapi.json", app)


#: Every operation of the API; a test below checks that the schema has no others.
OPERATIONS = [
    ("POST", "/api/v1/traces"), ("PUT", "/api/v1/traces/{name}"), ("GET", "/api/v1/traces"),
    ("GET", "/api/v1/traces/{trace_id}"), ("DELETE", "/api/v1/traces/{trace_id}"), ("GET", "/api/v1/jobs"),
    ("GET", "/api/v1/jobs/{job}"), ("GET", "/api/v1/jobs/{job}/report"), ("GET", "/api/v1/reports/fleet"),
    ("GET", "/api/v1/reports/fleet.json"), ("GET", "/api/v1/reports"), ("GET", "/api/v1/reports/latest"),
    ("GET", "/api/v1/reports/{name}/index.html"), ("GET", "/api/v1/reports/{name}/jobs/{job}.html"),
    ("POST", "/api/v1/sql"), ("GET", "/healthz"), ("GET", "/metrics"),
]


def test_every_operation_is_checked(api_schema: Any) -> None:
    found = sorted((op.ok().method.upper(), op.ok().path) for op in api_schema.get_all_operations())
    assert found == sorted(OPERATIONS)


@pytest.mark.parametrize(("method", "path"), OPERATIONS)
def test_no_request_makes_the_server_fail(api_schema: Any, method: str, path: str) -> None:
    operation = api_schema[path][method]

    @given(case=operation.as_strategy())
    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def check(case: Any) -> None:
        response = case.call()
        case.validate_response(response, checks=[not_a_server_error])
        assert response.status_code < 500, (case.method, case.path, response.text[:500])

    check()
