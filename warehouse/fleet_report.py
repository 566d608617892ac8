"""The fleet's figures over a time window, read from the stored per-trace analyses.

:meth:`Warehouse.fleet` returns a :class:`Fleet`, whose frames are polars
DataFrames for notebooks; ``tracelake report fleet`` and ``GET /api/v1/reports/fleet``
render it. Everything comes from the in-memory registry of traces and the small
per-trace files of the stored ``breakdown`` (and of ``devices`` and ``collectives``
where they matter), read straight from the selected traces' Parquet files: no
whole-warehouse view scan, which would read the footer of every file of every table.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import time
from dataclasses import dataclass, fields
from typing import Any

import polars as pl

from tracelake.analysis import fleet
from tracelake.contracts.errors import InvalidArgument

from .folder_cache import FolderCache
from .registry import select_traces
from .store import Store

log = logging.getLogger(__name__)

#: Week-over-week compares the 7 days up to the end of the window with the 7 before, so this much is read.
_HISTORY = dt.timedelta(days=14)
_RELATIVE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(m|min|h|d|w)\s*$", re.IGNORECASE)
_UNITS = {"m": "minutes", "min": "minutes", "h": "hours", "d": "days", "w": "weeks"}
_BREAKDOWN_COLUMNS = [
    "trace_id", "rank", "step", "span_ns", "busy_ns", "idle_ns", "compute_ns", "communication_ns",
    "exposed_communication_ns", "flops", "flops_utilisation_pct",
]
_COLLECTIVE_COLUMNS = ["trace_id", "rank", "process_group", "seq", "collective", "ts_ns", "dur_ns", "message_bytes"]
#: The times a window may name: from the Unix epoch to the last day nanosecond timestamps (``ts_ns``) reach.
#: Outside it there is nothing to report, and date arithmetic (14 days of history) would overflow.
EARLIEST = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
LATEST = dt.datetime(2262, 4, 11, tzinfo=dt.UTC)


def parse_when(text: str, now: dt.datetime | None = None) -> dt.datetime:
    """A point in time from ``7d``, ``12h``, ``30m``, ``2w`` (that long before ``now``) or an ISO date/datetime.

    Dates and naive datetimes are UTC.

    Raises:
        InvalidArgument: neither form, or a time outside :data:`EARLIEST` to :data:`LATEST`.
    """
    now = now or dt.datetime.now(dt.timezone.utc)
    match = _RELATIVE.match(text)
    if match:
        amount, unit = float(match.group(1)), match.group(2).lower()
        try:
            return in_range(now - dt.timedelta(**{_UNITS[unit]: amount}), text)
        except OverflowError:
            raise InvalidArgument(f"invalid time {text!r}: too far back") from None
    try:
        moment = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise InvalidArgument(
            f"invalid time {text!r}: give a duration back from now (30m, 12h, 7d, 2w) or an ISO date "
            "(2026-12-01, 2026-12-01T06:00:00Z)") from None
    return in_range(moment if moment.tzinfo is not None else moment.replace(tzinfo=dt.timezone.utc), text)


def in_range(moment: dt.datetime, text: str | None = None) -> dt.datetime:
    """``moment`` (naive: UTC) if it lies in ``[EARLIEST, LATEST]``.

    Raises:
        InvalidArgument: it does not; the message quotes ``text`` (what the user wrote) where given.
    """
    moment = _utc(moment)
    if not EARLIEST <= moment <= LATEST:  # compares aware times without converting, which could overflow
        shown = repr(text) if text is not None else moment.isoformat()
        raise InvalidArgument(f"invalid time {shown}: out of range; give a time from {EARLIEST:%Y-%m-%d} to "
                              f"{LATEST:%Y-%m-%d} (UTC)")
    return moment


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
    #: One row: the 7 days up to ``now`` against the 7 before (label filter applied, not ``since``).
    week_over_week: pl.DataFrame
    #: The same per job.
    week_over_week_by_job: pl.DataFrame
    #: Ranks that made their job's other ranks wait longest at collectives.
    stragglers: pl.DataFrame
    #: The collective instances with the longest transfer time.
    slowest_collectives: pl.DataFrame
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
) -> Fleet:
    """Assemble a :class:`Fleet` from frames (the pure part of :func:`read`).

    ``traces`` are the registry rows of the selection, including the 14 days before
    ``now`` for week-over-week; ``breakdown`` and ``devices`` their stored rows;
    ``collectives`` the per-job summaries (:func:`tracelake.analysis.fleet.collective_summaries`)
    of the ``collectives`` rows of the traces in ``[since, until)``.
    """
    rows = fleet.device_rows(traces, breakdown, devices)
    window = rows.filter(pl.col("ingested_at") >= since) if since is not None else rows
    jobs = fleet.by_job(window)
    return Fleet(
        since=since, until=until, labels=dict(labels), now=now,
        totals=fleet.summarise(window),
        by_job=jobs,
        by_day=fleet.by_day(window),
        by_week=fleet.by_week(window),
        by_label=fleet.by_label(window),
        by_device=fleet.by_device(window),
        offenders=fleet.wasted_ranking(jobs, top),
        week_over_week=fleet.week_over_week(rows, now),
        week_over_week_by_job=fleet.week_over_week(rows, now, by=["job"]),
        stragglers=fleet.stragglers_of(collectives, top),
        slowest_collectives=fleet.slowest_of(collectives, top),
    )


class FleetRows:
    """The stored rows fleet figures need, of every trace, kept per job folder (:class:`FolderCache`).

    Both are small and also snapshotted under ``cache/``: the whole-trace ``breakdown``
    rows (one per trace and rank), and of the ``collectives`` rows (a trace can hold
    millions) only each job's summary: its stragglers and slowest collective instances
    (:func:`tracelake.analysis.fleet.collective_summaries`).
    """

    def __init__(self, store: Store) -> None:
        self.breakdown = FolderCache(store, "breakdown", columns=_BREAKDOWN_COLUMNS, where=pl.col("step").is_null(),
                                     name="fleet-breakdown")
        self.collectives = FolderCache(store, "collectives", columns=_COLLECTIVE_COLUMNS,
                                       summarise=fleet.collective_summaries, version=fleet.SUMMARY_VERSION,
                                       name="fleet-collectives")


def read(
    store: Store,
    registry: pl.DataFrame,
    *,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
    labels: dict[str, str] | None = None,
    now: dt.datetime | None = None,
    top: int = 10,
    rows: FleetRows | None = None,
) -> Fleet:
    """The :class:`Fleet` of the traces in ``registry`` with all ``labels``, ingested in ``[since, until)``.

    Uses the whole-trace ``breakdown`` rows of the selected traces, the ``devices`` rows of
    those with a FLOPs utilisation and the ``collectives`` rows of those with collectives:
    from ``rows`` (kept between calls) when given, else read from the selected traces' files.
    """
    started = time.perf_counter()
    until = in_range(until) if until is not None else None
    since = in_range(since) if since is not None else None
    now = until or in_range(now or dt.datetime.now(dt.timezone.utc))
    labels = labels or {}
    history = now - _HISTORY
    selected = select_traces(registry, labels=labels, since=min(since, history) if since else None, until=until)
    timed = selected.filter(pl.col("device_op_count").fill_null(0) > 0)
    if rows is not None:
        breakdown = _only(rows.breakdown.frame(set(timed["job"].to_list())), timed).drop("job")
    else:
        breakdown = _read(store, "breakdown", timed, _BREAKDOWN_COLUMNS, pl.col("step").is_null())
    with_flops = breakdown.filter(pl.col("flops_utilisation_pct").is_not_null())["trace_id"].unique()
    devices = _read(store, "devices", timed.filter(pl.col("trace_id").is_in(with_flops.to_list())),
                    ["trace_id", "rank", "peak_tflops"])
    in_window = selected.filter(pl.col("ingested_at") >= since) if since is not None else selected
    with_collectives = in_window.filter(pl.col("collective_count").fill_null(0) > 0)
    collectives = _collective_summaries(store, with_collectives, rows)
    result = compute(selected, breakdown, devices, collectives, since=since, until=until, labels=labels, now=now,
                     top=top)
    result.seconds = time.perf_counter() - started
    log.debug("fleet of %d traces in %.3f s", selected.height, result.seconds)
    return result


def _collective_summaries(store: Store, traces: pl.DataFrame, rows: FleetRows | None) -> pl.DataFrame:
    """Per job, the summary of the ``collectives`` rows of ``traces`` (kept ones where they summarise exactly those).

    A kept summary covers every trace of its job folder; a job with only some traces in
    the window (or with files of a trace not registered yet) is summarised from its rows.
    """
    wanted = traces.group_by("job").agg(pl.col("trace_id").unique().sort().alias("wanted"))
    if rows is not None and wanted.height:
        kept = rows.collectives.frame(set(wanted["job"].to_list())).join(wanted, on="job", how="inner")
        exact = kept.filter(pl.col("trace_ids") == pl.col("wanted"))
        summaries = exact.drop("wanted")
        rest = traces.join(exact.select("job"), on="job", how="anti")
    else:
        summaries = None
        rest = traces
    if summaries is not None and not rest.height:
        return summaries
    read = _read(store, "collectives", rest, _COLLECTIVE_COLUMNS).join(rest.select("trace_id", "job"),
                                                                        on="trace_id", how="inner")
    made = fleet.collective_summaries(read)
    return pl.concat([summaries, made], how="vertical") if summaries is not None and summaries.height else made


def _only(frame: pl.DataFrame, traces: pl.DataFrame) -> pl.DataFrame:
    """The rows of ``frame`` (with ``job``) that belong to ``traces`` (a trace's files may predate its registration)."""
    return frame.join(traces.select("trace_id", "job"), on=["trace_id", "job"], how="semi")


def _read(store: Store, table: str, traces: pl.DataFrame, columns: list[str],
          where: pl.Expr | None = None) -> pl.DataFrame:
    frame = store.read_frame(table, zip(traces["job"].to_list(), traces["trace_id"].to_list()), columns=columns)
    return frame.filter(where) if where is not None else frame


def _utc(moment: dt.datetime) -> dt.datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=dt.timezone.utc)
