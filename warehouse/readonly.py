"""Untrusted read-only SQL over the warehouse views: the engine behind ``POST /api/v1/sql``.

A query from the network runs behind four layers, each of which would stop most
attacks alone:

1. Statement check. Exactly one statement, and it must be a query: ``SELECT``,
   ``WITH ... SELECT``, ``VALUES``, ``FROM``-first, ``TABLE``, ``DESCRIBE``,
   ``SUMMARIZE``, ``SHOW``, ``PIVOT ... IN (...)``, or a plain ``EXPLAIN`` of one
   of these (it shows the plan and runs nothing). ``EXPLAIN ANALYZE`` runs the
   statement it wraps, so it is refused, as is every other statement type
   (``COPY``, ``ATTACH``, ``INSTALL``, ``SET``, ``PRAGMA``, ``CALL``, ...).
2. Parse-tree check. DuckDB classifies ``WITH x AS (COPY ... TO 'f') SELECT 1``
   as a SELECT and runs the COPY (likewise INSERT, UPDATE and DELETE in a CTE), so
   the tree from ``json_serialize_sql`` may hold query nodes only. The table
   functions that run SQL given as text (``query``, ``json_execute_serialized_sql``)
   are refused: their text is a string the tree check cannot see, and
   ``json_execute_serialized_sql`` runs a serialised data-modifying CTE.
3. DuckDB's switches, set before ``lock_configuration``: files only under the
   warehouse's ``tables/`` folder (the views' Parquet), no external access, no
   spilling to disk (the memory limit is a hard cap, and nothing gets written), no
   extension install or autoload, no persistent secrets, and the directories that
   default to ``$HOME`` moved out of sight. The Python client has no ``getenv``, so
   nothing reads the environment (where the API tokens live).
4. Limits: the memory limit and threads above, a timer that interrupts the query,
   and at most ``max_rows + 1`` rows fetched from a streaming result.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from typing import Any

import duckdb

from . import catalog
from .errors import InvalidArgument, QueryError, WarehouseError
from .results import QueryResult
from .schema import sql_literal
from .store import Store

log = logging.getLogger(__name__)

#: Query-node types of DuckDB's parse tree that only read; COPY_QUERY_NODE, INSERT_QUERY_NODE,
#: STATEMENT_NODE and any type a later DuckDB adds are refused.
_READING_NODES = frozenset({"SELECT_NODE", "SET_OPERATION_NODE", "RECURSIVE_CTE_NODE", "CTE_NODE"})
#: Table functions whose argument is SQL text, which the parse-tree check cannot look into.
_SQL_TEXT_FUNCTIONS = frozenset({"query", "json_execute_serialized_sql"})
#: Where the settings that default to paths under ``$HOME`` point instead (never created).
_NOWHERE = "/nonexistent/tracelake-sql-sandbox"

_LEADING_WORD = re.compile(r"(?:\s+|--[^\n]*(?:\n|$)|/\*.*?\*/)*([A-Za-z_]+)", re.DOTALL)
_EXPLAIN = re.compile(r"(?:\s+|--[^\n]*(?:\n|$)|/\*.*?\*/)*explain\s", re.DOTALL | re.IGNORECASE)
_ONLY = "only one SELECT query is allowed"
_EXPLAIN_ONLY = "EXPLAIN is allowed only as a plain `EXPLAIN <SELECT query>` (EXPLAIN ANALYZE runs what it wraps)"


def readonly_query(
    store: Store, sql: str, *, max_rows: int, timeout_seconds: float, memory_limit: str, threads: int
) -> QueryResult:
    """Run one untrusted read-only query over the warehouse views in a sandboxed DuckDB connection.

    Args:
        store: The warehouse whose tables the views read.
        sql: One query (see the module docstring for what counts as one).
        max_rows: Most rows returned; with more, the result is marked ``truncated``.
        timeout_seconds: The query is cancelled when it runs longer.
        memory_limit: DuckDB memory limit of the query, e.g. ``"1GB"``; nothing spills to disk.
        threads: DuckDB threads of the query.

    Returns:
        The columns, DuckDB type names and up to ``max_rows`` rows.

    Raises:
        QueryError: The SQL is not one read-only query, does not parse (DuckDB's
            message), fails, or ran past ``timeout_seconds``.
        InvalidArgument: A limit is unusable (they come from the server's settings).
        WarehouseError: The views over the warehouse's tables cannot be created.
    """
    if max_rows < 1:
        raise InvalidArgument(f"TRACELAKE_SQL_MAX_ROWS={max_rows} must be at least 1")
    if not timeout_seconds > 0:
        raise InvalidArgument(f"TRACELAKE_SQL_TIMEOUT_SECONDS={timeout_seconds} must be more than 0")
    if threads < 1:
        raise InvalidArgument(f"TRACELAKE_THREADS={threads} must be at least 1")
    query, explain = _single_query(sql)
    started = time.perf_counter()
    con = duckdb.connect()
    try:
        _check_tree(con, query)
        _sandbox(con, store, memory_limit=memory_limit, threads=threads)
        result = _run(con, f"EXPLAIN {query}" if explain else query, max_rows, timeout_seconds)
    finally:
        con.close()
    log.debug("read-only query: %d rows in %.3f s", len(result.rows), time.perf_counter() - started)
    return result


def _statements(sql: str) -> list[duckdb.Statement]:
    """DuckDB's split of ``sql`` into statements; a parse error becomes a :class:`QueryError`."""
    try:
        return list(duckdb.extract_statements(sql))
    except duckdb.Error as exc:
        raise QueryError(str(exc).strip()) from None


def _kind(statement: duckdb.Statement) -> duckdb.StatementType | None:
    """The statement's type; None for one the Python client has no name for (``UPDATE EXTENSIONS``)."""
    try:
        return statement.type
    except ValueError:
        return None


def _leading_word(text: str) -> str | None:
    found = _LEADING_WORD.match(text)
    return found.group(1).upper() if found else None


def _single_query(sql: str) -> tuple[str, bool]:
    """The text of the one query in ``sql`` and whether to EXPLAIN it, or a :class:`QueryError`."""
    statements = _statements(sql)
    if not statements:
        raise QueryError(f"empty SQL query: {_ONLY}")
    if len(statements) > 1:
        raise QueryError(f"{_ONLY}; got {len(statements)} statements")
    statement = statements[0]
    kind = _kind(statement)
    if kind == duckdb.StatementType.SELECT:
        return statement.query, False
    if kind == duckdb.StatementType.EXPLAIN:
        # Rebuilt from a checked SELECT, so what runs is the plain EXPLAIN of that query.
        found = _EXPLAIN.match(statement.query)
        try:
            inner = _statements(statement.query[found.end() :]) if found else []
        except QueryError:
            inner = []
        if len(inner) != 1 or _kind(inner[0]) != duckdb.StatementType.SELECT:
            raise QueryError(_EXPLAIN_ONLY)
        return inner[0].query, True
    if kind == duckdb.StatementType.MULTI:
        raise QueryError(
            f"{_ONLY}; got a PIVOT without an IN list, which DuckDB runs as several statements "
            "(name the pivot values: PIVOT t ON c IN ('a', 'b') USING ...)"
        )
    word = _leading_word(statement.query)
    if word in (None, "WITH", "SELECT", "FROM"):
        word = kind.name if kind is not None else "a statement of an unknown type"
    raise QueryError(f"{_ONLY}; got {word}")


def _check_tree(con: duckdb.DuckDBPyConnection, query: str) -> None:
    """Refuse data-modifying CTEs and SQL-text table functions anywhere in ``query``'s parse tree."""
    row = con.execute("SELECT json_serialize_sql(?)", [query]).fetchone()
    try:
        tree = json.loads(row[0]) if row else {"error": True}
    except (ValueError, RecursionError):
        raise QueryError("the query is nested too deeply to check") from None
    if tree.get("error"):
        raise QueryError(str(tree.get("error_message") or "the query cannot be checked").strip())
    stack: list[Any] = [tree.get("statements")]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            kind = item.get("type")
            if isinstance(kind, str) and kind.endswith("_NODE") and kind not in _READING_NODES:
                label = kind.removesuffix("_NODE").removesuffix("_QUERY")
                raise QueryError(f"{_ONLY}; got {label} inside the query (e.g. WITH x AS ({label} ...) SELECT ...)")
            name = item.get("function_name")
            if isinstance(name, str) and name.lower() in _SQL_TEXT_FUNCTIONS:
                raise QueryError(f"{name}() is not allowed here: it runs SQL text, which cannot be checked")
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _sandbox(con: duckdb.DuckDBPyConnection, store: Store, *, memory_limit: str, threads: int) -> None:
    """Create the views, then confine ``con`` to reading the warehouse's tables and lock its settings."""
    try:
        for statement in catalog.view_statements(store):
            con.execute(statement)
    except duckdb.Error as exc:
        raise WarehouseError(f"cannot create the views over {store.tables}: {str(exc).strip()}") from None
    try:
        con.execute(f"SET memory_limit = {sql_literal(memory_limit)}")
    except duckdb.Error as exc:
        raise InvalidArgument(
            f"TRACELAKE_SQL_MEMORY_LIMIT={memory_limit!r} is not a DuckDB memory size: {exc}"
        ) from None
    for statement in (
        f"SET threads = {int(threads)}",
        f"SET allowed_directories = [{sql_literal(str(store.tables))}]",
        # The default temp_directory is '.tmp' under the server's working directory, which
        # DuckDB would add to the allowed directories; without one nothing spills.
        "SET temp_directory = ''",
        "SET autoinstall_known_extensions = false",
        "SET autoload_known_extensions = false",
        "SET allow_persistent_secrets = false",
        # Their defaults are paths under $HOME, which current_setting() and error messages show.
        f"SET home_directory = {sql_literal(_NOWHERE)}",
        f"SET secret_directory = {sql_literal(_NOWHERE)}",
        f"SET extension_directory = {sql_literal(_NOWHERE)}",
        "SET enable_external_access = false",
        "SET lock_configuration = true",
    ):
        con.execute(statement)


def _run(con: duckdb.DuckDBPyConnection, query: str, max_rows: int, timeout_seconds: float) -> QueryResult:
    """Run ``query`` under a timer that interrupts it, fetching at most ``max_rows + 1`` rows."""
    fired = threading.Event()

    def cancel() -> None:
        fired.set()
        con.interrupt()

    timer = threading.Timer(timeout_seconds, cancel)
    timer.daemon = True
    timer.start()
    try:
        result = con.execute(query)  # streams: rows are computed as they are fetched
        description = result.description or []
        rows = result.fetchmany(max_rows + 1)
    except duckdb.Error as exc:
        if fired.is_set():
            raise QueryError(
                f"query cancelled after {timeout_seconds:g} s (the limit is TRACELAKE_SQL_TIMEOUT_SECONDS)"
            ) from None
        raise QueryError(str(exc).strip()) from None
    finally:
        timer.cancel()
        timer.join()  # never interrupt a connection that is being closed
    return QueryResult(
        columns=[d[0] for d in description],
        types=[str(d[1]) for d in description],
        rows=rows[:max_rows],
        truncated=len(rows) > max_rows,
    )
