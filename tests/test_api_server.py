"""End to end: `tracelake serve` as a real uvicorn on 127.0.0.1, several concurrent httpx clients."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from tracelake.api.cli import app as cli
from tracelake.warehouse import Warehouse

from support import SAMPLES
from support.server import running_server

pytestmark = pytest.mark.slow  # a real uvicorn server and concurrent clients

TOKEN = "e2e-writer-token"
SCENARIOS = ("ddp_straggler", "launch_bound")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A real server (two ingest worker processes) on a free loopback port; yields its URL and warehouse."""
    home = tmp_path / "warehouse"
    env = {**os.environ, "TRACELAKE_TOKENS": f"{TOKEN}:read,write,admin", "TRACELAKE_HOME": str(home)}
    with running_server(["--ingest-workers", "2"], env, tmp_path / "server.log") as url:
        yield url, home


def _upload(url: str, path: Path, job: str) -> dict:  # type: ignore[type-arg]
    with path.open("rb") as f:
        answer = httpx.post(f"{url}/api/v1/traces", data={"job": job}, files={"file": (path.name, f)},
                            headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)
    assert answer.status_code == 202, answer.text
    return answer.json()["traces"][0]  # type: ignore[no-any-return]


def test_concurrent_uploads_end_to_end(server: tuple[str, Path], tmp_path: Path) -> None:
    url, home = server
    auth = {"Authorization": f"Bearer {TOKEN}"}
    work = [(p, scenario) for scenario in SCENARIOS for p in sorted((SAMPLES / scenario).glob("*.json.gz"))]
    with ThreadPoolExecutor(max_workers=4) as pool:
        uploaded = list(pool.map(lambda item: _upload(url, *item), work))
    assert len({t["trace_id"] for t in uploaded}) == len(work)

    deadline = time.monotonic() + 120
    pending = {t["trace_id"] for t in uploaded}
    while pending and time.monotonic() < deadline:
        for trace_id in list(pending):
            status = httpx.get(f"{url}/api/v1/traces/{trace_id}", headers=auth).json()["status"]
            assert status != "failed"
            if status == "done":
                pending.discard(trace_id)
        time.sleep(0.2)
    assert not pending, f"not ingested in time: {pending}"

    # the same files ingested locally give the same analyses
    local = Warehouse(tmp_path / "local")
    for scenario in SCENARIOS:
        assert local.ingest([SAMPLES / scenario], job=scenario).ok
    job = httpx.get(f"{url}/api/v1/jobs/ddp_straggler", headers=auth).json()
    expected = local.analyze(job="ddp_straggler")
    assert job["traces"] == 4
    assert [row["rank"] for row in job["breakdown"]] == expected.breakdown["rank"].to_list()
    assert [row["busy_ns"] for row in job["breakdown"]] == expected.breakdown["busy_ns"].to_list()
    assert [f["title"] for f in job["findings"]] == [f.title for f in expected.findings]

    sql = "SELECT job, rank, count(*) AS ops FROM device_ops GROUP BY ALL ORDER BY ALL"
    answer = httpx.post(f"{url}/api/v1/sql", json={"sql": sql}, headers=auth).json()
    assert answer["rows"] == [list(r) for r in local.query(sql).rows]

    metrics = httpx.get(f"{url}/metrics", headers=auth).text
    assert f'tracelake_ingests_total{{outcome="ingested"}} {len(work)}' in metrics
    assert not list((home / "uploads").iterdir())


def test_serve_refuses_a_public_address_without_tokens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRACELAKE_TOKENS", raising=False)
    monkeypatch.delenv("TRACELAKE_TOKENS_FILE", raising=False)
    result = CliRunner().invoke(cli, ["serve", "--home", str(tmp_path / "wh"), "--host", "0.0.0.0"])
    assert result.exit_code != 0
    assert "refusing to serve on 0.0.0.0 without API tokens" in result.output
