"""The names of a trace's operator calls that launched work, keyed a row group at a time (``derived_operators``).

Each call's key is its row of the distinct (name, input_dims, input_types, concrete_inputs, module) of the calls
(:data:`~tracelake.analysis.op_stats.GROUP_COLUMNS`, :meth:`~tracelake.analysis.op_stats.Operators.set_keyed`).
The values come as each row group's dictionary codes: a value's number is its place among every dictionary met so
far (each new value numbered as its dictionary lists it, as Arrow's ``unify_dictionaries`` would), so no string is
made per call: :meth:`CallNames.add` gives each group's calls their keys (their numbers among the distinct rows as
met), which the caller writes away (``call_table.CallSink``), and nothing is kept per call. The distinct rows are
ordered by those numbers (a null last) and by the module's text (sorted, none last): the order the calls' codes
sort in; :meth:`CallNames.ranked` gives each key its row in that order (docs/architecture.md, "Memory").
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from tracelake.analysis.event_index import narrow
from tracelake.analysis.op_stats import GROUP_COLUMNS, KEY_COLUMNS

from .derived_inputs import ints as _ints


class CallNames:
    """One trace's calls, fed in the order of their positions (:meth:`add`), then :meth:`ranked`. ``texts``: the
    scopes' texts (``ScopeTexts.texts``) that the calls' scope ids point at."""

    def __init__(self, texts: list[str | None]) -> None:
        self._numbers: dict[str, dict[str, int]] = {column: {} for column in KEY_COLUMNS}
        first: dict[str, int] = {}
        # each scope id's text, numbered by its first id (-1: none): ids of one text key alike
        self._texts = texts
        self._canonical = np.array([first.setdefault(t, i) if t is not None else -1 for i, t in enumerate(texts)]
                                   + [-1], dtype=np.int64)
        self._rows: dict[tuple[int, ...], int] = {}

    def add(self, calls: pa.Table, scope: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The next calls: ``calls`` (``dur_ns`` and the :data:`KEY_COLUMNS` it has, as dictionaries or not) and
        each one's scope id (-1: none); returns each call's key and host time."""
        count = calls.num_rows
        numbers = np.full((count, len(GROUP_COLUMNS)), -1, dtype=np.int64)
        for i, column in enumerate(KEY_COLUMNS):
            if column not in calls.column_names:
                continue
            known = self._numbers[column]
            at = 0
            for chunk in calls[column].chunks:
                if not pa.types.is_dictionary(chunk.type):
                    chunk = pc.dictionary_encode(chunk)
                words = chunk.dictionary.to_pylist()
                mapped = np.array([known.setdefault(w, len(known)) for w in words] + [-1], dtype=np.int64)
                numbers[at:at + len(chunk), i] = mapped[pc.fill_null(chunk.indices, len(words))
                                                        .to_numpy(zero_copy_only=False)]
                at += len(chunk)
        numbers[:, -1] = self._canonical[np.where(scope >= 0, scope, -1)]
        # the group's distinct rows by a sort of them (np.unique's rows go through a sort of opaque records: slow)
        order = np.lexsort(numbers.T[::-1])
        ordered = numbers[order]
        first = np.ones(count, dtype=bool)
        first[1:] = (ordered[1:] != ordered[:-1]).any(axis=1)
        keys = np.array([self._rows.setdefault(tuple(row), len(self._rows)) for row in ordered[first].tolist()],
                        dtype=np.int64)
        key = np.empty(count, dtype=np.int64)
        key[order] = keys[np.cumsum(first) - 1]
        host = _ints(calls["dur_ns"], 0) if "dur_ns" in calls.column_names else np.zeros(count, dtype=np.int64)
        return narrow(key), host

    def ranked(self) -> tuple[np.ndarray, pl.DataFrame]:
        """Each key's row of the distinct rows, and those rows (columns :data:`GROUP_COLUMNS`) in the order of their
        numbers."""
        rows = list(self._rows)
        words = {column: list(known) for column, known in self._numbers.items()}
        shown = sorted({text for r in rows if r[-1] >= 0 and (text := self._texts[r[-1]]) is not None})
        place = {text: i for i, text in enumerate(shown)}

        def order(row: tuple[int, ...]) -> tuple[int, ...]:  # a null (-1) after every value, the module by its text
            text = self._texts[row[-1]] if row[-1] >= 0 else None
            return (*(n if n >= 0 else len(words[c]) for c, n in zip(KEY_COLUMNS, row, strict=False)),
                    place.get(text, len(shown)) if text is not None else len(shown))

        ranked = sorted(range(len(rows)), key=lambda i: order(rows[i]))
        rank = np.empty(len(rows), dtype=np.int64)
        rank[ranked] = np.arange(len(rows))
        values: dict[str, list[str | None]] = {column: [] for column in GROUP_COLUMNS}
        for i in ranked:
            row = rows[i]
            for column, number in zip(KEY_COLUMNS, row, strict=False):
                values[column].append(words[column][number] if number >= 0 else None)
            values["module"].append(self._texts[row[-1]] if row[-1] >= 0 else None)
        return rank, pl.DataFrame(values, schema={c: pl.String for c in GROUP_COLUMNS})
