"""Parquet files written on a thread of their own, so that encoding one row group overlaps preparing the next."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

#: Text columns of the big tables whose row-group statistics (least and greatest value) no reader prunes by: the
#: names, categories and descriptions of ops and host events, mixed in every row group. The XLA parsers hand these
#: to Parquet as Arrow dictionaries, whose statistics take a quarter of the time of writing a TPU trace's device
#: ops (the parse's slowest thread): their files are written without them (``xla_rows.writer_options``). Every
#: other column keeps its statistics: the readers prune by trace, rank, time, kind, ids and null counts
#: (docs/architecture.md, "Parquet statistics"). Kineto's plain texts cost 4% of their tables' encoding and keep
#: theirs.
UNPRUNED_TEXTS = frozenset({"name", "category", "long_name", "hlo_module", "hlo_category", "cat", "input_dims",
                            "input_types", "concrete_inputs"})


def statistics_for(schema: pa.Schema) -> list[str]:
    """The columns of ``schema`` whose statistics a big table's file keeps, as Parquet paths (a list's are its
    elements'): all but :data:`UNPRUNED_TEXTS`."""
    return [f"{field.name}.list.element" if pa.types.is_list(field.type) else field.name
            for field in schema if field.name not in UNPRUNED_TEXTS]


class EncodingWriter:
    """A :class:`pyarrow.parquet.ParquetWriter` whose row groups are encoded and written on a thread of its own.

    pyarrow lets go of the GIL while it encodes, so the caller prepares the next row group (a
    DuckDB batch, a sweep, a join) on its core meanwhile. One group is encoded at a time: a write
    waits for the one before it, so at most one group waits beside the one being prepared. An
    error of the encoding thread is raised by the next :meth:`write_table` or by :meth:`close`.
    """

    def __init__(self, where: Path, schema: pa.Schema, **options: Any) -> None:
        self._writer: pq.ParquetWriter | None = pq.ParquetWriter(where, schema, **options)
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="tracelake-parquet")
        self._pending: Future[None] | None = None

    def write_table(self, table: pa.Table, row_group_size: int | None = None) -> None:
        """Write ``table`` (as row groups of ``row_group_size`` rows, at most) once the write before it is done."""
        self._wait()
        if self._writer is None:
            raise ValueError("write to a closed EncodingWriter")
        self._pending = self._thread.submit(self._writer.write_table, table, row_group_size=row_group_size)

    def close(self) -> None:
        """Wait for the last write and close the file (once; a failed write is raised here, the file closed)."""
        if self._writer is None:
            return
        try:
            self._wait()
        finally:
            self._thread.shutdown(wait=True)
            self._writer.close()
            self._writer = None

    def _wait(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def __enter__(self) -> EncodingWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
