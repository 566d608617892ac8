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

import re
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
from tracelake.contracts.classify import Category
from tracelake.contracts.schema import sql_literal

from . import nccl_kernels

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


def add(con: duckdb.DuckDBPyConnection, parts: Path, pg_config: Any = None) -> None:
    """Complete ``coll``: rows for unclaimed NCCL kernels and Gloo calls, and every row's source and kernel facts."""
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
                   json_extract_string(TRY_CAST(p.input_types AS JSON), '$[1]') AS type1
            FROM read_parquet({host}) p JOIN host_d h USING (event_id) WHERE {like}
        """)
        _cpu_names(con)
    _kernel_rows(con, has_host, _process_groups(pg_config, "nccl"))
    if has_host and not con.execute("SELECT count(*) FROM coll_args").fetchall()[0][0]:
        _gloo_rows(con, _process_groups(pg_config, "gloo"))
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


def _gloo_rows(con: duckdb.DuckDBPyConnection, groups: list[dict[str, Any]]) -> None:
    """Rows for CPU-side collectives (Gloo): ``gloo:`` ops, else ``c10d::`` ops that launched no kernel.

    Only for traces with no collective args at all: newer PyTorch records Gloo calls with
    ``record_param_comms``, which the args rows cover.
    """
    gloo = con.execute("SELECT count(*) FROM comm_ops WHERE name LIKE 'gloo:%'").fetchall()[0][0]
    if gloo:
        chosen = "SELECT * FROM comm_ops WHERE name LIKE 'gloo:%'"
    else:
        # Outermost c10d:: ops with no NCCL annotation inside and no kernel launched from inside.
        chosen = """
            SELECT c.* FROM comm_ops c
            WHERE c.name LIKE 'c10d::%'
              AND NOT EXISTS (SELECT 1 FROM comm_ops o WHERE o.pid = c.pid AND o.tid = c.tid
                              AND o.event_id <> c.event_id AND (
                                  (o.name LIKE 'c10d::%' AND o.depth < c.depth AND o.ts_ns <= c.ts_ns
                                   AND o.ts_ns + o.dur_ns >= c.ts_ns + c.dur_ns)
                                  OR (o.name NOT LIKE 'c10d::%' AND o.ts_ns >= c.ts_ns
                                      AND o.ts_ns <= c.ts_ns + c.dur_ns)))
              AND NOT EXISTS (SELECT 1 FROM host_d r JOIN comm_kernels k ON k.correlation = r.correlation
                              WHERE r.pid = c.pid AND r.tid = c.tid AND r.ts_ns >= c.ts_ns
                              AND r.ts_ns <= c.ts_ns + c.dur_ns)
        """
    group = _group_sql(groups, "'cpu'")
    output_first = ", ".join(sql_literal(n) for n in OUTPUT_FIRST)
    input_sized = ", ".join(sql_literal(n) for n in INPUT_SIZED)
    # The first input is the tensor (the output for the c10d:: ops that take it first: no size then).
    con.execute(f"""
        INSERT INTO coll BY NAME
        WITH g AS (
            SELECT c.*, n.collective, t.dtype,
                   CASE WHEN t.dtype IS NOT NULL AND c.name NOT IN ({output_first}) THEN {_nelems('c.dims0')} END
                       AS in_nelems
            FROM ({chosen}) c JOIN cpu_names n USING (name) LEFT JOIN cpu_types t ON t.type = c.type0
        )
        SELECT g.event_id, g.collective, {group},
               row_number() OVER (ORDER BY g.ts_ns, g.event_id) AS seq,
               g.dtype, g.in_nelems,
               CASE WHEN g.collective IN ({input_sized}) THEN {_bytes('g.in_nelems', 'b.size')} END AS message_bytes,
               g.ts_ns, g.dur_ns, g.ts_ns AS cpu_ts_ns, g.dur_ns AS cpu_dur_ns, g.step, 'cpu_op' AS source
        FROM g LEFT JOIN dtype_bytes b ON b.dtype = g.dtype
    """)
