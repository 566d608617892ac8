"""Hostile input at the API: each attack gets its 4xx with a clear error, and the server keeps serving.

The cases of issue #9 part 4, one test each: zip and gzip bombs, path traversal and
links in archives, oversized uploads, slow and stalled clients, malformed multipart,
SQL that reads or writes files, attaches databases, installs extensions or runs for
ever, and requests without a token or with the wrong one or the wrong scope. Cases
covered elsewhere are named in docs/security.md. Most run in process (TestClient);
what only a socket can do (trickle bytes, stall, stream past a limit, break HTTP
itself) runs against a real ``tracelake serve`` on 127.0.0.1, in ``test_api_hostile_socket.py``.
What both share (the expected answers, the hand-made bodies) is in ``support/hostile.py``.
"""

from __future__ import annotations

import gzip
import io
import os
import pickle
import re
import stat
import tarfile
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from tracelake.api.app import create_app
from tracelake.api.settings import ServerSettings
from tracelake.warehouse import Settings

from support.hostile import MALFORMED, TRACE, MiB, auth, refused, still_serves, zip_bytes
from support.tokens import ADMIN, READER, TOKENS, WRITER

pytestmark = pytest.mark.slow  # the attack suite: bombs, big uploads, hostile SQL


def _settings(home: Path, **overrides: object) -> ServerSettings:
    return ServerSettings(home=home, ingest_workers=0, **overrides)


@pytest.fixture
def client(home: Path) -> Iterator[TestClient]:
    """A server without tokens whose limits are small enough to reach in a test."""
    settings = _settings(home, max_expansion_ratio=10, max_expanded_bytes=8 * MiB, sql_timeout_seconds=1,
                         sql_memory_limit="128MB")
    with TestClient(create_app(settings)) as c:
        yield c


def _post(client: TestClient, name: str, data: bytes, wait: float = 0, **kw: Any) -> httpx.Response:
    return client.post("/api/v1/traces", params={"wait": wait}, files=[("file", (name, data))], **kw)


def _nothing_kept(home: Path) -> None:
    """No upload folder is left behind, and nothing was written outside them."""
    assert list((home / "uploads").iterdir()) == []


def _tar(mode: str, *infos: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode) as tar:  # type: ignore[call-overload]
        for info, data in infos:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    return info


# -- bombs ------------------------------------------------------------------------------------------

ZEROS = bytes(64 * MiB)


BOMBS: dict[str, Callable[[], bytes]] = {
    "bomb.zip": lambda: zip_bytes({"rank-0.json": ZEROS}),
    "bomb.json.gz": lambda: gzip.compress(ZEROS, 9),
    "bomb.tar.gz": lambda: _tar("w:gz", (_member("rank-0.json"), ZEROS)),
    "bomb.tar.bz2": lambda: _tar("w:bz2", (_member("rank-0.json"), bytes(16 * MiB))),
    "nested.zip": lambda: zip_bytes({"rank-0.json.gz": gzip.compress(ZEROS, 9)}, zipfile.ZIP_STORED),
}


@pytest.mark.parametrize("name", sorted(BOMBS))
def test_zip_and_gzip_bombs(client: TestClient, home: Path, name: str) -> None:
    bomb = BOMBS[name]()
    assert len(bomb) < 200_000  # 64 MiB (16 for bzip2) of zeros, a thousand times smaller
    started = time.perf_counter()
    refused(_post(client, name, bomb), 413, name, "TRACELAKE_MAX_EXPANSION_RATIO")
    assert time.perf_counter() - started < 10
    _nothing_kept(home)
    still_serves(client)


# -- archives that reach outside their folder ---------------------------------------------------

@pytest.mark.parametrize("member", ["../evil.json", "a/../../evil.json", "/tmp/evil.json", "C:/evil.json",
                                    "a\\..\\..\\evil.json", "evil\x00.json"])
def test_path_traversal_in_a_tar(client: TestClient, home: Path, tmp_path: Path, member: str) -> None:
    archive = _tar("w:gz", (_member(member), b'{"traceEvents": []}'))
    refused(_post(client, "evil.tar.gz", archive), 400, "evil.tar.gz")
    assert not list(tmp_path.rglob("evil*")) and not Path("/tmp/evil.json").exists()
    _nothing_kept(home)
    still_serves(client)


def test_path_traversal_in_upload_file_names(client: TestClient, home: Path, tmp_path: Path) -> None:
    """A client's file name is a label only: `../` in it neither refuses nor writes anywhere else."""
    hostile = "../../../../../../tmp/owned.json.gz"
    answer = _post(client, hostile, TRACE.read_bytes(), wait=60)
    assert answer.status_code == 202, answer.text
    assert answer.json()["traces"][0]["name"] == "owned.json.gz"
    put = client.put("/api/v1/traces/..%2F..%2Fowned.json.gz", content=TRACE.read_bytes())
    assert put.status_code in (202, 404), put.text  # %2F never reaches a path on disk
    assert not Path("/tmp/owned.json.gz").exists() and not list(tmp_path.rglob("owned*"))
    still_serves(client)


def _zip_link() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        info = zipfile.ZipInfo("rank-0.json")
        info.external_attr = (stat.S_IFLNK | 0o777) << 16
        z.writestr(info, "/etc/passwd")
    return buffer.getvalue()


@pytest.mark.parametrize(("name", "archive", "word"), [
    ("link.zip", _zip_link(), "symbolic link"),
    ("link.tar.gz", _tar("w:gz", (_member("passwd.json", tarfile.SYMTYPE, "/etc/passwd"), None)), "symbolic link"),
    ("hard.tar", _tar("w", (_member("shadow.json", tarfile.LNKTYPE, "/etc/shadow"), None)), "hard link"),
    ("dev.tar", _tar("w", (_member("mem.json", tarfile.CHRTYPE), None)), "device"),
    ("fifo.tar", _tar("w", (_member("pipe.json", tarfile.FIFOTYPE), None)), "fifo"),
])
def test_links_and_devices_in_archives(client: TestClient, home: Path, name: str, archive: bytes, word: str) -> None:
    refused(_post(client, name, archive), 400, name, word)
    _nothing_kept(home)
    still_serves(client)


def test_a_link_then_a_file_through_it(client: TestClient, home: Path, tmp_path: Path) -> None:
    """The classic two-step escape: a link to a folder outside, then a member written through it."""
    archive = _tar("w:gz", (_member("out", tarfile.SYMTYPE, str(tmp_path)), None),
                   (_member("out/rank-0.json"), b'{"traceEvents": []}'))
    refused(_post(client, "twostep.tar.gz", archive), 400, "twostep.tar.gz", "symbolic link")
    assert not (tmp_path / "rank-0.json").exists()
    _nothing_kept(home)
    still_serves(client)


def test_too_many_archive_members(home: Path) -> None:
    with TestClient(create_app(_settings(home, max_archive_members=50))) as c:
        archive = zip_bytes({f"f{i}.json": b"{}" for i in range(200)})
        refused(_post(c, "many.zip", archive), 413, "many.zip", "TRACELAKE_MAX_ARCHIVE_MEMBERS")
        _nothing_kept(home)
        still_serves(c)


def test_a_pickle_that_would_run_code(client: TestClient, home: Path, tmp_path: Path) -> None:
    """A Flight Recorder dump is unpickled by a restricted unpickler: a pickle calling a function fails, harmlessly."""
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self) -> tuple[Any, ...]:
            return (os.system, (f"touch {marker}",))

    dump = pickle.dumps({"version": "2.4", "pg_config": {}, "entries": [Payload()]}, protocol=4)
    body = refused(_post(client, "nccl_trace_rank_0", dump, wait=60), 422, "posix.system", "unsafe")
    assert body["kind"] == "IngestFailed"
    assert not marker.exists()
    still_serves(client)


# -- oversized uploads and malformed multipart --------------------------------------------------------

def test_oversized_uploads(home: Path) -> None:
    with TestClient(create_app(_settings(home, max_file_bytes=60_000, max_request_bytes=100_000))) as c:
        refused(_post(c, TRACE.name, bytes(70_000)), 413, "TRACELAKE_MAX_FILE_BYTES")
        two = [("file", (f"r{i}.json.gz", TRACE.read_bytes())) for i in range(3)]
        refused(c.post("/api/v1/traces", files=two), 413, "TRACELAKE_MAX_REQUEST_BYTES")
        declared = c.put("/api/v1/traces/x.json", content=b"x", headers={"Content-Length": str(10 << 30)})
        refused(declared, 413, "10 GiB", "TRACELAKE_MAX_REQUEST_BYTES")
        chunked = c.put("/api/v1/traces/x.json", content=iter([bytes(40_000)] * 4))  # no length: counted as it comes
        refused(chunked, 413, "TRACELAKE_MAX_")
        _nothing_kept(home)
        still_serves(c)


def test_a_chunked_put_counts_against_the_request_limit(home: Path) -> None:
    """A raw body without a Content-Length is held to the request limit too, not only to the file limit."""
    with TestClient(create_app(_settings(home, max_file_bytes=1 << 20, max_request_bytes=100_000))) as c:
        chunked = c.put("/api/v1/traces/x.json", content=iter([bytes(40_000)] * 4))
        refused(chunked, 413, "TRACELAKE_MAX_REQUEST_BYTES")
        _nothing_kept(home)
        still_serves(c)




@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_multipart(client: TestClient, home: Path, case: str) -> None:
    content_type, body = MALFORMED[case]
    answer = client.post("/api/v1/traces", content=body, headers={"Content-Type": content_type})
    error = refused(answer, 400)["error"]
    assert any(word in error for word in ("multipart", "form field", "file")), error
    _nothing_kept(home)
    still_serves(client)


# -- SQL ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("sql", [
    "SELECT * FROM read_text('/etc/passwd')",
    "SELECT * FROM read_csv('/proc/self/environ')",
    "SELECT * FROM read_blob('{home}/tracelake.duckdb')",
    "SELECT * FROM glob('/*')",
    "SELECT * FROM read_parquet('{home}/../*.parquet')",
    "SELECT * FROM read_text('{home}/tables/../tracelake.duckdb')",
    "SELECT * FROM read_csv('https://example.com/x.csv')",
])
def test_sql_that_reads_files(client: TestClient, home: Path, sql: str) -> None:
    answer = client.post("/api/v1/sql", json={"sql": sql.format(home=home)})
    refused(answer, 400)
    assert "root:" not in answer.text and "TRACELAKE_" not in answer.text
    still_serves(client, upload=False)


@pytest.mark.parametrize(("template", "word"), [
    ("COPY (SELECT 1) TO '{target}'", "got COPY"),
    ("WITH x AS (COPY (SELECT 1) TO '{target}') SELECT 1", "got COPY inside the query"),
    ("EXPORT DATABASE '{folder}'", "got EXPORT"),
    ("CREATE TABLE t AS SELECT 1", "got CREATE"),
    ("SELECT * FROM query('COPY (SELECT 1) TO ''{target}''')", "query() is not allowed"),
    ("EXPLAIN ANALYZE COPY (SELECT 1) TO '{target}'", "EXPLAIN is allowed only"),
])
def test_sql_that_writes_files(client: TestClient, home: Path, tmp_path: Path, template: str, word: str) -> None:
    target = home / "tables" / "evil.csv"
    sql = template.format(target=target, folder=tmp_path / "dump")
    refused(client.post("/api/v1/sql", json={"sql": sql}), 400, word)
    assert not target.exists() and not (tmp_path / "dump").exists()
    still_serves(client, upload=False)


@pytest.mark.parametrize("sql", [
    "ATTACH '{home}/tracelake.duckdb' AS w",
    "ATTACH '{home}/tracelake.duckdb' AS w (READ_ONLY)",
    "ATTACH ':memory:' AS m",
    "DETACH memory",
    "USE system",
])
def test_sql_that_attaches_databases(client: TestClient, home: Path, sql: str) -> None:
    refused(client.post("/api/v1/sql", json={"sql": sql.format(home=home)}), 400, "only one SELECT query")
    still_serves(client, upload=False)


@pytest.mark.parametrize(("sql", "word"), [
    ("INSTALL httpfs", "INSTALL"),
    ("FORCE INSTALL httpfs FROM 'http://127.0.0.1:1/'", "FORCE"),
    ("LOAD httpfs", "LOAD"),
    ("LOAD '/tmp/evil.duckdb_extension'", "LOAD"),
    ("SELECT * FROM iceberg_scan('x')", "iceberg_scan"),  # no autoloading of known extensions either
    ("SET enable_external_access = true", "SET"),
])
def test_sql_that_installs_extensions(client: TestClient, sql: str, word: str) -> None:
    refused(client.post("/api/v1/sql", json={"sql": sql}), 400, word)
    still_serves(client, upload=False)


@pytest.mark.parametrize(("sql", "word"), [
    ("SELECT count(*) FROM range(10000000000000) a", "cancelled after 1 s"),
    ("WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r) SELECT count(*) FROM r", "cancelled after 1 s"),
    ("SELECT list(i ORDER BY random()) FROM range(100000000) t(i)", "Out of Memory"),
])
def test_sql_that_runs_for_ever(client: TestClient, sql: str, word: str) -> None:
    started = time.perf_counter()
    refused(client.post("/api/v1/sql", json={"sql": sql}), 400, word)
    assert time.perf_counter() - started < 10
    still_serves(client, upload=False)


def test_sql_rows_are_capped(client: TestClient) -> None:
    """Asking for more rows than the server allows gets its limit, computed lazily (no endless result in memory)."""
    for ask in ({"max_rows": 10**9}, {}):
        answer = client.post("/api/v1/sql", json={"sql": "SELECT * FROM range(10000000000000)", **ask})
        assert answer.status_code == 200 and answer.json()["truncated"] is True
        assert answer.json()["row_count"] == Settings().sql_max_rows
    assert client.post("/api/v1/sql", json={"sql": "SELECT 1", "max_rows": 0}).status_code == 422
    assert client.post("/api/v1/sql", json={"sql": "SELECT 1" + " " * 100_000}).status_code == 422
    still_serves(client, upload=False)


# -- tokens and scopes ----------------------------------------------------------------------------

#: Operations that need more than ``read``; every other operation with a security scheme needs ``read``.
WRITE_AND_ADMIN = {("POST", "/api/v1/traces"): "write", ("PUT", "/api/v1/traces/{name}"): "write",
                   ("DELETE", "/api/v1/traces/{trace_id}"): "admin"}
CONCRETE = {"{name}": "x.json", "{trace_id}": "0123456789abcdef0123", "{job}": "ddp"}


def _operations(client: TestClient) -> list[tuple[str, str, str | None]]:
    """Every operation in the API's schema, with a concrete path and the scope it needs (None: open)."""
    found = []
    for template, methods in client.get("/openapi.json").json()["paths"].items():
        path = re.sub(r"\{[^}]+\}", lambda m: CONCRETE.get(m.group(0), "x"), template)
        for method, operation in methods.items():
            needs = WRITE_AND_ADMIN.get((method.upper(), template), "read") if operation.get("security") else None
            found.append((method.upper(), path, needs))
    return found


@pytest.mark.parametrize("header", [None, "Bearer wrong-token-0001", "Bearer ", f"Basic {READER}", f"bearer{READER}",
                                    f"Bearer {READER[:-1]}", f"Bearer {READER}x", f"Token {READER}"])
def test_requests_without_a_valid_token(secured: TestClient, header: str | None) -> None:
    operations = _operations(secured)
    assert len(operations) >= 12
    headers = {"Authorization": header} if header is not None else {}
    for method, path, needs in operations:
        answer = secured.request(method, path, headers=headers)
        if needs is None:
            assert answer.status_code == 200, (method, path)
            continue
        refused(answer, 401, "token")
    assert secured.get(f"/api/v1/jobs?token={READER}").status_code == 401  # tokens travel in the header only
    still_serves(secured, upload=False, headers=auth(WRITER))


def test_requests_with_the_wrong_scope(secured: TestClient) -> None:
    rank = {"read": 0, "write": 1, "admin": 2}
    for token, scope in ((READER, "read"), (WRITER, "write")):
        for method, path, needs in _operations(secured):
            if needs is None or rank[needs] <= rank[scope]:
                continue
            answer = secured.request(method, path, headers=auth(token))
            refused(answer, 403, f"lacks the {needs!r} scope")
    still_serves(secured, upload=False, headers=auth(WRITER))
