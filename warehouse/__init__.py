"""The warehouse: Parquet tables per trace, a DuckDB catalog, and the library facade.

The facade and the result types load on first use (PEP 562), so a process that needs only
the errors or the settings (a SQL worker, a short CLI command) does not pay for them. The
errors are declared in :mod:`tracelake.contracts.errors` and re-exported here.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tracelake.contracts.allocators import return_freed_memory_promptly
from tracelake.contracts.errors import (
    Forbidden,
    IngestMemoryLimit,
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

return_freed_memory_promptly()  # before anything loads polars (its allocator reads the setting once)

from .settings import Settings

if TYPE_CHECKING:
    from tracelake.analysis.fleet_view import Fleet
    from tracelake.analysis.job_view import JobReport

    from .core import Warehouse
    from .results import IngestReport, IngestResult, QueryResult

#: Names loaded on first use, and the module each lives in (relative: of this package). The result types
#: are pure view-models, so they live in :mod:`tracelake.analysis`; they are re-exported here.
_LAZY = {
    "Warehouse": ".core",
    "Fleet": "tracelake.analysis.fleet_view",
    "JobReport": "tracelake.analysis.job_view",
    "IngestReport": ".results",
    "IngestResult": ".results",
    "QueryResult": ".results",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "Fleet",
    "Forbidden",
    "IngestMemoryLimit",
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
