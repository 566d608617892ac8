"""The warehouse: Parquet tables per trace, a DuckDB catalog, and the library facade."""

from .core import Warehouse
from .errors import (
    InvalidArgument,
    NotFound,
    QueryError,
    TraceFormatError,
    TracelakeError,
    UnknownFormatError,
    WarehouseError,
)
from .results import IngestReport, IngestResult, QueryResult
from .settings import Settings

__all__ = [
    "IngestReport",
    "IngestResult",
    "InvalidArgument",
    "NotFound",
    "QueryError",
    "QueryResult",
    "Settings",
    "TraceFormatError",
    "TracelakeError",
    "UnknownFormatError",
    "Warehouse",
    "WarehouseError",
]
