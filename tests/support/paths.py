"""Where the tests find the repository, its sample traces and the real traces beside it."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "sample_traces" / "kineto"
REAL_TRACES = ROOT.parent / "shared" / "real_traces"
REAL_KINETO = REAL_TRACES / "pytorch_profiler"
REAL_XLA = REAL_TRACES / "xla"
TPU_SAMPLE = ROOT / "sample_traces" / "xla" / "tpu_allreduce" / "host0.xplane.pb"

#: The jobs of the fleet warehouse: (job, sample folder, labels). Inspector records carry no device time.
FLEET_JOBS = (
    ("ddp", ROOT / "sample_traces" / "kineto" / "ddp_straggler", {"team": "infra", "cluster": "a"}),
    ("launch", ROOT / "sample_traces" / "kineto" / "launch_bound", {"team": "ml", "cluster": "b"}),
    ("tpu", ROOT / "sample_traces" / "xla" / "tpu_allreduce", {"team": "ml", "hardware": "tpu"}),
    ("inspector", ROOT / "sample_traces" / "nccl" / "inspector", {"team": "infra"}),
)


def real_kineto_files() -> list[Path]:
    """Every real PyTorch profiler trace in ../shared/real_traces (empty when absent)."""
    if not REAL_KINETO.is_dir():
        return []
    return sorted(p for p in REAL_KINETO.rglob("*") if p.is_file() and p.name.endswith((".json", ".json.gz")))


def real_xplanes() -> list[Path]:
    return sorted(REAL_XLA.rglob("*.xplane.pb")) if REAL_XLA.is_dir() else []
