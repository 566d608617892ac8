"""Dense peak FLOP/s per dtype and memory bandwidth of the accelerators people train on.

Data, declared once (docs/analyses.md, "Hardware peaks"): every figure is the vendor's datasheet
figure *without* structured sparsity, FLOP/s (or OP/s for int8) per device as PyTorch sees it,
and HBM bytes/s. fp64 and fp32 are the matrix (tensor core / MFMA) figure where the datasheet
gives one, else the vector figure; tf32, bf16, fp16, fp8 and int8 are tensor-core figures. A
dtype the device has no peak for is absent. Pure look-ups, no I/O; the link table is
:mod:`tracelake.analysis.hardware`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from tracelake.contracts.errors import InvalidArgument

#: Keys a figure may have (and an override may name), besides ``hbm``.
DTYPES = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8")

T = 1e12


@dataclass(frozen=True)
class Peaks:
    """One device model's peaks: FLOP/s per dtype key and HBM bytes/s."""

    model: str
    flops: Mapping[str, float] = field(default_factory=dict)
    hbm: float | None = None

    def flops_for(self, dtype: str | None) -> float | None:
        """Peak FLOP/s of a dtype key (``bf16``, as :class:`tracelake.analysis.flops.Cost` names it), None if absent."""
        return self.flops.get(dtype) if dtype else None


@dataclass(frozen=True)
class _Row:
    pattern: str
    peaks: Peaks
    #: Matches only a device with this many SMs / CUs, where the name alone is ambiguous.
    sms: int | None = None
    #: Matches only a device with at least this much memory (GiB), where the name alone is ambiguous.
    min_gib: float | None = None


def _p(model: str, hbm_tbs: float, **tflops: float) -> Peaks:
    return Peaks(model, {k: v * T for k, v in tflops.items()}, hbm_tbs * T)


# Dense figures; "sparse" figures on the datasheets are twice these and are not used.
_H100_SXM = dict(fp64=67, fp32=67, tf32=494.5, bf16=989.5, fp16=989.5, fp8=1979, int8=1979)  # H100 datasheet, SXM
_H100_NVL = dict(fp64=60, fp32=60, tf32=417.5, bf16=835.5, fp16=835.5, fp8=1670.5, int8=1670.5)   # H100/H200 NVL
_MI300 = dict(fp64=163.4, fp32=163.4, tf32=653.7, bf16=1307.4, fp16=1307.4, fp8=2614.9, int8=2614.9)
_A100 = dict(fp64=19.5, fp32=19.5, tf32=156, bf16=312, fp16=312, int8=624)  # A100 datasheet (fp32: non-tensor)

#: Most specific first: the first row whose pattern is found in the device name (case-insensitive)
#: and whose SM count and memory, where given, fit wins.
ROWS: tuple[_Row, ...] = (
    # NVIDIA HGX B200 datasheet, per GPU (system figures / 8): FP8 72 PF sparse -> 4.5 PF dense; 8 TB/s.
    _Row(r"\bB200", _p("B200", 8.0, fp64=37, fp32=75, tf32=1125, bf16=2250, fp16=2250, fp8=4500, int8=4500)),
    # NVIDIA GH200 Grace Hopper datasheet: H100 SXM compute; 4.0 TB/s HBM3 (96 GB), 4.9 TB/s HBM3e (144 GB).
    _Row(r"GH200", _p("GH200 144GB HBM3e", 4.9, **_H100_SXM), min_gib=110),
    _Row(r"GH200", _p("GH200 96GB", 4.0, **_H100_SXM)),
    # NVIDIA H200 datasheet: H200 SXM as H100 SXM, 4.8 TB/s; H200 NVL 4.8 TB/s at NVL clocks.
    _Row(r"H200 NVL", _p("H200 NVL", 4.8, **_H100_NVL)),
    _Row(r"H200", _p("H200 SXM", 4.8, **_H100_SXM)),
    # NVIDIA H100 datasheet: NVL 3.9 TB/s; PCIe fp64 51, fp32 51, tf32 378, bf16/fp16 756, fp8/int8 1513, 2.0 TB/s.
    _Row(r"H100 NVL", _p("H100 NVL", 3.9, **_H100_NVL)),
    _Row(r"H100.*PCIe", _p("H100 PCIe", 2.0, fp64=51, fp32=51, tf32=378, bf16=756, fp16=756, fp8=1513,
                              int8=1513)),
    _Row(r"H100", _p("H100 PCIe", 2.0, fp64=51, fp32=51, tf32=378, bf16=756, fp16=756, fp8=1513, int8=1513),
         sms=114),
    _Row(r"H100", _p("H100 SXM", 3.35, **_H100_SXM)),
    # NVIDIA A100 datasheet: 40GB 1,555 GB/s (SXM and PCIe); 80GB SXM 2,039 GB/s, 80GB PCIe 1,935 GB/s.
    _Row(r"\bA100\b.*PCIe", _p("A100 80GB PCIe", 1.935, **_A100), min_gib=60),
    _Row(r"\bA100\b.*PCIe", _p("A100 40GB PCIe", 1.555, **_A100)),
    _Row(r"\bA100\b", _p("A100 80GB SXM", 2.039, **_A100), min_gib=60),
    _Row(r"\bA100\b", _p("A100 40GB SXM", 1.555, **_A100)),
    # NVIDIA L40S datasheet: fp32 91.6, tf32 183, bf16/fp16 362.05, fp8/int8 733; 864 GB/s.
    _Row(r"L40S", _p("L40S", 0.864, fp32=91.6, tf32=183, bf16=362.05, fp16=362.05, fp8=733, int8=733)),
    # NVIDIA L4 datasheet: fp32 30.3, tf32 60, bf16/fp16 121, fp8/int8 242.5; 300 GB/s.
    _Row(r"\bL4\b", _p("L4", 0.3, fp32=30.3, tf32=60, bf16=121, fp16=121, fp8=242.5, int8=242.5)),
    # NVIDIA A10 datasheet: fp32 31.2, tf32 62.5, bf16/fp16 125, int8 250; 600 GB/s.
    _Row(r"\bA10\b", _p("A10", 0.6, fp32=31.2, tf32=62.5, bf16=125, fp16=125, int8=250)),
    # NVIDIA V100 datasheet: SXM2 fp64 7.8, fp32 15.7, tensor fp16 125; PCIe 7 / 14 / 112; 900 GB/s.
    _Row(r"V100.*PCIE", _p("V100 PCIe", 0.9, fp64=7, fp32=14, fp16=112)),
    _Row(r"V100", _p("V100 SXM2", 0.9, fp64=7.8, fp32=15.7, fp16=125)),
    # NVIDIA T4 datasheet: fp32 8.1, fp16 65, int8 130; 320 GB/s.
    _Row(r"\bT4\b", _p("T4", 0.32, fp32=8.1, fp16=65, int8=130)),
    # AMD Instinct MI325X datasheet: MI300X compute, 6 TB/s HBM3E.
    _Row(r"MI325X", _p("MI325X", 6.0, **_MI300)),
    # AMD Instinct MI300X datasheet: fp64/fp32 matrix 163.4, tf32 653.7, bf16/fp16 1307.4, fp8/int8 2614.9; 5.3 TB/s.
    _Row(r"MI300X", _p("MI300X", 5.3, **_MI300)),
    # AMD Instinct MI250X / MI250 datasheets, per GCD (PyTorch sees each of the two GCDs as a device, so
    # half the OAM's figures): MI250X fp64/fp32 matrix 95.7, bf16/fp16/int8 383; MI250 90.5 and 362.1;
    # 3.2768 TB/s per OAM. ROCm may name a GCD "AMD Radeon Graphics": its CU count (110 / 104) tells.
    _Row(r"MI250X", _p("MI250X (one GCD)", 1.6384, fp64=47.85, fp32=47.85, bf16=191.5, fp16=191.5, int8=191.5)),
    _Row(r"MI250", _p("MI250 (one GCD)", 1.6384, fp64=45.25, fp32=45.25, bf16=181.05, fp16=181.05, int8=181.05)),
    _Row(r"AMD Radeon Graphics", _p("MI250X (one GCD)", 1.6384, fp64=47.85, fp32=47.85, bf16=191.5, fp16=191.5,
                                    int8=191.5), sms=110),
    _Row(r"AMD Radeon Graphics", _p("MI250 (one GCD)", 1.6384, fp64=45.25, fp32=45.25, bf16=181.05, fp16=181.05,
                                    int8=181.05), sms=104),
    # Google Cloud TPU system architecture pages, per chip: v6e (Trillium) bf16 918, int8 1836, 1,640 GB/s;
    # v5p bf16 459, int8 918, 2,765 GB/s; v5e bf16 197, int8 394, 819 GB/s; v4 bf16 275, 1,200 GB/s.
    # XLA profiles also carry the chip's own peak (devices.peak_tflops), which the breakdown prefers unless
    # TRACELAKE_DEVICE_PEAKS gives the device's FLOP/s.
    _Row(r"TPU v6", _p("TPU v6e", 1.64, bf16=918, int8=1836)),
    _Row(r"TPU v5 ?lite|TPU v5e", _p("TPU v5e", 0.819, bf16=197, int8=394)),
    _Row(r"TPU v5", _p("TPU v5p", 2.765, bf16=459, int8=918)),
    _Row(r"TPU v4", _p("TPU v4", 1.2, bf16=275, int8=275)),
)


def lookup(name: str | None, sms: int | None = None, memory_bytes: int | None = None) -> Peaks | None:
    """The :class:`Peaks` of a device by its name (``NVIDIA H100 80GB HBM3``), SM/CU count and memory.

    Returns None when no row matches (an unknown model, or an ambiguous name without the SM count
    or memory that resolves it: then the first row without such a condition answers).
    """
    if not name:
        return None
    gib = memory_bytes / 2**30 if memory_bytes else None
    for row in ROWS:
        if not re.search(row.pattern, name, re.IGNORECASE):
            continue
        if row.sms is not None and sms != row.sms:
            continue
        if row.min_gib is not None and (gib is None or gib < row.min_gib):
            continue
        return row.peaks
    return None


def from_device_properties(props: Mapping[str, object]) -> Peaks | None:
    """The :class:`Peaks` for one entry of a Kineto trace's ``deviceProperties`` (name, numSms, totalGlobalMem)."""
    name, sms, memory = props.get("name"), props.get("numSms"), props.get("totalGlobalMem")
    return lookup(name if isinstance(name, str) else None, sms if isinstance(sms, int) else None,
                  memory if isinstance(memory, int) else None)


def with_overrides(peaks: Peaks | None, overrides: Mapping[str, float]) -> Peaks | None:
    """``peaks`` with figures replaced, e.g. ``{"bf16": 900e12, "hbm": 4.0e12}`` (FLOP/s and bytes/s).

    An unknown device with overrides gets peaks made of the overrides alone.

    Raises:
        InvalidArgument: a key is neither ``hbm`` nor one of :data:`DTYPES`, or a figure is not positive.
    """
    for key, value in overrides.items():
        if key != "hbm" and key not in DTYPES:
            raise InvalidArgument(f"unknown peak {key!r}: use hbm or one of {', '.join(DTYPES)}")
        if not isinstance(value, (int, float)) or not value > 0:
            raise InvalidArgument(f"peak {key}={value!r} must be a positive number (FLOP/s or bytes/s)")
    if not overrides:
        return peaks
    base = peaks or Peaks("override")
    flops = {**base.flops, **{k: float(v) for k, v in overrides.items() if k != "hbm"}}
    hbm = float(overrides["hbm"]) if "hbm" in overrides else base.hbm
    return replace(base, flops=flops, hbm=hbm)


@dataclass(frozen=True)
class Override:
    """Peaks given by a person (``TRACELAKE_DEVICE_PEAKS``): for the devices whose name matches ``pattern`` (a
    case-insensitive regular expression; None: every device), ``figures`` in FLOP/s and bytes/s (key ``hbm``)."""

    pattern: str | None
    figures: dict[str, float]


def parse_overrides(text: str | None) -> tuple[Override, ...]:
    """``H100 PCIe: bf16=756, hbm=2.0; fp8=1979`` -> the overrides: entries split by ``;``, each an optional device
    name pattern and ``:``, then ``key=value`` pairs, dtypes (:data:`DTYPES`) in TFLOP/s and ``hbm`` in TB/s.

    Raises:
        InvalidArgument: an entry that is not of that form, an unknown key, a figure that is not positive, or a
            pattern that is not a regular expression.
    """
    found = []
    for entry in filter(None, (part.strip() for part in (text or "").split(";"))):
        pattern, colon, pairs = entry.rpartition(":")
        if not colon:
            pattern, pairs = "", entry
        if pattern.strip():
            try:
                re.compile(pattern.strip())
            except re.error as exc:
                raise InvalidArgument(f"device peaks {entry!r}: {pattern.strip()!r} is not a pattern ({exc})") from None
        figures: dict[str, float] = {}
        for pair in filter(None, (p.strip() for p in pairs.split(","))):
            key, _, value = pair.partition("=")
            try:
                number = float(value)
            except ValueError:
                raise InvalidArgument(f"device peaks {entry!r}: {pair!r} is not key=number (e.g. bf16=989 TFLOP/s, "
                                      "hbm=4.8 TB/s)") from None
            figures[key.strip().lower()] = number * (T if key.strip().lower() != "hbm" else 1e12)
        if not figures:
            raise InvalidArgument(f"device peaks {entry!r}: no key=number in it (e.g. `H100 PCIe: bf16=756`)")
        with_overrides(None, figures)  # the keys and figures, checked
        found.append(Override(pattern.strip() or None, figures))
    return tuple(found)


def matches(override: Override, name: str | None) -> bool:
    """Whether ``override`` applies to the device named ``name`` (no pattern: every device)."""
    return override.pattern is None or re.search(override.pattern, name or "", re.IGNORECASE) is not None


def resolve(name: str | None, sms: int | None, memory_bytes: int | None,
            overrides: tuple[Override, ...] = ()) -> Peaks | None:
    """:func:`lookup`, then the figures of every override whose pattern matches ``name`` (later ones win)."""
    figures: dict[str, float] = {}
    for override in overrides:
        if matches(override, name):
            figures.update(override.figures)
    return with_overrides(lookup(name, sms, memory_bytes), figures)
