"""The memory instants' op and step, written in event-id order for the merge of the final table.

Where a trace's memory instants are in time order in the file (a thread's allocator writes them as they happen)
the final ``memory_events`` table is a merge of the parts in file order with each instant's op and step
(``kineto_sql_tables._write_merged``), which wants those facts sorted by event id. The native sweep found each
instant's op id already (``mem_op_ids.parquet``, in the sweep's order: :mod:`.kineto_nesting`); here the facts are
put in the instants' own order in numpy, the ops named by one lookup of their ids among the host events, and the
steps found by a search of the disjoint step spans (:func:`.kineto_scan.step_spans`, the rule of
``kineto_sql_facts.step_spans``): no join is sorted, and no sort of the facts follows (docs/architecture.md,
"Memory instants").
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tracelake.contracts.schema import sql_literal

from . import kineto_scan, kineto_sql_tables

#: The memory instants' facts, by event id, for the merge of the final table.
FACTS_SCHEMA = pa.schema([("event_id", pa.int64()), ("op", pa.string()), ("step", pa.int64())])


def in_time_order(parts: Path) -> tuple[np.ndarray, np.ndarray] | None:
    """The event ids and times of the memory instants in ``parts``, in the order of their files, where that is the
    order of time (then of event id, which must grow) and every one has a time; else None."""
    ids: list[np.ndarray] = []
    times: list[np.ndarray] = []
    last_ts, last_id = None, None
    for path in kineto_sql_tables.part_files(parts, "memory"):
        table = pq.ParquetFile(path).read(columns=["event_id", "ts_ns"])
        if table.num_rows == 0:
            continue
        if table["ts_ns"].null_count or table["event_id"].null_count:
            return None
        ts, id_ = table["ts_ns"].to_numpy(), table["event_id"].to_numpy()
        if (np.diff(ts) < 0).any() or (np.diff(id_) <= 0).any():
            return None
        if last_ts is not None and (ts[0] < last_ts or id_[0] <= last_id):
            return None
        last_ts, last_id = ts[-1], id_[-1]
        ids.append(id_)
        times.append(ts)
    if not ids:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.concatenate(ids), np.concatenate(times)


def steps_at(steps: pa.Table, times: np.ndarray) -> pa.Array:
    """The step of each time (``steps``: ``step, ts_ns, dur_ns``): that of the span of :func:`.kineto_scan.step_spans`
    holding it, null where none does; what an ASOF join on the spans' starts, then ``t < end``, gives."""
    starts, ends, numbers = kineto_scan.step_spans(steps)
    if not len(starts):
        return pa.nulls(len(times), pa.int64())
    at = np.searchsorted(starts, times, side="right") - 1
    found = np.maximum(at, 0)
    return pa.array(numbers[found], mask=(at < 0) | (times >= ends[found]))


def write_by_id(con: duckdb.DuckDBPyConnection, parts: Path, ids: np.ndarray, times: np.ndarray, out: Path) -> None:
    """``out``: each instant's ``event_id`` (``ids``, growing, with ``times``), ``op`` (the name of the host event
    ``mem_op_ids.parquet`` gives it, null where none) and ``step``, in that order.

    The op names come from the host parts, read by DuckDB for the ids named only (a semi join).
    """
    op_ids = parts / "mem_op_ids.parquet"
    swept = pq.read_table(op_ids)
    order = np.argsort(swept["event_id"].to_numpy(), kind="stable")
    ops = np.append(swept["op_id"].fill_null(-1).to_numpy()[order], -1)  # -1: none (event ids are never negative)
    op_of = ops[_find(swept["event_id"].to_numpy()[order], ids)]  # an instant the sweep left out (no thread): none
    names = con.sql(f"SELECT h.event_id, h.name FROM read_parquet({sql_literal(str(parts / 'host-*.parquet'))}) h "
                    f"SEMI JOIN read_parquet({sql_literal(str(op_ids))}) o ON h.event_id = o.op_id "
                    "ORDER BY h.event_id").to_arrow_table() if any(parts.glob("host-*.parquet")) else None
    if names is None or not names.num_rows:
        op = pa.nulls(len(ids), pa.string())
    else:
        at = _find(names["event_id"].to_numpy(), op_of)
        missing = at == names.num_rows
        op = names["name"].combine_chunks().take(pa.array(np.where(missing, 0, at), mask=missing))
    steps = con.sql("SELECT step, ts_ns, dur_ns FROM steps").to_arrow_table()
    table = pa.table([pa.array(ids, pa.int64()), op, steps_at(steps, times)], schema=FACTS_SCHEMA)
    pq.write_table(table, out, compression="lz4", use_dictionary=["op"])


def _find(keys: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """The position of each of ``wanted`` in the sorted ``keys``; ``len(keys)`` where it is not there."""
    at = np.searchsorted(keys, wanted)
    inside = at < len(keys)
    hit = np.zeros(len(wanted), dtype=bool)
    hit[inside] = keys[at[inside]] == wanted[inside]
    return np.where(hit, at, len(keys))
