"""The DuckDB catalog: one view per warehouse table, over the Parquet files.

The catalog file ``tracelake.duckdb`` is for the DuckDB shell and other tools:

    duckdb -readonly ~/.tracelake/tracelake.duckdb -c "select count(*) from device_ops"

It is written once (and again when the schema or the warehouse location changes)
to a temporary name and renamed into place, so no process ever holds a write lock
on it: a shell or report reading it never blocks an ingest. Views read globs, so
new traces appear without touching the catalog. tracelake's own queries run on an
in-memory connection with the same views.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import duckdb

from . import schema
from .schema import sql_literal
from .store import Store

log = logging.getLogger(__name__)

#: The DuckDB shell from PyPI (duckdb-cli 1.5) reads storage up to this version.
STORAGE_VERSION = "v1.5.0"



def view_statements(store: Store, prefix: str = "") -> list[str]:
    """``CREATE VIEW`` statements for every table, reading absolute paths."""
    def scan(table: str) -> str:
        return (
            f"read_parquet({sql_literal(store.glob(table))}, hive_partitioning = true, "
            "hive_types = {'job': VARCHAR}, union_by_name = true)"
        )

    statements = [
        f"CREATE OR REPLACE VIEW {prefix}traces AS "
        f"SELECT trace_id, job, * EXCLUDE (trace_id, job) FROM {scan('traces')}"
    ]
    for name in schema.DATA_TABLES:
        statements.append(
            f"CREATE OR REPLACE VIEW {prefix}{name} AS SELECT * FROM {scan(name)} "
            "WHERE trace_id IN (SELECT trace_id FROM traces)"
        )
    statements.append(
        f"CREATE OR REPLACE VIEW {prefix}tracelake_meta AS SELECT "
        f"{schema.SCHEMA_VERSION} AS schema_version, {sql_literal(str(store.home))} AS home"
    )
    return statements


def catalog_is_current(store: Store) -> bool:
    """True when the catalog file exists, is readable and matches this schema and location."""
    if not store.catalog_path.exists():
        return False
    try:
        with duckdb.connect(str(store.catalog_path), read_only=True) as con:
            row = con.execute("SELECT schema_version, home FROM tracelake_meta").fetchone()
    except duckdb.Error as exc:
        log.debug("catalog unreadable, rebuilding: %s", exc)
        return False
    return row == (schema.SCHEMA_VERSION, str(store.home))


def write_catalog(store: Store) -> None:
    """(Re)write ``tracelake.duckdb`` atomically, readable by the DuckDB 1.5 shell."""
    tmp = store.catalog_path.with_name(f".{store.catalog_path.name}.{os.getpid()}.tmp")
    for leftover in (tmp, tmp.with_name(tmp.name + ".wal")):
        leftover.unlink(missing_ok=True)
    con = duckdb.connect()
    try:
        con.execute(f"ATTACH {sql_literal(str(tmp))} AS catalog (STORAGE_VERSION '{STORAGE_VERSION}')")
        for statement in view_statements(store, prefix="catalog."):
            con.execute(statement)
        con.execute("DETACH catalog")
    finally:
        con.close()
    os.replace(tmp, store.catalog_path)


def connect(store: Store, threads: int = 2) -> duckdb.DuckDBPyConnection:
    """An in-memory connection with every view, touching no lock on the catalog file."""
    con = duckdb.connect(config={"threads": threads})
    for statement in view_statements(store):
        con.execute(statement)
    return con
