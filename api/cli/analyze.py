"""``tracelake analyze``: where the time went, per rank, with the findings; recompute on request."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from tracelake.contracts.lazy import lazy_module, polars as pl
from tracelake.warehouse import InvalidArgument
from tracelake.warehouse.distributed import dask_client, warehouse_path

from ..output import jsonable, to_table
from ..user_input import parse_speedups
from . import render, render_memory, render_ops, render_paths
from .progress import count_bar
from .root import (
    HomeOption,
    SchedulerOption,
    WorkersOption,
    app,
    cluster_target,
    console,
    err_console,
    exit_on_error,
    open_warehouse,
)

if TYPE_CHECKING:
    from tracelake.analysis import findings, graphs
else:  # loaded by the commands that show analyses, not by every command (contracts/lazy.py)
    findings, graphs = lazy_module("tracelake.analysis.findings"), lazy_module("tracelake.analysis.graphs")


@app.command()
@exit_on_error
def analyze(
    trace_id: Annotated[str | None, typer.Argument(help="A trace id or a unique prefix of it, 4 characters at least "
                                                        "(see `tracelake traces`).",
                                                   show_default=False)] = None,
    job: Annotated[str | None, typer.Option("--job", "-j", help="Analyse every trace of this job.")] = None,
    recompute: Annotated[bool, typer.Option("--recompute", help="Recompute the stored analyses of every "
                                            "trace (of --job, if given) first.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
    what_if: Annotated[list[str] | None, typer.Option(
        "--what-if", metavar="TARGET=FACTOR",
        help="Also replay every step with these device ops FACTOR times as fast: a category (compute, "
             "communication, memory) or op names with * and ? (any case), e.g. --what-if 'gemm*=2' "
             "--what-if communication=1.5. Repeatable.", show_default=False)] = None,
    workers: WorkersOption = None,
    scheduler: SchedulerOption = None,
    home: HomeOption = None,
) -> None:
    """Show where the time went: the breakdown per rank and the findings, largest gain first.

    Then what bounds each step (its critical path across the ranks: measured time, the rank
    with most time on the path, the largest kinds of time as % of the step; with more than
    12 steps in a run, its slowest, median and fastest) and what if (each scenario's predicted
    and saved time per step, over every step). --json has every step and stretch.

    With --recompute, --scheduler (or DASK_SCHEDULER_ADDRESS) or --workers recompute one
    trace per Dask task (docs/scale-out.md).
    """
    speedups = parse_speedups(what_if)
    if not recompute and (scheduler or workers is not None):
        raise InvalidArgument("--scheduler and --workers apply to --recompute only")
    warehouse = open_warehouse(warehouse_path(home) if home is not None else None, existing=True)
    if recompute:
        target, _ = cluster_target(scheduler, workers)  # without Dask, --workers recomputes in process
        total = warehouse.count_traces(job=job)
        with dask_client(target) as client, count_bar("recompute", total, err_console.is_terminal) as tick:
            count = warehouse.recompute(job=job, client=client, on_trace=tick)
        err_console.print(f"recomputed the analyses of {count} traces", highlight=False)
        if trace_id is None and job is None:
            return
    result = warehouse.analyze(trace_id=trace_id, job=job, speedups=speedups)
    if as_json:
        sys.stdout.write(json.dumps(jsonable(result.as_dict()), indent=2) + "\n")
        return
    whole, colls = result.breakdown, result.collectives
    if result.runs.height > 1:  # docs/analyses.md, "Runs within a job": every table below is per run
        console.print(to_table(render.frame_result(result.runs.select("run", "rule", "traces", "ranks", "world_size", (
            (pl.col("end_ns") - pl.col("start_ns")) / 1e6).round(2).alias("span ms"))), title="runs in this job"))
    for warning in result.runs["warning"].drop_nulls().to_list() if "warning" in result.runs.columns else []:
        err_console.print(f"warning: {warning}", highlight=False, markup=False, soft_wrap=True)
    if whole.height:  # docs/analyses.md, "Breakdown": exclusive buckets add up to the span, inclusive ones overlap
        console.print(to_table(render.frame_result(render.exclusive_view(whole)),
                               title="where the device time went, per rank: % of span, exclusive buckets (they add "
                               "up to 100; compute+comm: communication hidden by compute; other mix: with memory ops)"))
        console.print(to_table(render.frame_result(render.inclusive_view(whole)),
                               title="per op class, % of span, inclusive (overlapping time counts in each class)"))
    print_findings(result.findings)
    print_critical_path(result.critical_path, result.what_if)
    print_parallelism(result.parallelism, result.pipeline_bubbles)
    print_memory(result)
    if result.bandwidth_by_size.height:
        console.print(to_table(render.frame_result(result.bandwidth_by_size.select(
            "collective", pl.col("bucket").alias("size from"), "instances",
            pl.col("median_busbw_gbs").round(1).alias("median busbw GB/s"),
            pl.col("min_busbw_gbs").round(1).alias("min busbw GB/s"),
            (pl.col("total_transfer_ns") / 1e6).round(2).alias("total ms"),
        )), title="collective bus bandwidth by message size"))
    for row in result.topology.to_dicts():
        console.print(f"NCCL topology: {row['ranks']} ranks on {row['nodes']} node(s), {row['gpus_per_node']} GPUs per "
                      f"node, {row['channels']} channels, transports {row['transports']}", highlight=False,
                      markup=False, soft_wrap=True)
    if result.nccl_tuning.height:
        choices = result.nccl_tuning.group_by("algorithm", "protocol").len().sort("len", descending=True)
        mix = ", ".join(f"{r['algorithm'] or '?'}/{r['protocol'] or '?'} x{r['len']}" for r in choices.to_dicts())
        console.print(f"NCCL records joined to {result.nccl_tuning.height} profiled collectives: {mix}",
                      highlight=False, markup=False, soft_wrap=True)
    if result.nccl_benchmarks.height:
        console.print()
        console.print(to_table(render.frame_result(_nccl_view(result.nccl_benchmarks)),
                               title="nccl-tests bus bandwidth"))
    if colls.height:
        busbw = colls.select(pl.col("busbw_gbs").median()).item()
        skew_us = float(colls.select(pl.col("skew_ns").median()).item() or 0) / 1e3
        bandwidth = f", median busbw {busbw:,.1f} GB/s" if busbw is not None else ""
        console.print(
            f"collectives: {colls.height} instances across ranks{bandwidth}, median arrival skew {skew_us:,.1f} us",
            highlight=False, soft_wrap=True,
        )
    if result.graphs.height:  # docs/analyses.md, "Launches", "CUDA/HIP graphs"
        console.print(to_table(render.frame_result(graphs.graph_summary(result.graphs).select(
            "rank", "launches", pl.col("kernels_per_launch").round(1).alias("kernels/launch"),
            (pl.col("device_ns_per_launch") / 1e6).round(3).alias("device ms/launch"),
            (pl.col("span_ns_per_launch") / 1e6).round(3).alias("span ms/launch"),
            pl.col("gaps_pct").round(1).alias("gaps % of span"),
            (pl.col("call_ns_per_launch") / 1e3).round(1).alias("launch call us"),
            (pl.col("mean_delay_ns") / 1e3).round(1).alias("delay us"))),
            title="CUDA/HIP graph launches, per rank (one row each: --json)"))
    if result.top_kernels.height:
        console.print()
        console.print(to_table(render.frame_result(_kernels_view(result.top_kernels)),
                               title="top kernels, all ranks (whole names: --json)"))
    if result.top_operators.height:  # docs/analyses.md, "Operators": op_stats summed over ranks
        console.print()
        console.print(to_table(render.frame_result(render_ops.operators_view(result.top_operators)),
                               title=render_ops.TITLE))
    if result.top_modules.height:  # docs/analyses.md, "Module"
        console.print()
        console.print(to_table(render.frame_result(render_ops.modules_view(result.top_modules)),
                               title=render_ops.MODULES_TITLE))
    for line in render_ops.model_flops_lines(result.model_flops):  # docs/analyses.md, "6·N·D cross-check"
        console.print(line, highlight=False, markup=False)


def _nccl_view(summary: Any) -> Any:
    return summary.select(
        "collective", pl.when(pl.col("in_place")).then(pl.lit("in-place")).otherwise(pl.lit("out-of-place"))
        .alias("placement"), "ranks", "nodes",
        pl.col("peak_busbw_gbs").round(1).alias("peak busbw GB/s"),
        (pl.col("peak_at_bytes") / 2**20).round(1).alias("at MiB"),
        (pl.col("half_peak_bytes") / 2**20).round(2).alias("half peak from MiB"),
        pl.col("small_time_us").round(1).alias("latency us"),
        pl.col("link"), pl.col("peak_share_pct").round(0).alias("% of link"),
    )


def print_findings(found: list[findings.Finding]) -> None:
    """Print the findings as a list, largest gain first as given; a line saying so when there are none."""
    if not found:
        console.print("no findings: nothing exposed, idle or late stands out", highlight=False)
    for f in found:
        gain = f" (fixing it saves up to {f.gain_ns / 1e6:,.1f} ms)" if f.gain_ns > 0 else ""
        console.print(f"- [bold]{escape(f.title)}[/]: {escape(f.detail)}{gain}", highlight=False, soft_wrap=True)


def print_critical_path(steps: pl.DataFrame, what_if: pl.DataFrame) -> None:
    """What bounds each step (its critical path across the ranks) and the what-if answers; nothing without steps."""
    if steps.height:  # docs/analyses.md, "Critical path"
        view, title = render_paths.bounds_view(steps)
        console.print(to_table(render.frame_result(view), title=title))
    if what_if.height:
        view = render_paths.what_if_view(what_if, words=console.width >= render_paths.WORDS_WIDTH)
        console.print(to_table(render.frame_result(view), title="what if: every step replayed with one change, "
                               "ms per step (as_measured, the baseline, is the measured time; largest saving "
                               "first)"))


def print_parallelism(groups: pl.DataFrame, bubbles: pl.DataFrame) -> None:
    """Communication per process group and dimension, and pipeline bubbles per stage (docs/analyses.md, "Parallelism")."""
    if groups.height:
        console.print(to_table(render.frame_result(render_paths.parallelism_view(groups)),
                               title="communication by process group: ms per rank; exposed = no compute overlaps it; "
                               "critical = on the steps' critical paths"))
    if bubbles.height:
        console.print(to_table(render.frame_result(render_paths.bubbles_view(bubbles)),
                               title="pipeline bubbles per stage, mean over steps: idle % of the step against the "
                               "schedule's own (p - 1) / (m + p - 1)"))


def print_memory(result: Any) -> None:
    """Device memory per rank and device, and what holds it at the peak; nothing without memory data
    (docs/analyses.md, "Memory")."""
    if result.memory.height:
        console.print(to_table(render.frame_result(render_memory.memory_view(result.memory)),
                               title=render_memory.TITLE))
    for line in render_memory.holders_lines(result.memory_live_at_peak, result.memory_by_category):
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    for line in render_memory.snapshot_lines(result.allocator_snapshots, result.allocator_live):
        console.print(line, highlight=False, markup=False, soft_wrap=True)


def _kernels_view(top: Any) -> Any:
    labels = render.kernel_labels(top["name"].to_list(), render.kernel_width(console.width))
    return top.select(
        pl.Series("kernel", labels, dtype=pl.String), pl.col("category").str.slice(0, 7).alias("kind"), "count",
        (pl.col("total_ns") / 1e6).round(2).alias("total ms"),
        (pl.col("mean_ns") / 1e3).round(1).alias("mean us"),
        pl.col("share_pct").round(1).alias("share %"),
    )
