"""The op and step of each memory instant of a Kineto trace, joined in DuckDB range by range (docs/architecture.md,
"Memory").

Every instant of a trace joins two things: the name of its op (the host event the native sweep found running at its
time: ``mem_op_ids.parquet``) and its step (``mem_steps.parquet``). One join of all of them grows with the trace,
and at 8 GB of the Qwen shape (3.3M instants) the ops' names ran out of half of DuckDB's limit in 3 runs of 8 under
load. So each join here holds a range of ids at a time (``kineto_sql_tables.id_ranges``), sized by the memory share:
:func:`op_names` by ranges of the ops' ids, :func:`sorted_facts` by ranges of the instants' ids, written in order.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from tracelake.contracts.lazy import duckdb
from tracelake.contracts.schema import sql_literal

from .kineto_sql_tables import SIDE_SHARE, id_ranges, memory_limit, memory_share

#: Bytes of the share of DuckDB's limit per memory instant named at once by :func:`op_names` (two hash joins: the
#: ops' ids, then their names; DuckDB builds the second on the instants, about 110 bytes each). At 8 GB of the Qwen
#: shape (3.3M instants) one join of all of them ran out of a 100 MB share in 3 of 8 runs under load. On the 4 GB
#: shape's parts (1.65M instants), alone: one join under the whole 200 MB limit took 100 MiB above the process in
#: 0.45 s; ranges at 400 bytes a row (4 ranges) 47-49 MiB in 0.66-0.70 s, at 250 (3 ranges) 62 MiB in 0.62 s. At 200,
#: the instants of a 1 GB trace (414K) are named in one range, those of 8 GB in seven.
OP_NAME_BYTES_PER_ROW = 200
#: The same for :func:`sorted_facts` (two hash joins and a sort of the instants): on the 4 GB shape's parts, one
#: statement of all 1.65M instants took 109 MiB above the process under a 95 MB limit, and ran out of a 40 MB one.
FACTS_BYTES_PER_ROW = 200
#: The files of the ops' names (:func:`op_names`): one, or one per range.
OPS_GLOB = "mem_ops-*.parquet"
#: Rows per row group of the sorted facts (the merge reads them a row group at a time).
_GROUP_ROWS = 65_536


def op_names(con: duckdb.DuckDBPyConnection, ids: str, host: str, parts: Path) -> None:
    """``mem_ops-<n>.parquet`` in ``parts``: each memory instant of ``ids`` (``event_id``, ``op_id``: the native
    sweep's) with the name of its op (``op``), from the host events' parts ``host``. Under half of DuckDB's limit, by
    ranges of the ops' ids. An instant without an op has no row: the views join these files with a left join."""
    con.execute(f"CREATE VIEW mem_op_keys AS SELECT op_id AS event_id FROM {ids} WHERE op_id IS NOT NULL")
    with memory_share(con, SIDE_SHARE):
        ranges = id_ranges(con, "mem_op_keys", max(memory_limit(con) // OP_NAME_BYTES_PER_ROW, 1))
        for n, (first, stop) in enumerate(ranges):
            within = f"op_id >= {first} AND op_id < {stop}"
            con.execute(f"""
                COPY (
                    SELECT i.event_id, n.name AS op FROM (SELECT * FROM {ids} WHERE {within}) i
                    LEFT JOIN (SELECT h.event_id, h.name FROM read_parquet({host}) h
                               SEMI JOIN (SELECT op_id FROM {ids} WHERE {within}) o ON h.event_id = o.op_id
                               WHERE h.event_id >= {first} AND h.event_id < {stop}) n ON n.event_id = i.op_id
                ) TO {sql_literal(str(parts / f"mem_ops-{n:06d}.parquet"))} (FORMAT parquet, COMPRESSION lz4)
            """)
        if not ranges:  # no instant has an op: an empty file, for the views' glob
            con.execute(f"COPY (SELECT event_id, NULL::VARCHAR AS op FROM {ids} LIMIT 0) "
                        f"TO {sql_literal(str(parts / 'mem_ops-000000.parquet'))} (FORMAT parquet)")
    con.execute("DROP VIEW mem_op_keys")


def sorted_facts(con: duckdb.DuckDBPyConnection, parts: Path, out: Path) -> None:
    """``out``: every memory instant of the parts (``mem_n``) with its ``op`` and ``step``, in order of ``event_id``,
    as the merge of the final table reads them (``kineto_sql_tables._write_merged``), under half of DuckDB's limit.
    Where one join of them all fits, in one statement; else the ops' names are sorted by instant first (a sort
    spills), then joined with the steps by ranges of the instants' ids, written in order."""
    memory, steps = (sql_literal(str(parts / name)) for name in ("memory-*.parquet", "mem_steps.parquet"))
    ops = parts / "mem_ops_by_id.parquet"
    rows = _GROUP_ROWS

    def joined(names: str, first: int | None = None, stop: int | None = None) -> str:
        def within(source: str) -> str:
            kept = "" if first is None else f" WHERE event_id >= {first} AND event_id < {stop}"
            return f"(SELECT * FROM read_parquet({source}){kept})"
        return (f"SELECT m.event_id, o.op, s.step FROM (SELECT event_id FROM {within(memory)}) m "
                f"LEFT JOIN {within(names)} o USING (event_id) LEFT JOIN {within(steps)} s USING (event_id) "
                "ORDER BY m.event_id")

    with memory_share(con, SIDE_SHARE):
        ranges = id_ranges(con, "mem_n", max(memory_limit(con) // FACTS_BYTES_PER_ROW, 1))
        if len(ranges) <= 1:
            con.execute(f"COPY ({joined(sql_literal(str(parts / OPS_GLOB)))}) TO {sql_literal(str(out))} "
                        f"(FORMAT parquet, COMPRESSION lz4, ROW_GROUP_SIZE {rows})")
            return
        con.execute(f"COPY (SELECT event_id, op FROM read_parquet({sql_literal(str(parts / OPS_GLOB))}) "
                    f"ORDER BY event_id) TO {sql_literal(str(ops))} "
                    f"(FORMAT parquet, COMPRESSION lz4, ROW_GROUP_SIZE {rows})")
        writer: pq.ParquetWriter | None = None
        try:
            for first, stop in ranges:
                reader = con.sql(joined(sql_literal(str(ops)), first, stop)).to_arrow_reader(rows)
                if writer is None:
                    writer = pq.ParquetWriter(out, reader.schema, compression="lz4")
                for batch in reader:
                    writer.write_batch(batch)
        except BaseException:
            if writer is not None:
                writer.close()
            out.unlink(missing_ok=True)
            raise
        if writer is not None:
            writer.close()
    ops.unlink()
