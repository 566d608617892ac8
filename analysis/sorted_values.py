"""Integers kept for an exact figure over all of them (a quantile, the deepest queue), read back sorted a chunk at a
time, so that what is computed from them needs a chunk of memory, not all of them (docs/architecture.md, "Memory").

A :class:`ValueLog` takes integers in any order and gives them back once, ascending, in chunks. :class:`MemoryLog`
holds them (4 bytes each where they fit in int32); ``warehouse/spill_log.SpillLog`` writes them to disk in sorted
runs and merges the runs as they are read. :func:`sorted_quantiles` and :func:`deepest_queue` work on the chunks as
they come; :func:`repeated` finds the values that repeat.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Protocol

import numpy as np

from .event_index import narrow
from .quantiles import between, cont_ranks

#: The length of the chunks :class:`MemoryLog` gives its values back in (views of one sorted array): the
#: temporaries of :func:`deepest_queue` are this long, not the stream's.
CHUNK = 1 << 16


class ValueLog(Protocol):
    """Integers appended in any order, given back once in ascending order, a chunk at a time."""

    def __len__(self) -> int:
        """How many values were appended."""

    def append(self, values: np.ndarray) -> None:
        """Add ``values`` (integers)."""

    def sorted_chunks(self) -> Iterator[np.ndarray]:
        """Every value appended, ascending, as int64 chunks (each sorted, each chunk's first value at least the last
        one's before it). Asked once: the log lets its values go as they are given."""


#: Makes an empty log: :class:`LaunchParts <tracelake.analysis.launches.LaunchParts>` takes one to keep its values
#: in memory or on disk.
LogFactory = Callable[[], ValueLog]


class MemoryLog:
    """A :class:`ValueLog` in memory: each piece as int32 where its values fit, int64 elsewhere."""

    def __init__(self) -> None:
        self._pieces: list[np.ndarray] = []
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def append(self, values: np.ndarray) -> None:
        if len(values):
            self._pieces.append(narrow(np.asarray(values)))
            self._count += len(values)

    def sorted_chunks(self) -> Iterator[np.ndarray]:
        values = np.concatenate(self._pieces, dtype=np.int64) if self._pieces else np.empty(0, dtype=np.int64)
        self._pieces = []
        values.sort()
        for first in range(0, len(values), CHUNK):
            yield values[first:first + CHUNK]


def sorted_quantiles(chunks: Iterable[np.ndarray], count: int, qs: Sequence[float]) -> list[float]:
    """DuckDB's ``quantile_cont`` (:mod:`.quantiles`' arithmetic) of ``count`` values (at least one) given ascending in
    ``chunks``, for each quantile in ``qs``."""
    ranks = sorted({rank for q in qs for rank in cont_ranks(count, q)[:2]})
    found: dict[int, float] = {}
    offset = 0
    for chunk in chunks:
        for rank in ranks:
            if offset <= rank < offset + len(chunk):
                found[rank] = float(chunk[rank - offset])
        offset += len(chunk)
    if offset != count:
        raise ValueError(f"the chunks held {offset} values where {count} were counted")
    return [between(found[low], found[high], count, q) for q in qs for low, high, _ in [cont_ranks(count, q)]]


def repeated(chunks: Iterable[np.ndarray]) -> np.ndarray:
    """The values that occur more than once among those given ascending in ``chunks`` (:meth:`ValueLog.sorted_chunks`),
    each once, ascending (int64). A chunk and the last value before it are held at a time."""
    found: list[np.ndarray] = []
    last: int | None = None
    for chunk in chunks:
        if not len(chunk):
            continue
        chunk = np.asarray(chunk, dtype=np.int64)
        again = chunk[1:][chunk[1:] == chunk[:-1]]
        if last is not None and int(chunk[0]) == last:
            again = np.concatenate([chunk[:1], again])
        if len(again):
            # a value repeated more than twice shows more than once here, and may also end the chunk before
            again = again[np.concatenate([[True], again[1:] != again[:-1]])]
            if found and int(found[-1][-1]) == int(again[0]):
                again = again[1:]
            if len(again):
                found.append(again)
        last = int(chunk[-1])
    return np.concatenate(found) if found else np.empty(0, dtype=np.int64)


def deepest_queue(launches: Iterable[np.ndarray], ends: Iterable[np.ndarray]) -> int:
    """The deepest queue: the most ops launched by some time and not yet ended at it (an op launched and ended at
    the same time never counts), from each op's launch and end, each given ascending in chunks
    (:meth:`ValueLog.sorted_chunks`), one chunk of either held at a time.

    The depth only grows at launches, so its maximum is at one: there it is the launches up to then minus the ends
    up to then, changes at the same time all counted. Launches at one time split over two chunks are undercounted at
    the first chunk's and counted whole at the second's, so the maximum is exact. An end chunk answers the launches
    below its last value only: ends equal to a launch time may go on into the next chunk.
    """
    deepest = launched = ended_before = 0
    end_chunks = (chunk for chunk in ends if len(chunk))
    end = next(end_chunks, None)
    for at in launches:
        if not len(at):
            continue
        up_to = launched + np.searchsorted(at, at, side="right")
        ended = np.empty(len(at), dtype=np.int64)
        first = 0
        while first < len(at):
            if end is None:  # every end counted already
                ended[first:] = ended_before
                break
            last = first + int(np.searchsorted(at[first:], end[-1], side="left"))  # the launches below its last end
            ended[first:last] = ended_before + np.searchsorted(end, at[first:last], side="right")
            first = last
            if first < len(at):  # launches at or past this chunk's last end: the next chunk answers them
                ended_before += len(end)
                end = next(end_chunks, None)
        deepest = max(deepest, int((up_to - ended).max()))
        launched += len(at)
    return deepest
