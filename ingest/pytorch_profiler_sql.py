"""Stage 2 of the Kineto parser: batches of events -> warehouse tables.

Per batch (:meth:`Normaliser.scan`, the native scanner) or group of batch files
(:meth:`Normaliser.load`, DuckDB's JSON reader, the reference and the fallback),
the events become typed columns (``ts`` and ``dur`` as exact decimals, so
nanosecond digits survive). Everything that depends on one event only (names,
kinds, categories, arguments) is written at once to Parquet parts in the staging
directory; only the few rows the end needs (step marks, collective args, memory
counters) are kept. At the end (:meth:`Normaliser.finish`) the cross-event facts
(nesting, steps, collective links) are derived in DuckDB from narrow columns read
back from the parts (the nesting by a native sweep over the host events DuckDB
sorts, where the scanner is built), and joined onto the parts as the final tables
are written.
Memory therefore grows with a few numbers per event, not with the trace text, and
DuckDB spills past its limit.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from tracelake.analysis.classify import Category, category_sql
from tracelake.warehouse import schema
from tracelake.warehouse.schema import sql_literal
from tracelake.warehouse.errors import TraceFormatError

from . import kernel_collectives, kineto_scan
from .model import TraceInfo

log = logging.getLogger(__name__)


class UnreadableValue(Exception):
    """DuckDB could not convert a value in the events (a wrongly typed field)."""


#: Bytes per element of the dtypes PyTorch writes in ``record_param_comms`` args.
DTYPE_BYTES: dict[str, int] = {
    "Float": 4, "float": 4, "Float32": 4, "Double": 8, "Half": 2, "BFloat16": 2,
    "Float8_e4m3fn": 1, "Float8_e5m2": 1, "Float8_e4m3fnuz": 1, "Float8_e5m2fnuz": 1,
    "Byte": 1, "Char": 1, "Bool": 1, "Short": 2, "Int": 4, "Long": 8,
    "ComplexFloat": 8, "ComplexDouble": 16, "UInt16": 2, "UInt32": 4, "UInt64": 8,
}

#: Device op kinds by Kineto event category (lower case). ``mtia_ccp_events`` are the ops of
#: Meta's MTIA accelerator (docs/formats.md, section 1).
KIND_BY_CAT = {
    "kernel": "kernel", "gpu_memcpy": "memcpy", "memcpy": "memcpy",
    "gpu_memset": "memset", "memset": "memset", "cuda_sync": "sync",
    "mtia_ccp_events": "kernel",
}
#: Kinds by (category, exact name) where a category holds more than one kind: MTIA's DMA
#: transfers (``args.size`` bytes, ``args.direction``) are copies.
KIND_BY_CAT_NAME = {("mtia_ccp_events", "dma_request"): "memcpy"}
#: The device-op category of MTIA traces: one such event makes the trace's ``device_type`` ``mtia``.
MTIA_CAT = "mtia_ccp_events"
#: Event phases of the Chrome trace format (``ph``); anything else is an error.
PHASES = ("B", "E", "X", "i", "I", "C", "b", "n", "e", "s", "t", "f", "P", "N", "O", "D", "M", "R", "c", "(", ")")
#: Integer args whose presence with a value that is not a number is an error.
CHECKED_INT_ARGS = ("external_id", "correlation", "device", "stream")
#: Complete (``X``) events that are neither device ops nor host ops.
NOT_HOST_CATS = ("gpu_user_annotation", "trace", "ac2g", "async_cpu_to_gpu", "fwdbwd")

#: ``args`` keys read from the JSON, by the name used in SQL. Numbers are read as
#: text because some back-ends write them as strings ("stream": "0x0", "bytes": "256").
ARGS: dict[str, tuple[str, str]] = {
    "external_id": ("External id", "VARCHAR"),
    "correlation": ("correlation", "VARCHAR"),
    "device": ("device", "VARCHAR"),
    "stream": ("stream", "VARCHAR"),
    "bytes": ("bytes", "VARCHAR"),
    "grid": ("grid", "JSON"),
    "block": ("block", "JSON"),
    "regs": ("registers per thread", "VARCHAR"),
    "smem": ("shared memory", "VARCHAR"),
    "occupancy": ("est. achieved occupancy %", "VARCHAR"),
    "graph_id": ("graph id", "VARCHAR"),
    "seq_nr": ("Sequence number", "VARCHAR"),
    "fwd_tid": ("Fwd thread id", "VARCHAR"),
    "input_dims": ("Input Dims", "JSON"),
    "input_types": ("Input type", "JSON"),
    "flops": ("flops", "VARCHAR"),
    "coll_name": ("Collective name", "VARCHAR"),
    "dtype": ("dtype", "VARCHAR"),
    "in_nelems": ("In msg nelems", "VARCHAR"),
    "out_nelems": ("Out msg nelems", "VARCHAR"),
    "group_size": ("Group size", "VARCHAR"),
    "pg_name": ("Process Group Name", "VARCHAR"),
    "pg_desc": ("Process Group Description", "VARCHAR"),
    "pg_ranks": ("Process Group Ranks", "VARCHAR"),
    "coll_seq": ("Seq", "VARCHAR"),
    "src_rank": ("Src Rank", "VARCHAR"),
    "dst_rank": ("Dst Rank", "VARCHAR"),
    "total_allocated": ("Total Allocated", "VARCHAR"),
    "total_reserved": ("Total Reserved", "VARCHAR"),
    "device_id": ("Device Id", "VARCHAR"),
    "device_type": ("Device Type", "VARCHAR"),
    "size": ("size", "VARCHAR"),
}



def _columns_spec() -> str:
    columns = {
        "ph": "VARCHAR", "cat": "VARCHAR", "name": "VARCHAR", "pid": "VARCHAR", "tid": "VARCHAR",
        "ts": "DECIMAL(20,3)", "dur": "DECIMAL(20,3)", "args": _args_type(),
    }
    return "{" + ", ".join(f"{sql_literal(k)}: {sql_literal(v)}" for k, v in columns.items()) + "}"


def _args_type() -> str:
    return "STRUCT(" + ", ".join(f'"{key}" {type_}' for key, type_ in ARGS.values()) + ")"


def _arg(name: str) -> str:
    return f'args."{ARGS[name][0]}"'


def _int_arg(name: str) -> str:
    """An integer arg written as a number, a decimal string or a hex string."""
    raw = _arg(name)
    return (f"coalesce(TRY_CAST({raw} AS BIGINT), TRY_CAST(TRY_CAST({raw} AS DOUBLE) AS BIGINT), "
            f"CASE WHEN {raw} ILIKE '0x%' THEN TRY_CAST({raw} AS UBIGINT) END)")


def _max_object(batch: Path) -> int:
    """DuckDB's JSON reader buffers this much per thread: no event is larger than its batch.

    No more than that, as two groups load at once within the ingest memory limit.
    """
    return batch.stat().st_size + 1024


def _connect(staging: Path, memory_limit: str, threads: int) -> duckdb.DuckDBPyConnection:
    return duckdb.connect(config={
        "memory_limit": memory_limit,
        "threads": threads,
        "temp_directory": str(staging / "duckdb_tmp"),
        "preserve_insertion_order": False,
    })


def _translate(exc: duckdb.Error, source: str) -> Exception:
    if isinstance(exc, duckdb.ConversionException | duckdb.InvalidInputException):
        return UnreadableValue(str(exc).splitlines()[0])
    return TraceFormatError(source, f"could not normalise the trace ({exc})")


_DEVICE_CATS = ", ".join(f"'{c}'" for c in KIND_BY_CAT)
_NOT_HOST = ", ".join(f"'{c}'" for c in (*KIND_BY_CAT, *NOT_HOST_CATS))
_KINDS = " ".join(f"WHEN '{cat}' THEN '{kind}'" for cat, kind in KIND_BY_CAT.items())
_KINDS_BY_NAME = " ".join(f"WHEN lcat = '{cat}' AND name = '{name}' THEN '{kind}'"
                          for (cat, name), kind in KIND_BY_CAT_NAME.items())

#: Row-local columns of device ops, written to Parquet parts as each group loads.
_DEVICE_PART = f"""
    SELECT event_id, name, CASE {_KINDS_BY_NAME} ELSE (CASE lcat {_KINDS} END) END AS kind,
           CAST(coalesce({_int_arg('device')}, num_id(pid)) AS INTEGER) AS device,
           coalesce({_int_arg('stream')}, num_id(tid)) AS stream,
           rel_ns(ts) AS ts_ns, dur_ns(dur) AS dur_ns,
           {_int_arg('correlation')} AS correlation, {_int_arg('external_id')} AS external_id,
           coalesce({_int_arg('bytes')}, {_int_arg('size')}) AS bytes,
           TRY_CAST({_arg('grid')} AS INTEGER[]) AS grid, TRY_CAST({_arg('block')} AS INTEGER[]) AS block,
           {_int_arg('regs')} AS regs, {_int_arg('smem')} AS smem,
           TRY_CAST({_arg('occupancy')} AS DOUBLE) AS occupancy,
           nullif({_int_arg('graph_id')}, 0) AS graph_id
    FROM batch WHERE ph = 'X' AND lcat IN ({_DEVICE_CATS})
"""
#: Row-local columns of host ops.
_HOST_PART = f"""
    SELECT event_id, cat, name, num_id(pid) AS pid, num_id(tid) AS tid,
           rel_ns(ts) AS ts_ns, dur_ns(dur) AS dur_ns,
           {_int_arg('correlation')} AS correlation, {_int_arg('external_id')} AS external_id,
           {_int_arg('seq_nr')} AS sequence_number, {_int_arg('fwd_tid')} AS fwd_thread_id,
           {_arg('input_dims')} AS input_dims, {_arg('input_types')} AS input_types,
           TRY_CAST({_arg('flops')} AS DOUBLE) AS flops
    FROM batch WHERE ph = 'X' AND coalesce(lcat, '') NOT IN ({_NOT_HOST})
"""


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
        #: Scan batches and nest host events natively (else DuckDB's JSON reader and SQL).
        self.native = native
        self.parts = staging / "parts"
        self.parts.mkdir()
        #: Batches as JSON files: every one on the DuckDB path, those with counter events on the native one.
        self.events = staging / "events"
        self.events.mkdir()
        self.con = _connect(staging, memory_limit, threads)
        self._columns = _columns_spec()
        self._local = threading.local()
        self._lock = threading.Lock()
        self._cursors: list[duckdb.DuckDBPyConnection] = []
        self._scanned: dict[str, list[pa.Table]] = {"step_marks": [], "coll_args": [], "memory": []}
        self._hip_calls = 0
        self._mtia_ops = 0
        #: Batch files holding counter (``"ph": "C"``) events, kept for :func:`_counters`.
        self.counter_batches: list[Path] = []
        for statement in _SETUP:
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

    def batch_file(self, first: int, batch: bytes, *, counters: bool) -> Path:
        """Write a batch (its first event is ``traceEvents[first]``) to ``events/``; kept for the end if ``counters``."""
        path = self.events / f"b-{first:012d}.json"
        path.write_bytes(batch)
        if counters:
            with self._lock:
                self.counter_batches.append(path)
        return path

    def scan(self, group: int, first: int, batch: bytes) -> None:
        """Scan batch number ``group`` (JSON array text; its first event is ``traceEvents[first]``) natively.

        Raises:
            TraceFormatError: an event cannot be read.
        """
        scanned = kineto_scan.scan(batch, first, self.source)
        if scanned.counter_events:
            self.batch_file(first, batch, counters=True)
        for table in ("device", "host"):
            # Parts live for one ingest: plain encoding writes faster than dictionaries, and lz4 keeps them small.
            pq.write_table(scanned.tables[table], self.parts / f"{table}-{group:06d}.parquet", compression="lz4",
                           use_dictionary=False)
        with self._lock:
            for table, parts in self._scanned.items():
                if scanned.tables[table].num_rows:
                    parts.append(scanned.tables[table])
            self._hip_calls += scanned.hip_calls
            self._mtia_ops += scanned.mtia_ops

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
        try:
            con.execute(f"""
                CREATE OR REPLACE TEMP TABLE batch AS
                SELECT ordinality - 1 + {int(first)} AS event_id, ph, cat, lower(cat) AS lcat, name,
                       pid, tid, ts, dur, args
                FROM read_json({files}, format = 'array', columns = {self._columns},
                               maximum_object_size = {max(_max_object(path) for path, _ in batches)}) WITH ORDINALITY
                WHERE ph IS NULL OR ph NOT IN ('s', 'f', 'M')
            """)
            _check_batch(con, self.source)
            device_part = sql_literal(str(self.parts / f"device-{group:06d}.parquet"))
            host_part = sql_literal(str(self.parts / f"host-{group:06d}.parquet"))
            con.execute(f"COPY ({_DEVICE_PART}) TO {device_part} (FORMAT parquet, COMPRESSION lz4)")
            con.execute(f"COPY ({_HOST_PART}) TO {host_part} (FORMAT parquet, COMPRESSION lz4)")
            for statement in _PER_BATCH:
                con.execute(statement.format(device_part=device_part, host_part=host_part))
        except duckdb.Error as exc:
            raise _translate(exc, self.source) from exc
        except UnicodeDecodeError as exc:  # DuckDB cut its message, quoting a value, inside a UTF-8 sequence
            raise UnreadableValue("a value DuckDB could not convert (its message is not valid UTF-8)") from exc

    def finish(self, info: TraceInfo, *, trace_id: str, base_ns: int, pg_config: object = None) -> None:
        """Derive the cross-event facts and write ``<table>.parquet`` for every data table; fill ``info``.

        ``pg_config``: ``distributedInfo.pg_config`` (process groups), for collectives derived from kernels.
        """
        started = time.perf_counter()
        con = self.con
        try:
            self._insert_scanned(con)
            _narrow(con, self.parts)
            _steps(con)
            _nesting(con, self.parts, native=self.native)
            _device_steps(con, self.parts)
            _collectives(con, self.parts)
            kernel_collectives.add(con, self.parts, pg_config)
            _counters(con, sorted(self.counter_batches))
            _fill_info(con, info, base_ns)
            _write_tables(con, self.staging, self.parts, trace_id, info.rank, base_ns)
        except duckdb.Error as exc:
            raise _translate(exc, self.source) from exc
        except UnicodeDecodeError as exc:  # DuckDB cut its message, quoting a value, inside a UTF-8 sequence
            raise UnreadableValue("a value DuckDB could not convert (its message is not valid UTF-8)") from exc
        log.debug("normalised %s in %.3fs", self.source, time.perf_counter() - started)

    def _insert_scanned(self, con: duckdb.DuckDBPyConnection) -> None:
        """The rows the native scanner kept for the end, into the tables the DuckDB path fills."""
        targets = {"step_marks": "step_marks", "coll_args": "coll_args", "memory": "counter_rows"}
        for name, parts in self._scanned.items():
            if parts:
                con.register("scanned_rows", pa.concat_tables(parts))
                con.execute(f"INSERT INTO {targets[name]} SELECT * FROM scanned_rows")
                con.unregister("scanned_rows")
        if self._hip_calls or self._mtia_ops:
            con.execute("INSERT INTO facts VALUES (?, ?)", [self._hip_calls, self._mtia_ops])

    def close(self) -> None:
        """Release DuckDB's memory and temporary files."""
        for con in self._cursors:
            con.close()
        self.con.close()


_SETUP = (
    "SET enable_progress_bar = false",  # DuckDB draws one on stdout for long statements
    # Times stay relative to the trace's own zero until the final write adds
    # baseTimeNanoseconds, which some traces only give after the events.
    "CREATE MACRO rel_ns(x) AS CAST(x * 1000 AS BIGINT)",
    "CREATE MACRO dur_ns(x) AS greatest(CAST(x * 1000 AS BIGINT), 0)",
    "CREATE MACRO num_id(s) AS coalesce(TRY_CAST(s AS BIGINT), TRY_CAST(regexp_extract(s, '\\d+') AS BIGINT))",
    "CREATE TABLE step_marks (step BIGINT, ts_ns BIGINT, dur_ns BIGINT)",
    "CREATE TABLE coll_args (event_id BIGINT, coll_name VARCHAR, dtype VARCHAR, process_group VARCHAR, "
    "pg_desc VARCHAR, pg_ranks VARCHAR, in_nelems BIGINT, out_nelems BIGINT, group_size BIGINT, coll_seq BIGINT, "
    "src_rank BIGINT, dst_rank BIGINT)",
    "CREATE TABLE counter_rows (name VARCHAR, device INTEGER, ts_ns BIGINT, value DOUBLE)",
    "CREATE TABLE facts (hip_calls BIGINT, mtia_ops BIGINT)",
)

_MEMORY_DEVICE = f"CASE WHEN {_int_arg('device_type')} = 0 THEN -1 ELSE CAST({_int_arg('device_id')} AS INTEGER) END"

#: What each group leaves in DuckDB: narrow columns and the few rows the end needs.
_PER_BATCH = (
    """INSERT INTO step_marks
       SELECT TRY_CAST(regexp_extract(name, 'ProfilerStep#(\\d+)', 1) AS BIGINT), rel_ns(ts), dur_ns(dur)
       FROM batch WHERE ph = 'X' AND name LIKE 'ProfilerStep#%'""",
    f"""INSERT INTO coll_args
       SELECT event_id, {_arg('coll_name')}, {_arg('dtype')}, {_arg('pg_name')}, {_arg('pg_desc')},
              {_arg('pg_ranks')}, {_int_arg('in_nelems')}, {_int_arg('out_nelems')}, {_int_arg('group_size')},
              {_int_arg('coll_seq')}, {_int_arg('src_rank')}, {_int_arg('dst_rank')}
       FROM batch WHERE ph = 'X' AND {_arg('coll_name')} IS NOT NULL""",
    f"""INSERT INTO counter_rows
       SELECT 'Total Allocated', {_MEMORY_DEVICE}, rel_ns(ts), TRY_CAST({_arg('total_allocated')} AS DOUBLE)
       FROM batch WHERE ph = 'i' AND name = '[memory]' AND {_arg('total_allocated')} IS NOT NULL AND ts IS NOT NULL
       UNION ALL
       SELECT 'Total Reserved', {_MEMORY_DEVICE}, rel_ns(ts), TRY_CAST({_arg('total_reserved')} AS DOUBLE)
       FROM batch WHERE ph = 'i' AND name = '[memory]' AND {_arg('total_reserved')} IS NOT NULL AND ts IS NOT NULL""",
    "INSERT INTO facts SELECT count(*) FILTER (WHERE lcat = 'cuda_runtime' AND name LIKE 'hip%'), "
    f"count(*) FILTER (WHERE ph = 'X' AND lcat = '{MTIA_CAT}') FROM batch",
)


def _check_batch(con: duckdb.DuckDBPyConnection, source: str) -> None:
    """Every event needs a known phase; complete events a start and a duration; ids must be numbers."""
    phases = ", ".join(f"'{p}'" for p in PHASES)
    bad_ids = " OR ".join(f"({_arg(n)} IS NOT NULL AND {_int_arg(n)} IS NULL)" for n in CHECKED_INT_ARGS)
    which_id = " ".join(
        f"WHEN {_arg(n)} IS NOT NULL AND {_int_arg(n)} IS NULL THEN 'args.{ARGS[n][0]}'" for n in CHECKED_INT_ARGS
    )
    bad = con.execute(f"""
        SELECT event_id, name,
               CASE WHEN ph IS NULL THEN 'missing' WHEN ph NOT IN ({phases}) THEN 'phase'
                    WHEN ph = 'X' AND ts IS NULL THEN 'ts' WHEN ph = 'X' AND dur IS NULL THEN 'dur'
                    ELSE CASE {which_id} END END AS problem,
               ph
        FROM batch
        WHERE ph IS NULL OR ph NOT IN ({phases}) OR (ph = 'X' AND (ts IS NULL OR dur IS NULL)) OR {bad_ids}
        ORDER BY event_id LIMIT 1
    """).fetchone()
    if bad is None:
        return
    event_id, name, problem, ph = bad
    key = None
    if problem.startswith("args."):
        problem, key = "id", problem.removeprefix("args.")
    message = kineto_scan.problem_message(problem, name, ph, key)
    raise TraceFormatError(source, message, where=f"traceEvents[{event_id}]")


def _narrow(con: duckdb.DuckDBPyConnection, parts: Path) -> None:
    """The columns the cross-event facts need, read back from the parts (nothing stays resident while loading)."""
    host = sql_literal(str(parts / "host-*.parquet"))
    device = sql_literal(str(parts / "device-*.parquet"))
    if not any(parts.glob("host-*.parquet")):
        con.execute("CREATE VIEW host_n AS SELECT NULL::BIGINT AS event_id, NULL::BIGINT AS pid, NULL::BIGINT AS tid, "
                    "NULL::BIGINT AS ts_ns, NULL::BIGINT AS dur_ns, NULL::BIGINT AS correlation LIMIT 0")
        con.execute("CREATE TABLE dev_n AS SELECT NULL::BIGINT AS event_id, NULL::INTEGER AS device, "
                    "NULL::BIGINT AS ts_ns, NULL::BIGINT AS dur_ns, NULL::BIGINT AS correlation, "
                    "NULL::VARCHAR AS category LIMIT 0")
        return
    con.execute(f"CREATE VIEW host_n AS SELECT event_id, pid, tid, ts_ns, dur_ns, correlation FROM read_parquet({host})")
    con.execute(f"""CREATE VIEW dev_n AS SELECT event_id, device, ts_ns, dur_ns, correlation, {category_sql()} AS category
                    FROM read_parquet({device})""")


def _steps(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("""
        CREATE TABLE steps AS
        SELECT step, min(ts_ns) AS ts_ns, max(ts_ns + dur_ns) - min(ts_ns) AS dur_ns
        FROM step_marks WHERE step IS NOT NULL GROUP BY step
    """)


def _nesting(con: duckdb.DuckDBPyConnection, parts: Path, *, native: bool) -> None:
    """``host_d``: the host events with their depth, parent and step; ``native``: by the native sweep."""
    if native:
        ts_max, dur_max = con.execute(
            "SELECT max(abs(CAST(ts_ns AS HUGEINT))), max(dur_ns) FROM host_n").fetchall()[0]
        if (ts_max or 0) + (dur_max or 0) < kineto_scan.NEST_LIMIT:
            _nesting_native(con, parts / "nesting.parquet")
            return
    _nesting_sql(con)


def _nesting_native(con: duckdb.DuckDBPyConnection, out: Path) -> None:
    """The native sweep over host events sorted by DuckDB (out of core), a batch at a time, into ``out``."""
    steps = con.sql("SELECT step, ts_ns, dur_ns FROM steps ORDER BY ts_ns, step").to_arrow_table()
    nesting = kineto_scan.HostNesting(steps)
    reader = con.sql("""
        SELECT event_id, pid, tid, ts_ns, dur_ns, correlation FROM host_n
        ORDER BY pid, tid, ts_ns, dur_ns DESC, event_id
    """).to_arrow_reader(_NEST_BATCH_ROWS)
    schema = reader.schema.append(pa.field("depth", pa.int32())).append(pa.field("step", pa.int64())).append(
        pa.field("parent_id", pa.int64()))
    with pq.ParquetWriter(out, schema, compression="lz4", use_dictionary=False) as writer:
        for batch in reader:
            writer.write_batch(nesting.add(batch))
    con.execute(f"CREATE VIEW host_d AS SELECT * FROM read_parquet({sql_literal(str(out))})")


#: Host events nested per batch.
_NEST_BATCH_ROWS = 262_144


def _nesting_sql(con: duckdb.DuckDBPyConnection) -> None:
    """Depth, parent and step of host events per thread, by a sweep over starts and ends.

    At equal times ends come before starts (touching is not nesting), longer events
    start first (the parent), and the end of a zero-length event comes after its start.
    """
    con.execute("""
        CREATE TABLE depths AS
        WITH points AS (
            SELECT pid, tid, ts_ns AS t, 1 AS ord, dur_ns, event_id, 1 AS delta FROM host_n
            UNION ALL
            SELECT pid, tid, ts_ns + dur_ns AS t, CASE WHEN dur_ns = 0 THEN 2 ELSE 0 END AS ord,
                   0 AS dur_ns, event_id, -1 AS delta FROM host_n
        ), running AS (
            SELECT event_id, ord,
                   sum(delta) OVER (PARTITION BY pid, tid ORDER BY t, ord, dur_ns DESC, event_id
                                    ROWS UNBOUNDED PRECEDING) AS open
            FROM points
        )
        SELECT event_id, CAST(open - 1 AS INTEGER) AS depth FROM running WHERE ord = 1
    """)
    con.execute("""
        CREATE TABLE host1 AS
        SELECT h.*, d.depth, CASE WHEN h.ts_ns < s.ts_ns + s.dur_ns THEN s.step END AS step
        FROM host_n h JOIN depths d USING (event_id)
        ASOF LEFT JOIN steps s ON h.ts_ns >= s.ts_ns
    """)
    con.execute("""
        CREATE TABLE host_d AS
        SELECT c.*, p.event_id AS parent_id
        FROM host1 c ASOF LEFT JOIN (SELECT pid, tid, depth + 1 AS child_depth, ts_ns, event_id FROM host1) p
          ON c.pid IS NOT DISTINCT FROM p.pid AND c.tid IS NOT DISTINCT FROM p.tid
         AND c.depth = p.child_depth AND c.ts_ns >= p.ts_ns
    """)
    con.execute("DROP TABLE depths; DROP TABLE host1")


def _device_steps(con: duckdb.DuckDBPyConnection, parts: Path) -> None:
    """``dev_d``: the device ops with their step: that of the runtime call that launched them, else by time.

    It goes to a file in ``parts/``, not to a table in DuckDB's memory, where it would
    take from the memory limit that the final joins need.
    """
    out = sql_literal(str(parts / "device_steps.parquet"))
    con.execute(f"""
        COPY (
            SELECT d.*, coalesce(l.step, CASE WHEN d.ts_ns < s.ts_ns + s.dur_ns THEN s.step END) AS step
            FROM dev_n d
            LEFT JOIN (
                SELECT correlation, any_value(step) AS step FROM host_d
                WHERE correlation IS NOT NULL GROUP BY correlation
            ) l USING (correlation)
            ASOF LEFT JOIN steps s ON d.ts_ns >= s.ts_ns
        ) TO {out} (FORMAT parquet, COMPRESSION lz4)
    """)
    con.execute(f"CREATE VIEW dev_d AS SELECT * FROM read_parquet({out})")
    con.execute("""
        CREATE TABLE step_rows AS
        SELECT s.step, s.ts_ns, s.dur_ns, min(d.ts_ns) AS device_start_ns,
               max(d.ts_ns + d.dur_ns) AS device_end_ns, count(d.event_id) AS device_op_count
        FROM steps s LEFT JOIN dev_d d ON d.step = s.step
        GROUP BY ALL
    """)


def _collectives(con: duckdb.DuckDBPyConnection, parts: Path) -> None:
    """Collective calls from ``record_param_comms`` (or NCCL kernel args), linked to kernels."""
    sizes = ", ".join(f"('{k}', {v})" for k, v in DTYPE_BYTES.items())
    con.execute(f"CREATE TABLE dtype_bytes(dtype VARCHAR, size INTEGER); INSERT INTO dtype_bytes VALUES {sizes}")
    con.execute("""
        CREATE TABLE coll_cpu AS
        SELECT c.*, h.pid, h.tid, h.ts_ns, h.dur_ns, h.step
        FROM coll_args c JOIN host_d h USING (event_id)
    """)
    # The kernel of a CPU-side call is launched from inside it, on the same thread.
    con.execute(f"""
        CREATE TABLE coll_links AS
        SELECT event_id, kernel_event_id FROM (
            SELECT c.event_id, k.event_id AS kernel_event_id,
                   row_number() OVER (PARTITION BY c.event_id ORDER BY k.ts_ns, k.event_id) AS n
            FROM coll_cpu c
            JOIN host_d r ON r.pid = c.pid AND r.tid = c.tid AND r.correlation IS NOT NULL
                       AND r.ts_ns >= c.ts_ns AND r.ts_ns <= c.ts_ns + c.dur_ns
            JOIN dev_d k ON k.correlation = r.correlation AND k.category = '{Category.COMMUNICATION}'
        ) WHERE n = 1
    """)
    kernels = sql_literal(str(parts / "device-*.parquet"))
    con.execute(f"""
        CREATE TABLE coll AS
        WITH calls AS (
            SELECT c.*, l.kernel_event_id, c.ts_ns AS cpu_ts_ns, c.dur_ns AS cpu_dur_ns
            FROM coll_cpu c LEFT JOIN coll_links l USING (event_id)
            UNION ALL BY NAME
            -- Kernels that carry collective args but no CPU-side call claimed them.
            SELECT c.*, d.event_id AS kernel_event_id, d.ts_ns, d.dur_ns, d.step
            FROM coll_args c JOIN dev_d d USING (event_id)
            WHERE d.event_id NOT IN (SELECT kernel_event_id FROM coll_links)
        ), kernel AS (
            SELECT event_id, name, stream FROM read_parquet({kernels})
            WHERE event_id IN (SELECT kernel_event_id FROM calls)
        )
        SELECT n.event_id, n.coll_name AS collective, n.process_group, n.pg_desc AS process_group_desc,
               n.pg_ranks AS group_ranks, n.group_size,
               coalesce(n.coll_seq, row_number() OVER (
                   PARTITION BY n.process_group ORDER BY coalesce(n.cpu_ts_ns, n.ts_ns), n.event_id)) AS seq,
               n.dtype, n.in_nelems, n.out_nelems,
               greatest(n.in_nelems, n.out_nelems) * b.size AS message_bytes,
               n.src_rank, n.dst_rank,
               coalesce(k.ts_ns, n.ts_ns) AS ts_ns, coalesce(k.dur_ns, n.dur_ns) AS dur_ns,
               n.cpu_ts_ns, n.cpu_dur_ns, n.kernel_event_id, kn.name AS kernel_name, kn.stream,
               coalesce(n.step, k.step) AS step
        FROM calls n
        LEFT JOIN dev_d k ON k.event_id = n.kernel_event_id
        LEFT JOIN kernel kn ON kn.event_id = n.kernel_event_id
        LEFT JOIN dtype_bytes b ON b.dtype = n.dtype
    """)


def _counters(con: duckdb.DuckDBPyConnection, counter_batches: list[Path]) -> None:
    """``C`` counter events (memory instants were collected per group)."""
    if not counter_batches:
        return
    files = "[" + ", ".join(sql_literal(str(p)) for p in counter_batches) + "]"
    con.execute(f"""
        INSERT INTO counter_rows
        WITH c AS (
            SELECT name, ts, TRY_CAST(args AS MAP(VARCHAR, DOUBLE)) AS m
            FROM read_json({files}, format = 'array',
                           columns = {{'ph': 'VARCHAR', 'name': 'VARCHAR', 'ts': 'DECIMAL(20,3)', 'args': 'JSON'}},
                           maximum_object_size = {max(_max_object(p) for p in counter_batches)})
            WHERE ph = 'C' AND ts IS NOT NULL
        )
        SELECT CASE WHEN key = name THEN name ELSE name || '.' || key END, NULL, rel_ns(ts), value
        FROM (SELECT name, ts, unnest(map_keys(m)) AS key, unnest(map_values(m)) AS value FROM c)
        WHERE value IS NOT NULL
    """)


def _fill_info(con: duckdb.DuckDBPyConnection, info: TraceInfo, base_ns: int) -> None:
    row = con.execute("""
        SELECT min(s), max(e) FROM (
            SELECT min(ts_ns) s, max(ts_ns + dur_ns) e FROM dev_d
            UNION ALL SELECT min(ts_ns), max(ts_ns + dur_ns) FROM host_n)
    """).fetchone()
    start, end = row if row else (None, None)
    info.start_ns = None if start is None else start + base_ns
    info.end_ns = None if end is None else end + base_ns
    info.device_count = con.execute("SELECT count(DISTINCT device) FROM dev_d").fetchone()[0]  # type: ignore[index]
    hip, mtia = con.execute("SELECT sum(hip_calls), sum(mtia_ops) FROM facts").fetchall()[0]
    info.device_type = ("mtia" if mtia else "rocm" if hip else "cuda") if info.device_count else "cpu"
    if info.pid is None:
        found = con.execute(
            "SELECT pid FROM host_n WHERE pid IS NOT NULL GROUP BY pid ORDER BY count(*) DESC LIMIT 1"
        ).fetchone()
        info.pid = found[0] if found else None


_ORDER = {
    "collectives": "ts_ns, event_id",
    "steps": "step",
    "counters": "name, ts_ns",
}

#: Bytes of DuckDB's memory limit per row of the parts joined at once with their
#: cross-event columns, by table. DuckDB does not spill a hash join far enough to join a
#: multi-gigabyte trace within the limit in one go: at 200 MB a 2 GB trace's 3.2M host ops
#: fail, and its 0.94M device ops (their side of the join holds the category text) go out
#: of core at a third of the speed. Larger tables are joined by ranges of event ids, into
#: one file: at the default 200 MB, 1.25M host ops or 250K device ops a range.
JOIN_BYTES_PER_ROW = {"host_ops": 160, "device_ops": 800}
#: Rows per row group of a table joined by ranges (DuckDB's own writer's size): each is
#: held whole, as Arrow and encoded, until written.
_ROW_GROUP_ROWS = 122_880
_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def _memory_limit(con: duckdb.DuckDBPyConnection) -> int:
    """The connection's memory limit in bytes (1 GB where DuckDB words it in a way not known here)."""
    limit = str(con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0])
    number, _, unit = limit.strip().partition(" ")
    try:
        return int(float(number) * _UNITS[unit.upper() or "B"])
    except (KeyError, ValueError):
        return 10**9


def _write_tables(
    con: duckdb.DuckDBPyConnection, staging: Path, parts: Path, trace_id: str, rank: int, base_ns: int
) -> None:
    common = {"trace_id": sql_literal(trace_id), "rank": str(int(rank))}
    base = int(base_ns)

    def shifted(column: str) -> str:
        return f"{column} + {base}" if base else column

    joined = {
        "device_ops": ("device", "dev_d", {
            "event_id": "event_id", "device": "p.device", "stream": "p.stream", "kind": "kind",
            "category": "d.category", "name": "name", "ts_ns": shifted("p.ts_ns"), "dur_ns": "p.dur_ns",
            "correlation": "p.correlation", "external_id": "external_id", "step": "d.step",
            "bytes": "bytes", "grid": "grid", "block": "block", "registers_per_thread": "regs",
            "shared_memory_bytes": "smem", "occupancy_pct": "occupancy", "graph_id": "graph_id",
        }),
        "host_ops": ("host", "host_d", {
            "event_id": "event_id", "pid": "p.pid", "tid": "p.tid", "cat": "cat", "name": "name",
            "ts_ns": shifted("p.ts_ns"), "dur_ns": "p.dur_ns", "depth": "d.depth", "parent_id": "d.parent_id",
            "correlation": "p.correlation", "external_id": "external_id",
            "sequence_number": "sequence_number", "fwd_thread_id": "fwd_thread_id",
            "input_dims": "input_dims", "input_types": "input_types", "flops": "flops", "step": "d.step",
        }),
    }
    for table_name, (part, facts, exprs) in joined.items():
        _write_joined(con, staging / f"{table_name}.parquet", schema.table(table_name),
                      schema.select_list(schema.table(table_name), common | exprs),
                      f"read_parquet({sql_literal(str(parts / f'{part}-*.parquet'))})", facts)
    sources = {
        "collectives": ("coll", {
            c: shifted(c) if c in ("ts_ns", "cpu_ts_ns") else c
            for c in schema.COLLECTIVES.column_names
            if c not in common and c not in ("is_async", "channels")
        } | {"is_async": "FALSE"}),
        "steps": ("step_rows", {
            c: shifted(c) if c in ("ts_ns", "device_start_ns", "device_end_ns") else c
            for c in schema.STEPS.column_names if c not in common
        }),
        "counters": ("counter_rows", {
            c: shifted(c) if c == "ts_ns" else c for c in schema.COUNTERS.column_names if c not in common
        }),
    }
    for table_name, (source, exprs) in sources.items():
        select = schema.select_list(schema.table(table_name), common | exprs)
        out = sql_literal(str(staging / f"{table_name}.parquet"))
        con.execute(f"COPY (SELECT {select} FROM {source} ORDER BY {_ORDER[table_name]}) TO {out} "
                    "(FORMAT parquet, COMPRESSION zstd)")


def _write_joined(
    con: duckdb.DuckDBPyConnection, out: Path, tbl: schema.Table, select: str, part_rows: str, facts: str
) -> None:
    """``out``: the rows of ``part_rows`` (``p``) joined with ``facts`` (``d``) on ``event_id``.

    One statement when the join fits DuckDB's memory limit (see :data:`JOIN_BYTES_PER_ROW`), else
    one range of event ids at a time (:func:`_id_ranges`), streamed into a single Parquet writer.
    """
    query = f"SELECT {select} FROM {part_rows} p JOIN {facts} d USING (event_id)"
    ranges = _id_ranges(con, facts, max(_memory_limit(con) // JOIN_BYTES_PER_ROW[tbl.name], 1))
    if len(ranges) <= 1:
        con.execute(f"COPY ({query}) TO {sql_literal(str(out))} (FORMAT parquet, COMPRESSION zstd)")
        return
    arrow_schema = tbl.arrow_schema
    # Dictionaries pay for the texts (names, categories) only; for numbers they cost writing time.
    texts = [f.name for f in arrow_schema if pa.types.is_string(f.type)]
    with pq.ParquetWriter(out, arrow_schema, compression="zstd", use_dictionary=texts) as writer:
        for first, stop in ranges:
            reader = con.sql(f"{query} WHERE p.event_id >= {first} AND p.event_id < {stop} "
                             f"AND d.event_id >= {first} AND d.event_id < {stop}").to_arrow_reader(_ROW_GROUP_ROWS)
            for batch in reader:
                writer.write_batch(batch.cast(arrow_schema))


#: Buckets of event ids counted to cut the ranges of a join.
_ID_BUCKETS = 1024


def _id_ranges(con: duckdb.DuckDBPyConnection, facts: str, rows_per_range: int) -> list[tuple[int, int]]:
    """Half-open ranges of event ids covering ``facts``, each holding at most ``rows_per_range`` of its rows.

    Cut at bucket edges (a bucket holds ``1/1024`` of the ids; one larger than the budget
    makes a range of its own), so that ops clustered in one part of a trace (Kineto writes
    a thread's CPU ops together) do not overfill a range. Empty for no rows.
    """
    rows, low, high = con.execute(f"SELECT count(*), min(event_id), max(event_id) FROM {facts}").fetchall()[0]
    if not rows:
        return []
    if rows <= rows_per_range:
        return [(low, high + 1)]
    width = -(-(high - low + 1) // _ID_BUCKETS)
    counts = con.execute(f"SELECT (event_id - {low}) // {width} AS bucket, count(*) FROM {facts} "
                         "GROUP BY bucket ORDER BY bucket").fetchall()
    ranges: list[tuple[int, int]] = []
    first, held = low, 0
    for bucket, count in counts:
        if held and held + count > rows_per_range:
            edge = low + bucket * width
            ranges.append((first, edge))
            first, held = edge, 0
        held += count
    ranges.append((first, high + 1))
    return ranges
