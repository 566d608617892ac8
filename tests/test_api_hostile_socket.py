"""Hostile input at the API over a real socket: slow clients, stalls, streams past a limit, broken HTTP.

What only a socket can do, against a real ``tracelake serve`` on 127.0.0.1 with small limits
and short timeouts: slow and stalled uploads are cut off without holding up others, an oversized
upload is refused before its body is read, malformed multipart and broken HTTP get a 400, and a
zip bomb sent three times at once is refused without the server's memory growing. Each attack
gets its 4xx and the server keeps serving; the in-process cases are in ``test_api_hostile.py``.
"""

from __future__ import annotations

import gzip
import os
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil
import pytest

from support.hostile import MALFORMED, TRACE, MiB, auth, multipart, refused, still_serves, zip_bytes
from support.server import read_answer, running_server
from support.tokens import WRITER
from support.uploads import uploads_left

pytestmark = pytest.mark.slow  # the attack suite: a real server, slow clients, bombs

HEADER_TIMEOUT = 2
IDLE_TIMEOUT = 2


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A real server with small limits and short timeouts; yields its URL and warehouse."""
    folder = tmp_path_factory.mktemp("hostile")
    home = folder / "warehouse"
    env = {**os.environ, "TRACELAKE_HOME": str(home), "TRACELAKE_TOKENS": f"{WRITER}:read,write",
           "TRACELAKE_MAX_FILE_BYTES": str(2 * MiB), "TRACELAKE_MAX_REQUEST_BYTES": str(4 * MiB),
           "TRACELAKE_HEADER_TIMEOUT_SECONDS": str(HEADER_TIMEOUT),
           "TRACELAKE_UPLOAD_IDLE_TIMEOUT_SECONDS": str(IDLE_TIMEOUT)}
    with running_server(["--ingest-workers", "0"], env, folder / "server.log") as url:
        yield url, home


@pytest.fixture
def web(live: tuple[str, Path]) -> Iterator[httpx.Client]:
    url, _ = live
    with httpx.Client(base_url=url, headers=auth(WRITER), timeout=30) as c:
        yield c


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=15)
    return s


def _head(method: str, path: str, **headers: object) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", f"Authorization: Bearer {WRITER}",
             *(f"{k.replace('_', '-')}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def test_slow_clients_do_not_hold_up_others_and_are_cut_off(live: tuple[str, Path], web: httpx.Client) -> None:
    url, _ = live
    request = _head("GET", "/healthz")
    slow = [_connect(url) for _ in range(20)]
    started = time.monotonic()
    for s in slow:
        s.sendall(request[:5])
    answered = []
    for i in range(8):  # trickle a byte per 0.25 s each; everyone else is answered meanwhile at once
        for s in slow:
            s.sendall(request[5 + i:6 + i])
        t = time.perf_counter()
        assert web.get("/healthz").status_code == 200
        answered.append(time.perf_counter() - t)
        time.sleep(0.25)
    assert max(answered) < 1, answered
    for s in slow:
        status, body = read_answer(s)  # the head never completed: 408 at the header timeout, then closed
        assert status == 408 and b"TRACELAKE_HEADER_TIMEOUT_SECONDS" in body, body
        assert s.recv(10) == b""
        s.close()
    assert time.monotonic() - started < HEADER_TIMEOUT + 5
    still_serves(web)


def test_a_stalled_upload_is_cut_off(live: tuple[str, Path], web: httpx.Client) -> None:
    url, home = live
    data = TRACE.read_bytes()
    raw = _connect(url)
    raw.sendall(_head("PUT", "/api/v1/traces/stalled.json.gz", Content_Length=len(data)) + data[:1000])
    form = _connect(url)
    body = multipart(b'Content-Disposition: form-data; name="file"; filename="stalled.json.gz"\r\n\r\n' + data)
    form.sendall(_head("POST", "/api/v1/traces", Content_Type="multipart/form-data; boundary=xyz",
                       Content_Length=len(body)) + body[:2000])
    started = time.monotonic()
    assert web.get("/healthz").status_code == 200  # served while the uploads stall
    for s in (raw, form):
        status, answer = read_answer(s)
        assert status == 408 and b"TRACELAKE_UPLOAD_IDLE_TIMEOUT_SECONDS" in answer, answer
        assert IDLE_TIMEOUT - 0.5 < time.monotonic() - started < IDLE_TIMEOUT + 5
        s.close()
    assert uploads_left(home) == []
    still_serves(web)


def test_a_slow_but_steady_upload_is_not_cut_off(live: tuple[str, Path], web: httpx.Client) -> None:
    """The upload timeout is for silence, not for slowness: a byte stream slower than it in total still lands."""
    data = gzip.compress(gzip.decompress(TRACE.read_bytes()).replace(b'"ddp"', b'"ddq"'))

    def trickle() -> Iterator[bytes]:
        for at in range(0, len(data), len(data) // 6 + 1):
            time.sleep(IDLE_TIMEOUT / 3)
            yield data[at:at + len(data) // 6 + 1]

    started = time.monotonic()
    answer = web.put("/api/v1/traces/steady.json.gz", params={"wait": 60}, content=trickle())
    assert time.monotonic() - started > IDLE_TIMEOUT
    assert answer.status_code == 202 and answer.json()["traces"][0]["status"] == "done", answer.text


def test_an_oversized_upload_is_refused_before_its_body_is_read(live: tuple[str, Path], web: httpx.Client) -> None:
    url, home = live
    s = _connect(url)
    s.sendall(_head("PUT", "/api/v1/traces/huge.json", Content_Length=10 << 30))
    status, body = read_answer(s)  # answered after the headers alone
    assert status == 413 and b"TRACELAKE_MAX_REQUEST_BYTES" in body, body
    started, sent = time.monotonic(), 0
    with pytest.raises(OSError):  # the server stops reading: the connection ends after a short linger
        while time.monotonic() - started < 30:
            s.sendall(bytes(MiB))
            sent += MiB
    s.close()
    assert time.monotonic() - started < 10

    def endless() -> Iterator[bytes]:  # no Content-Length (chunked): refused at the limit as it streams
        for _ in range(64):
            yield bytes(MiB)

    refused(web.put("/api/v1/traces/endless.json", content=endless()), 413, "TRACELAKE_MAX_")
    files = [("file", ("big.json", bytes(3 * MiB)))]
    refused(web.post("/api/v1/traces", files=files), 413, "big.json", "TRACELAKE_MAX_FILE_BYTES")
    assert uploads_left(home) == []
    still_serves(web)


def test_malformed_multipart_over_the_wire(live: tuple[str, Path], web: httpx.Client) -> None:
    url, home = live
    for case, (content_type, body) in sorted(MALFORMED.items()):
        s = _connect(url)
        s.sendall(_head("POST", "/api/v1/traces", Content_Type=content_type, Content_Length=len(body)) + body)
        status, answer = read_answer(s)
        s.close()
        assert status == 400 and b'"error"' in answer, (case, status, answer)
    assert uploads_left(home) == []
    still_serves(web)


def test_broken_http_is_refused(live: tuple[str, Path], web: httpx.Client) -> None:
    url, _ = live
    for raw in (
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * MiB + b"\r\n\r\n",  # a head over 16 KiB
        b"BREW /healthz HTCPCP/1.0\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + os.urandom(64),  # a TLS hello to the plain-HTTP port
    ):
        s = _connect(url)
        try:
            s.sendall(raw)
        except OSError:
            pass
        status, _ = read_answer(s)
        s.close()
        assert status == 400, raw[:40]
    still_serves(web)


def test_a_zip_bomb_end_to_end(live: tuple[str, Path], web: httpx.Client) -> None:
    url, home = live
    bomb = zip_bytes({"rank-0.json": bytes(256 * MiB)})
    assert len(bomb) < 1 * MiB
    port = url.rsplit(":", 1)[1]
    server = next(p for p in psutil.Process().children() if "serve" in p.cmdline() and port in p.cmdline())
    before = server.memory_info().rss
    with ThreadPoolExecutor(max_workers=3) as pool:
        answers = list(pool.map(lambda _: web.post("/api/v1/traces", files=[("file", ("bomb.zip", bomb))]), range(3)))
    for answer in answers:
        refused(answer, 413, "bomb.zip", "TRACELAKE_MAX_EXPANSION_RATIO")
    assert server.memory_info().rss - before < 200 * MiB
    assert uploads_left(home) == []
    unauthorised = httpx.post(f"{url}/api/v1/traces", files=[("file", ("bomb.zip", bomb))])
    refused(unauthorised, 401, "token")
    still_serves(web)
