"""The stats of a run of XSpace events by name, decoded in bulk as arrays (:class:`BatchStats`).

:meth:`.xspace.EventBatch.stats` makes one from the stat ranges :mod:`.xspace_events` located; the
values follow the rules of :meth:`.xspace.Plane.named_stats`, which decodes one event's stats at a time.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

import numpy as np

from .xspace_events import STAT_BYTES, STAT_DOUBLE, STAT_INT64, STAT_NONE, STAT_REF, STAT_STR, StatFields

if TYPE_CHECKING:
    from .xspace import EventBatch, Plane


#: Stat metadata ids below this are looked up in a table (:meth:`BatchStats._named`); a plane declaring a larger one
#: (not seen in XProf's files, whose ids count up from 1) is searched instead.
STAT_TABLE_LIMIT = 1 << 20


class BatchStats:
    """The stats of a run of events by name, as arrays: the bulk counterpart of :meth:`Plane.named_stats`.

    Same rules: per event the last stat of a name wins; stats whose metadata id the
    plane does not declare are left out, a reference to an undeclared id reads None
    (both counted by :meth:`count_unknown`, once the caller has used the run).
    """

    def __init__(self, plane: Plane, batch: EventBatch, fields: StatFields, events: int) -> None:
        self.plane = plane
        self.batch = batch
        self.fields = fields
        self.events = events
        self._ids: dict[str, list[int]] = {}
        for metadata_id, name in plane.stat_names.items():
            self._ids.setdefault(name, []).append(metadata_id)
        self._table: np.ndarray | None = None  # per stat metadata id, the index of its name in _ids (-1: none)
        self._names: np.ndarray | None = None  # per stat of the run, the index of its name (-1: undeclared)

    def _name_table(self) -> np.ndarray | None:
        """Per stat metadata id up to the largest the plane declares, the index of its name in ``_ids`` (-1: not
        declared); None where ids are too large for a table (:data:`STAT_TABLE_LIMIT`)."""
        if self._table is None:
            declared = list(self.plane.stat_names)
            if not declared or min(declared) < 0 or max(declared) >= STAT_TABLE_LIMIT:
                return None
            self._table = np.full(max(declared) + 1, -1, dtype=np.int32)
            for index, named in enumerate(self._ids.values()):
                self._table[named] = index
        return self._table

    def _name_indices(self, ids: np.ndarray, table: np.ndarray) -> np.ndarray:
        """Each id's name index in ``table`` (:meth:`_name_table`), -1 for an id it does not declare."""
        inside = (ids >= 0) & (ids < len(table))
        return np.where(inside, table[np.where(inside, ids, 0)], -1)

    def _declared(self, ids: np.ndarray) -> np.ndarray:
        """Whether the plane declares each stat metadata id."""
        table = self._name_table()
        if table is None:
            return np.isin(ids, np.array(list(self.plane.stat_names), dtype=np.int64))
        return self._name_indices(ids, table) >= 0

    def _named(self, name: str) -> np.ndarray:
        """Whether each stat (in :attr:`fields`) is called ``name``.

        Stat metadata ids are small numbers (1 up to the plane's count of names): each stat's name is looked up once
        per run in a table of them, then a name is one comparison, not a search of the ids per name. Ids no table
        suits: ``np.isin``.
        """
        ids = self._ids.get(name, [])
        mid = self.fields.metadata_id
        table = self._name_table()
        if table is None:
            return np.isin(mid, np.array(ids, dtype=np.int64))
        if self._names is None:
            self._names = self._name_indices(mid, table)
        if not ids:
            return np.zeros(len(mid), dtype=bool)
        return self._names == list(self._ids).index(name)

    def last(self, name: str) -> np.ndarray:
        """Per event, the index (in :attr:`fields`) of its last stat called ``name``; -1 where it has none."""
        out = np.full(self.events, -1, dtype=np.int64)
        ids = self._ids.get(name)
        if not ids or not len(self.fields.metadata_id):
            return out
        sel = np.flatnonzero(self._named(name))
        if len(sel):
            event = self.fields.event[sel]
            last = np.r_[event[1:] != event[:-1], True]  # stats are in file order, so grouped by event
            out[event[last]] = sel[last]
        return out

    def values(self, stats: np.ndarray) -> tuple[list[object], np.ndarray]:
        """The distinct values of ``stats`` (indices in :attr:`fields`, -1: none) as :func:`.xspace.stat_value`
        gives them, and each one's index among them (-1 for -1).

        Raises:
            UnicodeDecodeError: a string value that is not UTF-8 (protobuf rejects the whole line then).
        """
        codes = np.full(len(stats), -1, dtype=np.int64)
        have = np.flatnonzero(stats >= 0)
        kind = self.fields.kind[stats[have]]
        textual = (kind == STAT_STR) | (kind == STAT_BYTES)
        numeric = have[~textual]
        objects: list[object] = []
        if len(numeric):  # in (kind, value) order: a kind at a time (sorting pairs as rows is ~10x slower)
            chosen = stats[numeric]
            kinds, values = self.fields.kind[chosen], self.fields.value[chosen]
            for k in np.unique(kinds).tolist():
                mine = np.flatnonzero(kinds == k)
                distinct, inverse = np.unique(values[mine], return_inverse=True)
                codes[numeric[mine]] = inverse.reshape(-1) + len(objects)
                objects.extend(self._number(int(k), v) for v in distinct.tolist())
        seen: dict[tuple[int, bytes], int] = {}
        data = self.batch.data
        for i in have[textual].tolist():
            stat = int(stats[i])
            k = int(self.fields.kind[stat])
            raw = data[self.fields.start[stat]: self.fields.end[stat]].tobytes()
            code = seen.get((k, raw))
            if code is None:
                code = seen[(k, raw)] = len(objects)
                objects.append(raw.decode("utf-8") if k == STAT_STR else raw)
            codes[i] = code
        return objects, codes

    def _number(self, kind: int, value: int) -> object:
        if kind == STAT_NONE:
            return None
        if kind == STAT_DOUBLE:
            return struct.unpack("<d", value.to_bytes(8, "little"))[0]
        if kind == STAT_INT64:
            return value - (1 << 64) if value >= 1 << 63 else value
        if kind == STAT_REF:
            return self.plane.stat_names.get(value)
        return value  # STAT_UINT64

    def check_strings(self) -> None:
        """Raise if a string value is not UTF-8, as protobuf, which rejects the whole line then, does.

        Raises:
            UnicodeDecodeError: the first such string.
        """
        strings = np.flatnonzero(self.fields.kind == STAT_STR)
        if not len(strings):
            return
        data = self.batch.data
        high = np.flatnonzero(data >= 0x80)  # ASCII is UTF-8: only strings with high bytes need a look
        start, end = self.fields.start[strings], self.fields.end[strings]
        for i in np.flatnonzero(np.searchsorted(high, start) < np.searchsorted(high, end)).tolist():
            data[start[i]: end[i]].tobytes().decode("utf-8")

    def count_unknown(self) -> None:
        """Count the stats of undeclared metadata ids, and the references to undeclared ids, in the plane."""
        mid = self.fields.metadata_id
        if not len(mid):
            return
        declared = self._declared(mid)
        for metadata_id, n in zip(*np.unique(mid[~declared], return_counts=True), strict=True):
            self.plane._unknown(int(metadata_id), int(n))
        refs = self.fields.value[declared & (self.fields.kind == STAT_REF)]
        refs = refs[~self._declared(refs)]  # only the references to undeclared ids are counted: few, if any
        for ref, n in zip(*np.unique(refs, return_counts=True), strict=True):
            self.plane._unknown(int(ref), int(n))
