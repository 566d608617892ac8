"""Stage 2 of the Kineto parser: batches of events -> warehouse tables.

Per batch (:meth:`Normaliser.scan`, the native scanner) or group of batch files
(:meth:`Normaliser.load`, DuckDB's JSON reader, the reference and the fallback),
the events become typed columns (``ts`` and ``dur`` as exact decimals, so
nanosecond digits survive). Everything that depends on one event only (names,
kinds, categories, arguments; the memory instants too) is written at once to Parquet
parts in the staging directory; only the few rows the end needs (step marks, collective args, memory
counters) are kept. At the end (:meth:`Normaliser.finish`) the cross-event facts
(nesting, steps, collective links) are derived in DuckDB from narrow columns read
back from the parts (the nesting by a native sweep over the host events DuckDB
sorts, where the scanner is built), and joined onto the parts as the final tables
are written (:mod:`.kineto_sql_events` holds the per-batch SQL, :mod:`.kineto_sql_facts` the
cross-event facts, :mod:`.kineto_sql_tables` the final joins).
Memory therefore grows with a few numbers per event, not with the trace text, and
DuckDB spills past its limit.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
import logging
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tracelake.contracts.allocators import release_free_memory
from tracelake.contracts.lazy import duckdb
from tracelake.contracts.schema import sql_literal
from tracelake.contracts.errors import IngestMemoryLimit, TraceFormatError

from . import kernel_collectives, kineto_scan, kineto_sql_events, kineto_sql_facts, kineto_sql_tables, part_rows
from .model import TraceInfo

log = logging.getLogger(__name__)


class UnreadableValue(Exception):
    """DuckDB could not convert a value in the events (a wrongly typed field)."""


#: The scanner's rows kept for the end (step marks, collectives' args), in pieces of one batch each, are copied
#: into one table once this many pieces are held: each piece's columns lie in buffers of the scan's own, about
#: 5 KiB a batch with their Python objects, which grew with the trace (5 MiB at 8 GB of the Qwen shape).
KEPT_PIECES = 64


def _connect(staging: Path, memory_limit: str, threads: int) -> duckdb.DuckDBPyConnection:
    return duckdb.connect(config={
        "memory_limit": memory_limit,
        "threads": threads,
        "temp_directory": str(staging / "duckdb_tmp"),
        **kineto_sql_tables.PARTS_SETTINGS,
    })


def _translate(exc: duckdb.Error, source: str, memory_limit: str) -> Exception:
    if isinstance(exc, duckdb.ConversionException | duckdb.InvalidInputException):
        return UnreadableValue(str(exc).splitlines()[0])
    if isinstance(exc, duckdb.OutOfMemoryException):  # the limit, not the trace: say which setting to raise
        return IngestMemoryLimit.of(source, memory_limit, str(exc))
    return TraceFormatError(source, f"could not normalise the trace ({exc})")


class Abandoned(Exception):
    """A batch after one that failed: where its events are is never known (the earlier error is raised)."""


class EventNumbering:
    """The index of each batch's first event, for batches cut without counting their events and read on two
    threads: batch ``n`` learns it once batches ``0 .. n-1`` have said how many events they hold."""

    def __init__(self) -> None:
        self._ready = threading.Condition()
        self._counts: dict[int, int] = {}
        self._firsts: list[int] = []  # of the batches 0 .. len - 1, all counted
        self._total = 0
        self._failed: int | None = None

    def place(self, batch: int, count: int | None) -> int:
        """Batch ``batch`` holds ``count`` events (None: it failed); returns the index of its first, waiting
        for the batches before it.

        Raises:
            Abandoned: a batch before it failed.
        """
        with self._ready:
            if count is None:
                self._fail(batch)
            else:
                self._counts[batch] = count
                while len(self._firsts) in self._counts:
                    self._firsts.append(self._total)
                    self._total += self._counts.pop(len(self._firsts) - 1)
            self._ready.notify_all()
            while len(self._firsts) < batch and not self._abandons(batch):  # until every batch before it is counted
                self._ready.wait()
            if self._abandons(batch):
                raise Abandoned()
            return self._firsts[batch] if batch < len(self._firsts) else self._total

    def fail(self, batch: int) -> None:
        """Batch ``batch`` failed: the batches after it never learn where they are."""
        with self._ready:
            self._fail(batch)
            self._ready.notify_all()

    def _fail(self, batch: int) -> None:
        self._failed = batch if self._failed is None else min(self._failed, batch)

    def _abandons(self, batch: int) -> bool:
        return self._failed is not None and self._failed < batch

    @property
    def total(self) -> int:
        """The events of every batch, once all are placed."""
        return self._total


class Normaliser:
    """Loads event batches as they are cut, then writes the tables.

    The loads run on background threads while the next batches are cut, either
    through the native scanner (:meth:`scan`, which releases the GIL) or through
    DuckDB's JSON reader (:meth:`load`, each thread on a connection of its own),
    so that loading and cutting in Python use both cores.
    """

    def __init__(self, staging: Path, *, memory_limit: str, threads: int, source: str, native: bool) -> None:
        self.staging = staging
        self.source = source
        #: DuckDB's memory limit, as the person set it (``TRACELAKE_INGEST_MEMORY_LIMIT``): named when it is too low.
        self.memory_limit = memory_limit
        #: Scan batches and nest host events natively (else DuckDB's JSON reader and SQL).
        self.native = native
        self.parts = staging / "parts"
        self.parts.mkdir()
        #: Batches as JSON files: every one on the DuckDB path, those with counter events on the native one.
        self.events = staging / "events"
        self.events.mkdir()
        self.con = _connect(staging, memory_limit, threads)
        self._columns = kineto_sql_events.columns_spec()
        self._local = threading.local()
        self._lock = threading.Lock()
        self._cursors: list[duckdb.DuckDBPyConnection] = []
        self._scanned: dict[str, list[pa.Table]] = {"step_marks": [], "coll_args": []}
        self._hip_calls = 0
        self._mtia_ops = 0
        #: Batch files holding counter (``"ph": "C"``) events, kept for :func:`kineto_sql_facts.counters`.
        self.counter_batches: list[Path] = []
        for statement in kineto_sql_events.SETUP:
            self.con.execute(statement)

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        """This thread's own connection to the normaliser's database (its ``batch`` table is private)."""
        con: duckdb.DuckDBPyConnection | None = getattr(self._local, "con", None)
        if con is None:
            con = self._local.con = self.con.cursor()
            con.execute("SET enable_progress_bar = false")
            with self._lock:
                self._cursors.append(con)
        return con

    def batch_file(self, first: int, batch: bytes | memoryview, *, counters: bool) -> Path:
        """Write a batch (its first event is ``traceEvents[first]``) to ``events/``; kept for the end if ``counters``."""
        path = self.events / f"b-{first:012d}.json"
        path.write_bytes(batch)
        if counters:
            with self._lock:
                self.counter_batches.append(path)
        return path

    def scan(self, group: int, first: int, batch: bytes) -> None:
        """Scan batch number ``group`` (JSON array text, checked; its first event is ``traceEvents[first]``)
        natively.

        Raises:
            TraceFormatError: an event cannot be read.
        """
        self._keep(group, batch, kineto_scan.scan(batch, first, self.source))

    def scan_unchecked(self, group: int, batch: bytes | memoryview, numbering: EventNumbering) -> None:
        """Scan batch number ``group``, cut without a check or an event count, strictly; ``numbering`` places
        its events after those of the batches before it.

        Raises:
            TraceFormatError: an event cannot be read.
            kineto_scan.Unvouched: the batch is not one the strict check vouches for (see :meth:`restart`).
            Abandoned: a batch before it failed.
        """
        try:  # read as if from event 0, then moved on once the batches before it are counted
            scanned = kineto_scan.scan(batch, 0, self.source, strict=True)
            first = numbering.place(group, scanned.events)
        except BaseException:
            numbering.fail(group)
            raise
        self._keep(group, batch, scanned.starting_at(first))

    def _keep(self, group: int, batch: bytes | memoryview, scanned: kineto_scan.ScannedBatch) -> None:
        if scanned.counter_events:
            self.batch_file(scanned.first, batch, counters=True)
        for table in ("device", "host"):
            # Parts live for one ingest: plain encoding writes faster than dictionaries, and lz4 keeps them small.
            pq.write_table(scanned.tables[table], self.parts / f"{table}-{group:06d}.parquet", compression="lz4",
                           use_dictionary=False)
        if scanned.tables["memory_events"].num_rows:
            pq.write_table(scanned.tables["memory_events"], self.parts / f"memory-{group:06d}.parquet",
                           compression="lz4", use_dictionary=False)
        with self._lock:
            for table, parts in self._scanned.items():
                if scanned.tables[table].num_rows:
                    parts.append(scanned.tables[table])
                if len(parts) >= KEPT_PIECES:
                    parts[:] = [pa.concat_tables(parts).combine_chunks()]
            self._hip_calls += scanned.hip_calls
            self._mtia_ops += scanned.mtia_ops

    def restart(self) -> None:
        """Forget every batch read so far, to read the trace again (after :class:`kineto_scan.Unvouched`)."""
        for folder in (self.parts, self.events):
            for path in folder.iterdir():
                path.unlink()
        self._scanned = {name: [] for name in self._scanned}
        self._hip_calls = self._mtia_ops = 0
        self.counter_batches = []

    def load(self, group: int, batches: list[tuple[Path, int]]) -> None:
        """Parse group number ``group`` with DuckDB: consecutive batch files, each with the index of its first event.

        Numbering the events (``WITH ORDINALITY``) makes the scan sequential; the
        loaders run two groups at once.

        Raises:
            UnreadableValue: DuckDB could not convert a value (the caller locates it).
            TraceFormatError: an event lacks a required field or has a bad one.
        """
        con = self._cursor()
        files = "[" + ", ".join(sql_literal(str(path)) for path, _ in batches) + "]"
        first = batches[0][1]
        object_bytes = max(kineto_sql_events.max_object(path) for path, _ in batches)
        try:
            con.execute(f"""
                CREATE OR REPLACE TEMP TABLE batch AS
                SELECT ordinality - 1 + {int(first)} AS event_id, ph, cat, lower(cat) AS lcat, name,
                       pid, tid, ts, dur, args
                FROM read_json({files}, format = 'array', columns = {self._columns},
                               maximum_object_size = {object_bytes}) WITH ORDINALITY
                WHERE ph IS NULL OR ph NOT IN ('s', 'f', 'M')
            """)
            kineto_sql_events.check_batch(con, self.source)
            device_part = sql_literal(str(self.parts / f"device-{group:06d}.parquet"))
            host_part = sql_literal(str(self.parts / f"host-{group:06d}.parquet"))
            # In event-id order, as the native scanner writes them: the final tables merge the parts in that order
            # (kineto_sql_tables._write_merged); DuckDB's threads would otherwise interleave a large batch's rows.
            for query, part in ((kineto_sql_events.DEVICE_PART, device_part), (kineto_sql_events.HOST_PART, host_part)):
                con.execute(f"COPY ({query} ORDER BY event_id) TO {part} (FORMAT parquet, COMPRESSION lz4)")
            for statement in kineto_sql_events.PER_BATCH:
                con.execute(statement.format(device_part=device_part, host_part=host_part))
            self._load_memory(con, group, batches, object_bytes)
        except duckdb.Error as exc:
            raise _translate(exc, self.source, self.memory_limit) from exc
        except UnicodeDecodeError as exc:  # DuckDB cut its message, quoting a value, inside a UTF-8 sequence
            raise UnreadableValue("a value DuckDB could not convert (its message is not valid UTF-8)") from exc

    def _load_memory(self, con: duckdb.DuckDBPyConnection, group: int, batches: list[tuple[Path, int]],
                     object_bytes: int) -> None:
        """The memory instants of the loaded ``batch`` into ``memory-<group>.parquet``, by a second look at the
        batch files holding some (their ``Bytes`` arg cannot be read beside ``bytes``; see ``MEMORY_ARGS``)."""
        ids = [row[0] for row in con.execute(kineto_sql_events.MEMORY_EVENT_IDS).fetchall()]
        if not ids:
            return
        firsts = [first for _, first in batches]
        holding = sorted({bisect.bisect_right(firsts, event_id) - 1 for event_id in ids})
        files = [(str(batches[i][0]), batches[i][1]) for i in holding]
        memory_part = sql_literal(str(self.parts / f"memory-{group:06d}.parquet"))
        con.execute(f"COPY (WITH mem_batch AS ({kineto_sql_events.memory_batch(files, object_bytes)}) "
                    f"{kineto_sql_events.MEMORY_PART}) TO {memory_part} (FORMAT parquet, COMPRESSION lz4)")

    def finish(self, info: TraceInfo, *, trace_id: Callable[[], str], base_ns: int, pg_config: object = None) -> None:
        """Derive the cross-event facts and write ``<table>.parquet`` for every data table; fill ``info``.

        ``trace_id`` gives the id when the final tables are written (the file may still be hashed until then).
        ``pg_config``: ``distributedInfo.pg_config`` (process groups), for collectives derived from kernels.
        """
        started = time.perf_counter()
        con = self.con
        try:
            self._insert_scanned(con)
            kineto_sql_facts.narrow(con, self.parts)
            kineto_sql_facts.steps(con)
            # Between the steps: what each freed on DuckDB's and the loaders' threads goes back before the next one's
            # peak (docs/architecture.md, "Memory"; a few ms each).
            release_free_memory()
            kineto_sql_facts.nesting(con, self.parts, native=self.native)
            kineto_sql_facts.device_steps(con, self.parts)
            kineto_sql_facts.collectives(con, self.parts)
            kernel_collectives.add(con, self.parts, pg_config, info.rank)
            kineto_sql_facts.counters(con, sorted(self.counter_batches))
            release_free_memory()
            kineto_sql_facts.memory_events(con, self.parts, native=self.native)
            kineto_sql_facts.fill_info(con, info, base_ns)
            release_free_memory()
            kineto_sql_tables.write_tables(con, self.staging, self.parts, trace_id(), info.rank, base_ns)
        except duckdb.Error as exc:
            raise _translate(exc, self.source, self.memory_limit) from exc
        except part_rows.UnfitValue as exc:
            raise UnreadableValue(str(exc)) from exc
        except UnicodeDecodeError as exc:  # DuckDB cut its message, quoting a value, inside a UTF-8 sequence
            raise UnreadableValue("a value DuckDB could not convert (its message is not valid UTF-8)") from exc
        log.debug("normalised %s in %.3fs", self.source, time.perf_counter() - started)

    def _insert_scanned(self, con: duckdb.DuckDBPyConnection) -> None:
        """The rows the native scanner kept for the end, into the tables the DuckDB path fills."""
        targets = {"step_marks": "step_marks", "coll_args": "coll_args"}
        for name, parts in self._scanned.items():
            if parts:
                con.register("scanned_rows", pa.concat_tables(parts))
                con.execute(f"INSERT INTO {targets[name]} SELECT * FROM scanned_rows")
                con.unregister("scanned_rows")
                parts.clear()
        if self._hip_calls or self._mtia_ops:
            con.execute("INSERT INTO facts VALUES (?, ?)", [self._hip_calls, self._mtia_ops])

    def close(self) -> None:
        """Release DuckDB's memory and temporary files."""
        for con in self._cursors:
            con.close()
        self.con.close()
