"""The final tables of a Kineto trace: the Parquet parts joined with their cross-event facts.

:func:`write_tables` writes ``<table>.parquet`` for every data table into the staging
directory; the big joins (host and device ops) go by ranges of event ids when one join
would not fit DuckDB's memory limit (:data:`JOIN_BYTES_PER_ROW`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from tracelake.contracts import schema
from tracelake.contracts.schema import sql_literal


_ORDER = {
    "collectives": "ts_ns, event_id",
    "steps": "step",
    "counters": "name, ts_ns",
    "memory_events": "ts_ns, event_id",
}

#: Bytes of DuckDB's memory limit per row of the parts joined at once with their
#: cross-event columns, by table. DuckDB does not spill a hash join far enough to join a
#: multi-gigabyte trace within the limit in one go: at 200 MB a 2 GB trace's 3.2M host ops
#: fail, and its 0.94M device ops (their side of the join holds the category text) go out
#: of core at a third of the speed. Larger tables are joined by ranges of event ids, into
#: one file: at the default 200 MB, 1.25M host ops or 250K device ops a range.
JOIN_BYTES_PER_ROW = {"host_ops": 160, "device_ops": 800}
#: Rows per row group of a table joined by ranges: each is held whole, as Arrow and encoded, until
#: written, beside the batches DuckDB prepares. Half DuckDB's own writer's size (122,880) took 40-65 MB off
#: each join's peak on a 1 GB trace (long kernel names) at the same speed; a quarter took 70 MB, but the
#: stored analyses, which read a row group at a time, took 0.2 s longer.
_ROW_GROUP_ROWS = 65_536
_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def memory_limit(con: duckdb.DuckDBPyConnection) -> int:
    """The connection's memory limit in bytes (1 GB where DuckDB words it in a way not known here): what the joins
    plan their ranges by."""
    return _limit_bytes(con)


def _limit_bytes(con: duckdb.DuckDBPyConnection) -> int:
    limit = str(con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0])
    number, _, unit = limit.strip().partition(" ")
    try:
        return int(float(number) * _UNITS[unit.upper() or "B"])
    except (KeyError, ValueError):
        return 10**9


#: The share of the ingest's DuckDB memory limit a statement gets on a :func:`side_connection`, and the least it
#: gets. The nesting's sort of the host events took about 280 MB of RSS under the whole 200 MB limit on a 1 GB
#: trace, the peak of the ingest: at half the limit it spills sooner, 87 MB off that peak for +0.17 s of CPU in 12.
#: (The final joins and the memory instants' sort took 15 MB off the peak this way, for 0.35 s: not done. Tried
#: again on 2026-12-05 with the whole of :func:`write_tables` under half the limit on ``con`` itself: 40-55 MiB off
#: the 1 GB Qwen shape's peak for 3-5% more time, nothing off the 2 GB one's (the operators' pass sets it) for
#: 5-10% more, its joins going by twice the ranges, each reading all the facts again: not done.) Not below 100 MB,
#: where it would spill for little gain; a lower limit a person set holds.
SIDE_SHARE = 0.5
SIDE_FLOOR = 100 * 10**6


@contextmanager
def side_connection(con: duckdb.DuckDBPyConnection, share: float = SIDE_SHARE,
                    floor: int = SIDE_FLOOR) -> Iterator[duckdb.DuckDBPyConnection]:
    """A fresh in-memory DuckDB for a statement over the Parquet parts, with ``share`` of ``con``'s memory limit
    (never below ``floor`` bytes, unless ``con``'s is lower: then that), its threads, and a temporary folder of
    its own beside ``con``'s (``<folder>-side``: two databases spilling into one folder could take each other's
    files; DuckDB makes the folder when it first spills, and the staging folder holding both goes after the ingest).

    Its own database holds none of ``con``'s tables, so its limit binds its statement alone.
    """
    limit = _limit_bytes(con)
    threads, temp = con.execute("SELECT current_setting('threads'), current_setting('temp_directory')").fetchall()[0]
    side = duckdb.connect(config={"memory_limit": f"{min(limit, max(int(limit * share), floor))}B",
                                  "threads": int(threads), "temp_directory": f"{temp}-side",
                                  "preserve_insertion_order": False})
    try:
        yield side
    finally:
        side.close()


def write_tables(
    con: duckdb.DuckDBPyConnection, staging: Path, parts: Path, trace_id: str, rank: int, base_ns: int
) -> None:
    """Write ``<table>.parquet`` into ``staging`` for every data table, times shifted by ``base_ns``."""
    common = {"trace_id": sql_literal(trace_id), "rank": str(int(rank))}
    base = int(base_ns)

    def shifted(column: str) -> str:
        return f"{column} + {base}" if base else column

    joined = {
        "device_ops": ("device", "dev_d", {
            "event_id": "event_id", "device": "p.device", "stream": "p.stream", "kind": "kind",
            "category": "d.category", "name": "name", "ts_ns": shifted("p.ts_ns"), "dur_ns": "p.dur_ns",
            "correlation": "p.correlation", "external_id": "external_id", "step": "d.step",
            "bytes": "bytes", "grid": "grid", "block": "block", "registers_per_thread": "regs",
            "shared_memory_bytes": "smem", "occupancy_pct": "occupancy", "graph_id": "graph_id",
        }),
        "host_ops": ("host", "host_d", {
            "event_id": "event_id", "pid": "p.pid", "tid": "p.tid", "cat": "cat", "name": "name",
            "ts_ns": shifted("p.ts_ns"), "dur_ns": "p.dur_ns", "depth": "d.depth", "parent_id": "d.parent_id",
            "correlation": "p.correlation", "external_id": "external_id",
            "sequence_number": "sequence_number", "fwd_thread_id": "fwd_thread_id",
            "input_dims": "input_dims", "input_types": "input_types", "flops": "flops",
            "concrete_inputs": "concrete_inputs", "step": "d.step",
            "record_function_id": "record_function_id",
        }),
    }
    for table_name, (part, facts, exprs) in joined.items():
        _write_joined(con, staging / f"{table_name}.parquet", schema.table(table_name),
                      schema.select_list(schema.table(table_name), common | exprs),
                      f"read_parquet({sql_literal(str(parts / f'{part}-*.parquet'))})", facts)
    sources = {
        "collectives": ("coll", {
            c: shifted(c) if c in ("ts_ns", "cpu_ts_ns") else c
            for c in schema.COLLECTIVES.column_names
            if c not in common and c not in ("is_async", "channels")
        } | {"is_async": "FALSE"}),
        "steps": ("step_rows", {
            c: shifted(c) if c in ("ts_ns", "device_start_ns", "device_end_ns") else c
            for c in schema.STEPS.column_names if c not in common
        }),
        "counters": ("counter_rows", {
            c: shifted(c) if c == "ts_ns" else c for c in schema.COUNTERS.column_names if c not in common
        }),
    }
    if any(parts.glob("memory-*.parquet")):  # the trace has memory instants: mem_d (kineto_sql_facts.memory_events)
        sources["memory_events"] = ("mem_d", {
            c: shifted(c) if c == "ts_ns" else c for c in schema.MEMORY_EVENTS.column_names if c not in common
        })
    for table_name, (source, exprs) in sources.items():
        select = schema.select_list(schema.table(table_name), common | exprs)
        out = sql_literal(str(staging / f"{table_name}.parquet"))
        con.execute(f"COPY (SELECT {select} FROM {source} ORDER BY {_ORDER[table_name]}) TO {out} "
                    "(FORMAT parquet, COMPRESSION zstd)")


def _write_joined(
    con: duckdb.DuckDBPyConnection, out: Path, tbl: schema.Table, select: str, part_rows: str, facts: str
) -> None:
    """``out``: the rows of ``part_rows`` (``p``) joined with ``facts`` (``d``) on ``event_id``.

    One statement when the join fits DuckDB's memory limit (see :data:`JOIN_BYTES_PER_ROW`), else
    one range of event ids at a time (:func:`id_ranges`), streamed into a single Parquet writer.
    """
    query = f"SELECT {select} FROM {part_rows} p JOIN {facts} d USING (event_id)"
    ranges = id_ranges(con, facts, max(memory_limit(con) // JOIN_BYTES_PER_ROW[tbl.name], 1))
    if len(ranges) <= 1:
        con.execute(f"COPY ({query}) TO {sql_literal(str(out))} (FORMAT parquet, COMPRESSION zstd)")
        return
    arrow_schema = tbl.arrow_schema
    # Dictionaries pay for the texts (names, categories) only; for numbers they cost writing time.
    texts = [f.name for f in arrow_schema if pa.types.is_string(f.type)]
    with pq.ParquetWriter(out, arrow_schema, compression="zstd", use_dictionary=texts) as writer:
        for first, stop in ranges:
            reader = con.sql(f"{query} WHERE p.event_id >= {first} AND p.event_id < {stop} "
                             f"AND d.event_id >= {first} AND d.event_id < {stop}").to_arrow_reader(_ROW_GROUP_ROWS)
            for batch in reader:
                writer.write_batch(batch.cast(arrow_schema))


#: Buckets of event ids counted to cut the ranges of a join.
_ID_BUCKETS = 1024


def id_ranges(con: duckdb.DuckDBPyConnection, facts: str, rows_per_range: int) -> list[tuple[int, int]]:
    """Half-open ranges of event ids covering ``facts``, each holding at most ``rows_per_range`` of its rows.

    Cut at bucket edges (a bucket holds ``1/1024`` of the ids; one larger than the budget
    makes a range of its own), so that ops clustered in one part of a trace (Kineto writes
    a thread's CPU ops together) do not overfill a range. Empty for no rows.
    """
    rows, low, high = con.execute(f"SELECT count(*), min(event_id), max(event_id) FROM {facts}").fetchall()[0]
    if not rows:
        return []
    if rows <= rows_per_range:
        return [(low, high + 1)]
    width = -(-(high - low + 1) // _ID_BUCKETS)
    counts = con.execute(f"SELECT (event_id - {low}) // {width} AS bucket, count(*) FROM {facts} "
                         "GROUP BY bucket ORDER BY bucket").fetchall()
    ranges: list[tuple[int, int]] = []
    first, held = low, 0
    for bucket, count in counts:
        if held and held + count > rows_per_range:
            edge = low + bucket * width
            ranges.append((first, edge))
            first, held = edge, 0
        held += count
    ranges.append((first, high + 1))
    return ranges
