"""Collectives a Kineto trace shows only by their kernels or CPU calls (docs/analyses.md, "Collectives derived from kernels").

PyTorch up to about 2.0 writes ``record_param_comms`` without its ``Collective name``
args, so the rows :func:`.kineto_sql_facts.collectives` makes from those args do
not exist. This module adds, at the end of the Kineto ingest, in the same DuckDB
connection (the ``coll`` table, ``dev_d``, ``host_d`` and the Parquet parts):

* a row for every NCCL/RCCL kernel (category ``communication``) that no row claims yet
  (``source = 'kernel_name'``): the operation from the ProcessGroup annotation the kernel
  was launched in (``nccl:all_to_all``), else the ``c10d::`` op, else the kernel name
  (:mod:`.nccl_kernels`); sizes from those CPU ops' ``Input Dims``; the process group and
  ``seq`` by the rule of :func:`_process_groups`;
* a row for every Gloo collective (``gloo:all_reduce``; ``c10d::allreduce_`` that launched
  no kernel where the trace has no ``gloo:`` ops) when the trace has no collective args at
  all (``source = 'cpu_op'``);
* algorithm, protocol and reduction from the kernel name for every row with a kernel,
  and ``source`` for the rows made from args (``record_param_comms``, ``kernel_args``).
"""

from __future__ import annotations

import bisect
import json
import math
import re
from pathlib import Path
from typing import Any

import pyarrow as pa

from tracelake.contracts.classify import Category
from tracelake.contracts.lazy import duckdb
from tracelake.contracts.schema import sql_literal

from . import nccl_kernels
from .kineto_sql_events import DTYPE_BYTES

#: C++ element types as ``Input type`` writes them -> PyTorch's dtype names (``record_param_comms``' ``dtype``).
CPU_TYPES: dict[str, str] = {
    "float": "Float", "double": "Double", "c10::Half": "Half", "c10::BFloat16": "BFloat16", "long": "Long",
    "long int": "Long", "int64_t": "Long", "int": "Int", "short": "Short", "signed char": "Char",
    "unsigned char": "Byte", "bool": "Bool", "c10::Float8_e4m3fn": "Float8_e4m3fn",
    "c10::Float8_e5m2": "Float8_e5m2", "c10::complex<float>": "ComplexFloat", "c10::complex<double>": "ComplexDouble",
}
#: CPU op name prefixes that stand for one collective call.
ANNOTATIONS = ("nccl:", "rccl:", "gloo:")
#: ``c10d::`` ops whose first input is the output tensor and second the input (``_allgather_base_(out, in)``).
OUTPUT_FIRST = ("c10d::_allgather_base_", "c10d::alltoall_base_", "c10d::_reduce_scatter_base_",
                "c10d::allgather_into_tensor_coalesced_", "c10d::reduce_scatter_tensor_coalesced_")
#: Collectives whose nccl-tests size is the input's (docs/formats.md, "Bus bandwidth").
INPUT_SIZED = ("allreduce", "broadcast", "reduce", "reduce_scatter", "send", "recv")

_ALIASES = {
    "all_reduce": "allreduce", "all_gather": "allgather", "alltoall": "all_to_all", "all_to_allv": "all_to_all",
    "reduce_scatter_tensor": "reduce_scatter", "all_gather_into_tensor": "allgather",
    "allgather_into_tensor": "allgather", "recv_any_source": "recv", "monitored_barrier": "barrier",
}
_SUFFIXES = re.compile(r"(_base|_coalesced)+$")


def cpu_collective(name: str) -> str | None:
    """PyTorch's collective name for a ProcessGroup CPU op (``nccl:_all_gather_base`` -> ``allgather``); else None."""
    for prefix in (*ANNOTATIONS, "c10d::"):
        if name.startswith(prefix):
            op = _SUFFIXES.sub("", name.removeprefix(prefix).strip("_"))
            return _ALIASES.get(op, op) or None
    return None


def _process_groups(pg_config: Any, backend: str) -> list[dict[str, Any]]:
    """The ``distributedInfo.pg_config`` entries of ``backend`` (``nccl`` or ``gloo``), with name, desc, ranks, size."""
    groups = []
    for pg in pg_config if isinstance(pg_config, list) else []:
        if not isinstance(pg, dict) or backend not in str(pg.get("backend_config", "")):
            continue
        ranks = pg.get("ranks")
        groups.append({"process_group": str(pg.get("pg_name")), "process_group_desc": pg.get("pg_desc"),
                       "group_ranks": str(ranks) if isinstance(ranks, list) else None,
                       "group_size": pg.get("pg_size") if isinstance(pg.get("pg_size"), int) else None})
    return groups


def _group_sql(groups: list[dict[str, Any]], fallback: str) -> str:
    """Select-list of the process group columns: the one group of the backend, else ``fallback`` (a SQL expression)."""
    if len(groups) == 1:
        g = groups[0]
        text = {k: "NULL" if g[k] is None else sql_literal(str(g[k])) for k in g}
        size = "NULL" if g["group_size"] is None else str(int(g["group_size"]))
        return (f"{text['process_group']} AS process_group, {text['process_group_desc']} AS process_group_desc, "
                f"{text['group_ranks']} AS group_ranks, {size} AS group_size")
    return f"{fallback} AS process_group, NULL AS process_group_desc, NULL AS group_ranks, NULL AS group_size"


def _nelems(dims: str) -> str:
    """SQL: the elements of a tensor of shape ``dims`` (a BIGINT[]); null for negative or overflowing shapes."""
    return (f"CASE WHEN len({dims}) = 0 THEN 1 WHEN list_min({dims}) >= 0 "
            f"THEN TRY_CAST(list_product({dims}) AS BIGINT) END")


def _bytes(nelems: str, size: str) -> str:
    """SQL: ``nelems`` x ``size`` bytes, null where it does not fit 64 bits."""
    return f"TRY_CAST(CAST({nelems} AS HUGEINT) * {size} AS BIGINT)"


def add(con: duckdb.DuckDBPyConnection, parts: Path, pg_config: Any = None, rank: int | None = None) -> None:
    """Complete ``coll``: rows for unclaimed NCCL kernels and Gloo calls, and every row's source and kernel facts.

    ``rank``: the trace's global rank (the source or destination of its own Gloo sends and receives).
    """
    for column in ("source", "algorithm", "protocol", "reduction"):
        con.execute(f"ALTER TABLE coll ADD COLUMN {column} VARCHAR")
    con.execute("UPDATE coll SET source = CASE WHEN cpu_ts_ns IS NULL THEN 'kernel_args' ELSE 'record_param_comms' END")
    device = sql_literal(str(parts / "device-*.parquet"))
    host = sql_literal(str(parts / "host-*.parquet"))
    con.execute(f"""
        CREATE TABLE comm_kernels AS
        SELECT d.event_id, p.name, p.stream, d.device, d.ts_ns, d.dur_ns, d.correlation, d.step
        FROM dev_d d JOIN read_parquet({device}) p USING (event_id) WHERE d.category = '{Category.COMMUNICATION}'
    """)
    _kernel_forms(con)
    has_host = any(parts.glob("host-*.parquet"))
    if has_host:
        like = " OR ".join(f"name LIKE '{p}%'" for p in (*ANNOTATIONS, "c10d::"))
        con.execute(f"""
            CREATE TABLE comm_ops AS
            SELECT p.event_id, p.name, h.pid, h.tid, h.ts_ns, h.dur_ns, h.depth, h.step,
                   TRY_CAST(json_extract(TRY_CAST(p.input_dims AS JSON), '$[0]') AS BIGINT[]) AS dims0,
                   TRY_CAST(json_extract(TRY_CAST(p.input_dims AS JSON), '$[1]') AS BIGINT[]) AS dims1,
                   json_extract_string(TRY_CAST(p.input_types AS JSON), '$[0]') AS type0,
                   json_extract_string(TRY_CAST(p.input_types AS JSON), '$[1]') AS type1,
                   CAST(p.input_dims AS VARCHAR) AS input_dims, CAST(p.input_types AS VARCHAR) AS input_types,
                   CAST(p.concrete_inputs AS VARCHAR) AS concrete_inputs
            FROM read_parquet({host}) p JOIN host_d h USING (event_id) WHERE {like}
        """)
        _cpu_names(con)
    _kernel_rows(con, has_host, _process_groups(pg_config, "nccl"))
    if has_host and not con.execute("SELECT count(*) FROM coll_args").fetchall()[0][0]:
        _gloo_rows(con, _process_groups(pg_config, "gloo"), rank)
    con.execute("""
        UPDATE coll SET algorithm = f.algorithm, protocol = f.protocol,
                        reduction = coalesce(coll.reduction, f.reduction)
        FROM kernel_forms f WHERE coll.kernel_name = f.name
    """)


def _kernel_forms(con: duckdb.DuckDBPyConnection) -> None:
    names = [r[0] for r in con.execute("SELECT DISTINCT name FROM comm_kernels WHERE name IS NOT NULL").fetchall()]
    forms = [nccl_kernels.parse(n) for n in names]
    table = pa.table({
        "name": pa.array(names, pa.string()),
        **{field: pa.array([getattr(f, field) if f else None for f in forms], pa.string())
           for field in ("collective", "algorithm", "protocol", "reduction", "dtype")},
    })
    con.register("kernel_forms_arrow", table)
    con.execute("CREATE TABLE kernel_forms AS SELECT * FROM kernel_forms_arrow")
    con.unregister("kernel_forms_arrow")


def _cpu_names(con: duckdb.DuckDBPyConnection) -> None:
    """``cpu_names``: each ProcessGroup op name with its collective; ``cpu_types``: element type names."""
    names = [r[0] for r in con.execute("SELECT DISTINCT name FROM comm_ops").fetchall()]
    con.register("cpu_names_arrow", pa.table({"name": pa.array(names, pa.string()),
                                              "collective": pa.array([cpu_collective(n) for n in names], pa.string())}))
    con.execute("CREATE TABLE cpu_names AS SELECT * FROM cpu_names_arrow")
    con.unregister("cpu_names_arrow")
    con.register("cpu_types_arrow", pa.table({"type": list(CPU_TYPES), "dtype": list(CPU_TYPES.values())}))
    con.execute("CREATE TABLE cpu_types AS SELECT * FROM cpu_types_arrow")
    con.unregister("cpu_types_arrow")


def _kernel_rows(con: duckdb.DuckDBPyConnection, has_host: bool, groups: list[dict[str, Any]]) -> None:
    """A row per communication kernel no row claims, ordered per stream (the stream stands for the communicator)."""
    con.execute("""
        CREATE TABLE orphans AS
        SELECT k.* FROM comm_kernels k
        WHERE k.event_id NOT IN (SELECT kernel_event_id FROM coll WHERE kernel_event_id IS NOT NULL)
    """)
    if has_host:
        # The CPU ops the launch ran inside, on its thread: the innermost annotation and the outermost c10d:: op.
        con.execute("""
            CREATE TABLE orphan_cpu AS
            WITH launch AS (
                SELECT o.event_id, any_value(h.pid) AS pid, any_value(h.tid) AS tid, any_value(h.ts_ns) AS ts_ns
                FROM orphans o JOIN host_d h ON h.correlation = o.correlation
                WHERE o.correlation IS NOT NULL GROUP BY o.event_id
            ), around AS (
                SELECT l.event_id, c.* EXCLUDE (event_id), n.collective AS cpu_collective,
                       CASE WHEN c.name LIKE 'c10d::%' THEN 'c10d' ELSE 'annotation' END AS role
                FROM launch l JOIN comm_ops c ON c.pid = l.pid AND c.tid = l.tid
                 AND c.ts_ns <= l.ts_ns AND c.ts_ns + c.dur_ns >= l.ts_ns
                JOIN cpu_names n ON n.name = c.name
            )
            SELECT event_id,
                   arg_max(cpu_collective, depth) FILTER (role = 'annotation') AS annotation_collective,
                   arg_max(dims0, depth) FILTER (role = 'annotation') AS annotation_dims,
                   arg_max(type0, depth) FILTER (role = 'annotation') AS annotation_type,
                   arg_min(cpu_collective, depth) FILTER (role = 'c10d') AS c10d_collective,
                   arg_min(name, depth) FILTER (role = 'c10d') AS c10d_name,
                   arg_min(dims0, depth) FILTER (role = 'c10d') AS c10d_dims0,
                   arg_min(dims1, depth) FILTER (role = 'c10d') AS c10d_dims1,
                   arg_min(type1, depth) FILTER (role = 'c10d') AS c10d_type1,
                   arg_min(ts_ns, depth) AS cpu_ts_ns, arg_min(dur_ns, depth) AS cpu_dur_ns
            FROM around GROUP BY event_id
        """)
    else:
        con.execute("CREATE TABLE orphan_cpu AS SELECT NULL::BIGINT AS event_id, NULL AS annotation_collective, "
                    "NULL::BIGINT[] AS annotation_dims, NULL AS annotation_type, NULL AS c10d_collective, "
                    "NULL AS c10d_name, NULL::BIGINT[] AS c10d_dims0, NULL::BIGINT[] AS c10d_dims1, "
                    "NULL AS c10d_type1, NULL::BIGINT AS cpu_ts_ns, NULL::BIGINT AS cpu_dur_ns LIMIT 0")
    streams = con.execute("SELECT count(DISTINCT stream) FROM orphans").fetchall()[0][0]
    group = _group_sql(groups if streams == 1 else [], "'nccl-stream-' || s.stream_index")
    output_first = ", ".join(sql_literal(n) for n in OUTPUT_FIRST)
    input_sized = ", ".join(sql_literal(n) for n in INPUT_SIZED)
    con.execute(f"""
        INSERT INTO coll BY NAME
        WITH s AS (
            SELECT stream, CAST(row_number() OVER (ORDER BY min(ts_ns), stream) - 1 AS BIGINT) AS stream_index
            FROM orphans GROUP BY stream
        ), facts AS (
            SELECT o.*, c.* EXCLUDE (event_id), f.algorithm AS k_algorithm, f.protocol AS k_protocol, f.reduction AS k_reduction,
                   coalesce(c.annotation_collective, c.c10d_collective, f.collective) AS op,
                   coalesce({_nelems('c.annotation_dims')},
                            CASE WHEN c.c10d_name IN ({output_first}) THEN {_nelems('c.c10d_dims1')} END) AS in_n,
                   CASE WHEN c.c10d_name IN ({output_first}) THEN {_nelems('c.c10d_dims0')} END AS out_n,
                   coalesce(ta.dtype, tc.dtype, f.dtype) AS elem_type
            FROM orphans o LEFT JOIN orphan_cpu c USING (event_id)
            LEFT JOIN kernel_forms f ON f.name = o.name
            LEFT JOIN cpu_types ta ON ta.type = c.annotation_type
            LEFT JOIN cpu_types tc ON tc.type = c.c10d_type1
        )
        SELECT x.event_id, x.op AS collective, {group},
               row_number() OVER (PARTITION BY x.stream ORDER BY x.ts_ns, x.event_id) AS seq,
               x.elem_type AS dtype, x.in_n AS in_nelems, x.out_n AS out_nelems,
               CASE WHEN x.op IN ({input_sized}) THEN {_bytes('x.in_n', 'b.size')}
                    WHEN x.out_n IS NOT NULL THEN {_bytes('greatest(x.in_n, x.out_n)', 'b.size')} END AS message_bytes,
               x.ts_ns, x.dur_ns, x.cpu_ts_ns, x.cpu_dur_ns, x.event_id AS kernel_event_id,
               x.name AS kernel_name, x.stream, x.step, 'kernel_name' AS source
        FROM facts x JOIN s ON s.stream IS NOT DISTINCT FROM x.stream LEFT JOIN dtype_bytes b ON b.dtype = x.elem_type
    """)


#: ``c10d::`` ops that Gloo runs as another operation, by the ``gloo:`` annotation's collective.
GLOO_RUNS_AS = {"c10d::_reduce_scatter_base_": "allreduce"}
#: Operations whose peer (send, recv) or root (broadcast) is ``Concrete Inputs[2]`` of the ``c10d::`` op.
PEER_OPS = ("send", "recv", "broadcast")
_P2P = ("send", "recv")


def _json(text: Any) -> Any:
    try:
        return json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return None


def _tensor_nelems(dims: Any) -> int | None:
    """Elements of a tensor of shape ``dims`` (a list of non-negative ints fitting 64 bits), else None."""
    if not isinstance(dims, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in dims):
        return None
    n = math.prod(dims)
    return n if n < 2**63 else None


def _first_tensor(dims: Any, types: Any, index: int) -> tuple[int | None, str | None]:
    """(elements, dtype) of input ``index``: a tensor, or a one-tensor list (``TensorList``, shape ``[[4, 128]]``)."""
    if not isinstance(dims, list) or len(dims) <= index or not isinstance(types, list) or len(types) <= index:
        return None, None
    shape, kind = dims[index], types[index]
    dtype = CPU_TYPES.get(kind) if isinstance(kind, str) else None
    if dtype is not None:
        return _tensor_nelems(shape), dtype
    if kind == "TensorList" and isinstance(shape, list) and len(shape) == 1:
        return _tensor_nelems(shape[0]), None
    return None, None


def _peer(concrete: Any) -> int | None:
    """``Concrete Inputs[2]`` of a ``c10d::send``/``recv_``/``broadcast_``: the peer's (root's) rank in the group."""
    values = _json(concrete)
    if isinstance(values, list) and len(values) > 2 and isinstance(values[2], str) and values[2].isdigit():
        return int(values[2])
    return None


def _outermost(ops: list[dict[str, Any]], marks: list[tuple[Any, Any, int]]) -> list[dict[str, Any]]:
    """The ``c10d::`` ops inside no other one on their thread, less those with a mark (pid, tid, ts_ns) inside."""
    by_thread: dict[tuple[Any, Any], list[int]] = {}
    for pid, tid, ts in marks:
        by_thread.setdefault((pid, tid), []).append(ts)
    for times in by_thread.values():
        times.sort()
    kept = []
    last: dict[tuple[Any, Any], dict[str, Any]] = {}
    for op in sorted(ops, key=lambda o: (o["pid"] or 0, o["tid"] or 0, o["ts_ns"], o["depth"], o["event_id"])):
        thread, end = (op["pid"], op["tid"]), op["ts_ns"] + op["dur_ns"]
        outer = last.get(thread)
        if outer is not None and outer["depth"] < op["depth"] and end <= outer["ts_ns"] + outer["dur_ns"]:
            continue
        last[thread] = op
        times = by_thread.get(thread, [])
        at = bisect.bisect_left(times, op["ts_ns"])
        if at < len(times) and times[at] <= end:
            continue
        kept.append(op)
    return sorted(kept, key=lambda o: (o["ts_ns"], o["event_id"]))


def _match(annotations: list[dict[str, Any]], ops: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The ``c10d::`` op of each ``gloo:`` annotation (by event id): per operation, the n-th with the n-th.

    An annotation takes the earliest unmatched op of its operation that started no later than it did (a call
    made before the profiled window leaves its annotation unmatched rather than shifting the rest).
    """
    pending: dict[str, list[dict[str, Any]]] = {}
    for op in ops:  # start order
        pending.setdefault(GLOO_RUNS_AS.get(op["name"], op["collective"]), []).append(op)
    matched: dict[int, dict[str, Any]] = {}
    taken: dict[str, int] = {}
    for ann in annotations:  # start order
        queue, at = pending.get(ann["collective"], []), taken.get(ann["collective"], 0)
        if at < len(queue) and queue[at]["ts_ns"] <= ann["ts_ns"]:
            matched[ann["event_id"]] = queue[at]
            taken[ann["collective"]] = at + 1
    return matched


def _candidates(groups: list[dict[str, Any]], rank: int | None, op: str, peer: int | None,
                in_n: int | None, out_n: int | None) -> list[dict[str, Any]]:
    """The Gloo groups of this rank that the call can belong to, by what its arguments allow (all of one)."""
    if len(groups) <= 1:
        return groups
    found = []
    for g in groups:
        size, ranks = g["group_size"], g["ranks"]
        if peer is not None and op in PEER_OPS:
            if size is not None and peer >= size:
                continue
            if op in _P2P and ranks is not None and rank is not None and peer < len(ranks) and ranks[peer] == rank:
                continue  # a rank sends to and receives from another rank
        if op in ("allgather", "reduce_scatter") and in_n and out_n and size is not None:
            ratio = out_n / in_n if op == "allgather" else in_n / out_n
            if ratio != size:
                continue
        found.append(g)
    return found


def _global(groups: list[dict[str, Any]], peer: int | None) -> int | None:
    """Global rank of group rank ``peer``: the one every group in ``groups`` maps it to, else None."""
    if peer is None or not groups:
        return None
    found = {g["ranks"][peer] if g["ranks"] is not None and peer < len(g["ranks"]) else None for g in groups}
    value = found.pop() if len(found) == 1 else None
    return value if isinstance(value, int) else None


def _gloo_rows(con: duckdb.DuckDBPyConnection, groups: list[dict[str, Any]], rank: int | None = None) -> None:
    """Rows for CPU-side collectives (Gloo): ``gloo:`` ops, else ``c10d::`` ops that launched no kernel.

    Only for traces with no collective args at all (PyTorch records ``record_param_comms`` for NCCL,
    not for Gloo, up to at least 2.13; where a trace has those args, they make the rows). The rule
    (docs/formats.md, "Distributed CPU traces (gloo)"):

    * each ``gloo:`` annotation (on the group's worker thread; ``gloo:send``/``recv`` on the calling
      thread) is a row with its times (``ts_ns``, ``dur_ns``: the work, waiting for the peers included);
      the n-th ``c10d::`` op of an operation on the rank is the n-th annotation's CPU call
      (``cpu_ts_ns``, ``cpu_dur_ns``), its name (``_reduce_scatter_base_`` runs as ``gloo:all_reduce``),
      its sizes (``Input Dims``) and its peer or root (``Concrete Inputs[2]``);
    * the process group: the one Gloo group of ``pg_config``; with several, the only one the call can be
      in (peer or root within the group and not this rank; all-gather and reduce-scatter sizes in the
      ratio of the group size), else the one other calls on its worker thread were shown to be in, else
      null; ``cpu`` where ``pg_config`` lists no Gloo group;
    * ``seq``: collectives counted per process group, send and recv per (process group, source, destination),
      in the order of the CPU calls; null where the group (or a peer) is unknown.
    """
    columns = "c.event_id, c.name, n.collective, c.pid, c.tid, c.ts_ns, c.dur_ns, c.depth, c.step, c.input_dims, " \
              "c.input_types, c.concrete_inputs"

    def fetch(chosen: str) -> list[dict[str, Any]]:
        cur = con.execute(f"SELECT {columns} FROM ({chosen}) c JOIN cpu_names n USING (name) "
                          "WHERE n.collective IS NOT NULL ORDER BY c.ts_ns, c.event_id")
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    annotations = fetch("SELECT * FROM comm_ops WHERE name LIKE 'gloo:%'")
    # NCCL/RCCL annotations and launches of communication kernels: a c10d:: op around one is not Gloo's.
    marks = con.execute("""
        SELECT pid, tid, ts_ns FROM comm_ops WHERE name NOT LIKE 'c10d::%' AND name NOT LIKE 'gloo:%'
        UNION ALL
        SELECT r.pid, r.tid, r.ts_ns FROM host_d r JOIN comm_kernels k ON k.correlation = r.correlation
    """).fetchall()
    ops = _outermost(fetch("SELECT * FROM comm_ops WHERE name LIKE 'c10d::%'"), marks)
    matched = _match(annotations, ops) if annotations else {}
    # Each row: (annotation or None, c10d:: op or None).
    calls = [(a, matched.get(a["event_id"])) for a in annotations] if annotations else [(None, o) for o in ops]
    groups = [{**g, "ranks": r if isinstance(r := _json(g["group_ranks"]), list) else None} for g in groups]
    if rank is not None:
        groups = [g for g in groups if g["ranks"] is None or rank in g["ranks"]] or groups
    rows: list[dict[str, Any]] = []
    for ann, op in calls:
        call: dict[str, Any] = op or ann or {}
        name, collective = call["name"], call["collective"]
        ann_n, ann_type = (_first_tensor(_json(ann["input_dims"]), _json(ann["input_types"]), 0) if ann
                           else (None, None))
        c_dims, c_types = (_json(op["input_dims"]), _json(op["input_types"])) if op else (None, None)
        if name in OUTPUT_FIRST:
            c_in, c_in_type = _first_tensor(c_dims, c_types, 1)
            c_out, _ = _first_tensor(c_dims, c_types, 0)
        else:
            (c_in, c_in_type), c_out = _first_tensor(c_dims, c_types, 0), None
        dtype = ann_type or c_in_type
        # The annotation's tensor; the c10d:: op's input where there is none (and for reduce-scatter, which
        # Gloo runs as an all-reduce of that whole input).
        in_n = ann_n if ann_type and collective != "reduce_scatter" else c_in
        peer = _peer(op["concrete_inputs"]) if op and collective in PEER_OPS else None
        rows.append({"ann": ann, "op": op, "collective": collective, "dtype": dtype, "in_nelems": in_n,
                     "out_nelems": c_out, "peer": peer})
    # Process groups: the one candidate; else what the worker thread's other collectives showed.
    for row in rows:
        row["cands"] = _candidates(groups, rank, row["collective"], row["peer"], row["in_nelems"], row["out_nelems"])
        row["group"] = row["cands"][0] if len(row["cands"]) == 1 else None
    by_thread: dict[Any, set[str]] = {}
    for row in rows:
        if row["ann"] is not None and row["collective"] not in _P2P and row["group"] is not None:
            by_thread.setdefault(row["ann"]["tid"], set()).add(row["group"]["process_group"])
    for row in rows:
        shown = by_thread.get(row["ann"]["tid"]) if row["ann"] is not None else None
        if row["group"] is None and row["collective"] not in _P2P and shown and len(shown) == 1:
            row["group"] = next((g for g in row["cands"] if g["process_group"] in shown), None)
    # Peers as global ranks, and seq in the order of the CPU calls.
    counters: dict[tuple[Any, ...], int] = {}
    out = []
    for row in sorted(rows, key=lambda r: ((r["op"] or r["ann"])["ts_ns"], (r["op"] or r["ann"])["event_id"])):
        ann, op, group, collective = row["ann"], row["op"], row["group"], row["collective"]
        label: str | None = group["process_group"] if group else ("cpu" if not groups else None)
        peer = _global([group] if group else row["cands"], row["peer"])
        src = dst = None
        if collective == "send":
            src, dst = (rank, peer) if peer is not None else (None, None)
        elif collective == "recv":
            src, dst = (peer, rank) if peer is not None else (None, None)
        elif collective == "broadcast":
            src = peer
        key: tuple[Any, ...] | None = (label,)
        if collective in _P2P:
            key = (label, src, dst) if src is not None and dst is not None else None
        seq = None
        if label is not None and key is not None:
            seq = counters[key] = counters.get(key, 0) + 1
        size = DTYPE_BYTES.get(row["dtype"]) if row["dtype"] else None
        in_n, out_n = row["in_nelems"], row["out_nelems"]
        message = None
        if size is not None and in_n is not None:
            if collective in INPUT_SIZED:
                message = in_n * size
            elif out_n is not None:
                message = max(in_n, out_n) * size
        if message is not None and message >= 2**63:
            message = None
        main = ann or op
        out.append({
            "event_id": main["event_id"], "collective": collective, "process_group": label,
            "process_group_desc": group["process_group_desc"] if group else None,
            "group_ranks": group["group_ranks"] if group else None,
            "group_size": group["group_size"] if group else None, "seq": seq, "dtype": row["dtype"],
            "in_nelems": in_n, "out_nelems": out_n, "message_bytes": message, "src_rank": src, "dst_rank": dst,
            "ts_ns": main["ts_ns"], "dur_ns": main["dur_ns"],
            "cpu_ts_ns": op["ts_ns"] if op else None, "cpu_dur_ns": op["dur_ns"] if op else None,
            "step": main["step"], "source": "cpu_op",
        })
    if not out:
        return
    types = {"event_id": pa.int64(), "collective": pa.string(), "process_group": pa.string(),
             "process_group_desc": pa.string(), "group_ranks": pa.string(), "group_size": pa.int32(),
             "seq": pa.int64(), "dtype": pa.string(), "in_nelems": pa.int64(), "out_nelems": pa.int64(),
             "message_bytes": pa.int64(), "src_rank": pa.int32(), "dst_rank": pa.int32(), "ts_ns": pa.int64(),
             "dur_ns": pa.int64(), "cpu_ts_ns": pa.int64(), "cpu_dur_ns": pa.int64(), "step": pa.int64(),
             "source": pa.string()}
    table = pa.table({k: pa.array([r[k] for r in out], t) for k, t in types.items()})
    con.register("gloo_rows_arrow", table)
    con.execute("INSERT INTO coll BY NAME SELECT * FROM gloo_rows_arrow")
    con.unregister("gloo_rows_arrow")
