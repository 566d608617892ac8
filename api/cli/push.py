"""``tracelake push``: trace files and folders to a tracelake server, each file once (:mod:`tracelake.client`).

``--spool`` sends what the profiler hooks kept while the server was down (:func:`tracelake.client.send_spool`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from tracelake.client import Client, SpoolReport, UploadReport, send_spool
from tracelake.contracts.errors import InvalidArgument

from ..user_input import parse_labels
from .progress import upload_bar
from .root import app, console, err_console, exit_on_error

UrlOption = Annotated[str | None, typer.Option(
    "--url", envvar="TRACELAKE_URL", show_default=False,
    help="The tracelake server (default: $TRACELAKE_URL, else http://127.0.0.1:8000).")]
TokenOption = Annotated[str | None, typer.Option(
    "--token", envvar="TRACELAKE_TOKEN", show_default=False, show_envvar=False,
    help="An API token with the write scope (default: $TRACELAKE_TOKEN).")]


def push_summary(report: UploadReport, waited: bool) -> None:
    """Print the files the server had already, then one line of counts, bytes and throughput."""
    for item in report.present:
        console.print(f"[dim]skipped[/] {escape(str(item.path))}: already there as {item.trace_id} "
                      f"(job {escape(str(item.job))}, {item.status})", highlight=False, soft_wrap=True)
    mb = report.bytes_sent / 1e6
    rate = f", {mb / report.seconds:.1f} MB/s" if report.seconds > 0 and mb else ""
    sent = len(report.sent)
    console.print(
        f"[green]{sent} {'ingested' if waited else 'sent'}[/], {len(report.present)} already there, "
        f"[{'red' if report.failed else 'green'}]{len(report.failed)} failed[/] "
        f"({mb:.1f} MB in {report.seconds:.2f}s{rate}"
        f"{f', then {report.wait_seconds:.2f}s ingesting' if waited else ''})",
        highlight=False, soft_wrap=True,
    )


@app.command()
@exit_on_error
def push(
    paths: Annotated[list[Path] | None, typer.Argument(help=(
        "Trace files or folders of them (as `ingest` takes them; `tracelake nccl-env`'s folder too), or "
        ".zip/.tar.gz archives. With --spool: the spool folder (default: $TRACELAKE_SPOOL, else "
        "~/.cache/tracelake/spool)."), show_default=False)] = None,
    job: Annotated[str | None, typer.Option("--job", "-j", help="Job name to file the traces under (default: "
                                            "default).", show_default=False)] = None,
    label: Annotated[list[str] | None, typer.Option("--label", "-l", help="A key=value label; repeatable.",
                                                    show_default=False)] = None,
    spool: Annotated[bool, typer.Option("--spool", help=(
        "Send what the profiler hooks (tracelake.torch, tracelake.jax) kept in the spool while the server was "
        "down, each under its own job and labels; each file is removed once the server confirms it."))] = False,
    wait: Annotated[bool, typer.Option("--wait", help="Wait until the server has ingested every trace.")] = False,
    wait_timeout: Annotated[float, typer.Option("--wait-timeout", min=0, help="Longest wait, in seconds.")] = 600,
    retries: Annotated[int, typer.Option("--retries", min=0, help="Tries again after a connection error or a "
                                         "busy or failing server, waiting longer each time (up to 30s).")] = 8,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Upload trace files to a tracelake server, for a job's epilogue or a CI step.

    Each file's trace id is computed first and asked for: what the server has is not sent
    again, so running it twice sends nothing twice. Connection errors and busy or failing
    servers are retried with backoff. Exit code 0 when every file was sent (with --wait:
    ingested) or was there already, 1 when any failed; the others are sent either way.

    `tracelake push --spool [DIR]` sends what the profiler hooks kept in their spool while the
    server was away, each trace under its own job and labels, removing each file once the
    server has confirmed it (docs/integrations/pytorch.md).
    """
    client = Client(url, token, retries=retries)
    if spool:
        if job is not None or label:
            raise InvalidArgument("--spool sends each spooled trace under the job and labels it was spooled with; "
                                  "leave out --job and --label")
        if paths is not None and len(paths) > 1:
            raise InvalidArgument("--spool takes one spool folder (or none, for $TRACELAKE_SPOOL or "
                                  "~/.cache/tracelake/spool)")
        sent = send_spool(client, paths[0] if paths else None, wait=wait, wait_timeout=wait_timeout)
        spool_summary(sent)
        if not sent.ok:
            raise typer.Exit(1)
        return
    if not paths:
        raise InvalidArgument("give the trace files or folders to upload (or --spool)")
    labels = parse_labels(label)
    with upload_bar(not quiet and err_console.is_terminal) as bar:
        report = client.upload(paths, job=job or "default", labels=labels, wait=wait, wait_timeout=wait_timeout,
                               progress=bar)
    for item in report.failed:  # after the bar is gone: an ingest that failed is known only after --wait
        err_console.print(f"[red]failed[/] {escape(str(item.error or item.path))}", highlight=False, soft_wrap=True)
    if not report.items:
        err_console.print("[red]error:[/] no trace files found in the given paths")
        raise typer.Exit(1)
    push_summary(report, wait)
    if not report.ok:
        raise typer.Exit(1)


def spool_summary(report: SpoolReport) -> None:
    """Print the spool entries that failed, then one line of counts."""
    for folder, why in report.failed:
        err_console.print(f"[red]failed[/] {escape(str(folder))}: {escape(why)}", highlight=False, soft_wrap=True)
    files = sum(len(u.items) for u in report.uploads)
    present = sum(len(u.present) for u in report.uploads)
    busy = f", {len(report.incomplete)} being written (left alone)" if report.incomplete else ""
    console.print(f"[green]{len(report.sent)} spooled traces sent[/] ({files} files, {present} already there), "
                  f"[{'red' if report.failed else 'green'}]{len(report.failed)} failed[/]{busy}; "
                  f"spool {escape(str(report.spool))}", highlight=False, soft_wrap=True)
