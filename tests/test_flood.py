"""Flooding (issue 18, attack 6): idle connections, busy threads and slow bodies never keep /healthz waiting.

In process: ``/healthz`` runs on the event loop, so it answers while every thread of
the pool is taken, and it never waits on the ingest queue's lock. Against a real
``tracelake serve`` on 127.0.0.1 with small limits: a flood of idle connections is
cut down to ``max_connections`` (the idle longest closed first) while health checks,
requests and a request in progress go on; with every connection busy a new one gets
a 503; an upload that trickles on past its deadline, and a request body that stalls,
get a 408 and leave nothing behind.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import select
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tracelake.api.app import create_app
from tracelake.api.connections import RESERVED_FILES, ConnectionBudget, connections_for, fit_open_files
from tracelake.api.ingest_queue import QueuedFile
from tracelake.api.routes import health
from tracelake.api.settings import ServerSettings
from tracelake.warehouse import InvalidArgument

from support.server import read_answer, running_server
from support.uploads import uploads_left

pytestmark = pytest.mark.slow  # a real uvicorn server under a flood of connections

TOKEN = "flood-writer-token"
MAX_CONNECTIONS = 200
DEADLINE = 3  # TRACELAKE_UPLOAD_DEADLINE_SECONDS
IDLE_TIMEOUT = 2  # TRACELAKE_UPLOAD_IDLE_TIMEOUT_SECONDS
#: What "answered at once" means here: generous, for a loaded two-core machine.
PROMPT = 5.0


# -- in process: /healthz never waits for a thread or a lock -----------------------------------------


def test_healthz_answers_while_every_thread_is_busy(home: Path) -> None:
    """50 requests to a blocking route take all 40 threads of the pool; /healthz still answers."""
    assert inspect.iscoroutinefunction(health.healthz)
    app = create_app(ServerSettings(home=home, ingest_workers=0))
    release = threading.Event()
    entered = threading.Semaphore(0)

    def blocking() -> dict[str, str]:
        entered.release()
        release.wait(30)
        return {"done": "yes"}

    app.add_api_route("/test/blocking", blocking)

    async def scenario() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            busy = [asyncio.create_task(client.get("/test/blocking")) for _ in range(50)]
            try:
                for _ in range(40):  # the whole pool is blocked
                    assert await asyncio.to_thread(entered.acquire, timeout=30)
                answer = await asyncio.wait_for(client.get("/healthz"), PROMPT)
                assert answer.status_code == 200 and answer.json()["status"] == "ok", answer.text
                assert not any(task.done() for task in busy)
            finally:
                release.set()
            assert all(r.status_code == 200 for r in await asyncio.gather(*busy))

    asyncio.run(scenario())


def test_healthz_does_not_wait_for_the_queue(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While the ingest queue's lock is held (an upload being queued), /healthz answers at once, with the depth."""
    app = create_app(ServerSettings(home=home, ingest_workers=0))
    queue = app.state.tracelake.queue
    held, release = threading.Event(), threading.Event()

    def slow_check(trace_id: str) -> str:
        """The queue asks the warehouse about each file while it holds its lock: this one takes its time."""
        held.set()
        release.wait(30)
        return "elsewhere"  # already in the warehouse: nothing to ingest

    monkeypatch.setattr(queue.store, "registered_job", slow_check)
    queue.start()  # (the lifespan, which would start it, does not run under ASGITransport)
    folder = queue.new_folder()
    upload = [QueuedFile("0" * 20, "rank-0.json", folder / "rank-0.json")]

    def hold_the_lock() -> None:
        queue.submit(folder, upload, "flood", {})

    async def scenario() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            assert (await client.get("/healthz")).json()["queue_depth"] == 0
            holder = threading.Thread(target=hold_the_lock)
            holder.start()
            assert held.wait(10)
            try:
                for _ in range(3):
                    answer = await asyncio.wait_for(client.get("/healthz"), PROMPT)
                    assert answer.status_code == 200 and answer.json()["queue_depth"] == 0
            finally:
                release.set()
                holder.join()

    try:
        asyncio.run(scenario())
    finally:
        queue.stop()


def test_connections_fit_under_the_open_file_limit() -> None:
    assert connections_for(1000, 20_000) == 1000
    assert connections_for(1000, None) == 1000
    assert connections_for(1000, 1024) == 1024 - RESERVED_FILES
    assert connections_for(1000, 300) == 150  # a tiny limit: half of it
    budget = ConnectionBudget(768, 1000, 1024)
    assert budget.limit_concurrency > budget.max_connections  # uvicorn counts idle connections against it too
    assert "lowered from 1,000" in budget.describe() and "TRACELAKE_MAX_CONNECTIONS" in budget.describe()
    with pytest.raises(InvalidArgument, match="TRACELAKE_MAX_CONNECTIONS"):
        fit_open_files(0)


# -- over real sockets -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A real server with room for 200 connections, a 3 s upload deadline and a 2 s idle timeout."""
    folder = tmp_path_factory.mktemp("flood")
    home = folder / "warehouse"
    env = {**os.environ, "TRACELAKE_HOME": str(home), "TRACELAKE_TOKENS": f"{TOKEN}:read,write",
           "TRACELAKE_MAX_CONNECTIONS": str(MAX_CONNECTIONS), "TRACELAKE_UPLOAD_DEADLINE_SECONDS": str(DEADLINE),
           "TRACELAKE_UPLOAD_IDLE_TIMEOUT_SECONDS": str(IDLE_TIMEOUT)}
    log = folder / "server.log"
    with running_server(["--ingest-workers", "0"], env, log) as url:
        yield url, home
    assert f"at most {MAX_CONNECTIONS} open" in log.read_text()


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=15)


def _head(method: str, path: str, token: str | None = TOKEN, **headers: object) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1",
             *([f"Authorization: Bearer {token}"] if token else []),
             *(f"{k.replace('_', '-')}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _readable(s: socket.socket) -> bool:
    """Whether ``s`` has something to read (or was closed), without waiting; poll, not select: fds past 1024."""
    poller = select.poll()
    poller.register(s, select.POLLIN)
    return bool(poller.poll(0))


class _Held:
    """One connection of a flood: what the server sent on it, and whether it closed it."""

    def __init__(self, url: str, send: bytes = b"") -> None:
        self.s = _connect(url)
        if send:
            self.s.sendall(send)
        self.received = b""
        self.closed = False

    def gone(self) -> bool:
        """Read what arrived, without waiting; True once the server has closed the connection."""
        while not self.closed and _readable(self.s):
            try:
                chunk = self.s.recv(65536)
            except ConnectionResetError:
                chunk = b""
            self.received += chunk
            self.closed = not chunk
        return self.closed


def _prompt_get(url: str, path: str, **kw: object) -> httpx.Response:
    started = time.monotonic()
    answer = httpx.get(f"{url}{path}", timeout=PROMPT * 2, **kw)  # type: ignore[arg-type]
    assert time.monotonic() - started < PROMPT, f"{path} took {time.monotonic() - started:.1f} s"
    return answer


class _Trickle:
    """Sends up to ``most`` spaces on ``s``, one per 0.3 s, from a thread: a body that is slow but never idle."""

    def __init__(self, s: socket.socket, most: int) -> None:
        self.s = s
        self.most = most
        self.sent = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while self.sent < self.most and not self.stop.wait(0.3):
            try:
                self.s.sendall(b" ")
            except OSError:
                return
            self.sent += 1

    def finish(self) -> int:
        """Stop; the spaces sent."""
        self.stop.set()
        self.thread.join()
        return self.sent


def test_a_flood_of_idle_connections_is_cut_down_while_everyone_is_served(live: tuple[str, Path]) -> None:
    url, _ = live
    # a request in progress (its JSON body still arriving) is never closed to make room
    working = _connect(url)
    query, pad = b'{"sql": "SELECT 42 AS answer"', 200
    working.sendall(_head("POST", "/api/v1/sql", Content_Type="application/json",
                          Content_Length=len(query) + pad + 1) + query)
    trickle = _Trickle(working, most=pad)

    head = b"GET /api/v1/traces HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    partial = [_Held(url, send=head) for _ in range(100)]  # part of a request head each
    time.sleep(0.5)  # read by the server: these are now the idle longest
    flood = partial + [_Held(url) for _ in range(600)]  # connected, sending nothing

    for _ in range(5):
        answer = _prompt_get(url, "/healthz")
        assert answer.status_code == 200 and answer.json()["status"] == "ok"
        answer = _prompt_get(url, "/api/v1/traces", headers={"Authorization": f"Bearer {TOKEN}"})
        assert answer.status_code == 200, answer.text
        time.sleep(0.2)

    # the server holds at most MAX_CONNECTIONS: the rest of the flood was closed, the idle longest first
    deadline = time.monotonic() + 10
    while (closed := sum(h.gone() for h in flood)) < len(flood) - MAX_CONNECTIONS and time.monotonic() < deadline:
        time.sleep(0.2)
    assert closed >= len(flood) - MAX_CONNECTIONS, closed
    for h in partial:  # a partial request head closed to make room is told why
        assert h.gone() and h.received.startswith(b"HTTP/1.1 503 "), h.received
        assert json.loads(h.received.partition(b"\r\n\r\n")[2])["error"].count("TRACELAKE_MAX_CONNECTIONS")

    working.sendall(b" " * (pad - trickle.finish()) + b"}")
    status, body = read_answer(working)
    assert status not in (0, 408, 503), (status, body)  # answered (a 401 without a token, say), not cut off
    for h in flood:
        h.s.close()
    working.close()
    assert _prompt_get(url, "/healthz").status_code == 200


def test_with_every_connection_busy_a_new_one_gets_503(live: tuple[str, Path]) -> None:
    url, _ = live
    body = b'{"sql": "SELECT 1"}'
    busy_head = _head("POST", "/api/v1/sql", Content_Type="application/json", Content_Length=len(body))
    busy = [_Held(url, send=busy_head + body[:5]) for _ in range(MAX_CONNECTIONS + 10)]  # each body unfinished
    try:
        time.sleep(0.5)
        late = _Held(url)
        deadline = time.monotonic() + PROMPT
        while not late.gone() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert late.received.startswith(b"HTTP/1.1 503 ") and b"TRACELAKE_MAX_CONNECTIONS" in late.received, \
            late.received
        assert sum(not h.gone() for h in busy) >= MAX_CONNECTIONS - 10  # busy ones are not closed to make room
    finally:
        for h in busy:
            h.s.close()
    deadline = time.monotonic() + 10
    while True:  # once they are gone there is room again
        try:
            if httpx.get(f"{url}/healthz", timeout=PROMPT).status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline
        time.sleep(0.2)


def test_a_trickling_upload_is_cut_off_at_the_deadline(live: tuple[str, Path]) -> None:
    """A body that never pauses long enough for the idle timeout still ends at the upload deadline: 408."""
    url, home = live
    size = 1 << 20
    raw = _connect(url)
    raw.sendall(_head("PUT", "/api/v1/traces/trickle.json", Content_Length=size))
    boundary = b"flood"
    part = b"--" + boundary + b'\r\nContent-Disposition: form-data; name="file"; filename="trickle.json"\r\n\r\n'
    form = _connect(url)
    form.sendall(_head("POST", "/api/v1/traces", Content_Type=f"multipart/form-data; boundary={boundary.decode()}",
                       Content_Length=len(part) + size) + part)
    started = time.monotonic()
    answers: dict[socket.socket, tuple[int, bytes]] = {}
    while len(answers) < 2 and time.monotonic() - started < DEADLINE + 15:
        for s in (raw, form):
            if s in answers:
                continue
            if _readable(s):
                answers[s] = read_answer(s)
            else:
                s.sendall(b"[" * 64)  # 64 bytes per 0.25 s: never idle for IDLE_TIMEOUT
        time.sleep(0.25)
    took = time.monotonic() - started
    assert len(answers) == 2, "no answer at the deadline"
    for status, body in answers.values():
        assert status == 408, (status, body)
        error = json.loads(body)
        assert "TRACELAKE_UPLOAD_DEADLINE_SECONDS" in error["error"] and error["kind"] == "UploadDeadlinePassed"
    assert DEADLINE - 0.5 < took < DEADLINE + 10, took
    for s in (raw, form):  # the connection ends: the rest of the body is not read
        s.settimeout(10)
        with pytest.raises(OSError):
            while True:
                s.sendall(b"[" * 65536)
        s.close()
    assert uploads_left(home) == []
    assert _prompt_get(url, "/healthz").status_code == 200


def test_a_stalled_request_body_is_cut_off(live: tuple[str, Path]) -> None:
    """A JSON body that stops (read before the token is checked, by no route's timer) gets a 408 too."""
    url, _ = live
    s = _connect(url)
    s.sendall(_head("POST", "/api/v1/sql", token=None, Content_Type="application/json", Content_Length=100) + b"{")
    started = time.monotonic()
    status, body = read_answer(s)
    took = time.monotonic() - started
    assert status == 408 and b"TRACELAKE_UPLOAD_IDLE_TIMEOUT_SECONDS" in body, (status, body)
    assert IDLE_TIMEOUT <= took < IDLE_TIMEOUT + 15, took
    s.close()
