"""Classification of device operations into compute, communication, memory and sync.

The rules are data (docs/analyses.md, "Classification of device ops"): the
first rule that matches decides. The same table drives the SQL used at ingest and
the Python function used in tests and by other parsers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

CATEGORIES = ("compute", "communication", "memory", "sync")


@dataclass(frozen=True)
class Rule:
    """``category`` applies when the op's kind is in ``kinds`` or its name matches ``name_regex``."""

    category: str
    why: str
    kinds: tuple[str, ...] = ()
    name_regex: str | None = None


#: Ordered: sync first (never busy time), then communication, memory, compute.
RULES: tuple[Rule, ...] = (
    Rule("sync", "device-side waits are not work", kinds=("sync",)),
    Rule(
        "communication",
        "NCCL/RCCL/HCCL collective and point-to-point kernels (ncclKernel_*, ncclDevKernel_* since NCCL 2.19)",
        name_regex=r"(?i)^(nccl|rccl|hccl)|ncclkernel|nccldevkernel",
    ),
    Rule("memory", "copies and fills", kinds=("memcpy", "memset")),
    Rule("memory", "kernels named Memcpy*/Memset*", name_regex=r"(?i)^mem(cpy|set)"),
    Rule("compute", "every other kernel"),
)

_COMPILED = [(r, re.compile(r.name_regex) if r.name_regex else None) for r in RULES]


def classify(kind: str, name: str) -> str:
    """Return the category of one device op of ``kind`` (kernel|memcpy|memset|sync) called ``name``."""
    for rule, regex in _COMPILED:
        if rule.kinds and kind in rule.kinds:
            return rule.category
        if regex is not None and regex.search(name):
            return rule.category
        if not rule.kinds and regex is None:
            return rule.category
    return "compute"


def category_sql(kind: str = "kind", name: str = "name") -> str:
    """A SQL ``CASE`` expression applying :data:`RULES` to columns ``kind`` and ``name``."""
    whens = []
    for rule in RULES:
        conds = []
        if rule.kinds:
            kinds = ", ".join(f"'{k}'" for k in rule.kinds)
            conds.append(f"{kind} IN ({kinds})")
        if rule.name_regex:
            pattern = rule.name_regex.replace("(?i)", "")
            conds.append(f"regexp_matches({name}, '{pattern}', 'i')")
        if not conds:
            whens.append(f"ELSE '{rule.category}'")
            break
        whens.append(f"WHEN {' OR '.join(conds)} THEN '{rule.category}'")
    return "CASE " + " ".join(whens) + " END"
