"""A trace's launch calls by correlation id, in a Parquet file beside the trace's staged tables, read back a row group
at a time by the device ops' windows (docs/architecture.md, "Memory").

:class:`LaunchSink` takes the launch calls as the operators' attribution settles them (``analysis/op_attribution``)
and writes them sorted by correlation id, one per id, as the calls still to come allow: a call is written once no
call to come can have a lower id (the least id of the host events' row groups still to come, from their Parquet
statistics, and of the calls still waiting for a parent). CUDA numbers calls in launch order and ``host_ops`` holds
a trace's events in order of their ids, so the calls come nearly in order and few are held. :class:`LaunchTable`
answers a window's ids from the row groups their ids fall in (a window's launches are a narrow range of ids), a
few row groups kept at once. So neither holds anything per launch call of the trace.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from tracelake.analysis.launches import Launched, member
from tracelake.analysis.op_attribution import LaunchRows

from .keyed_groups import KeyedGroups

SCHEMA = pa.schema([("correlation", pa.int64()), ("launch_ns", pa.int64()), ("call_ns", pa.int64()),
                    ("graph", pa.bool_()), ("owner", pa.int64())])


class LaunchSink:
    """Launch calls into ``path``, sorted by correlation id, one per id: the first call by start, then the shorter,
    then the first in the trace (:func:`tracelake.analysis.launches.launch_call_rows`' rule), a graph launch where
    any call of the id is named like one."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.count = 0
        self._writer: pq.ParquetWriter | None = None
        self._held: list[LaunchRows] = []

    def add(self, rows: LaunchRows | None, floor: int | None) -> None:
        """Calls settled (None: none), and the least id a call still to come may have (None: unknown: all held)."""
        if rows is not None and len(rows.correlation):
            self._held.append(rows)
        if floor is not None and self._held:
            self._write(floor)

    def close(self) -> None:
        """Write every call held and close the file (an empty one where there was no call)."""
        if self._held:
            self._write(None)
        if self._writer is None:
            pq.write_table(SCHEMA.empty_table(), self.path)
        else:
            self._writer.close()

    def _write(self, floor: int | None) -> None:
        rows = LaunchRows.joined(self._held)
        self._held = []
        ids = rows.correlation
        ascending = bool((ids[1:] > ids[:-1]).all())  # the usual case: in order, one call an id
        order = np.arange(len(ids)) if ascending else np.lexsort((rows.position, rows.dur_ns, rows.ts_ns, ids))
        ids = rows.correlation[order]
        cut = len(ids) if floor is None else int(np.searchsorted(ids, floor, side="left"))
        if cut < len(ids):
            rest = order[cut:]
            self._held.append(rows.take(rest))
        if not cut:
            return
        order, ids = order[:cut], ids[:cut]
        first = np.flatnonzero(np.concatenate([[True], ids[1:] != ids[:-1]]))
        chosen = order[first]
        graph = np.maximum.reduceat(rows.graph[order], first) if len(first) else rows.graph[:0]
        table = pa.table([ids[first], rows.ts_ns[chosen].astype(np.int64), rows.dur_ns[chosen].astype(np.int64),
                          graph.astype(bool), rows.owner[chosen].astype(np.int64)], schema=SCHEMA)
        if self._writer is None:
            # read back once, soon, from the staging folder: no dictionary (ids and times are distinct), statistics
            # of the ids only (the row groups are found by them)
            self._writer = pq.ParquetWriter(self.path, SCHEMA, compression="lz4", use_dictionary=False,
                                            write_statistics=["correlation"])
        self._writer.write_table(table)
        self.count += table.num_rows


class LaunchTable:
    """A trace's launch calls as :class:`LaunchSink` wrote them, asked by correlation id (a
    :class:`~tracelake.analysis.launches.LaunchLookup`). ``shared``: the ids (sorted) that more than one kernel
    carries, graph launches whatever the call's name. Safe to ask from several threads (ranks computed at once)."""

    def __init__(self, path: Path, count: int, shared: np.ndarray) -> None:
        self._groups = KeyedGroups(path, "correlation", SCHEMA.names)
        self._count = count
        self._shared = shared

    def __len__(self) -> int:
        return self._count

    def find(self, correlation: pl.Series) -> Launched:
        n = len(correlation)
        values = correlation.fill_null(0).to_numpy().astype(np.int64)
        found = np.zeros(n, dtype=bool)
        launch_ns, call_ns = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
        graph, owner = np.zeros(n, dtype=bool), np.full(n, -1, dtype=np.int64)
        for group, rows in self._groups.matches(values, correlation.is_not_null().to_numpy()):
            ids, starts, durations, graphs, owners = self._groups.group(group)
            where = np.minimum(np.searchsorted(ids, values[rows]), len(ids) - 1)
            hit = ids[where] == values[rows]
            rows, where = rows[hit], where[hit]
            found[rows] = True
            launch_ns[rows], call_ns[rows] = starts[where], durations[where]
            graph[rows], owner[rows] = graphs[where], owners[where]
        graph |= found & member(values, self._shared)
        return Launched(found, launch_ns, call_ns, graph, owner)
