"""Every analysis of one trace or job, assembled together: what ``tracelake analyze`` shows.

Pure: frames in, an :class:`Analysis` out. The facade's :meth:`Warehouse.analyze` reads the
rows (:data:`STORED`) and returns an :class:`Analysis`, whose frames are polars DataFrames
for notebooks; the CLI and the API only render it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from . import collectives, critical_path, findings, nccl, nccl_findings, nccl_join, steps


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

    def as_dict(self) -> dict[str, Any]:
        """Everything as JSON-friendly lists of dicts."""
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
                "parallelism": self.parallelism.to_dicts(), "pipeline_bubbles": self.pipeline_bubbles.to_dicts()}


#: Tables :func:`compute` takes rows of (stored at ingest or parsed; small per trace).
STORED = ("traces", "stream_idle", "launch_stats", "stream_queues", "steps", "collectives", "nccl_benchmarks",
          "flight_recorder_status", "communicators", "comm_channels", "graph_launches", "devices")


def _ranks(frame: pl.DataFrame) -> int:
    return frame.select(pl.struct("trace_id", "rank").n_unique()).item() if frame.height else 0


def compute(
    whole: pl.DataFrame, stored: dict[str, pl.DataFrame], top_kernels: pl.DataFrame,
    link_peaks: dict[str, float] | None = None, paths: critical_path.CriticalPaths | None = None,
) -> Analysis:
    """Assemble every analysis of a selection of traces, and rank the findings.

    ``whole`` is the selection's whole-trace breakdown, ``stored`` its rows of each
    table in :data:`STORED`, ``top_kernels`` its kernel ranking
    (:func:`tracelake.analysis.kernels.top_kernels`); ``link_peaks`` the bus bandwidth
    each link type carries (:func:`tracelake.analysis.nccl.link_peaks`); ``paths`` the
    selection's critical paths and what-if answers (:func:`tracelake.analysis.critical_path.analyse`),
    whose replay then bounds the exposed-communication finding.
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
        + findings.from_traces(stored["traces"], whole),
        result.what_if, traces_named, ranks_named),
        findings.spans(whole, stored["traces"], stored["collectives"]),
    )
    return result
