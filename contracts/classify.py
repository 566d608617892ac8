"""Classification of device operations into compute, communication, memory and sync.

One ordered rule table (docs/analyses.md, "Classification of device ops") for every
format: each rule weighs the evidence a format has, the op's ``kind`` (Kineto's event
category, or the XLA parser's ``gpu_kind``), its ``name`` and, for XLA, its
``hlo_category`` (or HLO opcode). The first rule that matches decides. The same table
drives the SQL the Kineto parser runs at ingest (:func:`category_sql`) and the Python
function the XLA parsers call per op (:func:`classify`); a test checks that both agree
on every device-op name of the real traces.

This module imports nothing of the project's, so that every parser can use it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache


class Category(StrEnum):
    """What a device op spends its time on; the values are the strings stored in ``device_ops.category``."""

    COMPUTE = "compute"
    COMMUNICATION = "communication"
    MEMORY = "memory"
    SYNC = "sync"


#: Every category, in the order of :class:`Category`.
CATEGORIES: tuple[Category, ...] = tuple(Category)

#: HLO collective opcodes (their async ``-start``/``-done`` forms and fusions match too).
COLLECTIVE_OPCODES = (
    "all-reduce", "all-gather", "reduce-scatter", "all-to-all", "ragged-all-to-all",
    "collective-permute", "collective-broadcast", "send", "recv",
)
#: An ``hlo_category`` or opcode that names a collective: group 1 is the opcode.
COLLECTIVE_HLO = (
    r"^\s*(?:async[- ])?(" + "|".join(re.escape(o) for o in COLLECTIVE_OPCODES) + r")(?:-start|-done|-update)?"
    r"(?:[ -]fusion)?(?:\.\d+)?\s*$"
)
#: HLO opcodes (or ``hlo_category`` values) that move memory rather than compute.
MEMORY_OPCODES = ("copy", "copy-start", "copy-done", "dynamic-update-slice", "host-offload")
#: Names of copies and fills: CUDA's ``Memcpy``/``Memset``, ROCm's ``__amd_rocclr_copyBuffer``/``fillBuffer``
#: and roctracer's ``CopyHostToDevice``/``CopyDeviceToDevice``/``FillBuffer``.
COPY_NAME = r"memcpy|copybuffer|^copy(?:host|device)to(?:host|device|peer)"
FILL_NAME = r"memset|fillbuffer"


@dataclass(frozen=True)
class Rule:
    """``category`` applies when any condition holds: ``kind`` in ``kinds``, or a regex matches.

    Regexes are searched (not anchored unless they say so) without regard to case, in
    Python and in DuckDB (RE2) alike. A rule without conditions matches every op.
    """

    category: Category
    why: str
    kinds: tuple[str, ...] = ()
    name_regex: str | None = None
    hlo_regex: str | None = None


#: Ordered: sync first (never busy time), then communication, memory, compute.
RULES: tuple[Rule, ...] = (
    Rule(Category.SYNC, "device-side waits are not work", kinds=("sync",)),
    Rule(Category.COMMUNICATION, "XLA collectives: all-reduce, all-gather-start, reduce-scatter fusion, ...",
         hlo_regex=COLLECTIVE_HLO),
    Rule(
        Category.COMMUNICATION,
        "NCCL/RCCL/HCCL collective and point-to-point kernels (ncclKernel_*, ncclDevKernel_* since NCCL 2.19)",
        name_regex=r"^(?:nccl|rccl|hccl)|ncclkernel|nccldevkernel",
    ),
    Rule(Category.MEMORY, "copies and fills (Kineto memcpy/memset events, MTIA dma_request)",
         kinds=("memcpy", "memset")),
    Rule(Category.MEMORY, "XLA copies: copy, copy-start, copy-done, dynamic-update-slice, host-offload",
         hlo_regex=r"^\s*(?:" + "|".join(re.escape(o) for o in MEMORY_OPCODES) + r")\s*$"),
    Rule(Category.MEMORY, "kernels named as copies or fills (Memcpy*, Memset*, copyBuffer, FillBuffer, CopyXToY)",
         name_regex=f"{COPY_NAME}|{FILL_NAME}"),
    Rule(Category.COMPUTE, "every other op"),
)

_FLAGS = re.IGNORECASE
_COMPILED = [
    (rule, re.compile(rule.name_regex, _FLAGS) if rule.name_regex else None,
     re.compile(rule.hlo_regex, _FLAGS) if rule.hlo_regex else None)
    for rule in RULES
]
_COPY = re.compile(COPY_NAME, _FLAGS)
_FILL = re.compile(FILL_NAME, _FLAGS)


@lru_cache(maxsize=65536)
def classify(kind: str | None, name: str | None, hlo_category: str | None = None) -> Category:
    """The category of one device op from the evidence its format has.

    Args:
        kind: ``kernel``, ``memcpy``, ``memset``, ``sync`` or ``xla_op`` (None if unknown).
        name: the op's name (a kernel name, an HLO instruction name).
        hlo_category: XLA's ``hlo_category`` of the op, or its HLO opcode; None for Kineto.
    """
    for rule, name_re, hlo_re in _COMPILED:
        if not rule.kinds and name_re is None and hlo_re is None:
            return rule.category
        if kind is not None and kind in rule.kinds:
            return rule.category
        if name_re is not None and name is not None and name_re.search(name):
            return rule.category
        if hlo_re is not None and hlo_category is not None and hlo_re.search(hlo_category):
            return rule.category
    return Category.COMPUTE


def category_sql(kind: str = "kind", name: str = "name", hlo_category: str | None = None) -> str:
    """A SQL ``CASE`` expression applying :data:`RULES` to the given column expressions.

    ``hlo_category`` None leaves out the XLA rules (Kineto has no such evidence).
    """
    whens = []
    for rule in RULES:
        conds = []
        if rule.kinds:
            kinds = ", ".join(f"'{k}'" for k in rule.kinds)
            conds.append(f"{kind} IN ({kinds})")
        if rule.name_regex:
            conds.append(f"regexp_matches({name}, {_sql_text(rule.name_regex)}, 'i')")
        if rule.hlo_regex and hlo_category is not None:
            conds.append(f"regexp_matches({hlo_category}, {_sql_text(rule.hlo_regex)}, 'i')")
        if not rule.kinds and not rule.name_regex and not rule.hlo_regex:
            whens.append(f"ELSE '{rule.category}'")
            break
        if conds:
            whens.append(f"WHEN {' OR '.join(conds)} THEN '{rule.category}'")
    return "CASE " + " ".join(whens) + " END"


def op_kind(name: str) -> str:
    """``memcpy``, ``memset`` or ``kernel`` for a GPU op known only by its name (XLA GPU streams)."""
    if _FILL.search(name):
        return "memset"
    if _COPY.search(name):
        return "memcpy"
    return "kernel"


def _sql_text(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"
