"""The warehouse: Parquet tables per trace, a DuckDB catalog, and the library facade."""

from .core import Warehouse
from .errors import (
    Forbidden,
    InvalidArgument,
    NotFound,
    QueryError,
    TooLarge,
    TraceFormatError,
    TracelakeError,
    Unauthorized,
    UnknownFormatError,
    WarehouseError,
)
from .results import IngestReport, IngestResult, QueryResult
from .settings import Settings

__all__ = [
    "Forbidden",
    "IngestReport",
    "IngestResult",
    "InvalidArgument",
    "NotFound",
    "QueryError",
    "QueryResult",
    "Settings",
    "TooLarge",
    "TraceFormatError",
    "TracelakeError",
    "Unauthorized",
    "UnknownFormatError",
    "Warehouse",
    "WarehouseError",
]
