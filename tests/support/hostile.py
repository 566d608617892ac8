"""What the hostile-input tests of the API share: the good trace, the answers they expect, hand-made bodies.

``refused`` checks a 4xx JSON error, ``still_serves`` that the server still answers and ingests;
``zip_bytes`` and ``multipart`` build archives and multipart bodies, ``MALFORMED`` the broken
multipart requests sent both in process and over a real socket. Used by ``test_api_hostile.py``
and ``test_api_hostile_socket.py``.
"""

from __future__ import annotations

import io
import zipfile
from typing import Any

import httpx
from fastapi.testclient import TestClient

from support.paths import SAMPLES

TRACE = SAMPLES / "ddp_straggler" / "rank-0.json.gz"
MiB = 1 << 20


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def refused(answer: httpx.Response, status: int, *words: str) -> dict[str, Any]:
    """Assert ``answer`` is the JSON error ``status`` whose message holds every one of ``words``."""
    assert answer.status_code == status, answer.text
    body: dict[str, Any] = answer.json()
    assert body["kind"] and "Traceback" not in answer.text
    for word in words:
        assert word in body["error"], (word, body["error"])
    return body


def still_serves(client: TestClient | httpx.Client, upload: bool = True, **kw: Any) -> None:
    """The server answers a health check, a query and (with ``upload``) takes and ingests a good upload."""
    assert client.get("/healthz").status_code == 200
    answer = client.post("/api/v1/sql", json={"sql": "SELECT 42 AS answer"}, **kw)
    assert answer.status_code == 200 and answer.json()["rows"] == [[42]], answer.text
    if not upload:
        return
    answer = client.post("/api/v1/traces", params={"wait": 60}, files=[("file", (TRACE.name, TRACE.read_bytes()))],
                         **kw)
    assert answer.status_code == 202 and answer.json()["traces"][0]["status"] == "done", answer.text


def zip_bytes(members: dict[str, bytes], compression: int = zipfile.ZIP_DEFLATED) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buffer.getvalue()


def multipart(*parts: bytes, boundary: bytes = b"xyz", end: bytes = b"--xyz--\r\n") -> bytes:
    return b"".join(b"--" + boundary + b"\r\n" + p + b"\r\n" for p in parts) + end


FILE_PART = b'Content-Disposition: form-data; name="file"; filename="a.json"\r\n\r\n{"traceEvents": []}'
MALFORMED: dict[str, tuple[str, bytes]] = {
    "no boundary": ("multipart/form-data", multipart(FILE_PART)),
    "not multipart": ("application/json", b'{"file": "a.json"}'),
    "wrong boundary": ("multipart/form-data; boundary=abc", multipart(FILE_PART)),
    "truncated": ("multipart/form-data; boundary=xyz", multipart(FILE_PART, end=b"")[:60]),
    "no closing boundary": ("multipart/form-data; boundary=xyz", multipart(FILE_PART, end=b"")),
    "garbage header": ("multipart/form-data; boundary=xyz", multipart(b"this is no header\r\n\r\n{}")),
    "huge part header": ("multipart/form-data; boundary=xyz",
                         multipart(b"X-Junk: " + b"a" * (1 * MiB) + b"\r\n" + FILE_PART)),
    "huge form field": ("multipart/form-data; boundary=xyz",
                        multipart(b'Content-Disposition: form-data; name="job"\r\n\r\n' + b"j" * (100 << 10))),
    "too many parts": ("multipart/form-data; boundary=xyz",
                       multipart(*[b'Content-Disposition: form-data; name="x"\r\n\r\n1'] * 1001)),
    "no file": ("multipart/form-data; boundary=xyz",
                multipart(b'Content-Disposition: form-data; name="job"\r\n\r\nddp')),
    "empty": ("multipart/form-data; boundary=xyz", b""),
}
