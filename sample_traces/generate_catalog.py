"""The static catalog of the Kineto trace generator (``generate.py``): device ops, CPU operators, collectives.

Kernels with their launch geometry, the CPU operators of a DDP step (linear, relu, a compiled
Triton op, their backwards, copies, memsets, the fused AdamW step) and of a launch-bound one
(tiny elementwise ops), the NCCL collectives with their ring transfer cost, and the simulation's
constants (clock unit, pids, CUDA stream ids, launch APIs). Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass

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
