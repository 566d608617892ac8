"""Arrow batches taken by counts of rows: batches held until rows are taken off their front
(:class:`HeldBatches`), and the rows of a Parquet file taken so, a row group read at a time (:class:`FileRows`).
The final tables' merge (``kineto_sql_tables._write_merged``) takes its facts beside the parts' batches so, and
writes its row groups of a fixed count of rows from batches of any size."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


class HeldBatches:
    """Batches held in order until a given number of rows is taken off their front."""

    def __init__(self, arrow_schema: pa.Schema) -> None:
        self.schema = arrow_schema
        self.batches: list[pa.RecordBatch] = []
        self.count = 0

    def add(self, batch: pa.RecordBatch) -> None:
        self.batches.append(batch)
        self.count += batch.num_rows

    def take(self, rows: int) -> pa.Table:
        """The first ``rows`` rows held (fewer if fewer are held); the rest stay."""
        held = pa.Table.from_batches(self.batches, schema=self.schema)
        rest = held.slice(rows)
        self.batches, self.count = rest.to_batches(), rest.num_rows
        return held.slice(0, rows)


class FileRows:
    """The rows of a Parquet file in order, taken a given number at a time.

    Read a row group at a time (the facts' files are written in groups of ``kineto_sql_tables._ROW_GROUP_ROWS``):
    pyarrow's ``iter_batches`` read the whole file ahead, 49 MB of host events' facts at 4 GB of trace, at the merge's
    peak.
    """

    def __init__(self, path: Path) -> None:
        file = pq.ParquetFile(path)
        self._batches = (batch for group in range(file.num_row_groups)
                         for batch in file.read_row_group(group).to_batches())
        self._held = HeldBatches(file.schema_arrow)

    def take(self, rows: int) -> tuple[np.ndarray, pa.Table]:
        """The next ``rows`` rows (fewer at the end): their ``event_id`` and the whole rows."""
        while self._held.count < rows and (batch := next(self._batches, None)) is not None:
            self._held.add(batch)
        taken = self._held.take(rows)
        return taken.column("event_id").to_numpy(), taken

    def exhausted(self) -> bool:
        """Whether every row has been taken."""
        return not self._held.count and next(self._batches, None) is None
