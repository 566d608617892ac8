"""Operator attribution and ``op_stats`` in SQL (docs/analyses.md, "Operators"): the twin of
``analysis/op_stats.py``'s walk up the parent chains and window-by-window crediting.

The launch call of a correlation is the first host event with it (by start, then duration); a recursive
walk up ``parent_id`` from that call finds the innermost ``cpu_op`` that :func:`flops.counted` says carries
a cost, else the innermost ``cpu_op``. The per-call cost is :func:`flops.op_cost` and the device's figures
:func:`peaks.lookup` (registered as SQL functions: they are the tables of data under test elsewhere, in
tests/test_flops.py and tests/test_peaks.py).
"""

from __future__ import annotations

import json

import duckdb

from tracelake.analysis.flops import counted, op_cost
from tracelake.analysis.op_scope import FRAME, MODULE, scope_kind, scope_name
from tracelake.analysis.op_stats import NO_OPERATOR, peak_for
from tracelake.analysis.peaks import lookup
from tracelake.analysis.recompute import recompute_kind
from tracelake.contracts.classify import Category


def _cost(name: str | None, dims: str | None, types: str | None, concrete: str | None) -> dict | None:
    try:
        cost = op_cost(name, json.loads(dims), json.loads(types), json.loads(concrete) if concrete else None) \
            if name and dims and types else None
    except ValueError:
        cost = None
    if cost is None:
        return None
    return {"flops": cost.flops, "bytes": cost.bytes, "dtype": cost.dtype, "kind": cost.kind}


def register(con: duckdb.DuckDBPyConnection) -> None:
    """The SQL functions the queries below call: ``tl_counted``, ``tl_cost``, ``tl_known``, ``tl_peak``, ``tl_hbm``,
    ``tl_scope_kind``, ``tl_scope_name`` and ``tl_recompute_kind``."""
    cost_type = duckdb.struct_type({"flops": "DOUBLE", "bytes": "DOUBLE", "dtype": "VARCHAR", "kind": "VARCHAR"})
    con.create_function("tl_counted", lambda name: bool(name) and counted(name), ["VARCHAR"], "BOOLEAN",
                        null_handling="special")
    con.create_function("tl_cost", _cost, ["VARCHAR", "VARCHAR", "VARCHAR", "VARCHAR"], cost_type,
                        null_handling="special")
    con.create_function("tl_scope_kind", scope_kind, ["VARCHAR", "VARCHAR"], "INTEGER", null_handling="special")
    con.create_function("tl_scope_name", scope_name, ["VARCHAR"], "VARCHAR", null_handling="special")
    con.create_function("tl_recompute_kind", recompute_kind, ["VARCHAR"], "INTEGER", null_handling="special")
    con.create_function("tl_known", lambda name, sms, mem: lookup(name, sms, mem) is not None,
                        ["VARCHAR", "INTEGER", "BIGINT"], "BOOLEAN", null_handling="special")
    con.create_function("tl_peak", lambda name, sms, mem, dtype, kind: peak_for(lookup(name, sms, mem), dtype, kind),
                        ["VARCHAR", "INTEGER", "BIGINT", "VARCHAR", "VARCHAR"], "DOUBLE", null_handling="special")
    con.create_function("tl_hbm", lambda name, sms, mem: getattr(lookup(name, sms, mem), "hbm", None),
                        ["VARCHAR", "INTEGER", "BIGINT"], "DOUBLE", null_handling="special")


def attribution_sql(device_ops: str, host_ops: str) -> str:
    """Each device op with its operator call (``target``, an ``event_id`` of ``host_ops``; null for none), whether
    it is work (not a sync), and the ``credit_flops`` / ``credit_model_flops`` of the call whose first device op
    (by start, then ``event_id``, per rank) it is."""
    return f"""
    WITH RECURSIVE calls AS (
        SELECT trace_id, correlation, event_id FROM (
            SELECT trace_id, correlation, event_id, row_number() OVER (
                PARTITION BY trace_id, correlation ORDER BY ts_ns, coalesce(dur_ns, 0), event_id) AS n
            FROM {host_ops} WHERE correlation IS NOT NULL AND ts_ns IS NOT NULL) WHERE n = 1
    ), chain(trace_id, correlation, event_id, up) AS (
        SELECT trace_id, correlation, event_id, 0 FROM calls
        UNION ALL
        SELECT c.trace_id, c.correlation, h.parent_id, c.up + 1
        FROM chain c JOIN {host_ops} h ON h.trace_id = c.trace_id AND h.event_id = c.event_id
        WHERE h.parent_id IS NOT NULL AND c.up < 64
    ), ops AS (
        SELECT c.trace_id, c.correlation, c.event_id, c.up, tl_counted(h.name) AS costed
        FROM chain c JOIN {host_ops} h ON h.trace_id = c.trace_id AND h.event_id = c.event_id
        WHERE h.cat = 'cpu_op'
    ), targets AS (
        SELECT trace_id, correlation, arg_min(event_id, (NOT costed, up)) AS target FROM ops GROUP BY ALL
    ), attributed AS (
        SELECT d.*, t.target, coalesce(d.category <> '{Category.SYNC}', FALSE) AS work
        FROM {device_ops} d LEFT JOIN targets t ON t.trace_id = d.trace_id AND t.correlation = d.correlation
        WHERE d.ts_ns IS NOT NULL
    ), firsts AS (
        SELECT *, row_number() OVER (PARTITION BY trace_id, rank, target ORDER BY ts_ns, event_id) AS n
        FROM attributed WHERE work AND target IS NOT NULL AND dur_ns >= 0
    ), costs AS (
        SELECT trace_id, event_id AS target, tl_cost(name, input_dims, input_types, concrete_inputs) AS cost,
               tl_recompute_kind(name) = 0 AS plain
        FROM {host_ops} WHERE (trace_id, event_id) IN (SELECT (trace_id, target) FROM targets)
    ), rwalk(trace_id, target, event_id, up) AS (  -- up from each call's parent, to the first marker or backward node
        SELECT t.trace_id, t.target, h.parent_id, 1
        FROM (SELECT DISTINCT trace_id, target FROM targets) t
        JOIN {host_ops} h ON h.trace_id = t.trace_id AND h.event_id = t.target WHERE h.parent_id IS NOT NULL
        UNION ALL
        SELECT w.trace_id, w.target, h.parent_id, w.up + 1
        FROM rwalk w JOIN {host_ops} h ON h.trace_id = w.trace_id AND h.event_id = w.event_id
        WHERE h.parent_id IS NOT NULL AND tl_recompute_kind(h.name) = 0 AND w.up < 256
    ), again AS (
        SELECT w.trace_id, w.target, arg_min(tl_recompute_kind(h.name), w.up) = 1 AS recomputed
        FROM rwalk w JOIN {host_ops} h ON h.trace_id = w.trace_id AND h.event_id = w.event_id
        WHERE tl_recompute_kind(h.name) <> 0 GROUP BY ALL
    )
    SELECT a.*, c.cost.flops AS credit_flops, c.cost.dtype AS credit_dtype,
           CASE WHEN c.cost.kind IN ('matmul', 'conv', 'attention') THEN c.cost.flops
                WHEN c.cost.flops IS NOT NULL THEN 0.0 END AS credit_model_flops,
           CASE WHEN c.cost.kind IN ('matmul', 'conv', 'attention')
                THEN CASE WHEN c.plain AND coalesce(g.recomputed, FALSE) THEN c.cost.flops ELSE 0.0 END
                WHEN c.cost.flops IS NOT NULL THEN 0.0 END AS credit_recomputed_flops
    FROM attributed a
    LEFT JOIN firsts f ON f.trace_id = a.trace_id AND f.event_id = a.event_id AND f.n = 1
    LEFT JOIN costs c ON c.trace_id = a.trace_id AND c.target = f.target
    LEFT JOIN again g ON g.trace_id = a.trace_id AND g.target = f.target
    """


#: Per (trace, rank), the device's row of the table of known devices: its lowest device index that matches.
HARDWARE_SQL = """
    SELECT trace_id, rank, arg_min(name, device) AS name, arg_min(core_count, device) AS core_count,
           arg_min(memory_bytes, device) AS memory_bytes
    FROM devices WHERE kind <> 'nic' AND trace_id IS NOT NULL AND rank IS NOT NULL
      AND tl_known(name, core_count, memory_bytes)
    GROUP BY ALL
"""


def peaks_sql(attributed: str) -> str:
    """Per (trace, rank), ``peak_tflops`` for the breakdown: the trace's own (XLA), else the known device's figure
    for the dtype of most credited model FLOPs."""
    return f"""
    WITH dominant AS (
        SELECT trace_id, rank, first(credit_dtype ORDER BY total DESC, credit_dtype) AS dtype FROM (
            SELECT trace_id, rank, credit_dtype, sum(credit_model_flops) AS total
            FROM {attributed} WHERE credit_model_flops > 0 AND credit_dtype IS NOT NULL GROUP BY ALL)
        GROUP BY ALL
    ), own AS (
        SELECT trace_id, rank, max(peak_tflops) AS peak_tflops FROM devices GROUP BY ALL
    )
    SELECT coalesce(o.trace_id, m.trace_id) AS trace_id, coalesce(o.rank, m.rank) AS rank,
           coalesce(o.peak_tflops, tl_peak(h.name, h.core_count, h.memory_bytes, m.dtype, 'matmul') / 1e12)
             AS peak_tflops
    FROM own o FULL JOIN dominant m ON m.trace_id = o.trace_id AND m.rank = o.rank
    LEFT JOIN ({HARDWARE_SQL}) h ON h.trace_id = coalesce(o.trace_id, m.trace_id)
     AND h.rank = coalesce(o.rank, m.rank)
    """


def op_stats_sql(attributed: str, host_ops: str) -> str:
    """The ``op_stats`` rows from the attributed device ops (:func:`attribution_sql`)."""
    return f"""
    WITH RECURSIVE per_call AS (
        SELECT trace_id, rank, target, sum(coalesce(dur_ns, 0)) AS device_ns, count(*) AS kernels
        FROM {attributed} WHERE work AND target IS NOT NULL GROUP BY ALL
    ), {_scope_ctes(host_ops)}, calls AS (
        SELECT p.*, h.name AS op, h.input_dims AS input_shapes, coalesce(h.dur_ns, 0) AS host_ns,
               tl_cost(h.name, h.input_dims, h.input_types, h.concrete_inputs) AS cost, m.module
        FROM per_call p JOIN {host_ops} h ON h.trace_id = p.trace_id AND h.event_id = p.target
        LEFT JOIN modules m ON m.trace_id = p.trace_id AND m.start = p.target
    ), rows AS (
        SELECT trace_id, rank, op, input_shapes, cost.dtype AS dtype, cost.kind AS kind, module, count(*) AS count,
               sum(host_ns) AS host_ns, sum(device_ns) AS device_ns, sum(kernels) AS kernels,
               CASE WHEN count(cost.flops) = count(*) THEN sum(cost.flops) END AS flops,
               CASE WHEN count(cost.bytes) = count(*) THEN sum(cost.bytes) END AS bytes
        FROM calls GROUP BY ALL
        UNION ALL
        SELECT trace_id, rank, '{NO_OPERATOR}', NULL, NULL, NULL, NULL, NULL, NULL, sum(coalesce(dur_ns, 0)),
               count(*), NULL, NULL
        FROM {attributed} WHERE work AND target IS NULL GROUP BY ALL
    ), figures AS (
        SELECT r.*, tl_peak(h.name, h.core_count, h.memory_bytes, r.dtype, r.kind) AS peak,
               tl_hbm(h.name, h.core_count, h.memory_bytes) AS hbm,
               CASE WHEN r.device_ns > 0 THEN r.flops / (r.device_ns * 1000.0) END AS achieved_tflops,
               CASE WHEN r.bytes > 0 THEN r.flops / r.bytes END AS arithmetic_intensity
        FROM rows r LEFT JOIN ({HARDWARE_SQL}) h ON h.trace_id = r.trace_id AND h.rank = r.rank
    ), bounds AS (
        SELECT *, CASE WHEN arithmetic_intensity IS NOT NULL AND peak > 0 AND hbm > 0 AND device_ns > 0
                       THEN CASE WHEN arithmetic_intensity >= peak / hbm THEN 'compute' ELSE 'memory' END END AS bound
        FROM figures
    ), pct AS (
        SELECT *, CASE bound WHEN 'memory' THEN bytes * 1e11 / (device_ns * hbm)
                             WHEN 'compute' THEN flops * 1e11 / (device_ns * peak) END AS pct_of_roofline
        FROM bounds
    )
    SELECT *, pct_of_roofline > 100.0 AS above_roofline FROM pct
    """


def _scope_ctes(host_ops: str) -> str:
    """CTEs ending in ``modules`` (trace_id, start, module): each operator call's ``module`` path (docs/analyses.md,
    "Module"), by recursive walks up ``parent_id`` from the calls and from the forward events of backward calls."""
    return f"""
    fwd AS (
        SELECT trace_id, sequence_number AS seq, min(event_id) AS event_id FROM {host_ops}
        WHERE sequence_number IS NOT NULL AND coalesce(fwd_thread_id, 0) <= 0 GROUP BY ALL
    ), starts AS (
        SELECT DISTINCT trace_id, target AS event_id FROM per_call
        UNION SELECT trace_id, event_id FROM fwd
    ), walk(trace_id, start, event_id, up) AS (
        SELECT trace_id, event_id, event_id, 0 FROM starts
        UNION ALL
        SELECT w.trace_id, w.start, h.parent_id, w.up + 1
        FROM walk w JOIN {host_ops} h ON h.trace_id = w.trace_id AND h.event_id = w.event_id
        WHERE h.parent_id IS NOT NULL AND w.up < 256
    ), steps AS (
        SELECT w.*, tl_scope_kind(h.cat, h.name) AS kind, tl_scope_name(h.name) AS shown, h.sequence_number AS seq,
               coalesce(h.fwd_thread_id, 0) > 0 AND h.sequence_number IS NOT NULL AS backward
        FROM walk w JOIN {host_ops} h ON h.trace_id = w.trace_id AND h.event_id = w.event_id
    ), own AS (  -- the innermost module and its path; the innermost user frame; the nearest backward mark
        SELECT trace_id, start,
               min(up) FILTER (WHERE kind = {MODULE}) AS module_up,
               arg_min(shown, up) FILTER (WHERE kind = {FRAME}) AS frame,
               arg_min(seq, up) FILTER (WHERE backward) AS seq
        FROM steps GROUP BY ALL
    ), paths AS (
        SELECT o.trace_id, o.start, string_agg(s.shown, '/' ORDER BY s.up DESC) AS path
        FROM own o JOIN steps s ON s.trace_id = o.trace_id AND s.start = o.start
        WHERE s.kind = {MODULE} AND s.up >= o.module_up GROUP BY ALL
    ), modules AS (
        SELECT o.trace_id, o.start, coalesce(p.path, CASE WHEN o.seq IS NOT NULL THEN fp.path END, o.frame) AS module
        FROM own o LEFT JOIN paths p ON p.trace_id = o.trace_id AND p.start = o.start
        LEFT JOIN fwd f ON f.trace_id = o.trace_id AND f.seq = o.seq
        LEFT JOIN paths fp ON fp.trace_id = f.trace_id AND fp.start = f.event_id
    )"""
