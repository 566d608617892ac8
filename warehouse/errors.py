"""The one error hierarchy of tracelake.

Domain code raises these; the CLI maps them to a message and an exit code in one
place, and the REST API maps them to HTTP statuses in one exception handler.
"""

from __future__ import annotations

from pathlib import Path


class TracelakeError(Exception):
    """Base class of every error tracelake raises on purpose."""

    #: What the CLI exits with and the API answers with for this kind of error.
    exit_code: int = 1
    http_status: int = 400


class TraceFormatError(TracelakeError):
    """An input file is not a trace tracelake can read, or is damaged.

    The message always names the file and the place (byte offset, event index or
    line) so that a person can find the problem.
    """

    http_status = 422

    def __init__(self, source: str | Path, message: str, *, where: str | None = None) -> None:
        self.source = str(source)
        self.where = where
        self.reason = message
        place = f" at {where}" if where else ""
        super().__init__(f"{self.source}: {message}{place}")


class UnknownFormatError(TraceFormatError):
    """No parser recognises the file's content."""


class InvalidArgument(TracelakeError):
    """A caller passed a value tracelake cannot use (a bad job name, label, option)."""


class NotFound(TracelakeError):
    """A trace, job or file that was asked for does not exist."""

    http_status = 404


class QueryError(TracelakeError):
    """A SQL query failed; the message is DuckDB's."""


class QueryLimit(QueryError):
    """A query reached a limit it runs under (time, memory); the message names the setting."""


class QueryTimeout(QueryLimit):
    """A query ran past its time limit."""


class QueryMemoryLimit(QueryLimit):
    """A query needed more memory than its worker process may map."""


class Unavailable(TracelakeError):
    """The server cannot do this now (every SQL worker busy) or here (no OS sandbox for SQL): 503."""

    http_status = 503


class TooManyRequests(TracelakeError):
    """One client (token) has as many requests of this kind running as it may."""

    http_status = 429


class WarehouseError(TracelakeError):
    """The warehouse directory or its catalog cannot be used as it is."""

    http_status = 500


class TooLarge(InvalidArgument):
    """An upload, archive or decompressed stream is larger than the configured limit."""

    http_status = 413


class Unauthorized(TracelakeError):
    """A request carries no valid API token."""

    http_status = 401


class Forbidden(TracelakeError):
    """A request's token lacks the scope the operation needs."""

    http_status = 403
