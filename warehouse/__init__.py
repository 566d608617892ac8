"""The warehouse: Parquet tables per trace, a DuckDB catalog, and the library facade.

The facade and the result types load on first use (PEP 562), so a process that needs only
the errors or the settings (a SQL worker, a short CLI command) does not pay for them. The
errors are declared in :mod:`tracelake.contracts.errors` and re-exported here.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tracelake.contracts.errors import (
    Forbidden,
    InvalidArgument,
    NotFound,
    QueryError,
    QueryLimit,
    QueryMemoryLimit,
    QueryTimeout,
    TooLarge,
    TooManyRequests,
    TraceFormatError,
    TracelakeError,
    Unauthorized,
    Unavailable,
    UnknownFormatError,
    WarehouseError,
)

from .settings import Settings

if TYPE_CHECKING:
    from .core import Warehouse
    from .fleet_report import Fleet
    from .job_report import JobReport
    from .results import IngestReport, IngestResult, QueryResult

#: Names loaded on first use, and the module each lives in.
_LAZY = {
    "Warehouse": "core",
    "Fleet": "fleet_report",
    "JobReport": "job_report",
    "IngestReport": "results",
    "IngestResult": "results",
    "QueryResult": "results",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "Fleet",
    "Forbidden",
    "IngestReport",
    "IngestResult",
    "InvalidArgument",
    "JobReport",
    "NotFound",
    "QueryError",
    "QueryLimit",
    "QueryMemoryLimit",
    "QueryResult",
    "QueryTimeout",
    "Settings",
    "TooLarge",
    "TooManyRequests",
    "TraceFormatError",
    "TracelakeError",
    "Unauthorized",
    "Unavailable",
    "UnknownFormatError",
    "Warehouse",
    "WarehouseError",
]
