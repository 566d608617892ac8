"""What a parser receives and returns."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

#: Called with the number of source bytes consumed since the last call.
ByteCallback = Callable[[int], None]
#: Expansion always allowed, whatever the ratio says, so that tiny legitimate inputs pass.
MIN_EXPANSION_BYTES = 1 << 20


def expansion_limit(size: int, ratio: int, most: int, floor: int = MIN_EXPANSION_BYTES) -> int:
    """Most bytes an input of ``size`` bytes may expand to: ``min(most, max(ratio x size, floor))``.

    The one rule for every input that can expand (archives, gzip, pickles' shared
    references): the ratio stops bombs, the floor lets tiny files through.
    """
    return min(most, max(ratio * size, floor))


@dataclass(frozen=True)
class ParseOptions:
    """How a parser should run; built by the warehouse from its settings."""

    #: Name to use for the source in messages (the file name as the user gave it).
    source_name: str
    #: Content hash identifying the trace; every row the parser writes carries it.
    trace_id: str = ""
    memory_limit: str = "200MB"
    threads: int = 2
    batch_bytes: int = 8 << 20
    on_bytes: ByteCallback | None = None
    #: How Kineto JSON events are read: ``native`` (the C scanner), ``duckdb`` (DuckDB's JSON
    #: reader, the reference) or ``auto`` (native where it is built).
    kineto_engine: str = "auto"
    #: How NCCL debug logs' COLL lines are read: ``native`` (the C scanner), ``polars`` (the reference) or
    #: ``auto`` (native where it is built).
    nccl_log_engine: str = "auto"
    #: Most bytes of rows a format that can expand (a pickle's shared references) may make per byte
    #: of the trace, and in all; floor: 1 MiB. The warehouse passes ``TRACELAKE_MAX_EXPANSION_RATIO``
    #: and ``TRACELAKE_MAX_EXPANDED_BYTES``.
    max_expansion_ratio: int = 200
    max_expanded_bytes: int = 32 << 30
    #: Where the warehouse hashes the file while a format that takes its id late parses it (``Format.late_id``):
    #: waits for the id (``trace_id`` is then empty). See :meth:`final_trace_id`.
    pending_trace_id: Callable[[], str] | None = None

    def final_trace_id(self) -> str:
        """The trace id, waiting for it where it is still being computed; parsers that write it only once they
        have read the whole trace ask here, the others read ``trace_id``."""
        return self.pending_trace_id() if self.pending_trace_id is not None else self.trace_id

    def expansion_limit(self, size: int) -> int:
        """Most bytes of rows an input of ``size`` bytes may make (:func:`expansion_limit`)."""
        return expansion_limit(size, self.max_expansion_ratio, self.max_expanded_bytes)


@dataclass
class TraceInfo:
    """What a parser learned about a trace as a whole: most of its `traces` row.

    The warehouse adds the rest (id, job, labels, row counts, timings).
    """

    format: str
    host: str | None = None
    pid: int | None = None
    rank: int = 0
    rank_source: str = "default"
    world_size: int | None = None
    backend: str | None = None
    nccl_version: str | None = None
    device_type: str | None = None
    device_name: str | None = None
    device_count: int | None = None
    start_ns: int | None = None
    end_ns: int | None = None
    event_count: int = 0
    uncompressed_bytes: int = 0
    warnings: list[str] = field(default_factory=list)


#: A parser reads ``source`` and writes one Parquet file per warehouse table,
#: named ``<table>.parquet``, into the staging directory it is given.
ParseFunction = Callable[[Path, Path, ParseOptions], TraceInfo]
