"""What nccl-tests output implies beyond its rows (docs/formats.md, section 3, "nccl-tests output"):
the collective from the bus-bandwidth factor, per-rank GPU rows, ``-J`` JSON fields written as strings,
and the ``NCCL_DEBUG=INFO`` lines mixed into the same stdout.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from .model import ParseOptions, TraceInfo
from .tables import fit_int, fit_text, write_table

log = logging.getLogger(__name__)

#: docs/formats.md "Bus bandwidth": busbw = algbw x factor(n).
FACTORS: dict[str, Any] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "gather": lambda n: (n - 1) / n,
    "scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "sendrecv": lambda n: 1.0,
}
_REDUCING = {"all_reduce", "reduce_scatter", "reduce"}
_ROOTED = {"broadcast", "reduce", "gather", "scatter"}
_TOLERANCE = 0.02  # printed bandwidths are rounded to 2 decimals


def int_field(value: object) -> int | None:
    """An integer JSON field, also when written as a padded string (``"    -1"``) or a decimal (``0.0``)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        text = value.strip()
        try:
            value = float(text) if "." in text or "e" in text.lower() else int(text)
        except ValueError:
            return None
    if isinstance(value, float):
        return fit_int(int(value)) if value.is_integer() else None
    return fit_int(value) if isinstance(value, int) else None


def infer_collective(data: dict[str, list[Any]], n_ranks: int | None) -> tuple[str | None, str | None]:
    """The collective from busbw/algbw (the factor for ``n_ranks``), narrowed by the redop and root columns.

    Returns:
        (collective, None) when one collective fits; (None, warning) when none or several do.
    """
    if not n_ranks:
        return None, "collective unknown: no rank count to infer it from busbw/algbw"
    ratios = sorted(b / a for a, b in zip(data["algbw_gbs"], data["busbw_gbs"], strict=True)
                    if isinstance(a, float) and isinstance(b, float) and a >= 1.0)
    if not ratios:
        return None, "collective unknown: no row with algbw >= 1 GB/s to infer it from busbw/algbw"
    ratio = ratios[len(ratios) // 2]
    candidates = [c for c, f in FACTORS.items() if abs(f(n_ranks) - ratio) <= _TOLERANCE * max(ratio, 0.1)]
    redops = {r for r in data["redop"] if r is not None}
    roots = {r for r in data["root"] if r is not None}
    if redops and redops <= {"none"}:
        candidates = [c for c in candidates if c not in _REDUCING]
    elif redops:
        candidates = [c for c in candidates if c in _REDUCING or c == "sendrecv"]
    if roots and max(roots) >= 0:
        candidates = [c for c in candidates if c in _ROOTED]
    elif roots:
        candidates = [c for c in candidates if c not in _ROOTED]
    if len(candidates) == 1:
        return candidates[0], None
    what = ", ".join(candidates) if candidates else "none of the known collectives"
    return None, (f"collective unknown: busbw/algbw = {ratio:.3f} with {n_ranks} ranks fits {what} "
                  "(name the file *_perf* or keep the '# Collective test starting' line)")


def json_ranks(doc: dict[str, Any]) -> dict[int, tuple[str, int | None, str, int | None]]:
    """Ranks of a ``-J`` document's ``config.devices`` list: rank -> (host, pid, GPU model, device index)."""
    config = doc.get("config")
    devices = config.get("devices") if isinstance(config, dict) else None
    ranks: dict[int, tuple[str, int | None, str, int | None]] = {}
    for index, entry in enumerate(devices if isinstance(devices, list) else []):
        if not isinstance(entry, dict):
            continue
        rank = int_field(entry.get("rank"))
        rank = index if rank is None else rank
        host = fit_text(entry.get("hostname")) or ""
        name = fit_text(entry.get("device_info")) or ""  # the GPU model, as the rank line prints it
        device = int_field(entry.get("device", entry.get("cudaDev")))
        ranks[rank] = (host, int_field(entry.get("pid")), name, device)
    return ranks


def version_text(code: object) -> str | None:
    """NCCL's version code (``22703``, or ``2703`` before 2.9) as ``2.27.3``; None when not an integer."""
    number = int_field(code)
    if number is None or number <= 0:
        return None
    if number >= 10000:  # NCCL_VERSION(X,Y,Z) = X*10000 + Y*100 + Z since 2.9
        return f"{number // 10000}.{number // 100 % 100}.{number % 100}"
    return f"{number // 1000}.{number // 100 % 10}.{number % 100}"  # X*1000 + Y*100 + Z before


def write_devices(staging: Path, trace_id: str, ranks: dict[int, tuple[str, int | None, str, int | None]]) -> None:
    """One ``devices`` row (kind ``gpu``, the model as ``name``) per rank line or JSON device entry."""
    order = sorted(ranks)
    names = [ranks[r][2] or None for r in order]
    vendors = ["NVIDIA" if n and "nvidia" in n.lower() else "AMD" if n and "amd" in n.lower() else None
               for n in names]
    write_table(staging, "devices", {"rank": order, "device": [ranks[r][3] for r in order],
                                     "kind": ["gpu"] * len(order), "name": names, "vendor": vendors},
                trace_id=trace_id)


def read_mixed_log(source: Path, staging: Path, options: ParseOptions, info: TraceInfo) -> None:
    """Read the ``NCCL_DEBUG=INFO`` lines of an nccl-tests stdout with the debug-log parser, into the same
    trace (communicators, comm_channels, collectives); its version and WARNs join ``info``."""
    from . import nccl_log  # the debug-log parser skips the nccl-tests lines itself

    log_info = nccl_log.parse(source, staging, options)
    info.nccl_version = log_info.nccl_version or info.nccl_version
    info.backend = log_info.backend
    info.warnings.extend(w for w in log_info.warnings if not w.startswith("recognised "))
