"""``tracelake ingest``: trace files into the warehouse, locally or on a Dask cluster."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from tracelake.contracts.status import IngestStatus
from tracelake.warehouse import IngestResult
from tracelake.warehouse.distributed import dask_client, warehouse_path

from ..user_input import parse_labels
from . import render
from .progress import progress_bar
from .root import (
    HomeOption,
    SchedulerOption,
    WorkersOption,
    app,
    cluster_target,
    console,
    err_console,
    exit_on_error,
    open_warehouse,
)


def ingest_summary(results: list[IngestResult], seconds: float) -> None:
    """Print the skipped duplicates, then one line of counts, bytes, rows and throughput."""
    ingested = [r for r in results if r.status == IngestStatus.INGESTED]
    duplicates = [r for r in results if r.status == IngestStatus.DUPLICATE]
    failed = [r for r in results if r.status == IngestStatus.FAILED]
    for r in duplicates:
        console.print(f"[dim]skipped[/] {escape(str(r.path))}: already ingested as {r.trace_id} (job {r.job})",
                      highlight=False, soft_wrap=True)
    mb = sum(r.uncompressed_bytes for r in ingested) / 1e6
    rows = sum(sum(r.rows.values()) for r in ingested)
    rate = f", {mb / seconds:.1f} MB/s" if seconds > 0 and mb else ""
    console.print(
        f"[green]{len(ingested)} ingested[/], {len(duplicates)} already there, "
        f"[{'red' if failed else 'green'}]{len(failed)} failed[/] "
        f"({mb:.1f} MB of trace data, {rows:,} rows in {seconds:.2f}s{rate})",
        highlight=False,
        soft_wrap=True,
    )


@app.command()
@exit_on_error
def ingest(
    paths: Annotated[list[Path], typer.Argument(help=(
        "Trace files or directories of them: Kineto .json(.gz), XLA .xplane.pb/.trace.json.gz, NCCL logs, "
        "nccl-tests output, Inspector/profiler-plugin dumps, Flight Recorder dumps."),
                                                show_default=False)],
    job: Annotated[str, typer.Option("--job", "-j", help="Job name to file the traces under.")] = "default",
    label: Annotated[list[str] | None, typer.Option("--label", "-l", help="A key=value label; repeatable.",
                                                    show_default=False)] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
    workers: WorkersOption = None,
    scheduler: SchedulerOption = None,
    home: HomeOption = None,
) -> None:
    """Ingest trace files into the warehouse.

    Exit code 0 when every input ingested (or was already there), 1 when any failed;
    the others are ingested either way, and each failure is printed as `path: what went wrong`.
    With --scheduler (or DASK_SCHEDULER_ADDRESS) or --workers, each file is a Dask task
    (docs/scale-out.md); workers must see the inputs and the warehouse at the same paths.
    """
    labels = parse_labels(label)
    target, pool = cluster_target(scheduler, workers)
    warehouse = open_warehouse(warehouse_path(home) if home is not None else None)
    started = time.perf_counter()
    with dask_client(target) as client, progress_bar(not quiet and err_console.is_terminal) as bar:
        if client is not None and not quiet:
            err_console.print(f"ingesting on {escape(target.describe())}", highlight=False, soft_wrap=True)
        report = warehouse.ingest(paths, job=job, labels=labels, progress=bar, workers=pool, client=client)
    if bar is None:
        for r in report.failed:
            err_console.print(f"[red]failed[/] {escape(render.failure_line(r.path, r.error))}", highlight=False,
                              soft_wrap=True)
        for r in report.results:
            for warning in r.warnings:
                err_console.print(f"[yellow]warning[/] {escape(f'{r.path}: {warning}')}", highlight=False,
                                  soft_wrap=True)
    if not report.results:
        err_console.print("[red]error:[/] no trace files found in the given paths")
        raise typer.Exit(1)
    ingest_summary(report.results, time.perf_counter() - started)
    if not report.ok:
        raise typer.Exit(1)
