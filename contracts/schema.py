"""Every warehouse table, declared once as data.

The declaration drives everything else: the Arrow schema parsers must produce, the
SQL casts that normalise a parser's output, the DuckDB views of the catalog and
``docs/schema.md`` (a test checks that the document matches this module).
The tables are declared in :mod:`tracelake.contracts.tables`, :mod:`.profile_tables` and
:mod:`.derived_tables` (their building blocks in
:mod:`tracelake.contracts.columns`); this module is the one to import: it lists them in
write order and holds the version and the SQL helpers built on them.

Units live in column names: ``*_ns`` are integer nanoseconds (timestamps since the
Unix epoch where the trace gives absolute time), ``*_bytes``/``bytes`` are bytes.
"""

from __future__ import annotations

from .columns import DUR, EVENT_ID, JOB, RANK, STEP, TRACE_ID, TS, Column, Table
from .derived_tables import (
    BREAKDOWN,
    CRITICAL_PATH,
    GRAPH_LAUNCHES,
    KERNEL_STATS,
    LAUNCH_STATS,
    OP_STATS,
    STREAM_IDLE,
    STREAM_QUEUES,
)
from .profile_tables import ALLOCATOR_EVENTS, ALLOCATOR_SEGMENTS, ET_NODES, MEMORY_EVENTS, MEMORY_TIMELINE
from .tables import (
    COLLECTIVES,
    COMM_CHANNELS,
    COMMUNICATORS,
    COUNTERS,
    DEVICE_OPS,
    DEVICES,
    FLIGHT_RECORDER_STATUS,
    HOST_OPS,
    JOB_LIFECYCLE,
    NCCL_BENCHMARKS,
    STEPS,
    TRACES,
)

#: Bumped whenever a table or column changes meaning or type.
SCHEMA_VERSION = 10

#: Every table, in the order they are written; `traces` is last because writing
#: its row is what makes a trace visible.
TABLES: dict[str, Table] = {
    t.name: t
    for t in (DEVICE_OPS, HOST_OPS, COLLECTIVES, STEPS, COUNTERS, MEMORY_EVENTS, MEMORY_TIMELINE, ALLOCATOR_SEGMENTS,
              ALLOCATOR_EVENTS, DEVICES, NCCL_BENCHMARKS,
              COMMUNICATORS, COMM_CHANNELS, FLIGHT_RECORDER_STATUS, JOB_LIFECYCLE, ET_NODES, BREAKDOWN, KERNEL_STATS,
              STREAM_IDLE,
              LAUNCH_STATS, STREAM_QUEUES, GRAPH_LAUNCHES, CRITICAL_PATH, OP_STATS, TRACES)
}

#: Tables holding one trace's data (everything except the registry itself).
DATA_TABLES: tuple[str, ...] = tuple(name for name in TABLES if name != "traces")
#: Tables a parser writes.
PARSED_TABLES: tuple[str, ...] = tuple(name for name in DATA_TABLES if not TABLES[name].derived)
#: Tables computed from the parsed ones.
DERIVED_TABLES: tuple[str, ...] = tuple(name for name in DATA_TABLES if TABLES[name].derived)


def table(name: str) -> Table:
    """Return the declared table called ``name``."""
    try:
        return TABLES[name]
    except KeyError:
        raise KeyError(f"no table {name!r}; tables: {', '.join(TABLES)}") from None


def sql_literal(text: str) -> str:
    """``text`` as a SQL string literal (paths, ids) for statements built from parts."""
    return "'" + text.replace("'", "''") + "'"


def select_list(tbl: Table, exprs: dict[str, str]) -> str:
    """A SQL select list casting ``exprs`` to ``tbl``'s columns, in order.

    Columns missing from ``exprs`` become typed NULLs, so every parser's output
    has exactly the declared columns and types.
    """
    unknown = set(exprs) - set(tbl.column_names)
    if unknown:
        raise KeyError(f"{tbl.name} has no columns {sorted(unknown)}")
    return ",\n  ".join(
        f"CAST({exprs.get(c.name, 'NULL')} AS {c.type}) AS {c.name}" for c in tbl.columns
    )


__all__ = [
    "ALLOCATOR_EVENTS",
    "ALLOCATOR_SEGMENTS",
    "BREAKDOWN",
    "COLLECTIVES",
    "COMM_CHANNELS",
    "COMMUNICATORS",
    "COUNTERS",
    "CRITICAL_PATH",
    "DATA_TABLES",
    "DERIVED_TABLES",
    "DEVICES",
    "DEVICE_OPS",
    "DUR",
    "EVENT_ID",
    "ET_NODES",
    "FLIGHT_RECORDER_STATUS",
    "GRAPH_LAUNCHES",
    "HOST_OPS",
    "JOB",
    "JOB_LIFECYCLE",
    "KERNEL_STATS",
    "LAUNCH_STATS",
    "MEMORY_EVENTS",
    "MEMORY_TIMELINE",
    "NCCL_BENCHMARKS",
    "OP_STATS",
    "PARSED_TABLES",
    "RANK",
    "SCHEMA_VERSION",
    "STEP",
    "STEPS",
    "STREAM_IDLE",
    "STREAM_QUEUES",
    "TABLES",
    "TRACES",
    "TRACE_ID",
    "TS",
    "Column",
    "Table",
    "select_list",
    "sql_literal",
    "table",
]
