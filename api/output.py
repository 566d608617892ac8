"""Rendering query results for the terminal: table, CSV or JSON."""

from __future__ import annotations

import base64
import csv
import datetime as dt
import decimal
import io
import json
import math
from enum import Enum
from typing import Any

from rich.table import Table
from rich.text import Text

from tracelake.warehouse.results import QueryResult


class OutputFormat(str, Enum):
    """How ``tracelake sql`` and ``tracelake traces`` print rows."""

    table = "table"
    csv = "csv"
    json = "json"


def jsonable(value: Any) -> Any:
    """A DuckDB or polars value as strict JSON holds it: dicts, lists, str, int, finite float, bool or None.

    NaN and infinities become ``None`` (JSON has no such numbers), bytes base64 as in the
    API's SQL answers (wherever they are, map keys too), datetimes ISO 8601, decimals
    numbers, UUIDs and anything else their text.
    """
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return jsonable(float(value))
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, dict):
        return {_key(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return str(value)  # UUIDs, intervals, ...: their text, as the table and CSV show them


def _key(key: Any) -> str:
    """A dict key as JSON text: a string as it is, anything else as its JSON form (``null``, ``1.5``, base64 bytes)."""
    value = jsonable(key)
    return value if isinstance(value, str) else json.dumps(value)


def to_json(result: QueryResult) -> str:
    """Rows as a JSON array of objects; strict JSON (NaN and infinities are ``null``)."""
    rows = [{c: jsonable(v) for c, v in zip(result.columns, row)} for row in result.rows]
    return json.dumps(rows, indent=2, allow_nan=False)


def to_csv(result: QueryResult) -> str:
    """Rows as CSV with a header line."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(result.columns)
    for row in result.rows:
        writer.writerow([_csv_cell(v) for v in row])
    return buf.getvalue()


def _csv_cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, float):
        return value  # CSV has no rule against nan and inf: written as they are
    jv = jsonable(value)
    return json.dumps(jv) if isinstance(jv, dict | list) else jv


def to_table(result: QueryResult, title: str | None = None, max_rows: int = 1000) -> Table:
    """Rows as a rich table (at most ``max_rows``, with a note of how many were left out)."""
    table = Table(title=title, show_lines=False, header_style="bold")
    for name, type_ in zip(result.columns, result.types):
        numeric = any(t in type_.upper() for t in ("INT", "DOUBLE", "DECIMAL", "FLOAT", "HUGEINT"))
        table.add_column(name, justify="right" if numeric else "left", overflow="fold")
    for row in result.rows[:max_rows]:
        # Text cells: values are data, never rich markup ("[bold]" in a kernel name stays as it is).
        table.add_row(*(Text("" if v is None else _cell(v)) for v in row))
    if len(result.rows) > max_rows:
        table.caption = f"{len(result.rows) - max_rows} more rows not shown (use --format csv or json)"
    return table


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}".rstrip("0").rstrip(".") if abs(value) < 1e15 else f"{value:g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    jv = jsonable(value)
    return json.dumps(jv) if isinstance(jv, dict | list) else str(jv)
