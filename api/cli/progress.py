"""Progress bars on stderr (rich) for ingest and recompute; the commands turn them off where stderr is no terminal."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from tracelake.contracts.status import IngestStatus
from tracelake.warehouse import IngestResult

from . import render
from .root import err_console


class BarProgress:
    """Draws one rich progress bar over bytes and files for a multi-file ingest."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.task: TaskID | None = None
        self.total_files = 0
        self.done_files = 0

    def start(self, files: list[tuple[Path, int]]) -> None:
        self.total_files = len(files)
        self.task = self.progress.add_task("ingest", total=sum(size for _, size in files) or None,
                                           files=f"0/{self.total_files} files")

    def file_started(self, path: Path) -> None:
        if self.task is not None:
            name = path.name if len(path.name) <= 32 else path.name[:29] + "..."
            self.progress.update(self.task, description=escape(name))

    def advance(self, nbytes: int) -> None:
        if self.task is not None:
            self.progress.advance(self.task, nbytes)

    def file_done(self, result: IngestResult) -> None:
        self.done_files += 1
        if self.task is not None:
            self.progress.update(self.task, files=f"{self.done_files}/{self.total_files} files")
        if result.status == IngestStatus.FAILED:
            self.progress.console.print(f"[red]failed[/] {escape(render.failure_line(result.path, result.error))}",
                                        highlight=False, soft_wrap=True)
        for warning in result.warnings:
            self.progress.console.print(f"[yellow]warning[/] {escape(f'{result.path}: {warning}')}", highlight=False)


@contextmanager
def progress_bar(enabled: bool) -> Iterator[BarProgress | None]:
    """A bar over the bytes and files of an ingest (``Warehouse.ingest``'s ``progress``); None if not ``enabled``."""
    if not enabled:
        yield None
        return
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TextColumn("{task.fields[files]}"),
        TimeRemainingColumn(),
        console=err_console,
        transient=True,
    )
    with progress:
        yield BarProgress(progress)


@contextmanager
def count_bar(description: str, total: int, enabled: bool) -> Iterator[Callable[[str], None]]:
    """A progress bar over ``total`` items; yields the callback that counts one done."""
    if not enabled:
        yield lambda _: None
        return
    progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeRemainingColumn(), console=err_console, transient=True)
    with progress:
        task = progress.add_task(description, total=total)
        yield lambda _: progress.advance(task)


class UploadBar(BarProgress):
    """The bar of ``tracelake push``: bytes and files sent (:class:`tracelake.client.UploadProgress`); failures are
    printed when it is gone."""

    def file_done(self, item: Any) -> None:  # a tracelake.client.Sent
        self.done_files += 1
        if self.task is not None:
            self.progress.update(self.task, files=f"{self.done_files}/{self.total_files} files")


@contextmanager
def upload_bar(enabled: bool) -> Iterator[UploadBar | None]:
    """A bar over the bytes and files of an upload (``Client.upload``'s ``progress``); None if not ``enabled``."""
    with progress_bar(enabled) as bar:
        yield UploadBar(bar.progress) if bar is not None else None
