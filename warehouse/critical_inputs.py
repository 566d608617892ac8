"""Reading what the critical path of a run needs: each rank's host events, device ops and collectives.

The graph is built from whole tables, not stored summaries (docs/analyses.md, "Critical path"),
so only the columns :mod:`tracelake.analysis.depgraph` uses are read, trace by trace.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import polars as pl

from tracelake.analysis import critical_path, depgraph, et_deps, parallelism
from tracelake.analysis.nccl import Curve
from tracelake.contracts.critical import Speedup
from tracelake.ingest import execution_trace

from .store import Store


def read(store: Store, pairs: Sequence[tuple[str, str]], traces: pl.DataFrame,
         collectives: pl.DataFrame) -> list[depgraph.RankInput]:
    """One :class:`~tracelake.analysis.depgraph.RankInput` per rank of each ``(job, trace_id)`` pair.

    ``collectives`` are the pairs' rows of that table, already read. A trace holds one rank
    (Kineto), or one per device (an XLA profile: the process's host events go with its lowest
    rank, each device's ops and collectives with its own).
    """
    columns = [*depgraph.COLLECTIVE_COLUMNS, "rank"]
    rank_of = dict(zip(traces["trace_id"].cast(pl.String).to_list(), traces["rank"].to_list(), strict=True))
    edges = _data_edges(store, pairs, traces, rank_of)
    inputs = []
    for job, trace_id in pairs:
        pair = [(job, trace_id)]
        host = store.read_frame("host_ops", pair, [*depgraph.HOST_COLUMNS, "rank"])
        device = store.read_frame("device_ops", pair, [*depgraph.DEVICE_COLUMNS, "rank"])
        mine_collectives = collectives.filter(pl.col("trace_id") == trace_id).select(columns)
        ranks = sorted({int(r) for r in device["rank"].drop_nulls().unique().to_list()}) or [
            int(rank_of.get(trace_id) or 0)]
        for rank in ranks:
            def mine(frame: pl.DataFrame, rank: int = rank) -> pl.DataFrame:
                return frame.filter(pl.col("rank") == rank).drop("rank") if len(ranks) > 1 else frame.drop("rank")
            inputs.append(depgraph.RankInput(
                trace_id, rank, host.drop("rank") if rank == ranks[0] else host.clear().drop("rank"),
                mine(device), mine(mine_collectives), edges.get(rank)))
    return inputs


def _data_edges(store: Store, pairs: Sequence[tuple[str, str]], traces: pl.DataFrame,
                rank_of: dict[str, int | None]) -> dict[int, pl.DataFrame]:
    """Per rank, the data dependencies of the run's execution traces (:func:`et_deps.data_edges`)."""
    if "format" not in traces.columns:
        return {}
    ets = set(traces.filter(pl.col("format") == execution_trace.FORMAT)["trace_id"].cast(pl.String).to_list())
    et_pairs = [(job, trace_id) for job, trace_id in pairs if trace_id in ets]
    if not et_pairs:
        return {}
    found = et_deps.data_edges(store.read_frame("et_nodes", et_pairs, [*et_deps.NEEDS, "trace_id"]))
    out: dict[int, pl.DataFrame] = {}
    for (trace_id,), part in found.group_by(["trace_id"]):
        rank = int(rank_of.get(str(trace_id)) or 0)
        out[rank] = pl.concat([out[rank], part]) if rank in out else part
    return out


def analyse(store: Store, pairs: Sequence[tuple[str, str]], traces: pl.DataFrame,
            collectives: pl.DataFrame, speedups: Sequence[Speedup] = (),
            curves: Mapping[str, Curve] | None = None) -> critical_path.CriticalPaths:
    """The critical paths and what-if answers (with ``speedups``) of one run's traces, with its communication by
    parallelism dimension and its pipeline bubbles (``collectives``: the run's rows of that table)."""
    inputs = read(store, pairs, traces, collectives)
    paths = critical_path.analyse(inputs, speedups, curves)
    world = traces["world_size"].drop_nulls().max() if "world_size" in traces.columns else None
    paths.parallelism = parallelism.groups(inputs, collectives, paths.path, paths.steps,
                                           int(world) if world is not None else None)  # type: ignore[arg-type]
    paths.bubbles = parallelism.bubbles(inputs, collectives, paths.parallelism)
    return paths
