"""What the links between accelerators carry: per GPU model, its links within a node and the network between nodes.

Data, declared once (docs/analyses.md, "NCCL records", "Link peaks"): every figure is GB/s of
bus bandwidth per GPU in one direction, which is what nccl-tests' ``busbw`` is compared to,
and every figure comes from the vendor's specification cited there. Pure look-ups, no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: Per link name: (family, GB/s per GPU per direction). Families are what ``TRACELAKE_LINK_PEAKS`` may
#: also name (``nvlink=450`` sets every NVLink generation). Network entries are per NIC.
LINKS: dict[str, tuple[str, float]] = {
    "nvlink1": ("nvlink", 80.0),           # P100 SXM2: 4 links x 20 GB/s each way (160 GB/s both ways)
    "nvlink2": ("nvlink", 150.0),          # V100 SXM2: 6 links x 25 GB/s (300 GB/s both ways)
    "nvlink3": ("nvlink", 300.0),          # A100 SXM: 12 links x 25 GB/s (600 GB/s both ways)
    "nvlink4": ("nvlink", 450.0),          # H100 SXM, H200, GH200: 18 links x 25 GB/s (900 GB/s both ways)
    "nvlink4_bridge": ("nvlink", 300.0),   # H100 NVL pairs: NVLink bridge, 600 GB/s both ways
    "nvlink5": ("nvlink", 900.0),          # B200, GB200: 18 links x 50 GB/s (1.8 TB/s both ways)
    "pcie3": ("pcie", 15.75),              # x16 at 8 GT/s, 128b/130b
    "pcie4": ("pcie", 31.5),               # x16 at 16 GT/s
    "pcie5": ("pcie", 63.0),               # x16 at 32 GT/s
    "xgmi2": ("xgmi", 200.0),              # MI250/MI250X: 8 Infinity Fabric links x 100 GB/s per OAM, 2 GCDs
    "xgmi3": ("xgmi", 448.0),              # MI300X/MI325X: 7 links x 128 GB/s = 896 GB/s both ways
    "ib_edr": ("ib", 12.5),                # 100 Gb/s per NIC
    "ib_hdr": ("ib", 25.0),                # 200 Gb/s
    "ib_ndr": ("ib", 50.0),                # 400 Gb/s
    "ib_xdr": ("ib", 100.0),               # 800 Gb/s
    "roce_100": ("roce", 12.5),            # ConnectX NICs run Ethernet (RoCE) at the same line rates as IB
    "roce_200": ("roce", 25.0),
    "roce_400": ("roce", 50.0),
    "roce_800": ("roce", 100.0),
    "efa_v1": ("efa", 12.5),               # p3dn.24xlarge: 100 Gb/s per instance
    "efa_v2": ("efa", 50.0),               # p4d/p4de.24xlarge: 4 x 100 Gb/s per instance
    "efa_v2_p5": ("efa", 400.0),           # p5/p5e.48xlarge: 3200 Gb/s per instance
    "efa_v3": ("efa", 400.0),              # p5en.48xlarge: 3200 Gb/s per instance
}


@dataclass(frozen=True)
class Gpu:
    """One GPU model: its link to the other GPUs of a node, its host link, and its reference system's network."""

    pattern: str
    #: NVLink / Infinity Fabric generation (a :data:`LINKS` name), None when peers talk over PCIe only.
    peer_link: str | None
    host_link: str
    #: The NIC of its reference system (DGX/HGX: one per GPU), for NET/IB; None when there is none.
    nic: str | None
    #: EFA on its AWS instance, per instance (all GPUs together); None when AWS has none.
    efa: str | None


#: Most specific first: the first pattern found in the device name (case-insensitive) wins.
GPUS: tuple[Gpu, ...] = (
    Gpu(r"GB200", "nvlink5", "pcie5", "ib_ndr", None),
    Gpu(r"B200", "nvlink5", "pcie5", "ib_ndr", "efa_v3"),
    Gpu(r"GH200", "nvlink4", "pcie5", "ib_ndr", None),
    Gpu(r"H200", "nvlink4", "pcie5", "ib_ndr", "efa_v3"),
    Gpu(r"H100 NVL", "nvlink4_bridge", "pcie5", None, None),
    Gpu(r"H100.*PCIe", None, "pcie5", None, None),
    Gpu(r"H100", "nvlink4", "pcie5", "ib_ndr", "efa_v2_p5"),
    Gpu(r"A100.*PCIE", None, "pcie4", None, None),
    Gpu(r"A100", "nvlink3", "pcie4", "ib_hdr", "efa_v2"),
    Gpu(r"V100.*PCIE", None, "pcie3", None, None),
    Gpu(r"V100", "nvlink2", "pcie3", "ib_edr", "efa_v1"),
    Gpu(r"P100.*PCIE", None, "pcie3", None, None),
    Gpu(r"P100", "nvlink1", "pcie3", "ib_edr", None),
    Gpu(r"L40S|L40|\bL4\b|A10G?\b|A30|A40|\bT4\b|K80", None, "pcie4", None, None),
    Gpu(r"MI325X|MI300X", "xgmi3", "pcie5", None, None),
    Gpu(r"MI250", "xgmi2", "pcie4", None, None),
)
#: PCIe generation of the PCIe-only cards grouped above, where it is not gen 4.
_PCIE3 = re.compile(r"\bT4\b|K80", re.IGNORECASE)


def gpu(name: str | None) -> Gpu | None:
    """The :class:`Gpu` row for a device name (``NVIDIA A100-SXM4-80GB``), None when the model is not known."""
    if not name:
        return None
    for row in GPUS:
        if re.search(row.pattern, name, re.IGNORECASE):
            if row.peer_link is None and _PCIE3.search(name):
                return Gpu(row.pattern, None, "pcie3", None, None)
            return row
    return None


#: The RoCE link of a reference system's IB NIC: the same adapter at the same line rate, as Ethernet.
ROCE_OF = {"ib_edr": "roce_100", "ib_hdr": "roce_200", "ib_ndr": "roce_400", "ib_xdr": "roce_800"}


def peak(link: str, overrides: dict[str, float]) -> float | None:
    """A link's figure: ``TRACELAKE_LINK_PEAKS`` by name, then by family, then :data:`LINKS`."""
    if link in overrides:
        return overrides[link]
    family, figure = LINKS.get(link, (link, 0.0))
    if family in overrides:
        return overrides[family]
    return figure or None
