"""Reading what the critical path of a run needs: each rank's host events, device ops and collectives.

The graph is built from whole tables, not stored summaries (docs/analyses.md, "Critical path"),
so only the columns :mod:`tracelake.analysis.depgraph` uses are read, trace by trace.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from tracelake.analysis import critical_path, depgraph, parallelism

from .store import Store


def read(store: Store, pairs: Sequence[tuple[str, str]], traces: pl.DataFrame) -> list[depgraph.RankInput]:
    """One :class:`~tracelake.analysis.depgraph.RankInput` per ``(job, trace_id)`` pair, with its rank from ``traces``."""
    rank_of = dict(zip(traces["trace_id"].cast(pl.String).to_list(), traces["rank"].to_list(), strict=True))
    inputs = []
    for job, trace_id in pairs:
        pair = [(job, trace_id)]
        inputs.append(depgraph.RankInput(
            trace_id, int(rank_of.get(trace_id) or 0),
            store.read_frame("host_ops", pair, list(depgraph.HOST_COLUMNS)),
            store.read_frame("device_ops", pair, list(depgraph.DEVICE_COLUMNS)),
            store.read_frame("collectives", pair, list(depgraph.COLLECTIVE_COLUMNS)),
        ))
    return inputs


def analyse(store: Store, pairs: Sequence[tuple[str, str]], traces: pl.DataFrame,
            collectives: pl.DataFrame) -> critical_path.CriticalPaths:
    """The critical paths and what-if answers of one run's traces, with its communication by parallelism
    dimension and its pipeline bubbles (``collectives``: the run's rows of that table)."""
    inputs = read(store, pairs, traces)
    paths = critical_path.analyse(inputs)
    world = traces["world_size"].drop_nulls().max() if "world_size" in traces.columns else None
    paths.parallelism = parallelism.groups(inputs, collectives, paths.path, paths.steps,
                                           int(world) if world is not None else None)  # type: ignore[arg-type]
    paths.bubbles = parallelism.bubbles(inputs, collectives, paths.parallelism)
    return paths
