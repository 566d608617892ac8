"""What an NCCL or RCCL kernel's name says about the collective it runs.

A pure table of name forms (docs/analyses.md, "Collectives derived from kernels"),
newest first, each a regular expression with named groups:

* ``ncclDevKernel_AllReduce_Sum_f32_RING_LL`` (NCCL 2.19 and later; RCCL 2.18 and later),
  ``ncclDevKernel_AllGather_RING_LL`` (no reduction, no type), ``ncclDevKernel_SendRecv``
  and ``ncclDevKernel_Generic`` / ``ncclDevKernel_Generic_4`` (the name says nothing);
* ``ncclKernel_AllReduce_RING_LL_Sum_float`` (NCCL 2.7 to 2.18, RCCL before 2.18);
* ``ncclAllReduceRingLLKernel_sum_f32`` (NCCL 2.4 to 2.6; no ``LL`` means the simple
  protocol) and ``ncclAllReduceLLKernel_sum_f32`` (before 2.4, no algorithm).

Kernel names carry a reduction and a type even where the operation reduces nothing
(``ncclKernel_Broadcast_RING_LL_Sum_int8_t``: a byte copy): for operations that only move
data, :func:`parse` returns no reduction and no type, as the name says nothing about the
tensor. Everything a name does not say is ``None``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: NCCL operation names -> PyTorch's names (``collectives.collective``). ``SendRecv`` is
#: NCCL's fused point-to-point kernel, which runs sends, receives or an all_to_all: its
#: name does not say which, hence a name of its own.
OPS: dict[str, str] = {
    "AllReduce": "allreduce", "AllGather": "allgather", "ReduceScatter": "reduce_scatter",
    "Broadcast": "broadcast", "Reduce": "reduce", "SendRecv": "sendrecv", "Send": "send", "Recv": "recv",
    "AllToAll": "all_to_all", "AlltoAll": "all_to_all", "AllToAllPivot": "all_to_all",
    "Gather": "gather", "Scatter": "scatter",
}
#: Operations that reduce: only for these does a kernel name's reduction and type describe the tensor.
REDUCING = frozenset({"allreduce", "reduce_scatter", "reduce"})
#: Reductions, in NCCL's spellings -> lower-case names (``MinMax`` kernels run min or max: unknown).
REDUCTIONS: dict[str, str | None] = {
    "sum": "sum", "prod": "prod", "min": "min", "max": "max", "avg": "avg", "premulsum": "premul_sum",
    "sumpostdiv": "avg", "minmax": None, "copy": None,
}
#: Element types, in every spelling kernel names use -> PyTorch's dtype names (as ``record_param_comms`` writes).
TYPES: dict[str, str] = {
    "int8_t": "Char", "i8": "Char", "uint8_t": "Byte", "u8": "Byte", "int32_t": "Int", "i32": "Int",
    "uint32_t": "UInt32", "u32": "UInt32", "int64_t": "Long", "i64": "Long", "uint64_t": "UInt64", "u64": "UInt64",
    "half": "Half", "f16": "Half", "fp16": "Half", "float": "Float", "f32": "Float", "double": "Double",
    "f64": "Double", "__nv_bfloat16": "BFloat16", "bfloat16": "BFloat16", "bf16": "BFloat16",
    "hip_bfloat16": "BFloat16", "rccl_bfloat16": "BFloat16", "__nv_fp8_e4m3": "Float8_e4m3fn",
    "f8e4m3": "Float8_e4m3fn", "__nv_fp8_e5m2": "Float8_e5m2", "f8e5m2": "Float8_e5m2",
    "rccl_float8": "Float8_e4m3fnuz", "rccl_bfloat8": "Float8_e5m2fnuz",
}
ALGORITHMS = ("COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS_TREE", "COLLNET", "NVLS", "RING", "TREE", "PAT")
PROTOCOLS = ("LL128", "LL", "SIMPLE")

_OP = "(?P<op>[A-Z][A-Za-z]+?)"
_ALGO = "(?P<algo>" + "|".join(ALGORITHMS) + ")"
_PROTO = "(?P<proto>" + "|".join(PROTOCOLS) + ")"
_CAMEL_ALGO = "(?P<algo>Ring|Tree|CollNetDirect|CollNetChain|CollNet)"

#: The forms, tried in order; the first that matches the whole base name decides.
FORMS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("dev_generic", re.compile(r"ncclDevKernel(?:Debug)?_Generic(?:_\d+)?")),
    ("dev_sendrecv", re.compile(r"ncclDevKernel_(?P<op>SendRecv|Send|Recv)")),
    ("dev_reducing", re.compile(rf"ncclDevKernel_{_OP}_(?P<redop>[A-Za-z]+)_(?P<type>[a-z0-9]+)_{_ALGO}_{_PROTO}")),
    ("dev", re.compile(rf"ncclDevKernel_{_OP}_{_ALGO}_{_PROTO}")),
    ("kernel", re.compile(rf"ncclKernel_{_OP}_{_ALGO}_{_PROTO}_(?P<redop>[A-Za-z]+)_(?P<type>\w+)")),
    ("camel", re.compile(rf"nccl{_OP}{_CAMEL_ALGO}?(?P<proto>LL128|LL)?Kernel_(?P<redop>[a-z]+)_(?P<type>[a-z0-9]+)")),
)

_CAMEL_ALGOS = {"Ring": "RING", "Tree": "TREE", "CollNet": "COLLNET", "CollNetDirect": "COLLNET_DIRECT",
                "CollNetChain": "COLLNET_CHAIN"}


@dataclass(frozen=True)
class KernelForm:
    """What one kernel name says; ``None`` where it says nothing."""

    form: str
    collective: str | None = None
    algorithm: str | None = None
    protocol: str | None = None
    reduction: str | None = None
    dtype: str | None = None


def base_name(name: str) -> str:
    """The function name alone: no ``void`` prefix, no argument list or template arguments."""
    name = name.strip().removeprefix("void ").strip()
    for stop in ("(", "<"):
        name = name.split(stop, 1)[0]
    return name.strip()


def parse(name: str) -> KernelForm | None:
    """What the NCCL/RCCL kernel called ``name`` runs; ``None`` when ``name`` has none of the known forms."""
    base = base_name(name)
    for form, pattern in FORMS:
        match = pattern.fullmatch(base)
        if match is None:
            continue
        groups = match.groupdict()
        op = OPS.get(groups.get("op") or "")
        if groups.get("op") and op is None:
            continue
        algorithm = groups.get("algo")
        protocol = groups.get("proto")
        if form == "camel":
            algorithm = _CAMEL_ALGOS.get(algorithm) if algorithm else None
            # Before 2.7 the simple protocol had no suffix; before 2.4 there was no algorithm either.
            protocol = protocol or ("SIMPLE" if algorithm else None)
        reduces = op in REDUCING
        redop = groups.get("redop")
        reduction = REDUCTIONS.get(redop.lower()) if redop and reduces else None
        dtype = TYPES.get(groups.get("type") or "") if reduces else None
        return KernelForm(form, op, algorithm, protocol, reduction, dtype)
    return None
