"""Fleet figures: where the device-hours of many jobs go (docs/analyses.md, "Fleet").

Pure functions over polars frames: rows of the ``traces`` registry (``trace_id``,
``job``, ``labels``, ``ingested_at``, ``device_name``), the whole-trace rows of the
stored ``breakdown`` table and, for the slowest collectives and the stragglers,
``collectives`` rows with their ``job``. No file is read here.

Decisions (docs/analyses.md, "Fleet"):

- One whole-trace ``breakdown`` row is one device over its trace's span: a Kineto
  trace holds one rank (one GPU), an XLA profile one row per chip. Device-hours
  traced are the sum of those rows' ``span_ns`` (span x devices); busy, compute,
  communication, exposed-communication and idle device-hours the sums of the same
  rows' figures. Traces without device ops (NCCL logs, nccl-tests) add nothing.
- utilisation = compute / span; wasted = idle + exposed communication.
- A trace counts on the UTC day (and Monday-started week) it was ingested: the
  traces' own clocks are not epochs in every format, and ``--since`` selects on
  the same column, so a trace is counted in the window the listings show it in.
- Achieved FLOP/s is per device: FLOPs / device-seconds of the rows whose FLOPs are
  known; MFU = FLOPs / (peak FLOP/s x span) over the rows where both are known.
- Useful device-hours = device-hours x MFU (``breakdown.mfu_pct``, model FLOPs) per device,
  at most its busy time (an MFU above the busy share means an estimate or peak is off); null,
  not 0, where no device of a group has an MFU. Useful work lost = device-hours x (1 - MFU)
  over the same devices, so useful <= busy <= device-hours always.
- Memory headroom per job (:func:`memory_headroom`): peaks are the largest allocator
  totals over the job's accelerator devices; headroom the smallest share of a device's
  capacity its peak reserved leaves free.
"""

from __future__ import annotations

import datetime as dt
from typing import Any
from collections.abc import Sequence

import polars as pl

from . import collectives as collectives_analysis
from .findings import MIN_SKEW_NS
from .memory_findings import LOW_HEADROOM_PCT

NS_PER_HOUR = 3.6e12
#: The per-device time figures summed by :func:`summarise` (``<name>_ns`` in, ``<name>_hours`` out).
METRICS = ("span", "busy", "compute", "communication", "exposed_communication", "idle", "wasted")
DEVICE_COLUMNS = (
    "trace_id", "job", "rank", "labels", "ingested_at", "day", "device_name",
    *(f"{m}_ns" for m in METRICS), "flops", "peak_flops", "mfu_pct", "useful_ns",
)
SUMMARY_COLUMNS = (
    "traces", "devices", "device_hours", "busy_hours", "compute_hours", "communication_hours",
    "exposed_communication_hours", "idle_hours", "wasted_hours", "utilisation_pct", "busy_pct", "wasted_pct",
    "achieved_tflops", "mfu_pct", "flops_coverage_pct", "useful_hours", "useful_lost_hours", "useful_pct",
    "useful_coverage_pct",
)
_WEEK = dt.timedelta(days=7)


def _entries(labels: pl.Expr, dtype: pl.DataType) -> pl.Expr:
    """Labels as a list of ``{key, value}`` structs, whether stored as a map or already as entries."""
    if isinstance(dtype, pl.List):
        return labels
    return labels.map.entries()


def label_value(key: str) -> pl.Expr:
    """The value of label ``key`` of each row of a :func:`device_rows` frame (null where it has none)."""
    return (
        pl.col("labels")
        .list.eval(pl.element().filter(pl.element().struct.field("key") == key).struct.field("value"))
        .list.first()
    )


def label_keys(rows: pl.DataFrame) -> list[str]:
    """Every label key used by the rows of a :func:`device_rows` frame, sorted."""
    if rows.is_empty():
        return []
    keys = rows.select(pl.col("labels").list.eval(pl.element().struct.field("key")).explode().drop_nulls().unique())
    return sorted(keys.to_series().to_list())


def device_rows(traces: pl.DataFrame, breakdown: pl.DataFrame, devices: pl.DataFrame | None = None) -> pl.DataFrame:
    """One row per device timeline (trace and rank) with its job, labels, ingest day and time figures.

    Args:
        traces: ``traces`` registry rows with ``job`` (labels as a map or as key/value entries).
        breakdown: stored ``breakdown`` rows; only the whole-trace ones (``step`` null) are used.
        devices: ``devices`` rows (``trace_id``, ``rank``, ``peak_tflops``) giving each rank's peak;
            where absent, the peak is derived from ``flops_utilisation_pct`` when that is positive.

    Returns:
        The columns of :data:`DEVICE_COLUMNS`; ``labels`` as a list of ``{key, value}`` structs,
        ``peak_flops`` in FLOP/s (null where unknown).
    """
    whole = breakdown.filter(pl.col("step").is_null()) if "step" in breakdown.columns else breakdown
    meta = traces.select(
        "trace_id", "job", _entries(pl.col("labels"), traces.schema["labels"]).alias("labels"),
        "ingested_at", "device_name",
    )
    rows = whole.join(meta, on="trace_id", how="inner")
    span_s = pl.col("span_ns") / 1e9
    derived = pl.when((pl.col("flops_utilisation_pct") > 0) & (pl.col("span_ns") > 0)).then(
        pl.col("flops") / (pl.col("flops_utilisation_pct") / 100 * span_s))
    if devices is not None and not devices.is_empty():
        peaks = devices.group_by("trace_id", "rank").agg((pl.col("peak_tflops").max() * 1e12).alias("device_peak"))
        rows = rows.join(peaks, on=["trace_id", "rank"], how="left")
        peak = pl.coalesce(pl.col("device_peak"), derived)
    else:
        peak = derived
    mfu = (pl.col("mfu_pct") if "mfu_pct" in rows.columns else pl.lit(None)).cast(pl.Float64)
    useful = pl.min_horizontal(pl.max_horizontal(pl.col("span_ns") * pl.col("mfu_pct") / 100, 0), pl.col("busy_ns"))
    return rows.with_columns(
        pl.col("ingested_at").dt.date().alias("day"),
        (pl.col("idle_ns") + pl.col("exposed_communication_ns")).alias("wasted_ns"),
        peak.cast(pl.Float64).alias("peak_flops"),
        mfu.alias("mfu_pct"),
    ).with_columns(
        pl.when(pl.col("mfu_pct").is_not_null()).then(useful).cast(pl.Float64).alias("useful_ns"),
    ).select(DEVICE_COLUMNS)


def _aggregations() -> list[pl.Expr]:
    flops_known = pl.col("flops").is_not_null()
    both_known = flops_known & pl.col("peak_flops").is_not_null()
    return [
        pl.col("trace_id").n_unique().cast(pl.Int64).alias("traces"),
        pl.len().cast(pl.Int64).alias("devices"),
        *(pl.col(f"{m}_ns").sum().cast(pl.Int64) for m in METRICS),
        pl.col("flops").filter(flops_known).sum().alias("_flops"),
        pl.col("span_ns").filter(flops_known).sum().alias("_flops_span_ns"),
        pl.col("flops").filter(both_known).sum().alias("_peak_flops_done"),
        (pl.col("peak_flops") * pl.col("span_ns") / 1e9).filter(both_known).sum().alias("_peak_flops_possible"),
        pl.col("useful_ns").count().alias("_useful_devices"),
        pl.col("useful_ns").sum().alias("_useful_ns"),
        pl.col("span_ns").filter(pl.col("useful_ns").is_not_null()).sum().cast(pl.Float64).alias("_useful_span_ns"),
    ]


def _derive(sums: pl.DataFrame) -> pl.DataFrame:
    span = pl.col("span_ns")

    def pct(numerator: str, denominator: pl.Expr = span) -> pl.Expr:
        return pl.when(denominator > 0).then(100 * pl.col(numerator) / denominator).cast(pl.Float64)

    return sums.with_columns(
        *((pl.col(f"{m}_ns") / NS_PER_HOUR).alias("device_hours" if m == "span" else f"{m}_hours") for m in METRICS),
        pct("compute_ns").alias("utilisation_pct"),
        pct("busy_ns").alias("busy_pct"),
        pct("wasted_ns").alias("wasted_pct"),
        pl.when(pl.col("_flops_span_ns") > 0).then(pl.col("_flops") / (pl.col("_flops_span_ns") / 1e9) / 1e12)
        .cast(pl.Float64).alias("achieved_tflops"),
        pct("_peak_flops_done", pl.col("_peak_flops_possible")).alias("mfu_pct"),
        pct("_flops_span_ns").alias("flops_coverage_pct"),
        pl.when(pl.col("_useful_devices") > 0).then(pl.col("_useful_ns") / NS_PER_HOUR).alias("useful_hours"),
        pl.when(pl.col("_useful_devices") > 0).then((pl.col("_useful_span_ns") - pl.col("_useful_ns")) / NS_PER_HOUR)
        .alias("useful_lost_hours"),
        pct("_useful_ns", pl.col("_useful_span_ns")).alias("useful_pct"),
        pct("_useful_span_ns").alias("useful_coverage_pct"),
    )


def summarise(rows: pl.DataFrame, by: Sequence[str] = ()) -> pl.DataFrame:
    """Device-hours, utilisation and FLOP figures of :func:`device_rows` rows, per value of ``by``.

    Without ``by``, one row for everything (zeros for no rows). Columns: ``by``, then
    :data:`SUMMARY_COLUMNS`: hours are device-hours, ``*_pct`` shares of the device-hours
    traced, ``achieved_tflops`` per device, ``mfu_pct`` against the devices' peak,
    ``flops_coverage_pct`` the share of device-hours whose FLOPs are known.
    """
    sums = rows.group_by(*by).agg(_aggregations()) if by else rows.select(_aggregations())
    return _derive(sums).select(*by, *SUMMARY_COLUMNS)


def by_job(rows: pl.DataFrame) -> pl.DataFrame:
    """:func:`summarise` per job, by job name, with its ranks, accelerator, labels (those of its latest
    trace) and when it was first and last ingested."""
    extra = rows.group_by("job").agg(
        pl.col("rank").n_unique().cast(pl.Int64).alias("ranks"),
        pl.col("labels").sort_by("ingested_at").last().alias("labels"),
        pl.col("device_name").drop_nulls().mode().first().alias("device_name"),
        pl.col("ingested_at").min().alias("first_ingested_at"),
        pl.col("ingested_at").max().alias("last_ingested_at"),
    )
    return summarise(rows, ["job"]).join(extra, on="job", how="left").sort("job")


def by_day(rows: pl.DataFrame) -> pl.DataFrame:
    """:func:`summarise` per UTC day of ingest, oldest first: the utilisation trend."""
    return summarise(rows, ["day"]).sort("day")


def by_week(rows: pl.DataFrame) -> pl.DataFrame:
    """:func:`summarise` per week of ingest (``week`` = its Monday), oldest first."""
    weekly = rows.with_columns(pl.col("day").dt.truncate("1w").alias("week"))
    return summarise(weekly, ["week"]).sort("week")


def by_label(rows: pl.DataFrame, keys: Sequence[str] | None = None) -> pl.DataFrame:
    """:func:`summarise` per label value, for each label key (default: every key in ``rows``).

    Columns ``label_key``, ``label_value`` (null: the rows without that label), then
    :data:`SUMMARY_COLUMNS`; by key, then most wasted device-hours first.
    """
    frames = [
        summarise(rows.with_columns(pl.lit(key, pl.String).alias("label_key"), label_value(key).alias("label_value")),
                  ["label_key", "label_value"])
        for key in (label_keys(rows) if keys is None else keys)
    ]
    if not frames:
        return summarise(rows.head(0).with_columns(pl.lit(None, pl.String).alias("label_key"),
                                                   pl.lit(None, pl.String).alias("label_value")),
                         ["label_key", "label_value"])
    return pl.concat(frames).sort(["label_key", "wasted_hours", "label_value"], descending=[False, True, False],
                                  nulls_last=True)


def by_device(rows: pl.DataFrame) -> pl.DataFrame:
    """:func:`summarise` per accelerator model (the traces' ``device_name``), most device-hours first."""
    return summarise(rows, ["device_name"]).sort(["device_hours", "device_name"], descending=[True, False])


def wasted_ranking(jobs: pl.DataFrame, top: int | None = None) -> pl.DataFrame:
    """Jobs (rows of :func:`by_job`) ranked by wasted device-hours (idle + exposed communication), ``top`` first."""
    ranked = jobs.filter(pl.col("devices") > 0).sort(["wasted_hours", "job"], descending=[True, False])
    return ranked if top is None else ranked.head(top)


def lost_ranking(jobs: pl.DataFrame, top: int | None = None) -> pl.DataFrame:
    """Jobs (rows of :func:`by_job`) ranked by useful work lost (device-hours x (1 - MFU)), ``top`` first;
    jobs without an MFU last."""
    ranked = jobs.filter(pl.col("devices") > 0).sort(["useful_lost_hours", "job"], descending=[True, False],
                                                     nulls_last=True)
    return ranked if top is None else ranked.head(top)


def week_over_week(rows: pl.DataFrame, now: dt.datetime, by: Sequence[str] = ()) -> pl.DataFrame:
    """This week (the 7 days up to ``now``) against the 7 days before, per value of ``by``.

    Columns: ``by``, then for ``device_hours``, ``utilisation_pct``, ``wasted_hours``,
    ``wasted_pct``, ``useful_hours`` and ``useful_lost_hours`` this week's figure,
    ``previous_<figure>`` and the change: ``*_change_pct``
    for hours (null when the previous week had none), ``*_change_points`` for shares.
    Without ``by``, one row. A naive ``now`` is taken as UTC.
    """
    now = now if now.tzinfo is not None else now.replace(tzinfo=dt.timezone.utc)
    at = pl.col("ingested_at")
    figures = ["device_hours", "utilisation_pct", "wasted_hours", "wasted_pct", "useful_hours", "useful_lost_hours"]
    this = summarise(rows.filter((at >= now - _WEEK) & (at < now)), by).select(*by, *figures,
                                                                                pl.col("devices").alias("_this"))
    before = summarise(rows.filter((at >= now - 2 * _WEEK) & (at < now - _WEEK)), by).select(
        *by, *(pl.col(f).alias(f"previous_{f}") for f in figures), pl.col("devices").alias("_before"))
    joined = this.join(before, on=list(by), how="full", coalesce=True) if by else pl.concat([this, before],
                                                                                             how="horizontal")
    if by:  # a group with no device in a week had 0 hours then (useful ones stay null only for want of an MFU)
        hours = [f for f in figures if f.endswith("_hours")]
        joined = joined.with_columns(
            *(pl.when(pl.col("_this").is_null()).then(0.0).otherwise(pl.col(h)).alias(h) for h in hours),
            *(pl.when(pl.col("_before").is_null()).then(0.0).otherwise(pl.col(f"previous_{h}")).alias(f"previous_{h}")
              for h in hours))

    def change_pct(name: str) -> pl.Expr:
        previous = pl.col(f"previous_{name}")
        return pl.when(previous > 0).then(100 * (pl.col(name) - previous) / previous).alias(f"{name}_change_pct")

    def change_points(name: str) -> pl.Expr:
        return (pl.col(name) - pl.col(f"previous_{name}")).alias(f"{name.removesuffix('_pct')}_change_points")

    result = joined.with_columns(
        change_pct("device_hours"), change_points("utilisation_pct"), change_pct("wasted_hours"),
        change_points("wasted_pct"), change_pct("useful_hours"), change_pct("useful_lost_hours"),
    )
    ordered = [*by]
    for f in figures:
        ordered += [f, f"previous_{f}", f"{f}_change_pct" if f.endswith("_hours")
                    else f"{f.removesuffix('_pct')}_change_points"]
    result = result.select(ordered)
    return result.sort(by) if by else result


#: The most slowest collective instances a job's summary keeps (and so the most a fleet view can list).
SUMMARY_TOP = 100
#: Changes whenever :func:`collective_summaries` changes what it keeps (kept summaries are then made again).
SUMMARY_VERSION = 1
_STRAGGLER_COLUMNS = ("rank", "ranks", "times_last", "collectives", "share_last_pct", "mean_skew_us", "waited_ns")
_STRAGGLER_ORDER: dict[str, Any] = {"by": ["waited_ns", "job", "rank"], "descending": [True, False, False]}
_SLOWEST_ORDER: dict[str, Any] = {"by": ["transfer_ns", "first_ns", "job", "process_group", "seq"],
                                  "descending": [True, False, False, False, False]}


def collective_summaries(collectives: pl.DataFrame) -> pl.DataFrame:
    """Per job, what the fleet's stragglers and slowest collectives need of its ``collectives`` rows.

    One row per job (``collectives`` rows carry ``job``): ``trace_ids`` (the traces
    summarised, sorted), ``stragglers`` (every straggler of the job, as :func:`stragglers`
    defines them) and ``slowest`` (its :data:`SUMMARY_TOP` slowest instances). Jobs are
    independent, so summaries made at different times combine (:func:`stragglers_of`,
    :func:`slowest_of`) into exactly what the rows of all of them together give; a fleet
    keeps these instead of every collective of every trace.
    """
    timed = collectives.filter(pl.col("seq").is_not_null() & pl.col("ts_ns").is_not_null())
    arrivals = collectives_analysis.last_arrivals(timed, by=("job",))
    ranks = timed.group_by("job").agg(pl.col("rank").n_unique().cast(pl.Int64).alias("ranks"))
    late = (
        arrivals.join(ranks, on="job", how="left")
        .with_columns(
            (100 * pl.col("times_last") / pl.col("collectives")).alias("share_last_pct"),
            (pl.col("times_last") * pl.col("mean_skew_us") * 1e3).round(0).cast(pl.Int64).alias("waited_ns"),
        )
        .filter((pl.col("ranks") > 1) & (pl.col("share_last_pct") > 100 / pl.col("ranks"))
                & (pl.col("mean_skew_us") * 1e3 >= MIN_SKEW_NS))
        .group_by("job").agg(pl.struct(*_STRAGGLER_COLUMNS).alias("stragglers"))
    )
    slow = (
        collectives_analysis.instances(collectives, by=("job",))
        .filter(pl.col("transfer_ns").is_not_null())
        .sort(**_SLOWEST_ORDER)
        .group_by("job", maintain_order=True).head(SUMMARY_TOP)
        .group_by("job").agg(pl.struct(*collectives_analysis.COLUMNS).alias("slowest"))
    )
    traces = pl.col("trace_id") if "trace_id" in collectives.columns else pl.lit(None, pl.String)
    jobs = collectives.group_by("job").agg(traces.unique().drop_nulls().sort().alias("trace_ids"))
    return (jobs.join(late, on="job", how="left").join(slow, on="job", how="left")
            .select("job", "trace_ids", "stragglers", "slowest").sort("job"))


def stragglers_of(summaries: pl.DataFrame, top: int = 10) -> pl.DataFrame:
    """The ``top`` stragglers of the jobs in ``summaries`` (:func:`collective_summaries`), worst first."""
    rows = summaries.select("job", "stragglers").explode("stragglers").drop_nulls("stragglers").unnest("stragglers")
    return rows.sort(**_STRAGGLER_ORDER).head(top).select("job", *_STRAGGLER_COLUMNS)


def slowest_of(summaries: pl.DataFrame, top: int = 10) -> pl.DataFrame:
    """The ``top`` (at most :data:`SUMMARY_TOP`) slowest collective instances of the jobs in ``summaries``."""
    rows = summaries.select("job", "slowest").explode("slowest").drop_nulls("slowest").unnest("slowest")
    return rows.sort(**_SLOWEST_ORDER).head(min(top, SUMMARY_TOP)).select("job", *collectives_analysis.COLUMNS)


def stragglers(collectives: pl.DataFrame, top: int = 10) -> pl.DataFrame:
    """The ranks across the fleet that made the others wait longest at collectives.

    From ``collectives`` rows with ``job``: per job, the ranks that start collective
    instances (process group, seq) last more often than chance (1/n of them) and at
    least :data:`~tracelake.analysis.findings.MIN_SKEW_NS` late on average, ranked by
    the time the other ranks waited for them (``waited_ns``: the arrival skew summed
    over the instances the rank was last at). Columns: ``job``, ``rank``, ``ranks``,
    ``times_last``, ``collectives``, ``share_last_pct``, ``mean_skew_us``, ``waited_ns``.
    """
    return stragglers_of(collective_summaries(collectives), top)


def slowest_collectives(collectives: pl.DataFrame, top: int = 10) -> pl.DataFrame:
    """The collective instances across the fleet with the longest transfer time, with their job.

    Columns: ``job`` and :data:`~tracelake.analysis.collectives.COLUMNS` (transfer time =
    the shortest duration over ranks; bus bandwidth from it); ties go to the earliest.
    At most :data:`SUMMARY_TOP`.
    """
    return slowest_of(collective_summaries(collectives), top)


#: Headroom under this share of capacity: the job runs at the edge of its device memory (as the job finding).
EDGE_HEADROOM_PCT = LOW_HEADROOM_PCT
#: Headroom over this share on every device: the job could take a larger batch (or fewer devices).
ROOM_HEADROOM_PCT = 50.0
MEMORY_COLUMNS = ("job", "ranks", "devices", "peak_allocated_bytes", "peak_reserved_bytes", "capacity_bytes",
                  "headroom_bytes", "headroom_pct", "verdict")


def memory_headroom(device_peaks: pl.DataFrame, capacity: pl.DataFrame | None, traces: pl.DataFrame) -> pl.DataFrame:
    """Per job, its peak device memory and the headroom its tightest device leaves (:data:`MEMORY_COLUMNS`).

    Args:
        device_peaks: per (``trace_id``, ``rank``, ``device``) the largest ``total_allocated`` and
            ``total_reserved`` of its ``memory_events`` (``peak_allocated_bytes``, ``peak_reserved_bytes``);
            the CPU (device -1, or ``device_type`` ``cpu``) is left out.
        capacity: ``devices`` rows (``trace_id``, ``rank``, ``device``, ``kind``, ``memory_bytes``).
        traces: registry rows (``trace_id``, ``job``) of the traces to count.

    Returns:
        One row per job with memory data, by job: ``ranks`` and ``devices`` measured, the largest peaks
        over them, ``capacity_bytes`` (the largest device's), ``headroom_bytes`` and ``headroom_pct``
        (the smallest over the devices with a known capacity: (capacity - peak reserved) / capacity,
        clamped to [0, 100]%; null where no capacity is known) and ``verdict``: ``edge`` under
        :data:`EDGE_HEADROOM_PCT`, ``room`` over :data:`ROOM_HEADROOM_PCT`, else null.
    """
    key = ["trace_id", "rank", "device"]
    peaks = device_peaks
    if "device_type" in peaks.columns:
        peaks = peaks.filter(pl.col("device_type").is_null() | (pl.col("device_type") != "cpu"))
    peaks = (peaks.filter(pl.col("device") >= 0).with_columns(pl.col("rank").cast(pl.Int64),
                                                              pl.col("device").cast(pl.Int64))
             .join(traces.select("trace_id", "job"), on="trace_id", how="inner"))
    caps = pl.DataFrame(schema={"trace_id": pl.String, "rank": pl.Int64, "device": pl.Int64,
                                "capacity_bytes": pl.Int64})
    if capacity is not None and not capacity.is_empty():
        known = capacity.filter(pl.col("memory_bytes").is_not_null() & (pl.col("memory_bytes") > 0))
        if "kind" in known.columns:
            known = known.filter(pl.col("kind").is_null() | (pl.col("kind") != "nic"))
        caps = known.group_by(pl.col("trace_id"), pl.col("rank").cast(pl.Int64), pl.col("device").cast(pl.Int64)).agg(
            pl.col("memory_bytes").max().cast(pl.Int64).alias("capacity_bytes"))
    cap, reserved = pl.col("capacity_bytes"), pl.col("peak_reserved_bytes")
    rows = peaks.join(caps, on=key, how="left").with_columns(
        pl.min_horizontal(pl.max_horizontal(cap - reserved.fill_null(0), 0), cap).alias("headroom_bytes"))
    rows = rows.with_columns((100.0 * pl.col("headroom_bytes") / cap).alias("headroom_pct"))
    headroom = pl.col("headroom_pct")
    return (rows.group_by("job").agg(
        pl.col("rank").n_unique().cast(pl.Int64).alias("ranks"),
        pl.struct("trace_id", "rank", "device").n_unique().cast(pl.Int64).alias("devices"),
        pl.col("peak_allocated_bytes").max().cast(pl.Int64),
        reserved.max().cast(pl.Int64),
        cap.max(),
        pl.col("headroom_bytes").min(),
        headroom.min(),
    ).with_columns(
        pl.when(headroom < EDGE_HEADROOM_PCT).then(pl.lit("edge"))
        .when(headroom > ROOM_HEADROOM_PCT).then(pl.lit("room")).alias("verdict"),
    ).sort("job").select(MEMORY_COLUMNS))
