"""``tracelake traces``: the list of ingested traces."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from tracelake.warehouse.results import QueryResult
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
    sql = (  # ranks from the stored breakdown: an XLA profile holds a rank per device (docs/formats.md)
        "SELECT trace_id, job, rank, coalesce(r.ranks, [rank]) AS ranks, format, source_name, device_name, "
        "device_op_count, round((end_ns - start_ns) / 1e6, 3) AS span_ms, ingested_at FROM traces LEFT JOIN ("
        "SELECT trace_id, list(DISTINCT rank ORDER BY rank) AS ranks FROM breakdown WHERE step IS NULL "
        "GROUP BY trace_id) r USING (trace_id)"
    )
    params: list[Any] = []
    if job:
        sql += " WHERE job = ?"
        params.append(job)
    result = warehouse.query(sql + " ORDER BY job, rank, source_name", params)
    run_of = {t["trace_id"]: t["run"] for t in warehouse.traces(job)}  # docs/analyses.md, "Runs within a job"
    result = QueryResult([*result.columns[:2], "run", *result.columns[2:]], [*result.types[:2], "VARCHAR",
                         *result.types[2:]], [(*row[:2], run_of.get(row[0]), *row[2:]) for row in result.rows])
    title = f"{len(result.rows)} traces in {warehouse.home}"
    if fmt is not OutputFormat.table:
        print_result(result, fmt, title=title)
        return
    rows = [dict(zip(result.columns, row)) for row in result.rows]
    for row in rows:
        row["ranks"] = render.rank_ranges(row["ranks"] or [])
    width = short_ids([r["trace_id"] for r in rows], [t["trace_id"] for t in warehouse.traces()])
    console.print(render.traces_table(rows, title, console, width))
