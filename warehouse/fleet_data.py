"""The fleet's figures over a time window, read from the stored per-trace analyses.

:meth:`Warehouse.fleet` returns a :class:`~tracelake.analysis.fleet_view.Fleet`, assembled
by :func:`tracelake.analysis.fleet_view.compute` from what this module reads. Everything
comes from the in-memory registry of traces and the small per-trace files of the stored
``breakdown`` (and of ``devices``, ``collectives`` and, aggregated in the scan,
``memory_events`` where they matter), read straight
from the selected traces' Parquet files: no whole-warehouse view scan, which would read
the footer of every file of every table.
"""

from __future__ import annotations

import datetime as dt
import logging
import time

import polars as pl

from tracelake.analysis import fleet
from tracelake.analysis.fleet_view import Fleet, compute
from tracelake.contracts.moments import in_range

from .folder_cache import FolderCache
from .registry import select_traces
from .store import Store

log = logging.getLogger(__name__)

#: Week-over-week compares the 7 days up to the end of the window with the 7 before, so this much is read.
_HISTORY = dt.timedelta(days=14)
_BREAKDOWN_COLUMNS = [
    "trace_id", "rank", "step", "span_ns", "busy_ns", "idle_ns", "compute_ns", "communication_ns",
    "exposed_communication_ns", "flops", "flops_utilisation_pct", "mfu_pct",
]
_LIFECYCLE_COLUMNS = ["trace_id", "event", "seq", "at_ns", "dur_ns", "lost_since_ns", "resumed_ns", "steps",
                      "productive_ns"]
_COLLECTIVE_COLUMNS = ["trace_id", "rank", "process_group", "seq", "collective", "ts_ns", "dur_ns", "message_bytes"]


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
    those with a FLOPs utilisation (or memory events), the ``collectives`` rows of those with collectives
    and, per rank and device, the largest allocator totals of their ``memory_events`` (aggregated in the scan),
    and the ``job_lifecycle`` rows of the lifecycle files in the window (for goodput):
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
    memory = _memory_peaks(store, in_window)
    measured = in_window.filter(pl.col("trace_id").is_in(memory["trace_id"].unique().to_list()))
    capacity = _read(store, "devices", measured, ["trace_id", "rank", "device", "kind", "memory_bytes"])
    lifecycles = in_window.filter(pl.col("format") == "job_lifecycle")
    lifecycle = _read(store, "job_lifecycle", lifecycles, _LIFECYCLE_COLUMNS).join(
        lifecycles.select("trace_id", "job", "ingested_at"), on="trace_id", how="inner")
    result = compute(selected, breakdown, devices, collectives, since=since, until=until, labels=labels, now=now,
                     top=top, memory=memory, capacity=capacity, lifecycle=lifecycle)
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


def _memory_peaks(store: Store, traces: pl.DataFrame) -> pl.DataFrame:
    """Per (trace, rank, device) of ``traces``, the largest allocator totals of its ``memory_events``.

    Aggregated while scanning the files (only three columns of them are read), never loaded whole:
    a trace profiled with memory holds an event per allocation.
    """
    found = store.aggregate("memory_events", zip(traces["job"].to_list(), traces["trace_id"].to_list()), lambda scan: (
        scan.filter(pl.col("total_allocated").is_not_null() | pl.col("total_reserved").is_not_null())
        .group_by(pl.col("trace_id"), pl.col("rank").cast(pl.Int64), pl.col("device").cast(pl.Int64))
        .agg(pl.col("device_type").drop_nulls().first(),
             pl.col("total_allocated").max().cast(pl.Int64).alias("peak_allocated_bytes"),
             pl.col("total_reserved").max().cast(pl.Int64).alias("peak_reserved_bytes"))))
    if found is None:
        return pl.DataFrame(schema={"trace_id": pl.String, "rank": pl.Int64, "device": pl.Int64,
                                    "device_type": pl.String, "peak_allocated_bytes": pl.Int64,
                                    "peak_reserved_bytes": pl.Int64})
    return found


def _only(frame: pl.DataFrame, traces: pl.DataFrame) -> pl.DataFrame:
    """The rows of ``frame`` (with ``job``) that belong to ``traces`` (a trace's files may predate its registration)."""
    return frame.join(traces.select("trace_id", "job"), on=["trace_id", "job"], how="semi")


def _read(store: Store, table: str, traces: pl.DataFrame, columns: list[str],
          where: pl.Expr | None = None) -> pl.DataFrame:
    frame = store.read_frame(table, zip(traces["job"].to_list(), traces["trace_id"].to_list()), columns=columns)
    return frame.filter(where) if where is not None else frame
