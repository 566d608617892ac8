"""What bounds each step across ranks, and what-if predictions (docs/analyses.md, "Critical path").

The graph (:mod:`tracelake.analysis.depgraph`) is replayed: in topological order,
each node's time is the latest of its predecessors' (time plus edge weight) plus the
node's slack, the part of its measured time no predecessor explains. Replayed
unchanged it gives back every measured time; a scenario (:class:`Scenario`) changes
weights and slacks first; everything before a step is held at its measured times (and
the edges into the step keep their measured weights). A step's length runs from its
first measured moment on any rank to its latest replayed one;
its critical path is the chain of latest predecessors from the step's last moment
back to its first, each stretch attributed to a :class:`PathKind`.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import polars as pl

from tracelake.contracts.critical import PATH_KINDS, SPEEDUP_CATEGORIES, PathKind, Scenario, Speedup

from .collectives import BUSBW_FACTORS, NCCL_TESTS_NAMES
from .depgraph import CODE, RankInput, build
from .findings import Finding, rank_words
from .nccl import Curve
from .replay import Prepared, Stretch, prepare

PATH_COLUMNS = ("step", "position", "rank", "trace_id", "kind", "name", "process_group", "start_ns", "dur_ns")
STEP_COLUMNS = ("step", "ranks", "measured_ns", "length_ns", "residual_pct", "bounding_rank",
                *(f"{k}_ns" for k in PATH_KINDS))
WHAT_IF_COLUMNS = ("step", "scenario", "changed_rank", "measured_ns", "predicted_ns", "saving_ns", "saving_pct",
                   *(f"{k}_ns" for k in PATH_KINDS))
_CODE_KIND = {code: kind for kind, code in CODE.items()}
#: The name of a stretch before a moment that nothing in the trace precedes (a thread's or stream's first event).
UNEXPLAINED = "(nothing earlier in the trace)"


@dataclass
class CriticalPaths:
    """Per step: the critical path's stretches, its summary by kind, and the what-if answers."""

    path: pl.DataFrame
    steps: pl.DataFrame
    what_if: pl.DataFrame
    #: Edges the measured times contradicted, left out of the graph (clocks out of step).
    dropped_edges: int = 0
    #: Communication by process group and parallelism dimension (:func:`tracelake.analysis.parallelism.groups`).
    parallelism: pl.DataFrame = field(default_factory=pl.DataFrame)
    #: Pipeline bubbles per stage and step (:func:`tracelake.analysis.parallelism.bubbles`).
    bubbles: pl.DataFrame = field(default_factory=pl.DataFrame)


def _speedup(p: Prepared, speedup: Speedup, w0: np.ndarray, s0: np.ndarray) -> tuple[np.ndarray, np.ndarray, None]:
    """Device ops of a category, or named like a pattern, ``factor`` times as fast (a transfer's slack too)."""
    g = p.graph
    codes = [CODE[PathKind(k)] for k in SPEEDUP_CATEGORIES]
    on_device = np.isin(g.kind, codes) & g.on_device[g.dst]
    if speedup.target in SPEEDUP_CATEGORIES:
        edges = on_device & (g.kind == CODE[PathKind(speedup.target)])
        nodes = p.slack_kind == CODE[PathKind(speedup.target)]
    else:
        pattern = speedup.target.lower()
        named = np.array([fnmatch.fnmatchcase(name.lower(), pattern) for name in g.labels] or [False])
        edges = on_device & named[g.label]
        nodes = np.isin(p.slack_kind, codes) & (p.slack_label >= 0) & named[np.maximum(p.slack_label, 0)]
    return (np.where(edges, (w0 / speedup.factor).astype(np.int64, copy=False), w0),
            np.where(nodes, (s0 / speedup.factor).astype(np.int64, copy=False), s0), None)


def _nccl_tests(p: Prepared, curves: Mapping[str, Curve], s0: np.ndarray) -> np.ndarray | None:
    """Each collective's transfer at nccl-tests' bus bandwidth for its collective and size: bytes x the bus
    factor of its ranks / busbw; None when no collective has a curve."""
    slack, changed = s0.copy(), False
    for node, (op, n, size) in p.graph.collective_of.items():
        name = NCCL_TESTS_NAMES.get(op.lower())
        curve = curves.get(name) if name else None
        if curve is None or not size or p.slack_kind[node] != CODE[PathKind.COMMUNICATION]:
            continue
        a, b = BUSBW_FACTORS[op.lower()]
        busbw = curve.at(size)
        if busbw > 0:
            slack[node] = int(size * (a * (n - 1) / n + b) / busbw)  # bytes / (GB/s) = ns
            changed = True
    return slack if changed else None


def _scenarios(p: Prepared, speedups: Sequence[Speedup] = (),
               curves: Mapping[str, Curve] | None = None) -> dict[str, tuple[np.ndarray, np.ndarray, int | None]]:
    """Each scenario's edge weights (graph order), node slacks, and the rank it changes alone (or None)."""
    g = p.graph
    w0, s0 = g.w.astype(np.int64, copy=False), p.slack.astype(np.int64, copy=False)
    comm_e, comm_n = g.kind == CODE[PathKind.COMMUNICATION], p.slack_kind == CODE[PathKind.COMMUNICATION]
    # the transfer of a collective is the slack of its end; an unmatched communication op's weight is its duration
    comm_e = comm_e & g.on_device[g.dst]
    out: dict[str, tuple[np.ndarray, np.ndarray, int | None]] = {Scenario.AS_MEASURED: (w0, s0, None)}
    out[Scenario.COMMUNICATION_OVERLAPPED] = (np.where(comm_e, 0, w0), np.where(comm_n, 0, s0), None)
    out[Scenario.BANDWIDTH_X2] = (np.where(comm_e, w0 // 2, w0), np.where(comm_n, s0 // 2, s0), None)
    compute = (g.kind == CODE[PathKind.COMPUTE]) & g.on_device[g.dst]
    out[Scenario.COMPUTE_X2] = (np.where(compute, w0 // 2, w0), s0, None)
    launch_e, launch_n = g.kind == CODE[PathKind.LAUNCH], p.slack_kind == CODE[PathKind.LAUNCH]
    out[Scenario.NO_LAUNCH_OVERHEAD] = (np.where(launch_e, 0, w0), np.where(launch_n, 0, s0), None)
    # twice the ranks: a transfer of n ranks takes ring(2n) / ring(n) as long (docs/analyses.md, "Critical path")
    scaled_slack = s0.astype(np.float64)
    for node, (op, n, _) in g.collective_of.items():
        if p.slack_kind[node] == CODE[PathKind.COMMUNICATION] and n > 1:
            scaled_slack[node] *= ring_growth(op, n)
    out[Scenario.RANKS_X2] = (w0, scaled_slack.astype(np.int64, copy=False), None)
    # the slowest rank's own work at the median rank's pace, kind by kind (host and device apart)
    edge_rank = g.rank[g.dst]
    ranks = np.arange(len(g.ranks))
    own = [(kind, g.on_device[g.dst] == device) for kind in (PathKind.COMPUTE, PathKind.HOST, PathKind.MEMORY)
           for device in (True, False)]
    masks = [(g.kind == CODE[kind]) & where for kind, where in own]
    work = np.array([[w0[m & (edge_rank == r)].sum() for r in ranks] for m in masks], np.float64)
    # only ranks with work of their own count: a trace of the run without ops (an NCCL log beside a rank's
    # profile) is no rank to compare with, and one working rank has no median to be brought to
    working = work.sum(axis=0) > 0
    if working.sum() > 1:
        slowest = int(work.sum(axis=0).argmax())
        w = w0.copy()
        for m, per_rank in zip(masks, work, strict=True):
            if per_rank[slowest] > 0:
                factor = min(1.0, float(np.median(per_rank[working])) / per_rank[slowest])
                scaled = m & (edge_rank == slowest)
                w[scaled] = (w0[scaled] * factor).astype(np.int64, copy=False)
        out[Scenario.SLOWEST_RANK_AT_MEDIAN] = (w, s0, g.ranks[slowest][1])
    measured_bandwidth = _nccl_tests(p, curves, s0) if curves else None
    if measured_bandwidth is not None:
        out[Scenario.NCCL_TESTS_BANDWIDTH] = (w0, measured_bandwidth, None)
    for speedup in speedups:
        out[speedup.scenario] = _speedup(p, speedup, w0, s0)
    return out


#: Collectives whose ring transfer moves (n - 1) / n of the data per rank (all-reduce counts it twice, which
#: cancels in a ratio); the others (broadcast, reduce, send/recv) move the same bytes at any size.
RING_SCALED = ("allreduce", "all_reduce", "allgather", "all_gather", "_allgather_base", "reduce_scatter",
               "_reduce_scatter_base", "all_to_all", "alltoall", "all_to_allv", "alltoall_base")


def ring_growth(collective: str, ranks: int) -> float:
    """How much longer a collective's transfer takes with twice ``ranks`` at the same bus bandwidth."""
    name = collective.lower()
    if not any(name.startswith(op) for op in RING_SCALED):
        return 1.0
    return ((2 * ranks - 1) / (2 * ranks)) / ((ranks - 1) / ranks)


def analyse(ranks: list[RankInput], speedups: Sequence[Speedup] = (),
            curves: Mapping[str, Curve] | None = None) -> CriticalPaths:
    """Critical paths and what-if answers of one run (its ranks' rows; clocks comparable across ranks), with a
    scenario per asked-for speedup besides the standard ones, and one at nccl-tests' bandwidth where ``curves``
    (:func:`tracelake.analysis.nccl.bandwidth_curves`) cover its collectives."""
    if not ranks:
        return _empty()
    graph = build(ranks)
    if not len(graph.t):
        return _empty(graph.dropped)
    p = prepare(graph)
    labels = graph.labels
    rank_of = [r for _, r in graph.ranks]
    path_rows: list[tuple[object, ...]] = []
    step_rows: list[tuple[object, ...]] = []
    what_rows: list[tuple[object, ...]] = []
    measured: dict[int, int] = {}
    for scenario, (w, slack, changed) in _scenarios(p, speedups, curves).items():
        ws, sl = w[p.edge].astype(np.int64, copy=False), slack.astype(np.int64, copy=False)
        for step in p.orders:
            t, choice = p.replay(step, ws, sl)
            start, end, stretches = p.walk(step, t, choice, ws)
            p.restore(step)
            by_kind = _by_kind(stretches)
            step_value = None if step < 0 else step
            if scenario == Scenario.AS_MEASURED:
                spanned = graph.t[p.on_ranks[step]]
                measured[step] = int(spanned.max() - spanned.min())
                path_rows.extend(_merged(step_value, stretches, labels, graph.ranks, graph.group_of))
                per_rank: dict[int, int] = {}
                for rank, _, _, _, dur, _ in stretches:
                    per_rank[rank] = per_rank.get(rank, 0) + dur
                bounding = max(per_rank, key=lambda r: per_rank[r]) if per_rank else -1
                ranks_in = len(np.unique(graph.rank[p.on_ranks[step]]))
                step_rows.append((step_value, ranks_in, measured[step], end - start,
                                  _pct(end - start - measured[step], measured[step]),
                                  rank_of[bounding] if bounding >= 0 else None, *by_kind))
            what_rows.append((step_value, str(scenario), changed, measured[step], end - start,
                              measured[step] - (end - start),
                              _pct(measured[step] - (end - start), measured[step]), *by_kind))
    return CriticalPaths(
        path=pl.DataFrame(path_rows, schema=_schema(PATH_COLUMNS), orient="row"),
        steps=pl.DataFrame(step_rows, schema=_schema(STEP_COLUMNS), orient="row"),
        what_if=pl.DataFrame(what_rows, schema=_schema(WHAT_IF_COLUMNS), orient="row"),
        dropped_edges=graph.dropped,
    )


def _pct(part: int, whole: int) -> float | None:
    return round(100.0 * part / whole, 3) if whole > 0 else None


def _by_kind(stretches: list[Stretch]) -> list[int]:
    sums = [0] * len(PATH_KINDS)
    for _, kind, _, _, dur, _ in stretches:
        sums[kind] += dur
    return sums


def _merged(step: int | None, stretches: list[Stretch], labels: list[str], ranks: list[tuple[str, int]],
            group_of: dict[int, str]) -> list[tuple[object, ...]]:
    """Neighbouring stretches of one rank, kind and name joined; rows of :data:`PATH_COLUMNS`."""
    rows: list[list[object]] = []
    for rank, kind, label, start, dur, node in stretches:
        group = group_of.get(node)
        name = labels[label] if label >= 0 else UNEXPLAINED
        trace, who = ranks[rank] if rank >= 0 else (None, None)
        last = rows[-1] if rows else None
        if last and last[3] == trace and last[2] == who and last[4] == _CODE_KIND[kind] and last[5] == name \
                and last[6] == group:
            last[8] = int(last[8]) + dur  # type: ignore[call-overload]
            continue
        rows.append([step, len(rows), who, trace, str(_CODE_KIND[kind]), name, group, start, dur])
    return [tuple(r) for r in rows]


_TYPES: dict[str, Callable[[], pl.DataType]] = {
    "scenario": pl.String, "trace_id": pl.String, "kind": pl.String, "name": pl.String, "process_group": pl.String,
    "residual_pct": pl.Float64,
    "saving_pct": pl.Float64, "rank": pl.Int32, "bounding_rank": pl.Int32, "ranks": pl.Int32, "changed_rank": pl.Int32,
}


def _schema(columns: tuple[str, ...]) -> dict[str, pl.DataType]:
    return {c: _TYPES.get(c, pl.Int64)() for c in columns}


def _empty(dropped: int = 0) -> CriticalPaths:
    return CriticalPaths(pl.DataFrame(schema=_schema(PATH_COLUMNS)), pl.DataFrame(schema=_schema(STEP_COLUMNS)),
                         pl.DataFrame(schema=_schema(WHAT_IF_COLUMNS)), dropped)


#: What each scenario changes, in words for findings and the CLI.
WORDS = {
    Scenario.AS_MEASURED: "as measured (the graph replayed unchanged)",
    Scenario.COMMUNICATION_OVERLAPPED: "communication fully overlapped",
    Scenario.BANDWIDTH_X2: "collective bandwidth doubled",
    Scenario.COMPUTE_X2: "compute kernels twice as fast",
    Scenario.NO_LAUNCH_OVERHEAD: "no launch overhead (as in a CUDA graph)",
    Scenario.SLOWEST_RANK_AT_MEDIAN: "the slowest rank at the median rank's pace",
    Scenario.RANKS_X2: "twice the ranks (same work per rank)",
    Scenario.NCCL_TESTS_BANDWIDTH: "collectives at the bus bandwidth nccl-tests measured",
}
#: Scenarios that are fixes someone can make (a faster GPU is not a finding).
FIXES = (Scenario.COMMUNICATION_OVERLAPPED, Scenario.BANDWIDTH_X2, Scenario.NO_LAUNCH_OVERHEAD,
         Scenario.SLOWEST_RANK_AT_MEDIAN)
#: A what-if is a finding when it saves at least this share of the measured steps.
MIN_SAVING_SHARE = 0.01
TOTAL_COLUMNS = ("scenario", "steps", "measured_ns", "predicted_ns", "saving_ns", "saving_pct")


def totals(what_if: pl.DataFrame) -> pl.DataFrame:
    """Per scenario, over every step: measured and predicted time, the saving and its share (:data:`TOTAL_COLUMNS`)."""
    if what_if.is_empty():
        return pl.DataFrame(schema=_schema(TOTAL_COLUMNS))
    keys = [c for c in ("run", "scenario") if c in what_if.columns]
    changed = [pl.col("changed_rank").first()] if "changed_rank" in what_if.columns else []
    out = what_if.group_by(keys, maintain_order=True).agg(
        pl.len().cast(pl.Int64).alias("steps"), pl.col("measured_ns").sum(), pl.col("predicted_ns").sum(), *changed)
    return out.with_columns((pl.col("measured_ns") - pl.col("predicted_ns")).alias("saving_ns")).with_columns(
        pl.when(pl.col("measured_ns") > 0)
        .then((100 * pl.col("saving_ns") / pl.col("measured_ns")).round(3)).alias("saving_pct"))


def what_if_findings(what_if: pl.DataFrame, traces: tuple[str, ...], ranks: tuple[int, ...]) -> list[Finding]:
    """The fixes whose replay shortens the steps by at least :data:`MIN_SAVING_SHARE`, largest first."""
    found: list[Finding] = []
    for row in totals(what_if).iter_rows(named=True):
        if row["scenario"] not in FIXES or row["measured_ns"] <= 0:  # asked-for speedups are answers, not findings
            continue
        scenario = Scenario(row["scenario"])
        saving = int(row["saving_ns"])
        if saving < MIN_SAVING_SHARE * row["measured_ns"]:
            continue
        steps = int(row["steps"])
        found.append(Finding(
            f"what_if_{scenario}",
            f"with {WORDS[scenario]}, steps would take {row['saving_pct']:.0f}% less",
            f"replaying the dependency graph of {steps} step{'s' if steps != 1 else ''} across {rank_words(ranks) if ranks else 'every rank'} "
            f"with {WORDS[scenario]} "
            f"gives {row['predicted_ns'] / steps / 1e6:,.1f} ms per step against "
            f"{row['measured_ns'] / steps / 1e6:,.1f} ms measured: {saving / steps / 1e6:,.1f} ms per step",
            saving, traces=traces, ranks=ranks,
        ))
    return sorted(found, key=lambda f: -f.gain_ns)


#: Findings whose gain is an upper bound that a scenario's replay answers.
ANSWERED_BY = {"exposed_communication": Scenario.COMMUNICATION_OVERLAPPED,
               "straggler": Scenario.SLOWEST_RANK_AT_MEDIAN, "short_kernels": Scenario.NO_LAUNCH_OVERHEAD}


def with_replay(found: list[Finding], what_if: pl.DataFrame, traces: tuple[str, ...],
                ranks: tuple[int, ...]) -> list[Finding]:
    """Findings with the replay's answers: upper bounds replaced, and the fixes no finding named yet added.

    An upper bound (exposed communication counts the time a rank waits for others inside a
    collective, which overlapping does not remove; a straggler's lateness; launch calls) becomes
    the saving the replay predicts for its fix, never more than the bound, and says so.
    """
    answers = {Scenario(r["scenario"]): r for r in totals(what_if).iter_rows(named=True) if r["scenario"] in
               set(Scenario)}
    covered: set[Scenario] = set()
    out: list[Finding] = []
    for f in found:
        scenario = ANSWERED_BY.get(f.kind)
        changed = answers[scenario].get("changed_rank") if scenario in answers else None
        if scenario is not None and scenario in answers and (changed is None or f.ranks == (changed,)):
            row = answers[scenario]
            steps, saving = max(int(row["steps"]), 1), max(int(row["saving_ns"]), 0)
            covered.add(scenario)
            f = replace(f, gain_ns=min(f.gain_ns, saving), detail=(
                f"{f.detail}; replaying the {steps} step{'s' if steps != 1 else ''} with {WORDS[scenario]} saves "
                f"{saving / steps / 1e6:,.1f} ms per step ({row['saving_pct'] or 0:.1f}%)"))
        out.append(f)
    return out + [f for f in what_if_findings(what_if, traces, ranks)
                  if Scenario(f.kind.removeprefix("what_if_")) not in covered]
