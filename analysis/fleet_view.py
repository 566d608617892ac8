"""The fleet report's view-model: a :class:`Fleet` assembled from frames (the window it may cover is
:mod:`tracelake.contracts.moments`).

Pure: frames in, a :class:`Fleet` out (the figures are :mod:`tracelake.analysis.fleet`'s).
:meth:`Warehouse.fleet` reads the rows (:mod:`tracelake.warehouse.fleet_data`) and returns a
:class:`Fleet`, whose frames are polars DataFrames for notebooks; ``tracelake report fleet``
and ``GET /api/v1/reports/fleet`` render it.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, fields
from typing import Any

import polars as pl

from . import fleet, goodput

@dataclass
class Fleet:
    """The fleet's device-hours, utilisation and waste over ``[since, until)`` (by ingest time)."""

    since: dt.datetime | None
    until: dt.datetime | None
    #: The labels every trace in it carries (the ``--label`` filter).
    labels: dict[str, str]
    #: Reference time of the week-over-week comparison (``until``, else when it was computed).
    now: dt.datetime
    #: One row: the whole selection (:data:`tracelake.analysis.fleet.SUMMARY_COLUMNS`).
    totals: pl.DataFrame
    by_job: pl.DataFrame
    by_day: pl.DataFrame
    by_week: pl.DataFrame
    #: Per label key and value (``label_key``, ``label_value``).
    by_label: pl.DataFrame
    #: Per accelerator model.
    by_device: pl.DataFrame
    #: Jobs ranked by wasted device-hours (idle + exposed communication), the worst ``top``.
    offenders: pl.DataFrame
    #: Jobs ranked by useful work lost (device-hours x (1 - MFU)), the worst ``top``; jobs without an MFU last.
    lost_work: pl.DataFrame
    #: One row: the 7 days up to ``now`` against the 7 before (label filter applied, not ``since``).
    week_over_week: pl.DataFrame
    #: The same per job.
    week_over_week_by_job: pl.DataFrame
    #: Ranks that made their job's other ranks wait longest at collectives.
    stragglers: pl.DataFrame
    #: The collective instances with the longest transfer time.
    slowest_collectives: pl.DataFrame
    #: Per job with memory data in the window, its peak device memory and headroom
    #: (:data:`tracelake.analysis.fleet.MEMORY_COLUMNS`).
    memory: pl.DataFrame
    #: Per job with a lifecycle file in the window, its goodput, factors and badput
    #: (:data:`tracelake.analysis.goodput.COLUMNS`).
    goodput: pl.DataFrame
    #: Seconds it took to read and compute.
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """Everything as JSON-friendly values (frames as lists of dicts)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, pl.DataFrame):
                value = value.to_dicts()
            out[f.name] = value
        return out


def compute(
    traces: pl.DataFrame,
    breakdown: pl.DataFrame,
    devices: pl.DataFrame | None,
    collectives: pl.DataFrame,
    *,
    since: dt.datetime | None,
    until: dt.datetime | None,
    labels: dict[str, str],
    now: dt.datetime,
    top: int = 10,
    memory: pl.DataFrame | None = None,
    capacity: pl.DataFrame | None = None,
    lifecycle: pl.DataFrame | None = None,
) -> Fleet:
    """Assemble a :class:`Fleet` from frames (the pure part of :func:`tracelake.warehouse.fleet_data.read`).

    ``traces`` are the registry rows of the selection, including the 14 days before
    ``now`` for week-over-week; ``breakdown`` and ``devices`` their stored rows;
    ``collectives`` the per-job summaries (:func:`tracelake.analysis.fleet.collective_summaries`)
    of the ``collectives`` rows of the traces in ``[since, until)``; ``memory`` the per-device peaks
    of their ``memory_events`` and ``capacity`` their ``devices`` rows
    (:func:`tracelake.analysis.fleet.memory_headroom`); ``lifecycle`` the ``job_lifecycle`` rows of the
    lifecycle files in ``[since, until)`` with their trace's ``job`` and ``ingested_at``
    (:func:`tracelake.analysis.goodput.per_job`, program goodput from the job's useful share).
    """
    rows = fleet.device_rows(traces, breakdown, devices)
    window = rows.filter(pl.col("ingested_at") >= since) if since is not None else rows
    jobs = fleet.by_job(window)
    in_window = traces.filter(pl.col("ingested_at") >= since) if since is not None else traces
    peaks = memory if memory is not None else pl.DataFrame(
        schema={"trace_id": pl.String, "rank": pl.Int64, "device": pl.Int64, "peak_allocated_bytes": pl.Int64,
                "peak_reserved_bytes": pl.Int64})
    return Fleet(
        since=since, until=until, labels=dict(labels), now=now,
        totals=fleet.summarise(window),
        by_job=jobs,
        by_day=fleet.by_day(window),
        by_week=fleet.by_week(window),
        by_label=fleet.by_label(window),
        by_device=fleet.by_device(window),
        offenders=fleet.wasted_ranking(jobs, top),
        lost_work=fleet.lost_ranking(jobs, top),
        week_over_week=fleet.week_over_week(rows, now),
        week_over_week_by_job=fleet.week_over_week(rows, now, by=["job"]),
        stragglers=fleet.stragglers_of(collectives, top),
        slowest_collectives=fleet.slowest_of(collectives, top),
        memory=fleet.memory_headroom(peaks, capacity, in_window),
        goodput=goodput.per_job(lifecycle if lifecycle is not None else pl.DataFrame(),
                                jobs.select("job", pl.col("useful_pct").alias("mfu_pct"))),
    )
