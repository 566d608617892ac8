"""Parquet files written on a thread of their own, so that encoding one row group overlaps preparing the next."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq


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
