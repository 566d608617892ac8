"""Stage 2 of the Kineto parser: staged rows -> warehouse tables, in DuckDB.

Runs out of core (DuckDB spills to the staging directory) so a trace of any size
normalises within the configured memory limit.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import duckdb

from tracelake.analysis.classify import category_sql
from tracelake.warehouse import schema
from tracelake.warehouse.errors import TraceFormatError

from .model import TraceInfo

log = logging.getLogger(__name__)

#: Bytes per element of the dtypes PyTorch writes in ``record_param_comms`` args.
DTYPE_BYTES: dict[str, int] = {
    "Float": 4, "float": 4, "Float32": 4, "Double": 8, "Half": 2, "BFloat16": 2,
    "Float8_e4m3fn": 1, "Float8_e5m2": 1, "Float8_e4m3fnuz": 1, "Float8_e5m2fnuz": 1,
    "Byte": 1, "Char": 1, "Bool": 1, "Short": 2, "Int": 4, "Long": 8,
    "ComplexFloat": 8, "ComplexDouble": 16, "UInt16": 2, "UInt32": 4, "UInt64": 8,
}

#: Device op kinds by Kineto event category.
KIND_BY_CAT = {
    "kernel": "kernel", "gpu_memcpy": "memcpy", "memcpy": "memcpy",
    "gpu_memset": "memset", "memset": "memset", "cuda_sync": "sync",
}

_STAGED_COLUMNS = {
    "device": "event_id BIGINT, cat VARCHAR, name VARCHAR, pid BIGINT, pid_s VARCHAR, tid BIGINT, tid_s VARCHAR, "
    "ts VARCHAR, dur VARCHAR, device BIGINT, stream BIGINT, correlation BIGINT, external_id BIGINT, bytes BIGINT, "
    "grid INTEGER[], block INTEGER[], regs BIGINT, smem BIGINT, occupancy DOUBLE",
    "host": "event_id BIGINT, cat VARCHAR, name VARCHAR, pid BIGINT, pid_s VARCHAR, tid BIGINT, tid_s VARCHAR, "
    "ts VARCHAR, dur VARCHAR, correlation BIGINT, external_id BIGINT, seq_nr BIGINT, fwd_tid BIGINT, "
    "input_dims VARCHAR, input_types VARCHAR, flops DOUBLE",
    "coll": "event_id BIGINT, source VARCHAR, coll_name VARCHAR, dtype VARCHAR, in_nelems BIGINT, out_nelems BIGINT, "
    "group_size BIGINT, pg_name VARCHAR, pg_desc VARCHAR, pg_ranks VARCHAR, coll_seq BIGINT, src_rank BIGINT, dst_rank BIGINT",
    "meta": "name VARCHAR, pid BIGINT, pid_s VARCHAR, tid BIGINT, value VARCHAR",
    "memory": "pid BIGINT, ts VARCHAR, total_allocated DOUBLE, total_reserved DOUBLE, device_id BIGINT",
    "counter": "name VARCHAR, pid BIGINT, ts VARCHAR, value DOUBLE",
}


def _connect(staging: Path, memory_limit: str, threads: int) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(config={
        "memory_limit": memory_limit,
        "threads": threads,
        "temp_directory": str(staging / "duckdb_tmp"),
        "preserve_insertion_order": False,
    })
    return con


def _load_staged(con: duckdb.DuckDBPyConnection, staging: Path, staged: list[str]) -> None:
    for name, columns in _STAGED_COLUMNS.items():
        if name in staged:
            path = staging / f"raw_{name}.parquet"
            con.execute(f"CREATE VIEW raw_{name} AS SELECT * FROM read_parquet('{_sql_path(path)}')")
        else:
            con.execute(f"CREATE TABLE raw_{name} ({columns})")


def _sql_path(path: Path) -> str:
    return str(path).replace("'", "''")


def _check_times(con: duckdb.DuckDBPyConnection, table: str, source: str) -> None:
    bad = con.execute(
        f"SELECT event_id, name, ts_ns IS NULL AS no_ts FROM {table} "
        "WHERE ts_ns IS NULL OR dur_ns IS NULL ORDER BY event_id LIMIT 1"
    ).fetchone()
    if bad:
        event_id, name, no_ts = bad
        field = "ts" if no_ts else "dur"
        raise TraceFormatError(
            source,
            f"event {name!r} has a missing or non-numeric {field!r}",
            where=f"traceEvents[{event_id}]",
        )


def normalise(
    staging: Path,
    staged: list[str],
    info: TraceInfo,
    *,
    trace_id: str,
    base_ns: int,
    memory_limit: str,
    threads: int,
    source: str,
) -> None:
    """Write ``<table>.parquet`` for every data table into ``staging`` and fill ``info``."""
    started = time.perf_counter()
    con = _connect(staging, memory_limit, threads)
    try:
        _load_staged(con, staging, staged)
        con.execute(f"CREATE MACRO us_ns(x) AS CAST(TRY_CAST(x AS DECIMAL(20,3)) * 1000 AS BIGINT) + {int(base_ns)}")
        con.execute("CREATE MACRO dur_ns(x) AS greatest(CAST(TRY_CAST(x AS DECIMAL(20,3)) * 1000 AS BIGINT), 0)")
        con.execute("CREATE MACRO num_id(i, s) AS coalesce(i, TRY_CAST(regexp_extract(s, '\\d+') AS BIGINT))")
        kinds = " ".join(f"WHEN '{cat}' THEN '{kind}'" for cat, kind in KIND_BY_CAT.items())
        con.execute(f"""
            CREATE TABLE dev AS
            SELECT event_id, name,
                   CASE lower(cat) {kinds} ELSE 'kernel' END AS kind,
                   CAST(coalesce(device, num_id(pid, pid_s)) AS INTEGER) AS device,
                   coalesce(stream, num_id(tid, tid_s)) AS stream,
                   us_ns(ts) AS ts_ns, dur_ns(dur) AS dur_ns,
                   correlation, external_id, bytes, grid, block, regs, smem, occupancy
            FROM raw_device
        """)
        _check_times(con, "dev", source)
        con.execute("""
            CREATE TABLE host0 AS
            SELECT event_id, cat, name, num_id(pid, pid_s) AS pid, num_id(tid, tid_s) AS tid,
                   us_ns(ts) AS ts_ns, dur_ns(dur) AS dur_ns,
                   correlation, external_id, seq_nr, fwd_tid, input_dims, input_types, flops
            FROM raw_host
        """)
        _check_times(con, "host0", source)
        _steps(con)
        _nesting(con)
        _device_steps(con)
        _collectives(con)
        _counters(con)
        _fill_info(con, info)
        _write_tables(con, staging, trace_id, info.rank)
    except duckdb.Error as exc:
        raise TraceFormatError(source, f"could not normalise the trace ({exc})") from exc
    finally:
        con.close()
    log.debug("normalised %s in %.3fs", source, time.perf_counter() - started)


def _steps(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("""
        CREATE TABLE steps AS
        SELECT step, min(ts_ns) AS ts_ns, max(ts_ns + dur_ns) - min(ts_ns) AS dur_ns
        FROM (
            SELECT TRY_CAST(regexp_extract(name, 'ProfilerStep#(\\d+)', 1) AS BIGINT) AS step, ts_ns, dur_ns
            FROM host0 WHERE name LIKE 'ProfilerStep#%'
        ) WHERE step IS NOT NULL
        GROUP BY step
    """)


def _nesting(con: duckdb.DuckDBPyConnection) -> None:
    """Depth and parent of host events per thread, by a sweep over starts and ends.

    At equal times ends come before starts (touching is not nesting), longer events
    start first (the parent), and the end of a zero-length event comes after its start.
    """
    con.execute("""
        CREATE TABLE depths AS
        WITH points AS (
            SELECT pid, tid, ts_ns AS t, 1 AS ord, dur_ns, event_id, 1 AS delta FROM host0
            UNION ALL
            SELECT pid, tid, ts_ns + dur_ns AS t, CASE WHEN dur_ns = 0 THEN 2 ELSE 0 END AS ord,
                   0 AS dur_ns, event_id, -1 AS delta FROM host0
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
        FROM host0 h JOIN depths d USING (event_id)
        ASOF LEFT JOIN steps s ON h.ts_ns >= s.ts_ns
    """)
    con.execute("""
        CREATE TABLE host AS
        SELECT c.*, p.event_id AS parent_id
        FROM host1 c ASOF LEFT JOIN (SELECT pid, tid, depth, ts_ns, event_id FROM host1) p
          ON c.pid IS NOT DISTINCT FROM p.pid AND c.tid IS NOT DISTINCT FROM p.tid
         AND c.depth - 1 = p.depth AND c.ts_ns >= p.ts_ns
    """)


def _device_steps(con: duckdb.DuckDBPyConnection) -> None:
    """A device op belongs to the step of the runtime call that launched it, else by time."""
    con.execute(f"""
        CREATE TABLE device AS
        SELECT d.*, {category_sql('d.kind', 'd.name')} AS category,
               coalesce(l.step, CASE WHEN d.ts_ns < s.ts_ns + s.dur_ns THEN s.step END) AS step
        FROM dev d
        LEFT JOIN (
            SELECT correlation, any_value(step) AS step FROM host
            WHERE correlation IS NOT NULL GROUP BY correlation
        ) l USING (correlation)
        ASOF LEFT JOIN steps s ON d.ts_ns >= s.ts_ns
    """)
    con.execute("""
        CREATE TABLE step_rows AS
        SELECT s.step, s.ts_ns, s.dur_ns, min(d.ts_ns) AS device_start_ns,
               max(d.ts_ns + d.dur_ns) AS device_end_ns, count(d.event_id) AS device_op_count
        FROM steps s LEFT JOIN device d ON d.step = s.step
        GROUP BY ALL
    """)


def _collectives(con: duckdb.DuckDBPyConnection) -> None:
    """Collective calls from ``record_param_comms`` (or NCCL kernel args), linked to kernels."""
    sizes = ", ".join(f"('{k}', {v})" for k, v in DTYPE_BYTES.items())
    con.execute(f"CREATE TABLE dtype_bytes(dtype VARCHAR, size INTEGER); INSERT INTO dtype_bytes VALUES {sizes}")
    con.execute("""
        CREATE TABLE coll_cpu AS
        SELECT c.*, h.pid, h.tid, h.ts_ns, h.dur_ns, h.step
        FROM raw_coll c JOIN host h USING (event_id) WHERE c.source = 'cpu_op'
    """)
    # The kernel of a CPU-side call is launched from inside it, on the same thread.
    con.execute("""
        CREATE TABLE coll_links AS
        SELECT event_id, kernel_event_id FROM (
            SELECT c.event_id, k.event_id AS kernel_event_id,
                   row_number() OVER (PARTITION BY c.event_id ORDER BY k.ts_ns, k.event_id) AS n
            FROM coll_cpu c
            JOIN host r ON r.pid = c.pid AND r.tid = c.tid AND r.correlation IS NOT NULL
                       AND r.ts_ns >= c.ts_ns AND r.ts_ns <= c.ts_ns + c.dur_ns
            JOIN device k ON k.correlation = r.correlation AND k.category = 'communication'
        ) WHERE n = 1
    """)
    con.execute("""
        CREATE TABLE coll AS
        WITH calls AS (
            SELECT c.*, l.kernel_event_id, c.ts_ns AS cpu_ts_ns, c.dur_ns AS cpu_dur_ns
            FROM coll_cpu c LEFT JOIN coll_links l USING (event_id)
            UNION ALL BY NAME
            SELECT c.*, d.event_id AS kernel_event_id, NULL AS cpu_ts_ns, NULL AS cpu_dur_ns,
                   d.ts_ns, d.dur_ns, d.step
            FROM raw_coll c JOIN device d USING (event_id)
            WHERE c.source = 'kernel' AND d.event_id NOT IN (
                SELECT kernel_event_id FROM coll_links WHERE kernel_event_id IS NOT NULL)
        ), named AS (
            SELECT calls.*, trim(pg_name, '"') AS process_group
            FROM calls
        )
        SELECT n.event_id, n.coll_name AS collective, n.process_group, n.pg_desc AS process_group_desc,
               trim(n.pg_ranks, '"') AS group_ranks, n.group_size,
               coalesce(n.coll_seq, row_number() OVER (
                   PARTITION BY n.process_group ORDER BY coalesce(n.cpu_ts_ns, n.ts_ns), n.event_id)) AS seq,
               n.dtype, n.in_nelems, n.out_nelems,
               greatest(n.in_nelems, n.out_nelems) * b.size AS message_bytes,
               n.src_rank, n.dst_rank,
               coalesce(k.ts_ns, n.ts_ns) AS ts_ns, coalesce(k.dur_ns, n.dur_ns) AS dur_ns,
               n.cpu_ts_ns, n.cpu_dur_ns, n.kernel_event_id, k.name AS kernel_name, k.stream,
               coalesce(n.step, k.step) AS step
        FROM named n
        LEFT JOIN device k ON k.event_id = n.kernel_event_id
        LEFT JOIN dtype_bytes b ON b.dtype = n.dtype
    """)


def _counters(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("""
        CREATE TABLE counter_rows AS
        SELECT name, device, us_ns(ts) AS ts_ns, value FROM (
            SELECT 'Total Allocated' AS name, CAST(device_id AS INTEGER) AS device, ts, total_allocated AS value
            FROM raw_memory WHERE total_allocated IS NOT NULL
            UNION ALL
            SELECT 'Total Reserved', CAST(device_id AS INTEGER), ts, total_reserved
            FROM raw_memory WHERE total_reserved IS NOT NULL
            UNION ALL
            SELECT name, NULL, ts, value FROM raw_counter
        ) WHERE us_ns(ts) IS NOT NULL
    """)


def _fill_info(con: duckdb.DuckDBPyConnection, info: TraceInfo) -> None:
    row = con.execute("""
        SELECT min(s), max(e) FROM (
            SELECT min(ts_ns) s, max(ts_ns + dur_ns) e FROM device
            UNION ALL SELECT min(ts_ns), max(ts_ns + dur_ns) FROM host)
    """).fetchone()
    info.start_ns, info.end_ns = (row[0], row[1]) if row else (None, None)
    info.device_count = con.execute("SELECT count(DISTINCT device) FROM device").fetchone()[0]  # type: ignore[index]
    hip = con.execute("SELECT count(*) FROM host WHERE name LIKE 'hip%' AND cat = 'cuda_runtime'").fetchone()[0]  # type: ignore[index]
    if info.device_count:
        info.device_type = "rocm" if hip else "cuda"
    else:
        info.device_type = "cpu"
    if info.pid is None:
        found = con.execute(
            "SELECT pid FROM host WHERE cat = 'cpu_op' AND pid IS NOT NULL GROUP BY pid ORDER BY count(*) DESC LIMIT 1"
        ).fetchone()
        info.pid = found[0] if found else None


_ORDER = {
    "device_ops": "device, stream, ts_ns",
    "host_ops": "pid, tid, ts_ns, event_id",
    "collectives": "ts_ns, event_id",
    "steps": "step",
    "counters": "name, ts_ns",
}


def _write_tables(con: duckdb.DuckDBPyConnection, staging: Path, trace_id: str, rank: int) -> None:
    common = {"trace_id": f"'{trace_id}'", "rank": str(int(rank))}
    sources = {
        "device_ops": ("device", {
            "event_id": "event_id", "device": "device", "stream": "stream", "kind": "kind",
            "category": "category", "name": "name", "ts_ns": "ts_ns", "dur_ns": "dur_ns",
            "correlation": "correlation", "external_id": "external_id", "step": "step",
            "bytes": "bytes", "grid": "grid", "block": "block", "registers_per_thread": "regs",
            "shared_memory_bytes": "smem", "occupancy_pct": "occupancy",
        }),
        "host_ops": ("host", {
            "event_id": "event_id", "pid": "pid", "tid": "tid", "cat": "cat", "name": "name",
            "ts_ns": "ts_ns", "dur_ns": "dur_ns", "depth": "depth", "parent_id": "parent_id",
            "correlation": "correlation", "external_id": "external_id",
            "sequence_number": "seq_nr", "fwd_thread_id": "fwd_tid", "input_dims": "input_dims",
            "input_types": "input_types", "flops": "flops", "step": "step",
        }),
        "collectives": ("coll", {c: c for c in schema.COLLECTIVES.column_names if c not in common}),
        "steps": ("step_rows", {c: c for c in schema.STEPS.column_names if c not in common}),
        "counters": ("counter_rows", {c: c for c in schema.COUNTERS.column_names if c not in common}),
    }
    for table_name, (source, exprs) in sources.items():
        tbl = schema.table(table_name)
        select = schema.select_list(tbl, common | exprs)
        out = _sql_path(staging / f"{table_name}.parquet")
        con.execute(
            f"COPY (SELECT {select} FROM {source} ORDER BY {_ORDER[table_name]}) "
            f"TO '{out}' (FORMAT parquet, COMPRESSION zstd)"
        )
