"""Tables computed across a run when its job is analysed, stored with the run's traces: ``critical_path``.

A run's critical path needs every rank, so it cannot be computed when one rank's trace comes in: ingest
writes an empty file for each trace (``warehouse/derived.py``) and an analysis of the whole job writes each
rank's stretches into its trace's file (docs/schema.md, ``critical_path``). Each file is replaced atomically,
under the write lock and only while its trace is registered, like the other derived tables.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq

from tracelake.contracts import schema

from .store import Store, temp_name

log = logging.getLogger(__name__)

#: Tables computed across a run when its job is analysed: ingest writes them empty, and recomputing a trace's
#: derived tables keeps what an analysis stored (``staging.publish_derived``).
PER_RUN = ("critical_path",)


def store_critical_path(store: Store, pairs: Sequence[tuple[str, str]], path: pl.DataFrame, run: str | None,
                        ranks: int) -> None:
    """Write the run's path stretches (:data:`tracelake.analysis.critical_path.PATH_COLUMNS`) into the
    ``critical_path`` file of each of its traces. A warehouse that cannot be written (read-only) keeps what it
    has: the analysis itself does not depend on it."""
    tbl = schema.table("critical_path")
    rows = path.rename({"start_ns": "ts_ns"}).with_columns(pl.lit(run, pl.String).alias("run"),
                                                           pl.lit(ranks, pl.Int32).alias("ranks"))
    written: list[tuple[str, str, Path]] = []
    try:
        for job, trace_id in pairs:  # written beside their targets first; the lock is held for the renames only
            target = store.path(tbl.name, job, trace_id)
            mine = rows.filter(pl.col("trace_id") == trace_id).select(tbl.column_names)
            if _unchanged(target, mine):
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            scratch = temp_name(target)
            written.append((job, trace_id, scratch))
            pq.write_table(mine.to_arrow().cast(tbl.arrow_schema), scratch, compression="zstd")
        with store.write_lock() as held:
            for job, trace_id, scratch in written if held else []:
                if store.registered_job(trace_id) == job:
                    os.replace(scratch, store.path(tbl.name, job, trace_id))
    except OSError as exc:
        log.warning("critical_path not stored for %d trace(s): %s", len(pairs), exc)
    finally:
        for _, _, scratch in written:
            try:
                scratch.unlink(missing_ok=True)
            except OSError:
                pass


def _unchanged(target: Path, rows: pl.DataFrame) -> bool:
    """Whether ``target`` already holds ``rows`` (a job analysed again with nothing new: nothing is written)."""
    try:
        with open(target, "rb") as file:  # one open: the file may be replaced by another analysis meanwhile
            held = pl.read_parquet(file)
    except (OSError, pl.exceptions.PolarsError):
        return False
    return held.height == rows.height and held.equals(rows.cast(held.schema, strict=False))
