"""Parsers that turn profiler output into warehouse tables.

One module per format (``pytorch_profiler`` today); :mod:`.detect` picks the
parser by content. The warehouse calls :func:`parse_into` with a staging
directory; :func:`parse` is the convenience for notebooks and tests that want the
tables in memory.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tracelake.warehouse import schema

from .detect import FORMATS, Format, detect
from .model import ParseOptions, TraceInfo

__all__ = ["FORMATS", "Format", "ParseOptions", "ParsedTrace", "TraceInfo", "content_id", "detect", "parse", "parse_into"]


@dataclass
class ParsedTrace:
    """A parsed trace held in memory: its facts and one Arrow table per warehouse table."""

    info: TraceInfo
    tables: dict[str, pa.Table]


def content_id(path: Path) -> str:
    """The trace id of a file: the first 20 hex digits of the SHA-256 of its bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(8 << 20):
            digest.update(block)
    return digest.hexdigest()[:20]


def parse_into(path: Path, staging: Path, options: ParseOptions) -> tuple[Format, TraceInfo]:
    """Detect the format of ``path`` and parse it into ``<table>.parquet`` files in ``staging``."""
    fmt = detect(path, options.source_name)
    info = fmt.parse(path, staging, options)
    for name in schema.PARSED_TABLES:  # a format fills the tables it has; the others are empty
        target = staging / f"{name}.parquet"
        if not target.exists():
            pq.write_table(schema.table(name).arrow_schema.empty_table(), target)
    return fmt, info


def parse(path: str | Path) -> ParsedTrace:
    """Parse one trace file into memory (for notebooks and tests; the warehouse streams)."""
    path = Path(path)
    staging = Path(tempfile.mkdtemp(prefix="tracelake-parse-"))
    try:
        options = ParseOptions(source_name=path.name, trace_id=content_id(path))
        _, info = parse_into(path, staging, options)
        tables = {
            name: pq.read_table(staging / f"{name}.parquet")
            for name in schema.PARSED_TABLES
        }
        return ParsedTrace(info, tables)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
