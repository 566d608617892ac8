"""Every analysis of one trace or job, computed together: what ``tracelake analyze`` shows.

The facade's :meth:`Warehouse.analyze` returns an :class:`Analysis`, whose frames
are polars DataFrames for notebooks; the CLI and the API only render it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import duckdb
import polars as pl

from tracelake.analysis import collectives, findings, kernels, launches, overview, steps


@dataclass
class Analysis:
    """The analyses of a selection of traces (one trace, or every trace of a job)."""

    breakdown: pl.DataFrame
    top_kernels: pl.DataFrame
    idle_by_stream: pl.DataFrame
    launches: pl.DataFrame
    queues: pl.DataFrame
    step_stats: pl.DataFrame
    step_outliers: pl.DataFrame
    collectives: pl.DataFrame
    last_arrivals: pl.DataFrame
    findings: list[findings.Finding] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """Everything as JSON-friendly lists of dicts."""
        frames = {
            name: getattr(self, name).to_dicts()
            for name in ("breakdown", "top_kernels", "idle_by_stream", "launches", "queues", "step_stats",
                         "step_outliers", "collectives", "last_arrivals")
        }
        return {"findings": [f.as_dict() for f in self.findings], **frames}


def _stored(con: duckdb.DuckDBPyConnection, table: str, where: str, params: list[Any], order: str) -> pl.DataFrame:
    return con.sql(f"SELECT * EXCLUDE (job) FROM {table} WHERE {where} ORDER BY {order}", params=params).pl()


def compute(
    con: duckdb.DuckDBPyConnection, whole: pl.DataFrame, *, where: str, params: list[Any], top: int = 8
) -> Analysis:
    """Run every analysis over the rows selected by ``where`` (a filter on ``job`` or ``trace_id``)."""
    device_where = f"d.{where}"
    arrivals = overview.last_arrivals(con, where, params)
    result = Analysis(
        breakdown=whole,
        top_kernels=kernels.top_kernels(con, where=where, params=params, top=top),
        # Stored at ingest (warehouse/derived.py): read, not recomputed.
        idle_by_stream=_stored(con, "stream_idle", where, params, "trace_id, rank, stream"),
        launches=_stored(con, "launch_stats", where, params, "trace_id, rank"),
        queues=launches.queue_lengths(con, where=device_where, params=params),
        step_stats=steps.step_stats(con, where=where, params=params),
        step_outliers=steps.step_outliers(con, where=where, params=params),
        collectives=collectives.instances(con, where=where, params=params),
        last_arrivals=arrivals,
    )
    result.findings = findings.rank(
        findings.from_breakdown(whole)
        + findings.from_last_arrivals(arrivals, ranks=whole.height, whole=whole)
        + findings.from_idle(result.idle_by_stream, whole)
        + findings.from_launches(result.launches)
        + findings.from_step_outliers(result.step_outliers)
    )
    return result
