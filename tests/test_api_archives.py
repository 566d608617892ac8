"""Archives uploaded to the REST API (FastAPI TestClient): a tar or zip of traces is ingested member by member;
unsafe members (paths out of the folder, links) and archives without a trace are refused whole."""

from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from support.uploads import DDP, upload, uploads_left


def test_tar_gz_of_a_trace_directory(client: TestClient, tmp_path: Path) -> None:
    archive = tmp_path / "run.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for p in sorted(DDP.glob("*.json.gz")):
            tar.add(p, arcname=f"run/{p.name}")
    answer = upload(client, archive, job="archived")
    assert answer.status_code == 202, answer.text
    traces = answer.json()["traces"]
    assert [t["name"] for t in traces] == [f"run.tar.gz/run/rank-{r}.json.gz" for r in range(4)]
    assert {t["status"] for t in traces} == {"done"}
    ranks = client.post("/api/v1/sql", json={"sql": "SELECT rank FROM traces WHERE job = 'archived' ORDER BY 1"})
    assert ranks.json()["rows"] == [[0], [1], [2], [3]]


def test_zipupload(client: TestClient, tmp_path: Path) -> None:
    archive = tmp_path / "run.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.write(DDP / "rank-3.json.gz", "rank-3.json.gz")
    traces = upload(client, archive, job="zipped").json()["traces"]
    assert [(t["name"], t["status"]) for t in traces] == [("run.zip/rank-3.json.gz", "done")]


@pytest.mark.parametrize("member", ["../evil.json", "/etc/evil.json", "a/../../evil.json"])
def test_archive_traversal_is_refused(client: TestClient, home: Path, tmp_path: Path, member: str) -> None:
    archive = tmp_path / "evil.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr(member, b'{"traceEvents": []}')
    answer = upload(client, archive)
    assert answer.status_code == 400, answer.text
    assert "evil.zip" in answer.json()["error"]
    assert uploads_left(home) == []
    assert not (tmp_path / "evil.json").exists() and not (home / "evil.json").exists()
    assert client.get("/api/v1/traces").json()["total"] == 0


def test_symlink_in_archive_is_refused(client: TestClient, home: Path, tmp_path: Path) -> None:
    archive = tmp_path / "link.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        info = tarfile.TarInfo("passwd.json")
        info.type = tarfile.SYMTYPE
        info.linkname = "/etc/passwd"
        tar.addfile(info)
    answer = upload(client, archive)
    assert answer.status_code == 400 and "link" in answer.json()["error"].lower()
    assert uploads_left(home) == []


def test_upload_of_in_memory_zip(client: TestClient) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        z.writestr("notes/readme.md", b"no traces here")
    answer = client.post("/api/v1/traces", files=[("file", ("empty.zip", buffer.getvalue(), "application/zip"))])
    assert answer.status_code == 400 and "no trace file" in answer.json()["error"]
