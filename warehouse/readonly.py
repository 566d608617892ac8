"""Untrusted SQL over the warehouse: the engine behind ``POST /api/v1/sql`` and ``tracelake sql``.

A query runs behind two independent walls, either of which stops a write to the warehouse alone:

1. :mod:`.sql_policy`, an allow-list checked on DuckDB's parse tree: one reading statement;
   only known node kinds; only allow-listed functions (none takes SQL text, reads files
   or changes state); only the warehouse's views (the API). DuckDB's own switches back
   it up: files only under ``tables/``, no external access, no spilling, no extension
   loading, settings locked.
2. :mod:`.sql_sandbox`, the operating system: the query runs in a worker process
   (:mod:`.sql_pool`) that Landlock lets read beneath ``tables/`` only and write nowhere,
   whose memory ``RLIMIT_DATA`` caps, and which is killed at its deadline.

Limits: ``sql_timeout_seconds``, ``sql_memory_limit``, ``sql_max_rows``, ``sql_max_bytes``
(the answer is cut and says so), ``sql_workers`` and ``sql_queue_seconds`` (503 past it);
the API adds ``sql_per_token`` (429). See docs/security.md, "SQL".
"""

from __future__ import annotations

import re
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgspec

from tracelake.contracts import schema
from tracelake.contracts.errors import InvalidArgument

from . import catalog
from .results import QueryResult
from .settings import Settings
from .sql_policy import LOCAL, Policy, api_policy
from .sql_pool import QueryStream, SqlPool, WorkerSpec
from .store import Store

#: The warehouse's views: all an API query may read.
API_POLICY = api_policy(["traces", "tracelake_meta", *schema.DATA_TABLES])
#: DuckDB's own memory limit, as a share of the worker's cap (DuckDB fails first, with its own message).
DUCKDB_SHARE = 0.6
#: The least memory a query may be given: DuckDB itself and its threads need about 100 MB.
MIN_MEMORY = 128 * 10**6
#: Formats ``tracelake sql --out`` writes, by file extension.
EXPORT_FORMATS = {".parquet": "parquet", ".csv": "csv", ".json": "json", ".ndjson": "json"}

_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?I?B?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 10**3, "KB": 10**3, "M": 10**6, "MB": 10**6, "G": 10**9, "GB": 10**9,
          "T": 10**12, "TB": 10**12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(text: str, setting: str, minimum: int = MIN_MEMORY) -> int:
    """Bytes in a size like ``1GB`` (10^9), ``512MiB`` (2^29) or ``1000000``.

    Raises:
        InvalidArgument: naming ``setting`` when ``text`` is not a size of at least ``minimum`` bytes.
    """
    found = _SIZE.match(text)
    unit = found.group(2).upper() if found else None
    if not found or unit not in _UNITS:
        raise InvalidArgument(f"{setting}={text!r} is not a size: write e.g. 1GB, 512MB or 2GiB")
    size = int(float(found.group(1)) * _UNITS[str(unit)])
    if size < minimum:
        raise InvalidArgument(f"{setting}={text!r} is too small: at least {minimum // 10**6}MB")
    return size


def api_spec(store: Store, settings: Settings) -> WorkerSpec:
    """Workers for untrusted queries: read ``tables/`` only, write nothing, memory capped, Landlock required."""
    memory = parse_size(settings.sql_memory_limit, "TRACELAKE_SQL_MEMORY_LIMIT")
    if settings.threads < 1:
        raise InvalidArgument(f"TRACELAKE_THREADS={settings.threads} must be at least 1")
    tables = str(store.tables)
    return WorkerSpec(read=(tables,), views=tuple(catalog.view_statements(store)), threads=settings.threads,
                      memory_bytes=memory, duckdb_memory=int(memory * DUCKDB_SHARE),
                      allowed_directories=(tables,), require_landlock=settings.sql_os_sandbox == "required")


def local_spec(store: Store, settings: Settings, scratch: Path | None = None) -> WorkerSpec:
    """Workers for ``tracelake sql``: read what the user can read, write nothing (but ``scratch``)."""
    return WorkerSpec(read=("/",), views=tuple(catalog.view_statements(store)), threads=max(settings.threads, 1),
                      scratch=(str(scratch),) if scratch else (), require_landlock=False)


class SqlEngine:
    """Sandboxed SQL workers over one warehouse, lent one query at a time, with a limit per client."""

    def __init__(self, store: Store, settings: Settings, *, spec: WorkerSpec | None = None,
                 policy: Policy | None = API_POLICY) -> None:
        for name in ("sql_max_rows", "sql_max_bytes", "sql_workers", "sql_per_token"):
            if getattr(settings, name) < 1:
                raise InvalidArgument(f"TRACELAKE_{name.upper()}={getattr(settings, name)} must be at least 1")
        if not settings.sql_timeout_seconds > 0:
            raise InvalidArgument(f"TRACELAKE_SQL_TIMEOUT_SECONDS={settings.sql_timeout_seconds} must be more than 0")
        self.settings = settings
        self.policy = policy
        self.pool = SqlPool(spec or api_spec(store, settings), settings.sql_workers)

    def start(self) -> None:
        """Start the workers in the background, so the first queries do not wait for them."""
        self.pool.prewarm()

    def close(self) -> None:
        """Stop the workers."""
        self.pool.close()

    def stream(self, sql: str, *, max_rows: int | None = None) -> QueryStream:
        """Start ``sql`` on a worker; the answer is held until complete, so errors come before the head.

        Raises:
            Unavailable: no worker became free within ``sql_queue_seconds``.
        """
        s = self.settings
        rows = s.sql_max_rows if max_rows is None else max(1, min(max_rows, s.sql_max_rows))
        request = {"sql": sql, "max_rows": rows, "max_bytes": s.sql_max_bytes, "timeout": s.sql_timeout_seconds,
                   "hold": True, "check": self.policy is not None,
                   "policy": self.policy.as_dict() if self.policy is not None else None}
        return self.pool.query(request, queue_seconds=s.sql_queue_seconds)

    def query(self, sql: str, *, max_rows: int | None = None) -> QueryResult:
        """Run ``sql`` and collect its answer (at most the row and byte limits).

        Raises:
            QueryError: refused, failed, or past a limit (:class:`QueryLimit` names it).
        """
        with self.stream(sql, max_rows=max_rows) as stream:
            return collect(stream)


def collect(stream: QueryStream) -> QueryResult:
    """A stream's whole answer as a :class:`QueryResult` (values as JSON gives them)."""
    columns, types = stream.head()
    body = b"[" + b"".join(stream.chunks()) + b"]"
    rows: list[Any] = msgspec.json.decode(body)
    return QueryResult(columns=columns, types=types, rows=[tuple(r) for r in rows],
                       truncated=bool(stream.end.get("truncated")), truncated_by=stream.end.get("truncated_by"))


def query_once(store: Store, settings: Settings, sql: str, *, max_rows: int | None = None) -> QueryResult:
    """One untrusted query on a worker started for it (a server keeps a :class:`SqlEngine` instead)."""
    engine = SqlEngine(store, replace(settings, sql_workers=1))
    try:
        return engine.query(sql, max_rows=max_rows)
    finally:
        engine.close()


def local_query(store: Store, settings: Settings, sql: str, *, out: Path | None = None) -> QueryResult:
    """``tracelake sql``: the same checks as the API, but the user's own files may be read.

    With ``out``, the result is written there (Parquet, CSV or JSON by its extension) by
    DuckDB's COPY into a private scratch folder, then moved into place; ``out`` may not
    lie inside the warehouse.

    Raises:
        QueryError: the SQL is refused or fails.
        InvalidArgument: ``out`` has an unknown extension or lies inside the warehouse.
    """
    if out is None:
        pool = SqlPool(local_spec(store, settings), 1)
        try:
            with pool.query(_local_request(sql), queue_seconds=60) as stream:
                return collect(stream)
        finally:
            pool.close()
    target = out.expanduser().resolve()
    fmt = EXPORT_FORMATS.get(target.suffix.lower())
    if fmt is None:
        raise InvalidArgument(f"--out {out}: name a file ending in {', '.join(EXPORT_FORMATS)}")
    if target.is_relative_to(store.home.resolve()):
        raise InvalidArgument(f"--out {out}: the warehouse ({store.home}) is never written by a query")
    with tempfile.TemporaryDirectory(prefix="tracelake-export-") as scratch:
        written = Path(scratch) / f"out{target.suffix.lower()}"
        pool = SqlPool(local_spec(store, settings, Path(scratch)), 1)
        try:
            request = {**_local_request(sql), "copy_to": {"path": str(written), "format": fmt}}
            with pool.query(request, queue_seconds=60) as stream:
                stream.head()
                list(stream.chunks())
                count = int(stream.end.get("row_count") or 0)
        finally:
            pool.close()
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(written), str(target))
    return QueryResult(columns=["rows", "file"], types=["BIGINT", "VARCHAR"], rows=[(count, str(target))])


def _local_request(sql: str) -> dict[str, Any]:
    return {"sql": sql, "check": True, "policy": LOCAL.as_dict(), "hold": False}


__all__ = ["API_POLICY", "SqlEngine", "api_spec", "collect", "local_query", "local_spec", "parse_size",
           "query_once"]
