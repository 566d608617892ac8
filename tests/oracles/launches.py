"""Launch statistics, launch queues and graph launches in SQL (docs/analyses.md, "Launches", "CUDA/HIP graphs").

The readable reference for ``analysis/launches.py`` and ``analysis/graphs.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

import duckdb
import polars as pl

from tracelake.analysis.launches import GRAPH_CALL
from tracelake.contracts.classify import Category


def launch_stats(
    con: duckdb.DuckDBPyConnection,
    *,
    where: str = "TRUE",
    params: Sequence[object] | None = None,
    device_ops: str = "device_ops",
    host_ops: str = "host_ops",
) -> pl.DataFrame:
    """Launch delay distribution and kernels shorter than their launch, per (trace, rank).

    ``where`` filters device ops (columns prefixed ``d.``).
    """
    return con.sql(launch_stats_sql(device_ops, host_ops, where), params=list(params or [])).pl()


def launch_calls_sql(host_ops: str) -> str:
    """Per (trace, correlation), the host call that launched it: ``launch_ns`` and ``call_ns`` (its duration).

    That is the first host event with the id (by start, then the shorter); an event without
    a duration counts as instant. ``graph_call``: some event with the id is named like
    :data:`GRAPH_CALL`; ``call``: the (smallest) name of those, null when none is.
    """
    return f"""
        SELECT trace_id, correlation, min(ts_ns) AS launch_ns,
               arg_min(coalesce(dur_ns, 0), (ts_ns, coalesce(dur_ns, 0))) AS call_ns,
               coalesce(bool_or(regexp_matches(name, '{GRAPH_CALL}')), FALSE) AS graph_call,
               min(name) FILTER (WHERE regexp_matches(name, '{GRAPH_CALL}')) AS call
        FROM {host_ops} WHERE correlation IS NOT NULL AND ts_ns IS NOT NULL GROUP BY ALL
    """


def shared_correlations_sql(device_ops: str) -> str:
    """Per trace, the correlation ids more than one kernel carries: graph launches whatever the call's name."""
    return f"""
        SELECT trace_id, correlation FROM {device_ops}
        WHERE kind = 'kernel' AND correlation IS NOT NULL AND ts_ns IS NOT NULL
        GROUP BY ALL HAVING count(*) > 1
    """


def launched_kernels_sql(device_ops: str, host_ops: str, where: str = "TRUE") -> str:
    """Every kernel joined to its launch call: ``launch_ns``, ``call_ns``, ``call`` and ``in_graph``.

    ``in_graph``: the call is a graph launch (:data:`GRAPH_CALL`) or the trace has other kernels
    with the same correlation. The shared ids are counted over the whole trace, not only ``where``:
    being in a graph is a property of the launch, not of the selection.
    """
    return f"""
        SELECT d.*, r.launch_ns, r.call_ns, r.call,
               r.graph_call OR s.correlation IS NOT NULL AS in_graph
        FROM {device_ops} d
        JOIN ({launch_calls_sql(host_ops)}) r ON r.trace_id = d.trace_id AND r.correlation = d.correlation
        LEFT JOIN ({shared_correlations_sql(device_ops)}) s
          ON s.trace_id = d.trace_id AND s.correlation = d.correlation
        WHERE d.kind = 'kernel' AND d.correlation IS NOT NULL AND d.ts_ns IS NOT NULL AND ({where})
    """


def launch_stats_sql(device_ops: str, host_ops: str, where: str = "TRUE") -> str:
    """SQL of :func:`launch_stats`: kernels launched one by one, and graph launches (one row each) apart."""
    return f"""
    WITH d AS (
        SELECT trace_id, rank, correlation, ts_ns, dur_ns, call_ns, in_graph, launch_ns + call_ns AS called_ns,
               greatest(ts_ns - (launch_ns + call_ns), 0) AS delay_ns
        FROM ({launched_kernels_sql(device_ops, host_ops, where)})
    ), one AS (
        SELECT trace_id, rank, count(*) AS launches,
               round(avg(delay_ns)) AS mean_delay_ns,
               round(quantile_cont(delay_ns, 0.5)) AS p50_delay_ns,
               round(quantile_cont(delay_ns, 0.95)) AS p95_delay_ns,
               max(delay_ns) AS max_delay_ns,
               count(*) FILTER (WHERE dur_ns < call_ns) AS shorter,
               sum(call_ns) FILTER (WHERE dur_ns < call_ns) AS overhead
        FROM d WHERE NOT in_graph GROUP BY ALL
    ), g AS (
        SELECT trace_id, rank, correlation, count(*) AS kernels, any_value(call_ns) AS call_ns,
               greatest(min(ts_ns) - any_value(called_ns), 0) AS delay_ns
        FROM d WHERE in_graph GROUP BY ALL
    ), graphs AS (
        SELECT trace_id, rank, count(*) AS graph_launches, sum(kernels) AS graph_kernels,
               sum(call_ns) AS graph_launch_ns, round(avg(delay_ns)) AS graph_mean_delay_ns,
               max(delay_ns) AS graph_max_delay_ns
        FROM g GROUP BY ALL
    ), k AS (SELECT DISTINCT trace_id, rank FROM d)
    SELECT k.trace_id, k.rank, coalesce(o.launches, 0) AS launches,
           o.mean_delay_ns, o.p50_delay_ns, o.p95_delay_ns, o.max_delay_ns,
           coalesce(o.shorter, 0) AS shorter_than_launch,
           100.0 * o.shorter / nullif(o.launches, 0) AS shorter_than_launch_pct,
           CAST(coalesce(o.overhead, 0) AS BIGINT) AS launch_overhead_ns,
           coalesce(g.graph_launches, 0) AS graph_launches, coalesce(g.graph_kernels, 0) AS graph_kernels,
           CAST(coalesce(g.graph_launch_ns, 0) AS BIGINT) AS graph_launch_ns,
           g.graph_mean_delay_ns, g.graph_max_delay_ns
    FROM k
    LEFT JOIN one o ON o.trace_id IS NOT DISTINCT FROM k.trace_id AND o.rank IS NOT DISTINCT FROM k.rank
    LEFT JOIN graphs g ON g.trace_id IS NOT DISTINCT FROM k.trace_id AND g.rank IS NOT DISTINCT FROM k.rank
    ORDER BY k.trace_id, k.rank
    """


def queue_lengths(
    con: duckdb.DuckDBPyConnection,
    *,
    where: str = "TRUE",
    params: Sequence[object] | None = None,
    device_ops: str = "device_ops",
    host_ops: str = "host_ops",
) -> pl.DataFrame:
    """Launch queue depth per stream: +1 when a runtime call launches an op, -1 when the op starts.

    ``max_queue`` is the deepest the queue got; ``mean_queue`` its time-weighted mean
    between the first launch and the last start. A queue that stays near zero means the
    device waits for the host; a deep one means the host runs ahead (good).
    """
    return con.sql(queue_lengths_sql(device_ops, host_ops, where), params=list(params or [])).pl()


def queue_lengths_sql(device_ops: str, host_ops: str, where: str = "TRUE") -> str:
    """SQL of :func:`queue_lengths`."""
    return f"""
    WITH l AS (
        SELECT d.trace_id, d.rank, d.stream, r.launch_ns, d.ts_ns AS start_ns
        FROM {device_ops} d
        JOIN ({launch_calls_sql(host_ops)}) r ON r.trace_id = d.trace_id AND r.correlation = d.correlation
        WHERE d.correlation IS NOT NULL AND d.ts_ns IS NOT NULL AND d.category <> '{Category.SYNC}' AND ({where})
    ), points AS (
        SELECT trace_id, rank, stream, launch_ns AS t, 1 AS delta FROM l
        UNION ALL
        SELECT trace_id, rank, stream, greatest(start_ns, launch_ns), -1 FROM l
    ), summed AS (
        SELECT trace_id, rank, stream, t, sum(delta) AS delta FROM points GROUP BY ALL
    ), depth AS (
        SELECT *, sum(delta) OVER w AS queue,
               lead(t) OVER (PARTITION BY trace_id, rank, stream ORDER BY t) - t AS len
        FROM summed
        WINDOW w AS (PARTITION BY trace_id, rank, stream ORDER BY t ROWS UNBOUNDED PRECEDING)
    )
    SELECT q.trace_id, q.rank, q.stream, n.launches, q.max_queue, q.mean_queue
    FROM (
        SELECT trace_id, rank, stream, CAST(max(queue) AS BIGINT) AS max_queue,
               sum(queue * len) / nullif(sum(len), 0) AS mean_queue
        FROM depth GROUP BY ALL
    ) q JOIN (SELECT trace_id, rank, stream, count(*) AS launches FROM l GROUP BY ALL) n
      ON n.trace_id IS NOT DISTINCT FROM q.trace_id AND n.rank IS NOT DISTINCT FROM q.rank
     AND n.stream IS NOT DISTINCT FROM q.stream
    ORDER BY q.trace_id, q.rank, q.stream
    """


def graph_launches(
    con: duckdb.DuckDBPyConnection,
    *,
    where: str = "TRUE",
    params: Sequence[object] | None = None,
    device_ops: str = "device_ops",
    host_ops: str = "host_ops",
) -> pl.DataFrame:
    """One row per graph launch (:data:`tracelake.analysis.graphs.COLUMNS`), by trace, rank and launch time.

    ``where`` filters device ops (columns prefixed ``d.``).
    """
    return con.sql(graph_launches_sql(device_ops, host_ops, where), params=list(params or [])).pl()


def graph_launches_sql(device_ops: str, host_ops: str, where: str = "TRUE") -> str:
    """SQL of :func:`graph_launches`.

    The union of busy time is summed in start order: each kernel adds what it runs past the
    latest end before it (the kernels before it cover everything up to that end, as they all
    started no later).
    """
    return f"""
    WITH g AS (
        SELECT trace_id, rank, correlation, stream, graph_id, call, launch_ns, call_ns, ts_ns,
               coalesce(dur_ns, 0) AS dur_ns, ts_ns + coalesce(dur_ns, 0) AS end_ns
        FROM ({launched_kernels_sql(device_ops, host_ops, where)}) WHERE in_graph
    ), o AS (
        SELECT *, max(end_ns) OVER (PARTITION BY trace_id, rank, correlation ORDER BY ts_ns, end_ns
                                    ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS covered_ns
        FROM g
    )
    SELECT trace_id, rank, correlation, min(graph_id) AS graph_id, any_value(call) AS call,
           any_value(launch_ns) AS launch_ns, any_value(call_ns) AS call_ns, count(*) AS kernels,
           count(DISTINCT stream) AS streams, min(ts_ns) AS first_ns, CAST(sum(dur_ns) AS BIGINT) AS device_ns,
           max(end_ns) - min(ts_ns) AS span_ns,
           CAST(max(end_ns) - min(ts_ns)
                - sum(greatest(end_ns - greatest(ts_ns, coalesce(covered_ns, ts_ns)), 0)) AS BIGINT) AS gaps_ns,
           greatest(min(ts_ns) - any_value(launch_ns + call_ns), 0) AS delay_ns
    FROM o GROUP BY ALL ORDER BY trace_id, rank, launch_ns, correlation
    """

