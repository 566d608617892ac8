"""CUDA/HIP graph launches, one row each (docs/analyses.md, "Launches", "CUDA/HIP graphs").

A graph launch is one runtime call (``cudaGraphLaunch``, ``hipGraphLaunch``, ...) that starts
many kernels, all carrying the call's correlation id (:mod:`.launches` says which launches are
graphs). Per launch: the call, the kernels it started, their device time, the span from the
first kernel's start to the last one's end, the gaps inside that span (span minus the union of
the kernels' busy time: the device idle within the graph) and the launch delay (first kernel
start - end of the call, floored at 0).

:func:`graph_rows` computes the rows of a rank from the kernels :class:`launches.LaunchParts` keeps.
"""

from __future__ import annotations

import polars as pl

COLUMNS = (
    "trace_id", "rank", "correlation", "graph_id", "call", "launch_ns", "call_ns", "kernels", "streams",
    "first_ns", "device_ns", "span_ns", "gaps_ns", "delay_ns",
)

_SCHEMA = {
    "trace_id": pl.String, "rank": pl.Int32, "correlation": pl.Int64, "graph_id": pl.Int64, "call": pl.String,
    "launch_ns": pl.Int64, "call_ns": pl.Int64, "kernels": pl.Int64, "streams": pl.Int64, "first_ns": pl.Int64,
    "device_ns": pl.Int64, "span_ns": pl.Int64, "gaps_ns": pl.Int64, "delay_ns": pl.Int64,
}


def graph_rows(kernels: pl.DataFrame | None, trace_id: str, rank: int, calls: dict[int, str]) -> pl.DataFrame:
    """One row per graph launch of one (trace, rank) (:data:`COLUMNS`), by launch time, from its graph kernels.

    The union of busy time is summed in start order: each kernel adds what it runs past the
    latest end before it (the kernels before it cover everything up to that end, as they all
    started no later).

    Args:
        kernels: ``correlation``, ``stream``, ``graph_id``, ``ts_ns``, ``dur_ns`` (0 where missing),
            ``launch_ns``, ``call_ns`` of each kernel a graph launch started; None for none.
        calls: the name of each correlation's call, where it is named like a graph launch.
    """
    if kernels is None or not kernels.height:
        return pl.DataFrame(schema=_SCHEMA)
    ordered = kernels.with_columns((pl.col("ts_ns") + pl.col("dur_ns")).alias("end_ns")).sort(
        "correlation", "ts_ns", "end_ns")
    covered = pl.col("end_ns").cum_max().shift(1).over("correlation")
    ordered = ordered.with_columns(
        pl.max_horizontal(pl.col("end_ns") - pl.max_horizontal("ts_ns", covered.fill_null(pl.col("ts_ns"))), 0)
        .alias("new_ns"))
    rows = ordered.group_by("correlation").agg(
        pl.col("graph_id").min(), pl.col("launch_ns").first(), pl.col("call_ns").first(),
        pl.len().cast(pl.Int64).alias("kernels"), pl.col("stream").drop_nulls().n_unique().cast(pl.Int64)
        .alias("streams"), pl.col("ts_ns").min().alias("first_ns"), pl.col("dur_ns").sum().alias("device_ns"),
        (pl.col("end_ns").max() - pl.col("ts_ns").min()).alias("span_ns"), pl.col("new_ns").sum().alias("busy_ns"))
    names = pl.DataFrame({"correlation": list(calls), "call": list(calls.values())},
                         schema={"correlation": pl.Int64, "call": pl.String})
    return rows.join(names, on="correlation", how="left").select(
        pl.lit(trace_id).alias("trace_id"), pl.lit(rank, dtype=pl.Int32).alias("rank"), "correlation", "graph_id",
        "call", "launch_ns", "call_ns", "kernels", "streams", "first_ns", "device_ns", "span_ns",
        (pl.col("span_ns") - pl.col("busy_ns")).alias("gaps_ns"),
        pl.max_horizontal(pl.col("first_ns") - pl.col("launch_ns") - pl.col("call_ns"), 0).alias("delay_ns"),
    ).cast(_SCHEMA).sort("launch_ns", "correlation")  # type: ignore[arg-type]


def graph_summary(graphs: pl.DataFrame) -> pl.DataFrame:
    """Per (trace, rank), the graph launches of :func:`graph_rows` in a row: launches, kernels per launch,
    device time and span per launch, gaps inside the graphs, launch call time and delay."""
    if graphs.is_empty():
        return pl.DataFrame(schema={"trace_id": pl.String, "rank": pl.Int32, "launches": pl.Int64,
                                    "kernels_per_launch": pl.Float64, "device_ns_per_launch": pl.Float64,
                                    "span_ns_per_launch": pl.Float64, "gaps_ns": pl.Int64, "gaps_pct": pl.Float64,
                                    "call_ns_per_launch": pl.Float64, "mean_delay_ns": pl.Float64})
    return graphs.group_by("trace_id", "rank").agg(
        pl.len().cast(pl.Int64).alias("launches"), pl.col("kernels").mean().alias("kernels_per_launch"),
        pl.col("device_ns").mean().alias("device_ns_per_launch"), pl.col("span_ns").mean().alias("span_ns_per_launch"),
        pl.col("gaps_ns").sum().cast(pl.Int64).alias("gaps_ns"),
        (100 * pl.col("gaps_ns").sum() / pl.col("span_ns").sum()).alias("gaps_pct"),
        pl.col("call_ns").mean().alias("call_ns_per_launch"), pl.col("delay_ns").mean().alias("mean_delay_ns"),
    ).sort("trace_id", "rank")
