"""What a job report shows: the job's :class:`Analysis` plus its steps, collective lateness and link peak.

Pure: frames in, a :class:`JobReport` out. :meth:`Warehouse.job_report` reads the rows and
returns a :class:`JobReport`; ``tracelake report job`` and ``GET /api/v1/jobs/{job}/report``
render it as HTML.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import polars as pl

from . import collectives, fleet, nccl
from .assemble import Analysis


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
    #: Why the link's figure is unknown, when it is (docs/analyses.md, "Link peaks").
    link_note: str | None = None


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


def link_choice(traces: pl.DataFrame, topology: pl.DataFrame,
                link_peaks: dict[str, float]) -> tuple[str | None, float | None, str | None]:
    """The link a job's collectives cross, what it carries and why not when unknown.

    TPUs: ``ici``. GPUs: the rule of :func:`tracelake.analysis.nccl.choose_link` (docs/analyses.md,
    "Link peaks") over the job's nodes (NCCL's topology, else the traces' hosts), GPU model and the
    transports its NCCL logs show.
    """
    link = link_of(traces, topology)
    if link is None or link == "ici":
        return link, {**nccl.DEFAULT_LINK_PEAKS, **link_peaks}.get(link) if link else None, None
    if not topology.is_empty() and "nodes" in topology.columns:
        nodes = int(topology["nodes"].max() or 1)  # type: ignore[arg-type]
        transports = [t.strip() for row in topology["transports"].drop_nulls().to_list() for t in row.split(",")]
        nics = [n.strip() for row in topology["nics"].drop_nulls().to_list() for n in row.split(",")] \
            if "nics" in topology.columns else []
    else:
        nodes, transports, nics = max(traces["host"].drop_nulls().n_unique(), 1), [], []
    models = traces["device_name"].drop_nulls().unique().sort().to_list() if "device_name" in traces.columns else []
    return nccl.choose_link(nodes, models[0] if len(models) == 1 else None, transports, link_peaks, nics)


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
    link, peak, link_note = link_choice(traces, analysis.topology, link_peaks)
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
        link_peak_gbs=peak,
        generated_at=now or dt.datetime.now(dt.timezone.utc),
        link_note=link_note,
    )
