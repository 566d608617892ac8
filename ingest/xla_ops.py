"""What an XLA op is: its category, collective name and message size (docs/formats.md, section 2).

Shared by the XSpace parser and the trace-viewer JSON parser, so both classify the
same op the same way.
"""

from __future__ import annotations

import re

#: HLO collective opcodes (their async ``-start``/``-done`` forms and fusions match too).
COLLECTIVE_OPCODES = (
    "all-reduce", "all-gather", "reduce-scatter", "all-to-all", "ragged-all-to-all",
    "collective-permute", "collective-broadcast", "send", "recv",
)
_COLLECTIVE = re.compile(
    r"^(?:async[- ])?(" + "|".join(re.escape(o) for o in COLLECTIVE_OPCODES) + r")(?:-start|-done|-update)?"
    r"(?:[ -]fusion)?(?:\.\d+)?$"
)
#: Categories and opcodes that move memory rather than compute.
MEMORY_OPCODES = frozenset({"copy", "copy-start", "copy-done", "dynamic-update-slice", "host-offload"})
_GPU_MEMORY_NAME = re.compile(r"memcpy|memset|copybuffer|fillbuffer", re.IGNORECASE)
_GPU_COLLECTIVE_NAME = re.compile(r"^(nccl|rccl)", re.IGNORECASE)
_SHAPE = re.compile(r"\b(pred|[sfuc]\d+|bf16|f8e\w+?)\[([\d,]*)\]")
_DTYPE_BITS = {"pred": 8, "bf16": 16}


def collective_name(category_or_opcode: str | None) -> str | None:
    """``all_reduce`` for ``all-reduce``, ``all-reduce-start``, ``all-reduce fusion``...; None if not a collective."""
    if not category_or_opcode:
        return None
    match = _COLLECTIVE.match(category_or_opcode.strip().lower())
    return match.group(1).replace("-", "_") if match else None


def category(hlo_category: str | None, name: str, *, gpu_kernel: bool = False) -> str:
    """``communication``, ``memory`` or ``compute`` for an op."""
    if collective_name(hlo_category) or (gpu_kernel and _GPU_COLLECTIVE_NAME.match(name)):
        return "communication"
    if (hlo_category or "").lower() in MEMORY_OPCODES or (gpu_kernel and _GPU_MEMORY_NAME.search(name)):
        return "memory"
    return "compute"


def gpu_kind(name: str) -> str:
    """``memcpy``, ``memset`` or ``kernel`` for a GPU op name."""
    lowered = name.lower()
    if "memset" in lowered or "fillbuffer" in lowered:
        return "memset"
    if "memcpy" in lowered or "copybuffer" in lowered:
        return "memcpy"
    return "kernel"


#: JAX collective primitives, which name their HLO instructions (``psum.7``), by the opcode they lower to.
JAX_PRIMITIVES = {
    "psum": "all-reduce", "pmax": "all-reduce", "pmin": "all-reduce", "pmean": "all-reduce",
    "all_gather": "all-gather", "reduce_scatter": "reduce-scatter", "psum_scatter": "reduce-scatter",
    "ppermute": "collective-permute", "all_to_all": "all-to-all",
}


def opcode_of(instruction: str | None) -> str | None:
    """The opcode an instruction name suggests, if it is one we know: the fallback when neither
    ``hlo_category`` nor the HLO proto says (``all-reduce.3`` -> ``all-reduce``; the JAX primitive
    names ``psum.7`` -> ``all-reduce``, ``ppermute.3`` -> ``collective-permute``)."""
    if not instruction:
        return None
    base = re.sub(r"\.\d+$", "", instruction.strip().lower())
    if base in JAX_PRIMITIVES:
        return JAX_PRIMITIVES[base]
    return base if collective_name(base) or base in MEMORY_OPCODES else None


def result_bytes(hlo_text: str | None) -> int | None:
    """Bytes of an HLO instruction's result from its text (``%x = f32[8,128]{1,0} add(...)``); tuples: the largest."""
    if not hlo_text or "=" not in hlo_text:
        return None
    result = hlo_text.split("=", 1)[1].lstrip()
    if result.startswith("("):
        depth, end = 0, 0
        for i, ch in enumerate(result):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0:
                end = i
                break
        result = result[: end + 1]
    else:
        result = result.split(" ", 1)[0]
    sizes = []
    for dtype, dims in _SHAPE.findall(result):
        bits = _DTYPE_BITS.get(dtype) or int(re.sub(r"\D", "", dtype.split("e")[0]) or 8)
        count = 1
        for dim in filter(None, dims.split(",")):
            count *= int(dim)
        sizes.append(count * bits // 8)
    return max(sizes) if sizes else None


def message_bytes(out_bytes: int | None, bytes_accessed: int | None) -> int | None:
    """nccl-tests size of a collective: max(input, output), with input = bytes accessed - output."""
    if out_bytes is None:
        return None
    if bytes_accessed is None or bytes_accessed <= out_bytes:
        return out_bytes
    return max(out_bytes, bytes_accessed - out_bytes)
