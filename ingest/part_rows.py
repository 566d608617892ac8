"""The rows of a Kineto trace's Parquet parts as batches of a final table, read by Arrow on the calling thread.

The final tables' merges (``kineto_sql_tables._write_merged``) read the host and device ops' parts here, a part at a
time, rather than through DuckDB. DuckDB handed its batches over from its worker threads, each text column's
characters in a buffer grown by ``realloc`` there and freed on the merge's thread once written: the holes they left in
the workers' heaps grew with the batches read. Read here, on the merge's own thread, the merges alone on the parts of
the 8 GB Qwen shape peaked 50-55 MiB lower (device ops 111-118 MiB of anonymous memory against 165-171, host ops
109-110 against 171), in about the same time (device ops 1.5-2.0 s against 1.3-1.5, host ops 2.8-3.0 against 3.3;
docs/architecture.md, "Memory").

A :class:`PartColumns` declares where each column of the table comes from, once: the same declaration gives the SQL
expressions of the hash join that takes over where a merge cannot (:meth:`PartColumns.sql`).
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tracelake.contracts import schema
from tracelake.contracts.schema import sql_literal


#: Rows per batch read from a part, at most (the scanners write a part per batch of about 8 MB of trace: 1,700 device
#: ops or 15,000 host ops of the Qwen shape, a row group each).
BATCH_ROWS = 65_536


class UnfitValue(ValueError):
    """A value of a part that does not fit its table's column."""


@dataclass(frozen=True)
class PartColumns:
    """Where the columns of ``table`` come from: ``sources`` maps a column to the parts' column holding it, those in
    ``shifted`` moved by ``base_ns`` (the trace's times made absolute), and ``constants`` hold one value in every row
    (the trace's id and rank). Any other column of the table is null (the facts', which the merge fills).

    The final tables read from DuckDB's relations rather than parts (collectives, steps...) take their SQL from the
    same declaration (:meth:`sql`), so the rule for the constants and the shift is written once."""

    table: schema.Table
    sources: Mapping[str, str]
    constants: Mapping[str, str | int] = field(default_factory=dict)
    shifted: frozenset[str] = frozenset()
    base_ns: int = 0

    def __post_init__(self) -> None:
        unknown = (set(self.sources) | set(self.constants)) - set(self.table.column_names)
        if unknown:
            raise KeyError(f"{self.table.name} has no columns {sorted(unknown)}")

    def sql(self) -> dict[str, str]:
        """The same columns as SQL expressions over the parts (for ``schema.select_list``)."""
        exprs = {name: sql_literal(value) if isinstance(value, str) else str(int(value))
                 for name, value in self.constants.items()}
        for name, column in self.sources.items():
            exprs[name] = f"{column} + {int(self.base_ns)}" if name in self.shifted and self.base_ns else column
        return exprs

    def batches(self, files: list[Path]) -> Generator[pa.RecordBatch, None, None]:
        """The rows of ``files``, in the order given and each file's own, as batches of the table's schema.

        Raises:
            UnfitValue: a value out of its column's range (a time past 64 bits once shifted, a kernel's registers past
                32), as DuckDB's casts refuse it.
        """
        arrow_schema = self.table.arrow_schema
        wanted = sorted(set(self.sources.values()))
        for path in files:
            with pq.ParquetFile(path) as part:
                for batch in part.iter_batches(batch_size=BATCH_ROWS, columns=wanted, use_threads=False):
                    yield pa.RecordBatch.from_arrays([self._column(batch, f) for f in arrow_schema],
                                                     schema=arrow_schema)

    def _column(self, batch: pa.RecordBatch, target: pa.Field) -> pa.Array:
        rows = batch.num_rows
        source = self.sources.get(target.name)
        if source is not None:
            try:
                values = batch.column(source).cast(target.type)
                if target.name in self.shifted and self.base_ns:
                    values = pc.add_checked(values, pa.scalar(int(self.base_ns), target.type))
            except pa.ArrowInvalid as exc:
                first = str(exc).splitlines()[0]
                raise UnfitValue(f"{self.table.name}.{target.name}, from {source}: {first}") from None
            return values
        if target.name in self.constants:
            return pa.repeat(pa.scalar(self.constants[target.name], target.type), rows)
        return pa.nulls(rows, target.type)
