"""A trace's operator calls that launched work, by position, in a Parquet file beside the trace's staged tables.

The operators' pass (:mod:`.derived_operators`) names the calls a row group of ``host_ops`` at a time, in the order
of their positions, and :class:`CallSink` writes each call's position, its key (its number among the distinct calls
as :class:`~.derived_names.CallNames` met them), its host time and its recompute flag as they come. The device ops'
windows ask the calls by position (:class:`CallTable`, a :class:`~tracelake.analysis.op_calls.CallLookup`), from the
row groups the positions fall in: a window's operators are a narrow range of positions, so nothing per call of the
trace is held (docs/architecture.md, "Memory").
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tracelake.analysis.op_calls import CallRows, found_in

from .keyed_groups import KeyedGroups

SCHEMA = pa.schema([("position", pa.int64()), ("key", pa.int32()), ("host_ns", pa.int64()),
                    ("recomputed", pa.bool_())])
#: Calls a row group holds.
GROUP_ROWS = 16_384


class CallSink:
    """Calls into ``path``, fed in the order of their positions (:meth:`add`), in row groups of :data:`GROUP_ROWS`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.count = 0
        self._held: list[tuple[np.ndarray, ...]] = []
        self._rows = 0
        self._last = -1
        # read back once, soon, from the staging folder: statistics of the positions only (the groups are found by
        # them)
        self._writer = pq.ParquetWriter(path, SCHEMA, compression="lz4", use_dictionary=False,
                                        write_statistics=["position"])

    def add(self, position: np.ndarray, key: np.ndarray, host_ns: np.ndarray, recomputed: np.ndarray) -> None:
        """The next calls (positions ascending, above every call's before them)."""
        if not len(position):
            return
        if int(position[0]) <= self._last or not bool((position[1:] > position[:-1]).all()):
            raise ValueError("operator calls must come in the order of their positions, each once")
        self._last = int(position[-1])
        self._held.append((position, key, host_ns, recomputed))
        self._rows += len(position)
        if self._rows >= GROUP_ROWS:
            self._write(final=False)

    def close(self) -> None:
        """Write the calls held and close the file."""
        self._write(final=True)
        self._writer.close()

    def _write(self, *, final: bool) -> None:
        if not self._held:
            return
        columns = [np.concatenate([piece[i] for piece in self._held]) for i in range(len(SCHEMA))]
        whole = len(columns[0]) if final else len(columns[0]) // GROUP_ROWS * GROUP_ROWS
        table = pa.table([pa.array(column[:whole], type=field.type) for column, field in zip(columns, SCHEMA)],
                         schema=SCHEMA)
        self._writer.write_table(table, row_group_size=GROUP_ROWS)
        self.count += whole
        rest = tuple(column[whole:] for column in columns)
        self._held = [rest] if len(rest[0]) else []
        self._rows = len(rest[0])


class CallTable:
    """A trace's calls as :class:`CallSink` wrote them, asked by position (a
    :class:`~tracelake.analysis.op_calls.CallLookup`); ``rank``: each key's row of the operators' kinds."""

    def __init__(self, path: Path, count: int, rank: np.ndarray) -> None:
        self._groups = KeyedGroups(path, "position", SCHEMA.names)
        self._count = count
        self._rank = rank

    def __len__(self) -> int:
        return self._count

    def find(self, owner: np.ndarray) -> CallRows:
        owner = owner.astype(np.int64, copy=False)
        found = CallRows.none(len(owner))
        for group, rows in self._groups.matches(owner, owner >= 0):
            position, key, host_ns, recomputed = self._groups.group(group)
            here = found_in(position, owner[rows], key, host_ns, recomputed, int(self._groups.firsts[group]))
            hit = here.index >= 0
            rows = rows[hit]
            found.index[rows] = here.index[hit]
            found.key[rows] = self._rank[here.key[hit]]
            found.host_ns[rows] = here.host_ns[hit]
            found.recomputed[rows] = here.recomputed[hit]
        return found
