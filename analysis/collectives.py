"""Collectives across ranks: arrival skew, the last rank, transfer time and bandwidth.

A collective instance is (process group, seq) within a job (ANALYSES.md). Its
transfer time is estimated as the shortest duration over ranks (the others also
waited for the last arrival); algbw = bytes / time and busbw = algbw x the
collective's factor for n ranks, with bytes and factors from FORMATS.md (the
``message_bytes`` column already holds the nccl-tests size of the operation).
"""

from __future__ import annotations

from collections.abc import Sequence

import duckdb
import polars as pl

#: Bus bandwidth factor by PyTorch collective name, as a SQL expression of n.
BUSBW_FACTORS: dict[str, str] = {
    "allreduce": "2.0 * (n - 1) / n", "all_reduce": "2.0 * (n - 1) / n",
    "allgather": "1.0 * (n - 1) / n", "_allgather_base": "1.0 * (n - 1) / n",
    "all_gather": "1.0 * (n - 1) / n", "all_gather_into_tensor": "1.0 * (n - 1) / n",
    "allgather_into_tensor_coalesced": "1.0 * (n - 1) / n",
    "reduce_scatter": "1.0 * (n - 1) / n", "_reduce_scatter_base": "1.0 * (n - 1) / n",
    "reduce_scatter_tensor": "1.0 * (n - 1) / n", "reduce_scatter_tensor_coalesced": "1.0 * (n - 1) / n",
    "all_to_all": "1.0 * (n - 1) / n", "all_to_allv": "1.0 * (n - 1) / n", "alltoall_base": "1.0 * (n - 1) / n",
    "gather": "1.0 * (n - 1) / n", "scatter": "1.0 * (n - 1) / n",
    "broadcast": "1.0", "reduce": "1.0", "send": "1.0", "recv": "1.0",
}

COLUMNS = (
    "process_group", "seq", "collective", "ranks", "message_bytes", "first_ns", "skew_ns", "last_rank",
    "transfer_ns", "algbw_gbs", "busbw_gbs",
)


def instances(
    con: duckdb.DuckDBPyConnection, *, where: str = "TRUE", params: Sequence[object] | None = None,
    collectives: str = "collectives",
) -> pl.DataFrame:
    """One row per collective instance seen on more than one rank, in time order."""
    factor = "CASE lower(collective) " + " ".join(
        f"WHEN '{name}' THEN {expr}" for name, expr in BUSBW_FACTORS.items()
    ) + " END"
    return con.sql(f"""
        WITH c AS (
            SELECT process_group, seq, collective, rank, ts_ns, dur_ns, message_bytes
            FROM {collectives} WHERE seq IS NOT NULL AND ts_ns IS NOT NULL AND ({where})
        ), inst AS (
            SELECT process_group, seq, any_value(collective) AS collective, count(DISTINCT rank) AS n,
                   max(message_bytes) AS message_bytes, min(ts_ns) AS first_ns,
                   max(ts_ns) - min(ts_ns) AS skew_ns, arg_max(rank, ts_ns) AS last_rank,
                   min(dur_ns) AS transfer_ns
            FROM c GROUP BY process_group, seq HAVING count(DISTINCT rank) > 1
        )
        SELECT process_group, seq, collective, n AS ranks, message_bytes, first_ns, skew_ns, last_rank,
               transfer_ns,
               CASE WHEN transfer_ns > 0 THEN message_bytes / transfer_ns END AS algbw_gbs,
               CASE WHEN transfer_ns > 0 THEN message_bytes / transfer_ns * ({factor}) END AS busbw_gbs
        FROM inst ORDER BY first_ns, process_group, seq
    """, params=list(params or [])).pl()
