"""How the faces report a tracelake error: the HTTP status of each kind, and the CLI's exit code.

The domain errors (:mod:`tracelake.contracts.errors`) say what went wrong; this module is
the one place that decides what the REST API answers and what the CLI exits with. A
kind not listed takes the entry of its nearest listed base class.
"""

from __future__ import annotations

from tracelake.contracts.errors import (
    Forbidden,
    InvalidArgument,
    NotFound,
    TooLarge,
    TooManyRequests,
    TraceFormatError,
    TracelakeError,
    Unauthorized,
    Unavailable,
    WarehouseError,
)


class UploadTimedOut(InvalidArgument):
    """An upload sent nothing for longer than ``TRACELAKE_UPLOAD_IDLE_TIMEOUT_SECONDS`` (a stalled client)."""


class UploadDeadlinePassed(UploadTimedOut):
    """An upload still sending ``TRACELAKE_UPLOAD_DEADLINE_SECONDS`` after its body began (a trickling client)."""


#: The HTTP status the API answers each kind of error with.
HTTP_STATUS: dict[type[TracelakeError], int] = {
    TracelakeError: 400,
    TraceFormatError: 422,
    NotFound: 404,
    UploadTimedOut: 408,
    TooLarge: 413,
    TooManyRequests: 429,
    Unauthorized: 401,
    Forbidden: 403,
    WarehouseError: 500,
    Unavailable: 503,
}

#: The status the CLI exits with for each kind of error.
EXIT_CODE: dict[type[TracelakeError], int] = {
    TracelakeError: 1,
}


def _nearest(table: dict[type[TracelakeError], int], exc: TracelakeError) -> int:
    for cls in type(exc).__mro__:
        if cls in table:
            return table[cls]
    return table[TracelakeError]


def http_status(exc: TracelakeError) -> int:
    """The HTTP status the API answers ``exc`` with."""
    return _nearest(HTTP_STATUS, exc)


def exit_code(exc: TracelakeError) -> int:
    """The status the CLI exits with after reporting ``exc``."""
    return _nearest(EXIT_CODE, exc)
