"""Result objects the facade returns to the CLI, the API and library users."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tracelake.contracts.status import IngestStatus

from .inputs import file_size


@dataclass
class IngestResult:
    """What happened to one input file."""

    path: Path
    status: IngestStatus
    trace_id: str | None = None
    job: str | None = None
    format: str | None = None
    rank: int | None = None
    rows: dict[str, int] = field(default_factory=dict)
    source_bytes: int = 0
    uncompressed_bytes: int = 0
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        """True unless the file failed to ingest."""
        return self.status != IngestStatus.FAILED


@dataclass
class IngestReport:
    """The results of one ``ingest`` call, in input order."""

    results: list[IngestResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when every input ingested (or was already there)."""
        return all(r.ok for r in self.results)

    @property
    def failed(self) -> list[IngestResult]:
        """The inputs that failed."""
        return [r for r in self.results if not r.ok]

    def count(self, status: IngestStatus | str) -> int:
        """How many inputs ended with ``status``."""
        return sum(1 for r in self.results if r.status == status)


@dataclass
class QueryResult:
    """Rows of a SQL query, with column names and DuckDB type names.

    ``truncated`` is True when the query had more rows than its row limit, or more
    bytes than its answer may carry, and only the first ones are in ``rows``;
    ``truncated_by`` says which limit (``rows`` or ``bytes``).
    """

    columns: list[str]
    types: list[str]
    rows: list[tuple[Any, ...]]
    truncated: bool = False
    truncated_by: str | None = None

    def as_dicts(self) -> list[dict[str, Any]]:
        """Rows as ``{column: value}`` dicts."""
        return [dict(zip(self.columns, row)) for row in self.rows]


class IngestProgress(Protocol):
    """Receives progress of a multi-file ingest (the CLI draws a progress bar from it)."""

    def start(self, files: list[tuple[Path, int]]) -> None:
        """Called once with every input file and its size in bytes."""

    def file_started(self, path: Path) -> None:
        """Called before each file is read."""

    def advance(self, nbytes: int) -> None:
        """Called as source bytes are read, possibly from a reader thread: it must be thread-safe."""

    def file_done(self, result: IngestResult) -> None:
        """Called when one file has been ingested, skipped or has failed."""


def report_whole_file(progress: IngestProgress | None, path: Path, result: IngestResult) -> None:
    """Tell ``progress`` that a file done elsewhere (another process, a Dask worker) is done, all its bytes at once."""
    if progress is not None:
        progress.file_started(path)
        progress.advance(file_size(path))
        progress.file_done(result)
