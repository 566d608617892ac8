"""The one error hierarchy of tracelake.

Domain code raises these; they say what went wrong, never how a face reports it. The
CLI maps them to a message and an exit code, and the REST API to an HTTP status, in
one place each (:mod:`tracelake.api.errors`).
"""

from __future__ import annotations

from pathlib import Path


class TracelakeError(Exception):
    """Base class of every error tracelake raises on purpose."""


class TraceFormatError(TracelakeError):
    """An input file is not a trace tracelake can read, or is damaged.

    The message always names the file and the place (byte offset, event index or
    line) so that a person can find the problem.
    """

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


class QueryError(TracelakeError):
    """A SQL query failed; the message is DuckDB's."""


class QueryLimit(QueryError):
    """A query reached a limit it runs under (time, memory); the message names the setting."""


class QueryTimeout(QueryLimit):
    """A query ran past its time limit."""


class QueryMemoryLimit(QueryLimit):
    """A query needed more memory than its worker process may map."""


class Unavailable(TracelakeError):
    """The server cannot do this now (every SQL worker busy) or here (no OS sandbox for SQL)."""


class IngestMemoryLimit(Unavailable):
    """Normalising a trace needed more memory than an ingest may use (``TRACELAKE_INGEST_MEMORY_LIMIT``): the trace
    is not at fault, the limit is too low for it."""

    @classmethod
    def of(cls, source: str | Path, limit: str, detail: str) -> IngestMemoryLimit:
        """The error for ``source`` under the ``limit`` DuckDB ran with, ``detail`` its own message."""
        first = detail.strip().splitlines()[0] if detail.strip() else "out of memory"
        return cls(f"{source}: normalising it needed more memory than an ingest may use "
                   f"(TRACELAKE_INGEST_MEMORY_LIMIT={limit}; DuckDB: {first.removeprefix('Out of Memory Error: ')}): "
                   "raise the limit and ingest the file again")


class TooManyRequests(TracelakeError):
    """One client (token) has as many requests of this kind running as it may."""


class WarehouseError(TracelakeError):
    """The warehouse directory or its catalog cannot be used as it is."""


class TooLarge(InvalidArgument):
    """An upload, archive or decompressed stream is larger than the configured limit."""


class Unauthorized(TracelakeError):
    """A request carries no valid API token."""


class Forbidden(TracelakeError):
    """A request's token lacks the scope the operation needs."""


class ServerError(TracelakeError):
    """A tracelake server answered a client's request with an error, or could not be reached.

    The message is the server's own (its JSON ``error``); ``status`` is the HTTP status (None when
    no answer came), ``kind`` the server's error class (``Unauthorized``, ``NotFound``, ...).
    """

    def __init__(self, message: str, *, status: int | None = None, kind: str | None = None) -> None:
        self.status = status
        self.kind = kind
        super().__init__(message)
