"""Which PyTorch operators keep their ``Concrete Inputs`` arg in ``host_ops.concrete_inputs``.

A Kineto trace recorded with ``record_shapes`` gives every operator a ``Concrete Inputs`` arg: the
values of its scalar and list arguments as strings (``["", "", "[2, 2]", "[1, 1]", "1"]``). Most are
never read, so both Kineto engines keep it only for the operators named here (docs/schema.md,
``host_ops``): ``c10d::`` collectives, for their peer, tag or root rank (docs/analyses.md, "Gloo and
other host collectives"), and the operators whose cost needs an argument that is not a tensor
(docs/analyses.md, "Operators"): the stride, padding, dilation and transposed flag of a convolution,
whether an attention is causal, and the dims a reduction reduces over.

This module imports nothing of the project's, so that every parser can use it.
"""

from __future__ import annotations

#: The name prefix of operators that always keep ``Concrete Inputs``.
CONCRETE_PREFIX = "c10d::"

#: Operators whose FLOPs or bytes read ``Concrete Inputs`` (a test checks this against the cost rules).
CONCRETE_OPS: frozenset[str] = frozenset({
    # convolutions: stride, padding, dilation, transposed, output padding; backward: transposed, output mask
    "aten::convolution", "aten::_convolution", "aten::conv1d", "aten::conv2d", "aten::conv3d",
    "aten::cudnn_convolution", "aten::miopen_convolution", "aten::miopen_depthwise_convolution",
    "aten::mkldnn_convolution", "aten::_slow_conv2d_forward", "aten::_conv_depthwise2d",
    "aten::convolution_backward",
    # attention: is_causal (or the efficient kernels' custom_mask_type)
    "aten::scaled_dot_product_attention",
    "aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_cudnn_attention",
    "aten::_scaled_dot_product_fused_attention_overrideable",
    "aten::_flash_attention_forward", "aten::_efficient_attention_forward", "aten::_cudnn_attention_forward",
    "aten::_scaled_dot_product_flash_attention_backward",
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
    "aten::_scaled_dot_product_efficient_attention_backward",
    "aten::_scaled_dot_product_cudnn_attention_backward",
    "aten::_flash_attention_backward", "aten::_efficient_attention_backward", "aten::_cudnn_attention_backward",
    # reductions: the dims reduced over
    "aten::sum", "aten::mean", "aten::amax", "aten::amin", "aten::prod",
})


def keeps_concrete(name: str | None) -> bool:
    """Whether an operator of this name keeps its ``Concrete Inputs``."""
    return name is not None and (name.startswith(CONCRETE_PREFIX) or name in CONCRETE_OPS)
