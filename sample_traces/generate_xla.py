"""Generate the XLA sample profile: ``sample_traces/xla/tpu_allreduce/host0.xplane.pb``.

A JAX-style data-parallel training loop on 4 TPU chips, written as an XSpace the
way XProf writes one: per chip an ``XLA Ops`` line (fusions with ``flops``, a
synchronous ``all-reduce``, a ``copy``), an ``Async XLA Ops`` line (an async
all-reduce's start-to-done window that compute only partly hides), an ``XLA
Modules`` line wrapping the ops and a ``Steps`` line; plane stats with the chip's
peak FLOP/s and bandwidth; a host plane; ``Task Environment`` with the profile
start. Chip 2 starts its all-reduces 300 us late in every step (a straggler).

Deterministic: run ``python sample_traces/generate_xla.py`` to rewrite the file.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from tracelake.ingest.xplane_proto import XLine, XPlaneHeader, XSpace

OUT = Path(__file__).resolve().parent / "xla" / "tpu_allreduce" / "host0.xplane.pb"
CHIPS = 4
STEPS = 4
STEP_US = 10_000
LATE_CHIP, LATE_US = 2, 300
PEAK_TFLOPS = 918.0
PROGRAM = 4242
START_NS = 1_767_225_600_000_000_000  # 2026-01-01 00:00:00 UTC

#: (name, hlo_category, start us in the step, duration us, flops, bytes_accessed, HLO text)
OPS: list[tuple[str, str, int, int, float, int, str]] = [
    *[(f"fusion.{i}", "convolution fusion", 1200 * i, 1200, 0.55 * PEAK_TFLOPS * 1e12 * 1.2e-3, 64 << 20,
       f"%fusion.{i} = bf16[64,1024,1024]{{2,1,0}} fusion(...), kind=kOutput") for i in range(6)],
    ("all-reduce", "all-reduce", 7400, 1500, 0.0, 512 << 20,
     "%all-reduce = f32[64,1024,1024]{2,1,0} all-reduce(f32[64,1024,1024]{2,1,0} %p), to_apply=%add"),
    ("copy.1", "copy", 8900, 300, 0.0, 128 << 20, "%copy.1 = bf16[64,1024,512]{2,1,0} copy(%x)"),
]
ASYNC = ("all-reduce-start", "all-reduce", 6500, 1500, 256 << 20,
         "%all-reduce-start = f32[32,1024,1024]{2,1,0} all-reduce-start(f32[32,1024,1024]{2,1,0} %g)")
STATS = ["hlo_category", "flops", "bytes_accessed", "program_id", "device_type_string",
         "peak_teraflops_per_second", "peak_hbm_bw_gigabytes_per_second", "profile_start_time",
         "profile_stop_time", "step_num"]
STAT_ID = {name: i + 1 for i, name in enumerate(STATS)}


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _stat(message: Any, name: str, value: object) -> None:
    stat = message.stats.add(metadata_id=STAT_ID[name])
    if isinstance(value, str):
        stat.str_value = value
    elif isinstance(value, float):
        stat.double_value = value
    elif name == "program_id":
        stat.uint64_value = int(value)  # type: ignore[call-overload]
    else:
        stat.int64_value = int(value)  # type: ignore[call-overload]


def _plane(header: Any, lines: list[Any]) -> bytes:
    for name, number in STAT_ID.items():
        header.stat_metadata[number].id = number
        header.stat_metadata[number].name = name
    return header.SerializeToString() + b"".join(_field(3, line.SerializeToString()) for line in lines)


def chip_plane(chip: int, steps_count: int = STEPS, small_ops: int = 0) -> bytes:
    header = XPlaneHeader(id=chip + 1, name=f"/device:TPU:{chip}")
    _stat(header, "device_type_string", "TPU v6 Lite")
    _stat(header, "peak_teraflops_per_second", PEAK_TFLOPS)
    _stat(header, "peak_hbm_bw_gigabytes_per_second", 1640.0)
    metadata: dict[str, int] = {}

    def md(name: str, display: str, category: str | None = None, flops: float = 0.0, bytes_accessed: int = 0) -> int:
        if name not in metadata:
            mid = len(metadata) + 1
            metadata[name] = mid
            entry = header.event_metadata[mid]
            entry.id, entry.name, entry.display_name = mid, name, display
            if category is not None:
                _stat(entry, "hlo_category", category)
                _stat(entry, "flops", flops)
                _stat(entry, "bytes_accessed", bytes_accessed)
                _stat(entry, "program_id", PROGRAM)
        return metadata[name]

    ops = XLine(id=1, name="XLA Ops", timestamp_ns=0)
    asyncs = XLine(id=2, name="Async XLA Ops", timestamp_ns=0)
    modules = XLine(id=3, name="XLA Modules", timestamp_ns=0)
    steps = XLine(id=4, name="Steps", timestamp_ns=0)
    for step in range(steps_count):
        base_ps = (1_000 + step * STEP_US) * 1_000_000
        for name, category, start, dur, flops, nbytes, text in OPS:
            shift = LATE_US if chip == LATE_CHIP and start >= 7400 else 0
            ops.events.add(metadata_id=md(text, name, category, flops, nbytes),
                           offset_ps=base_ps + (start + shift) * 1_000_000, duration_ps=dur * 1_000_000)
        for k in range(small_ops):  # short elementwise ops between the fusions (benchmarks only)
            text = f"%add.{k % 64} = f32[1024]{{0}} add(f32[1024]{{0}} %a, f32[1024]{{0}} %b)"
            ops.events.add(metadata_id=md(text, f"add.{k % 64}", "non-fusion elementwise", 2048.0, 12288),
                           offset_ps=base_ps + k * (7_200_000_000 // small_ops), duration_ps=500_000)
        name, category, start, dur, nbytes, text = ASYNC
        shift = LATE_US if chip == LATE_CHIP else 0
        asyncs.events.add(metadata_id=md(text, name, category, 0.0, nbytes),
                          offset_ps=base_ps + (start + shift) * 1_000_000, duration_ps=dur * 1_000_000)
        modules.events.add(metadata_id=md(f"jit_train_step({PROGRAM})", "jit_train_step"),
                           offset_ps=base_ps, duration_ps=9_500 * 1_000_000)
        steps.events.add(metadata_id=md(str(step + 1), str(step + 1)), offset_ps=base_ps,
                         duration_ps=STEP_US * 1_000_000)
    return _plane(header, [modules, ops, asyncs, steps])


def host_plane() -> bytes:
    header = XPlaneHeader(id=100, name="/host:CPU")
    entry = header.event_metadata[1]
    entry.id, entry.name = 1, "PjitFunction(train_step)"
    line = XLine(id=7001, name="python", display_name="python", timestamp_ns=0)
    for step in range(STEPS):
        line.events.add(metadata_id=1, offset_ps=(500 + step * STEP_US) * 1_000_000, duration_ps=400 * 1_000_000)
    return _plane(header, [line])


def environment_plane() -> bytes:
    header = XPlaneHeader(id=200, name="Task Environment")
    _stat(header, "profile_start_time", START_NS)
    _stat(header, "profile_stop_time", START_NS + (STEPS + 1) * STEP_US * 1000)
    return _plane(header, [])


def build(steps: int = STEPS, small_ops: int = 0) -> bytes:
    """The XSpace bytes: ``steps`` training steps (the sample has 4), each with ``small_ops`` extra short ops."""
    planes = [chip_plane(c, steps, small_ops) for c in range(CHIPS)] + [host_plane(), environment_plane()]
    return b"".join(_field(1, p) for p in planes) + XSpace(hostnames=["host0"]).SerializeToString()


def main(argv: list[str] | None = None) -> int:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    data = build()
    OUT.write_bytes(data)
    print(f"wrote {OUT} ({len(data):,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
