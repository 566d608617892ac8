"""Shared fixtures: sample and real traces, fresh and pre-filled warehouses, a folder to unpack archives
into; hypothesis profiles.

Plain helpers and constants (paths, protobuf encoding, a real server) are in ``tests/support``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import settings

# The CLI's consoles fix their width when they are created if COLUMNS is set then (pytest-xdist's workers
# inherit the controlling terminal's): without it they follow the COLUMNS each test gives its command.
os.environ.pop("COLUMNS", None)
os.environ.pop("LINES", None)

from support import FLEET_JOBS, REAL_KINETO, SAMPLES  # noqa: E402 - after the terminal size is cleared
from support.tokens import TOKENS  # noqa: E402
from tracelake.api.settings import ServerSettings  # noqa: E402
from tracelake.warehouse import Warehouse  # noqa: E402

if TYPE_CHECKING:
    from fastapi.testclient import TestClient

# Hypothesis draws the same examples every run by default (a failure in CI reproduces at a desk);
# TRACELAKE_HYPOTHESIS=random explores new ones, and prints how to reproduce what it finds.
settings.register_profile("deterministic", derandomize=True, database=None, deadline=None, print_blob=True)
settings.register_profile("random", derandomize=False, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("TRACELAKE_HYPOTHESIS") or "deterministic")


@pytest.fixture
def real_kineto() -> Path:
    """The real Kineto traces folder; skips the test where ../shared is absent."""
    if not REAL_KINETO.is_dir():
        pytest.skip("../shared/real_traces/pytorch_profiler is not present")
    return REAL_KINETO


@pytest.fixture
def samples() -> Path:
    """The project's own sample traces (one folder per scenario)."""
    return SAMPLES


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A warehouse directory that does not exist yet."""
    return tmp_path / "warehouse"


@pytest.fixture
def warehouse(home: Path) -> Warehouse:
    """A fresh, empty warehouse."""
    return Warehouse(home)


@pytest.fixture(scope="session")
def sample_warehouse_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A warehouse with every sample scenario ingested (job = scenario name); read-only for tests."""
    home = tmp_path_factory.mktemp("samples") / "warehouse"
    wh = Warehouse(home)
    for scenario in sorted(p for p in SAMPLES.iterdir() if p.is_dir()):
        report = wh.ingest([scenario], job=scenario.name)
        assert report.ok, [r.error for r in report.failed]
    return home


@pytest.fixture
def sample_warehouse(sample_warehouse_home: Path) -> Warehouse:
    """The pre-filled sample warehouse."""
    return Warehouse(sample_warehouse_home)


@pytest.fixture
def copy_sample(tmp_path: Path):  # type: ignore[no-untyped-def]
    """Copy a sample file into a temporary folder (so a test may corrupt it)."""

    def _copy(scenario: str = "ddp_straggler", name: str = "rank-0.json.gz") -> Path:
        target = tmp_path / "inputs" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(SAMPLES / scenario / name, target)
        return target

    return _copy


@pytest.fixture(scope="session")
def fleet_warehouse_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A warehouse holding Kineto, XLA and NCCL jobs with team/cluster/hardware labels; read-only for tests."""
    home = tmp_path_factory.mktemp("fleet") / "warehouse"
    wh = Warehouse(home)
    for job, folder, labels in FLEET_JOBS:
        report = wh.ingest([folder], job=job, labels=labels)
        assert report.ok, [r.error for r in report.failed]
    return home


@pytest.fixture
def fleet_warehouse(fleet_warehouse_home: Path) -> Warehouse:
    """The pre-filled fleet warehouse."""
    return Warehouse(fleet_warehouse_home)


@pytest.fixture
def client(home: Path) -> Iterator[TestClient]:
    """An in-process server over ``home`` without tokens (loopback mode: every request allowed)."""
    from fastapi.testclient import TestClient  # imported here: runs that start no server skip the web stack

    from tracelake.api.app import create_app

    with TestClient(create_app(ServerSettings(home=home, ingest_workers=0))) as c:
        yield c


@pytest.fixture
def secured(home: Path) -> Iterator[TestClient]:
    """An in-process server over ``home`` with a writer, a reader and an admin token (``support.tokens``)."""
    from fastapi.testclient import TestClient

    from tracelake.api.app import create_app

    with TestClient(create_app(ServerSettings(home=home, ingest_workers=0, tokens=TOKENS))) as c:
        yield c


@pytest.fixture
def dest(tmp_path: Path) -> Path:
    """An empty folder to unpack archives into (``tmp_path/box/dest``; the archives go beside ``box``)."""
    d = tmp_path / "box" / "dest"
    d.mkdir(parents=True)
    return d
