"""``tracelake export``: a job's data in other tools' formats (``perfetto``: one timeline of every rank)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from .root import HomeOption, app, err_console, exit_on_error, open_warehouse
from .words import WordsGroup

export_app = typer.Typer(
    name="export",
    cls=WordsGroup,
    help="Write a job's data for other tools: `perfetto`, one timeline of every rank for ui.perfetto.dev.",
    no_args_is_help=True,
)
app.add_typer(export_app)


@export_app.command("perfetto")
@exit_on_error
def export_perfetto(
    job: Annotated[str, typer.Option("--job", "-j", help="The job (see `tracelake traces`).", show_default=False)],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="File to write (default: <job>.perfetto.json.gz).",
                                             show_default=False)] = None,
    step: Annotated[int | None, typer.Option("--step", help="Only this step (ProfilerStep#N), and its critical "
                                             "path.", show_default=False)] = None,
    home: HomeOption = None,
) -> None:
    """Write every rank of a job on one timeline (a process per rank, its threads and device streams), with the
    critical path of each step as its own track (arrows where it changes rank) and the findings as markers.
    Open it in ui.perfetto.dev or chrome://tracing; `tracelake ingest` reads it back as a Kineto trace."""
    target = out or Path(f"{job}.perfetto.json.gz")
    done = open_warehouse(home, existing=True).export_perfetto(job, target, step=step)
    err_console.print(f"wrote {escape(str(target))}: {done.ranks} rank(s), {done.ops:,} events "
                      f"({done.bytes / 1e6:.1f} MB); open it in https://ui.perfetto.dev", highlight=False)
