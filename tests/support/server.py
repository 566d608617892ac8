"""A real ``tracelake serve`` (uvicorn) on a free loopback port, for end-to-end tests."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(url: str, log_path: Path, process: subprocess.Popen[bytes] | None = None) -> None:
    """Wait until the server at ``url`` answers ``/healthz``; fail the test with its log after a minute (or once
    ``process`` has exited)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if (process is not None and process.poll() is not None) or time.monotonic() > deadline:
            pytest.fail(f"the server did not start: {log_path.read_text()}")
        time.sleep(0.2)


@contextmanager
def running_server(args: list[str], env: dict[str, str], log_path: Path) -> Iterator[str]:
    """Run ``tracelake serve ARGS`` until ``/healthz`` answers; yield its URL, stop it afterwards.

    Fails the test with the server's log if it does not come up within a minute.
    """
    port = free_port()
    with log_path.open("wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "tracelake.api.cli", "serve", "--port", str(port), *args],
                                   env=env, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(url, log_path, process)
            yield url
        finally:
            process.terminate()
            process.wait(30)


def read_answer(s: socket.socket) -> tuple[int, bytes]:
    """The status and body of the one answer on ``s``; (0, b"") if the server closed without one."""
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length")), 0)
        while len(body) < length:
            chunk = s.recv(65536)
            if not chunk:
                break
            body += chunk
    except ConnectionResetError:
        return 0, b""
    if not head:
        return 0, b""
    return int(head.split(b" ")[1]), body
