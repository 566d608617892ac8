"""The REST API in process (FastAPI TestClient): every endpoint and its errors."""

from __future__ import annotations

import gzip
import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tracelake import ingest
from tracelake.api.app import create_app
from tracelake.api.network import is_loopback
from tracelake.api.responses import encode
from tracelake.api.settings import ServerSettings
from tracelake.warehouse import Warehouse

from support import SAMPLES
from support.tokens import ADMIN, READER, WRITER
from support.uploads import DDP, files_form, upload, uploads_left


def _settings(home: Path, **overrides: object) -> ServerSettings:
    return ServerSettings(home=home, ingest_workers=0, **overrides)  # type: ignore[arg-type]


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


# -- uploads ---------------------------------------------------------------------------
def test_upload_returns_content_ids_and_ingests(client: TestClient, home: Path) -> None:
    paths = sorted(DDP.glob("*.json.gz"))
    answer = client.post("/api/v1/traces", files=files_form(*paths), data={"job": "ddp", "labels": "team=infra,model=gpt"})
    assert answer.status_code == 202, answer.text
    body = answer.json()
    assert [t["trace_id"] for t in body["traces"]] == [ingest.content_id(p) for p in paths]
    assert body["labels"] == {"team": "infra", "model": "gpt"} and body["files"] == 4
    assert body["bytes"] == sum(p.stat().st_size for p in paths)
    assert client.app.state.tracelake.queue.wait([t["trace_id"] for t in body["traces"]], 60)  # type: ignore[attr-defined]
    for t in body["traces"]:
        detail = client.get(t["url"]).json()
        assert detail["status"] == "done" and detail["job"] == "ddp"
        assert detail["trace"]["labels"] == {"team": "infra", "model": "gpt"}
    local = Warehouse(home).query("SELECT count(*) FROM device_ops").rows[0][0]
    assert local > 0
    assert uploads_left(home) == []


def test_same_bytes_again_is_the_same_trace(client: TestClient) -> None:
    first = upload(client, DDP / "rank-0.json.gz").json()["traces"][0]
    again = upload(client, DDP / "rank-0.json.gz", job="other").json()["traces"][0]
    assert again["trace_id"] == first["trace_id"]
    assert again["already_present"] is True and again["status"] == "done" and again["job"] == "ddp"
    assert client.get("/api/v1/traces").json()["total"] == 1


def test_wait_answers_when_done(client: TestClient) -> None:
    answer = upload(client, DDP / "rank-1.json.gz", wait=60)
    assert answer.status_code == 202
    assert [t["status"] for t in answer.json()["traces"]] == ["done"]


def test_put_raw_body(client: TestClient) -> None:
    data = (DDP / "rank-2.json.gz").read_bytes()
    answer = client.put("/api/v1/traces/rank-2.json.gz", params={"job": "raw", "labels": "team=ci", "wait": 60},
                        content=data)
    assert answer.status_code == 202, answer.text
    trace = answer.json()["traces"][0]
    assert trace["status"] == "done" and trace["name"] == "rank-2.json.gz"
    row = client.get(trace["url"]).json()["trace"]
    assert row["rank"] == 2 and row["labels"] == {"team": "ci"} and row["source_name"] == "rank-2.json.gz"


def test_gzip_bomb_is_refused(client: TestClient, home: Path, tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.json.gz"
    with gzip.open(bomb, "wb", compresslevel=9) as f:
        block = b" " * (1 << 20)
        for _ in range(64):
            f.write(block)
    small = _settings(home / "small", max_expansion_ratio=10, max_expanded_bytes=8 << 20)
    with TestClient(create_app(small)) as c:
        answer = upload(c, bomb)
    assert answer.status_code == 413, answer.text
    assert "bomb.json.gz" in answer.json()["error"]


def test_too_large_file_is_refused(home: Path) -> None:
    with TestClient(create_app(_settings(home, max_file_bytes=10_000))) as c:
        answer = upload(c, DDP / "rank-0.json.gz")
        assert answer.status_code == 413
        assert "rank-0.json.gz" in answer.json()["error"] and "TRACELAKE_MAX_FILE_BYTES" in answer.json()["error"]
        put = c.put("/api/v1/traces/x.json.gz", content=(DDP / "rank-0.json.gz").read_bytes())
        assert put.status_code == 413
        assert c.get("/healthz").status_code == 200
    assert uploads_left(home) == []


def test_too_large_request_is_refused(home: Path) -> None:
    with TestClient(create_app(_settings(home, max_request_bytes=50_000))) as c:
        answer = upload(c, DDP / "rank-0.json.gz", DDP / "rank-1.json.gz")
    assert answer.status_code == 413 and "TRACELAKE_MAX_REQUEST_BYTES" in answer.json()["error"]


def test_unknown_format_is_refused_whole(client: TestClient, home: Path, tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("just some text\n")
    answer = upload(client, DDP / "rank-0.json.gz", notes)
    assert answer.status_code == 422
    assert "notes.txt" in answer.json()["error"]
    assert client.get("/api/v1/traces").json()["total"] == 0  # the good file of the same upload is not kept
    assert uploads_left(home) == []


def test_truncated_gzip_is_refused(client: TestClient, tmp_path: Path) -> None:
    cut = tmp_path / "rank-0.json.gz"
    cut.write_bytes((DDP / "rank-0.json.gz").read_bytes()[:20_000])
    answer = upload(client, cut)
    assert answer.status_code == 422
    assert "rank-0.json.gz" in answer.json()["error"] and "truncated" in answer.json()["error"]


def test_corrupt_trace_fails_in_the_background_with_the_reason(client: TestClient, tmp_path: Path) -> None:
    bad = tmp_path / "rank-0.json"
    text = gzip.decompress((DDP / "rank-0.json.gz").read_bytes()).decode()
    bad.write_text(text[: len(text) // 2])  # recognisably Kineto, cut in the middle
    answer = upload(client, bad, wait=0)
    assert answer.status_code == 202
    trace = answer.json()["traces"][0]
    assert client.app.state.tracelake.queue.wait([trace["trace_id"]], 60)  # type: ignore[attr-defined]
    detail = client.get(trace["url"]).json()
    assert detail["status"] == "failed" and "rank-0.json" in detail["error"]
    assert client.get("/api/v1/traces").json()["total"] == 0
    waited = upload(client, bad, wait=60)  # the failed trace may be uploaded again; waiting tells at once
    assert waited.status_code == 422
    body = waited.json()
    assert body["kind"] == "IngestFailed" and body["error"] == detail["error"]
    assert body["traces"][0]["status"] == "failed"


def test_malformed_multipart(client: TestClient) -> None:
    body = b"--xyz\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.json\"\r\n\r\n{\"traceEv"
    answer = client.post("/api/v1/traces", content=body,
                         headers={"Content-Type": "multipart/form-data; boundary=xyz"})
    assert answer.status_code == 400 and "multipart" in answer.json()["error"]
    assert client.post("/api/v1/traces", content=b"{}", headers={"Content-Type": "application/json"}).status_code == 400
    assert client.post("/api/v1/traces", data={"job": "x"}, files={"other": (None, b"1")}).status_code == 400


def test_bad_job_and_labels(client: TestClient) -> None:
    answer = upload(client, DDP / "rank-0.json.gz", job="../etc")
    assert answer.status_code == 400 and "invalid job name" in answer.json()["error"]
    answer = upload(client, DDP / "rank-0.json.gz", labels="no-equals-sign")
    assert answer.status_code == 400 and "label" in answer.json()["error"]
    assert client.get("/api/v1/traces").json()["total"] == 0


def test_labels_as_json(client: TestClient) -> None:
    answer = upload(client, DDP / "rank-0.json.gz", labels='{"team": "infra", "cluster": "a"}')
    assert answer.json()["labels"] == {"team": "infra", "cluster": "a"}


# -- reading ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def filled_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A warehouse filled through the API once for the module: the DDP sample (job ddp, team=infra) and the
    launch-bound one (job lb, team=ml)."""
    home = tmp_path_factory.mktemp("filled") / "warehouse"
    with TestClient(create_app(_settings(home))) as client:
        assert upload(client, *sorted(DDP.glob("*.json.gz")), labels="team=infra").status_code == 202
        assert upload(client, SAMPLES / "launch_bound" / "rank-0.json.gz", job="lb", labels="team=ml").status_code == 202
    return home


@pytest.fixture
def filled(home: Path, filled_home: Path) -> Iterator[TestClient]:
    """A server without tokens over its own copy of that warehouse (at ``home``; tests may change it)."""
    shutil.copytree(filled_home, home, symlinks=True)
    with TestClient(create_app(_settings(home))) as c:
        yield c


def test_list_traces_filters_and_pages(filled: TestClient) -> None:
    page = filled.get("/api/v1/traces", params={"limit": 2}).json()
    assert page["total"] == 5 and len(page["traces"]) == 2 and page["next"]
    second = filled.get(page["next"]).json()
    assert second["offset"] == 2 and len(second["traces"]) == 2
    ids = {t["trace_id"] for t in page["traces"] + second["traces"]}
    assert len(ids) == 4
    assert filled.get("/api/v1/traces", params={"job": "lb"}).json()["total"] == 1
    assert filled.get("/api/v1/traces", params={"label": "team=infra"}).json()["total"] == 4
    assert filled.get("/api/v1/traces", params={"since": "2999-01-01T00:00:00Z"}).json()["total"] == 0
    assert filled.get("/api/v1/traces", params={"until": "2999-01-01T00:00:00Z"}).json()["total"] == 5
    assert filled.get("/api/v1/traces", params={"job": "../x"}).status_code == 422
    assert filled.get("/api/v1/traces", params={"label": "bad"}).status_code == 400


def test_unknown_trace(client: TestClient) -> None:
    assert client.get("/api/v1/traces/0123456789abcdef0123").status_code == 404
    assert client.get("/api/v1/traces/not-hex").status_code == 422
    assert client.delete("/api/v1/traces/0123456789abcdef0123").status_code == 404


def test_delete(filled: TestClient) -> None:
    trace_id = ingest.content_id(SAMPLES / "launch_bound" / "rank-0.json.gz")
    answer = filled.delete(f"/api/v1/traces/{trace_id}")
    assert answer.status_code == 200 and answer.json() == {"trace_id": trace_id, "job": "lb", "deleted": True}
    assert filled.get(f"/api/v1/traces/{trace_id}").status_code == 404
    count = filled.post("/api/v1/sql", json={"sql": f"SELECT count(*) FROM device_ops WHERE trace_id = '{trace_id}'"})
    assert count.json()["rows"] == [[0]]
    assert [j["job"] for j in filled.get("/api/v1/jobs").json()["jobs"]] == ["ddp"]


def test_jobs(filled: TestClient, home: Path) -> None:
    jobs = {j["job"]: j for j in filled.get("/api/v1/jobs").json()["jobs"]}
    assert set(jobs) == {"ddp", "lb"}
    assert jobs["ddp"]["traces"] == 4 and jobs["ddp"]["ranks"] == 4 and jobs["ddp"]["formats"] == ["pytorch_profiler"]


def test_job_analysis_is_the_library_analysis(filled: TestClient, home: Path) -> None:
    answer = filled.get("/api/v1/jobs/ddp")
    assert answer.status_code == 200
    body = answer.json()
    expected = json.loads(encode(Warehouse(home).analyze(job="ddp").as_dict()))
    assert body["job"] == "ddp" and body["traces"] == 4
    assert body["breakdown"] == expected["breakdown"] and len(body["breakdown"]) == 4
    assert body["findings"] == expected["findings"] and body["findings"]
    assert body["last_arrivals"] == expected["last_arrivals"]
    assert body["top_kernels"] == expected["top_kernels"]
    assert body["analysis"]["idle_by_stream"] == expected["idle_by_stream"]
    for name in ("critical_path", "critical_path_stretches", "what_if"):  # declared in JobAnalysis, at the top
        assert body[name] == expected[name] and body[name] and name not in body["analysis"]
    assert filled.get("/api/v1/jobs/ddp").json() == body  # answered again from the cache
    assert filled.get("/api/v1/jobs/nope").status_code == 404


def test_job_analysis_follows_changes(filled: TestClient) -> None:
    before = filled.get("/api/v1/jobs/ddp").json()
    trace_id = ingest.content_id(DDP / "rank-3.json.gz")
    assert filled.delete(f"/api/v1/traces/{trace_id}").status_code == 200
    after = filled.get("/api/v1/jobs/ddp").json()
    assert after["traces"] == 3 and len(after["breakdown"]) == 3 and before["traces"] == 4


# -- SQL -------------------------------------------------------------------------------
def test_sql(filled: TestClient, home: Path) -> None:
    sql = "SELECT rank, category, sum(dur_ns) AS ns FROM device_ops GROUP BY ALL ORDER BY 1, 2"
    answer = filled.post("/api/v1/sql", json={"sql": sql})
    assert answer.status_code == 200
    body = answer.json()
    local = Warehouse(home).query(sql)
    assert body["columns"] == local.columns and body["rows"] == [list(r) for r in local.rows]
    assert body["row_count"] == len(local.rows) and body["truncated"] is False


def test_sql_row_limit(filled: TestClient) -> None:
    body = filled.post("/api/v1/sql", json={"sql": "SELECT * FROM range(100)", "max_rows": 7}).json()
    assert body["row_count"] == 7 and body["truncated"] is True


@pytest.mark.parametrize("sql", [
    "SELECT * FROM read_text('/etc/passwd')",
    "COPY (SELECT 1) TO 'x.csv'",
    "CREATE TABLE t AS SELECT 1",
    "ATTACH '/tmp/x.duckdb' AS x",
    "INSTALL httpfs",
    "SET threads = 1",
    "SELECT 1; SELECT 2",
    "SELEC nonsense",
])
def test_sql_refuses(filled: TestClient, sql: str) -> None:
    answer = filled.post("/api/v1/sql", json={"sql": sql})
    assert answer.status_code == 400, answer.text
    assert answer.json()["kind"] == "QueryError" and answer.json()["error"]


def test_sql_validation(client: TestClient) -> None:
    assert client.post("/api/v1/sql", json={"sql": ""}).status_code == 422
    assert client.post("/api/v1/sql", json={}).status_code == 422
    assert client.post("/api/v1/sql", content=b"not json", headers={"Content-Type": "application/json"}).status_code == 422


# -- security --------------------------------------------------------------------------
def test_tokens_and_scopes(secured: TestClient) -> None:
    assert secured.get("/healthz").status_code == 200
    assert secured.get("/api/v1/jobs").status_code == 401
    assert secured.get("/api/v1/jobs", headers=_auth("wrong-token-000")).status_code == 401
    assert secured.get("/api/v1/jobs", headers={"Authorization": "Basic abc"}).status_code == 401
    assert secured.get("/api/v1/jobs", headers=_auth(READER)).status_code == 200
    assert secured.get("/metrics", headers=_auth(READER)).status_code == 200
    assert secured.get("/metrics").status_code == 401
    files = files_form(DDP / "rank-0.json.gz")
    refused = secured.post("/api/v1/traces", files=files, headers=_auth(READER))
    assert refused.status_code == 403 and "write" in refused.json()["error"]
    accepted = secured.post("/api/v1/traces", params={"wait": 60}, files=files, headers=_auth(WRITER))
    assert accepted.status_code == 202
    trace_id = accepted.json()["traces"][0]["trace_id"]
    assert secured.delete(f"/api/v1/traces/{trace_id}", headers=_auth(WRITER)).status_code == 403
    assert secured.delete(f"/api/v1/traces/{trace_id}", headers=_auth(ADMIN)).status_code == 200
    sql = {"sql": "SELECT 1"}
    assert secured.post("/api/v1/sql", json=sql).status_code == 401
    assert secured.post("/api/v1/sql", json=sql, headers=_auth(ADMIN)).status_code == 200


def test_bad_token_settings(home: Path) -> None:
    from tracelake.warehouse import InvalidArgument

    with pytest.raises(InvalidArgument, match="scope"):
        create_app(_settings(home, tokens="abcdefghij:read,delete"))
    with pytest.raises(InvalidArgument, match="8 characters"):
        create_app(_settings(home, tokens="abc:read"))


def test_tokens_file(home: Path, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"# team tokens\n{READER}:read  # the dashboard\n")
    with TestClient(create_app(_settings(home, tokens_file=str(tokens)))) as c:
        assert c.get("/api/v1/jobs", headers=_auth(READER)).status_code == 200
        assert c.get("/api/v1/jobs").status_code == 401


# -- server ----------------------------------------------------------------------------
def test_health_and_metrics(client: TestClient) -> None:
    health = client.get("/healthz").json()
    assert health["status"] == "ok" and health["queue_depth"] == 0
    upload(client, DDP / "rank-0.json.gz")
    client.post("/api/v1/traces", content=b"{}", headers={"Content-Type": "application/json"})
    text = client.get("/metrics").text
    values = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line and not line.startswith("#")}
    size = (DDP / "rank-0.json.gz").stat().st_size
    assert values["tracelake_uploads_total"] == 1 and values["tracelake_upload_bytes_total"] == size
    assert values["tracelake_upload_rejections_total"] == 1
    assert values['tracelake_ingests_total{outcome="ingested"}'] == 1
    assert values["tracelake_ingest_duration_seconds_count"] == 1
    assert values["tracelake_ingest_queue_depth"] == 0
    assert values['tracelake_http_requests_total{method="POST",route="/api/v1/traces",status="202"}'] == 1


def test_queued_uploads_survive_a_restart(home: Path) -> None:
    with TestClient(create_app(_settings(home))):
        pass
    folder = home / "uploads" / "left-by-a-dead-server"
    folder.mkdir()
    trace = folder / "part-0"
    trace.write_bytes((DDP / "rank-1.json.gz").read_bytes())
    trace_id = ingest.content_id(trace)
    (folder / "manifest.json").write_text(json.dumps(
        {"job": "resumed", "labels": {}, "files": [{"trace_id": trace_id, "name": "rank-1.json.gz", "path": "part-0"}]}
    ))
    incomplete = home / "uploads" / "never-finished"
    incomplete.mkdir()
    (incomplete / "part-0").write_bytes(b"half")
    with TestClient(create_app(_settings(home))) as c:
        assert c.app.state.tracelake.queue.wait([trace_id], 60)  # type: ignore[attr-defined]
        assert c.get(f"/api/v1/traces/{trace_id}").json()["job"] == "resumed"
    assert uploads_left(home) == []


def test_openapi_documents_every_route(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    paths = schema["paths"]
    for path in ("/api/v1/traces", "/api/v1/traces/{name}", "/api/v1/traces/{trace_id}", "/api/v1/jobs",
                 "/api/v1/jobs/{job}", "/api/v1/jobs/{job}/report", "/api/v1/reports/fleet", "/api/v1/sql",
                 "/healthz", "/metrics"):
        assert path in paths, path
    assert "multipart/form-data" in paths["/api/v1/traces"]["post"]["requestBody"]["content"]
    assert "HTTPBearer" in schema["components"]["securitySchemes"]
    assert schema["components"]["schemas"]["SqlQuery"]["examples"]
    analysis = schema["components"]["schemas"]["JobAnalysis"]["properties"]
    for name in ("critical_path", "critical_path_stretches", "what_if"):
        assert "step" in analysis[name]["description"], name


def test_errors_never_leak_tracebacks(client: TestClient) -> None:
    for answer in (
        client.post("/api/v1/traces", content=b"--b\r\n", headers={"Content-Type": "multipart/form-data; boundary=b"}),
        client.post("/api/v1/sql", json={"sql": "SELECT * FROM nowhere"}),
    ):
        assert 400 <= answer.status_code < 500
        assert "Traceback" not in answer.text


def test_job_analysis_is_prepared_after_ingest(client: TestClient) -> None:
    state = client.app.state.tracelake  # type: ignore[attr-defined]
    assert upload(client, *sorted(DDP.glob("*.json.gz"))).status_code == 202
    deadline = time.monotonic() + 30
    while not state.analyses.prepared() and time.monotonic() < deadline:
        time.sleep(0.05)
    prepared = state.analyses.prepared()
    assert len(prepared) == 1
    assert client.get("/api/v1/jobs/ddp").content == prepared[0]


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.0.0.2", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("0.0.0.0", False), ("::", False), ("10.1.2.3", False), ("no-such-host.invalid", False),
])
def test_loopback_addresses(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_queue_depth_is_the_count_of_queued_tasks(client: TestClient) -> None:
    """The depth the queue keeps as tasks change equals a recount of its tasks, during a burst and after it."""
    queue = client.app.state.tracelake.queue  # type: ignore[attr-defined]

    ids = []
    for path in sorted(DDP.glob("*.json.gz")) * 2:  # the second round: already queued or done, nothing new
        answer = client.post("/api/v1/traces", files=[("file", (path.name, path.read_bytes()))])
        ids += [t["trace_id"] for t in answer.json()["traces"]]
        depth, recounted = queue.recount()  # both at one moment
        assert depth == recounted <= 4
    assert queue.wait(ids, 120)
    assert queue.recount() == (0, 0)
    assert client.get("/healthz").json()["queue_depth"] == 0


def test_an_upload_is_hashed_once(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server hashes an upload as it arrives; its ingest takes that id and reads the file only to parse it."""
    import tracelake.warehouse.staging as staging

    calls: list[Path] = []
    original = ingest.content_id
    monkeypatch.setattr(staging.ingest, "content_id", lambda path, name=None: calls.append(path) or original(path, name))
    path = DDP / "rank-1.json.gz"
    with TestClient(create_app(_settings(home))) as c:
        body = upload(c, path).json()
        trace_id = body["traces"][0]["trace_id"]
        assert c.app.state.tracelake.queue.wait([trace_id], 60)  # type: ignore[attr-defined]
        assert c.get(body["traces"][0]["url"]).json()["status"] == "done"
    assert calls == []
    assert trace_id == original(path)
    assert Warehouse(home).query("SELECT DISTINCT trace_id FROM host_ops").rows == [(trace_id,)]
