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
from .fleet_report import Fleet
from .job_report import JobReport
from .results import IngestReport, IngestResult, QueryResult
from .settings import Settings

__all__ = [
    "Fleet",
    "Forbidden",
    "IngestReport",
    "IngestResult",
    "InvalidArgument",
    "JobReport",
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
