"""What an XLA op is: its collective name, opcode and message size (docs/formats.md, section 2).

Shared by the XSpace parser and the trace-viewer JSON parser. Categories come from the
one rule table of every format, :func:`tracelake.contracts.classify.classify`
(docs/analyses.md, "Classification of device ops"), called with the op's kind, name and
``hlo_category``.
"""

from __future__ import annotations

import re

from tracelake.contracts.classify import COLLECTIVE_HLO, MEMORY_OPCODES

_COLLECTIVE = re.compile(COLLECTIVE_HLO, re.IGNORECASE)
_SHAPE = re.compile(r"\b(pred|[sfuc]\d+|bf16|f8e\w+?)\[([\d,]*)\]")
_DTYPE_BITS = {"pred": 8, "bf16": 16}


def collective_name(category_or_opcode: str | None) -> str | None:
    """``all_reduce`` for ``all-reduce``, ``all-reduce-start``, ``all-reduce fusion``...; None if not a collective."""
    if not category_or_opcode:
        return None
    match = _COLLECTIVE.match(category_or_opcode.strip().lower())
    return match.group(1).replace("-", "_") if match else None


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
