"""Every analysis of one trace or job, assembled together: what ``tracelake analyze`` shows.

Pure: frames in, an :class:`Analysis` out. The facade's :meth:`Warehouse.analyze` reads the
rows (:data:`STORED`) and returns an :class:`Analysis`, whose frames are polars DataFrames
for notebooks; the CLI and the API only render it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from . import (
    allocator, collectives, critical_path, findings, memory, memory_findings, model_flops, nccl, nccl_findings,
    nccl_join, operator_findings, operators, steps,
)


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
    nccl_benchmarks: pl.DataFrame
    lagging_ranks: pl.DataFrame
    unreached: pl.DataFrame
    nccl_tuning: pl.DataFrame
    topology: pl.DataFrame
    bandwidth_by_size: pl.DataFrame
    slowest_collectives: pl.DataFrame
    findings: list[findings.Finding] = field(default_factory=list)
    #: The runs the selection spans, one row each (:mod:`tracelake.analysis.runs`; docs/analyses.md, "Runs within a
    #: job"); with more than one, every other frame has a leading ``run`` column.
    runs: pl.DataFrame = field(default_factory=pl.DataFrame)
    #: One row per CUDA/HIP graph launch (table ``graph_launches``; docs/analyses.md, "Launches").
    graphs: pl.DataFrame = field(default_factory=pl.DataFrame)
    #: What bounds each step across the ranks: one row per step, time on the critical path by kind
    #: (:mod:`tracelake.analysis.critical_path`; docs/analyses.md, "Critical path").
    critical_path: pl.DataFrame = field(default_factory=pl.DataFrame)
    #: The stretches of each step's critical path, in order: rank, kind, name, start and duration.
    critical_path_stretches: pl.DataFrame = field(default_factory=pl.DataFrame)
    #: Each step replayed under each what-if scenario: the predicted step time and its path by kind.
    what_if: pl.DataFrame = field(default_factory=pl.DataFrame)
    #: Communication per process group, mapped to a parallelism dimension (:mod:`tracelake.analysis.parallelism`).
    parallelism: pl.DataFrame = field(default_factory=pl.DataFrame)
    #: Pipeline bubbles per stage and step, against the schedule's own bubble.
    pipeline_bubbles: pl.DataFrame = field(default_factory=pl.DataFrame)
    #: Device memory per (trace, rank, device) (:func:`tracelake.analysis.memory.peaks` columns, then the growth's
    #: ``slope_bytes_per_step`` and ``leak``); empty without ``memory_events`` (docs/analyses.md, "Memory").
    memory: pl.DataFrame = field(default_factory=pl.DataFrame)
    #: What holds each device's memory at its allocated peak, by the op that allocated it: one row per op.
    memory_live_at_peak: pl.DataFrame = field(default_factory=pl.DataFrame)
    #: Bytes per category at the peak of PyTorch's memory timeline export (``memory_timeline``), where present.
    memory_by_category: pl.DataFrame = field(default_factory=pl.DataFrame)
    #: Growth of the memory that survives each steady step, and whether it is a leak.
    memory_growth: pl.DataFrame = field(default_factory=pl.DataFrame)
    #: Allocations and synchronising malloc/free runtime calls per (trace, rank, step).
    allocator_churn: pl.DataFrame = field(default_factory=pl.DataFrame)
    #: Per (trace, rank, device) of a CUDA allocator snapshot (``allocator_segments``): reserved, in use, free and
    #: how broken up the free memory is (:func:`tracelake.analysis.allocator.snapshot_summary`).
    allocator_snapshots: pl.DataFrame = field(default_factory=pl.DataFrame)
    #: The snapshot's blocks in use by the frame that allocated them
    #: (:func:`tracelake.analysis.allocator.live_by_frame`).
    allocator_live: pl.DataFrame = field(default_factory=pl.DataFrame)
    #: The snapshot history's out-of-memory failures against the free memory (``allocator_events``).
    allocator_ooms: pl.DataFrame = field(default_factory=pl.DataFrame)
    #: For plots, not in :meth:`as_dict`: allocated and reserved totals over time per (trace, rank, device), at
    #: most :data:`SERIES_POINTS` rows each (:func:`memory_series`).
    memory_series: pl.DataFrame = field(default_factory=pl.DataFrame)
    #: For plots, not in :meth:`as_dict`: the memory timeline's live bytes per category over time, at most
    #: :data:`SERIES_POINTS` instants per timeline (:func:`category_series`).
    memory_category_series: pl.DataFrame = field(default_factory=pl.DataFrame)
    #: The operators with most device time over every rank, then one ``(other operators)`` row: ``op_stats`` summed
    #: (:func:`tracelake.analysis.operators.top_operators`; docs/analyses.md, "Operators"); empty without rows.
    top_operators: pl.DataFrame = field(default_factory=pl.DataFrame)
    #: The module paths with most device time over every rank (:func:`tracelake.analysis.operators.top_modules`;
    #: docs/analyses.md, "Module"); empty where the traces have no Python events.
    top_modules: pl.DataFrame = field(default_factory=pl.DataFrame)
    #: Per labelled trace and rank, 6·N·D per step against the operators' count (:func:`model_flops.cross_check`;
    #: docs/analyses.md, "6·N·D cross-check"); empty without the labels ``params`` and ``tokens_per_step``.
    model_flops: pl.DataFrame = field(default_factory=pl.DataFrame)
    #: For plots, not in :meth:`as_dict`: the selection's ``op_stats`` rows (the job report's roofline).
    op_stats: pl.DataFrame = field(default_factory=pl.DataFrame)

    def as_dict(self) -> dict[str, Any]:
        """Everything but what only plots read (``memory_series``, ``memory_category_series``, ``op_stats``) as lists
        of dicts."""
        frames = {
            name: getattr(self, name).to_dicts()
            for name in ("breakdown", "top_kernels", "idle_by_stream", "launches", "queues", "step_stats",
                         "step_outliers", "collectives", "last_arrivals", "nccl_benchmarks", "lagging_ranks", "unreached",
                         "nccl_tuning", "topology",
                         "bandwidth_by_size", "slowest_collectives")
        }
        return {"findings": [f.as_dict() for f in self.findings], **frames, "runs": self.runs.to_dicts(),
                "graphs": self.graphs.to_dicts(), "critical_path": self.critical_path.to_dicts(),
                "critical_path_stretches": self.critical_path_stretches.to_dicts(), "what_if": self.what_if.to_dicts(),
                "parallelism": self.parallelism.to_dicts(), "pipeline_bubbles": self.pipeline_bubbles.to_dicts(),
                "top_operators": self.top_operators.to_dicts(), "top_modules": self.top_modules.to_dicts(),
                "model_flops": self.model_flops.to_dicts(),
                **{name: getattr(self, name).to_dicts() for name in MEMORY_FRAMES}}


#: The memory results :meth:`Analysis.as_dict` gives (docs/analyses.md, "Memory").
MEMORY_FRAMES = ("memory", "memory_live_at_peak", "memory_by_category", "memory_growth", "allocator_churn",
                 "allocator_snapshots", "allocator_live", "allocator_ooms")


#: Tables :func:`compute` takes rows of (stored at ingest or parsed; small per trace).
STORED = ("traces", "stream_idle", "launch_stats", "stream_queues", "steps", "collectives", "nccl_benchmarks",
          "flight_recorder_status", "communicators", "comm_channels", "graph_launches", "devices", "memory_events",
          "memory_timeline", "op_stats", "allocator_segments", "allocator_events")
#: The host calls :func:`compute` counts as allocator churn (``host_ops`` rows of these names; docs/analyses.md,
#: "Memory"): read only where the selection has ``memory_events``.
ALLOCATOR_CALLS = tuple(sorted(memory.SYNC_MALLOC_CALLS | memory.SYNC_FREE_CALLS | memory.ASYNC_CALLS))
#: Most points a plotted memory series keeps per device (or timeline): a job report stays small.
SERIES_POINTS = 2000


def _ranks(frame: pl.DataFrame) -> int:
    return frame.select(pl.struct("trace_id", "rank").n_unique()).item() if frame.height else 0


def compute(
    whole: pl.DataFrame, stored: dict[str, pl.DataFrame], top_kernels: pl.DataFrame,
    link_peaks: dict[str, float] | None = None, paths: critical_path.CriticalPaths | None = None,
    allocator_calls: pl.DataFrame | None = None, top: int = 8,
) -> Analysis:
    """Assemble every analysis of a selection of traces, and rank the findings.

    ``whole`` is the selection's whole-trace breakdown, ``stored`` its rows of each
    table in :data:`STORED`, ``top_kernels`` its kernel ranking
    (:func:`tracelake.analysis.kernels.top_kernels`); ``link_peaks`` the bus bandwidth
    each link type carries (:func:`tracelake.analysis.nccl.link_peaks`); ``paths`` the
    selection's critical paths and what-if answers (:func:`tracelake.analysis.critical_path.analyse`),
    whose replay then bounds the exposed-communication finding. ``allocator_calls`` are the selection's
    ``host_ops`` rows named in :data:`ALLOCATOR_CALLS` (``trace_id``, ``rank``, ``name``, ``step``, ``dur_ns``).
    ``top`` is how many operators :attr:`Analysis.top_operators` names before the rest.
    """
    arrivals = collectives.last_arrivals(stored["collectives"])
    instances = collectives.instances(stored["collectives"])
    result = Analysis(
        breakdown=whole,
        top_kernels=top_kernels,
        idle_by_stream=stored["stream_idle"].sort("trace_id", "rank", "stream"),
        launches=stored["launch_stats"].sort("trace_id", "rank"),
        queues=stored["stream_queues"].sort("trace_id", "rank", "stream"),
        step_stats=steps.step_stats(stored["steps"]),
        step_outliers=steps.step_outliers(stored["steps"]),
        collectives=instances,
        last_arrivals=arrivals,
        nccl_benchmarks=nccl.benchmark_summary(stored["nccl_benchmarks"], link_peaks, devices=stored.get("devices"),
                                               traces=stored["traces"], channels=stored["comm_channels"]),
        lagging_ranks=nccl.lagging_ranks(stored["flight_recorder_status"]),
        unreached=nccl.unreached(stored["collectives"], stored["traces"]),
        nccl_tuning=nccl_join.tuned_collectives(stored["collectives"], stored["traces"]),
        topology=nccl.topology(stored["communicators"], stored["comm_channels"], stored.get("devices")),
        bandwidth_by_size=collectives.bandwidth_by_size(instances),
        slowest_collectives=collectives.slowest(instances),
        graphs=stored["graph_launches"].sort("trace_id", "rank", "launch_ns") if "graph_launches" in stored
        else pl.DataFrame(),
        top_operators=operators.top_operators(stored.get("op_stats", pl.DataFrame()), top=top),
        top_modules=operators.top_modules(stored.get("op_stats", pl.DataFrame()), top=top),
        model_flops=model_flops.cross_check(stored["traces"], stored.get("op_stats", pl.DataFrame())),
        op_stats=stored.get("op_stats", pl.DataFrame()),
    )
    traces_named: tuple[str, ...] = ()
    ranks_named: tuple[int, ...] = ()
    if paths is not None:
        result.critical_path, result.critical_path_stretches = paths.steps, paths.path
        result.what_if = paths.what_if
        result.parallelism, result.pipeline_bubbles = paths.parallelism, paths.bubbles
        traces_named = tuple(stored["traces"]["trace_id"].cast(pl.String).to_list())
        ranks_from = whole if whole.height and "rank" in whole.columns else stored["traces"]  # an XLA trace: many
        ranks_named = tuple(sorted({int(r) for r in ranks_from["rank"].drop_nulls().to_list()}))
    memory_found = _memory(result, stored, allocator_calls)
    result.findings = findings.rank(critical_path.with_replay(
        findings.from_breakdown(whole)
        + findings.from_last_arrivals(arrivals, ranks=max(whole.height, _ranks(stored["collectives"])), whole=whole)
        + findings.from_idle(result.idle_by_stream, whole)
        + findings.from_launches(result.launches, whole)
        + findings.from_graphs(result.graphs)
        + findings.from_step_outliers(result.step_outliers)
        + nccl_findings.from_nccl_benchmarks(result.nccl_benchmarks)
        + nccl_findings.from_lagging_ranks(result.lagging_ranks)
        + nccl_findings.from_unreached(result.unreached)
        + nccl_findings.from_topology(result.topology)
        + findings.from_traces(stored["traces"], whole)
        + operator_findings.from_op_stats(result.op_stats, whole)
        + model_flops.findings(result.model_flops)
        + memory_found,
        result.what_if, traces_named, ranks_named),
        findings.spans(whole, stored["traces"], stored["collectives"]),
    )
    return result


def _memory(result: Analysis, stored: dict[str, pl.DataFrame],
            allocator_calls: pl.DataFrame | None) -> list[findings.Finding]:
    """Fill ``result``'s memory frames from the stored rows; return the memory findings (docs/analyses.md, "Memory")."""
    events = stored.get("memory_events", pl.DataFrame())
    timeline = stored.get("memory_timeline", pl.DataFrame())
    categories = memory.by_category_at_peak(timeline) if timeline.height else pl.DataFrame()
    result.memory_by_category = categories
    if timeline.height:
        result.memory_category_series = category_series(timeline)
    snapshot_found = _snapshots(result, stored)
    if not events.height:
        return snapshot_found
    capacity = stored.get("devices")
    peak_rows = memory.peaks(events, capacity)
    grown = memory.growth(events, capacity)
    live = memory.live_at_peak(events)
    calls = allocator_calls if allocator_calls is not None else pl.DataFrame(
        schema={"trace_id": pl.String, "rank": pl.Int64, "name": pl.String, "step": pl.Int64, "dur_ns": pl.Int64})
    churned = memory.churn(events, calls)
    result.memory = peak_rows.join(grown.select(*memory.KEY, "slope_bytes_per_step", "leak"), on=list(memory.KEY),
                                   how="left")
    result.memory_live_at_peak = _live_rows(live)
    result.memory_growth, result.allocator_churn = grown, churned
    result.memory_series = memory_series(events)
    return memory_findings.findings(peak_rows, live=live, categories=_by_rank(categories),
                                    ooms=memory.out_of_memory(events), growth_rows=grown, churn_rows=churned,
                                    imbalance=memory.imbalance(peak_rows)) + snapshot_found


def _snapshots(result: Analysis, stored: dict[str, pl.DataFrame]) -> list[findings.Finding]:
    """Fill ``result``'s allocator snapshot frames; return their findings (docs/analyses.md, "Allocator snapshots")."""
    segments = stored.get("allocator_segments", pl.DataFrame())
    events = stored.get("allocator_events", pl.DataFrame())
    if not segments.height and not events.height:
        return []
    summary = allocator.snapshot_summary(segments) if segments.height else pl.DataFrame(
        schema={c: pl.String if c == "trace_id" else pl.Int64 for c in ("trace_id", "rank", "device", "free_bytes",
                                                                       "largest_free_bytes")})
    result.allocator_snapshots = summary
    result.allocator_live = allocator.live_by_frame(segments) if segments.height else pl.DataFrame()
    result.allocator_ooms = allocator.out_of_memory(events, summary) if events.height else pl.DataFrame()
    return allocator.findings(summary, result.allocator_ooms)


def _by_rank(categories: pl.DataFrame) -> pl.DataFrame:
    """Category rows keyed by rank (and device, where the export names one), not by trace: the timeline is its own
    trace, and joins the Kineto trace of the same rank (within one run, as :func:`compute` is called)."""
    return categories.drop("trace_id") if "trace_id" in categories.columns else categories


def _live_rows(live: list[memory.LiveAtPeak]) -> pl.DataFrame:
    """:func:`tracelake.analysis.memory.live_at_peak` as rows: one per (trace, rank, device, op), largest first."""
    schema = {"trace_id": pl.String, "rank": pl.Int64, "device": pl.Int64, "ts_ns": pl.Int64, "step": pl.Int64,
              "allocated_bytes": pl.Int64, "live_bytes": pl.Int64, "before_trace_bytes": pl.Int64,
              "residual_bytes": pl.Int64, "op": pl.String, "blocks": pl.Int64, "bytes": pl.Int64,
              "share_pct": pl.Float64}
    rows = [{"trace_id": p.trace_id, "rank": p.rank, "device": p.device, "ts_ns": p.ts_ns, "step": p.step,
             "allocated_bytes": p.allocated_bytes, "live_bytes": p.live_bytes,
             "before_trace_bytes": p.before_trace_bytes, "residual_bytes": p.residual_bytes, "op": s.op,
             "blocks": s.blocks, "bytes": s.bytes, "share_pct": s.share_pct} for p in live for s in p.by_op]
    return pl.DataFrame(rows, schema=schema)


def _thin(frame: pl.DataFrame, key: list[str], value: str, points: int, extra: list[str]) -> pl.DataFrame:
    """At most about ``points`` rows per ``key`` (in ``_t`` order): per time bucket, the rows with the lowest and
    highest ``value`` (and of each ``extra`` column, the highest), so that every peak stays in the plot."""
    if frame.is_empty():
        return frame
    per = 2 + len(extra)
    buckets = max(points // per, 1)
    t = pl.col("_t")
    at = frame.with_row_index("_i").with_columns(
        pl.when(t.max().over(key) > t.min().over(key))
        .then(((t - t.min().over(key)) * (buckets - 1) // (t.max().over(key) - t.min().over(key))))
        .otherwise(0).alias("_b"),
        pl.len().over(key).alias("_n"))
    small = at.filter(pl.col("_n") <= points)
    big = at.filter(pl.col("_n") > points)
    chosen = big.group_by(*key, "_b").agg(
        pl.col("_i").sort_by(value).first().alias("_lo"), pl.col("_i").sort_by(value).last().alias("_hi"),
        *(pl.col("_i").sort_by(c).last().alias(f"_x{n}") for n, c in enumerate(extra)))
    keep = pl.concat([chosen.select(pl.col(c).alias("_i")) for c in chosen.columns if c.startswith(("_lo", "_hi", "_x"))]) \
        if chosen.height else pl.DataFrame(schema={"_i": pl.UInt32})
    picked = big.filter(pl.col("_i").is_in(keep["_i"].implode()))
    return pl.concat([small, picked]).sort("_i").drop("_i", "_b", "_n")


def memory_series(events: pl.DataFrame, points: int = SERIES_POINTS) -> pl.DataFrame:
    """Allocated and reserved totals over time per (trace, rank, device), for a plot: at most ``points`` rows each.

    ``trace_id``, ``rank``, ``device``, ``ts_ns``, ``allocated_bytes``, ``reserved_bytes``: the trace's own running
    totals, in time order; past ``points`` events, each of ``points / 3`` stretches of time keeps its lowest and
    highest allocated and its highest reserved event, so the peaks are drawn as they are.
    """
    key = list(memory.KEY)
    ts = "ts_ns" if "ts_ns" in events.columns else "ts"
    rows = events.filter(pl.col("total_allocated").is_not_null()).select(
        pl.col("trace_id").cast(pl.String), pl.col("rank").cast(pl.Int64), pl.col("device").cast(pl.Int64),
        pl.col(ts).cast(pl.Int64).alias("_t"), pl.col("total_allocated").alias("allocated_bytes"),
        pl.col("total_reserved").alias("reserved_bytes")).with_row_index("_o").sort([*key, "_t", "_o"]).drop("_o")
    return _thin(rows, key, "allocated_bytes", points, ["reserved_bytes"]).rename({"_t": "ts_ns"})


def category_series(timeline: pl.DataFrame, points: int = SERIES_POINTS) -> pl.DataFrame:
    """Live bytes per category over time of PyTorch's memory timeline export, for a stacked plot.

    One row per (trace, rank, device where given, instant, category): ``ts_ns``, ``category``, ``bytes``,
    read after all rows of an instant, pre-existing memory counted from the first instant; the replay is
    :func:`tracelake.analysis.memory.by_category_at_peak`'s, kept at every instant. Past ``points`` instants,
    each of ``points / 2`` stretches keeps its instants with the lowest and the highest total.
    """
    key = [c for c in memory.KEY if c in timeline.columns]
    ts = "ts_ns" if "ts_ns" in timeline.columns else "ts"
    tl = timeline
    if tl.schema["action"].is_integer():
        tl = tl.with_columns(pl.col("action").replace_strict(memory.TIMELINE_ACTIONS, default=None,
                                                             return_dtype=pl.String))
    if tl.schema["category"].is_integer():
        tl = tl.with_columns(pl.col("category").replace_strict(memory.TIMELINE_CATEGORIES, default="unknown",
                                                               return_dtype=pl.String))
    size, action = pl.col("bytes").cast(pl.Int64), pl.col("action")
    tl = tl.select(
        *key, pl.col("category").fill_null("unknown"),
        pl.when(action == "destroy").then(-size.abs()).when(action == "increment_version").then(size)
        .otherwise(size.abs()).alias("_delta"),
        pl.when(pl.col(ts).is_null() | (pl.col(ts) < 0)).then(None).otherwise(pl.col(ts)).cast(pl.Int64).alias("_t"))
    tl = tl.with_columns(pl.col("_t").fill_null(pl.col("_t").min().over(key) if key else pl.col("_t").min()))
    tl = tl.filter(pl.col("_t").is_not_null())
    if tl.is_empty():
        return pl.DataFrame(schema={**{c: timeline.schema[c] for c in key}, "ts_ns": pl.Int64, "category": pl.String,
                                    "bytes": pl.Int64})
    cats = sorted(tl["category"].unique().to_list())
    per = tl.group_by(*key, "_t", "category").agg(pl.col("_delta").sum())
    wide = per.pivot(on="category", index=[*key, "_t"], values="_delta").sort([*key, "_t"])
    for c in cats:
        if c not in wide.columns:
            wide = wide.with_columns(pl.lit(0, dtype=pl.Int64).alias(c))
    wide = wide.with_columns(pl.col(c).fill_null(0).cum_sum().over(key) if key else pl.col(c).fill_null(0).cum_sum()
                             for c in cats)
    wide = wide.with_columns(pl.sum_horizontal(*cats).alias("_total"))
    thin = _thin(wide, key or ["_g"], "_total", points, []) if key else \
        _thin(wide.with_columns(pl.lit(0).alias("_g")), ["_g"], "_total", points, []).drop("_g")
    return thin.drop("_total").unpivot(index=[*key, "_t"], variable_name="category", value_name="bytes").rename(
        {"_t": "ts_ns"}).sort([*key, "ts_ns", "category"])
