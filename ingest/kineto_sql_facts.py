"""The cross-event facts of a Kineto trace (stage 2, at the end), derived in DuckDB.

From narrow columns read back from the Parquet parts (:func:`narrow`): the steps, the nesting
of host events (natively where the scanner is built, else in SQL), the step of every device
op, the collective calls linked to their kernels, the counters, the operator and step of every
memory instant, and the trace's span and device type. :meth:`.pytorch_profiler_sql.Normaliser.finish`
runs them in this order; :mod:`.kineto_sql_tables` joins the results onto the parts.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tracelake.contracts.classify import Category, category_sql
from tracelake.contracts.lazy import duckdb
from tracelake.contracts.schema import sql_literal

from . import kineto_memory_facts, kineto_memory_ops, kineto_nesting, kineto_scan, kineto_sql_tables
from .kineto_sql_events import DEVICE_TYPES, DTYPE_BYTES, max_object
from .model import TraceInfo


def narrow(con: duckdb.DuckDBPyConnection, parts: Path) -> None:
    """The columns the cross-event facts need, read back from the parts (nothing stays resident while loading)."""
    device = sql_literal(str(parts / "device-*.parquet"))
    _host_n(con, parts)
    if not any(parts.glob("host-*.parquet")):
        con.execute("CREATE TABLE dev_n AS SELECT NULL::BIGINT AS event_id, NULL::INTEGER AS device, "
                    "NULL::BIGINT AS ts_ns, NULL::BIGINT AS dur_ns, NULL::BIGINT AS correlation, "
                    "NULL::VARCHAR AS category LIMIT 0")
        return
    # The category's patterns run once per distinct (kind, name), not per op: a few dozen kernel names make up
    # 100,000s of ops, and the patterns over every op's long name were most of device_steps' time. The names'
    # categories are a table (its size known, the join builds on it), and the ops with theirs a file: a view
    # holding the join let DuckDB plan device_steps' joins around it and run out of memory on a 1 GB trace.
    con.execute(f"""CREATE TABLE dev_cat AS SELECT kind, name, {category_sql()} AS category
                    FROM (SELECT DISTINCT kind, name FROM read_parquet({device}))""")
    narrow_ops = sql_literal(str(parts / "dev_n.parquet"))
    con.execute(f"""COPY (SELECT d.event_id, d.device, d.ts_ns, d.dur_ns, d.correlation, c.category
                          FROM read_parquet({device}) d JOIN dev_cat c
                          ON d.kind IS NOT DISTINCT FROM c.kind AND d.name IS NOT DISTINCT FROM c.name)
                    TO {narrow_ops} (FORMAT parquet, COMPRESSION lz4)""")
    con.execute(f"CREATE VIEW dev_n AS SELECT * FROM read_parquet({narrow_ops})")


def _host_n(con: duckdb.DuckDBPyConnection, parts: Path) -> None:
    """``host_n``: the narrow columns of the host events in the parts (none where there are no host parts)."""
    if any(parts.glob("host-*.parquet")):
        con.execute("CREATE VIEW host_n AS SELECT event_id, pid, tid, ts_ns, dur_ns, correlation "
                    f"FROM read_parquet({sql_literal(str(parts / 'host-*.parquet'))})")
    else:
        con.execute("CREATE VIEW host_n AS SELECT NULL::BIGINT AS event_id, NULL::BIGINT AS pid, NULL::BIGINT AS tid, "
                    "NULL::BIGINT AS ts_ns, NULL::BIGINT AS dur_ns, NULL::BIGINT AS correlation LIMIT 0")


def steps(con: duckdb.DuckDBPyConnection) -> None:
    """``steps``: each ``ProfilerStep#N`` from its first mark to the end of its last; and their :func:`step_spans`."""
    con.execute("""
        CREATE TABLE steps AS
        SELECT step, min(ts_ns) AS ts_ns, max(ts_ns + dur_ns) - min(ts_ns) AS dur_ns
        FROM step_marks WHERE step IS NOT NULL GROUP BY step
    """)
    step_spans(con)


def step_spans(con: duckdb.DuckDBPyConnection) -> None:
    """``step_spans``: the time the ``steps`` cover, cut into disjoint spans ``[ts_ns, end_ns)``, each with its step.

    A time belongs to the step that contains it (``ts_ns <= t < ts_ns + dur_ns``) and, where
    steps overlap or nest, to the one that starts last, then ends first (the innermost), then
    has the highest number. Between two consecutive step starts or ends the steps containing
    a time do not change, so one lookup (an ASOF join on ``ts_ns``, then ``t < end_ns``)
    gives every event its step, with no tie left to chance.
    ``kineto_scan.HostNesting`` applies the same rule natively.
    """
    con.execute("""
        CREATE TABLE step_spans AS
        WITH bounds AS (
            SELECT ts_ns AS t FROM steps WHERE dur_ns > 0
            UNION SELECT ts_ns + dur_ns FROM steps WHERE dur_ns > 0
        ), spans AS (
            SELECT t AS ts_ns, lead(t) OVER (ORDER BY t) AS end_ns FROM bounds
        )
        SELECT p.ts_ns, p.end_ns, s.step
        FROM spans p JOIN steps s ON s.ts_ns <= p.ts_ns AND p.ts_ns < s.ts_ns + s.dur_ns
        WHERE p.end_ns IS NOT NULL
        QUALIFY row_number() OVER (
            PARTITION BY p.ts_ns ORDER BY s.ts_ns DESC, s.ts_ns + s.dur_ns, s.step DESC) = 1
    """)


def nesting(con: duckdb.DuckDBPyConnection, parts: Path, *, native: bool) -> None:
    """``host_d``: the host events with their depth, parent and step; ``native``: by the native sweep."""
    if native:
        ts_max, dur_max, threads = con.execute(
            "SELECT max(abs(CAST(ts_ns AS HUGEINT))), max(dur_ns), approx_count_distinct(hash(pid, tid)) "
            "FROM host_n").fetchall()[0]
        if any(parts.glob("memory-*.parquet")):  # the memory instants ride the sweep too
            instant_max, instant_threads = con.execute(
                "SELECT max(abs(CAST(ts_ns AS HUGEINT))), approx_count_distinct(hash(pid, tid)) FROM "
                f"read_parquet({sql_literal(str(parts / 'memory-*.parquet'))})").fetchall()[0]
            ts_max = max(ts_max or 0, instant_max or 0)
            threads += instant_threads
        if (ts_max or 0) + (dur_max or 0) < kineto_scan.NEST_LIMIT:
            _nesting_native(con, parts / "nesting.parquet", threads)
            return
    nesting_sql(con)


def _nesting_native(con: duckdb.DuckDBPyConnection, out: Path, threads: int) -> None:
    """The native sweep (:func:`.kineto_nesting.sweep`) over the host events, sorted by DuckDB a slice of time at a
    time, into ``out``; where the trace has memory instants, they ride the same sweep and each instant's op is found
    on the way, into ``mem_op_ids.parquet`` beside ``out``: no second sort of the host events."""
    steps = con.sql("SELECT step, ts_ns, dur_ns FROM steps ORDER BY ts_ns, step").to_arrow_table()
    with kineto_sql_tables.side_connection(con) as sorter:  # half the limit: SIDE_SHARE
        kineto_nesting.sweep(sorter, out, steps, threads)
    con.execute(f"CREATE VIEW host_d AS SELECT * FROM read_parquet({sql_literal(str(out))})")


def nesting_sql(con: duckdb.DuckDBPyConnection) -> None:
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
        SELECT h.*, d.depth, CASE WHEN h.ts_ns < s.end_ns THEN s.step END AS step
        FROM host_n h JOIN depths d USING (event_id)
        ASOF LEFT JOIN step_spans s ON h.ts_ns >= s.ts_ns
    """)
    con.execute("""
        CREATE TABLE host_d AS
        SELECT c.*, p.event_id AS parent_id
        FROM host1 c ASOF LEFT JOIN (SELECT pid, tid, depth + 1 AS child_depth, ts_ns, event_id FROM host1) p
          ON c.pid IS NOT DISTINCT FROM p.pid AND c.tid IS NOT DISTINCT FROM p.tid
         AND c.depth = p.child_depth AND c.ts_ns >= p.ts_ns
    """)
    con.execute("DROP TABLE depths; DROP TABLE host1")


#: The span of an event id, and the least one: ``device_steps`` orders the launch calls by one HUGEINT, the start
#: times the span plus the id above the least, where a (start, id) struct took 0.62 s to group the 4 GB Qwen shape's
#: 1.29 M correlations and the number 0.36 s.
_ID_SPAN, _ID_LOW = 2**64, -2**63


def device_steps(con: duckdb.DuckDBPyConnection, parts: Path) -> None:
    """``dev_d``: the device ops with their step: that of the runtime call that launched them, else by time.

    The launch is the host event with the op's ``correlation`` that lies in a step; where
    several do (a correlation reused), the earliest (by start, then ``event_id``: a host event has a step only where
    it has a start, so every one compared has one). By time,
    the step is that of :func:`step_spans` at the op's start.

    It goes to a file in ``parts/``, not to a table in DuckDB's memory, where it would
    take from the memory limit that the final joins need.
    """
    out = sql_literal(str(parts / "device_steps.parquet"))
    # Under half the limit, as the final sorts: its group of the launch calls by correlation spills sooner (4 GB
    # Qwen-shaped trace, 1.29 M correlations: this step's peak 282 MiB where the whole limit let it reach 374).
    with kineto_sql_tables.memory_share(con, kineto_sql_tables.SIDE_SHARE):
        con.execute(f"""
            COPY (
                SELECT d.*, coalesce(l.step, CASE WHEN d.ts_ns < s.end_ns THEN s.step END) AS step
                FROM dev_n d
                LEFT JOIN (
                    SELECT correlation, arg_min(step, CAST(ts_ns AS HUGEINT) * CAST({_ID_SPAN} AS HUGEINT)
                                                      + (CAST(event_id AS HUGEINT) - CAST({_ID_LOW} AS HUGEINT)))
                           AS step
                    FROM host_d WHERE correlation IS NOT NULL AND step IS NOT NULL GROUP BY correlation
                ) l USING (correlation)
                ASOF LEFT JOIN step_spans s ON d.ts_ns >= s.ts_ns
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


def collectives(con: duckdb.DuckDBPyConnection, parts: Path) -> None:
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


def counters(con: duckdb.DuckDBPyConnection, counter_batches: list[Path]) -> None:
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
                           maximum_object_size = {max(max_object(p) for p in counter_batches)})
            WHERE ph = 'C' AND ts IS NOT NULL
        )
        SELECT CASE WHEN key = name THEN name ELSE name || '.' || key END, NULL, rel_ns(ts), value
        FROM (SELECT name, ts, unnest(map_keys(m)) AS key, unnest(map_values(m)) AS value FROM c)
        WHERE value IS NOT NULL
    """)


#: Bytes of DuckDB's memory limit per memory instant joined at once with its op and step (as
#: ``kineto_sql_tables.JOIN_BYTES_PER_ROW``). The DuckDB path holds its host events and counters in memory:
#: at the default 200 MB, a trace of 620K memory instants (and 1.2M counter rows) fails with 500K instants a
#: range and passes with 200K; 2000 makes ranges of 100K.
MEMORY_JOIN_BYTES_PER_ROW = 2000
#: The same for the native path, whose host events stay in the parts: one join and sort of the instants of a 1 GB
#: trace (414K) went within the 200 MB limit, but under a tight limit (40 MB, tests/test_real_shaped.py) it ran out of
#: memory once in four runs: the same budget as the DuckDB path until that is understood.
NATIVE_MEMORY_JOIN_BYTES_PER_ROW = 2000


def memory_events(con: duckdb.DuckDBPyConnection, parts: Path, *, native: bool) -> None:
    """``mem_d``: the memory instants of the parts, each with its device type's name, its ``op`` and its step.

    The ``op`` is the innermost ``cpu_op`` on the instant's thread running at its time (start <= t < end, or t
    = start for an op of zero length): of the ``cpu_op`` events of the threads that have memory instants
    holding it, the last to start, then the first to end (:func:`.kineto_memory_ops.innermost_ops`). The
    step is by time, as for host events.

    Each stage goes to a file in ``parts/`` (as :func:`device_steps` does), not to a table in DuckDB's
    memory; the op lookup holds the ``cpu_op`` events of the allocating threads (times, ids and names: about
    100 bytes each) while it runs. ``mem_d`` is a view joining them where one join fits DuckDB's memory limit
    (the final table's statement then joins and sorts at once), else files joined range by range. Where the
    instants are in time order in the file, ``mem_rows`` (the parts in file order) and a file of each instant's op
    and step sorted by id (``kineto_memory_facts.sorted_facts``) let the final table be a merge instead, and
    ``mem_d`` is the one join's view, which the merge leaves unused unless it finds the rows out of order. Nothing is
    made when the trace has no memory instants.
    """
    if not any(parts.glob("memory-*.parquet")):
        return
    memory = sql_literal(str(parts / "memory-*.parquet"))
    host = sql_literal(str(parts / "host-*.parquet"))
    ops_file = sql_literal(str(parts / kineto_memory_facts.OPS_GLOB))
    steps_file = sql_literal(str(parts / "mem_steps.parquet"))
    types = " ".join(f"WHEN {number} THEN {sql_literal(name)}" for number, name in DEVICE_TYPES.items())
    con.execute(f"CREATE VIEW mem_n AS SELECT * FROM read_parquet({memory})")
    cpu_ops = (f"""SELECT h.event_id, h.pid, h.tid, h.ts_ns, h.dur_ns, h.name FROM read_parquet({host}) h
                   SEMI JOIN (SELECT DISTINCT pid, tid FROM mem_n) t ON h.pid = t.pid AND h.tid = t.tid
                   WHERE {kineto_nesting.IS_CPU_OP.format(table='h.')}""" if any(parts.glob("host-*.parquet")) else
               "SELECT NULL::BIGINT AS event_id, NULL::BIGINT AS pid, NULL::BIGINT AS tid, NULL::BIGINT AS ts_ns, "
               "NULL::BIGINT AS dur_ns, NULL::VARCHAR AS name LIMIT 0")
    op_ids = parts / "mem_op_ids.parquet"
    if op_ids.exists():
        # The native nesting found each instant's op on its sweep (kineto_nesting.sweep): only the names are wanted,
        # of the ops the instants name (a semi join keeps the hash table to those).
        kineto_memory_facts.op_names(con, f"read_parquet({sql_literal(str(op_ids))})", host, parts)
    else:
        # The innermost op of each instant in numpy (kineto_memory_ops): a SQL sweep of the ops' starts and ends,
        # and a join for their names, took most of the memory instants' cost (benchmarks/ingest_memory.py).
        found = kineto_memory_ops.innermost_ops(
            con.sql(cpu_ops).to_arrow_table(),
            con.sql("SELECT event_id, pid, tid, ts_ns FROM mem_n "
                    "WHERE ts_ns IS NOT NULL AND pid IS NOT NULL AND tid IS NOT NULL").to_arrow_table())
        pq.write_table(found, parts / "mem_ops-000000.parquet", compression="lz4")  # the one file of OPS_GLOB
        del found
    _instant_steps(con, parts, parts / "mem_steps.parquet")
    in_time_order = _in_time_order(parts)
    if in_time_order:
        # In file order the instants are in time order (a thread's allocator writes them as they happen): the final
        # table is then a merge of the parts with their op and step (kineto_sql_tables.write_tables), no sort.
        con.execute(f"""CREATE VIEW mem_rows AS
                        SELECT event_id, pid, tid, device, CASE device_type {types} END AS device_type, ts_ns, kind,
                               addr, bytes, total_allocated, total_reserved
                        FROM {kineto_sql_tables.in_order(parts, 'memory')}""")
        # ... beside each instant's op and step, sorted by id into this file range by range (one join and sort of
        # every instant grows with the trace)
        kineto_memory_facts.sorted_facts(con, parts, parts / kineto_sql_tables.MEMORY_FACTS_FILE)
    per_row = MEMORY_JOIN_BYTES_PER_ROW if not native else NATIVE_MEMORY_JOIN_BYTES_PER_ROW
    ranges = [] if in_time_order else \
        kineto_sql_tables.id_ranges(con, "mem_n", max(kineto_sql_tables.memory_limit(con) // per_row, 1))
    # A view where one join fits DuckDB's memory limit (or where the merge leaves it unused): the final table's
    # statement joins and sorts at once (kineto_sql_tables.write_tables). Else joined by ranges of event ids into
    # files, as the final tables are.
    joined = f"""
        SELECT m.event_id, m.pid, m.tid, m.device, CASE m.device_type {types} END AS device_type, m.ts_ns,
               m.kind, m.addr, m.bytes, m.total_allocated, m.total_reserved, o.op, s.step
        FROM {{memory}} m LEFT JOIN {{ops}} o USING (event_id) LEFT JOIN {{steps}} s ON s.event_id = m.event_id
    """
    if len(ranges) <= 1:
        con.execute("CREATE VIEW mem_d AS " + joined.format(
            memory=f"read_parquet({memory})", ops=f"read_parquet({ops_file})", steps=f"read_parquet({steps_file})"))
        return
    for n, (first, stop) in enumerate(ranges):
        def within(file: str, first: int = first, stop: int = stop) -> str:
            return f"(SELECT * FROM read_parquet({file}) WHERE event_id >= {first} AND event_id < {stop})"
        out = sql_literal(str(parts / f"memory_d-{n:06d}.parquet"))
        con.execute(f"COPY ({joined.format(memory=within(memory), ops=within(ops_file), steps=within(steps_file))}) "
                    f"TO {out} (FORMAT parquet, COMPRESSION lz4)")
    con.execute(f"CREATE VIEW mem_d AS SELECT * FROM read_parquet({sql_literal(str(parts / 'memory_d-*.parquet'))})")


def _instant_steps(con: duckdb.DuckDBPyConnection, parts: Path, out: Path) -> None:
    """Each memory instant's step into ``out`` (``event_id``, ``step``; null where its time falls between steps;
    instants before the first span or without a time left out, as an ASOF join leaves them): a part at a time, by
    bisection of the spans' starts (``step_spans``: disjoint, a few per step). DuckDB's ASOF join sorted every
    instant's id and time in memory at once (3.3M instants at 8 GB of trace: it set the ingest's peak)."""
    spans = con.sql("SELECT ts_ns, end_ns, step FROM step_spans ORDER BY ts_ns").to_arrow_table()
    starts, ends = (spans[c].to_numpy(zero_copy_only=False) for c in ("ts_ns", "end_ns"))
    steps = spans["step"]
    out_schema = pa.schema([("event_id", pa.int64()), ("step", steps.type)])
    with pq.ParquetWriter(out, out_schema, compression="lz4") as writer:
        for path in kineto_sql_tables.part_files(parts, "memory"):
            part = pq.ParquetFile(path).read(columns=["event_id", "ts_ns"])
            part = part.filter(pc.is_valid(part["ts_ns"]))
            ts = part["ts_ns"].to_numpy()
            at = np.searchsorted(starts, ts, side="right") - 1
            found = np.flatnonzero(at >= 0)
            at = at[found]
            inside = ts[found] < ends[at]
            step = pc.take(steps, pa.array(at)).combine_chunks() if len(at) else pa.array([], steps.type)
            writer.write_table(pa.table([part["event_id"].take(pa.array(found)).cast(pa.int64()),
                                         pc.if_else(pa.array(inside), step, pa.nulls(len(at), steps.type))],
                                        schema=out_schema))


def _in_time_order(parts: Path) -> bool:
    """Whether the memory instants in ``parts``, read in the order of their files, are in order of time (then of
    event id), every one with a time."""
    last_ts, last_id = None, None
    for path in kineto_sql_tables.part_files(parts, "memory"):
        table = pq.ParquetFile(path).read(columns=["event_id", "ts_ns"])
        if table.num_rows == 0:
            continue
        if table["ts_ns"].null_count or table["event_id"].null_count:
            return False
        ts, ids = table["ts_ns"].to_numpy(), table["event_id"].to_numpy()
        if (np.diff(ts) < 0).any() or (np.diff(ids) <= 0).any():
            return False
        if last_ts is not None and (ts[0] < last_ts or ids[0] <= last_id):
            return False
        last_ts, last_id = ts[-1], ids[-1]
    return True


def fill_info(con: duckdb.DuckDBPyConnection, info: TraceInfo, base_ns: int) -> None:
    """Fill ``info``'s span, device count and type, and (if missing) the pid with most host events."""
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
