"""The native scanner of NCCL debug log text (``_nccl_scan.c``): COLL rows as typed columns, the rare kinds' lines.

One call reads a chunk's whole lines with the GIL released (the ingest's threads scan chunks
on every core): it counts the non-empty lines, copies out the lines of the rare kinds (inits,
transports, TUNING, WARN, version), which :mod:`.nccl_log` reads with polars as before, and
makes every COLL line a row of the columns :func:`.nccl_log_coll.coll_rows` gives. It takes
only the COLL lines it is sure of; at the first other one (damaged, Unicode, a number or date
out of range) it gives up on the chunk, which the polars path then reads whole, so both
paths give the same tables (the tests hold them equal).

The setting ``TRACELAKE_NCCL_LOG_ENGINE`` (``ParseOptions.nccl_log_engine``) chooses: ``auto`` (the
default: the scanner where it is built), ``native`` (an error where it is not) or ``polars``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
import pyarrow as pa

from tracelake.contracts.errors import InvalidArgument
from tracelake.contracts.lazy import polars as pl

from .nccl_ops import collective_name

_native: ModuleType | None
try:
    _native = importlib.import_module(f"{__package__}._nccl_scan")
except ImportError:  # not built (no compiler at install): the polars path reads every chunk
    _native = None

#: Whether the native scanner is built.
AVAILABLE = _native is not None


def use_native(engine: str) -> bool:
    """Whether a parse with ``engine`` (``ParseOptions.nccl_log_engine``: ``auto``, ``native`` or ``polars``) scans
    with the native scanner.

    Raises:
        InvalidArgument: ``native`` where the scanner is not built.
    """
    if engine == "native" and not AVAILABLE:
        raise InvalidArgument("TRACELAKE_NCCL_LOG_ENGINE=native, but the native NCCL log scanner is not built: "
                              "reinstall tracelake where gcc and the Python headers are present, or use 'auto'")
    return engine != "polars" and AVAILABLE


@dataclass
class Scanned:
    """One piece of text scanned: its non-empty lines, the rare kinds' lines (each ending in a newline) and the
    COLL rows (:func:`.nccl_log_coll.coll_rows`' columns; None where there are none)."""

    lines: int
    rare: bytes
    rows: pl.DataFrame | None


def scan(text: bytes | memoryview) -> Scanned | None:
    """Scan whole lines of a log; None where a COLL line is not one the scanner takes (read ``text`` with polars)."""
    if _native is None:
        raise RuntimeError("the native NCCL log scanner is not built")
    lines, unsure, rare, rows, i64, i32, strings = _native.scan(text)
    if unsure:
        return None
    return Scanned(lines, rare, _rows(rows, i64, i32, strings) if rows else None)


_COLUMNS = ("ts_ns", "host", "pid", "comm", "op", "collective", "seq", "count", "size", "dtype", "root", "nranks",
            "stream")


def _numbers(rows: int, type_: pa.DataType, column: tuple[str, bytes, bytes | None, int]) -> pl.Series:
    name, data, valid, nulls = column
    array = pa.Array.from_buffers(type_, rows, [None if valid is None else pa.py_buffer(valid), pa.py_buffer(data)],
                                  null_count=nulls)
    return pl.Series(name, array)


def _rows(rows: int, i64: tuple[Any, ...], i32: tuple[Any, ...], strings: tuple[Any, ...]) -> pl.DataFrame:
    """The scanner's columns as :func:`.nccl_log_coll.coll_rows`' frame: each string column gathered from its
    distinct values (a handful per chunk), ``collective`` named once per distinct op."""
    columns = {c[0]: _numbers(rows, pa.int64(), c) for c in i64}
    columns.update((c[0], _numbers(rows, pa.int32(), c)) for c in i32)
    for name, index, values in strings:
        picks = pl.Series(np.frombuffer(index, dtype=np.int32, count=rows))
        columns[name] = pl.Series(name, values, dtype=pl.String).gather(picks)
        if name == "op":
            named = pl.Series("collective", [collective_name(v) for v in values], dtype=pl.String)
            columns["collective"] = named.gather(picks)
    return pl.DataFrame([columns[c] for c in _COLUMNS])
