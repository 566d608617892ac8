"""Uploads as the API tests make them: a multipart form of files, one upload through a TestClient, and what an
upload left in the warehouse's ``uploads/`` folder. Used by ``test_api.py``, ``test_api_archives.py``,
``test_api_hostile_socket.py`` and ``test_flood.py``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from . import SAMPLES

DDP = SAMPLES / "ddp_straggler"


def files_form(*paths: Path) -> list[tuple[str, tuple[str, bytes, str]]]:
    """The multipart ``file`` fields for ``paths``."""
    return [("file", (p.name, p.read_bytes(), "application/octet-stream")) for p in paths]


def upload(client: TestClient, *paths: Path, job: str = "ddp", wait: float = 60, **kw: object) -> Any:
    """POST ``paths`` to ``/api/v1/traces`` with the form fields ``job`` and ``kw``; the response."""
    data = {"job": job, **{k: str(v) for k, v in kw.items()}}
    return client.post("/api/v1/traces", params={"wait": wait}, files=files_form(*paths), data=data)


def uploads_left(home: Path) -> list[Path]:
    """What is left in ``home/uploads``, waiting up to 5 s: a refused upload's folder goes as the answer is sent."""
    deadline = time.monotonic() + 5
    while (left := list((home / "uploads").iterdir())) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left
