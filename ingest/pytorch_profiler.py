"""PyTorch profiler (Kineto) Chrome-trace JSON: ``.json`` and ``.json.gz``.

Two stages keep memory bounded whatever the trace size, and put the heavy
lifting in native code on every core:

1. Cut (Python): the ``traceEvents`` array is streamed and cut into batches of
   whole events. Nothing is decoded into Python objects. Natively the cuts are
   not checked: the scanner checks each batch strictly as it reads it, and where
   one fails the trace is read again with every batch checked first
   (:func:`_cut_and_load`; docs/formats.md, section 1).
2. Load, on two threads while the next batch is cut: the native scanner
   (:mod:`tracelake.ingest.kineto_scan`) turns each batch into columns and
   writes the row-local ones as Parquet parts; where it is not built (or with
   ``TRACELAKE_KINETO_ENGINE=duckdb``), DuckDB's JSON reader does the same from
   batch files. Then SQL derives the cross-event facts (steps, nesting,
   collective-to-kernel links) and writes the warehouse tables, out of core; see
   :mod:`tracelake.ingest.pytorch_profiler_sql`.

When DuckDB rejects a value (a wrongly typed field), :func:`locate_error`
decodes the trace again with typed structs to say exactly which event and field;
the native scanner names the event itself.
"""

from __future__ import annotations

import queue
import re
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Generic, TypeVar

import msgspec

from tracelake.contracts.allocators import release_free_memory
from tracelake.contracts.errors import InvalidArgument, TraceFormatError

from . import kineto_scan, pytorch_profiler_sql
from .chrome_json import ChromeTraceReader
from .model import ParseOptions, TraceInfo
from .tables import fit_int, write_table
from .source import BatchBuffers, DecodedStream, iter_chunks, read_ahead

FORMAT = "pytorch_profiler"

_RANK_IN_NAME = re.compile(r"(?:^|[^a-z])rank[-_]?(\d+)(?:[^0-9]|$)", re.IGNORECASE)
_HOST_IN_NAME = re.compile(r"^(?P<host>[A-Za-z0-9.-]+)_(?P<pid>\d+)\.\d+\.pt\.trace\.json")
_COUNTER_EVENT = re.compile(rb'"ph"\s*:\s*"C"')


def _has_counter_event(data: bytes) -> bool:
    """Whether a batch may hold ``"ph": "C"`` events (memchr-fast on batches without any)."""
    return b'"C"' in data and _COUNTER_EVENT.search(data) is not None


def sniff(head: bytes, filename: str) -> bool:
    """True for a Chrome-trace JSON object that looks like PyTorch profiler output."""
    if not head.lstrip().startswith(b"{"):
        return False
    markers = (b'"traceEvents"', b'"schemaVersion"', b'"deviceProperties"', b'"distributedInfo"')
    return any(m in head for m in markers)


# -- stage 1: cut into batches, loaded as they come ------------------------------------

#: Loads at once, each on its own thread.
LOADERS = 2

Item = TypeVar("Item")


class _Loader(Generic[Item]):
    """Feeds cut batches to the normaliser on background threads.

    Two loads run at once while the next batch is cut: the native scanner and
    DuckDB both release the GIL, and several of DuckDB's statements use one core
    only, so one loader alone would leave a core idle. At most four items are in
    flight. When loads fail, the error of the earliest item is raised, so the same
    bad file always gets the same message.
    """

    def __init__(self, load: Callable[[int, Item], None], done: Callable[[Item], None] | None = None,
                 workers: int = LOADERS) -> None:
        self._load = load
        self._done = done
        self._queue: queue.Queue[tuple[int, Item] | None] = queue.Queue(maxsize=1)
        self._errors: dict[int, BaseException] = {}
        self._lock = threading.Lock()
        self._items = 0
        self._threads = [
            threading.Thread(target=self._run, name=f"tracelake-json-loader-{n}", daemon=True)
            for n in range(workers)
        ]
        for thread in self._threads:
            thread.start()

    def _run(self) -> None:
        while (queued := self._queue.get()) is not None:
            number, item = queued
            earliest = self._earliest_failed()
            if earliest is None or number < earliest:
                try:
                    self._load(number, item)
                except BaseException as exc:  # re-raised on the parsing thread by put()/close()
                    with self._lock:
                        self._errors[number] = exc
            if self._done is not None:
                self._done(item)

    def put(self, item: Item) -> None:
        """Queue one item; blocks while another is already waiting.

        Raises the earliest loading error so far, which stops the cutting.
        """
        self._raise_earliest()
        self._queue.put((self._items, item))
        self._items += 1

    def close(self) -> None:
        """Wait for every queued item; re-raise the earliest loading error."""
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            thread.join()
        self._raise_earliest()

    def _earliest_failed(self) -> int | None:
        with self._lock:
            return min(self._errors) if self._errors else None

    def _raise_earliest(self) -> None:
        earliest = self._earliest_failed()
        if earliest is not None:
            raise self._errors[earliest]


#: Batches per group, parsed by one DuckDB call (the DuckDB path).
GROUP_BATCHES = 4


def _cut_and_load(
    source: Path, options: ParseOptions, normaliser: pytorch_profiler_sql.Normaliser
) -> tuple[ChromeTraceReader[msgspec.Raw], int]:
    """Cut the events into batches and load them: natively from memory, or with DuckDB from batch files.

    Returns the reader (header, tail) and the number of events. Batches holding counter (``"ph": "C"``)
    events stay on disk for the normaliser's second look (the native scanner tells which; the DuckDB path
    looks for ``"C"``).

    Natively, the batches are first cut without a check and checked by the scanner as it reads them (one
    pass over the text, not two). Where any batch fails, the trace is read again as the DuckDB path reads
    it, every batch checked before it is scanned: that pass finds the true boundaries of a cut that fell
    inside a string, and names any error exactly as it always has (docs/formats.md, section 1).
    """
    if normaliser.native:
        seen = _Seen(options.on_bytes)
        try:
            return _scan_unchecked(source, replace(options, on_bytes=seen.first_pass), normaliser)
        except (TraceFormatError, kineto_scan.Unvouched, pytorch_profiler_sql.Abandoned):
            normaliser.restart()
            return _load(source, replace(options, on_bytes=seen.second_pass()), normaliser)
    return _load(source, options, normaliser)


class _Seen:
    """Progress over two passes: the bytes the first reads are passed on, of the second's only those beyond."""

    def __init__(self, on_bytes: Callable[[int], None] | None) -> None:
        self._on_bytes = on_bytes
        self.count = 0

    def first_pass(self, count: int) -> None:
        self.count += count
        if self._on_bytes is not None:
            self._on_bytes(count)

    def second_pass(self) -> Callable[[int], None] | None:
        if self._on_bytes is None:
            return None
        on_bytes, left, read = self._on_bytes, self.count, 0

        def beyond(count: int) -> None:
            nonlocal read
            new = max(0, read + count - max(read, left))
            read += count
            if new:
                on_bytes(new)
        return beyond


def _reader(source: Path, options: ParseOptions) -> ChromeTraceReader[msgspec.Raw]:
    """A reader of the trace's raw events, read ahead on a thread; batches checked natively where the scanner is
    built."""
    chunks = read_ahead(iter_chunks(source, on_bytes=options.on_bytes, name=options.source_name))
    return ChromeTraceReader(chunks, msgspec.Raw, options.source_name, batch_bytes=options.batch_bytes,
                             count_events=kineto_scan.json_array_length if kineto_scan.AVAILABLE else None)


def _scan_unchecked(source: Path, options: ParseOptions, normaliser: pytorch_profiler_sql.Normaliser
                    ) -> tuple[ChromeTraceReader[msgspec.Raw], int]:
    """The unchecked cut: batches cut in place in reused buffers the file is read straight into (one copy of each
    byte, no page faulted in per batch), each buffer given back once the scanner is done with its batch."""
    buffers = BatchBuffers(options.batch_bytes + 2)
    with DecodedStream(source, on_bytes=options.on_bytes, name=options.source_name) as stream:
        reader = ChromeTraceReader(stream.chunks(), msgspec.Raw, options.source_name, batch_bytes=options.batch_bytes,
                                   count_events=kineto_scan.json_array_length, fill=stream.readinto)
        numbering = pytorch_profiler_sql.EventNumbering()
        scanner: _Loader[bytes | memoryview] = _Loader(
            lambda n, batch: normaliser.scan_unchecked(n, batch, numbering), buffers.give_back)
        try:
            for data in reader.unchecked_batches(buffers):
                scanner.put(data)
        finally:
            scanner.close()
    return reader, numbering.total


def _load(source: Path, options: ParseOptions, normaliser: pytorch_profiler_sql.Normaliser
          ) -> tuple[ChromeTraceReader[msgspec.Raw], int]:
    """The checked cut: every batch decoded (or checked natively) before it is loaded."""
    reader = _reader(source, options)
    if normaliser.native:
        scanner: _Loader[tuple[int, bytes]] = _Loader(lambda n, item: normaliser.scan(n, *item))
        try:
            for first, events, data in reader.batches():
                if events:
                    scanner.put((first, data))
        finally:
            scanner.close()
        return reader, reader.event_count

    def remove_loaded(batches: list[tuple[Path, int]]) -> None:
        for path, _ in batches:
            if path not in normaliser.counter_batches:
                path.unlink(missing_ok=True)

    loader: _Loader[list[tuple[Path, int]]] = _Loader(normaliser.load, remove_loaded)
    group: list[tuple[Path, int]] = []
    try:
        for first, events, data in reader.batches():
            if not events:
                continue
            path = normaliser.batch_file(first, data, counters=_has_counter_event(data))
            group.append((path, first))
            if len(group) >= GROUP_BATCHES:
                loader.put(group)
                group = []
        if group:
            loader.put(group)
    finally:
        loader.close()
    return reader, reader.event_count


# -- locating a bad value precisely ---------------------------------------------------

class _Args(msgspec.Struct, gc=False):
    """Args as DuckDB reads them: an object (its values may be anything)."""


class Event(msgspec.Struct, gc=False):
    """One element of ``traceEvents``, typed as the normaliser reads it."""

    ph: str
    cat: str | None = None
    name: str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: float | None = None
    dur: float | None = None
    args: _Args | None = None


def locate_error(source: Path, options: ParseOptions) -> None:
    """Decode the trace again with typed events; raise a :class:`TraceFormatError` at the first bad one."""
    chunks = iter_chunks(source, name=options.source_name)
    reader: ChromeTraceReader[Event] = ChromeTraceReader(
        chunks, Event, options.source_name, batch_bytes=options.batch_bytes
    )
    for _ in reader.batches():
        pass


# -- trace-level facts ----------------------------------------------------------------

def _trace_info(options: ParseOptions, top: dict[str, Any], event_count: int, json_bytes: int) -> TraceInfo:
    info = TraceInfo(format=FORMAT, event_count=event_count, uncompressed_bytes=json_bytes)
    dist = top.get("distributedInfo")
    rank = fit_int(dist.get("rank"), 32) if isinstance(dist, dict) else None
    if rank is not None:
        info.rank = rank
        info.rank_source = "distributedInfo"
    else:
        match = _RANK_IN_NAME.search(options.source_name)
        if match and fit_int(int(match.group(1)), 32) is not None:
            info.rank = int(match.group(1))
            info.rank_source = "file name"
        else:
            info.warnings.append(
                "no rank in distributedInfo or in the file name (e.g. rank-3.json); assumed rank 0"
            )
    if isinstance(dist, dict):
        info.world_size = fit_int(dist.get("world_size"), 32)
        info.backend = _str_or_none(dist.get("backend"))
        info.nccl_version = _str_or_none(dist.get("nccl_version"))
    info.host = _str_or_none(top.get("host_name"))
    match = _HOST_IN_NAME.match(options.source_name)
    if match:
        info.host = info.host or match.group("host")
        info.pid = fit_int(int(match.group("pid")))
    props = top.get("deviceProperties")
    if isinstance(props, list) and props and isinstance(props[0], dict):
        info.device_name = _str_or_none(props[0].get("name"))
    return info


def _devices(top: dict[str, Any], rank: int) -> dict[str, list[object]]:
    """The ``devices`` rows from ``deviceProperties`` (CUDA/HIP device properties, one per device)."""
    rows: dict[str, list[object]] = {k: [] for k in (
        "rank", "device", "kind", "name", "core_count", "memory_bytes", "compute_capability")}
    props = top.get("deviceProperties")
    for prop in props if isinstance(props, list) else []:
        if not isinstance(prop, dict) or fit_int(prop.get("id"), 32) is None:
            continue
        major, minor = prop.get("computeMajor"), prop.get("computeMinor")
        for key, value in (
            ("rank", rank), ("device", prop["id"]), ("kind", "gpu"), ("name", _str_or_none(prop.get("name"))),
            ("core_count", fit_int(prop.get("numSms"), 32)), ("memory_bytes", fit_int(prop.get("totalGlobalMem"))),
            ("compute_capability", f"{major}.{minor}" if isinstance(major, int) and isinstance(minor, int) else None),
        ):
            rows[key].append(value)
    return rows


def _pg_config(top: dict[str, Any]) -> object:
    """``distributedInfo.pg_config``: the process groups (None where the trace does not list them)."""
    dist = top.get("distributedInfo")
    return dist.get("pg_config") if isinstance(dist, dict) else None


def _str_or_none(value: object) -> str | None:
    return str(value) if value is not None and value != "" else None


def _base_time_ns(top: dict[str, Any], source: str) -> int:
    base = top.get("baseTimeNanoseconds", 0)
    if base is None:
        return 0
    if not isinstance(base, int) or isinstance(base, bool):
        raise TraceFormatError(source, f"baseTimeNanoseconds is {type(base).__name__}, expected an integer")
    if fit_int(base) is None:
        raise TraceFormatError(source, f"baseTimeNanoseconds {base} does not fit in 64 bits (not epoch nanoseconds)")
    return base


def parse(source: Path, staging: Path, options: ParseOptions) -> TraceInfo:
    """Parse one Kineto trace into ``<table>.parquet`` files in ``staging``.

    Raises:
        TraceFormatError: the file is not a readable PyTorch profiler trace; the
            message names the file and the byte offset or event index.
    """
    native = options.kineto_engine != "duckdb" and kineto_scan.AVAILABLE
    if options.kineto_engine == "native" and not native:
        raise InvalidArgument("TRACELAKE_KINETO_ENGINE=native, but the native Kineto scanner is not built: reinstall "
                              "tracelake where gcc and the Python headers are present, or use 'auto'")
    normaliser = pytorch_profiler_sql.Normaliser(
        staging, memory_limit=options.memory_limit, threads=options.threads, source=options.source_name,
        native=native,
    )
    try:
        try:
            reader, event_count = _cut_and_load(source, options, normaliser)
            release_free_memory()
            top = {**reader.header, **reader.tail}
            info = _trace_info(options, top, event_count, reader.json_bytes)
            normaliser.finish(
                info,
                trace_id=options.final_trace_id,  # asked for when the final tables are written, not before
                base_ns=_base_time_ns(top, options.source_name),
                pg_config=_pg_config(top),
            )
            write_table(staging, "devices", _devices(top, info.rank), trace_id=options.final_trace_id())
        except pytorch_profiler_sql.UnreadableValue as exc:
            locate_error(source, options)  # raises with the event index when it finds the culprit
            raise TraceFormatError(options.source_name, f"unexpected value in an event ({exc})") from None
    finally:
        normaliser.close()
        release_free_memory()
    return info
