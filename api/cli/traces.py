"""``tracelake traces``: the list of ingested traces."""

from __future__ import annotations

from typing import Annotated

import typer

from tracelake.warehouse.trace_ids import short_ids

from ..output import OutputFormat
from . import render
from .root import FormatOption, HomeOption, app, console, exit_on_error, open_warehouse, print_result


@app.command()
@exit_on_error
def traces(
    job: Annotated[str | None, typer.Option("--job", "-j", help="Only this job's traces.")] = None,
    fmt: FormatOption = OutputFormat.table,
    home: HomeOption = None,
) -> None:
    """List ingested traces.

    `ranks` are the ranks a trace holds: one for a PyTorch rank file, one per device of an XLA
    profile (as `analyze` shows them); `rank` is the lowest. In a narrow terminal the table shows
    unique id prefixes, which every command takes.
    """
    warehouse = open_warehouse(home, existing=True)
    result = warehouse.trace_listing(job)
    title = f"{len(result.rows)} traces in {warehouse.home}"
    if fmt is not OutputFormat.table:
        print_result(result, fmt, title=title)
        return
    rows = [dict(zip(result.columns, row)) for row in result.rows]
    for row in rows:
        row["ranks"] = render.rank_ranges(row["ranks"] or [])
    width = short_ids([r["trace_id"] for r in rows], [t["trace_id"] for t in warehouse.traces()])
    console.print(render.traces_table(rows, title, console, width))
