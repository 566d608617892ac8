"""Where an event id is among a trace's events: the position of each event's parent, from the parents' ids.

A trace's host events name their parent by ``event_id`` (docs/analyses.md, "Operators"); the analyses walk parent
chains by position. :class:`EventIndex` answers an id's position (the first, where an id repeats) for any ids:

- **Dense ids** (their span at most :data:`DENSE_SPAN` times their number): a bit per id in the span and a count of
  the bits before each 64 (int32 below 2**31 ids), about 0.19 bytes per id of the span, so an id's rank among the
  distinct ids is a count of bits. At 4 GB of Kineto trace (7M host events, ids spanning 12M) that is 1.7 MB, where
  a table of positions over the span took 49 MB. Parsers number events densely; a trace's launch calls' correlation
  ids are some 15 apart (CUDA numbers every runtime call, recorded or not): as bits, 2.8 bytes per call.
- **Sparse ids**: the distinct ids, sorted, as offsets from the lowest (4 bytes each where they span less than 2**32,
  else 8), and an id found by bisection. Ids that ascend strictly are sorted and distinct already: they are not
  sorted again (at 4 GB of Kineto trace, sorting the 1.3M launch calls' correlation ids held five more arrays as
  long, 52 MB, at the stored analyses' peak).

Where the ids ascend strictly (``host_ops`` stores a trace's events in order of ``event_id``), an id's rank is its
position; otherwise the index also keeps the first position of each distinct id (4 bytes each). The index is asked a
piece at a time, and built a piece at a time (:class:`Builder`): given the ids' number and span first (a Parquet
file's row-group statistics tell them), dense ids are set as bits as each piece (a row group's) comes, and no piece
is held; ids that do not ascend are given twice, the second time for their first positions. A caller need not hold
every event's id, nor every parent's, at once: at 8 GB of Kineto trace (14M host events) the pieces were 56 MB.
Pure: numpy in, positions out.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: Ids span at most this many times their number (plus :data:`DENSE_SLACK`) to be kept as bits: there, the bits and
#: their counts (0.19 bytes per id of the span) take no more than sparse ids' offsets (4 bytes per id).
DENSE_SPAN = 16
DENSE_SLACK = 1024
#: Ids asked at once: the lookups' temporaries are this long, whatever the number asked.
CHUNK = 1 << 20


class _Bits:
    """Dense ids: a bit per id from ``low`` on, and how many bits are set before each 64 (``counts``: its type)."""

    def __init__(self, words: np.ndarray, low: int, counts: type[np.signedinteger]) -> None:
        self.words, self.low = words, low
        self.before = np.zeros(len(words), dtype=counts)
        np.cumsum(np.bitwise_count(words[:-1]), out=self.before[1:])

    def rank(self, wanted: np.ndarray, inside: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        offset = np.where(inside, wanted - self.low, 0).astype(np.uint64)
        at, bit = offset >> np.uint64(6), offset & np.uint64(63)
        word = self.words[at]
        present = inside & (((word >> bit) & np.uint64(1)) == 1)
        return self.before[at] + np.bitwise_count(word & ((np.uint64(1) << bit) - np.uint64(1))), present


class _Keys:
    """Sparse ids: the distinct ids, sorted, as offsets from ``low`` (uint32 where they fit)."""

    def __init__(self, keys: np.ndarray, low: int) -> None:
        self.low = low
        kind = np.uint32 if int(keys[-1]) - low < 2**32 else np.int64
        # the offsets made straight in their type: no int64 array of them first
        self.keys = np.subtract(keys, low, out=np.empty(len(keys), dtype=kind), casting="unsafe")

    def rank(self, wanted: np.ndarray, inside: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        offset = np.where(inside, wanted - self.low, 0).astype(self.keys.dtype)  # no cast of the keys per lookup
        at = np.minimum(np.searchsorted(self.keys, offset), len(self.keys) - 1)
        return at, inside & (self.keys[at] == offset)


class EventIndex:
    """The positions of a trace's event ids (:func:`build`): ``size`` events, ids from ``low`` to ``high``, their
    ranks among the distinct ids (``ranks``) and, where the ids do not ascend strictly, the first position of each
    distinct id by rank (``first``; None: the rank is the position)."""

    def __init__(self, size: int, low: int, high: int, ranks: _Bits | _Keys | None,
                 first: np.ndarray | None = None) -> None:
        self.size, self._low, self._high = size, low, high
        self._ranks, self._first = ranks, first
        self._kind = position_type(size)

    @property
    def nbytes(self) -> int:
        """The bytes the index holds."""
        held = [*vars(self._ranks).values(), self._first] if self._ranks is not None else []
        return sum(part.nbytes for part in held if isinstance(part, np.ndarray))

    def positions(self, wanted: np.ndarray, chunk: int = CHUNK) -> np.ndarray:
        """The position of each id in ``wanted`` (-1: not an id of the trace), as int32 below 2**31 events."""
        found = np.empty(len(wanted), dtype=self._kind)
        for start in range(0, len(wanted), chunk):
            found[start:start + chunk] = self._positions(np.asarray(wanted[start:start + chunk], dtype=np.int64))
        return found

    def _positions(self, wanted: np.ndarray) -> np.ndarray:
        if self._ranks is None:
            return np.full(len(wanted), -1, dtype=self._kind)
        rank, present = self._ranks.rank(wanted, (wanted >= self._low) & (wanted <= self._high))
        if self._first is not None:
            rank = self._first[np.where(present, rank, 0)]
        return np.where(present, rank, -1).astype(self._kind)


def build(pieces: Sequence[np.ndarray]) -> EventIndex:
    """The index of the ids in ``pieces`` (integer arrays, in the trace's order; position = order across them)."""
    pieces = [np.asarray(piece) for piece in pieces if len(piece)]
    size = sum(len(piece) for piece in pieces)
    if not size:
        return EventIndex(0, 0, -1, None)
    builder = Builder(size, min(int(piece.min()) for piece in pieces), max(int(piece.max()) for piece in pieces))
    for piece in pieces:
        builder.add(piece)
    if builder.again:
        for piece in pieces:
            builder.add_again(piece)
    return builder.index()


class Builder:
    """An :class:`EventIndex` built a piece at a time, given the ids' number (``size``) and span (``low`` to
    ``high``) first: the pieces (in the trace's order; position = order across them) go to :meth:`add`, then, where
    :attr:`again` says so, the same pieces once more to :meth:`add_again`, then :meth:`index`.

    Dense ids are set as bits as each piece comes, and no piece is held; where they do not ascend strictly, the
    second pass finds each distinct id's first position. Sparse ids are held (their index keeps each anyway). A piece
    that breaks what was given (an id outside the span, more or fewer ids than ``size``) is a bug: ValueError.
    """

    def __init__(self, size: int, low: int, high: int) -> None:
        self.size, self.low, self.high = size, low, high
        self._dense = size > 0 and high - low < DENSE_SPAN * size + DENSE_SLACK
        self._bits = np.zeros(((high - low) // 64 + 1) * 8 if self._dense else 0, dtype=np.uint8)
        self._held: list[np.ndarray] = []  # sparse ids' pieces
        self._ascending, self._seen = True, 0
        self._last: int | None = None
        self._ranks: _Bits | None = None
        self._first: np.ndarray | None = None

    @property
    def again(self) -> bool:
        """Whether the pieces must be given once more (:meth:`add_again`): dense ids that do not ascend."""
        return self._dense and not self._ascending

    def add(self, piece: np.ndarray) -> None:
        """The next piece of ids."""
        piece = np.asarray(piece)
        if not len(piece):
            return
        if self._ranks is not None:
            raise ValueError("a piece after the second pass began")
        if int(piece.min()) < self.low or int(piece.max()) > self.high or self._seen + len(piece) > self.size:
            raise ValueError(f"ids outside those given: {self.size} from {self.low} to {self.high}")
        self._seen += len(piece)
        self._ascending = self._ascending and bool(np.all(piece[1:] > piece[:-1])) and (
            self._last is None or int(piece[0]) > self._last)
        self._last = int(piece[-1])
        if not self._dense:
            self._held.append(piece)
            return
        for at in range(0, len(piece), CHUNK):
            _set_bits(self._bits, piece[at:at + CHUNK].astype(np.int64) - self.low)

    def add_again(self, piece: np.ndarray) -> None:
        """The next piece of ids, in the second pass (:attr:`again`): each distinct id's first position kept."""
        piece = np.asarray(piece, dtype=np.int64)
        ranks = self._settled_ranks()
        if self._first is None:
            self._first = np.full(int(ranks.before[-1] + np.bitwise_count(ranks.words[-1])), -1,
                                  dtype=position_type(self.size))
            self._seen = 0
        rank, _ = ranks.rank(piece, np.ones(len(piece), dtype=bool))
        new = self._first[rank] < 0
        # a repeated id's first position in the piece: written last to first, so the first wins
        self._first[rank[new][::-1]] = np.arange(self._seen, self._seen + len(piece))[new][::-1]
        self._seen += len(piece)

    def index(self) -> EventIndex:
        """The index, once every piece is in (twice, where :attr:`again`)."""
        if self._seen != self.size or (self.again and self._first is None):
            raise ValueError(f"{self._seen} ids given of {self.size}")
        if not self.size:
            return EventIndex(0, 0, -1, None)
        if self._dense:
            return EventIndex(self.size, self.low, self.high, self._settled_ranks(), self._first)
        pieces, self._held = self._held, []
        if self._ascending:  # distinct and sorted already (the launch calls' correlation ids): no sort
            whole = pieces[0] if len(pieces) == 1 else np.concatenate(pieces, dtype=np.int64)
            return EventIndex(self.size, self.low, self.high, _Keys(whole.astype(np.int64, copy=False), self.low))
        keys, first = np.unique(np.concatenate(pieces, dtype=np.int64), return_index=True)
        return EventIndex(self.size, self.low, self.high, _Keys(keys, self.low), first.astype(position_type(self.size)))

    def _settled_ranks(self) -> _Bits:
        if self._ranks is None:
            # little-endian words: bit i of word w is the byte order the bits were set in
            self._ranks = _Bits(self._bits.view("<u8"), self.low, position_type(self.size))
        return self._ranks


def _set_bits(bits: np.ndarray, offset: np.ndarray) -> None:
    """Set the bits ``offset`` (bit i of byte i // 8, little-endian) of ``bits``: the ids of a piece as bits over the
    piece's own span, OR-ed in, where that span is at most 8 times their number (no array spans the whole, nor 8 bytes
    per id more than the offsets); else each bit OR-ed in at its byte (3x slower: sparser pieces only)."""
    start = int(offset.min()) // 8 * 8
    span = int(offset.max()) - start + 1
    if span <= 8 * len(offset):
        mine = np.zeros(span, dtype=bool)
        mine[offset - start] = True
        packed = np.packbits(mine, bitorder="little")
        bits[start // 8:start // 8 + len(packed)] |= packed
    else:
        np.bitwise_or.at(bits, offset >> 3, np.left_shift(1, offset & 7).astype(np.uint8))


def narrow(values: np.ndarray) -> np.ndarray:
    """Integers as int32 where they all fit (a trace's event ids, a duration or a wait in ns: under 2.1 s), else as
    they are: arrays kept for every host event, launch call or launched op take half the memory."""
    if len(values) and -2**31 <= int(values.min()) and int(values.max()) < 2**31:
        return values.astype(np.int32, copy=False)
    return values


def position_type(size: int) -> type[np.signedinteger]:
    """The integer type of a position among ``size`` events: int32 below 2**31."""
    return np.int32 if size < 2**31 else np.int64


def parent_rows(ids: np.ndarray, parent_ids: np.ndarray) -> np.ndarray:
    """The position of each event's parent (-1 for none or one not among ``ids``), the first event of an id that
    repeats: int32 below 2**31 events."""
    return build([ids]).positions(parent_ids)
