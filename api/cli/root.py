"""The ``tracelake`` command group and what its commands share: consoles, options, error mapping.

Every command maps :class:`TracelakeError` to a one-line message and an exit code
in one place (:func:`exit_on_error`); no traceback reaches the user for bad input.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from tracelake.warehouse import NotFound, Settings, TracelakeError, Warehouse
from tracelake.warehouse.distributed import SCHEDULER_ENV, ClusterTarget, dask_available, resolve_target
from tracelake.warehouse.results import QueryResult
from tracelake.warehouse.store import is_warehouse

from ..errors import exit_code
from ..output import OutputFormat, to_csv, to_json, to_table
from .words import WordsGroup

P = ParamSpec("P")
R = TypeVar("R")


app = typer.Typer(
    name="tracelake",
    cls=WordsGroup,
    help="Ingest ML training and inference traces (PyTorch profiler, ...) into a Parquet + DuckDB "
    "warehouse and find where the time goes.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
console = Console()
err_console = Console(stderr=True)

HomeOption = Annotated[
    Path | None,
    typer.Option("--home", envvar="TRACELAKE_HOME", help="Warehouse directory (default: ~/.tracelake).",
                 show_default=False),
]
FormatOption = Annotated[OutputFormat, typer.Option("--format", "-f", help="Output format.")]


def exit_on_error(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn tracelake errors into a message on stderr and its exit code (:func:`tracelake.api.errors.exit_code`)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except TracelakeError as exc:
            err_console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
            raise typer.Exit(exit_code(exc)) from None

    return wrapper


def open_warehouse(home: Path | None, *, existing: bool = False) -> Warehouse:
    """The warehouse at ``home``; with ``existing`` (read commands) one that is there already, never a new one."""
    settings = Settings.from_env(home=home)
    if existing and not is_warehouse(settings.home_path):
        raise NotFound(f"no warehouse at {settings.home_path}: check --home (or TRACELAKE_HOME), or ingest into it "
                       "first")
    return Warehouse(settings=settings)


def print_result(result: QueryResult, fmt: OutputFormat, title: str | None = None) -> None:
    """Print ``result`` as ``fmt``: a rich table on the console, or CSV or JSON on stdout."""
    if fmt is OutputFormat.json:
        sys.stdout.write(to_json(result) + "\n")
    elif fmt is OutputFormat.csv:
        sys.stdout.write(to_csv(result))
    else:
        console.print(to_table(result, title=title))


WorkersOption = Annotated[int | None, typer.Option(
    "--workers", "-w", min=1, show_default=False,
    help="Start a local Dask cluster of this many worker processes (without Dask installed: a process pool).")]
SchedulerOption = Annotated[str | None, typer.Option(
    "--scheduler", show_default=False,
    help=f"Run on the Dask cluster at this address, e.g. tcp://host:8786 (default: ${SCHEDULER_ENV}, "
    "else this process).")]


def cluster_target(scheduler: str | None, workers: int | None) -> tuple[ClusterTarget, int]:
    """Where ingest or recompute runs, and the local process-pool size for ``--workers`` without Dask."""
    target = resolve_target(scheduler, workers, os.environ)
    if target.workers is not None and not dask_available():
        return ClusterTarget(), target.workers
    return target, 1
