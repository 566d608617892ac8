"""FLOPs and bytes of one PyTorch operator from the shapes and dtypes Kineto records with it.

Pure functions over what a ``cpu_op`` carries in its args (``Input Dims``, ``Input type``,
``Concrete Inputs``); no I/O. The formulas, the conventions (one multiply-add is 2 FLOPs; a
causal mask halves attention; unknown is "no estimate", never 0) and which operator of a
nested chain carries the cost are in docs/analyses.md, "Operator FLOPs and bytes".
The operator tables are data, declared once below.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal

Kind = Literal["matmul", "conv", "attention", "norm", "elementwise", "reduction"]

#: Bytes per element of each dtype as Kineto's ``Input type`` names it. Not listed: no bytes estimate.
DTYPE_BYTES: dict[str, int] = {
    "double": 8, "float": 4, "c10::Half": 2, "c10::BFloat16": 2,
    "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1, "c10::Float8_e4m3fnuz": 1, "c10::Float8_e5m2fnuz": 1,
    "c10::Float8_e8m0fnu": 1, "long int": 8, "long": 8, "int": 4, "short int": 2, "short": 2,
    "signed char": 1, "unsigned char": 1, "bool": 1, "c10::complex<float>": 8, "c10::complex<double>": 16,
    "c10::complex<c10::Half>": 4,
}
#: The key of :data:`tracelake.analysis.peaks` figures a dtype runs at (matmul and conv inputs).
PEAK_DTYPE: dict[str, str] = {
    "double": "fp64", "float": "fp32", "c10::Half": "fp16", "c10::BFloat16": "bf16",
    "c10::Float8_e4m3fn": "fp8", "c10::Float8_e5m2": "fp8", "c10::Float8_e4m3fnuz": "fp8",
    "c10::Float8_e5m2fnuz": "fp8", "signed char": "int8",
}
#: ``Input type`` values that are not tensors (a scalar, a list of ints, an absent optional).
NOT_TENSOR = frozenset({"", "Scalar", "ScalarList", "TensorList", "GenericList", "Device", "str", "Layout"})


@dataclass(frozen=True)
class Cost:
    """What one operator call computes and moves (docs/analyses.md, "Operator FLOPs and bytes")."""

    #: Floating-point operations; one multiply-add counts 2.
    flops: float
    #: Bytes read from inputs plus bytes written to outputs; None when a dtype's size is unknown.
    bytes: float | None
    #: The peak's dtype key (``bf16``, ``fp32``, ...): the matmul/conv/attention input dtype, else input 0's.
    dtype: str | None
    kind: Kind


#: Operators whose work is always done by a child operator that carries the cost; the caller
#: counts each call once by summing only operators where :func:`counted` is true. Value: the child.
COUNTED_IN_CHILD: dict[str, str] = {
    "aten::linear": "aten::addmm / aten::mm / aten::matmul", "aten::matmul": "aten::mm / aten::bmm / aten::mv",
    "aten::conv1d": "aten::convolution", "aten::conv2d": "aten::convolution", "aten::conv3d": "aten::convolution",
    "aten::conv_transpose1d": "aten::convolution", "aten::conv_transpose2d": "aten::convolution",
    "aten::conv_transpose3d": "aten::convolution", "aten::convolution": "aten::_convolution",
    "aten::_convolution": "aten::cudnn_convolution / miopen_convolution / mkldnn_convolution / ...",
    "aten::scaled_dot_product_attention": "aten::_scaled_dot_product_*_attention or its math decomposition",
    "aten::_scaled_dot_product_flash_attention": "aten::_flash_attention_forward",
    "aten::_scaled_dot_product_flash_attention_backward": "aten::_flash_attention_backward",
    "aten::_scaled_dot_product_efficient_attention": "aten::_efficient_attention_forward",
    "aten::_scaled_dot_product_efficient_attention_backward": "aten::_efficient_attention_backward",
    "aten::_scaled_dot_product_cudnn_attention": "aten::_cudnn_attention_forward",
    "aten::_scaled_dot_product_cudnn_attention_backward": "aten::_cudnn_attention_backward",
    "aten::layer_norm": "aten::native_layer_norm", "aten::batch_norm": "aten::_batch_norm_impl_index",
    "aten::_batch_norm_impl_index": "aten::native_batch_norm / cudnn_batch_norm / miopen_batch_norm",
    "aten::group_norm": "aten::native_group_norm", "aten::rms_norm": "aten::_fused_rms_norm or its decomposition",
    "aten::softmax": "aten::_softmax", "aten::log_softmax": "aten::_log_softmax",
    "aten::relu": "aten::clamp_min", "aten::relu_": "aten::clamp_min_", "aten::zero_": "aten::fill_",
    "aten::dropout": "aten::native_dropout", "aten::rsub": "aten::sub", "aten::square": "aten::pow",
}

# ---- matmul family: (index of A, index of B, batched) ----
_MATMUL: dict[str, tuple[int, int, bool]] = {
    "aten::mm": (0, 1, False), "aten::addmm": (1, 2, False), "aten::_addmm_activation": (1, 2, False),
    "aten::_scaled_mm": (0, 1, False), "aten::bmm": (0, 1, True), "aten::baddbmm": (1, 2, True),
    "aten::addbmm": (1, 2, True),
}

# ---- convolutions: (input, weight, stride, padding, dilation, transposed, output_padding) argument indices ----
_ConvArgs = tuple[int, int, int | None, int | None, int | None, int | None, int | None]
_CONV: dict[str, _ConvArgs] = {
    "aten::convolution": (0, 1, 3, 4, 5, 6, 7), "aten::_convolution": (0, 1, 3, 4, 5, 6, 7),
    "aten::conv1d": (0, 1, 3, 4, 5, None, None), "aten::conv2d": (0, 1, 3, 4, 5, None, None),
    "aten::conv3d": (0, 1, 3, 4, 5, None, None),
    "aten::cudnn_convolution": (0, 1, 3, 2, 4, None, None),
    "aten::miopen_convolution": (0, 1, 4, 3, 5, None, None),
    "aten::miopen_depthwise_convolution": (0, 1, 4, 3, 5, None, None),
    "aten::mkldnn_convolution": (0, 1, 4, 3, 5, None, None),
    "aten::_slow_conv2d_forward": (0, 1, 4, 5, None, None, None),
    "aten::_conv_depthwise2d": (0, 1, 4, 5, 6, None, None),
}
#: Transposed convolutions (weight is [C_in, C_out/groups, *kernel]): FLOPs need no stride.
_CONV_TRANSPOSED = frozenset({"aten::cudnn_convolution_transpose", "aten::miopen_convolution_transpose",
                              "aten::slow_conv_transpose2d", "aten::slow_conv_transpose3d"})

# ---- attention: (layout of q/k/v, index of q, index of is_causal or mask type, backward) ----
_ATTENTION: dict[str, tuple[Literal["bhtd", "bthd"], int, int, bool]] = {
    "aten::scaled_dot_product_attention": ("bhtd", 0, 5, False),
    "aten::_scaled_dot_product_flash_attention": ("bhtd", 0, 4, False),
    "aten::_scaled_dot_product_flash_attention_for_cpu": ("bhtd", 0, 4, False),
    "aten::_scaled_dot_product_efficient_attention": ("bhtd", 0, 6, False),
    "aten::_scaled_dot_product_cudnn_attention": ("bhtd", 0, 6, False),
    "aten::_scaled_dot_product_fused_attention_overrideable": ("bhtd", 0, 5, False),
    "aten::_flash_attention_forward": ("bthd", 0, 8, False),
    "aten::_efficient_attention_forward": ("bthd", 0, 9, False),
    "aten::_cudnn_attention_forward": ("bhtd", 0, 10, False),
    "aten::_scaled_dot_product_flash_attention_backward": ("bhtd", 1, 11, True),
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": ("bhtd", 1, 7, True),
    "aten::_scaled_dot_product_efficient_attention_backward": ("bhtd", 1, 11, True),
    "aten::_scaled_dot_product_cudnn_attention_backward": ("bhtd", 1, 14, True),
    "aten::_flash_attention_backward": ("bthd", 1, 11, True),
    "aten::_efficient_attention_backward": ("bthd", 1, 14, True),
    "aten::_cudnn_attention_backward": ("bhtd", 1, 14, True),
}
#: The efficient-attention kernels take ``custom_mask_type`` (0: none, 1 and 2: causal) where the others take a bool.
_MASK_TYPE = frozenset({"aten::_efficient_attention_forward", "aten::_efficient_attention_backward"})
#: FLOPs of an attention backward per FLOP of its forward: 5 matmuls of the forward's 2 (recomputing QK^T).
ATTENTION_BACKWARD_FACTOR = 2.5

# ---- memory-bound ops: (kind, FLOPs per element of input 0, outputs) ----
# outputs: "broadcast" writes the broadcast shape of the tensor inputs in input 0's dtype; a tuple
# of input indices writes a tensor shaped like each; "reduce" writes input 0 reduced over the dims
# in concrete input 1 (keepdim or not, same count); "bool" is "broadcast" in bool.
_Outputs = Literal["broadcast", "reduce", "bool"] | tuple[int, ...]
_BYTES_OPS: dict[str, tuple[Kind, float, _Outputs]] = {
    **{f"aten::{op}": ("elementwise", 1.0, "broadcast") for op in (
        "add", "add_", "sub", "sub_", "rsub", "mul", "mul_", "div", "div_", "neg", "abs", "exp", "exp_",
        "log", "log_", "sqrt", "rsqrt", "reciprocal", "pow", "square", "sigmoid", "sigmoid_", "tanh",
        "tanh_", "clamp", "clamp_", "clamp_min", "clamp_min_", "clamp_max", "clamp_max_", "gelu", "gelu_",
        "silu", "silu_", "cos", "sin", "where", "masked_fill", "masked_fill_", "threshold_backward",
        "sigmoid_backward", "tanh_backward", "gelu_backward", "silu_backward", "addcmul", "addcmul_",
        "addcdiv", "addcdiv_", "lerp", "lerp_", "nan_to_num", "native_dropout", "logit", "logit_backward")},
    **{f"aten::{op}": ("elementwise", 1.0, "bool") for op in ("eq", "ne", "lt", "le", "gt", "ge")},
    # A copy reads its source and writes its destination; a fill only writes.
    "aten::copy_": ("elementwise", 0.0, (0,)), "aten::fill_": ("elementwise", 0.0, (0,)),
    **{f"aten::{op}": ("reduction", 1.0, "reduce") for op in ("sum", "mean", "amax", "amin", "prod")},
    **{f"aten::{op}": ("reduction", 5.0, (0,)) for op in ("_softmax", "_log_softmax", "cumsum")},
    "aten::_softmax_backward_data": ("reduction", 3.0, (0,)),
    "aten::_log_softmax_backward_data": ("reduction", 3.0, (0,)),
    "aten::native_layer_norm": ("norm", 5.0, (0,)), "aten::native_layer_norm_backward": ("norm", 8.0, (1, 5, 6)),
    "aten::native_batch_norm": ("norm", 5.0, (0,)), "aten::cudnn_batch_norm": ("norm", 5.0, (0,)),
    "aten::miopen_batch_norm": ("norm", 5.0, (0,)),
    "aten::native_batch_norm_backward": ("norm", 8.0, (1, 2, 2)),
    "aten::cudnn_batch_norm_backward": ("norm", 8.0, (0, 2, 2)),
    "aten::miopen_batch_norm_backward": ("norm", 8.0, (0, 2, 2)),
    "aten::native_group_norm": ("norm", 5.0, (0,)), "aten::native_group_norm_backward": ("norm", 8.0, (1, 4, 4)),
    "aten::_fused_rms_norm": ("norm", 4.0, (0,)), "aten::_fused_rms_norm_backward": ("norm", 6.0, (1, 4)),
}
#: The input whose dtype the output has, where it is not input 0 (``where(condition, self, other)``).
_OUT_DTYPE_OF: dict[str, int] = {"aten::where": 1}
#: Inputs an op writes without reading (the destination of a copy or fill).
_WRITE_ONLY: dict[str, int] = {"aten::copy_": 0, "aten::fill_": 0}

Shape = tuple[int, ...]


def counted(name: str) -> bool:
    """Whether a caller summing a trace's costs counts this operator (known, and not :data:`COUNTED_IN_CHILD`).

    The caller also skips a counted op that has a descendant of the same name (an overload that
    re-dispatches, such as ``aten::div`` by a Python number calling ``aten::div``); see
    docs/analyses.md, "Operator FLOPs and bytes".
    """
    known = name in _MATMUL or name in _CONV or name in _CONV_TRANSPOSED or name in _ATTENTION or \
        name in _BYTES_OPS or name in ("aten::convolution_backward", "aten::mv", "aten::dot", "aten::addmv")
    return known and name not in COUNTED_IN_CHILD


def op_cost(name: str, input_dims: list | None, input_types: list | None,
            concrete: list | None = None) -> Cost | None:
    """FLOPs and bytes of one operator call (docs/analyses.md, "Operator FLOPs and bytes").

    Args:
        name: the ``cpu_op``'s name, e.g. ``aten::addmm``.
        input_dims: its ``Input Dims`` arg (one list per input; a tensor list is a list of lists).
        input_types: its ``Input type`` arg.
        concrete: its ``Concrete Inputs`` arg (strings such as ``"True"`` or ``"[1, 1]"``), when recorded.

    Returns:
        The :class:`Cost`, or None when the operator is unknown or its arguments do not fit its
        formula ("no estimate", never 0). Never raises on malformed arguments.
    """
    if not isinstance(input_dims, list) or not isinstance(input_types, list):
        return None
    try:
        return _cost(name, input_dims, input_types, concrete if isinstance(concrete, list) else [])
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


def _cost(name: str, dims: list, types: list, concrete: list) -> Cost | None:
    if name in _MATMUL:
        return _matmul(name, dims, types)
    if name in ("aten::mv", "aten::addmv", "aten::dot", "aten::matmul", "aten::linear"):
        return _matmul_general(name, dims, types)
    if name in _CONV:
        return _conv(name, dims, types, concrete)
    if name in _CONV_TRANSPOSED:
        return _conv_transposed(dims, types)
    if name == "aten::convolution_backward":
        return _conv_backward(dims, types, concrete)
    if name in _ATTENTION:
        return _attention(name, dims, types, concrete)
    if name in _BYTES_OPS:
        return _bytes_op(name, dims, types, concrete)
    return None


# ---- shapes and dtypes ----

def _shape(dims: object) -> Shape | None:
    """A tensor's sizes, or None when they are not a list of non-negative ints."""
    if not isinstance(dims, list) or not all(type(d) is int and d >= 0 for d in dims):
        return None
    return tuple(dims)


def _numel(shape: Shape) -> int:
    return math.prod(shape)


def _tensor(dims: list, types: list, i: int) -> tuple[Shape, str] | None:
    """Input ``i`` as (shape, dtype) when it is a tensor with valid sizes, else None."""
    if i >= len(dims) or i >= len(types) or not isinstance(types[i], str) or types[i] in NOT_TENSOR:
        return None
    shape = _shape(dims[i])
    return (shape, types[i]) if shape is not None else None


def _size(dtype: str) -> int | None:
    return DTYPE_BYTES.get(dtype)


def _nbytes(tensors: list[tuple[int, str]]) -> float | None:
    """Sum of elements x dtype size over (elements, dtype); None when a dtype's size is unknown."""
    total = 0
    for n, dtype in tensors:
        size = _size(dtype)
        if size is None:
            return None
        total += n * size
    return float(total)


def _broadcast(shapes: list[Shape]) -> Shape | None:
    out: list[int] = []
    for shape in shapes:
        if len(shape) > len(out):
            out = [1] * (len(shape) - len(out)) + out
        for j, d in enumerate(shape):
            k = len(out) - len(shape) + j
            if d != out[k] and d != 1 and out[k] != 1:
                return None
            out[k] = d if out[k] == 1 else out[k]
    return tuple(out)


def _int_list(concrete: list, i: int | None) -> list[int] | None:
    """Concrete input ``i`` as a list of ints (``"[2, 2]"`` or ``"2"``), None when absent or not one."""
    if i is None or i >= len(concrete) or not isinstance(concrete[i], str):
        return None
    text = concrete[i].strip()
    if re.fullmatch(r"-?\d+", text):
        return [int(text)]
    if re.fullmatch(r"\[\s*(-?\d+\s*(,\s*-?\d+\s*)*)?\]", text):
        return [int(x) for x in re.findall(r"-?\d+", text)]
    return None


def _flag(concrete: list, i: int, mask_type: bool = False) -> bool | None:
    """Concrete input ``i`` as a bool (``"True"``/``"False"``; a non-zero int for a mask type), None when absent."""
    if i >= len(concrete) or not isinstance(concrete[i], str):
        return None
    text = concrete[i].strip()
    if not mask_type:
        return text == "True" if text in ("True", "False") else None
    return int(text) != 0 if re.fullmatch(r"\d+", text) else None


def _cost_of(flops: float, kind: Kind, dtype: str, io: list[tuple[int, str]]) -> Cost | None:
    if flops < 0 or any(n < 0 for n, _ in io):
        return None
    return Cost(float(flops), _nbytes(io), PEAK_DTYPE.get(dtype), kind)


# ---- the formulas ----

def _matmul(name: str, dims: list, types: list) -> Cost | None:
    ia, ib, batched = _MATMUL[name]
    a, b = _tensor(dims, types, ia), _tensor(dims, types, ib)
    if a is None or b is None:
        return None
    (sa, ta), (sb, tb) = a, b
    rank = 3 if batched else 2
    if len(sa) != rank or len(sb) != rank or sa[-1] != sb[-2] or (batched and sa[0] != sb[0]):
        return None
    batch = sa[0] if batched else 1
    m, k, n = sa[-2], sa[-1], sb[-1]
    io = [(_numel(sa), ta), (_numel(sb), tb)]
    if ia == 1 and (bias := _tensor(dims, types, 0)) is not None:  # addmm/baddbmm read their bias
        io.append((_numel(bias[0]), bias[1]))
    out = m * n if name == "aten::addbmm" else batch * m * n
    # _scaled_mm's output dtype is a ScalarType code, not a dtype name: bf16, what fp8 training asks for.
    io.append((out, "c10::BFloat16" if name == "aten::_scaled_mm" else ta))
    return _cost_of(2 * batch * m * k * n, "matmul", ta, io)


def _matmul_general(name: str, dims: list, types: list) -> Cost | None:
    """``matmul`` (any ranks, broadcast batch), ``linear`` (weight [n, k]), ``mv``, ``addmv``, ``dot``."""
    if len(dims) != {"aten::linear": 3, "aten::addmv": 5}.get(name, 2):
        return None  # old profilers record other ops' inputs on a composite: no estimate rather than a wrong one
    first = 1 if name == "aten::addmv" else 0
    a, b = _tensor(dims, types, first), _tensor(dims, types, first + 1)
    if a is None or b is None:
        return None
    (sa, ta), (sb, tb) = a, b
    if name == "aten::linear":
        if len(sa) < 1 or len(sb) != 2 or sa[-1] != sb[1]:
            return None
        sb = (sb[1], sb[0])
    if not sa or not sb:
        return None
    a2 = sa if len(sa) > 1 else (1,) + sa
    b2 = sb if len(sb) > 1 else sb + (1,)
    if a2[-1] != b2[-2]:
        return None
    batch_shape = _broadcast([a2[:-2], b2[:-2]])
    if batch_shape is None:
        return None
    batch, m, k, n = _numel(batch_shape), a2[-2], a2[-1], b2[-1]
    io = [(_numel(sa), ta), (_numel(sb), tb), (batch * m * n, ta)]
    bias = {"aten::linear": 2, "aten::addmv": 0}.get(name)
    if bias is not None and (extra := _tensor(dims, types, bias)) is not None:
        io.append((_numel(extra[0]), extra[1]))
    return _cost_of(2 * batch * m * k * n, "matmul", ta, io)


def _spatial(concrete: list, i: int | None, n: int, default: int) -> list[int] | None:
    """A per-spatial-dim conv parameter: one value broadcast to ``n`` dims, ``default`` when the op has none."""
    if i is None:
        return [default] * n
    values = _int_list(concrete, i)
    if values is None or len(values) not in (1, n):
        return None
    return values * n if len(values) == 1 else values


def _conv(name: str, dims: list, types: list, concrete: list) -> Cost | None:
    ix, iw, i_stride, i_pad, i_dil, i_trans, i_outpad = _CONV[name]
    if i_trans is not None and _flag(concrete, i_trans):
        return _conv_transposed(dims, types, concrete, i_stride, i_pad, i_dil, i_outpad)
    x, w = _tensor(dims, types, ix), _tensor(dims, types, iw)
    if x is None or w is None:
        return None
    (sx, tx), (sw, tw) = x, w
    nsp = len(sx) - 2
    if nsp < 1 or len(sw) != len(sx) or sw[1] == 0 or sx[1] % sw[1]:
        return None
    stride, pad = _spatial(concrete, i_stride, nsp, 1), _spatial(concrete, i_pad, nsp, 0)
    dil = _spatial(concrete, i_dil, nsp, 1)
    if stride is None or pad is None or dil is None or min(stride) < 1:
        return None
    out = [(sx[2 + j] + 2 * pad[j] - dil[j] * (sw[2 + j] - 1) - 1) // stride[j] + 1 for j in range(nsp)]
    if min(out) < 0:
        return None
    n_, k = sx[0], sw[0]
    flops = 2 * n_ * k * sw[1] * _numel(sw[2:]) * _numel(tuple(out))
    return _cost_of(flops, "conv", tx, [(_numel(sx), tx), (_numel(sw), tw), (n_ * k * _numel(tuple(out)), tx)])


def _conv_transposed(dims: list, types: list, concrete: list | None = None, i_stride: int | None = None,
                     i_pad: int | None = None, i_dil: int | None = None,
                     i_outpad: int | None = None) -> Cost | None:
    """Transposed: 2·N·C_in·(C_out/groups)·prod(kernel)·prod(input spatial); the output needs the strides."""
    x, w = _tensor(dims, types, 0), _tensor(dims, types, 1)
    if x is None or w is None:
        return None
    (sx, tx), (sw, tw) = x, w
    nsp = len(sx) - 2
    if nsp < 1 or len(sw) != len(sx) or sx[1] != sw[0]:
        return None
    flops = 2 * sx[0] * sx[1] * sw[1] * _numel(sw[2:]) * _numel(sx[2:])
    io = [(_numel(sx), tx), (_numel(sw), tw)]
    if concrete is not None:
        stride, pad = _spatial(concrete, i_stride, nsp, 1), _spatial(concrete, i_pad, nsp, 0)
        dil, outpad = _spatial(concrete, i_dil, nsp, 1), _spatial(concrete, i_outpad, nsp, 0)
        if stride and pad and dil and outpad:
            out = [(sx[2 + j] - 1) * stride[j] - 2 * pad[j] + dil[j] * (sw[2 + j] - 1) + outpad[j] + 1
                   for j in range(nsp)]
            groups_out = sw[1] * (sx[1] // sw[0] if sw[0] else 1)
            io.append((sx[0] * groups_out * _numel(tuple(out)), tx))
            return _cost_of(flops, "conv", tx, io)
    return Cost(float(flops), None, PEAK_DTYPE.get(tx), "conv")


def _conv_backward(dims: list, types: list, concrete: list) -> Cost | None:
    """``convolution_backward(grad_output, input, weight, ..., transposed=7, ..., output_mask=10)``."""
    g, x, w = _tensor(dims, types, 0), _tensor(dims, types, 1), _tensor(dims, types, 2)
    if g is None or x is None or w is None:
        return None
    (sg, tg), (sx, tx), (sw, tw) = g, x, w
    if len(sg) < 3 or len(sx) != len(sg) or len(sw) != len(sg) or sg[0] != sx[0]:
        return None
    mask = _bool_list(concrete, 10) or [True, True, False]  # unrecorded: grad_input and grad_weight
    if len(mask) != 3:
        return None
    if _flag(concrete, 7):  # transposed: weight [C_in, C_out/groups, *kernel], input is the small side
        if sx[1] != sw[0]:
            return None
        one = 2 * sx[0] * sx[1] * sw[1] * _numel(sw[2:]) * _numel(sx[2:])
    else:
        if sg[1] != sw[0] or sw[1] == 0 or sx[1] % sw[1]:
            return None
        one = 2 * sg[0] * sg[1] * sw[1] * _numel(sw[2:]) * _numel(sg[2:])
    flops = one * (int(mask[0]) + int(mask[1])) + (_numel(sg) if mask[2] else 0)
    io = [(_numel(sg), tg), (_numel(sx), tx), (_numel(sw), tw)]
    io += [(_numel(sx), tx)] if mask[0] else []
    io += [(_numel(sw), tw)] if mask[1] else []
    io += [(sg[1], tg)] if mask[2] else []
    return _cost_of(flops, "conv", tx, io)


def _bool_list(concrete: list, i: int) -> list[bool] | None:
    if i >= len(concrete) or not isinstance(concrete[i], str):
        return None
    items = re.findall(r"True|False", concrete[i])
    return [v == "True" for v in items] if items else None


def _attention(name: str, dims: list, types: list, concrete: list) -> Cost | None:
    """4·B·H·Tq·Tk·D forward (QK^T and PV, 2 FLOPs per multiply-add), halved when causal; backward 2.5x."""
    layout, iq, i_causal, backward = _ATTENTION[name]
    q, k, v = (_tensor(dims, types, iq + j) for j in range(3))
    if q is None or k is None or v is None:
        return None
    (sq, tq), (sk, tk), (sv, tv) = q, k, v
    if len(sq) != 4 or len(sk) != 4 or len(sv) != 4:
        return None  # 3-D inputs are variable-length batches: the per-sequence lengths are not recorded
    if layout == "bhtd":
        b, h, t_q, d = sq
        t_k, d_k, t_v, d_v = sk[2], sk[3], sv[2], sv[3]
    else:
        b, t_q, h, d = sq
        t_k, d_k, t_v, d_v = sk[1], sk[3], sv[1], sv[3]
    if sk[0] != b or sv[0] != b or d_k != d or t_v != t_k:
        return None
    flops = 2.0 * b * h * t_q * t_k * (d + d_v)
    if _flag(concrete, i_causal, name in _MASK_TYPE):
        flops /= 2
    io = [(_numel(sq), tq), (_numel(sk), tk), (_numel(sv), tv)]
    out = (b * h * t_q * d_v, tq)
    if backward:  # read grad_out, q, k, v, out; write dq, dk, dv
        flops *= ATTENTION_BACKWARD_FACTOR
        io += [out, out, (_numel(sq), tq), (_numel(sk), tk), (_numel(sv), tv)]
    else:
        io.append(out)
    return _cost_of(flops, "attention", tq, io)


def _bytes_op(name: str, dims: list, types: list, concrete: list) -> Cost | None:
    """Memory-bound ops: bytes = tensor inputs read + outputs written; FLOPs = a few per element of input 0."""
    kind, per_element, outputs = _BYTES_OPS[name]
    tensors: list[tuple[int, Shape, str]] = []
    for i, t in enumerate(types):
        if isinstance(t, str) and t in NOT_TENSOR:
            continue
        tensor = _tensor(dims, types, i)
        if tensor is None:
            return None  # a tensor input whose sizes are malformed
        tensors.append((i, *tensor))
    if not tensors or tensors[0][0] != 0:
        return None
    first_shape, first_dtype = tensors[0][1], tensors[0][2]
    write_only = _WRITE_ONLY.get(name)
    io = [(_numel(s), t) for i, s, t in tensors if i != write_only]
    if outputs in ("broadcast", "bool"):
        shape = _broadcast([s for _, s, _ in tensors])
        if shape is None:
            return None
        dtype_of = {i: t for i, _, t in tensors}
        out_dtype = dtype_of.get(_OUT_DTYPE_OF.get(name, 0), first_dtype)
        io.append((_numel(shape), "bool" if outputs == "bool" else out_dtype))
    elif outputs == "reduce":
        reduced = _int_list(concrete, 1)
        if reduced is not None and first_shape:
            kept = [d for j, d in enumerate(first_shape)
                    if j not in {r % len(first_shape) for r in reduced}] if reduced else []
            io.append((_numel(tuple(kept)), first_dtype))
    else:
        by_index = {i: (s, t) for i, s, t in tensors}
        io += [(_numel(by_index[i][0]), by_index[i][1]) for i in outputs if i in by_index]
    return _cost_of(per_element * _numel(first_shape), kind, first_dtype, io)
