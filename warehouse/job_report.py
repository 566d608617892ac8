"""What a job report shows: the job's :class:`Analysis` plus its steps, collective lateness and link peak.

:meth:`Warehouse.job_report` returns a :class:`JobReport`; ``tracelake report job`` and
``GET /api/v1/jobs/{job}/report`` render it as HTML.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import polars as pl

from tracelake.analysis import collectives, fleet

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
    return JobReport(
        job=job,
        traces=traces,
        analysis=analysis,
        summary=fleet.summarise(fleet.device_rows(traces, breakdown)),
        steps=breakdown.filter(pl.col("step").is_not_null()).sort("rank", "step", "trace_id"),
        lateness=collectives.lateness(collective_rows),
        link=link,
        link_peak_gbs=link_peaks.get(link) if link is not None else None,
        generated_at=now or dt.datetime.now(dt.timezone.utc),
    )
