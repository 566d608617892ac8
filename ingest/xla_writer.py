"""Writing ``device_ops`` parts on a second thread while the XSpace parser decodes the next ones.

Encoding and compressing a Parquet part takes about as long as decoding the events
it holds; Arrow does it without the GIL, so a writer thread overlaps the two on a
second core. Parts are written in the order given (one worker), and at most
:data:`PENDING` wait at a time, so memory stays bounded.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType

from .tables import ColumnValues, TableWriter

#: Parts handed over but not yet written, at most (each is one window of events: a few MB, strings
#: dictionary-encoded until the writer casts them).
PENDING = 4


class BackgroundWriter:
    """A :class:`TableWriter` whose :meth:`write` returns at once; errors surface at the next call or at close."""

    def __init__(self, writer: TableWriter) -> None:
        self._writer = writer
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tracelake-xla-writer")
        self._pending: list[Future[None]] = []

    @property
    def rows(self) -> int:
        """Rows written so far (waits for the parts handed over)."""
        self._wait(0)
        return self._writer.rows

    def write(self, columns: Mapping[str, ColumnValues]) -> None:
        """Queue one part (column lists or Arrow arrays), waiting while :data:`PENDING` parts are queued."""
        self._wait(PENDING - 1)
        self._pending.append(self._pool.submit(self._writer.write, columns))

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
