"""A trace's operator calls that launched work, found by their position: in memory, or wherever a caller keeps them.

:class:`~.op_stats.OpParts` asks, for each device op of a window, its operator call (the position its launch call
names: :class:`~.launches.Launched`'s ``owner``) and that call's number among the trace's calls, its row of
:attr:`~.op_stats.Operators.kinds`, its host time and whether it is recomputed (:class:`CallRows`). A
:class:`CallLookup` answers: :class:`CallArrays` from arrays in memory; the warehouse's table on disk
(``warehouse/call_table.py``) a row group at a time, so that nothing per call is held through the windows
(docs/architecture.md, "Memory"). Pure: numpy in, arrays out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class CallRows:
    """Of each operator position asked: its call's number among the trace's calls (-1 where it is not a call that
    launched work; the other three are 0 there), its row of the kinds, its host time in ns, whether recomputed."""

    index: np.ndarray
    key: np.ndarray
    host_ns: np.ndarray
    recomputed: np.ndarray

    @classmethod
    def none(cls, n: int) -> CallRows:
        """``n`` positions, none of them a call."""
        return cls(np.full(n, -1, dtype=np.int64), np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64),
                   np.zeros(n, dtype=bool))


class CallLookup(Protocol):
    """A trace's calls that launched work, numbered by position ascending."""

    def __len__(self) -> int:
        """How many calls."""

    def find(self, owner: np.ndarray) -> CallRows:
        """Each position of ``owner`` (-1: none) as a call."""


class CallArrays:
    """A :class:`CallLookup` of arrays: ``rows`` (the calls' positions, ascending), and of each its ``key``,
    ``host_ns`` and ``recomputed`` flag."""

    def __init__(self, rows: np.ndarray, key: np.ndarray, host_ns: np.ndarray, recomputed: np.ndarray) -> None:
        self.rows, self.key, self.host_ns, self.recomputed = rows, key, host_ns, recomputed

    def __len__(self) -> int:
        return len(self.rows)

    def find(self, owner: np.ndarray) -> CallRows:
        return found_in(self.rows, owner, self.key, self.host_ns, self.recomputed)


def found_in(rows: np.ndarray, owner: np.ndarray, key: np.ndarray, host_ns: np.ndarray, recomputed: np.ndarray,
             first: int = 0) -> CallRows:
    """:meth:`CallLookup.find` in one stretch of the calls: ``rows`` their positions (ascending), ``first`` the
    number of the stretch's first call."""
    if not len(rows):
        return CallRows.none(len(owner))
    at = np.minimum(np.searchsorted(rows, owner), len(rows) - 1)
    hit = (owner >= 0) & (rows[at] == owner)
    return CallRows(np.where(hit, at + first, -1), np.where(hit, key[at], 0).astype(np.int64),
                    np.where(hit, host_ns[at], 0).astype(np.int64), hit & recomputed[at])


class Bits:
    """A flag per call, a bit each (a call's number sets and reads it)."""

    def __init__(self, n: int) -> None:
        self._bits = np.zeros((n + 7) // 8, dtype=np.uint8)

    def get(self, at: np.ndarray) -> np.ndarray:
        return (self._bits[at >> 3] >> (at & 7).astype(np.uint8)) & 1 == 1

    def set(self, at: np.ndarray) -> None:
        np.bitwise_or.at(self._bits, at >> 3, (1 << (at & 7)).astype(np.uint8))
