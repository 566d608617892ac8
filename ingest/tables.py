"""Writing a parser's rows as the warehouse's Parquet files, in the declared schema.

Parsers that build rows in Python (XLA, NCCL) hand columns (lists) to these
helpers; every column the declaration has and the parser does not fill is null,
so each file has exactly the declared columns and types.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tracelake.contracts import schema

#: A column's values: a list, or an Arrow array (cast to the declared type).
ColumnValues: TypeAlias = "Sequence[object] | pa.Array[Any] | pa.ChunkedArray[Any]"


def fit_int(value: object, bits: int = 64) -> int | None:
    """``value`` if it is an integer (not a bool) that fits a signed ``bits``-bit column, else None.

    Parsers pass the numbers of untrusted files through this: a huge one becomes
    null instead of an overflow when the column is written.
    """
    if isinstance(value, int) and not isinstance(value, bool) and -(1 << (bits - 1)) <= value < 1 << (bits - 1):
        return value
    return None


def fit_text(value: object) -> str | None:
    """A string column's value: strings as they are, numbers as text, anything else None.

    Containers are never ``str()``-ed: a pickle can nest shared lists so deeply that their text is exponential.
    """
    if isinstance(value, str):
        return value
    return str(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def arrow_table(table: str, columns: Mapping[str, ColumnValues], *, trace_id: str,
                nulls: Callable[[int, pa.DataType], pa.Array] = pa.nulls) -> pa.Table:
    """An Arrow table of ``table``'s declared schema from column lists.

    ``trace_id`` fills that column; other missing columns are null (``nulls(rows, type)`` makes them).
    """
    tbl = schema.table(table)
    unknown = set(columns) - set(tbl.column_names)
    if unknown:
        raise KeyError(f"{table} has no columns {sorted(unknown)}")
    rows = len(next(iter(columns.values()))) if columns else 0  # lists, or Arrow arrays

    def column(c: schema.Column) -> pa.Array:
        if c.name in columns:
            values = columns[c.name]
            if isinstance(values, pa.Array | pa.ChunkedArray):
                return values.cast(c.arrow_type)
            return pa.array(values, type=c.arrow_type)
        if c.name == "trace_id":
            return pa.repeat(pa.scalar(trace_id, type=c.arrow_type), rows)
        return nulls(rows, c.arrow_type)

    arrays = [column(c) for c in tbl.columns]
    arrays = [a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a for a in arrays]
    return pa.Table.from_arrays(arrays, schema=tbl.arrow_schema)


def write_table(staging: Path, table: str, columns: Mapping[str, ColumnValues], *, trace_id: str) -> None:
    """Write ``<table>.parquet`` in ``staging`` from column lists (see :func:`arrow_table`)."""
    pq.write_table(arrow_table(table, columns, trace_id=trace_id), staging / f"{table}.parquet", compression="zstd")


def append_table(staging: Path, table: str, columns: Mapping[str, ColumnValues], *, trace_id: str) -> None:
    """Add rows to ``<table>.parquet`` in ``staging``, written already or not (small tables that two readers
    of one file both fill, such as ``devices`` from nccl-tests rank lines and NCCL's NIC lines)."""
    path = staging / f"{table}.parquet"
    rows = arrow_table(table, columns, trace_id=trace_id)
    if path.exists():
        with pq.ParquetFile(path) as written:  # one file: pq.read_table would load Arrow's datasets (15 MB)
            rows = pa.concat_tables([written.read(), rows])
    pq.write_table(rows, path, compression="zstd")


class TableWriter:
    """Writes ``<table>.parquet`` in parts (one row group per :meth:`write`), for tables too big to hold."""

    def __init__(self, staging: Path, table: str, *, trace_id: str, dictionaries: bool = False,
                 **options: Any) -> None:
        """``options``: ``pyarrow.parquet.ParquetWriter``'s (encodings, statistics...); zstd unless they say.

        ``dictionaries``: text columns given as Arrow dictionaries (a code per row into the distinct values) are
        written as they are, as Parquet's dictionary pages, not cast to one string per row and encoded again (the
        others are dictionary-encoded here): for 6.7 million TPU ops the writer's CPU time falls by about 40%.
        The file is the same to a reader: the Arrow schema is not stored, and Parquet's types read back as the
        declared ones (tests/test_table_writer.py checks this).
        """
        self.table = table
        self.trace_id = trace_id
        self.rows = 0
        declared = schema.table(table).arrow_schema
        #: The text columns written from dictionaries (with ``dictionaries``).
        self._texts = [f.name for f in declared if pa.types.is_string(f.type)] if dictionaries else []
        if self._texts:
            declared = pa.schema([f.with_type(_TEXT_CODES) if f.name in self._texts else f for f in declared])
            options = {"store_schema": False, **options}
        self._schema = declared
        self._nulls: dict[pa.DataType, pa.Array] = {}
        self._writer = pq.ParquetWriter(staging / f"{table}.parquet", declared, **{"compression": "zstd", **options})

    def write(self, columns: Mapping[str, ColumnValues]) -> None:
        """Append rows given as column lists or Arrow arrays."""
        self.write_part(self.part(columns))

    def part(self, columns: Mapping[str, ColumnValues]) -> pa.Table:
        """The rows of column lists or Arrow arrays as the file's Arrow table (:meth:`write_part` writes it)."""
        if self._texts:
            part = arrow_table(self.table, {n: v for n, v in columns.items() if n not in self._texts},
                               trace_id=self.trace_id, nulls=self._null_column)
            texts = {n: _text_codes(columns[n]) if n in columns else self._null_column(part.num_rows, _TEXT_CODES)
                     for n in self._texts if n != "trace_id"}
            if "trace_id" in self._texts:
                texts["trace_id"] = pa.DictionaryArray.from_arrays(
                    pa.array(np.zeros(part.num_rows, dtype=np.int32)), pa.array([self.trace_id], type=pa.string()))
            part = pa.Table.from_arrays([texts[f.name] if f.name in texts else part[f.name] for f in self._schema],
                                        schema=self._schema)
        else:
            part = arrow_table(self.table, columns, trace_id=self.trace_id, nulls=self._null_column)
        return part

    def _null_column(self, rows: int, kind: pa.DataType) -> pa.Array:
        """``rows`` nulls of ``kind``: a slice of one array per type that the parts share, not an array per part
        (parts wait beside the writer with a column of 8 bytes a row for each column the parser leaves empty)."""
        held = self._nulls.get(kind)
        if held is None or len(held) < rows:
            held = self._nulls[kind] = pa.nulls(rows, type=kind)
        return held.slice(0, rows)

    def write_part(self, part: pa.Table) -> None:
        """Append rows made by :meth:`part`."""
        if part.num_rows:
            self._writer.write_table(part)
            self.rows += part.num_rows

    def close(self) -> None:
        """Finish the file (an empty table still gets a valid file)."""
        self._writer.close()

    def __enter__(self) -> TableWriter:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


#: How :class:`TableWriter` holds a text column given as a dictionary.
_TEXT_CODES = pa.dictionary(pa.int32(), pa.string())


def _text_codes(values: ColumnValues) -> pa.Array:
    """A text column as a dictionary of :data:`_TEXT_CODES` (a list, or Arrow strings, are encoded here)."""
    if isinstance(values, pa.ChunkedArray):  # chunks may hold different dictionaries (with nulls, not unified)
        values = values.cast(pa.string()).combine_chunks()
    if not isinstance(values, pa.Array):
        values = pa.array(values, type=pa.string())
    if not pa.types.is_dictionary(values.type):
        values = pc.dictionary_encode(values.cast(pa.string()))
    values = values.cast(_TEXT_CODES)
    words = values.dictionary
    # Parquet keeps an Arrow dictionary as its dictionary pages only where its words are distinct, and takes no null
    # among them: a dictionary of the ops of a line (one word per op kind, the same category or module for many)
    # made Parquet write every row's text plainly, 20 times the bytes to encode, compress and read back. So each word
    # once, and the rows of a null word null.
    distinct = pc.dictionary_encode(words)
    if distinct.null_count or len(distinct.dictionary) < len(words):
        values = pa.DictionaryArray.from_arrays(pc.take(distinct.indices, values.indices),
                                                distinct.dictionary).cast(_TEXT_CODES)
    return values


#: Parts a :class:`BackgroundWriter` holds handed over but not yet written, at most, unless told otherwise.
PENDING = 4


class BackgroundWriter:
    """A :class:`TableWriter` whose :meth:`write` returns at once; errors surface at the next call or at close.

    Encoding and compressing a Parquet part takes about as long as making the rows it
    holds; Arrow does it without the GIL, so a writer thread overlaps the two on a
    second core. Parts are written in the order given (one worker), and at most
    ``pending`` wait at a time, so memory stays bounded. The columns are made into the
    part's Arrow table on the caller's thread (:meth:`TableWriter.part`): the writer's
    thread is the slower one (on a TPU trace the parser waited on it for half its time),
    so it only encodes.
    """

    def __init__(self, writer: TableWriter, pending: int = PENDING) -> None:
        self._writer = writer
        self._limit = pending
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tracelake-table-writer")
        self._pending: list[Future[None]] = []

    @property
    def rows(self) -> int:
        """Rows written so far (waits for the parts handed over)."""
        self._wait(0)
        return self._writer.rows

    def write(self, columns: Mapping[str, ColumnValues]) -> None:
        """Queue one part (column lists or Arrow arrays), waiting while ``pending`` parts are queued."""
        part = self._writer.part(columns)
        self._wait(self._limit - 1)
        self._pending.append(self._pool.submit(self._writer.write_part, part))

    def _wait(self, keep: int) -> None:
        while len(self._pending) > keep:
            self._pending.pop(0).result()  # re-raises the writer's error here

    def close(self) -> None:
        """Write what is queued and finish the file."""
        try:
            self._wait(0)
        finally:
            for future in self._pending:
                future.cancel()
            self._pool.shutdown(wait=True)
            self._writer.close()

    def __enter__(self) -> BackgroundWriter:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
