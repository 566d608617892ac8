"""Deterministic generator of realistic multi-rank PyTorch profiler (Kineto) traces.

Each rank's trace is a Kineto Chrome-trace JSON object, pretty-printed the way
libkineto writes it (several lines per event, 2-space indent), with the launch
chain cpu_op -> cudaLaunchKernel -> kernel joined by ``ac2g`` flows, DDP-style
bucketed all-reduces and one all-gather per step, and ``M`` metadata at the end.

All ranks share one simulated clock. Every rank's step is a coroutine that yields
when it reaches a collective (its arrival time on the NCCL stream) and is resumed
with the collective's completion time, which is the same on every rank: the
latest arrival plus the transfer time. Early ranks therefore show long NCCL
kernels (waiting) and a straggler the shortest ones.

Output is streamed (one step's events are formatted and written at a time) and
byte-identical between runs: seeded RNGs, no wall-clock time, gzip mtime 0.
Standard library only; run ``python generate.py --help`` for the CLI.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import random
import sys
import time
from collections import Counter
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

__all__ = ["EXTRA_SCENARIOS", "SCENARIOS", "Scenario", "write_scenario", "write_trace"]


@dataclass(frozen=True)
class Scenario:
    """What to simulate. ``layers`` is the number of compute kernels per forward pass."""

    name: str
    ranks: int
    steps: int
    layers: int
    straggler_rank: int | None
    straggler_delay_us: float  # extra data-loading stall per step on the straggler's CPU
    launch_bound: bool  # tiny kernels launched one by one from Python: host gaps on the stream
    seed: int
    straggler_slowdown: float = 1.25  # compute-kernel duration multiplier on the straggler
    buckets: int = 2  # DDP gradient all-reduce buckets per step
    first_step: int = 1  # number N of the first ProfilerStep#N
    busbw_gbps: float = 150.0  # NCCL bus bandwidth used for transfer times
    base_time_ns: int = 1764547200000000000  # baseTimeNanoseconds: epoch of ts == 0
    #: The forward pass replays a captured CUDA graph: one cudaGraphLaunch per step starts all its kernels
    #: (one correlation, "graph id"/"graph node id" args as Kineto writes them with CUDA 12).
    cuda_graph: bool = False
    #: False: collectives as PyTorch <= 2.0 wrote them (no "Collective name" args, no pg_config; kernels named
    #: ncclKernel_<Op>_RING_LL_Sum_<type>), the input shape only in the nccl: annotation's "Input Dims".
    comm_metadata: bool = True


SCENARIOS: dict[str, Scenario] = {
    "ddp_straggler": Scenario(
        name="ddp_straggler", ranks=4, steps=6, layers=16, straggler_rank=2,
        straggler_delay_us=150.0, launch_bound=False, seed=20251201),
    "launch_bound": Scenario(
        name="launch_bound", ranks=1, steps=3, layers=200, straggler_rank=None,
        straggler_delay_us=0.0, launch_bound=True, seed=7),
}

#: Scenarios the generator writes on request only (``--scenario``); none is committed under sample_traces/.
EXTRA_SCENARIOS: dict[str, Scenario] = {
    "cuda_graph": Scenario(
        name="cuda_graph", ranks=1, steps=3, layers=24, straggler_rank=None,
        straggler_delay_us=0.0, launch_bound=False, seed=17, cuda_graph=True),
}

# ---------------------------------------------------------------------------
# Static catalog: device ops, CPU operators and collectives
# ---------------------------------------------------------------------------

_US = 1000  # ns per microsecond; the simulation runs on integer nanoseconds
_HOST_PID_BASE = 1000  # host pid (and main thread tid) of rank r is 1000 + r
_T0 = 1_000_000  # ns: profiler window start on every rank (ts are relative)
_COMPUTE, _MEMCPY, _NCCL = 7, 13, 20  # CUDA stream ids

# launch API name -> (cat, cbid)
_API: dict[str, tuple[str, int]] = {
    "cudaLaunchKernel": ("cuda_runtime", 211), "cuLaunchKernel": ("cuda_driver", 307),
    "cudaLaunchKernelExC": ("cuda_runtime", 430), "cudaMemcpyAsync": ("cuda_runtime", 41),
    "cudaMemsetAsync": ("cuda_runtime", 51), "cudaStreamSynchronize": ("cuda_runtime", 131),
    "cudaEventRecord": ("cuda_runtime", 135), "cudaStreamWaitEvent": ("cuda_runtime", 147),
    "cudaGraphLaunch": ("cuda_runtime", 311),
}
_GRAPH_ID = 7  # the id CUPTI gives the captured forward graph (the same graph replays every step)


@dataclass(frozen=True, eq=False)  # hashed by identity: a key of the template cache
class _DevOp:
    """A GPU activity: kernel, memcpy or memset."""

    cat: str  # kernel | gpu_memcpy | gpu_memset
    name: str
    us: float  # nominal duration
    stream: int = _COMPUTE
    tail: str = ""  # kernels: the static launch-geometry args
    nbytes: int = 0  # copies and memsets: bytes moved


@dataclass(frozen=True)
class _Leaf:
    """The innermost cpu_op, which calls ``api`` to enqueue one device op."""

    name: str
    static: str  # static args: "Input Dims", "Input type"
    dev: _DevOp
    api: str = "cudaLaunchKernel"


@dataclass(frozen=True)
class _Op:
    """An operator as the profiler sees it: nested frames around one or more leaves."""

    frames: tuple[tuple[str, str, str], ...]  # (cat, name, static args), outermost first
    leaves: tuple[_Leaf, ...]
    seq_frames: int = 0  # how many outer frames carry the autograd "Sequence number"
    flow: str = ""  # fwdbwd flow end drawn at the last sequenced frame: "s" forward, "f" backward
    py: str = ""  # python_function wrapping the whole operator


@dataclass(frozen=True)
class _Coll:
    """A collective: c10d op > record_param_comms > nccl:<name> > cudaLaunchKernelExC."""

    op: str
    annotation: str
    coll: str
    kernel: str
    nelems: int  # input elements per rank (bf16)
    gather: bool = False  # output is world_size times the input

    def out_nelems(self, world: int) -> int:
        return self.nelems * world if self.gather else self.nelems

    def transfer_ns(self, world: int, busbw_gbps: float) -> int:
        """Ring cost: 2(n-1)/n of the bytes for all-reduce, (n-1)/n for all-gather."""
        factor = (1 if self.gather else 2) * (world - 1) / world
        return int(12 * _US + factor * self.out_nelems(world) * 2 / busbw_gbps)


def _kernel(name: str, us: float, grid: tuple[int, int, int], block: tuple[int, int, int],
            regs: int, smem: int, occupancy: int) -> _DevOp:
    bps = grid[0] * grid[1] * grid[2] / 132  # H100 SXM: 132 SMs
    wps = bps * -(-block[0] * block[1] * block[2] // 32)
    tail = (f'"registers per thread": {regs},      "shared memory": {smem},      '
            f'"blocks per SM": {bps:.6f},      "warps per SM": {wps:.6f},      '
            f'"grid": [{grid[0]}, {grid[1]}, {grid[2]}],      '
            f'"block": [{block[0]}, {block[1]}, {block[2]}],      '
            f'"est. achieved occupancy %": {occupancy}')
    return _DevOp("kernel", name, us, tail=tail)


def _ew(functor: str, arity: int) -> str:
    """Name of an ATen vectorized elementwise kernel."""
    return (f"void at::native::vectorized_elementwise_kernel<4, {functor}, at::detail::Array<char*, "
            f"{arity}> >(int, {functor}, at::detail::Array<char*, {arity}>)")


def _inputs(*inputs: tuple[int, ...] | str, dtype: str = "c10::BFloat16") -> str:
    """The record_shapes args of an op: tensors given by shape (contiguous), scalars by value."""
    rows = []  # per input: concrete value, type, strides, dims
    for arg in inputs:
        if isinstance(arg, str):
            rows.append((f'"{arg}"', '"Scalar"', "[]", "[]"))
            continue
        strides, step = [], 1
        for size in reversed(arg):
            strides.insert(0, step)
            step *= size
        rows.append(('""', f'"{dtype}"', str(strides), str(list(arg))))
    concrete, types, strides_, dims = (", ".join(column) for column in zip(*rows))
    return (f'"Concrete Inputs": [{concrete}], "Input type": [{types}], '
            f'"Input Strides": [{strides_}], "Input Dims": [{dims}]')


def _gemm(layout: str, us: float) -> _DevOp:
    return _kernel(f"sm90_xmma_gemm_bf16bf16_bf16f32_f32_{layout}_n_tilesize128x128x64_warpgroupsize"
                   "1x1x1_execute_segment_k_off_kernel__5x_cublas", us, (64, 32, 1), (384, 1, 1),
                   168, 213248, 19)


_BIG = (32768, 1, 1), (128, 1, 1), 22, 0, 100  # geometry of an 8192x4096 elementwise kernel
_TINY = (512, 1, 1), (128, 1, 1), 20, 0, 24  # geometry of a 256x1024 elementwise kernel
_MM = _inputs((8192, 4096), (4096, 4096))
_ACT = (8, 1024, 4096)  # activations: batch 8, sequence 1024, hidden 4096
_BWD = "autograd::engine::evaluate_function: "

# DDP forward operators cycle linear -> relu -> compiled (triton); each launches one kernel.
_DDP_FWD = (
    _Op((("cpu_op", "aten::linear", _inputs(_ACT, (4096, 4096), (4096,))),),
        (_Leaf("aten::addmm", _inputs((4096,), (8192, 4096), (4096, 4096), "1", "1"),
               _gemm("tn", 390.0)),), seq_frames=1, flow="s"),
    _Op((("cpu_op", "aten::relu", _inputs(_ACT)),),
        (_Leaf("aten::clamp_min", _inputs(_ACT, "0"),
               _kernel(_ew("at::native::(anonymous namespace)::launch_clamp_scalar(at::TensorIteratorBase&, "
                           "c10::Scalar, c10::Scalar, at::native::detail::ClampLimits)::{lambda()#1}::"
                           "operator()() const::{lambda()#14}::operator()() const::{lambda(c10::BFloat16)#1}",
                           2), 45.0, *_BIG)),), seq_frames=1, flow="s"),
    _Op((("cpu_op", "CompiledFunction", ""),
         ("user_annotation", "## Call CompiledFxGraph fk3v7xq2ohbnu4kdtyr6m5ojyfwq2s7 ##", "")),
        (_Leaf("triton_poi_fused_relu_0", _inputs(_ACT),
               _kernel("triton_poi_fused_relu_0", 38.0, *_BIG), api="cuLaunchKernel"),),
        seq_frames=1, flow="s"),
)
_DDP_BWD = (
    _Op((("cpu_op", _BWD + "AddmmBackward0", ""), ("cpu_op", "AddmmBackward0", "")),
        (_Leaf("aten::mm", _MM, _gemm("nn", 395.0)), _Leaf("aten::mm", _MM, _gemm("nt", 410.0))),
        seq_frames=2, flow="f"),
    _Op((("cpu_op", _BWD + "ReluBackward0", ""), ("cpu_op", "ReluBackward0", "")),
        (_Leaf("aten::threshold_backward", _inputs(_ACT, _ACT, "0"),
               _kernel(_ew("at::native::(anonymous namespace)::threshold_kernel_impl<c10::BFloat16>("
                           "at::TensorIteratorBase&, c10::BFloat16, c10::BFloat16)::"
                           "{lambda(c10::BFloat16, c10::BFloat16)#1}", 3), 62.0, *_BIG)),),
        seq_frames=2, flow="f"),
    _Op((("cpu_op", _BWD + "CompiledFunctionBackward", ""), ("cpu_op", "CompiledFunctionBackward", "")),
        (_Leaf("triton_poi_fused_threshold_backward_0", _inputs(_ACT, _ACT),
               _kernel("triton_poi_fused_threshold_backward_0", 52.0, *_BIG), api="cuLaunchKernel"),),
        seq_frames=2, flow="f"),
)


def _tiny(fn: str, fwd_us: float, bwd_name: str, bwd_fn: str, bwd_us: float, py: str) -> tuple[_Op, _Op]:
    """A launch-bound elementwise op on a 256x1024 tensor: kernels of 2-5 us."""
    dims = _inputs((256, 1024), dtype="float")
    fwd = _Op((), (_Leaf(f"aten::{fn}", dims, _kernel(_ew(f"at::native::{fn}_kernel_cuda<float>", 2),
                                                       fwd_us, *_TINY)),), seq_frames=1, flow="s", py=py)
    bwd = _Op((("cpu_op", _BWD + bwd_name, ""), ("cpu_op", bwd_name, "")),
              (_Leaf(f"aten::{bwd_fn}", dims, _kernel(_ew(f"at::native::{bwd_fn}_kernel_cuda<float>", 3),
                                                       bwd_us, *_TINY)),), seq_frames=2, flow="f")
    return fwd, bwd


_NN = "torch/nn/modules/activation.py"
_TINY_OPS = (
    _tiny("mul", 2.4, "MulBackward0", "mul", 2.6, "model.py(31): forward"),
    _tiny("gelu", 3.6, "GeluBackward0", "gelu_backward", 4.4, f"{_NN}(734): forward"),
    _tiny("sigmoid", 2.9, "SigmoidBackward0", "sigmoid_backward", 3.3, f"{_NN}(299): forward"),
    _tiny("tanh", 3.1, "TanhBackward0", "tanh_backward", 3.5, f"{_NN}(391): forward"),
)


def _copy(cat: str, name: str, nbytes: int, gbps: float, stream: int) -> _DevOp:
    return _DevOp(cat, name, nbytes / gbps / _US + 1.2, stream=stream, nbytes=nbytes)


_H2D = _Op((("cpu_op", "aten::to", ""), ("cpu_op", "aten::_to_copy", "")),
           (_Leaf("aten::copy_", _inputs((8, 1024, 512), (8, 1024, 512), "True"),
                  _copy("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 8_388_608, 48.0, _MEMCPY),
                  api="cudaMemcpyAsync"),))
_ZERO = _Op((("cpu_op", "aten::zero_", _inputs((33554432,))),),
            (_Leaf("aten::fill_", _inputs((33554432,), "0"),
                   _copy("gpu_memset", "Memset (Device)", 67_108_864, 2400.0, _COMPUTE),
                   api="cudaMemsetAsync"),))
_ADAMW = _kernel("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous "
                 "namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor"
                 "<c10::BFloat16, 4, (at::native::ADAM_MODE)1, false>, double*, double, double, double, double, "
                 "double, bool, double*, double*>(at::native::(anonymous namespace)::TensorListMetadata<4>, "
                 "at::native::(anonymous namespace)::FusedAdamMathFunctor<c10::BFloat16, 4, (at::native::"
                 "ADAM_MODE)1, false>, double*, double, double, double, double, double, bool, double*, double*)",
                 280.0, (1320, 1, 1), (512, 1, 1), 94, 0, 42)
_OPTIM = tuple(_Op((), (_Leaf("aten::_fused_adamw_", "", _ADAMW),)) for _ in range(2))
_ITEM = _Op((("cpu_op", "aten::item", _inputs((), dtype="float")),),
            (_Leaf("aten::_local_scalar_dense", _inputs((), dtype="float"),
                   _copy("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", 4, 0.004, _COMPUTE),
                   api="cudaMemcpyAsync"),))
_NCCL_GEOMETRY = _kernel("", 0, (32, 1, 1), (640, 1, 1), 96, 103808, 0).tail
_ALLGATHER = _Coll("c10d::_allgather_base_", "nccl:_all_gather_base", "_allgather_base",
                   "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 1_048_576, gather=True)
_ALLREDUCE = tuple(_Coll("c10d::allreduce_", "nccl:all_reduce", "allreduce",
                         "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", n)
                   for n in (13_107_200, 8_388_608))

# ---------------------------------------------------------------------------
# Output: event text templates and the streaming sink
# ---------------------------------------------------------------------------

_X = ('  {\n    "ph": "X", "cat": "%s", "name": "%s", "pid": %d, "tid": %d,\n'
      '    "ts": %.3f, "dur": %.3f,\n    "args": {\n      %s\n    }\n  }')
# Two-stage templates: the first % fills the static parts, leaving %d/%.3f fields for each event.
_X_TEMPLATE = _X.replace("%.3f", "%%.3f")  # cat, name, pid, tid, args format -> ts, dur, args values
_FLOW_TEMPLATE = ('  {\n    "ph": "%s", "id": %%d, "pid": %d, "tid": %d, "ts": %%.3f,\n'
                  '    "cat": "%s", "name": "%s"%s\n  }')  # ph, pid, tid, cat, cat, bp -> id, ts
_META = '  {\n    "name": "%s", "ph": "M", "ts": %.3f, "pid": %s, "tid": %s,\n    "args": {\n      %s\n    }\n  }'


class _Sink:
    """Collects one step's formatted events, then writes them as one chunk; counts what it wrote."""

    def __init__(self, fh: BinaryIO | None) -> None:
        self.fh = fh
        self.buf: list[str] = []
        self.sep = ""
        self.cats: Counter[str] = Counter()
        self.events = self.nbytes = self.nccl = 0

    def write(self, text: str) -> None:
        data = text.encode()
        if self.fh is not None:
            self.fh.write(data)
        self.nbytes += len(data)

    def add(self, cat: str | None, text: str) -> None:
        self.buf.append(text)
        self.events += 1
        if cat:
            self.cats[cat] += 1

    def flush(self) -> None:
        if self.buf:
            self.write(self.sep + ",\n".join(self.buf))
            self.sep = ",\n"
            self.buf.clear()


def _mix(*parts: int) -> int:
    seed = 0
    for part in parts:
        seed = seed * 1_000_003 + part
    return seed


# ---------------------------------------------------------------------------
# Simulation of one rank
# ---------------------------------------------------------------------------

_Step = Generator[tuple[int, int], int, None]  # yields (arrival, transfer) at each collective


class _Rank:
    """One rank's process: a CPU thread, three CUDA streams and the profiler's id counters.

    Timing is always simulated, identically; events are formatted only for the rank
    being written (``live``), so the other ranks cost little while they pace the collectives.
    """

    def __init__(self, sc: Scenario, rank: int, sink: _Sink | None) -> None:
        self.sc, self.rank = sc, rank
        self.live = sink is not None
        self.sink = sink if sink is not None else _Sink(None)  # never flushed when not live
        self.pid = _HOST_PID_BASE + rank
        self.dev = rank % 8
        self.slow = sc.straggler_slowdown if rank == sc.straggler_rank else 1.0
        self.launch_ns = (8000, 2000) if sc.launch_bound else (4500, 3500)  # launch call: lo, span
        pairs = _TINY_OPS if sc.launch_bound else tuple(zip(_DDP_FWD, _DDP_BWD))
        self.fwd = tuple(fwd for fwd, _ in pairs)  # forward op of layer i: fwd[i % len(fwd)]
        self.bwd = tuple(bwd for _, bwd in pairs)
        self.cpu = _T0 + 200 * _US + rank * 37_117  # profilers start a little apart
        self.free = {_COMPUTE: 0, _MEMCPY: 0, _NCCL: 0}  # when each stream becomes idle
        self.streams: set[int] = set()
        self.rng = random.Random(sc.seed)
        self.rand = self.rng.random
        self.ext = self.corr = self.ev = self.seq = self.py_id = self.pg_seq = 0
        self.gpu_lo, self.gpu_hi = 1 << 62, 0
        self.templates: dict[object, str] = {}
        self.pg_ranks = "[" + ", ".join(map(str, range(sc.ranks))) + "]"

    # -- id counters and emission helpers ---------------------------------

    def _next(self, counter: str) -> int:
        value = getattr(self, counter) + 1
        setattr(self, counter, value)
        return value

    def _dt(self, lo: float, hi: float) -> int:
        """A random CPU/GPU delay between ``lo`` and ``hi`` microseconds, in ns."""
        return int((lo + (hi - lo) * self.rand()) * _US)

    # Events are formatted from per-rank templates: the text of one kind of event with its
    # static parts (names, pids, static args) filled in and %-fields left for ts, dur and ids.

    @staticmethod
    def _template(cat: str, name: str, pid: int, tid: int, args_fmt: str) -> str:
        return _X_TEMPLATE % (cat, name.replace("%", "%%"), pid, tid, args_fmt)

    def _op(self, cat: str, name: str, static: str, ts: int, dur: int, ext: int,
            seq: int | None = None, fwd_thread: int = 0, ev: int | None = None) -> None:
        """A cpu_op or user_annotation with the profiler's usual args."""
        key = (cat, name, static, seq is None, fwd_thread)
        tmpl = self.templates.get(key)
        if tmpl is None:
            fmt = '"External id": %d,"Record function id": %d, '
            if seq is not None:
                fmt += f'"Sequence number": %d, "Fwd thread id": {fwd_thread}, '
            fmt += (static.replace("%", "%%") + ", " if static else "") + '"Ev Idx": %d'
            tmpl = self.templates[key] = self._template(cat, name, self.pid, self.pid, fmt)
        if ev is None:
            self.ev = ev = self.ev + 1
        values = (ext, ext, ev) if seq is None else (ext, ext, seq, ev)
        self.sink.add(cat, tmpl % (ts / _US, dur / _US, *values))

    def _py(self, name: str, ts: int, dur: int, parent: int | None, ident: int, ev: int) -> None:
        tmpl = self.templates.get(("py", name))
        if tmpl is None:
            fmt = '"Python parent id": %s, "Python id": %d, "Ev Idx": %d'
            tmpl = self._template("python_function", name, self.pid, self.pid, fmt)
            self.templates["py", name] = tmpl
        parent_text = "null" if parent is None else parent
        self.sink.add("python_function", tmpl % (ts / _US, dur / _US, parent_text, ident, ev))

    def _flow(self, ph: str, fid: int, pid: int, tid: int, ts: int, cat: str) -> None:
        key = (ph, pid, tid, cat)
        tmpl = self.templates.get(key)
        if tmpl is None:
            bp = ', "bp": "e"' if ph == "f" else ""
            tmpl = self.templates[key] = _FLOW_TEMPLATE % (ph, pid, tid, cat, cat, bp)
        self.sink.add(cat, tmpl % (fid, ts / _US))

    def _device(self, dev: _DevOp, ts: int, dur: int, ext: int, corr: int, extra: str = "") -> None:
        """A kernel, memcpy or memset on ``dev.stream`` of this rank's GPU."""
        tmpl = self.templates.get(dev) if not extra else None
        if tmpl is None:
            tail = dev.tail.replace("%", "%%") or f'"bytes": {dev.nbytes}, "memory bandwidth (GB/s)": %r'
            fmt = ('"External id": %d,      ' + ('"queued": 0, ' if dev.cat == "kernel" else "")
                   + f'"device": {self.dev}, "context": 1,      "stream": {dev.stream}, "correlation": %d,      '
                   + tail + extra.replace("%", "%%"))
            tmpl = self._template(dev.cat, dev.name, self.dev, dev.stream, fmt)
            if not extra:
                self.templates[dev] = tmpl
        values = (ext, corr) if dev.tail else (ext, corr, dev.nbytes / dur)
        self.sink.add(dev.cat, tmpl % (ts / _US, dur / _US, *values))
        self.streams.add(dev.stream)
        self.gpu_lo, self.gpu_hi = min(self.gpu_lo, ts), max(self.gpu_hi, ts + dur)

    def _runtime(self, api: str, ts: int, dur: int, ext: int, corr: int) -> None:
        cat, cbid = _API[api]
        tmpl = self.templates.get(api)
        if tmpl is None:
            fmt = f'"External id": %d,      "cbid": {cbid}, "correlation": %d'
            tmpl = self.templates[api] = self._template(cat, api, self.pid, self.pid, fmt)
        self.sink.add(cat, tmpl % (ts / _US, dur / _US, ext, corr))

    def _begin(self, name: str, cat: str = "user_annotation") -> tuple[str, str, int, int, int]:
        """Open a span on the CPU thread; ``_end`` closes and emits it."""
        ident = self._next("py_id" if cat == "python_function" else "ext")
        frame = (cat, name, self.cpu, ident, self._next("ev"))
        self.cpu += self._dt(1.0, 3.0)
        return frame

    def _end(self, frame: tuple[str, str, int, int, int]) -> None:
        self.cpu += self._dt(1.0, 3.0)
        if not self.live:
            return
        cat, name, start, ident, ev = frame
        if cat == "python_function":
            self._py(name, start, self.cpu - start, None, ident, ev)
        else:
            self._op(cat, name, "", start, self.cpu - start, ident, ev=ev)

    # -- operators and collectives ------------------------------------------

    def _run(self, op: _Op, after: int = 0, seq: int | None = None, py_parent: int = 0) -> int:
        """Run ``op`` on the CPU thread, enqueue its device ops; return when the last one ends."""
        rand, free, ext, corr = self.rand, self.free, self.ext, self.corr  # hot path: locals only
        t = py_start = self.cpu  # delays below are "lo_ns + int(span_ns * rand())"
        if op.py:
            t += 2500 + int(2500 * rand())
        opened = []
        for k, frame in enumerate(op.frames):
            ext += 1
            opened.append((frame, t, ext, seq if k < op.seq_frames else None))
            t += 1500 + int(2500 * rand())
        launch_lo, launch_span = self.launch_ns
        launches, done = [], 0
        for leaf in op.leaves:
            ext += 1
            corr += 1
            dev = leaf.dev
            api_ts = t + 1500 + int(2000 * rand())
            api_dur = launch_lo + int(launch_span * rand())
            start = max(api_ts + 2500 + int(3500 * rand()), free[dev.stream], after)
            scale = self.slow if dev.cat == "kernel" else 1.0
            free[dev.stream] = done = start + int(dev.us * scale * (960 + 80 * rand()))
            leaf_end = api_ts + api_dur + 1000 + int(2000 * rand())
            launches.append((leaf, t, leaf_end - t, ext, api_ts, api_dur, corr, start, done - start))
            t = leaf_end + 1000 + int(2000 * rand())
        ends = []
        for _ in opened:  # innermost frame closes first
            ends.append(t)
            t += 1000 + int(2000 * rand())
        self.cpu = t + (2000 + int(2000 * rand()) if op.py else 8000 + int(12000 * rand()))
        self.ext, self.corr = ext, corr
        if not self.live:
            return done
        if op.py:
            self._py(op.py, py_start, t - py_start, py_parent, self._next("py_id"), self._next("ev"))
        fwd_thread = int(op.flow == "f")
        for k, (((cat, name, static), start, ext, sq), end) in enumerate(zip(opened, reversed(ends))):
            self._op(cat, name, static, start, end - start, ext, sq, fwd_thread)
            if sq is not None and k == op.seq_frames - 1 and op.flow:
                self._flow(op.flow, sq, self.pid, self.pid, start, "fwdbwd")
        leaf_seq = seq if op.seq_frames > len(op.frames) else None  # a frameless op is sequenced itself
        for leaf, start, dur, ext, api_ts, api_dur, corr, g_start, g_dur in launches:
            self._op("cpu_op", leaf.name, leaf.static, start, dur, ext, leaf_seq, fwd_thread)
            if leaf_seq is not None and op.flow:
                self._flow(op.flow, leaf_seq, self.pid, self.pid, start, "fwdbwd")
                leaf_seq = None
            self._runtime(leaf.api, api_ts, api_dur, ext, corr)
            self._flow("s", corr, self.pid, self.pid, api_ts, "ac2g")
            self._device(leaf.dev, g_start, g_dur, ext, corr)
            self._flow("f", corr, self.dev, leaf.dev.stream, g_start, "ac2g")
        return done

    def _graph(self, ops: list[_Op], after: int) -> int:
        """Replay the kernels of ``ops`` as one captured CUDA graph; return when the last one ends.

        One cpu_op (``CUDAGraph.replay``) calls ``cudaGraphLaunch`` once; every kernel carries its
        correlation, back to back on the compute stream with the short gaps of graph scheduling.
        """
        rand, free = self.rand, self.free
        start_cpu = self.cpu
        ext, corr = self._next("ext"), self._next("corr")
        api_ts = start_cpu + 1500 + int(2000 * rand())
        api_dur = 6000 + int(4000 * rand())  # one call for the whole graph
        start = max(api_ts + 3000 + int(3000 * rand()), free[_COMPUTE], after)
        nodes = []
        for node, dev in enumerate((leaf.dev for op in ops for leaf in op.leaves if leaf.dev.cat == "kernel"), 1):
            dur = int(dev.us * self.slow * (960 + 80 * rand()))
            nodes.append((dev, start, dur, node))
            start += dur + 500 + int(1500 * rand())  # the graph's own scheduling gap between dependent nodes
        done = nodes[-1][1] + nodes[-1][2] if nodes else start
        free[_COMPUTE] = max(free[_COMPUTE], done)
        end = api_ts + api_dur + 1000 + int(2000 * rand())
        self.cpu = end + 8000 + int(12000 * rand())
        if not self.live:
            return done
        self._op("cpu_op", "CUDAGraph.replay", "", start_cpu, end - start_cpu, ext)
        self._runtime("cudaGraphLaunch", api_ts, api_dur, ext, corr)
        self._flow("s", corr, self.pid, self.pid, api_ts, "ac2g")
        for dev, ts, dur, node in nodes:
            self._device(dev, ts, dur, ext, corr,
                         extra=f', "graph id": {_GRAPH_ID}, "graph node id": {(_GRAPH_ID << 32) | node}')
        if nodes:
            self._flow("f", corr, self.dev, nodes[0][0].stream, nodes[0][1], "ac2g")
        return done

    def _collective(self, c: _Coll, ready: int) -> Generator[tuple[int, int], int, int]:
        """Issue ``c`` once the compute stream reached ``ready``; return its (global) end time."""
        dt, world = self._dt, self.sc.ranks
        seq = self._next("pg_seq")
        t_op = self.cpu
        t_rpc = t_op + dt(4.0, 8.0)
        t_rec = t_rpc + dt(5.0, 10.0)  # ProcessGroupNCCL::syncStream: record + wait event
        rec_dur, wait_dur = dt(2.0, 4.0), dt(1.5, 3.0)
        t_wait = t_rec + rec_dur + dt(0.5, 1.5)
        t_ann = t_wait + wait_dur + dt(2.0, 5.0)
        t_api = t_ann + dt(3.0, 6.0)
        api_dur = dt(7.0, 12.0)
        ann_end = t_api + api_dur + dt(2.0, 4.0)
        rpc_end = ann_end + dt(3.0, 8.0)
        op_end = rpc_end + dt(2.0, 5.0)
        self.cpu = op_end + dt(8.0, 15.0)
        start = max(t_api + dt(4.0, 8.0), self.free[_NCCL], ready)
        jitter = random.Random(_mix(self.sc.seed, seq)).uniform(0.97, 1.08)  # same on every rank
        end = yield start, int(c.transfer_ns(world, self.sc.busbw_gbps) * jitter)
        self.free[_NCCL] = end
        if not self.live:
            return end
        e_op, e_rpc, e_ann = self._next("ext"), self._next("ext"), self._next("ext")
        out = c.out_nelems(world)
        common = (f'"Collective name": "{c.coll}", "dtype": "BFloat16", "In msg nelems": {c.nelems}, '
                  f'"Out msg nelems": {out}, "In split size": "[]", "Out split size": "[]", ')
        group = (f'"Group size": {world}, "Process Group Name": "0", "Process Group Description": "default_pg", '
                 f'"Process Group Ranks": "{self.pg_ranks}"')
        self._op("cpu_op", c.op, "", t_op, op_end - t_op, e_op)
        args = (f'"External id": {e_rpc},"Record function id": {e_rpc}, "Ev Idx": {self._next("ev")}, {common}'
                f'"Global rank start": 0, "Global rank stride": 1, {group}, "Rank": {self.rank}, "Seq": {seq}')
        kernel_name, kernel_args, annotation = c.kernel, f", {common}{group}, \"Seq\": {seq}", ""
        if not self.sc.comm_metadata:  # PyTorch <= 2.0: shapes only, old kernel names
            args = (f'"External id": {e_rpc}, "Ev Idx": {self._next("ev")}, "Input Dims": [[], [], [], [], [], [], '
                    '[]], "Input type": ["TensorList", "Scalar", "Scalar", "Scalar", "", "", ""]')
            kernel_name, kernel_args = _old_kernel_name(c.kernel), ""
            annotation = _inputs((c.nelems,))
        self.sink.add("cpu_op", _X % ("cpu_op", "record_param_comms", self.pid, self.pid, t_rpc / _US,
                                      (rpc_end - t_rpc) / _US, args))
        self._runtime("cudaEventRecord", t_rec, rec_dur, e_rpc, self._next("corr"))
        self._runtime("cudaStreamWaitEvent", t_wait, wait_dur, e_rpc, self._next("corr"))
        self._op("user_annotation", c.annotation, annotation, t_ann, ann_end - t_ann, e_ann)
        corr = self._next("corr")
        self._runtime("cudaLaunchKernelExC", t_api, api_dur, e_ann, corr)
        self._flow("s", corr, self.pid, self.pid, t_api, "ac2g")
        kernel = _DevOp("kernel", kernel_name, 0.0, stream=_NCCL, tail=_NCCL_GEOMETRY)
        self._device(kernel, start, end - start, e_ann, corr, kernel_args)
        self._flow("f", corr, self.dev, _NCCL, start, "ac2g")
        self.sink.nccl += 1
        return end

    # -- one training step ----------------------------------------------------

    def step(self, n: int) -> _Step:
        """ProfilerStep#n: data, all-gather, forward, backward with bucketed all-reduce, optimizer, sync."""
        sc, live = self.sc, self.live
        self.rng = random.Random(_mix(sc.seed, self.rank, n))
        self.rand, dt = self.rng.random, self._dt
        profiler_step = self._begin(f"ProfilerStep#{n}")
        self.gpu_lo, self.gpu_hi = 1 << 62, 0
        py = self._begin("train.py(58): train_step", "python_function") if sc.launch_bound else None
        loader = self._begin("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__")
        stall = sc.straggler_delay_us if self.rank == sc.straggler_rank else 0.0
        self.cpu += dt(120.0, 220.0) + int(stall * _US)
        self._end(loader)
        ready = self._run(_H2D)
        zero = self._begin("Optimizer.zero_grad#AdamW.zero_grad")
        ready = max(ready, self._run(_ZERO))
        self._end(zero)
        if sc.ranks > 1:  # parameters are gathered before the forward may start
            ready = yield from self._collective(_ALLGATHER, ready)
        forward = self._begin("DistributedDataParallel.forward" if sc.ranks > 1 else "## forward ##")
        seqs = []
        if sc.cuda_graph:
            seqs = [self._next("seq") for _ in range(sc.layers)]
            self._graph([self.fwd[i % len(self.fwd)] for i in range(sc.layers)], after=ready)
        for i in range(0 if sc.cuda_graph else sc.layers):
            seqs.append(self._next("seq"))
            self._run(self.fwd[i % len(self.fwd)], after=ready, seq=seqs[-1], py_parent=py[3] if py else 0)
        self._end(forward)
        backward = self._begin("## backward ##")
        cuts = {round(sc.layers * (b + 1) / sc.buckets) for b in range(sc.buckets)}
        grads_done = 0
        for j, i in enumerate(reversed(range(sc.layers))):
            grad = self._run(self.bwd[i % len(self.bwd)], seq=seqs[i])
            if sc.ranks > 1 and j + 1 in cuts:  # a bucket of gradients is ready: all-reduce it
                bucket = _ALLREDUCE[sorted(cuts).index(j + 1) % len(_ALLREDUCE)]
                grads_done = yield from self._collective(bucket, grad)
        self._end(backward)
        optimizer = self._begin("Optimizer.step#AdamW.step")
        for op in _OPTIM:  # the compute stream waits for the last all-reduce
            self._run(op, after=grads_done)
        self._end(optimizer)
        copied = self._run(_ITEM)  # loss.item(): copy to host, then block until the GPU is done
        sync_ts, corr = self.cpu, self._next("corr")
        self.cpu = max(sync_ts + dt(3.0, 6.0), copied + dt(2.0, 5.0))
        if live:
            self._runtime("cudaStreamSynchronize", sync_ts, self.cpu - sync_ts, self.ext, corr)
        self.cpu += dt(10.0, 30.0)
        if py:
            self._end(py)
        self._end(profiler_step)
        if live:
            self.sink.add("gpu_user_annotation", _X % (
                "gpu_user_annotation", f"ProfilerStep#{n}", self.dev, _COMPUTE, self.gpu_lo / _US,
                (self.gpu_hi - self.gpu_lo) / _US, f'"External id": {profiler_step[3]}'))
        self.cpu += dt(30.0, 80.0)

    def trailer(self) -> Iterator[tuple[str | None, str]]:
        """Kineto's closing events: process/thread metadata, the profiler span and instants."""
        begin, end = _T0 / _US, max(self.cpu, *self.free.values()) / _US + 50.0
        process = "python3.11"
        for pid, name, label, order in ((self.pid, process, "CPU", self.pid),
                                        (self.dev, process, f"GPU {self.dev}", 16777216 + self.dev)):
            yield None, _META % ("process_name", begin, pid, 0, f'"name": "{name}"')
            yield None, _META % ("process_labels", begin, pid, 0, f'"labels": "{label}"')
            yield None, _META % ("process_sort_index", begin, pid, 0, f'"sort_index": {order}')
        threads = [(self.pid, self.pid, f"thread {self.pid} (pt_main_thread)", self.pid)]
        threads += [(self.dev, s, f"stream {s} ", s) for s in sorted(self.streams)]
        for pid, tid, name, order in threads:
            yield None, _META % ("thread_name", begin, pid, tid, f'"name": "{name}"')
            yield None, _META % ("thread_sort_index", begin, pid, tid, f'"sort_index": {order}')
        yield "Trace", (f'  {{\n    "ph": "X", "cat": "Trace", "ts": {begin:.3f}, "dur": {end - begin:.3f},\n'
                        '    "pid": "Spans", "tid": "PyTorch Profiler",\n    "name": "PyTorch Profiler (0)",\n'
                        '    "args": {\n      "Op count": 0\n    }\n  }')
        yield None, _META % ("process_sort_index", begin, '"Spans"', 0, '"sort_index": 536870912')
        for name, pid, tid, ts in (("Iteration Start: PyTorch Profiler", "Traces", "Trace PyTorch Profiler", begin),
                                   ("Record Window End", "", "", end)):
            yield None, (f'  {{\n    "name": "{name}", "ph": "i", "s": "g",\n'
                         f'    "pid": "{pid}", "tid": "{tid}", "ts": {ts:.3f}\n  }}')


def _run_step(ranks: list[_Rank], n: int) -> None:
    """Advance every rank through step ``n`` in lockstep, completing each collective globally."""
    steps = [rank.step(n) for rank in ranks]

    def advance(step: _Step, value: int | None) -> tuple[int, int] | None:
        try:
            return step.send(value)
        except StopIteration:
            return None

    pending = [advance(s, None) for s in steps]
    while pending[0] is not None:
        end = max(arrival for arrival, _ in pending) + pending[0][1]
        pending = [advance(s, end) for s in steps]


# ---------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------


def _old_kernel_name(kernel: str) -> str:
    """``ncclDevKernel_AllReduce_Sum_bf16_RING_LL(...)`` as NCCL 2.7 to 2.18 named it: ``ncclKernel_AllReduce_RING_LL_Sum_...``."""
    op = kernel.split("(")[0].split("_")[1]
    return f"ncclKernel_{op}_RING_LL_Sum_{'__nv_bfloat16' if op == 'AllReduce' else 'int8_t'}(ncclWorkElem)"


def _header(sc: Scenario, rank: int) -> str:
    dev = rank % 8
    dist: dict[str, object] = {
        "backend": "nccl", "rank": rank, "world_size": sc.ranks, "pg_count": 1,
        "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl",
                       "pg_size": sc.ranks, "ranks": list(range(sc.ranks))}], "nccl_version": "2.21.5"}
    if not sc.comm_metadata:  # PyTorch <= 2.0 wrote no process groups
        dist = {"backend": "nccl", "rank": rank, "world_size": sc.ranks}
    trace_id = hashlib.md5(f"{sc.name}:{sc.seed}:{rank}".encode()).hexdigest().upper()
    return (
        '{\n  "schemaVersion": 1,\n  "deviceProperties": [\n    {\n'
        f'      "id": {dev}, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 84929216512,\n'
        '      "computeMajor": 9, "computeMinor": 0,\n'
        '      "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048,\n'
        '      "regsPerBlock": 65536, "regsPerMultiprocessor": 65536, "warpSize": 32,\n'
        '      "sharedMemPerBlock": 49152, "sharedMemPerMultiprocessor": 233472,\n'
        '      "numSms": 132, "sharedMemPerBlockOptin": 232448\n    }\n  ],\n'
        f'  "distributedInfo": {json.dumps(dist)},\n  "record_shapes": 1,\n  "with_flops": 0,\n'
        f'  "cuda_runtime_version": 12040,\n  "cuda_driver_version": 12040,\n  "trace_id": "{trace_id}",\n'
        f'  "host_name": "trainer-{rank // 8:03d}",\n  "baseTimeNanoseconds": {sc.base_time_ns},\n'
        '  "traceEvents": [\n')


@contextmanager
def _open_out(path: Path, compresslevel: int) -> Iterator[BinaryIO]:
    with open(path, "wb", buffering=1 << 20) as raw:
        if path.suffix != ".gz":
            yield raw
            return
        # filename="" and mtime=0 keep the gzip header independent of path and time
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=compresslevel, mtime=0) as gz:
            yield gz


def write_trace(path: str | Path, scenario: Scenario, rank: int, *, target_bytes: int | None = None,
                compresslevel: int | None = None) -> dict:
    """Write ``rank``'s trace of ``scenario`` to ``path`` (gzip if it ends with .gz), streaming.

    With ``target_bytes``, steps repeat past ``scenario.steps`` until the uncompressed JSON is
    about that size. ``compresslevel`` defaults to 9 for sample files, 1 with ``target_bytes``.
    Returns counts of what was written (see the README for the keys).
    """
    if not 0 <= rank < scenario.ranks:
        raise ValueError(f"rank {rank} outside 0..{scenario.ranks - 1}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    level = compresslevel if compresslevel is not None else (9 if target_bytes is None else 1)
    with _open_out(path, level) as fh:
        sink = _Sink(fh)
        ranks = [_Rank(scenario, r, sink if r == rank else None) for r in range(scenario.ranks)]
        sink.write(_header(scenario, rank))
        steps = last = 0

        def more() -> bool:  # with a target: stop when less than half a step is missing
            if target_bytes is None:
                return steps < scenario.steps
            return steps == 0 or target_bytes - sink.nbytes > last // 2

        while more():
            before = sink.nbytes
            _run_step(ranks, scenario.first_step + steps)
            sink.flush()
            steps, last = steps + 1, sink.nbytes - before
        for cat, text in ranks[rank].trailer():
            sink.add(cat, text)
        sink.flush()
        sink.write('\n  ],\n  "traceName": "/tmp/libkineto_activities_%d.json",\n  "displayTimeUnit": "ms"\n}\n'
                   % ranks[rank].pid)
    return {
        "scenario": scenario.name, "rank": rank, "world_size": scenario.ranks, "steps": steps,
        "events": sink.events, "cat_counts": dict(sorted(sink.cats.items())),
        "device_ops": {k: sink.cats[k] for k in ("kernel", "gpu_memcpy", "gpu_memset")},
        "nccl_kernels": sink.nccl, "bytes": sink.nbytes, "file_bytes": path.stat().st_size,
    }


def write_scenario(out_dir: str | Path, scenario: Scenario) -> list[Path]:
    """Write ``rank-<r>.json.gz`` for every rank of ``scenario`` into ``out_dir``."""
    paths = [Path(out_dir) / f"rank-{r}.json.gz" for r in range(scenario.ranks)]
    for rank, path in enumerate(paths):
        write_trace(path, scenario, rank)
    return paths


def main(argv: list[str] | None = None) -> int:
    default_out = Path(__file__).resolve().parent / "kineto"
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    known = SCENARIOS | EXTRA_SCENARIOS
    parser.add_argument("--scenario", default="all", help=f"one of {', '.join(known)}, or all (default: the "
                        f"committed ones, {', '.join(SCENARIOS)})")
    parser.add_argument("--out", type=Path, help=f"output folder (default {default_out}); with --target-mb, "
                        "the output file (default ./<scenario>-rank<R>-<N>mb.json; .gz compresses)")
    parser.add_argument("--target-mb", type=float, help="write one rank, repeating steps up to N MB of JSON")
    parser.add_argument("--rank", type=int, default=0, help="rank to write with --target-mb (default 0)")
    args = parser.parse_args(argv)
    if args.scenario != "all" and args.scenario not in known:
        parser.error(f"unknown scenario {args.scenario!r}")
    if args.target_mb is not None:
        name = "ddp_straggler" if args.scenario == "all" else args.scenario
        out = args.out or Path(f"{name}-rank{args.rank}-{args.target_mb:g}mb.json")
        started = time.perf_counter()
        summary = write_trace(out, known[name], args.rank, target_bytes=int(args.target_mb * 1e6))
        seconds = time.perf_counter() - started
        summary["mb_per_s"] = round(summary["bytes"] / 1e6 / seconds, 1)
        print(json.dumps({"path": str(out), **summary}))
        return 0
    names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    for name in names:
        for path in write_scenario((args.out or default_out) / name, known[name]):
            print(path, path.stat().st_size, "bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
