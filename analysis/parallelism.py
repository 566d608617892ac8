"""Communication by parallelism dimension, and pipeline bubbles (docs/analyses.md, "Parallelism").

Each process group is mapped to a dimension (data, tensor, pipeline, context, expert or sequence
parallelism) by the first rule that tells: its name or description in the trace (a device mesh
names its groups ``tp``, ``dp_shard``, ...), the operations it runs (only send/recv: pipeline;
mostly all-to-all: expert), then its ranks (the whole world: data; consecutive ranks: tensor;
strided: data). Per group: its collectives' time and the part no compute overlaps, per rank on
average, and its share of the critical path. Per pipeline stage and step: the time the stage's
device sat idle, against the bubble a 1F1B or GPipe schedule has by construction,
(p - 1) / (m + p - 1) for p stages and m micro-batches.
"""

from __future__ import annotations

import json
import re
from enum import StrEnum

import numpy as np
import polars as pl

from tracelake.contracts.classify import Category
from tracelake.contracts.critical import P2P_OPS

from .depgraph import RankInput


class Dimension(StrEnum):
    """A parallelism dimension."""

    DATA = "data"
    TENSOR = "tensor"
    PIPELINE = "pipeline"
    CONTEXT = "context"
    EXPERT = "expert"
    SEQUENCE = "sequence"


#: Name patterns, tried in this order on a group's description, then its name (a letter may not touch the
#: match: ``default_pg`` is not ``pp``). A flattened mesh dimension such as ``dp_shard_cp`` takes the first.
NAME_RULES: tuple[tuple[Dimension, str], ...] = (
    (Dimension.PIPELINE, r"(?<![a-z])(pp|pipe|pipeline)(?![a-z])"),
    (Dimension.EXPERT, r"(?<![a-z])(ep|expert|experts|moe)(?![a-z])"),
    (Dimension.CONTEXT, r"(?<![a-z])(cp|context)(?![a-z])"),
    (Dimension.TENSOR, r"(?<![a-z])(tp|tensor|mp|model)(?![a-z])"),
    (Dimension.SEQUENCE, r"(?<![a-z])(sp|sequence)(?![a-z])"),
    (Dimension.DATA, r"(?<![a-z])(dp|data|replicate|shard|fsdp|hsdp|ddp)(?![a-z])"),
)
#: What a pipeline group runs: point-to-point operations, and batches of them.
P2P = (*P2P_OPS, "batch_isend_irecv")
GROUP_COLUMNS = ("process_group", "description", "dimension", "basis", "group_size", "ranks", "collectives",
                 "operations", "time_ns", "exposed_ns", "critical_ns", "critical_pct", "a2a_imbalance_pct")
BUBBLE_COLUMNS = ("rank", "step", "stages", "microbatches", "span_ns", "busy_ns", "bubble_ns", "bubble_pct",
                  "schedule_bubble_pct")


def _ranks(text: object) -> list[int]:
    try:
        value = json.loads(str(text))
    except (ValueError, TypeError):
        return []
    return [int(r) for r in value] if isinstance(value, list) and all(isinstance(r, int) for r in value) else []


def dimension_of(name: str, description: str, operations: list[str], ranks: list[int],
                 world: int | None) -> tuple[Dimension | None, str]:
    """The dimension of one process group and the rule that told it (``name``, ``operations`` or ``ranks``)."""
    for text in (description, name):
        for dimension, pattern in NAME_RULES:
            if text and re.search(pattern, text.lower()):
                return dimension, "name"
    ops = [o.lower() for o in operations]
    if ops and all(o in P2P for o in ops):
        return Dimension.PIPELINE, "operations"
    if ops and sum("all_to_all" in o or "alltoall" in o for o in ops) * 2 > len(ops):
        return Dimension.EXPERT, "operations"
    if len(ranks) > 1:
        ordered = sorted(ranks)
        strides = set(np.diff(ordered).tolist())
        if world is not None and len(ranks) >= world:
            return Dimension.DATA, "ranks"
        if strides == {1}:
            return Dimension.TENSOR, "ranks"
        if len(strides) == 1:
            return Dimension.DATA, "ranks"
    return None, "unknown"


def _all_to_all_imbalance(c: pl.DataFrame) -> pl.DataFrame:
    """Per group, how much more its busiest rank sends in an all-to-all than the average rank, %, over its
    instances (uneven expert routing in a mixture of experts); null without all-to-alls or sizes."""
    sizes = pl.col("in_nelems").cast(pl.Float64) if "in_nelems" in c.columns else pl.lit(None, pl.Float64)
    a2a = c.filter(pl.col("collective").str.to_lowercase().str.contains("all_?to_?all")).with_columns(
        sizes.alias("size")).filter(pl.col("size") > 0)
    if a2a.is_empty():
        return pl.DataFrame(schema={"process_group": pl.String, "a2a_imbalance_pct": pl.Float64})
    per = a2a.group_by("process_group", "seq").agg(
        (100 * (pl.col("size").max() / pl.col("size").mean() - 1)).alias("excess"), pl.len().alias("n"))
    return per.filter(pl.col("n") > 1).group_by("process_group").agg(
        pl.col("excess").mean().round(3).alias("a2a_imbalance_pct"))


def _covered(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merged intervals of (starts, ends) and the covered length before each merged start."""
    if not len(starts):
        return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64)
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    running = np.maximum.accumulate(e)
    new = np.concatenate([[True], s[1:] > running[:-1]])
    group = np.cumsum(new) - 1
    ms, me = s[new], np.zeros(int(new.sum()), np.int64)
    np.maximum.at(me, group, e)
    before = np.concatenate([[0], np.cumsum(me - ms)[:-1]])
    return ms, me, before


def _covered_until(x: np.ndarray, ms: np.ndarray, me: np.ndarray, before: np.ndarray) -> np.ndarray:
    """Covered length of the merged intervals up to each time in ``x``."""
    if not len(ms):
        return np.zeros(len(x), np.int64)
    i = np.searchsorted(ms, x, side="right") - 1
    inside = np.where(i >= 0, np.minimum(x, me[np.maximum(i, 0)]) - ms[np.maximum(i, 0)], 0)
    return np.where(i >= 0, before[np.maximum(i, 0)] + np.maximum(inside, 0), 0)


def _compute_cover(r: RankInput) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ops = r.device.filter((pl.col("category") == Category.COMPUTE) & pl.col("ts_ns").is_not_null())
    ts = ops["ts_ns"].to_numpy().astype(np.int64)
    return _covered(ts, ts + ops["dur_ns"].fill_null(0).to_numpy().astype(np.int64))


def groups(ranks: list[RankInput], collectives: pl.DataFrame, stretches: pl.DataFrame,
           steps: pl.DataFrame, world: int | None) -> pl.DataFrame:
    """One row per process group of one run (:data:`GROUP_COLUMNS`).

    ``collectives`` are the run's ``collectives`` rows; ``stretches`` and ``steps`` its critical
    paths (:mod:`tracelake.analysis.critical_path`); ``world`` its world size when known.
    """
    c = collectives.filter(pl.col("process_group").is_not_null() & ~pl.col("is_async").fill_null(False))
    if c.is_empty():
        return pl.DataFrame(schema=_GROUP_SCHEMA)
    # each op's time not overlapped by compute on its rank
    by_trace = {r.trace_id: r for r in ranks}
    exposed = np.zeros(c.height, np.int64)
    ts = c["ts_ns"].fill_null(0).to_numpy().astype(np.int64)
    end = ts + c["dur_ns"].fill_null(0).to_numpy().astype(np.int64)
    traces = c["trace_id"].cast(pl.String).to_numpy()
    for trace_id in np.unique(traces):
        mine = traces == trace_id
        r = by_trace.get(str(trace_id))
        cover = _compute_cover(r) if r is not None else _covered(np.empty(0, np.int64), np.empty(0, np.int64))
        overlap = _covered_until(end[mine], *cover) - _covered_until(ts[mine], *cover)
        exposed[mine] = (end[mine] - ts[mine]) - overlap
    c = c.with_columns(pl.Series("exposed_ns", exposed))
    total_path = int(steps["length_ns"].sum()) if "length_ns" in steps.columns and steps.height else 0
    on_path = (stretches.filter(pl.col("process_group").is_not_null()).group_by("process_group")
               .agg(pl.col("dur_ns").sum().alias("critical_ns")) if "process_group" in stretches.columns
               else pl.DataFrame(schema={"process_group": pl.String, "critical_ns": pl.Int64}))
    per = c.group_by("process_group").agg(
        pl.col("process_group_desc").drop_nulls().first().alias("description"),
        pl.col("group_ranks").drop_nulls().first().alias("group_ranks"),
        pl.col("group_size").max().alias("group_size"),
        pl.struct("seq", "collective").n_unique().cast(pl.Int64).alias("collectives"),
        pl.col("collective").unique().sort().alias("operations"),
        pl.col("rank").n_unique().alias("ranks_seen"),
        pl.col("dur_ns").sum().alias("time_total"),
        pl.col("exposed_ns").sum().alias("exposed_total"),
    ).join(on_path, on="process_group", how="left").join(_all_to_all_imbalance(c), on="process_group", how="left")
    rows = []
    for g in per.sort("process_group").iter_rows(named=True):
        members = _ranks(g["group_ranks"])
        dimension, basis = dimension_of(str(g["process_group"]), str(g["description"] or ""), g["operations"],
                                        members, world)
        seen = max(int(g["ranks_seen"]), 1)
        critical = int(g["critical_ns"] or 0)
        rows.append((g["process_group"], g["description"], str(dimension) if dimension else None, basis,
                     g["group_size"] or (len(members) or None), g["group_ranks"], g["collectives"],
                     ", ".join(g["operations"]), int(g["time_total"] or 0) // seen,
                     int(g["exposed_total"] or 0) // seen, critical,
                     round(100 * critical / total_path, 3) if total_path else None, g["a2a_imbalance_pct"]))
    return pl.DataFrame(rows, schema=_GROUP_SCHEMA, orient="row")


_GROUP_SCHEMA = {"process_group": pl.String, "description": pl.String, "dimension": pl.String, "basis": pl.String,
                 "group_size": pl.Int64, "ranks": pl.String, "collectives": pl.Int64, "operations": pl.String,
                 "time_ns": pl.Int64, "exposed_ns": pl.Int64, "critical_ns": pl.Int64, "critical_pct": pl.Float64,
                 "a2a_imbalance_pct": pl.Float64}
_BUBBLE_SCHEMA = {"rank": pl.Int32, "step": pl.Int64, "stages": pl.Int64, "microbatches": pl.Int64,
                  "span_ns": pl.Int64, "busy_ns": pl.Int64, "bubble_ns": pl.Int64, "bubble_pct": pl.Float64,
                  "schedule_bubble_pct": pl.Float64}


def bubbles(ranks: list[RankInput], collectives: pl.DataFrame, dimensions: pl.DataFrame) -> pl.DataFrame:
    """Per pipeline stage (rank) and step: idle time against the schedule's own bubble (:data:`BUBBLE_COLUMNS`).

    The stages are the ranks that send or receive in a pipeline group; micro-batches per step are
    the sends of the first stage in that step. A stage is busy while a compute op runs on its
    device, or, on a rank without device ops, while an operator other than a communication call
    runs on its busiest thread. The step's span is the stage's step, from its
    first to its last event.
    """
    pipeline = dimensions.filter(pl.col("dimension") == Dimension.PIPELINE)["process_group"].to_list()
    p2p = collectives.filter(pl.col("process_group").is_in(pipeline) & pl.col("collective").is_in(list(P2P)))
    if p2p.is_empty():
        return pl.DataFrame(schema=_BUBBLE_SCHEMA)
    stages = sorted(int(r) for r in p2p["rank"].unique().drop_nulls())
    first = stages[0]
    sends = p2p.filter((pl.col("rank") == first) & pl.col("collective").is_in(["send", "isend"])
                       & pl.col("step").is_not_null()).group_by("step").agg(pl.len().alias("m"))
    micro = dict(sends.select("step", "m").rows())
    p = len(stages)
    rows = []
    for r in ranks:
        if r.rank not in stages:
            continue
        busy_frame = _busy(r)
        for (step,), frame in busy_frame.group_by("step"):
            if step is None:
                continue
            s = int(step)
            starts, ends = frame["s"].to_numpy(), frame["e"].to_numpy()
            span = _step_span(r, s)
            if span is None or span[1] <= span[0]:
                continue
            ms, me, _ = _covered(np.clip(starts, *span), np.clip(ends, *span))
            busy = int((me - ms).sum())
            m = micro.get(s)
            theory = round(100 * (p - 1) / (m + p - 1), 3) if m else None
            width = span[1] - span[0]
            rows.append((r.rank, s, p, m, width, busy, width - busy, round(100 * (width - busy) / width, 3), theory))
    return pl.DataFrame(rows, schema=_BUBBLE_SCHEMA, orient="row").sort("rank", "step")


def _step_span(r: RankInput, step: int) -> tuple[int, int] | None:
    parts = []
    for frame in (r.host, r.device):
        mine = frame.filter((pl.col("step") == step) & pl.col("ts_ns").is_not_null())
        if mine.height:
            ts = mine["ts_ns"].to_numpy().astype(np.int64)
            ends = ts + mine["dur_ns"].fill_null(0).to_numpy().astype(np.int64)
            parts.append((int(ts.min()), int(ends.max())))
    if not parts:
        return None
    return min(a for a, _ in parts), max(b for _, b in parts)


def _busy(r: RankInput) -> pl.DataFrame:
    """The stage's busy intervals with their step: compute ops on its device, else its top-level host operators."""
    compute = r.device.filter((pl.col("category") == Category.COMPUTE) & pl.col("ts_ns").is_not_null())
    if compute.height:
        frame = compute
    else:
        host = r.host.filter((pl.col("cat") == "cpu_op")
                             & ~pl.col("name").str.contains(r"^(c10d::|gloo:|nccl:|record_param_comms)")
                             & pl.col("ts_ns").is_not_null())
        if host.is_empty():
            return pl.DataFrame(schema={"step": pl.Int64, "s": pl.Int64, "e": pl.Int64})
        busiest = host.group_by("tid").agg(pl.col("dur_ns").sum()).sort("dur_ns", descending=True)["tid"][0]
        frame = host.filter(pl.col("tid") == busiest)
    return frame.select(pl.col("step").cast(pl.Int64), pl.col("ts_ns").alias("s"),
                        (pl.col("ts_ns") + pl.col("dur_ns").fill_null(0)).alias("e"))
