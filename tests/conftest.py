"""Shared fixtures: sample and real traces, fresh and pre-filled warehouses."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tracelake.warehouse import Warehouse

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_traces" / "kineto"
REAL_TRACES = ROOT.parent / "shared" / "real_traces"
REAL_KINETO = REAL_TRACES / "pytorch_profiler"


def varint(value: int) -> bytes:
    """``value`` as a protobuf varint (a negative int64 as its 10-byte two's complement), for hand-made messages."""
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | 0x80 if value else byte)
        if not value:
            return bytes(out)


def len_field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field ``number`` holding ``payload``."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def real_kineto_files() -> list[Path]:
    """Every real PyTorch profiler trace in ../shared/real_traces (empty when absent)."""
    if not REAL_KINETO.is_dir():
        return []
    return sorted(p for p in REAL_KINETO.rglob("*") if p.is_file() and p.name.endswith((".json", ".json.gz")))


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


#: The jobs of the fleet warehouse: (job, sample folder, labels). Inspector records carry no device time.
FLEET_JOBS = (
    ("ddp", ROOT / "sample_traces" / "kineto" / "ddp_straggler", {"team": "infra", "cluster": "a"}),
    ("launch", ROOT / "sample_traces" / "kineto" / "launch_bound", {"team": "ml", "cluster": "b"}),
    ("tpu", ROOT / "sample_traces" / "xla" / "tpu_allreduce", {"team": "ml", "hardware": "tpu"}),
    ("inspector", ROOT / "sample_traces" / "nccl" / "inspector", {"team": "infra"}),
)


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
