"""``tracelake sql``: one read-only SQL query over the warehouse."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tracelake.contracts.schema import TABLES

from ..output import OutputFormat
from .root import FormatOption, HomeOption, app, err_console, exit_on_error, open_warehouse, print_result


@app.command()
@exit_on_error
def sql(
    query: Annotated[str, typer.Argument(help=f"One SELECT over the tables: {', '.join(TABLES)} (docs/schema.md; "
                                              "your own files too: read_parquet('x.parquet')).", show_default=False)],
    fmt: FormatOption = OutputFormat.table,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write the result to this .parquet, .csv or "
                                             ".json file (DuckDB's COPY) instead of printing it.",
                                             show_default=False)] = None,
    home: HomeOption = None,
) -> None:
    """Run one SQL query over the warehouse (DuckDB dialect); it can read, never change, the warehouse.

    Queries run with the API's checks in a process that may write nothing: COPY, ATTACH,
    CREATE and the like are refused (export with --out).
    """
    result = open_warehouse(home, existing=True).query_local(query, out=out)
    if out is not None:
        err_console.print(f"wrote {result.rows[0][0]} rows to {result.rows[0][1]}", highlight=False, markup=False)
        return
    print_result(result, fmt)
