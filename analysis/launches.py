"""Kernel launch statistics per rank (ANALYSES.md, "Launches").

Launch delay = kernel start - end of the runtime call that launched it (joined
on correlation), floored at 0. A kernel is *shorter than its launch overhead*
when it runs for less time than its runtime call took: fusing such kernels, or
capturing them in a CUDA graph, removes host time.
"""

from __future__ import annotations

from collections.abc import Sequence

import duckdb
import polars as pl

COLUMNS = (
    "trace_id", "rank", "launches", "mean_delay_ns", "p50_delay_ns", "p95_delay_ns", "max_delay_ns",
    "shorter_than_launch", "shorter_than_launch_pct", "launch_overhead_ns",
)


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
    sql = f"""
    WITH l AS (
        SELECT d.trace_id, d.rank, d.dur_ns,
               greatest(d.ts_ns - (r.ts_ns + r.dur_ns), 0) AS delay_ns, r.dur_ns AS call_ns
        FROM {device_ops} d
        JOIN {host_ops} r ON r.trace_id = d.trace_id AND r.correlation = d.correlation
        WHERE d.kind = 'kernel' AND d.correlation IS NOT NULL AND ({where})
    )
    SELECT trace_id, rank, count(*) AS launches,
           avg(delay_ns) AS mean_delay_ns,
           quantile_cont(delay_ns, 0.5) AS p50_delay_ns,
           quantile_cont(delay_ns, 0.95) AS p95_delay_ns,
           max(delay_ns) AS max_delay_ns,
           count(*) FILTER (WHERE dur_ns < call_ns) AS shorter_than_launch,
           100.0 * count(*) FILTER (WHERE dur_ns < call_ns) / count(*) AS shorter_than_launch_pct,
           CAST(sum(call_ns) FILTER (WHERE dur_ns < call_ns) AS BIGINT) AS launch_overhead_ns
    FROM l GROUP BY ALL ORDER BY trace_id, rank
    """
    return con.sql(sql, params=list(params or [])).pl()
