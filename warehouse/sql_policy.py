"""The first wall around untrusted SQL: one reading statement whose parse tree holds only allow-listed parts.

Everything is an allow-list, checked on DuckDB's own parse tree (``json_serialize_sql``):

* the statement: exactly one, and a query (``SELECT``, ``WITH``, ``VALUES``, ``FROM``-first,
  ``TABLE``, ``DESCRIBE``, ``SUMMARIZE``, ``SHOW``, ``PIVOT ... IN (...)``) or a plain
  ``EXPLAIN`` of one; every other statement type is refused;
* every node of its tree, at any depth: query nodes, table references, result modifiers
  and expression classes from fixed sets (a data-modifying CTE is a ``COPY``/``INSERT``
  node: not in the set);
* every function call by name (:mod:`.sql_functions`): scalar, aggregate and window
  functions that read nothing and run nothing, table functions that generate rows or list
  the catalog. A function that takes SQL text or a serialized plan is never on the list,
  so no string is ever parsed as SQL later;
* every table read by name: the warehouse's views and the query's own CTEs (the API), or
  anything (the CLI, whose user may read their own files).

A query this module passes still runs behind a second, independent wall
(:mod:`.sql_sandbox`). See docs/security.md, "SQL".
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tracelake.contracts.errors import QueryError
from tracelake.contracts.lazy import duckdb

from .sql_functions import FILE_TABLE_FUNCTIONS, FUNCTIONS, TABLE_FUNCTIONS

#: Query nodes that only read. COPY_QUERY_NODE, INSERT_QUERY_NODE, STATEMENT_NODE and any later type are refused.
QUERY_NODES = frozenset({"SELECT_NODE", "SET_OPERATION_NODE", "RECURSIVE_CTE_NODE", "CTE_NODE"})
#: Table references.
TABLE_REFS = frozenset({"BASE_TABLE", "JOIN", "SUBQUERY", "TABLE_FUNCTION", "EXPRESSION_LIST", "PIVOT",
                        "SHOW_REF", "EMPTY"})
#: Result modifiers (ORDER BY, LIMIT, DISTINCT) and the directions of ORDER BY terms.
MODIFIERS = frozenset({"ORDER_MODIFIER", "LIMIT_MODIFIER", "LIMIT_PERCENT_MODIFIER", "DISTINCT_MODIFIER",
                       "ASCENDING", "DESCENDING", "ORDER_DEFAULT"})
#: Expression classes (every call inside one is checked by name).
EXPRESSIONS = frozenset({"FUNCTION", "CONSTANT", "COLUMN_REF", "CAST", "COMPARISON", "CONJUNCTION", "OPERATOR",
                         "CASE", "SUBQUERY", "WINDOW", "STAR", "LAMBDA", "LAMBDA_REF", "BETWEEN", "COLLATE",
                         "PARAMETER", "POSITIONAL_REFERENCE", "TYPE"})
#: What ``SHOW`` lists (``SHOW TABLES``, ``SHOW ALL TABLES``, ``SHOW DATABASES``).
SHOW_SPECIAL = frozenset({'"tables"', "__show_tables_expanded", '"databases"'})
#: Qualifiers a function or table may carry: the built-in catalogs and schemas only.
CATALOGS = frozenset({"", "system", "memory", "temp"})
SCHEMAS = frozenset({"", "main", "pg_catalog"})
#: A CTE name: a plain identifier, so that no out-of-scope use of it can name a file.
_CTE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")

_LEADING_WORD = re.compile(r"(?:\s+|--[^\n]*(?:\n|$)|/\*.*?\*/)*([A-Za-z_]+)", re.DOTALL)
_EXPLAIN = re.compile(r"(?:\s+|--[^\n]*(?:\n|$)|/\*.*?\*/)*explain\s", re.DOTALL | re.IGNORECASE)
ONLY = "only one SELECT query is allowed"
_EXPLAIN_ONLY = "EXPLAIN is allowed only as a plain `EXPLAIN <SELECT query>` (EXPLAIN ANALYZE runs what it wraps)"


@dataclass(frozen=True)
class Policy:
    """What a query may name: functions, table functions and tables (None: any table or file)."""

    name: str
    functions: frozenset[str]
    table_functions: frozenset[str]
    tables: frozenset[str] | None

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly form (sent to a worker process)."""
        return {"name": self.name, "functions": sorted(self.functions),
                "table_functions": sorted(self.table_functions),
                "tables": None if self.tables is None else sorted(self.tables)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Policy:
        """The policy :meth:`as_dict` wrote."""
        tables = data.get("tables")
        return cls(str(data["name"]), frozenset(data["functions"]), frozenset(data["table_functions"]),
                   None if tables is None else frozenset(tables))


def api_policy(views: Iterable[str]) -> Policy:
    """Untrusted queries from the network: the warehouse's ``views``, generators and catalog listings only."""
    return Policy("api", FUNCTIONS, TABLE_FUNCTIONS, frozenset(v.lower() for v in views))


#: ``tracelake sql``: its user may also read their own files (read_parquet, 'file.csv', ...).
LOCAL = Policy("local", FUNCTIONS, TABLE_FUNCTIONS | FILE_TABLE_FUNCTIONS, None)


def single_query(sql: str) -> tuple[str, bool]:
    """The text of the one query in ``sql`` and whether to EXPLAIN it.

    Raises:
        QueryError: ``sql`` is empty, holds several statements, does not parse, or is not a query.
    """
    statements = _statements(sql)
    if not statements:
        raise QueryError(f"empty SQL query: {ONLY}")
    if len(statements) > 1:
        raise QueryError(f"{ONLY}; got {len(statements)} statements")
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
            f"{ONLY}; got a PIVOT without an IN list, which DuckDB runs as several statements "
            "(name the pivot values: PIVOT t ON c IN ('a', 'b') USING ...)"
        )
    found_word = _LEADING_WORD.match(statement.query)
    word = found_word.group(1).upper() if found_word else None
    if word in (None, "WITH", "SELECT", "FROM"):
        word = kind.name if kind is not None else "a statement of an unknown type"
    hint = " (to save a result, use `tracelake sql --out FILE`)" if word == "COPY" else ""
    raise QueryError(f"{ONLY}; got {word}{hint}")


def check_tree(con: duckdb.DuckDBPyConnection, query: str, policy: Policy) -> None:
    """Refuse ``query`` unless every node, function and table of its parse tree is allowed by ``policy``.

    ``con`` only parses (``json_serialize_sql`` runs nothing).

    Raises:
        QueryError: naming the first part that is not allowed, or saying why the tree cannot be checked.
    """
    row = con.execute("SELECT json_serialize_sql(?)", [query]).fetchone()
    try:
        tree = json.loads(row[0]) if row else {"error": True}
    except (ValueError, RecursionError):
        raise QueryError("the query is nested too deeply to check") from None
    if tree.get("error"):
        message = str(tree.get("error_message") or "the query cannot be checked").strip()
        if "Only SELECT statements" in message:
            message = "this kind of query cannot be checked (a PIVOT inside a subquery?): write it as a plain SELECT"
        raise QueryError(message)
    _Walker(policy).walk(tree.get("statements"))


class _Walker:
    """One pass over a serialized parse tree, refusing at the first part the policy does not allow."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.ctes: set[str] = set()

    def walk(self, root: Any) -> None:
        # CTE names first: a reference may come before the CTE in the serialized order.
        self._collect_ctes(root)
        stack: list[tuple[Any, bool]] = [(root, False)]
        while stack:
            item, table_function = stack.pop()
            if isinstance(item, list):
                stack.extend((value, table_function) for value in item)
            elif isinstance(item, dict):
                self._node(item, table_function)
                for key, value in item.items():
                    # the expression of a TABLE_FUNCTION ref is a table function call
                    stack.append((value, key == "function" and item.get("type") == "TABLE_FUNCTION"))

    def _collect_ctes(self, root: Any) -> None:
        stack: list[Any] = [root]
        while stack:
            item = stack.pop()
            if isinstance(item, list):
                stack.extend(item)
            elif isinstance(item, dict):
                cte_map = item.get("cte_map")
                if isinstance(cte_map, dict):
                    for entry in cte_map.get("map") or []:
                        name = entry.get("key") if isinstance(entry, dict) else None
                        if not isinstance(name, str) or not _CTE_NAME.match(name):
                            raise QueryError(f"CTE name {name!r} is not allowed: use a plain name (letters, "
                                             "digits, '_')")
                        self.ctes.add(name.lower())
                stack.extend(item.values())

    def _node(self, node: dict[str, Any], table_function: bool) -> None:
        cls = node.get("class")
        kind = node.get("type")
        if isinstance(cls, str):
            if cls not in EXPRESSIONS:
                raise QueryError(f"{_label(cls)} expressions are not allowed here")
        elif isinstance(kind, str) and kind not in QUERY_NODES | TABLE_REFS | MODIFIERS:
            label = _label(kind.removesuffix("_NODE").removesuffix("_QUERY"))
            raise QueryError(f"{ONLY}; got {label} inside the query (e.g. WITH x AS ({label} ...) SELECT ...)")
        name = node.get("function_name")
        if isinstance(name, str):
            self._function(name, node, table_function)
        if kind == "BASE_TABLE":
            self._table(node)
        elif kind == "SHOW_REF" and "query" not in node:
            table = node.get("table_name")
            if node.get("show_type") == "SHOW_SPECIAL" and table in SHOW_SPECIAL:
                return
            self._table(node)

    def _function(self, name: str, node: dict[str, Any], table_function: bool) -> None:
        catalog, schema_name = node.get("catalog") or "", node.get("schema") or ""
        allowed = self.policy.table_functions if table_function else self.policy.functions
        what = "table function" if table_function else "function"
        if catalog.lower() not in CATALOGS or schema_name.lower() not in SCHEMAS:
            raise QueryError(f"{what} {catalog}.{schema_name}.{name}() is not allowed: call built-in functions "
                             "by their plain name")
        if name.lower() not in allowed and name not in allowed:
            raise QueryError(f"{what} {name}() is not allowed here (the allowed functions are listed in "
                             "docs/security.md; those that read files, run SQL text or change state never are)")

    def _table(self, node: dict[str, Any]) -> None:
        name = node.get("table_name")
        catalog, schema_name = node.get("catalog_name") or "", node.get("schema_name") or ""
        if self.policy.tables is None:
            return
        if not isinstance(name, str) or catalog.lower() not in CATALOGS or schema_name.lower() not in SCHEMAS:
            raise QueryError(f"table {name!r} is not allowed here: read the warehouse's views "
                             f"({', '.join(sorted(self.policy.tables))})")
        if name.lower() not in self.policy.tables and name.lower() not in self.ctes:
            raise QueryError(f"table {name!r} is not allowed here: only the warehouse's views "
                             f"({', '.join(sorted(self.policy.tables))}) and the query's own CTEs can be read")


def _label(kind: str) -> str:
    return kind.replace("_", " ")


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


__all__ = ["LOCAL", "api_policy", "ONLY", "Policy", "check_tree", "single_query"]
