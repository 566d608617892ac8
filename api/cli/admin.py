"""``tracelake check`` (verify and repair the warehouse) and ``tracelake version``."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer
from rich.markup import escape

from .root import HomeOption, app, console, exit_on_error, open_warehouse


@app.command()
@exit_on_error
def check(
    repair: Annotated[bool, typer.Option("--repair", help=(
        "Put right what can be: remove what dead processes left (data files of unregistered traces, stale "
        "staging folders, temp files), move stray and faulty files aside into <home>/quarantine/<time>/, "
        "write missing or faulty schema files and the catalog again."))] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    stale_after: Annotated[float, typer.Option("--stale-after", min=0, help=(
        "Seconds without a write after which a staging folder counts as left over (0 only when "
        "nothing else writes to the warehouse)."))] = 3600.0,
    home: HomeOption = None,
) -> None:
    """Verify the warehouse: registered traces whole, every file under tables/ in its place and schema, the catalog.

    Every registered trace must have all its files and row counts; every file under tables/ must fit
    the layout and its table's declared schema; the catalog must hold exactly tracelake's views.
    Each finding says what --repair did or would do. Exit code 0 when healthy (after --repair, if
    given), 1 when a problem or leftover remains. Registered traces are never rewritten: delete a
    damaged one and ingest it again.
    """
    from rich.table import Table

    report = open_warehouse(home, existing=True).check(repair=repair, stale_after=stale_after)
    if as_json:
        sys.stdout.write(json.dumps(report.as_dict(), indent=2) + "\n")
    else:
        if report.problems:
            table = Table(title=f"{len(report.problems)} problems")
            for column in ("trace", "job", "table", "problem", "detail", "repair"):
                table.add_column(column, overflow="fold")
            for p in report.problems:
                table.add_row(p.trace_id[:12], p.job, p.table, p.kind, escape(p.detail), escape(p.repair))
            console.print(table)
        if report.orphans:
            table = Table(title=f"{len(report.orphans)} leftovers and strays (invisible to queries)")
            for column in ("kind", "path", "detail", "repair"):
                table.add_column(column, overflow="fold")
            for o in report.orphans:
                table.add_row(o.kind, escape(str(o.path)), escape(o.detail), escape(o.repair))
            console.print(table)
        verdict = "[green]healthy[/]" if report.ok else "[red]problems found[/]"
        repairable = report.orphans or any(p.repair.startswith("--repair") for p in report.problems)
        hint = "" if report.ok or repair or not repairable else " (`tracelake check --repair` puts right what it can)"
        console.print(f"{verdict}: {report.traces} traces, {report.files} files checked in {report.seconds:.2f}s; "
                      f"{len(report.problems)} problems"
                      f"{f' ({sum(p.fixed for p in report.problems)} put right)' if repair else ''}, "
                      f"{len(report.orphans)} leftovers"
                      f"{f' ({sum(o.removed for o in report.orphans)} removed or moved aside)' if repair else ''}, "
                      f"{report.in_use} in use{_newer(report.not_in_version)}{hint}", highlight=False, soft_wrap=True)
    if not report.ok:
        raise typer.Exit(1)


def _newer(count: int) -> str:
    """The check's count of tables newer than their trace's schema version, when there are any."""
    return f", {count} table files newer than their trace (not missing)" if count else ""


@app.command()
def version() -> None:
    """Print the tracelake version."""
    from tracelake.warehouse.core import tracelake_version

    console.print(tracelake_version())
