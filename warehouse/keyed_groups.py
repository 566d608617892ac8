"""A Parquet file in the staging area sorted by one integer column, read back a row group at a time.

The tables the operators' pass writes for the device ops' windows (the launch calls by correlation id,
:mod:`.launch_table`; the operator calls by position, :mod:`.call_table`) are asked a window at a time, and a
window's keys are a narrow range: :class:`KeyedGroups` finds the row groups the keys fall in from the groups'
statistics of the key column, and keeps a few groups read (docs/architecture.md, "Memory").
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

#: Row groups kept read at once.
CACHED_GROUPS = 4


class KeyedGroups:
    """``path``'s row groups by the values of its column ``key`` (ascending through the file), each read as numpy
    arrays of ``columns``, :data:`CACHED_GROUPS` kept. Safe to ask from several threads (ranks computed at once)."""

    def __init__(self, path: Path, key: str, columns: list[str]) -> None:
        self._file = pq.ParquetFile(path)
        self._columns = columns
        meta = self._file.metadata
        column = self._file.schema_arrow.get_field_index(key)
        groups = [meta.row_group(i) for i in range(meta.num_row_groups)]
        kept = [i for i, group in enumerate(groups) if group.num_rows]
        stats = [groups[i].column(column).statistics for i in kept]
        self._groups = np.array(kept, dtype=np.int64)
        self._lows = np.array([int(s.min) for s in stats], dtype=np.int64)
        self._highs = np.array([int(s.max) for s in stats], dtype=np.int64)
        #: The number of each kept group's first row in the file.
        self.firsts = np.cumsum([0] + [groups[i].num_rows for i in kept])[:-1].astype(np.int64)
        self._cache: OrderedDict[int, tuple[np.ndarray, ...]] = OrderedDict()
        self._lock = threading.Lock()

    def matches(self, values: np.ndarray, asked: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
        """Of ``values`` (those where ``asked`` holds), per kept group their range can fall in: the group (an
        index for :meth:`group` and :attr:`firsts`) and the indices into ``values`` of those in its range."""
        if not len(self._groups):
            return
        at = np.minimum(np.searchsorted(self._highs, values, side="left"), len(self._groups) - 1)
        inside = asked & (values >= self._lows[at]) & (values <= self._highs[at])
        for group in np.unique(at[inside]).tolist():
            yield group, np.flatnonzero(inside & (at == group))

    def group(self, index: int) -> tuple[np.ndarray, ...]:
        """The kept group ``index``'s columns."""
        with self._lock:
            cached = self._cache.get(index)
            if cached is not None:
                self._cache.move_to_end(index)
                return cached
            part = self._file.read_row_group(int(self._groups[index]), columns=self._columns)
            cached = tuple(part[name].to_numpy() for name in self._columns)
            self._cache[index] = cached
            if len(self._cache) > CACHED_GROUPS:
                self._cache.popitem(last=False)
            return cached
