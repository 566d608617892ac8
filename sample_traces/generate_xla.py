"""Generate the XLA sample profile: ``sample_traces/xla/tpu_allreduce/host0.xplane.pb``.

A JAX-style data-parallel training loop on 4 TPU chips, written as an XSpace the
way XProf writes one: per chip an ``XLA Ops`` line (fusions with ``flops``, a
synchronous ``all-reduce``, a ``copy``), an ``Async XLA Ops`` line (an async
all-reduce's start-to-done window that compute only partly hides), an ``XLA
Modules`` line wrapping the ops and a ``Steps`` line; plane stats with the chip's
peak FLOP/s and bandwidth; a host plane; ``Task Environment`` with the profile
start. Chip 2 starts its all-reduces 300 us late in every step (a straggler).

Deterministic: run ``python sample_traces/generate_xla.py`` to rewrite the file.

:func:`build_gpu` writes the GPU layout instead (JAX on NVIDIA GPUs, for benchmarks
and tests; nothing committed): per GPU a ``/device:GPU:N`` plane whose ``Stream
#N(...)`` lines hold the kernels, each carrying its details as per-event stats
(``correlation_id``, ``kernel_details``, ``tf_op``, ``name``, ``hlo_op``,
``hlo_module``, ``program_id``; strings as ``ref_value`` s into the plane's stat
metadata, as XProf writes them), plus the lines XProf derives from them (``XLA
Ops``, ``XLA Modules``), which repeat the kernels and must not be counted again;
a host plane with the launch calls and the step annotations.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
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
#: Where a step's short ops (benchmarks only) start: after the straggler's late copy, one after another, as a TPU core
#: runs its ops (an ``XLA Ops`` line of a real profile is in time order); each lasts
#: ``SMALL_PS``, and the step grows to hold them (:func:`step_length_ps`).
SMALL_START_US = 9_500
SMALL_PS = 500_000
#: The idle time at a step's end, after its module.
STEP_TAIL_US = 500
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
    step_ps = step_length_ps(small_ops)
    for step in range(steps_count):
        base_ps = 1_000 * 1_000_000 + step * step_ps
        for name, category, start, dur, flops, nbytes, text in OPS:
            shift = LATE_US if chip == LATE_CHIP and start >= 7400 else 0
            ops.events.add(metadata_id=md(text, name, category, flops, nbytes),
                           offset_ps=base_ps + (start + shift) * 1_000_000, duration_ps=dur * 1_000_000)
        for k in range(small_ops):  # short elementwise ops after the copy, one after another (benchmarks only)
            text = f"%add.{k % 64} = f32[1024]{{0}} add(f32[1024]{{0}} %a, f32[1024]{{0}} %b)"
            ops.events.add(metadata_id=md(text, f"add.{k % 64}", "non-fusion elementwise", 2048.0, 12288),
                           offset_ps=base_ps + SMALL_START_US * 1_000_000 + k * SMALL_PS, duration_ps=SMALL_PS)
        name, category, start, dur, nbytes, text = ASYNC
        shift = LATE_US if chip == LATE_CHIP else 0
        asyncs.events.add(metadata_id=md(text, name, category, 0.0, nbytes),
                          offset_ps=base_ps + (start + shift) * 1_000_000, duration_ps=dur * 1_000_000)
        modules.events.add(metadata_id=md(f"jit_train_step({PROGRAM})", "jit_train_step"),
                           offset_ps=base_ps, duration_ps=step_ps - STEP_TAIL_US * 1_000_000)
        steps.events.add(metadata_id=md(str(step + 1), str(step + 1)), offset_ps=base_ps, duration_ps=step_ps)
    return _plane(header, [modules, ops, asyncs, steps])


def step_length_ps(small_ops: int) -> int:
    """A TPU step's length: :data:`STEP_US`, or longer where its short ops need the room (the module ends
    :data:`STEP_TAIL_US` before the next step)."""
    return max(STEP_US * 1_000_000, (SMALL_START_US + STEP_TAIL_US) * 1_000_000 + small_ops * SMALL_PS)


def host_plane() -> bytes:
    header = XPlaneHeader(id=100, name="/host:CPU")
    entry = header.event_metadata[1]
    entry.id, entry.name = 1, "PjitFunction(train_step)"
    line = XLine(id=7001, name="python", display_name="python", timestamp_ns=0)
    for step in range(STEPS):
        line.events.add(metadata_id=1, offset_ps=(500 + step * STEP_US) * 1_000_000, duration_ps=400 * 1_000_000)
    return _plane(header, [line])


def environment_plane(steps: int = STEPS) -> bytes:
    header = XPlaneHeader(id=200, name="Task Environment")
    _stat(header, "profile_start_time", START_NS)
    _stat(header, "profile_stop_time", START_NS + (steps + 1) * STEP_US * 1000)
    return _plane(header, [])


def build(steps: int = STEPS, small_ops: int = 0) -> bytes:
    """The XSpace bytes: ``steps`` training steps (the sample has 4), each with ``small_ops`` extra short ops."""
    planes = [chip_plane(c, steps, small_ops) for c in range(CHIPS)] + [host_plane(), environment_plane()]
    return b"".join(_field(1, p) for p in planes) + XSpace(hostnames=["host0"]).SerializeToString()


# -- the GPU layout (build_gpu) -------------------------------------------------------------

GPUS = 4
GPU_PROGRAM = 17
GPU_MODULE = "jit_train_step"
#: Streams as XProf names their lines: ``Stream #<id>(<what runs on it>)``.
COMPUTE_STREAM, COPY_STREAM, NCCL_STREAM = 13, 14, 22
#: Ids XProf gives the lines it derives from the streams (from kThreadIdDerivedMin = 0xdeadbeef on).
DERIVED_MODULES_LINE, DERIVED_OPS_LINE = 0xDEADBEEF + 3, 0xDEADBEEF + 4
GEMMS = 6
GEMM_KERNEL = ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off"
               "_kernel__5x_cublas")
#: (kernel, hlo_op, JAX name, kernel_details or memcpy_details, stream, start us in the step, duration us)
GPU_FIXED: list[tuple[str, str, str, str, int, int, int]] = [
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "all-reduce-start.1", "jit(train_step)/psum",
     "regs:96 static_shared:0 dynamic_shared:0 grid:32,1,1 block:512,1,1 occ_pct:25", NCCL_STREAM, 7400, 1500),
    ("MemcpyD2D", "copy.1", "jit(train_step)/copy", "kind_src:device kind_dst:device size:67108864 "
     "dest:0 async:1 num_bytes:67108864", COPY_STREAM, 8900, 300),
]
GPU_PLANE_STATS = ["device_vendor", "clock_rate", "core_count", "memory_bandwidth", "memory_size",
                   "compute_cap_major", "compute_cap_minor"]
GPU_EVENT_STATS = ["correlation_id", "kernel_details", "memcpy_details", "tf_op", "name", "hlo_op", "hlo_module",
                   "program_id"]
HOST_STATS = ["correlation_id", "device_id", "step_num"]
_VARINT, _LEN = 0, 2


class _StatNames:
    """A plane's stat metadata: the stat names first, then one entry per string a ``ref_value`` points at."""

    def __init__(self, names: list[str]) -> None:
        self.ids: dict[str, int] = {}
        for name in names:
            self.id(name)

    def id(self, name: str) -> int:
        """The id of ``name``, declared on first use."""
        return self.ids.setdefault(name, len(self.ids) + 1)

    def declare(self, header: Any) -> None:
        """Write every entry into the plane header's ``stat_metadata``."""
        for name, number in self.ids.items():
            header.stat_metadata[number].id = number
            header.stat_metadata[number].name = name


def _tag(number: int, wire: int) -> bytes:
    return _varint(number << 3 | wire)


def _int_stat(stat_id: int, value_field: int, value: int) -> bytes:
    """An ``XStat`` with an integer value (uint64_value=3, int64_value=4, ref_value=7), as a field of an XEvent."""
    return _field(4, _tag(1, _VARINT) + _varint(stat_id) + _tag(value_field, _VARINT) + _varint(value))


def _event(metadata_id: int, offset_ps: int, duration_ps: int, stats: bytes = b"") -> bytes:
    """An ``XEvent`` as a field of an XLine, written by hand (millions of them: protobuf objects are too slow)."""
    body = (_tag(1, _VARINT) + _varint(metadata_id) + _tag(2, _VARINT) + _varint(offset_ps)
            + _tag(3, _VARINT) + _varint(duration_ps) + stats)
    return _field(4, body)


def _line(line_id: int, name: str, events: list[bytes]) -> bytes:
    """An ``XLine`` (timestamp 0: relative to the profile start) with its events, as a field of an XPlane."""
    return _field(3, XLine(id=line_id, name=name, timestamp_ns=0).SerializeToString() + b"".join(events))


@dataclass(frozen=True)
class GpuKernel:
    """One kernel of a step on every GPU: where it runs and what its events say."""

    name: str
    hlo_op: str
    jax_name: str
    details: str
    stream: int
    start_ps: int
    duration_ps: int


def gpu_kernels(kernels: int) -> list[GpuKernel]:
    """The kernels of one step: ``kernels`` short fusions and :data:`GEMMS` cuBLAS GEMMs on the compute stream,
    one after the other in the first 7.2 ms, then an NCCL all-reduce and a device-to-device copy."""
    compute: list[tuple[str, str, str, str]] = []
    every = max(1, (kernels + GEMMS) // GEMMS)
    gemms = 0
    for k in range(kernels + GEMMS):
        if gemms < GEMMS and (k % every == 0 or kernels + GEMMS - k <= GEMMS - gemms):
            compute.append((GEMM_KERNEL, f"cublas-gemm.{gemms}", "jit(train_step)/dot_general",
                            "regs:168 static_shared:0 dynamic_shared:213248 grid:132,1,1 block:384,1,1 occ_pct:6.25"))
            gemms += 1
        else:
            j = (k - gemms) % 64
            compute.append((f"loop_add_fusion_{j}", f"add_fusion.{j}", "jit(train_step)/add",
                            f"regs:{16 + j % 8} static_shared:0 dynamic_shared:0 grid:{64 + j},1,1 block:128,1,1 "
                            "occ_pct:100"))
    slot = 7_200_000_000 // len(compute)
    out = [GpuKernel(name, op, jax, details, COMPUTE_STREAM, k * slot, slot * 4 // 5)
           for k, (name, op, jax, details) in enumerate(compute)]
    out += [GpuKernel(name, op, jax, details, stream, start * 1_000_000, dur * 1_000_000)
            for name, op, jax, details, stream, start, dur in GPU_FIXED]
    return out


def _step_base_ps(step: int) -> int:
    return (1_000 + step * STEP_US) * 1_000_000


def correlation_id(gpu: int, gpus: int, launch: int) -> int:
    """The CUPTI correlation id of a GPU's ``launch``-th kernel: unique in the process, across GPUs (as CUPTI's)."""
    return launch * gpus + gpu + 1


def gpu_plane(gpu: int, steps: int, plan: list[GpuKernel], gpus: int = GPUS) -> bytes:
    """``/device:GPU:<gpu>``: a line per stream, each kernel with its per-event stats; the derived lines."""
    header = XPlaneHeader(id=gpu + 1, name=f"/device:GPU:{gpu}")
    names = _StatNames(GPU_PLANE_STATS + GPU_EVENT_STATS)
    for name, value in (("device_vendor", "Nvidia"), ("clock_rate", 1_980_000), ("core_count", 132),
                        ("memory_bandwidth", 3_352_320_000_000), ("memory_size", 85_520_809_984),
                        ("compute_cap_major", 9), ("compute_cap_minor", 0)):
        stat = header.stats.add(metadata_id=names.id(name))
        if isinstance(value, str):
            stat.str_value = value
        else:
            stat.int64_value = value
    kernel_ids: dict[str, int] = {}
    op_ids: dict[str, int] = {}

    def metadata(ids: dict[str, int], name: str) -> int:
        if name not in ids:
            ids[name] = len(header.event_metadata) + 1
            entry = header.event_metadata[ids[name]]
            entry.id, entry.name = ids[name], name
            if ids is op_ids:
                entry.display_name = name
        return ids[name]

    ref = 7  # XStat.ref_value: strings are references to stat metadata names
    # What every event of a kernel says besides its correlation id, written once per kernel.
    fixed = []
    for kernel in plan:
        details = "memcpy_details" if kernel.stream == COPY_STREAM else "kernel_details"
        fixed.append(b"".join(_int_stat(names.id(stat), ref, names.id(value)) for stat, value in (
            (details, kernel.details), ("tf_op", kernel.jax_name), ("name", kernel.jax_name),
            ("hlo_op", kernel.hlo_op), ("hlo_module", GPU_MODULE))) + _int_stat(names.id("program_id"), 4, GPU_PROGRAM))
    streams: dict[int, list[bytes]] = {COMPUTE_STREAM: [], COPY_STREAM: [], NCCL_STREAM: []}
    ops: list[bytes] = []
    modules: list[bytes] = []
    correlation_stat = names.id("correlation_id")
    launch = 0
    for step in range(steps):
        base = _step_base_ps(step)
        modules.append(_event(metadata(op_ids, f"{GPU_MODULE}({GPU_PROGRAM})"), base, 9_500_000_000))
        for kernel, stats in zip(plan, fixed, strict=True):
            correlation = correlation_id(gpu, gpus, launch)
            launch += 1
            offset = base + kernel.start_ps
            streams[kernel.stream].append(_event(metadata(kernel_ids, kernel.name), offset, kernel.duration_ps,
                                                 _int_stat(correlation_stat, 3, correlation) + stats))
            ops.append(_event(metadata(op_ids, kernel.hlo_op), offset, kernel.duration_ps))
    names.declare(header)
    kinds = {COMPUTE_STREAM: "Compute", COPY_STREAM: "MemcpyD2D", NCCL_STREAM: "Nccl"}
    lines = [_line(stream, f"Stream #{stream}({kinds[stream]})", events) for stream, events in streams.items()]
    lines += [_line(DERIVED_MODULES_LINE, "XLA Modules", modules), _line(DERIVED_OPS_LINE, "XLA Ops", ops)]
    return header.SerializeToString() + b"".join(lines)


def gpu_host_plane(gpus: int, steps: int, plan: list[GpuKernel]) -> bytes:
    """``/host:CPU``: JAX's step annotations (``train`` with ``step_num``), and per GPU a thread of launch calls."""
    header = XPlaneHeader(id=100, name="/host:CPU")
    names = _StatNames(HOST_STATS)
    calls = {"train": 1, "cuLaunchKernel": 2, "cuMemcpyDtoDAsync": 3}
    for name, number in calls.items():
        header.event_metadata[number].id, header.event_metadata[number].name = number, name
    step_stat, correlation_stat, device_stat = names.id("step_num"), names.id("correlation_id"), names.id("device_id")
    lines = [_line(7001, "python", [_event(calls["train"], _step_base_ps(step), STEP_US * 1_000_000,
                                           _int_stat(step_stat, 4, step)) for step in range(steps)])]
    slot = min(k.duration_ps for k in plan)
    for gpu in range(gpus):
        launches = []
        launch = 0
        for step in range(steps):
            for kernel in plan:
                correlation = correlation_id(gpu, gpus, launch)
                launch += 1
                call = calls["cuMemcpyDtoDAsync" if kernel.stream == COPY_STREAM else "cuLaunchKernel"]
                launches.append(_event(call, _step_base_ps(step) + kernel.start_ps - 2_000_000,
                                       min(3_000_000, slot // 2),
                                       _int_stat(correlation_stat, 3, correlation) + _int_stat(device_stat, 3, gpu)))
        tid = 20_000 + gpu
        lines.append(_line(tid, f"Host Threads/{tid}", launches))
    names.declare(header)
    return header.SerializeToString() + b"".join(lines)


def build_gpu(steps: int = STEPS, kernels: int = 0, gpus: int = GPUS) -> bytes:
    """A JAX-on-GPU XSpace: ``gpus`` GPUs, ``steps`` training steps of ``kernels`` short fusions (plus 6 GEMMs,
    an NCCL all-reduce and a copy) each; every kernel also on the derived ``XLA Ops`` line, launched from the host."""
    plan = gpu_kernels(kernels)
    planes = [gpu_plane(g, steps, plan, gpus) for g in range(gpus)]
    planes += [gpu_host_plane(gpus, steps, plan), environment_plane(steps)]
    return b"".join(_field(1, p) for p in planes) + XSpace(hostnames=["host0"]).SerializeToString()


def main(argv: list[str] | None = None) -> int:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    data = build()
    OUT.write_bytes(data)
    print(f"wrote {OUT} ({len(data):,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
