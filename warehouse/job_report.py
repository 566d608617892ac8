"""What a job report shows: the job's :class:`Analysis` plus its steps, collective lateness and link peak.

:meth:`Warehouse.job_report` returns a :class:`JobReport`; ``tracelake report job`` and
``GET /api/v1/jobs/{job}/report`` render it as HTML.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import polars as pl

from tracelake.analysis import collectives, fleet, nccl

from .analysis_report import Analysis


@dataclass
class JobReport:
    """Everything a job report draws, as frames."""

    job: str
    #: The job's ``traces`` registry rows.
    traces: pl.DataFrame
    analysis: Analysis
    #: One row: the job's device-hours, utilisation and waste, as the fleet report counts them.
    summary: pl.DataFrame
    #: Stored ``breakdown`` rows of every step (``step`` not null), by rank and step.
    steps: pl.DataFrame
    #: How late each rank started each collective instance (:func:`tracelake.analysis.collectives.lateness`).
    lateness: pl.DataFrame
    #: The link the job's collectives run over (``nvlink``, ``ib``, ``ici``), when it can be told.
    link: str | None
    #: What that link carries at best, GB/s of bus bandwidth (``TRACELAKE_LINK_PEAKS``), when known.
    link_peak_gbs: float | None
    generated_at: dt.datetime


def link_of(traces: pl.DataFrame, topology: pl.DataFrame) -> str | None:
    """The link a job's collectives cross: ``ici`` on TPUs, ``ib`` across hosts, else ``nvlink``; None without devices.

    The hosts come from NCCL's topology (debug logs) when the job has it, else from the traces' ``host``.
    """
    types = set(traces["device_type"].drop_nulls().to_list()) if "device_type" in traces.columns else set()
    if "tpu" in types:
        return "ici"
    if not topology.is_empty() and "nodes" in topology.columns:
        return "ib" if (topology["nodes"].max() or 1) > 1 else "nvlink"  # type: ignore[operator]
    if not types & {"cuda", "rocm"}:
        return None
    return "ib" if traces["host"].drop_nulls().n_unique() > 1 else "nvlink"


def _run_of(runs: pl.DataFrame) -> pl.DataFrame:
    """``run``, ``trace_id`` per trace from an analysis' ``runs`` summary (docs/analyses.md, "Runs within a job")."""
    if runs.is_empty() or "trace_ids" not in runs.columns:
        return pl.DataFrame(schema={"run": pl.String, "trace_id": pl.String})
    return runs.select("run", "trace_ids").explode("trace_ids").rename({"trace_ids": "trace_id"})


def compute(
    job: str,
    traces: pl.DataFrame,
    analysis: Analysis,
    breakdown: pl.DataFrame,
    collective_rows: pl.DataFrame,
    link_peaks: dict[str, float],
    now: dt.datetime | None = None,
) -> JobReport:
    """Assemble a :class:`JobReport` from a job's analysis and its stored ``breakdown`` and ``collectives`` rows."""
    link = link_of(traces, analysis.topology)
    steps = breakdown.filter(pl.col("step").is_not_null()).sort("rank", "step", "trace_id")
    runs = _run_of(analysis.runs)
    if runs.height > 1 and runs["run"].n_unique() > 1:  # several runs: never line up ranks across them
        steps = runs.join(steps, on="trace_id", how="inner").sort("run", "rank", "step", "trace_id")
        lateness = pl.concat([
            collectives.lateness(collective_rows.filter(pl.col("trace_id").is_in(ids["trace_id"].implode())))
            .select(pl.lit(run, dtype=pl.String).alias("run"), pl.all())
            for (run,), ids in runs.group_by("run", maintain_order=True)
        ], how="diagonal_relaxed")
    else:
        lateness = collectives.lateness(collective_rows)
    return JobReport(
        job=job,
        traces=traces,
        analysis=analysis,
        summary=fleet.summarise(fleet.device_rows(traces, breakdown)),
        steps=steps,
        lateness=lateness,
        link=link,
        link_peak_gbs={**nccl.DEFAULT_LINK_PEAKS, **link_peaks}.get(link) if link is not None else None,
        generated_at=now or dt.datetime.now(dt.timezone.utc),
    )
