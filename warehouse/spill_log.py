"""A :class:`~tracelake.analysis.sorted_values.ValueLog` on disk: what the stored analyses keep per launched op (its
launch delay, its launch and end on its stream) written to a file in the staging area, so that it does not grow the
ingest's memory with the trace (docs/architecture.md, "Memory").

Values are held until :data:`RUN` of them have come, then sorted and written as a *run* of raw int64. Read back, the
runs are merged a block of each at a time: every value up to the least of the blocks' last values is given (no value
still unread can be below it), and a block used up is refilled. So memory holds a run while appending and
:data:`MERGE_BUDGET` bytes of blocks while merging, whatever the count.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

#: Values sorted in memory and written as one run (1 MiB of int64).
RUN = 1 << 17
#: Bytes of the runs' blocks held at once while merging; a block never below :data:`MIN_BLOCK` values.
MERGE_BUDGET = 1 << 20
MIN_BLOCK = 1 << 12

_ITEM = np.dtype("<i8")


class SpillLog:
    """Integers appended in any order into ``path`` (created here, removed once read back), given back once
    ascending (:meth:`sorted_chunks`)."""

    def __init__(self, path: Path, run: int = RUN, budget: int = MERGE_BUDGET, min_block: int = MIN_BLOCK) -> None:
        self._path = path
        self._run, self._budget, self._min_block = run, budget, min_block
        self._held: list[np.ndarray] = []
        self._held_count = 0
        self._runs: list[tuple[int, int]] = []  # (first value's position in the file, count)
        self._written = 0

    def __len__(self) -> int:
        return self._written + self._held_count

    def append(self, values: np.ndarray) -> None:
        if not len(values):
            return
        self._held.append(np.asarray(values, dtype=np.int64))
        self._held_count += len(values)
        if self._held_count >= self._run:
            self._write_run()

    def sorted_chunks(self) -> Iterator[np.ndarray]:
        if not self._runs:  # all in memory still: no file
            values = np.sort(np.concatenate(self._held)) if self._held else np.empty(0, dtype=np.int64)
            self._held, self._held_count = [], 0
            if len(values):
                yield values
            return
        self._write_run()
        try:
            yield from self._merged()
        finally:
            self._path.unlink(missing_ok=True)

    def _write_run(self) -> None:
        if not self._held:
            return
        run = np.sort(np.concatenate(self._held)).astype(_ITEM, copy=False)
        self._held, self._held_count = [], 0
        with open(self._path, "ab") as out:
            out.write(run.tobytes())
        self._runs.append((self._written, len(run)))
        self._written += len(run)

    def _merged(self) -> Iterator[np.ndarray]:
        block = max(self._min_block, self._budget // (_ITEM.itemsize * len(self._runs)))
        fd = os.open(self._path, os.O_RDONLY)
        try:
            readers = [_RunReader(fd, self._path, first, count, block) for first, count in self._runs]
            blocks = [reader.next() for reader in readers]
            while True:
                live = [i for i, values in enumerate(blocks) if len(values)]
                if not live:
                    return
                # every value up to the least last value of the blocks: all that is still unread is at least that
                bound = min(blocks[i][-1] for i in live)
                taken = []
                for i in live:
                    cut = int(np.searchsorted(blocks[i], bound, side="right"))
                    taken.append(blocks[i][:cut])
                    blocks[i] = blocks[i][cut:]
                    if not len(blocks[i]):
                        blocks[i] = readers[i].next()
                yield np.sort(np.concatenate(taken)) if len(taken) > 1 else taken[0]
        finally:
            os.close(fd)


class _RunReader:
    """One run of a :class:`SpillLog`'s file, read a block at a time."""

    def __init__(self, fd: int, path: Path, first: int, count: int, block: int) -> None:
        self._fd, self._path, self._at, self._end, self._block = fd, path, first, first + count, block

    def next(self) -> np.ndarray:
        """The next block (empty at the run's end)."""
        count = min(self._block, self._end - self._at)
        if count <= 0:
            return np.empty(0, dtype=np.int64)
        data = os.pread(self._fd, count * _ITEM.itemsize, self._at * _ITEM.itemsize)
        if len(data) != count * _ITEM.itemsize:
            raise OSError(f"{self._path}: a spilled run ended early ({len(data)} bytes of {count * _ITEM.itemsize})")
        self._at += count
        return np.frombuffer(data, dtype=_ITEM).astype(np.int64)
