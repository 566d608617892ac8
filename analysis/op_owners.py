"""The operators that launched work, as the attribution settles them: packed into a log, given back by position.

:class:`~.op_attribution.Attribution` finds, per launch call, its operator (a position among the trace's host
events), that operator's scope (a :class:`~.op_attribution.ScopeTexts` id, -1 for none) and whether it runs as a
recomputation. An operator's launches can be settled in several pieces, and the operators whose parent came late are
settled late, so the same operator comes more than once and out of order. Each is packed into one integer
(:func:`pack`: the position in the high bits, so the integers sort by position) and appended to a
:class:`~.sorted_values.ValueLog`, which a caller may keep on disk: then nothing per operator is held while the
trace is read (docs/architecture.md, "Memory"). :meth:`OwnerLog.chunks` gives them back ascending and distinct,
a chunk at a time. Pure: numpy in, arrays out.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, fields

import numpy as np

from .sorted_values import MemoryLog, ValueLog

#: Bits of a packed operator, from the lowest: its recompute flag (1), its scope id plus one (:data:`SCOPE_BITS`),
#: its position (:data:`POSITION_BITS`); 63 in all, so a packed value is never negative.
SCOPE_BITS = 26
POSITION_BITS = 36


@dataclass
class Owners:
    """Operators of one trace that own a launch (positions ascending, distinct), each with its scope text id (into
    :attr:`~.op_attribution.ScopeTexts.texts`; -1 for none) and whether it runs as a recomputation."""

    rows: np.ndarray
    scope: np.ndarray
    recomputed: np.ndarray

    @classmethod
    def empty(cls) -> Owners:
        return cls(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool))

    @classmethod
    def joined(cls, pieces: list[Owners]) -> Owners:
        """The pieces' operators, one after the other."""
        if not pieces:
            return cls.empty()
        return cls(*(np.concatenate([getattr(piece, f.name) for piece in pieces]) for f in fields(cls)))

    def __len__(self) -> int:
        return len(self.rows)

    def take(self, chosen: np.ndarray | slice) -> Owners:
        """The operators ``chosen`` (a mask, indices or a slice)."""
        return Owners(self.rows[chosen], self.scope[chosen], self.recomputed[chosen])


def pack(position: np.ndarray, scope: np.ndarray, recomputed: np.ndarray) -> np.ndarray:
    """Each operator as one int64 that sorts by ``position``; ValueError where a position or a scope id does not
    fit (a trace of 2**36 host events, or of 2**26 distinct module paths and frames: terabytes of trace)."""
    position, scope = position.astype(np.int64), scope.astype(np.int64)
    if len(position) and (int(position.min()) < 0 or int(position.max()) >= 2**POSITION_BITS
                          or int(scope.min()) < -1 or int(scope.max()) >= 2**SCOPE_BITS - 1):
        raise ValueError(f"an operator's position or scope is beyond what the attribution keeps (positions under "
                         f"2**{POSITION_BITS}, scopes under 2**{SCOPE_BITS} - 1)")
    return (position << (SCOPE_BITS + 1)) | ((scope + 1) << 1) | recomputed.astype(np.int64)


def unpack(packed: np.ndarray) -> Owners:
    """The operators :func:`pack` made, as they are (order and repeats kept)."""
    packed = packed.astype(np.int64, copy=False)
    return Owners(packed >> (SCOPE_BITS + 1), ((packed >> 1) & (2**SCOPE_BITS - 1)) - 1, (packed & 1).astype(bool))


class OwnerLog:
    """One trace's operators that launched work, added as settled (:meth:`add`), then :meth:`chunks`. ``log``: where
    the packed operators wait (:class:`~.sorted_values.MemoryLog` when none is given)."""

    def __init__(self, log: ValueLog | None = None) -> None:
        self._log: ValueLog = log if log is not None else MemoryLog()

    def add(self, position: np.ndarray, scope: np.ndarray, recomputed: np.ndarray) -> None:
        if len(position):
            self._log.append(pack(position, scope, recomputed))

    def chunks(self, fixed: tuple[np.ndarray, np.ndarray] | None = None) -> Iterator[Owners]:
        """Every operator added, by position ascending, each once (the same operator always comes with the same scope
        and flag: the one that sorts first is kept), a chunk at a time. ``fixed``: positions (ascending, distinct,
        among those added) and the scope each takes instead of its own. Asked once."""
        positions, scopes = fixed if fixed is not None else (np.zeros(0, dtype=np.int64),) * 2
        last = -1  # the position of the last operator given: a repeat may open the next chunk
        for packed in self._log.sorted_chunks():
            owners = unpack(packed)
            first = np.ones(len(owners), dtype=bool)
            first[1:] = owners.rows[1:] != owners.rows[:-1]
            first &= owners.rows != last
            if not first.all():
                owners = owners.take(first)
            if not len(owners):
                continue
            last = int(owners.rows[-1])
            low, high = np.searchsorted(positions, [int(owners.rows[0]), last + 1])
            if high > low:
                at = np.searchsorted(owners.rows, positions[low:high])
                owners.scope[at] = scopes[low:high]
            yield owners


class OwnerCursor:
    """The chunks of :meth:`OwnerLog.chunks` taken by ranges of positions, lowest first (:meth:`below`)."""

    def __init__(self, chunks: Iterator[Owners]) -> None:
        self._chunks = chunks
        self._held = Owners.empty()

    def below(self, limit: int) -> Owners:
        """The operators not taken yet whose position is under ``limit``."""
        pieces = []
        while True:
            cut = int(np.searchsorted(self._held.rows, limit))
            if cut:
                pieces.append(self._held.take(slice(None, cut)))
            if cut < len(self._held):
                self._held = self._held.take(slice(cut, None))
                break
            following = next(self._chunks, None)
            if following is None:
                self._held = Owners.empty()
                break
            self._held = following
        return pieces[0] if len(pieces) == 1 else Owners.joined(pieces)
