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

import json
import logging
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

from tracelake.contracts import schema
from tracelake.contracts.errors import WarehouseError
from tracelake.contracts.lazy import duckdb
from tracelake.contracts.schema import sql_literal

from .store import Store, temp_name

log = logging.getLogger(__name__)

#: The DuckDB shell from PyPI (duckdb-cli 1.5) reads storage up to this version.
STORAGE_VERSION = "v1.5.0"



def _scan(files: str) -> str:
    return (
        f"read_parquet({files}, hive_partitioning = true, "
        "hive_types = {'job': VARCHAR}, union_by_name = true)"
    )


def view_statements(store: Store, prefix: str = "") -> list[str]:
    """``CREATE VIEW`` statements for every table over the whole warehouse, reading absolute paths.

    Data views keep only the rows of registered traces (a semi-join on ``traces`` by
    job and trace id), so files published by an ingest that died before registering,
    or left by a delete that died half way, are never seen, not even beside a later
    registration of the same trace under another job.
    """
    statements = [
        f"CREATE OR REPLACE VIEW {prefix}traces AS "
        f"SELECT trace_id, job, * EXCLUDE (trace_id, job) FROM {_scan(sql_literal(store.glob('traces')))}"
    ]
    for name in schema.DATA_TABLES:
        statements.append(
            f"CREATE OR REPLACE VIEW {prefix}{name} AS SELECT data.* FROM {_scan(sql_literal(store.glob(name)))} "
            "AS data SEMI JOIN traces AS reg ON data.job = reg.job AND data.trace_id = reg.trace_id"
        )
    statements.append(
        f"CREATE OR REPLACE VIEW {prefix}tracelake_meta AS SELECT "
        f"{schema.SCHEMA_VERSION} AS schema_version, {sql_literal(str(store.home))} AS home"
    )
    return statements


def selection_view_statements(
    store: Store, traces: Sequence[tuple[str, str]], tables: Iterable[str] | None = None, *, temp: bool = False
) -> list[str]:
    """Views like :func:`view_statements`, over the files of the given ``(job, trace_id)`` pairs only.

    Binding a view reads the footer of every file it covers, so an analysis of one
    trace or job must not pay for the whole fleet; the traces are registered (the
    caller found their ``traces`` files), so no semi-join is needed either.
    With ``tables``, only those views; with ``temp``, temporary views (private
    to the connection).
    """
    statements = []
    kind = "TEMP VIEW" if temp else "VIEW"
    for name in schema.TABLES if tables is None else tables:
        files = [store.schema_file(name)] + [
            path for job, trace_id in traces if (path := store.path(name, job, trace_id)).exists()
        ]
        listed = "[" + ", ".join(sql_literal(str(f)) for f in files) + "]"
        columns = "trace_id, job, * EXCLUDE (trace_id, job)" if name == "traces" else "*"
        statements.append(f"CREATE OR REPLACE {kind} {name} AS SELECT {columns} FROM {_scan(listed)}")
    return statements


def _stamp(store: Store) -> str:
    return f"{schema.SCHEMA_VERSION}\n{store.home}\n"


def catalog_is_current(store: Store) -> bool:
    """True when the catalog file exists and matches this schema and location.

    The stamp file written beside the catalog answers without opening it (opening
    a DuckDB file costs tens of milliseconds, and every command checks).
    """
    if not store.catalog_path.exists():
        return False
    try:
        if store.catalog_stamp.read_text(encoding="utf-8") == _stamp(store):
            return True
    except (OSError, UnicodeDecodeError):
        pass
    try:
        with duckdb.connect(str(store.catalog_path), read_only=True) as con:
            row = con.execute("SELECT schema_version, home FROM tracelake_meta").fetchone()
    except duckdb.Error as exc:
        log.debug("catalog unreadable, rebuilding: %s", exc)
        return False
    if row != (schema.SCHEMA_VERSION, str(store.home)):
        return False
    try:
        _write_stamp(store)
    except OSError as exc:  # a read-only warehouse still works, it just checks the slow way
        log.debug("cannot write the catalog stamp: %s", exc)
    return True


def _write_stamp(store: Store) -> None:
    tmp = temp_name(store.catalog_stamp)
    try:
        tmp.write_text(_stamp(store), encoding="utf-8")
        os.replace(tmp, store.catalog_stamp)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_catalog(store: Store) -> None:
    """(Re)write ``tracelake.duckdb`` atomically, readable by the DuckDB 1.5 shell.

    Written under a hidden name of this process's (several processes may rewrite it
    at once: each renames a whole catalog into place); one left by a killed process
    is listed by ``tracelake check``. A process that has not loaded DuckDB has it written
    by a child (:mod:`.catalog_child`): an XLA or NCCL ingest into a new warehouse then
    never maps DuckDB's library (some 40 MB it would hold to its end).

    Raises:
        WarehouseError: the catalog could not be written; nothing is left behind.
    """
    tmp = temp_name(store.catalog_path)
    wal = tmp.with_name(tmp.name + ".wal")
    statements = [
        f"ATTACH {sql_literal(str(tmp))} AS catalog (STORAGE_VERSION '{STORAGE_VERSION}')",
        *view_statements(store, prefix="catalog."),
        "DETACH catalog",
    ]
    try:
        if "duckdb" in sys.modules or not sys.executable:  # loaded already, or no interpreter to start
            _run_here(statements)
        else:
            _run_in_child(statements, store.catalog_path)
        os.replace(tmp, store.catalog_path)
    except BaseException:
        for leftover in (tmp, wal):
            leftover.unlink(missing_ok=True)
        raise
    wal.unlink(missing_ok=True)
    _write_stamp(store)


def _run_here(statements: Sequence[str]) -> None:
    con = duckdb.connect()
    try:
        for statement in statements:
            con.execute(statement)
    finally:
        con.close()


#: The longest a child may take to write a catalog (a few dozen views: well under a second).
_CHILD_TIMEOUT_S = 120


def _run_in_child(statements: Sequence[str], target: Path) -> None:
    """Run ``statements`` in a :mod:`.catalog_child` process; a failure raises WarehouseError naming ``target``."""
    child = Path(__file__).with_name("catalog_child.py")
    try:
        done = subprocess.run([sys.executable, "-P", "-B", str(child)], input=json.dumps(list(statements)),
                              capture_output=True, text=True, timeout=_CHILD_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise WarehouseError(f"cannot write the DuckDB catalog {target}: {exc}") from exc
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or [f"exit status {done.returncode}"]
        raise WarehouseError(f"cannot write the DuckDB catalog {target}: {lines[-1]}")


def connect(store: Store, threads: int = 2) -> duckdb.DuckDBPyConnection:
    """An in-memory connection with a view per table over the whole warehouse, touching no lock on the catalog."""
    con = duckdb.connect(config={"threads": threads})
    for statement in view_statements(store):
        con.execute(statement)
    return con


_shared: dict[tuple[int, int], duckdb.DuckDBPyConnection] = {}
_shared_lock = threading.Lock()


def session(
    store: Store, traces: Sequence[tuple[str, str]], tables: Iterable[str] | None = None, *, threads: int = 2
) -> duckdb.DuckDBPyConnection:
    """A cursor on this process's shared in-memory database, with temporary views over ``traces`` only.

    Opening a DuckDB database costs more than most analysis queries, so one per
    process (and thread count) is kept; each session is a cursor of its own, whose
    views vanish when it is closed. Safe to use from several threads, a cursor each.
    """
    key = (os.getpid(), threads)  # a forked child must not reuse its parent's database
    with _shared_lock:
        db = _shared.get(key)
        if db is None:
            db = _shared[key] = duckdb.connect(config={"threads": threads})
    cursor = db.cursor()
    for statement in selection_view_statements(store, traces, tables, temp=True):
        cursor.execute(statement)
    return cursor


#: What a catalog might hold besides views, each ``(what, query listing its schema and name)``: none of it.
_OTHER_OBJECTS = (
    ("a table", "SELECT schema_name, table_name FROM duckdb_tables() WHERE database_name = 'catalog'"),
    ("a macro", "SELECT schema_name, function_name FROM duckdb_functions() WHERE database_name = 'catalog'"),
    ("a sequence", "SELECT schema_name, sequence_name FROM duckdb_sequences() WHERE database_name = 'catalog'"),
    ("a type", "SELECT schema_name, type_name FROM duckdb_types() WHERE database_name = 'catalog' AND NOT internal"),
    ("an index", "SELECT schema_name, index_name FROM duckdb_indexes() WHERE database_name = 'catalog'"),
    ("a schema", "SELECT '', schema_name FROM duckdb_schemas() "
                 "WHERE database_name = 'catalog' AND NOT internal AND schema_name <> 'main'"),
)
_VIEWS = "SELECT schema_name, view_name, sql FROM duckdb_views() WHERE database_name = 'catalog' AND NOT internal"
_EXCLUDE = re.compile(r"EXCLUDE \(([^()]*)\)")


def _normal_select(con: duckdb.DuckDBPyConnection, select: str) -> str | None:
    """A view's query as DuckDB prints it once parsed (never bound or run), or None when it is no query.

    ``EXCLUDE`` lists are sorted: DuckDB keeps them as sets, printed in any order.
    """
    try:
        row = con.execute("SELECT json_deserialize_sql(json_serialize_sql(?))", [select]).fetchone()
    except duckdb.Error:
        return None
    if row is None or not isinstance(row[0], str):
        return None
    text = " ".join(row[0].split())
    return _EXCLUDE.sub(lambda m: "EXCLUDE (" + ", ".join(sorted(m[1].split(", "))) + ")", text)


def catalog_differences(store: Store) -> list[tuple[str, str]]:
    """How ``tracelake.duckdb`` differs from what :func:`write_catalog` writes: ``(object, what)`` pairs.

    The catalog must open read-only and hold exactly the views of :func:`view_statements`,
    each with its definition (compared as parsed, never bound, so no data file is read),
    and nothing else: no table, macro, sequence, type, index or schema. A write-ahead log
    beside it is listed too (DuckDB would replay it on open). Empty when all is as written.
    """
    found: list[tuple[str, str]] = []
    wal = store.catalog_path.with_name(store.catalog_path.name + ".wal")
    if wal.exists() or wal.is_symlink():
        found.append((wal.name, "a write-ahead log beside the catalog, which tracelake never leaves"))
    if store.catalog_path.is_symlink() or not store.catalog_path.is_file():
        return [*found, (store.catalog_path.name, "missing (or not a regular file)")]
    con = duckdb.connect()
    try:
        expected: dict[str, str | None] = {}
        for statement in view_statements(store):
            head, _, select = statement.partition(" AS ")
            expected[head.split()[-1]] = _normal_select(con, select)
        try:
            con.execute(f"ATTACH {sql_literal(str(store.catalog_path))} AS catalog (READ_ONLY)")
            views = con.execute(_VIEWS).fetchall()
            others = [(kind, row) for kind, query in _OTHER_OBJECTS for row in con.execute(query).fetchall()]
        except duckdb.Error as exc:
            return [*found, (store.catalog_path.name, f"does not open read-only: {str(exc).strip()}")]
        present: set[str] = set()
        for schema_name, name, sql in views:
            if schema_name != "main" or name not in expected:
                found.append((f"{schema_name}.{name}", "a view tracelake does not create"))
                continue
            present.add(name)
            head = f"CREATE VIEW {name} AS "
            select = sql.strip().removesuffix(";")[len(head):] if sql.startswith(head) else ""
            if expected[name] is None or _normal_select(con, select) != expected[name]:
                shown = " ".join(sql.split())
                shown = shown if len(shown) <= 200 else shown[:200] + "..."
                found.append((name, f"view defined otherwise than tracelake writes it: {shown}"))
    finally:
        con.close()
    found += [(name, "view missing") for name in expected if name not in present]
    found += [(f"{schema_name}.{name}" if schema_name else name, f"{kind} tracelake does not create")
              for kind, (schema_name, name) in others]
    return found
