"""The time breakdown per rank, for the whole trace and per step (ANALYSES.md).

One sweep over each window's device ops: every op contributes a start (+1) and an
end (-1) to the counter of its category; between two consecutive points the state
(which categories are active) is constant, so each segment's length goes to the
buckets its state belongs to. Unions, the communication/compute intersection and
the exclusive buckets all come out of the same pass, in DuckDB, with no
per-nanosecond arrays. Sync ops are not work and never count as busy.

Async collective windows (XLA's ``Async XLA Ops``: start to done) join the sweep as
a fourth state that is never busy: the part of them no device op covers is
``exposed_async_collective_ns``. FLOPs are summed per window, and with the device's
peak (``devices.peak_tflops``) give ``flops_utilisation_pct`` over the span.
"""

from __future__ import annotations

import duckdb
import numpy as np
import polars as pl

#: Output columns, in order (all integer ns except ``overlap_pct``).
COLUMNS = (
    "trace_id", "rank", "step", "span_ns", "busy_ns", "idle_ns",
    "compute_ns", "communication_ns", "memory_ns",
    "overlapped_communication_ns", "exposed_communication_ns", "overlap_pct",
    "compute_only_ns", "communication_only_ns", "memory_only_ns",
    "compute_communication_ns", "other_overlap_ns",
    "async_collective_ns", "exposed_async_collective_ns", "flops", "flops_utilisation_pct",
)

#: Empty stand-ins for the optional inputs of :func:`breakdown_sql`.
NO_ASYNC = ("(SELECT NULL::VARCHAR AS trace_id, NULL::INTEGER AS rank, NULL::BIGINT AS step, "
            "NULL::BIGINT AS ts_ns, NULL::BIGINT AS dur_ns LIMIT 0)")
NO_DEVICES = "(SELECT NULL::VARCHAR AS trace_id, NULL::INTEGER AS rank, NULL::DOUBLE AS peak_tflops LIMIT 0)"


def breakdown_sql(device_ops: str, async_windows: str = NO_ASYNC, devices: str = NO_DEVICES) -> str:
    """SQL computing the breakdown of ``device_ops`` (a table, view or parenthesised query).

    ``device_ops`` needs ``trace_id``, ``rank``, ``step``, ``category``, ``ts_ns``,
    ``dur_ns`` and ``flops``; ``async_windows`` (``trace_id``, ``rank``, ``step``,
    ``ts_ns``, ``dur_ns``) are async collective spans; ``devices`` gives ``peak_tflops``
    per (``trace_id``, ``rank``). One row per (trace, rank) with ``step`` NULL for the
    whole trace, plus one row per (trace, rank, step).
    """
    return f"""
    WITH ops AS (
        SELECT trace_id, rank, step, category, ts_ns, ts_ns + dur_ns AS end_ns, flops
        FROM {device_ops} WHERE category <> 'sync' AND dur_ns >= 0
        UNION ALL
        SELECT trace_id, rank, step, 'async', ts_ns, ts_ns + dur_ns, NULL
        FROM {async_windows} WHERE dur_ns >= 0
    ), windows AS (
        SELECT trace_id, rank, NULL::BIGINT AS step, category, ts_ns, end_ns, flops, FALSE AS per_step FROM ops
        UNION ALL
        SELECT trace_id, rank, step, category, ts_ns, end_ns, flops, TRUE FROM ops WHERE step IS NOT NULL
    ), spans AS (
        SELECT trace_id, rank, step, per_step, min(ts_ns) AS first_ns, max(end_ns) AS last_ns,
               sum(flops) AS flops
        FROM windows WHERE category <> 'async' GROUP BY ALL
    ), points AS (
        SELECT trace_id, rank, step, per_step, ts_ns AS t,
               (category = 'compute')::INT AS dc, (category = 'communication')::INT AS dm,
               (category = 'memory')::INT AS dx, (category = 'async')::INT AS da
        FROM windows
        UNION ALL
        SELECT trace_id, rank, step, per_step, end_ns,
               -(category = 'compute')::INT, -(category = 'communication')::INT, -(category = 'memory')::INT,
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
             AS flops_utilisation_pct
    FROM spans sp LEFT JOIN sums s
      ON s.trace_id = sp.trace_id AND s.rank = sp.rank AND s.per_step = sp.per_step
     AND s.step IS NOT DISTINCT FROM sp.step
    LEFT JOIN (SELECT trace_id, rank, max(peak_tflops) AS peak_tflops FROM {devices} GROUP BY ALL) d
      ON d.trace_id = sp.trace_id AND d.rank = sp.rank
    ORDER BY sp.trace_id, sp.rank, sp.per_step, sp.step
    """


def breakdown(con: duckdb.DuckDBPyConnection, device_ops: str = "device_ops") -> pl.DataFrame:
    """The breakdown of every (trace, rank) and (trace, rank, step) in ``device_ops``, as a polars frame."""
    return con.sql(breakdown_sql(device_ops)).pl()


def breakdown_of_frame(device_ops: pl.DataFrame) -> pl.DataFrame:
    """The breakdown of a polars frame of device ops (for notebooks and tests)."""
    con = duckdb.connect()
    try:
        if "flops" not in device_ops.columns:
            device_ops = device_ops.with_columns(pl.lit(None, dtype=pl.Float64).alias("flops"))
        con.register("ops_frame", device_ops.to_arrow())
        return breakdown(con, "ops_frame")
    finally:
        con.close()


# -- the same breakdown, vectorised -----------------------------------------------------
#
# breakdown_sql above is the readable reference; breakdown_frame computes the same rows
# with numpy sorts and cumulative sums, which stays fast for millions of ops and many
# steps (DuckDB's windows spill heavily there). A test keeps the two equal.

_CODES = {"compute": 0, "communication": 1, "memory": 2}
_ASYNC, _OTHER = 3, 4
_STATE_BUCKETS = {
    # bucket: predicate over the 4-bit state (1 compute, 2 communication, 4 memory, 8 async window)
    "busy_ns": lambda s: (s & 7) != 0,
    "compute_ns": lambda s: (s & 1) != 0,
    "communication_ns": lambda s: (s & 2) != 0,
    "memory_ns": lambda s: (s & 4) != 0,
    "overlapped_communication_ns": lambda s: (s & 3) == 3,
    "compute_only_ns": lambda s: (s & 7) == 1,
    "communication_only_ns": lambda s: (s & 7) == 2,
    "memory_only_ns": lambda s: (s & 7) == 4,
    "compute_communication_ns": lambda s: (s & 7) == 3,
    "async_collective_ns": lambda s: (s & 8) != 0,
    "exposed_async_collective_ns": lambda s: s == 8,
}


def _order(key: np.ndarray, t: np.ndarray) -> np.ndarray:
    """The permutation sorting by (key, t): one argsort of a packed int64 when it fits, else lexsort."""
    t_low, t_span = int(t.min()), int(t.max()) - int(t.min()) + 1
    k_low, k_span = int(key.min()), int(key.max()) - int(key.min()) + 1
    if t_span * k_span < 2**62:
        return np.argsort((key - k_low) * t_span + (t - t_low))
    return np.lexsort((t, key))


def _state_sums(key: np.ndarray, start: np.ndarray, end: np.ndarray, code: np.ndarray) -> dict[int, dict[str, int]]:
    """Per key: time spent in each state of the sweep, summed into the buckets."""
    if not len(key):
        return {}
    t = np.concatenate([start, end])
    order = _order(np.concatenate([key, key]), t)
    t = t[order]
    k = np.concatenate([key, key])[order]
    c = np.concatenate([code, code]).astype(np.int8)[order]
    delta = np.where(order < len(key), 1, -1).astype(np.int32)
    del order
    state = np.zeros(len(t), dtype=np.int8)
    for bit, which in ((1, 0), (2, 1), (4, 2), (8, _ASYNC)):
        state |= np.where(np.cumsum(np.where(c == which, delta, 0)) > 0, bit, 0).astype(np.int8)
    length = np.diff(t)
    length[k[1:] != k[:-1]] = 0  # no segment runs from one window into the next
    keys, index = np.unique(k[:-1], return_inverse=True)
    per_state = np.bincount(index * 16 + state[:-1].astype(np.int64), weights=length,
                            minlength=len(keys) * 16).reshape(-1, 16)
    states = np.arange(16)
    out: dict[int, dict[str, int]] = {}
    for row, key_value in enumerate(keys.tolist()):
        out[key_value] = {
            bucket: int(round(per_state[row][test(states)].sum())) for bucket, test in _STATE_BUCKETS.items()
        }
    return out


def breakdown_frame(
    device_ops: pl.DataFrame,
    async_windows: pl.DataFrame | None = None,
    peak_tflops: dict[tuple[str, int], float] | None = None,
) -> pl.DataFrame:
    """:func:`breakdown_sql`'s rows, computed with numpy (same inputs as frames, same columns)."""
    ops = device_ops.filter((pl.col("category") != "sync") & (pl.col("dur_ns") >= 0))
    if "flops" not in ops.columns:
        ops = ops.with_columns(pl.lit(None, dtype=pl.Float64).alias("flops"))
    windows = async_windows.filter(pl.col("dur_ns") >= 0) if async_windows is not None else None
    rows: list[dict[str, object]] = []
    keys = ops.select("trace_id", "rank").unique(maintain_order=True)
    groups = [((keys["trace_id"][0], keys["rank"][0]), ops)] if keys.height == 1 else \
        ops.group_by(["trace_id", "rank"], maintain_order=True)
    for (trace_id, rank), group in groups:
        mine = windows.filter((pl.col("trace_id") == trace_id) & (pl.col("rank") == rank)) \
            if windows is not None else None
        rows.extend(_rank_rows(str(trace_id), int(rank), group, mine,
                               (peak_tflops or {}).get((str(trace_id), int(rank)))))
    schema = {c: (pl.String if c == "trace_id" else pl.Int32 if c == "rank" else
                  pl.Float64 if c in ("overlap_pct", "flops", "flops_utilisation_pct") else pl.Int64)
              for c in COLUMNS}
    frame = pl.DataFrame(rows, schema=schema) if rows else pl.DataFrame(schema=schema)
    return frame.sort(["trace_id", "rank", pl.col("step").is_not_null(), "step"], nulls_last=False)


def _rank_rows(
    trace_id: str, rank: int, ops: pl.DataFrame, windows: pl.DataFrame | None, peak: float | None
) -> list[dict[str, object]]:
    start = ops["ts_ns"].to_numpy().astype(np.int64)
    end = start + ops["dur_ns"].to_numpy().astype(np.int64)
    code = ops["category"].cast(pl.String).replace_strict(_CODES, default=_OTHER, return_dtype=pl.Int8).to_numpy()
    steps = ops["step"].fill_null(-1).to_numpy().astype(np.int64)
    if windows is not None and windows.height:
        w_start = windows["ts_ns"].to_numpy().astype(np.int64)
        start = np.concatenate([start, w_start])
        end = np.concatenate([end, w_start + windows["dur_ns"].to_numpy().astype(np.int64)])
        code = np.concatenate([code, np.full(windows.height, _ASYNC)])
        steps = np.concatenate([steps, windows["step"].fill_null(-1).to_numpy().astype(np.int64)])
    whole = _state_sums(np.zeros(len(start), dtype=np.int64), start, end, code)
    in_step = steps >= 0
    per_step = _state_sums(steps[in_step], start[in_step], end[in_step], code[in_step])
    spans = ops.group_by(pl.col("step")).agg(
        pl.col("ts_ns").min().alias("first"), (pl.col("ts_ns") + pl.col("dur_ns")).max().alias("last"),
        pl.col("flops").sum().alias("flops"), pl.col("flops").is_not_null().any().alias("has_flops"),
    )
    whole_span = ops.select(
        pl.col("ts_ns").min().alias("first"), (pl.col("ts_ns") + pl.col("dur_ns")).max().alias("last"),
        pl.col("flops").sum().alias("flops"), pl.col("flops").is_not_null().any().alias("has_flops"),
    ).with_columns(pl.lit(None, dtype=pl.Int64).alias("step"))
    out = []
    for span in [*whole_span.to_dicts(), *spans.filter(pl.col("step").is_not_null()).to_dicts()]:
        if span["first"] is None:
            continue
        step = span["step"]
        sums = (whole.get(0) if step is None else per_step.get(int(step))) or dict.fromkeys(_STATE_BUCKETS, 0)
        length = int(span["last"]) - int(span["first"])
        flops = float(span["flops"]) if span["has_flops"] else None
        communication = sums["communication_ns"]
        out.append({
            "trace_id": trace_id, "rank": rank, "step": step, "span_ns": length,
            "busy_ns": sums["busy_ns"], "idle_ns": length - sums["busy_ns"],
            "compute_ns": sums["compute_ns"], "communication_ns": communication, "memory_ns": sums["memory_ns"],
            "overlapped_communication_ns": sums["overlapped_communication_ns"],
            "exposed_communication_ns": communication - sums["overlapped_communication_ns"],
            "overlap_pct": 100.0 * sums["overlapped_communication_ns"] / communication if communication else None,
            "compute_only_ns": sums["compute_only_ns"], "communication_only_ns": sums["communication_only_ns"],
            "memory_only_ns": sums["memory_only_ns"], "compute_communication_ns": sums["compute_communication_ns"],
            "other_overlap_ns": sums["busy_ns"] - sums["compute_only_ns"] - sums["communication_only_ns"]
            - sums["memory_only_ns"] - sums["compute_communication_ns"],
            "async_collective_ns": sums["async_collective_ns"],
            "exposed_async_collective_ns": sums["exposed_async_collective_ns"],
            "flops": flops,
            "flops_utilisation_pct": 100.0 * flops / (peak * 1e12 * length / 1e9)
            if flops is not None and peak and length > 0 else None,
        })
    return out
