"""The building blocks of the table declarations: columns, tables and the columns many tables share.

The tables themselves are declared in :mod:`tracelake.contracts.tables`; use them through
:mod:`tracelake.contracts.schema`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

_ARROW_TYPES: dict[str, pa.DataType] = {
    "VARCHAR": pa.string(),
    "BIGINT": pa.int64(),
    "UBIGINT": pa.uint64(),
    "INTEGER": pa.int32(),
    "DOUBLE": pa.float64(),
    "BOOLEAN": pa.bool_(),
    "TIMESTAMPTZ": pa.timestamp("us", tz="UTC"),
    "VARCHAR[]": pa.list_(pa.string()),
    "INTEGER[]": pa.list_(pa.int32()),
    "BIGINT[]": pa.list_(pa.int64()),
    "MAP(VARCHAR, VARCHAR)": pa.map_(pa.string(), pa.string()),
}


@dataclass(frozen=True)
class Column:
    """One column: its name, DuckDB type and what it means."""

    name: str
    type: str
    doc: str

    @property
    def arrow_type(self) -> pa.DataType:
        """The Arrow type Parquet files store this column as."""
        return _ARROW_TYPES[self.type]


@dataclass(frozen=True)
class Table:
    """A warehouse table: one Parquet file per trace under ``tables/<name>/job=<job>/``."""

    name: str
    doc: str
    columns: tuple[Column, ...]
    #: Columns that come from the directory layout (hive partitioning), not the file.
    partition_columns: tuple[Column, ...] = field(default=())
    #: Computed from other tables after parsing (and again by ``analyze --recompute``).
    derived: bool = False

    @property
    def arrow_schema(self) -> pa.Schema:
        """The schema of this table's Parquet files (partition columns excluded)."""
        return pa.schema([pa.field(c.name, c.arrow_type) for c in self.columns])

    def column(self, name: str) -> Column:
        """Return the column called ``name``."""
        for col in (*self.columns, *self.partition_columns):
            if col.name == name:
                return col
        raise KeyError(f"table {self.name} has no column {name!r}")

    @property
    def column_names(self) -> list[str]:
        """Names of the columns stored in each file, in order."""
        return [c.name for c in self.columns]



def column(name: str, type_: str, doc: str) -> Column:
    """A column called ``name`` of DuckDB type ``type_``, documented by ``doc``."""
    return Column(name, type_, doc)


def ns_column(name: str, doc: str) -> Column:
    """A BIGINT column of nanoseconds (the name should end in ``_ns``)."""
    return column(name, "BIGINT", doc)


JOB = column("job", "VARCHAR", "Job the trace was ingested under (from the `job=<job>` folder).")
TRACE_ID = column("trace_id", "VARCHAR", "Content hash of the source file; joins every table to `traces`.")
RANK = column("rank", "INTEGER", "Global rank of the process that wrote the trace.")
EVENT_ID = column("event_id", "BIGINT", "Index of the event in the source file's event list (unique per trace).")
TS = column("ts_ns", "BIGINT", "Start time, ns since the epoch (or the profiler's clock when the trace has no epoch).")
DUR = column("dur_ns", "BIGINT", "Duration in ns, never negative.")
STEP = column("step", "BIGINT", "Training step (`ProfilerStep#N`) the event belongs to; null outside steps.")
