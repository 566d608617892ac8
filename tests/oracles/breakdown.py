"""The breakdown in SQL (docs/analyses.md, "Breakdown"): the readable reference ``analysis/breakdown.py``'s
sweep is checked against."""

from __future__ import annotations

from tracelake.contracts.classify import Category


#: Empty stand-ins for the optional inputs of :func:`breakdown_sql`.
NO_ASYNC = ("(SELECT NULL::VARCHAR AS trace_id, NULL::INTEGER AS rank, NULL::BIGINT AS step, "
            "NULL::BIGINT AS ts_ns, NULL::BIGINT AS dur_ns LIMIT 0)")
NO_DEVICES = "(SELECT NULL::VARCHAR AS trace_id, NULL::INTEGER AS rank, NULL::DOUBLE AS peak_tflops LIMIT 0)"


def breakdown_sql(device_ops: str, async_windows: str = NO_ASYNC, devices: str = NO_DEVICES,
                  model_flops: str = "flops", recomputed_flops: str = "0.0") -> str:
    """SQL computing the breakdown of ``device_ops`` (a table, view or parenthesised query).

    ``device_ops`` needs ``trace_id``, ``rank``, ``step``, ``category``, ``ts_ns``,
    ``dur_ns`` and ``flops``; ``async_windows`` (``trace_id``, ``rank``, ``step``,
    ``ts_ns``, ``dur_ns``) are async collective spans; ``devices`` gives ``peak_tflops``
    per (``trace_id``, ``rank``). One row per (trace, rank) with ``step`` NULL for the
    whole trace, plus one row per (trace, rank, step). ``model_flops`` names the column of
    ``device_ops`` holding each op's model FLOPs (``hfu_pct``); by default its ``flops``; ``recomputed_flops``
    the part of them a recomputation ran again (left out of ``mfu_pct``).
    """
    return f"""
    WITH ops AS (
        SELECT trace_id, rank, step, category, ts_ns, ts_ns + dur_ns AS end_ns, flops,
               {model_flops} AS model_flops, {recomputed_flops} AS recomputed_flops
        FROM {device_ops} WHERE category <> '{Category.SYNC}' AND dur_ns >= 0
        UNION ALL
        SELECT trace_id, rank, step, 'async', ts_ns, ts_ns + dur_ns, NULL, NULL, NULL
        FROM {async_windows} WHERE dur_ns >= 0
    ), windows AS (
        SELECT trace_id, rank, NULL::BIGINT AS step, category, ts_ns, end_ns, flops, model_flops, recomputed_flops,
               FALSE AS per_step
        FROM ops
        UNION ALL
        SELECT trace_id, rank, step, category, ts_ns, end_ns, flops, model_flops, recomputed_flops, TRUE FROM ops
        WHERE step IS NOT NULL
    ), spans AS (
        SELECT trace_id, rank, step, per_step, min(ts_ns) AS first_ns, max(end_ns) AS last_ns,
               sum(flops) AS flops, sum(model_flops) AS model_flops, sum(recomputed_flops) AS recomputed_flops
        FROM windows WHERE category <> 'async' GROUP BY ALL
    ), points AS (
        SELECT trace_id, rank, step, per_step, ts_ns AS t,
               (category = '{Category.COMPUTE}')::INT AS dc, (category = '{Category.COMMUNICATION}')::INT AS dm,
               (category = '{Category.MEMORY}')::INT AS dx, (category = 'async')::INT AS da
        FROM windows
        UNION ALL
        SELECT trace_id, rank, step, per_step, end_ns,
               -(category = '{Category.COMPUTE}')::INT, -(category = '{Category.COMMUNICATION}')::INT,
               -(category = '{Category.MEMORY}')::INT,
               -(category = 'async')::INT
        FROM windows
    ), deltas AS (
        SELECT trace_id, rank, step, per_step, t, sum(dc) AS dc, sum(dm) AS dm, sum(dx) AS dx, sum(da) AS da
        FROM points GROUP BY ALL
    ), states AS (
        SELECT *,
               sum(dc) OVER w > 0 AS c, sum(dm) OVER w > 0 AS m, sum(dx) OVER w > 0 AS x,
               sum(da) OVER w > 0 AS a,
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
               CAST(coalesce(sum(len) FILTER (WHERE c AND m AND NOT x), 0) AS BIGINT) AS compute_communication_ns,
               CAST(coalesce(sum(len) FILTER (WHERE a), 0) AS BIGINT) AS async_collective_ns,
               CAST(coalesce(sum(len) FILTER (WHERE a AND NOT (c OR m OR x)), 0) AS BIGINT)
                 AS exposed_async_collective_ns
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
                    - s.compute_communication_ns, 0) AS other_overlap_ns,
           coalesce(s.async_collective_ns, 0) AS async_collective_ns,
           coalesce(s.exposed_async_collective_ns, 0) AS exposed_async_collective_ns,
           sp.flops,
           CASE WHEN sp.flops IS NOT NULL AND d.peak_tflops > 0 AND sp.last_ns > sp.first_ns
                THEN 100.0 * sp.flops / (d.peak_tflops * 1e12 * (sp.last_ns - sp.first_ns) / 1e9) END
             AS flops_utilisation_pct,
           CASE WHEN sp.model_flops IS NOT NULL AND d.peak_tflops > 0 AND sp.last_ns > sp.first_ns
                THEN 100.0 * greatest(sp.model_flops - coalesce(sp.recomputed_flops, 0.0), 0.0)
                     / (d.peak_tflops * 1e12 * (sp.last_ns - sp.first_ns) / 1e9) END
             AS mfu_pct,
           CASE WHEN sp.model_flops IS NOT NULL AND d.peak_tflops > 0 AND sp.last_ns > sp.first_ns
                THEN 100.0 * sp.model_flops / (d.peak_tflops * 1e12 * (sp.last_ns - sp.first_ns) / 1e9) END
             AS hfu_pct
    FROM spans sp LEFT JOIN sums s
      ON s.trace_id = sp.trace_id AND s.rank = sp.rank AND s.per_step = sp.per_step
     AND s.step IS NOT DISTINCT FROM sp.step
    LEFT JOIN (SELECT trace_id, rank, max(peak_tflops) AS peak_tflops FROM {devices} GROUP BY ALL) d
      ON d.trace_id = sp.trace_id AND d.rank = sp.rank
    ORDER BY sp.trace_id, sp.rank, sp.per_step, sp.step
    """
