"""NCCL operation names as the warehouse writes them, and the message size nccl-tests would give them.

Shared by the Inspector, debug-log and profiler-plugin parsers, so one operation
gets one name and one size whichever record it comes from.
"""

from __future__ import annotations

import re

_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")
_SPECIAL = {"AllToAll": "all_to_all", "AlltoAll": "all_to_all", "SendRecv": "send"}
#: Collectives whose per-rank count or size is one rank's share of the nccl-tests size.
PER_RANK_SHARE = frozenset({"all_gather", "reduce_scatter", "all_to_all"})


def collective_name(nccl_name: str) -> str:
    """``AllReduce`` -> ``all_reduce``, ``AlltoAll`` -> ``all_to_all``, ``Send`` -> ``send``."""
    return _SPECIAL.get(nccl_name) or _CAMEL.sub("_", nccl_name).lower()


def nccl_tests_bytes(collective: str, per_rank_bytes: int | None, n_ranks: int | None) -> int | None:
    """The operation's size as nccl-tests counts it: the per-rank size, times the ranks where it is a share."""
    if per_rank_bytes is not None and n_ranks and collective in PER_RANK_SHARE:
        return per_rank_bytes * n_ranks
    return per_rank_bytes
