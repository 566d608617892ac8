"""Hardware peaks (analysis/peaks.py): device names as drivers and real traces spell them, and sanity of the figures."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from support import ROOT, real_kineto_files
from tracelake.analysis.peaks import DTYPES, ROWS, Peaks, from_device_properties, lookup, with_overrides
from tracelake.contracts.errors import InvalidArgument

GIB = 2**30

#: (device name as nvidia-smi / rocm-smi / the XLA profile write it, SM or CU count, memory GiB, expected model).
NAMES = [
    ("NVIDIA A100-SXM4-40GB", 108, 40, "A100 40GB SXM"),
    ("NVIDIA A100-PG509-200", 108, 39.4, "A100 40GB SXM"),
    ("NVIDIA A100-SXM4-80GB", 108, 79.2, "A100 80GB SXM"),
    ("NVIDIA A100-PCIE-40GB", 108, 39.4, "A100 40GB PCIe"),
    ("NVIDIA A100 80GB PCIe", 108, 79.2, "A100 80GB PCIe"),
    ("NVIDIA H100 80GB HBM3", 132, 79.2, "H100 SXM"),
    ("NVIDIA H100 80GB HBM3", 114, 79.2, "H100 PCIe"),  # a PCIe card named like the SXM one: 114 SMs tell
    ("NVIDIA H100 PCIe", 114, 79.6, "H100 PCIe"),
    ("NVIDIA H100 NVL", 132, 93.1, "H100 NVL"),
    ("NVIDIA H200", 132, 139.8, "H200 SXM"),
    ("NVIDIA H200 NVL", 132, 139.8, "H200 NVL"),
    ("NVIDIA GH200 480GB", 132, 95.0, "GH200 96GB"),
    ("NVIDIA GH200 144G HBM3e", 132, 142.0, "GH200 144GB HBM3e"),
    ("NVIDIA B200", 148, 178.4, "B200"),
    ("NVIDIA L40S", 142, 44.4, "L40S"),
    ("NVIDIA L4", 58, 22.0, "L4"),
    ("NVIDIA A10", 72, 22.0, "A10"),
    ("Tesla V100-SXM2-32GB", 80, 31.7, "V100 SXM2"),
    ("Tesla V100-PCIE-16GB", 80, 15.8, "V100 PCIe"),
    ("Tesla T4", 40, 14.7, "T4"),
    ("AMD Instinct MI250X", 110, 64, "MI250X (one GCD)"),
    ("AMD Instinct MI250", 104, 64, "MI250 (one GCD)"),
    ("AMD Radeon Graphics", 104, 64, "MI250 (one GCD)"),  # ROCm 6 names a gfx90a GCD so (the MI250 real trace)
    ("AMD Radeon Graphics", 110, 64, "MI250X (one GCD)"),
    ("AMD Instinct MI300X", 304, 192, "MI300X"),
    ("AMD Instinct MI300X VF", 304, 191.5, "MI300X"),
    ("AMD Instinct MI325X", 304, 256, "MI325X"),
    ("TPU v4", None, 32, "TPU v4"),
    ("TPU v5 lite", None, 16, "TPU v5e"),
    ("TPU v5", None, 95, "TPU v5p"),
    ("TPU v6 Lite", None, 32, "TPU v6e"),
]


@pytest.mark.parametrize(("name", "sms", "gib", "model"), NAMES, ids=[f"{n}-{s}" for n, s, _, _ in NAMES])
def test_device_names_match(name: str, sms: int | None, gib: float, model: str) -> None:
    peaks = lookup(name, sms, int(gib * GIB))
    assert peaks is not None and peaks.model == model


def test_every_row_is_reachable() -> None:
    """Each row of the table answers at least one real device name above (none is shadowed by an earlier row)."""
    assert {row.peaks.model for row in ROWS} == {model for *_, model in NAMES}


def _device_properties() -> list[tuple[str, dict]]:
    found = []
    for path in real_kineto_files() + sorted((ROOT / "sample_traces" / "gpu_h200").glob("*/*.pt.trace.json.gz")):
        opener = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rt") as f:
            data = json.load(f)
        for props in (data.get("deviceProperties") or []) if isinstance(data, dict) else []:
            found.append((path.parent.name, props))
    return found


#: What the real traces' device names must resolve to, by a word of the name (independent of the table).
FAMILY = {"H200": "H200", "H100": "H100", "B200": "B200", "A100": "A100", "V100": "V100", "MI300X": "MI300X",
          "Radeon": "MI250"}


def test_names_in_real_traces_resolve() -> None:
    """Every deviceProperties entry of the real and H200 traces finds its model (ambiguous ones by SM count)."""
    seen = _device_properties()
    assert len({props["name"] for _, props in seen}) >= 6 if len(seen) > 20 else seen
    for folder, props in seen:
        peaks = from_device_properties(props)
        family = next(v for k, v in FAMILY.items() if k in props["name"])
        assert peaks is not None and family in peaks.model, (folder, props["name"], peaks)


def test_h200_of_the_sample_traces() -> None:
    props = {"name": "NVIDIA H200", "numSms": 132, "totalGlobalMem": 150109880320}
    peaks = from_device_properties(props)
    assert peaks is not None and peaks.flops_for("bf16") == 989.5e12 and peaks.hbm == 4.8e12


@pytest.mark.parametrize("name", ["NVIDIA GeForce RTX 4090", "Intel(R) Data Center GPU Max 1550", "", "cpu", "A1000"])
def test_unknown_devices(name: str) -> None:
    assert lookup(name) is None
    assert lookup(None) is None
    assert from_device_properties({"name": 7}) is None


@pytest.mark.parametrize("row", ROWS, ids=[f"{r.peaks.model}:{r.pattern}" for r in ROWS])
def test_figures_are_sane(row) -> None:  # noqa: ANN001 - a table row
    """Narrower types are never slower: fp8 >= bf16 >= tf32 >= fp32 >= fp64 where the device has both; all dense
    figures below 5 PFLOP/s (no sparse figure slipped in) and HBM between 100 GB/s and 10 TB/s."""
    flops = row.peaks.flops
    assert set(flops) <= set(DTYPES) and flops
    order = ["fp64", "fp32", "tf32", "bf16", "fp8"]
    present = [flops[k] for k in order if k in flops]
    assert present == sorted(present)
    if "bf16" in flops and "fp16" in flops:
        assert flops["bf16"] == flops["fp16"]
    assert all(0 < v < 5e15 for v in flops.values())
    assert row.peaks.hbm is not None and 1e11 <= row.peaks.hbm <= 1e13


def test_tpu_figure_agrees_with_the_profile() -> None:
    """The TPU sample's profile states the chip's own peak (generate_xla.PEAK_TFLOPS); the table says the same."""
    from tracelake.sample_traces.generate_xla import PEAK_TFLOPS

    peaks = lookup("TPU v6 Lite")
    assert peaks is not None and peaks.flops_for("bf16") == PEAK_TFLOPS * 1e12


def test_overrides() -> None:
    base = lookup("NVIDIA H200")
    over = with_overrides(base, {"bf16": 900e12, "hbm": 4.0e12})
    assert over is not None and base is not None
    assert over.flops_for("bf16") == 900e12 and over.hbm == 4.0e12 and over.flops_for("fp32") == base.flops_for("fp32")
    assert base.flops_for("bf16") == 989.5e12  # the table itself is unchanged
    assert with_overrides(base, {}) is base
    unknown = with_overrides(None, {"fp8": 1e15})
    assert unknown == Peaks("override", {"fp8": 1e15}, None)
    assert unknown.flops_for("bf16") is None and unknown.flops_for(None) is None
    with pytest.raises(InvalidArgument, match="unknown peak 'bfloat'"):
        with_overrides(base, {"bfloat": 1e12})
    with pytest.raises(InvalidArgument, match="positive"):
        with_overrides(base, {"hbm": -1})


def test_device_peaks_from_settings_change_the_stored_mfu(tmp_path: Path) -> None:
    """TRACELAKE_DEVICE_PEAKS halving the H200's bf16 peak doubles every MFU of the GPT capture, exactly."""
    train = Path(__file__).resolve().parents[1] / "sample_traces" / "gpu_h200" / "train" / "train.pt.trace.json.gz"
    mfu = {name: _stored_mfu(tmp_path / name, train, text)
           for name, text in (("table", ""), ("override", "H200: bf16=494.75; NVIDIA B200: bf16=1"))}
    assert mfu["table"] and all(m is not None and m > 0 for m in mfu["table"])
    assert mfu["override"] == pytest.approx([2 * m for m in mfu["table"]], rel=1e-9)


@pytest.mark.parametrize("text, message", [
    ("bf16", "is not key=number"), ("H100: bfloat=3", "unknown peak"), ("H100: bf16=-1", "positive"),
    ("(: bf16=1", "is not a pattern"), ("H100:", "no key=number"),
])
def test_bad_device_peaks_are_refused_when_read(text: str, message: str) -> None:
    from tracelake.warehouse.settings import Settings

    with pytest.raises(InvalidArgument, match=message) as caught:
        Settings.from_env({"TRACELAKE_DEVICE_PEAKS": text})
    assert "TRACELAKE_DEVICE_PEAKS" in str(caught.value)


def test_device_peak_overrides_apply_by_pattern() -> None:
    from tracelake.analysis.peaks import parse_overrides, resolve

    overrides = parse_overrides("H100 PCIe: bf16=756, hbm=2.0; fp8=1979")
    h100 = resolve("NVIDIA H100 PCIe", 114, 80 * 2**30, overrides)
    assert h100 is not None and h100.flops_for("bf16") == 756e12 and h100.hbm == 2.0e12
    assert h100.flops_for("fp8") == 1979e12
    h200 = resolve("NVIDIA H200", 132, 141 * 2**30, overrides)
    assert h200 is not None and h200.flops_for("fp8") == 1979e12 and h200.flops_for("bf16") == 989.5e12


def test_device_peaks_from_settings_win_over_the_profiles_own(tmp_path: Path) -> None:
    """An XLA profile states its chip's peak, which the breakdown prefers; a FLOP/s figure a person gave for the
    device wins over it (half the peak: twice every MFU), and one giving only the memory bandwidth does not."""
    from tracelake.sample_traces.generate_xla import PEAK_TFLOPS

    tpu = sorted((ROOT / "sample_traces" / "xla" / "tpu_allreduce").glob("*.xplane.pb"))[0]
    mfu = {name: _stored_mfu(tmp_path / name, tpu, text)
           for name, text in (("profile", ""), ("flops", f"TPU: bf16={PEAK_TFLOPS / 2}"), ("hbm", "TPU: hbm=1.0"))}
    assert mfu["profile"] and all(m is not None and m > 0 for m in mfu["profile"])
    assert mfu["flops"] == pytest.approx([2 * m for m in mfu["profile"]], rel=1e-9)
    assert mfu["hbm"] == mfu["profile"]


def _stored_mfu(home: Path, trace: Path, peaks_setting: str) -> list[float | None]:
    """The breakdown's MFU per step (whole trace first) of ``trace`` ingested with ``TRACELAKE_DEVICE_PEAKS``."""
    from tracelake.warehouse import Warehouse
    from tracelake.warehouse.settings import Settings

    wh = Warehouse(settings=Settings.from_env({}, home=home, device_peaks=peaks_setting))
    assert all(r.ok for r in wh.ingest([trace], job="j").results)
    return [row[1] for row in wh.query("SELECT step, mfu_pct FROM breakdown ORDER BY step NULLS FIRST").rows]
