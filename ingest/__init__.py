"""Parsers that turn profiler output into warehouse tables.

One module per format (Kineto JSON, XLA xplane and trace-viewer JSON, the NCCL
debug log, nccl-tests, the NCCL profiler and Inspector plugins, Flight Recorder);
:mod:`.detect` picks the parser by content (:data:`.detect.FORMATS`). The warehouse calls :func:`parse_into` with a staging
directory; :func:`parse` is the convenience for notebooks and tests that want the
tables in memory.
"""

from __future__ import annotations

from tracelake.contracts.allocators import return_freed_memory_promptly

return_freed_memory_promptly()  # before pyarrow and polars load (each reads its setting once)

import hashlib
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tracelake.contracts import schema

from .detect import FORMATS, Format, detect
from .model import ParseOptions, TraceInfo
from .source import DecodedStream, read_head

__all__ = ["FORMATS", "ID_DIGITS", "Format", "ParseOptions", "ParsedTrace", "TraceInfo", "content_id", "detect", "parse", "parse_into"]


@dataclass
class ParsedTrace:
    """A parsed trace held in memory: its facts and one Arrow table per warehouse table."""

    info: TraceInfo
    tables: dict[str, pa.Table]


#: Hex digits of a trace id (of the SHA-256 of the decoded content).
ID_DIGITS = 20
#: Bytes hashed per read.
HASH_BLOCK_BYTES = 8 << 20


def content_id(path: Path, name: str | None = None) -> str:
    """The trace id of a file: the first 20 hex digits of the SHA-256 of its decoded content.

    A gzip file is hashed as what it decompresses to (every member), in one streaming pass
    with ISA-L, so ``x.json``, ``x.json.gz`` and a copy compressed at another level are one
    trace (docs/formats.md, "Trace ids"). An uploaded file is hashed the same way as its bytes
    arrive (:class:`tracelake.api.uploads.ContentHasher`).

    Raises:
        TraceFormatError: the file is empty, or its gzip stream is damaged or ends early
            (naming ``name``, default the file's name, and the compressed byte).
    """
    digest = hashlib.sha256()
    read_head(path, 1, name)  # a damaged gzip header: "not a valid gzip file", as format detection says it
    block = memoryview(bytearray(HASH_BLOCK_BYTES))  # one buffer read into again and again: no page faulted anew
    with DecodedStream(path, name=name) as stream:
        while read := stream.readinto(block):
            digest.update(block[:read])
    return digest.hexdigest()[:ID_DIGITS]


def parse_into(path: Path, staging: Path, options: ParseOptions,
               fmt: Format | None = None) -> tuple[Format, TraceInfo]:
    """Detect the format of ``path`` (unless the caller did: ``fmt``) and parse it into ``<table>.parquet`` files
    in ``staging``."""
    fmt = fmt or detect(path, options.source_name)
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
