"""The Kineto event vocabulary and the row-local SQL of the DuckDB path (stage 2, per batch).

What the JSON reader reads of each event (:data:`ARGS`), which categories are device ops
(:data:`KIND_BY_CAT`), the checks every event must pass (:func:`check_batch`), and the
statements that turn a loaded ``batch`` table into Parquet parts (:data:`DEVICE_PART`,
:data:`HOST_PART`) and the few rows the end needs (:data:`PER_BATCH`). The native scanner
(:mod:`.kineto_scan`) produces the same columns; :mod:`.pytorch_profiler_sql` runs these.
"""

from __future__ import annotations

from pathlib import Path

from tracelake.contracts.concrete import CONCRETE_OPS, CONCRETE_PREFIX
from tracelake.contracts.errors import TraceFormatError
from tracelake.contracts.lazy import duckdb
from tracelake.contracts.schema import sql_literal

from . import kineto_scan


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
    "concrete_inputs": ("Concrete Inputs", "JSON"),
    "record_function_id": ("Record function id", "VARCHAR"),
}
#: ``args`` keys only memory instants need, read by a second look at the batches that hold them
#: (:data:`MEMORY_PART`): DuckDB's structs cannot hold ``Bytes`` beside ``bytes`` (their names ignore case).
MEMORY_ARGS: dict[str, tuple[str, str]] = {
    "mem_bytes": ("Bytes", "VARCHAR"),
    "addr": ("Addr", "VARCHAR"),
}
#: The instants that are allocator events (docs/formats.md, section 1), and the one of them that is a failure.
MEMORY_NAMES = ("[memory]", "[OutOfMemory]")
OOM_NAME = "[OutOfMemory]"
#: ``memory_events.device_type`` by Kineto's numeric ``Device Type``: PyTorch's ``c10::DeviceType``, named
#: as ``DeviceTypeName(type, lower_case=true)`` names them (``PrivateUse1`` by its default name).
DEVICE_TYPES: dict[int, str] = {
    0: "cpu", 1: "cuda", 2: "mkldnn", 3: "opengl", 4: "opencl", 5: "ideep", 6: "hip", 7: "fpga", 8: "maia",
    9: "xla", 10: "vulkan", 11: "metal", 12: "xpu", 13: "mps", 14: "meta", 15: "hpu", 16: "ve", 17: "lazy",
    18: "ipu", 19: "mtia", 20: "privateuseone",
}


def columns_spec() -> str:
    """The ``columns`` argument of ``read_json``: the event fields read, with their DuckDB types."""
    columns = {
        "ph": "VARCHAR", "cat": "VARCHAR", "name": "VARCHAR", "pid": "VARCHAR", "tid": "VARCHAR",
        "ts": "DECIMAL(20,3)", "dur": "DECIMAL(20,3)", "args": _args_type(),
    }
    return "{" + ", ".join(f"{sql_literal(k)}: {sql_literal(v)}" for k, v in columns.items()) + "}"


def memory_columns_spec() -> str:
    """The ``columns`` argument of the second ``read_json`` of batches holding memory instants."""
    keys = [ARGS[n] for n in _MEMORY_SHARED_ARGS] + list(MEMORY_ARGS.values())
    columns = {
        "ph": "VARCHAR", "name": "VARCHAR", "pid": "VARCHAR", "tid": "VARCHAR", "ts": "DECIMAL(20,3)",
        "args": "STRUCT(" + ", ".join(f'"{key}" {type_}' for key, type_ in keys) + ")",
    }
    return "{" + ", ".join(f"{sql_literal(k)}: {sql_literal(v)}" for k, v in columns.items()) + "}"


#: The memory instants' args that the first read has too (under the same names).
_MEMORY_SHARED_ARGS = ("total_allocated", "total_reserved", "device_id", "device_type")


def _args_type() -> str:
    return "STRUCT(" + ", ".join(f'"{key}" {type_}' for key, type_ in ARGS.values()) + ")"


def _arg(name: str) -> str:
    return f'args."{(ARGS.get(name) or MEMORY_ARGS[name])[0]}"'


def _int_arg(name: str) -> str:
    """An integer arg written as a number, a decimal string or a hex string."""
    raw = _arg(name)
    return (f"coalesce(TRY_CAST({raw} AS BIGINT), TRY_CAST(TRY_CAST({raw} AS DOUBLE) AS BIGINT), "
            f"CASE WHEN {raw} ILIKE '0x%' THEN TRY_CAST({raw} AS UBIGINT) END)")


def max_object(batch: Path) -> int:
    """DuckDB's JSON reader buffers this much per thread: no event is larger than its batch.

    No more than that, as two groups load at once within the ingest memory limit.
    """
    return batch.stat().st_size + 1024


_DEVICE_CATS = ", ".join(f"'{c}'" for c in KIND_BY_CAT)
_NOT_HOST = ", ".join(f"'{c}'" for c in (*KIND_BY_CAT, *NOT_HOST_CATS))
_KINDS = " ".join(f"WHEN '{cat}' THEN '{kind}'" for cat, kind in KIND_BY_CAT.items())
_KINDS_BY_NAME = " ".join(f"WHEN lcat = '{cat}' AND name = '{name}' THEN '{kind}'"
                          for (cat, name), kind in KIND_BY_CAT_NAME.items())

#: Row-local columns of device ops, written to Parquet parts as each group loads.
DEVICE_PART = f"""
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
#: Whether an event's name keeps its ``Concrete Inputs`` (:mod:`tracelake.contracts.concrete`).
_KEEPS_CONCRETE = (f"(starts_with(name, {sql_literal(CONCRETE_PREFIX)}) OR name IN "
                   f"({', '.join(sql_literal(n) for n in sorted(CONCRETE_OPS))}))")
#: Row-local columns of host ops. ``concrete_inputs`` (``Concrete Inputs``) only of the ops that keep it.
HOST_PART = f"""
    SELECT event_id, cat, name, num_id(pid) AS pid, num_id(tid) AS tid,
           rel_ns(ts) AS ts_ns, dur_ns(dur) AS dur_ns,
           {_int_arg('correlation')} AS correlation, {_int_arg('external_id')} AS external_id,
           {_int_arg('seq_nr')} AS sequence_number, {_int_arg('fwd_tid')} AS fwd_thread_id,
           {_arg('input_dims')} AS input_dims, {_arg('input_types')} AS input_types,
           TRY_CAST({_arg('flops')} AS DOUBLE) AS flops,
           CASE WHEN {_KEEPS_CONCRETE} THEN {_arg('concrete_inputs')} END AS concrete_inputs,
           nullif({_int_arg('record_function_id')}, 0) AS record_function_id
    FROM batch WHERE ph = 'X' AND coalesce(lcat, '') NOT IN ({_NOT_HOST})
"""


SETUP = (
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
PER_BATCH = (
    """INSERT INTO step_marks
       SELECT TRY_CAST(regexp_extract(name, 'ProfilerStep#(\\d+)', 1) AS BIGINT), rel_ns(ts), dur_ns(dur)
       FROM batch WHERE ph = 'X' AND name LIKE 'ProfilerStep#%'""",
    f"""INSERT INTO coll_args
       SELECT event_id, {_arg('coll_name')}, {_arg('dtype')}, {_arg('pg_name')}, {_arg('pg_desc')},
              {_arg('pg_ranks')}, {_int_arg('in_nelems')}, {_int_arg('out_nelems')}, {_int_arg('group_size')},
              {_int_arg('coll_seq')}, {_int_arg('src_rank')}, {_int_arg('dst_rank')}
       FROM batch WHERE ph = 'X' AND {_arg('coll_name')} IS NOT NULL""",
    "INSERT INTO facts SELECT count(*) FILTER (WHERE lcat = 'cuda_runtime' AND name LIKE 'hip%'), "
    f"count(*) FILTER (WHERE ph = 'X' AND lcat = '{MTIA_CAT}') FROM batch",
)

_MEMORY_NAMES_SQL = ", ".join(sql_literal(n) for n in MEMORY_NAMES)
#: The memory instants of a loaded ``batch``: which batch files the second look (:func:`memory_batch`) reads.
MEMORY_EVENT_IDS = f"SELECT event_id FROM batch WHERE ph = 'i' AND name IN ({_MEMORY_NAMES_SQL}) ORDER BY event_id"


def _bigint_arg(name: str) -> str:
    """:func:`_int_arg` where a hex value beyond BIGINT is null (as the native scanner reads it), not an error."""
    return f"TRY_CAST({_int_arg(name)} AS BIGINT)"


def memory_batch(files: list[tuple[str, int]], object_bytes: int) -> str:
    """The memory instants of batch files (path, index of its first event), each numbered from its first event."""
    spec = memory_columns_spec()
    return " UNION ALL ".join(f"""
        SELECT ordinality - 1 + {int(first)} AS event_id, name, pid, tid, ts, args
        FROM read_json({sql_literal(path)}, format = 'array', columns = {spec},
                       maximum_object_size = {int(object_bytes)}) WITH ORDINALITY
        WHERE ph = 'i' AND name IN ({_MEMORY_NAMES_SQL})""" for path, first in files)


#: Row-local columns of memory instants (from ``mem_batch``, made by :func:`memory_batch`), written to Parquet
#: parts (``memory-*.parquet``) as each group loads; ``op`` and ``step`` are added at the end.
MEMORY_PART = f"""
    SELECT event_id, num_id(pid) AS pid, num_id(tid) AS tid, {_MEMORY_DEVICE} AS device,
           {_bigint_arg('device_type')} AS device_type, rel_ns(ts) AS ts_ns,
           CASE WHEN name = {sql_literal(OOM_NAME)} THEN 'oom' WHEN bytes > 0 THEN 'alloc'
                WHEN bytes < 0 THEN 'free' END AS kind,
           {_bigint_arg('addr')} AS addr, bytes, {_bigint_arg('total_allocated')} AS total_allocated,
           {_bigint_arg('total_reserved')} AS total_reserved
    FROM (SELECT *, {_bigint_arg('mem_bytes')} AS bytes FROM mem_batch)
"""


def check_batch(con: duckdb.DuckDBPyConnection, source: str) -> None:
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
