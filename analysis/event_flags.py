"""What the operator attribution asks of every host event, in one byte each (:class:`EventFlags`).

docs/analyses.md, "Operators": walking up from a launch call, the attribution looks for the nearest
``cpu_op`` (a counted one first: :func:`.flops.counted`), the module and frame events of its scope
(:func:`.op_scope.scope_kind`) and the checkpoint markers and backward nodes of recomputation
(:func:`.recompute.recompute_kind`). A trace holds millions of host events, and these four as arrays of their
own took 4 bytes each (28 MB at 4 GB of Kineto trace, 7M host events); packed they take one, and each is
unpacked as it is asked for. Pure: numpy in, arrays out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_OP, _COUNTED = np.uint8(1), np.uint8(2)
_KIND_SHIFT, _RECOMPUTE_SHIFT, _TWO_BITS = np.uint8(2), np.uint8(4), np.uint8(3)


@dataclass(frozen=True, eq=False)  # an array: compare :attr:`bits`
class EventFlags:
    """Per host event, in the bits of a byte: a ``cpu_op`` (bit 0), a counted one (bit 1), its scope kind (bits 2-3)
    and its recompute kind (bits 4-5)."""

    bits: np.ndarray

    @classmethod
    def pack(cls, is_op: np.ndarray, is_counted: np.ndarray, kind: np.ndarray, recompute: np.ndarray) -> EventFlags:
        """From four arrays, one element per event: ``is_counted`` counts only where ``is_op`` holds; ``kind`` and
        ``recompute`` take values 0-3 (:data:`.op_scope.NONE`... and :func:`.recompute.recompute_kind`'s)."""
        for name, values in (("kind", kind), ("recompute", recompute)):
            if len(values) and (int(values.min()) < 0 or int(values.max()) > 3):
                raise ValueError(f"{name} takes values 0-3, not {int(values.min())}-{int(values.max())}")
        bits = np.asarray(is_op, dtype=bool).astype(np.uint8)
        bits |= (np.asarray(is_op, dtype=bool) & np.asarray(is_counted, dtype=bool)).view(np.uint8) * _COUNTED
        bits |= np.asarray(kind).astype(np.uint8) << _KIND_SHIFT
        bits |= np.asarray(recompute).astype(np.uint8) << _RECOMPUTE_SHIFT
        return cls(bits)

    def __len__(self) -> int:
        return len(self.bits)

    def is_op(self) -> np.ndarray:
        """Whether each event is a ``cpu_op`` (bool)."""
        return (self.bits & _OP).view(bool)

    def counted_op(self) -> np.ndarray:
        """Whether each event is a ``cpu_op`` with a cost estimate (bool)."""
        found = self.bits >> np.uint8(1)
        found &= _OP
        return found.view(bool)

    def kind(self) -> np.ndarray:
        """Each event's scope kind (int8)."""
        found = self.bits >> _KIND_SHIFT
        found &= _TWO_BITS
        return found.view(np.int8)

    def recompute(self) -> np.ndarray:
        """Each event's recompute kind (int8)."""
        found = self.bits >> _RECOMPUTE_SHIFT
        found &= _TWO_BITS
        return found.view(np.int8)
