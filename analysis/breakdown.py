"""The time breakdown per rank, for the whole trace and per step (ANALYSES.md).

One sweep over each window's device ops: every op contributes a start (+1) and an
end (-1) to the counter of its category; between two consecutive points the state
(which categories are active) is constant, so each segment's length goes to the
buckets its state belongs to. Unions, the communication/compute intersection and
the exclusive buckets all come out of the same pass, in DuckDB, with no
per-nanosecond arrays. Sync ops are not work and never count as busy.
"""

from __future__ import annotations

import duckdb
import polars as pl

#: Output columns, in order (all integer ns except ``overlap_pct``).
COLUMNS = (
    "trace_id", "rank", "step", "span_ns", "busy_ns", "idle_ns",
    "compute_ns", "communication_ns", "memory_ns",
    "overlapped_communication_ns", "exposed_communication_ns", "overlap_pct",
    "compute_only_ns", "communication_only_ns", "memory_only_ns",
    "compute_communication_ns", "other_overlap_ns",
)


def breakdown_sql(device_ops: str) -> str:
    """SQL computing the breakdown of ``device_ops`` (a table, view or parenthesised query).

    ``device_ops`` needs ``trace_id``, ``rank``, ``step``, ``category``, ``ts_ns`` and
    ``dur_ns``. One row per (trace, rank) with ``step`` NULL for the whole trace,
    plus one row per (trace, rank, step).
    """
    return f"""
    WITH ops AS (
        SELECT trace_id, rank, step, category, ts_ns, ts_ns + dur_ns AS end_ns
        FROM {device_ops} WHERE category <> 'sync' AND dur_ns >= 0
    ), windows AS (
        SELECT trace_id, rank, NULL::BIGINT AS step, category, ts_ns, end_ns, FALSE AS per_step FROM ops
        UNION ALL
        SELECT trace_id, rank, step, category, ts_ns, end_ns, TRUE FROM ops WHERE step IS NOT NULL
    ), spans AS (
        SELECT trace_id, rank, step, per_step, min(ts_ns) AS first_ns, max(end_ns) AS last_ns
        FROM windows GROUP BY ALL
    ), points AS (
        SELECT trace_id, rank, step, per_step, ts_ns AS t,
               (category = 'compute')::INT AS dc, (category = 'communication')::INT AS dm,
               (category = 'memory')::INT AS dx
        FROM windows
        UNION ALL
        SELECT trace_id, rank, step, per_step, end_ns,
               -(category = 'compute')::INT, -(category = 'communication')::INT, -(category = 'memory')::INT
        FROM windows
    ), deltas AS (
        SELECT trace_id, rank, step, per_step, t, sum(dc) AS dc, sum(dm) AS dm, sum(dx) AS dx
        FROM points GROUP BY ALL
    ), states AS (
        SELECT *,
               sum(dc) OVER w > 0 AS c, sum(dm) OVER w > 0 AS m, sum(dx) OVER w > 0 AS x,
               lead(t) OVER (PARTITION BY trace_id, rank, step, per_step ORDER BY t) - t AS len
        FROM deltas
        WINDOW w AS (PARTITION BY trace_id, rank, step, per_step ORDER BY t ROWS UNBOUNDED PRECEDING)
    ), sums AS (
        SELECT trace_id, rank, step, per_step,
               CAST(coalesce(sum(len) FILTER (WHERE c OR m OR x), 0) AS BIGINT) AS busy_ns,
               CAST(coalesce(sum(len) FILTER (WHERE c), 0) AS BIGINT) AS compute_ns,
               CAST(coalesce(sum(len) FILTER (WHERE m), 0) AS BIGINT) AS communication_ns,
               CAST(coalesce(sum(len) FILTER (WHERE x), 0) AS BIGINT) AS memory_ns,
               CAST(coalesce(sum(len) FILTER (WHERE c AND m), 0) AS BIGINT) AS overlapped_communication_ns,
               CAST(coalesce(sum(len) FILTER (WHERE c AND NOT m AND NOT x), 0) AS BIGINT) AS compute_only_ns,
               CAST(coalesce(sum(len) FILTER (WHERE m AND NOT c AND NOT x), 0) AS BIGINT) AS communication_only_ns,
               CAST(coalesce(sum(len) FILTER (WHERE x AND NOT c AND NOT m), 0) AS BIGINT) AS memory_only_ns,
               CAST(coalesce(sum(len) FILTER (WHERE c AND m AND NOT x), 0) AS BIGINT) AS compute_communication_ns
        FROM states WHERE len IS NOT NULL GROUP BY ALL
    )
    SELECT sp.trace_id, sp.rank, sp.step,
           sp.last_ns - sp.first_ns AS span_ns,
           coalesce(s.busy_ns, 0) AS busy_ns,
           sp.last_ns - sp.first_ns - coalesce(s.busy_ns, 0) AS idle_ns,
           coalesce(s.compute_ns, 0) AS compute_ns,
           coalesce(s.communication_ns, 0) AS communication_ns,
           coalesce(s.memory_ns, 0) AS memory_ns,
           coalesce(s.overlapped_communication_ns, 0) AS overlapped_communication_ns,
           coalesce(s.communication_ns - s.overlapped_communication_ns, 0) AS exposed_communication_ns,
           CASE WHEN coalesce(s.communication_ns, 0) > 0
                THEN 100.0 * s.overlapped_communication_ns / s.communication_ns END AS overlap_pct,
           coalesce(s.compute_only_ns, 0) AS compute_only_ns,
           coalesce(s.communication_only_ns, 0) AS communication_only_ns,
           coalesce(s.memory_only_ns, 0) AS memory_only_ns,
           coalesce(s.compute_communication_ns, 0) AS compute_communication_ns,
           coalesce(s.busy_ns - s.compute_only_ns - s.communication_only_ns - s.memory_only_ns
                    - s.compute_communication_ns, 0) AS other_overlap_ns
    FROM spans sp LEFT JOIN sums s
      ON s.trace_id = sp.trace_id AND s.rank = sp.rank AND s.per_step = sp.per_step
     AND s.step IS NOT DISTINCT FROM sp.step
    ORDER BY sp.trace_id, sp.rank, sp.per_step, sp.step
    """


def breakdown(con: duckdb.DuckDBPyConnection, device_ops: str = "device_ops") -> pl.DataFrame:
    """The breakdown of every (trace, rank) and (trace, rank, step) in ``device_ops``, as a polars frame."""
    return con.sql(breakdown_sql(device_ops)).pl()


def breakdown_of_frame(device_ops: pl.DataFrame) -> pl.DataFrame:
    """The breakdown of a polars frame of device ops (for notebooks and tests)."""
    con = duckdb.connect()
    try:
        con.register("ops_frame", device_ops.to_arrow())
        return breakdown(con, "ops_frame")
    finally:
        con.close()
