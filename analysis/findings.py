"""Findings in plain words, each with an upper bound on what fixing it would save.

Pure functions over analysis results (polars frames in, findings out). The
estimated gain is per rank and whole trace: time that would disappear from the
timeline if the cause were removed entirely, so a reader knows what to attack first.
Every finding names the traces and ranks it was measured on, and :func:`rank`
caps its gain at their span (docs/analyses.md, "Findings").
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

import polars as pl



@dataclass(frozen=True)
class Finding:
    """One thing worth fixing."""

    kind: str
    title: str
    detail: str
    #: Upper bound of the saving on the worst rank's timeline, ns; never above the span of what it names.
    gain_ns: int
    #: Ids of the traces it was measured on (filled from ``ranks`` by :func:`bound` where left empty).
    traces: tuple[str, ...] = ()
    #: Ranks it was measured on (filled from ``traces`` by :func:`bound` where left empty).
    ranks: tuple[int, ...] = ()
    #: The estimate before :func:`bound` capped it at that span; None when it was within it.
    uncapped_gain_ns: int | None = None

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict."""
        return {**asdict(self), "traces": list(self.traces), "ranks": list(self.ranks)}


def _ms(ns: float) -> str:
    return f"{ns / 1e6:,.1f} ms"


def rank_words(ranks: tuple[int, ...] | list[int]) -> str:
    """``rank 3``, ``ranks 1, 3`` or ``ranks 0-7`` (a run of three or more consecutive ranks)."""
    values = sorted(set(ranks))
    if len(values) == 1:
        return f"rank {values[0]}"
    if len(values) > 2 and values[-1] - values[0] == len(values) - 1:
        return f"ranks {values[0]}-{values[-1]}"
    return "ranks " + ", ".join(str(r) for r in values)


def _matters(gain_ns: int | None, span_ns: int | None) -> bool:
    """A gain worth a finding: at least :data:`MIN_GAIN_SHARE` of the span it was measured on."""
    return bool(gain_ns) and int(gain_ns or 0) >= MIN_GAIN_SHARE * int(span_ns or 0)


def from_breakdown(whole: pl.DataFrame) -> list[Finding]:
    """Exposed communication and idle time, from the whole-trace breakdown rows of one job or trace.

    Each is reported when its worst rank's figure is at least :data:`MIN_GAIN_SHARE` of that rank's
    span (a 0.0 ms "finding" is noise, not a thing to fix).
    """
    findings: list[Finding] = []
    if whole.is_empty():
        return findings
    comm = int(whole["communication_ns"].sum())
    exposed = int(whole["exposed_communication_ns"].sum())
    worst = whole.sort("exposed_communication_ns", descending=True).row(0, named=True)
    if comm > 0 and exposed > 0 and _matters(worst["exposed_communication_ns"], worst["span_ns"]):
        findings.append(Finding(
            "exposed_communication",
            f"{100 * exposed / comm:.0f}% of communication is exposed",
            f"nothing overlaps {_ms(exposed / whole.height)} of communication per rank on average; "
            f"worst is rank {worst['rank']} with {_ms(worst['exposed_communication_ns'])} "
            f"({100 * worst['exposed_communication_ns'] / max(worst['span_ns'], 1):.0f}% of its span)",
            int(worst["exposed_communication_ns"]),
            traces=(str(worst["trace_id"]),), ranks=(int(worst["rank"]),),
        ))
    span = int(whole["span_ns"].sum())
    idle = int(whole["idle_ns"].sum())
    worst = whole.sort("idle_ns", descending=True).row(0, named=True)
    if span > 0 and idle > 0 and _matters(worst["idle_ns"], worst["span_ns"]):
        findings.append(Finding(
            "idle",
            f"devices are idle {100 * idle / span:.0f}% of the time",
            f"rank {worst['rank']} is idle {_ms(worst['idle_ns'])} "
            f"({100 * worst['idle_ns'] / max(worst['span_ns'], 1):.0f}% of its span)",
            int(worst["idle_ns"]),
            traces=(str(worst["trace_id"]),), ranks=(int(worst["rank"]),),
        ))
    return findings


#: A straggler is reported only when its lateness adds up to this share of a rank's span...
MIN_GAIN_SHARE = 0.001
#: ...and it arrives at least this late on average.
MIN_SKEW_NS = 10_000
#: A rank is a straggler when it starts last at more than twice the share chance gives (2/ranks), and
#: with 2 or 3 ranks, where twice chance is 1 or near it, at more than this share.
STRAGGLER_SHARE = 0.6


def from_last_arrivals(arrivals: pl.DataFrame, ranks: int, whole: pl.DataFrame | None = None) -> list[Finding]:
    """A straggler: a rank that starts collectives last far more often than 1/n of the time (:data:`STRAGGLER_SHARE`).

    With the whole-trace breakdown, the evidence adds the straggler's compute time
    against the median rank's (more compute points at the rank's own work; equal
    compute points at its host, data loading or hardware).
    """
    if arrivals.is_empty() or ranks < 2:
        return []
    top = arrivals.row(0, named=True)
    total = int(top["collectives"])
    share = top["times_last"] / max(total, 1)
    if share <= min(2 / ranks, STRAGGLER_SHARE):  # twice chance; with 2 or 3 ranks chance is too close to 1
        return []
    skew_ns = float(top["mean_skew_us"] or 0) * 1e3
    if skew_ns < MIN_SKEW_NS:
        return []  # microseconds apart: clock noise, not a straggler
    if whole is not None and not whole.is_empty():
        span = whole.select(pl.col("span_ns").cast(pl.Float64).median()).item() or 0
        if skew_ns * top["times_last"] < MIN_GAIN_SHARE * span:
            return []  # arrival order within noise: nobody is really waiting
    evidence = ""
    traces: tuple[str, ...] = ()
    if whole is not None and not whole.is_empty():
        traces = tuple(sorted(whole.filter(pl.col("rank") == top["rank"])["trace_id"].cast(pl.String).unique()))
    if whole is not None and whole.height > 1:
        mine = whole.filter(pl.col("rank") == top["rank"])
        median = whole.select(pl.col("compute_ns").cast(pl.Float64).median()).item()
        if mine.height and median:
            ratio = float(mine["compute_ns"][0]) / float(median)
            evidence = f"; its compute time is {100 * (ratio - 1):+.0f}% against the median rank"
    return [Finding(
        "straggler",
        f"rank {top['rank']} arrives last at {100 * share:.0f}% of collectives",
        f"{top['times_last']} of {total} collectives start last on rank {top['rank']}, "
        f"{_ms(skew_ns)} after the first rank on average: every other rank waits for it{evidence}",
        int(skew_ns * top["times_last"]),
        traces=traces, ranks=(int(top["rank"]),),
    )]


def from_idle(idle: pl.DataFrame, whole: pl.DataFrame) -> list[Finding]:
    """Host-bound idle on each rank's busiest stream, capped by the rank's idle time.

    Gaps on other streams (a communication stream between collectives, say) are
    idle by design and are left out.
    """
    if idle.is_empty() or whole.is_empty():
        return []
    main = idle.sort("op_ns", descending=True).group_by("trace_id", maintain_order=True).first()
    rank_idle = whole.select("trace_id", pl.col("idle_ns").alias("rank_idle_ns"))
    main = main.join(rank_idle, on="trace_id").with_columns(
        pl.min_horizontal("host_wait_ns", "rank_idle_ns").alias("gain_ns")
    )
    worst = main.sort("gain_ns", descending=True).row(0, named=True)
    gaps = int(main["idle_ns"].sum())
    host_wait = int(main["host_wait_ns"].sum())
    if worst["gain_ns"] <= 0 or gaps <= 0:
        return []
    return [Finding(
        "host_wait",
        f"the busiest stream waits for the host in {100 * host_wait / gaps:.0f}% of its idle gaps",
        f"on rank {worst['rank']}, stream {worst['stream']} sits {_ms(worst['host_wait_ns'])} idle until the CPU "
        "launches the next op (launch-bound: Python overhead, data loading, host synchronisation)",
        int(worst["gain_ns"]),
        traces=(str(worst["trace_id"]),), ranks=(int(worst["rank"]),),
    )]


def from_launches(launches: pl.DataFrame, whole: pl.DataFrame | None = None) -> list[Finding]:
    """Kernels launched one by one that are shorter than their own launch call: candidates for fusion or CUDA graphs.

    Kernels a graph launch started are already in a CUDA graph: they are never counted here, and
    the detail says how many there were (docs/analyses.md, "Launches", "CUDA/HIP graphs"). The gain
    is the host time of the counted launch calls, each call once, and with the whole-trace breakdown
    ``whole`` no more than the rank's device idle time: host time saved can only fill the device's
    idle gaps, the device's own work stays (:func:`bound` caps it at the span as well).
    """
    if launches.is_empty():
        return []
    graphs = [pl.col(c).fill_null(0).sum() if c in launches.columns else pl.lit(0, dtype=pl.Int64).alias(c)
              for c in ("graph_launches", "graph_kernels")]  # launch_stats stored before graphs were modelled
    # Per trace and rank: two runs of one rank are two timelines, and a saving is on one of them.
    per_rank = launches.group_by("trace_id", "rank").agg(
        pl.col("launches").sum(), pl.col("shorter_than_launch").sum(), pl.col("launch_overhead_ns").sum(), *graphs,
    )
    per_rank = per_rank.with_columns(pl.col("launch_overhead_ns").fill_null(0).alias("gain_ns"))
    if whole is not None and not whole.is_empty():
        idle = whole.select("trace_id", "rank", pl.col("idle_ns").alias("rank_idle_ns"))
        per_rank = per_rank.join(idle, on=["trace_id", "rank"], how="left").with_columns(
            pl.min_horizontal("gain_ns", pl.col("rank_idle_ns").fill_null(pl.col("gain_ns"))).alias("gain_ns"))
    worst = per_rank.sort("gain_ns", descending=True, nulls_last=True).row(0, named=True)
    if not worst["shorter_than_launch"]:
        return []
    capped = ""
    if worst["gain_ns"] < (worst["launch_overhead_ns"] or 0):
        capped = f"; the device is idle only {_ms(worst['gain_ns'])} on that rank, so that is the most it can save"
    in_graphs = ""
    if worst["graph_kernels"]:
        calls = worst["graph_launches"]
        in_graphs = (f"; {worst['graph_kernels']} more kernels were started by {calls} CUDA graph launch"
                     f"{'es' if calls != 1 else ''}: already in a CUDA graph, not counted")
    return [Finding(
        "short_kernels",
        f"{worst['shorter_than_launch']} of {worst['launches']} kernels launched one by one on rank {worst['rank']} "
        "are shorter than their launch",
        f"their launch calls take {_ms(worst['launch_overhead_ns'] or 0)} of host time; fusing them, or capturing "
        f"them in a CUDA/HIP graph where the device has graphs, removes that host time{in_graphs}{capped}",
        int(worst["gain_ns"]),
        traces=(str(worst["trace_id"]),), ranks=(int(worst["rank"]),),
    )]


#: Gaps inside CUDA graphs are reported from this share of the graphs' span on: a few microseconds
#: between dependent kernels are normal.
GRAPH_GAP_SHARE = 0.1


def from_graphs(graphs: pl.DataFrame) -> list[Finding]:
    """Idle gaps inside CUDA/HIP graphs: device time a graph launch holds but does not use.

    The gain is the worst rank's summed ``gaps_ns`` over its graph launches (docs/analyses.md,
    "Launches", "CUDA/HIP graphs"): what would leave its timeline if the graph's kernels ran back
    to back. Nothing here advises capturing a graph: these kernels are in one already.
    """
    if graphs.is_empty() or "gaps_ns" not in graphs.columns:
        return []
    per_rank = graphs.group_by("rank").agg(
        pl.len().alias("launches"), pl.col("kernels").sum(), pl.col("gaps_ns").sum(), pl.col("span_ns").sum(),
        pl.col("trace_id").unique().sort())
    worst = per_rank.sort("gaps_ns", descending=True, nulls_last=True).row(0, named=True)
    if not worst["span_ns"] or worst["gaps_ns"] < GRAPH_GAP_SHARE * worst["span_ns"]:
        return []
    share = 100 * worst["gaps_ns"] / worst["span_ns"]
    return [Finding(
        "graph_gaps",
        f"CUDA graphs on rank {worst['rank']} leave the device idle {share:.0f}% of their span",
        f"{worst['launches']} graph launch{'es' if worst['launches'] != 1 else ''} ({worst['kernels']} kernels, "
        f"already in a CUDA graph) span {_ms(worst['span_ns'])} with {_ms(worst['gaps_ns'])} of gaps between "
        "their kernels: dependencies, host callbacks or memcpy nodes inside the graph; fewer, larger kernels "
        "(fusion) or parallel branches shorten them",
        int(worst["gaps_ns"]),
        traces=(str(worst["trace_id"]),), ranks=(int(worst["rank"]),),
    )]


def _trace_of(row: dict[str, Any]) -> tuple[str, ...]:
    return (str(row["trace_id"]),) if row.get("trace_id") is not None else ()


def from_step_outliers(outliers: pl.DataFrame) -> list[Finding]:
    """Steps far slower than their rank's typical step (data stalls, GC, checkpoints, recompiles).

    A slow first step (``warmup``, docs/analyses.md "Steps") is a warm-up, not a slow step: it is
    named as such, with no gain, and never counted among the outliers.
    """
    if outliers.is_empty():
        return []
    warm = outliers.filter(pl.col("warmup")) if "warmup" in outliers.columns else outliers.clear()
    slow = outliers.filter(~pl.col("warmup")) if "warmup" in outliers.columns else outliers
    found = []
    if not slow.is_empty():
        worst = slow.row(0, named=True)
        found.append(Finding(
            "slow_steps",
            f"{slow.height} step(s) run far slower than usual",
            f"step {worst['step']} on rank {worst['rank']} took {_ms(worst['dur_ns'])}, "
            f"{_ms(worst['excess_ns'])} more than the rank's median step",
            int(worst["excess_ns"]),
            traces=_trace_of(worst), ranks=(int(worst["rank"]),),
        ))
    if not warm.is_empty():
        first = warm.row(0, named=True)
        found.append(Finding(
            "warmup_step",
            f"the first profiled step is a warm-up on {warm['rank'].n_unique()} rank(s)",
            f"step {first['step']} on rank {first['rank']} took {_ms(first['dur_ns'])}, "
            f"{_ms(first['excess_ns'])} more than the rank's median of the later steps (compilation, autotuning, "
            "allocator and caches warming up); it is not counted as a slow step: profile from a later step "
            "(torch.profiler.schedule(skip_first=...)) to leave it out",
            0,
            traces=tuple(sorted({str(t) for t in warm["trace_id"]})) if "trace_id" in warm.columns else (),
            ranks=tuple(sorted({int(r) for r in warm["rank"]})),
        ))
    return found


def rank(findings: list[Finding], spans: pl.DataFrame) -> list[Finding]:
    """Findings bounded by the ``spans`` they were measured on (:func:`bound`), largest gain first.

    A hang (no gain to estimate: nothing moves) comes first of all. ``spans`` is
    :func:`spans` of the same selection: taking it here means no finding reaches a
    reader unbounded.
    """
    return sorted(bound(findings, spans), key=lambda f: (f.kind != "hang", -f.gain_ns))


def spans(whole: pl.DataFrame, traces: pl.DataFrame, collectives: pl.DataFrame | None = None) -> pl.DataFrame:
    """The span of each (trace, rank) of a selection: the most a finding measured on it can save.

    The whole-trace breakdown's ``span_ns`` where the rank has device ops; else the
    trace's ``end_ns - start_ns``; else the extent of the rank's collectives (NCCL debug
    logs record no trace bounds). Columns ``trace_id``, ``rank``, ``span_ns`` (null where
    none is known).
    """
    key = {"trace_id": pl.String, "rank": pl.Int64}
    parts = [whole.select(pl.col("trace_id").cast(pl.String), pl.col("rank").cast(pl.Int64))]
    parts.append(traces.select(pl.col("trace_id").cast(pl.String), pl.col("rank").cast(pl.Int64)))
    if collectives is not None:
        parts.append(collectives.select(pl.col("trace_id").cast(pl.String), pl.col("rank").cast(pl.Int64)))
    pairs = pl.concat(parts).drop_nulls().unique().sort("trace_id", "rank") if parts else pl.DataFrame(schema=key)
    measured = whole.select(pl.col("trace_id").cast(pl.String), pl.col("rank").cast(pl.Int64),
                            pl.col("span_ns").cast(pl.Int64).alias("device_ns"))
    bounds = traces.select(pl.col("trace_id").cast(pl.String),
                           (pl.col("end_ns") - pl.col("start_ns")).cast(pl.Int64).alias("trace_ns")).unique("trace_id")
    out = pairs.join(measured.unique(["trace_id", "rank"]), on=["trace_id", "rank"], how="left")
    out = out.join(bounds, on="trace_id", how="left")
    if collectives is not None and collectives.height:
        extent = collectives.group_by(pl.col("trace_id").cast(pl.String), pl.col("rank").cast(pl.Int64)).agg(
            ((pl.col("ts_ns") + pl.col("dur_ns").fill_null(0)).max() - pl.col("ts_ns").min()).cast(pl.Int64)
            .alias("collective_ns"))
        out = out.join(extent, on=["trace_id", "rank"], how="left")
    else:
        out = out.with_columns(pl.lit(None, dtype=pl.Int64).alias("collective_ns"))
    return out.select("trace_id", "rank", pl.coalesce("device_ns", "trace_ns", "collective_ns").alias("span_ns"))


#: Characters of a trace id that name it in words.
SHORT_ID = 12


def bound(findings: list[Finding], spans: pl.DataFrame) -> list[Finding]:
    """Name each finding's traces and ranks and cap its gain at their span (docs/analyses.md, "Findings").

    The rule: a finding's ``gain_ns`` never exceeds the longest span among the
    (trace, rank) pairs of ``spans`` it names, the timeline it was measured on
    (one that names no trace or rank: the longest span of the selection). A larger
    estimate is capped there, keeping the estimate in ``uncapped_gain_ns`` and
    saying so in its detail; where no span is known, the gain is 0. Empty
    ``traces`` are filled from the ranks, empty ``ranks`` from the traces, and when
    the selection holds several traces the detail names the finding's (first
    :data:`SHORT_ID` characters of the id).
    """
    several = spans["trace_id"].n_unique() > 1 if spans.height else False
    out = []
    for finding in findings:
        mine = spans
        if finding.traces:
            mine = mine.filter(pl.col("trace_id").is_in(list(finding.traces)))
        if finding.ranks:
            mine = mine.filter(pl.col("rank").is_in(list(finding.ranks)))
        traces, ranks = finding.traces, finding.ranks
        if ranks and not traces:
            traces = tuple(sorted(mine["trace_id"].unique().to_list()))
        if traces and not ranks:
            ranks = tuple(sorted(mine["rank"].unique().to_list()))
        detail, gain, uncapped = finding.detail, finding.gain_ns, None
        if several and traces:
            shown = ", ".join(t[:SHORT_ID] for t in traces[:3])
            more = f" and {len(traces) - 3} more" if len(traces) > 3 else ""
            detail += f"; trace{'s' if len(traces) > 1 else ''} {shown}{more}"
        known = mine["span_ns"].drop_nulls()
        limit = int(known.max()) if known.len() else None  # type: ignore[arg-type]
        if gain > 0 and (limit is None or gain > limit):
            uncapped, gain = gain, limit or 0
            where = f"the {_ms(gain)} span it was measured on" if limit is not None else "no known span"
            detail += f" (estimate of {_ms(uncapped)} capped at {where})"
        out.append(replace(finding, detail=detail, gain_ns=gain, traces=traces, ranks=ranks,
                           uncapped_gain_ns=uncapped))
    return out


def from_traces(traces: pl.DataFrame, whole: pl.DataFrame) -> list[Finding]:
    """Traces of host activity with no device op recognised: say so, and what can still be said.

    A CPU-only run, or an accelerator whose events tracelake does not read yet, leaves no
    device timeline: no breakdown, idle or communication finding can exist, and "nothing
    stands out" would mislead (docs/analyses.md, "Findings"). ``traces`` are the
    selection's ``traces`` rows, ``whole`` its whole-trace breakdown (a trace with a row
    there has device ops whatever its counts say).
    """
    needed = {"trace_id", "rank", "host_op_count", "device_op_count"}
    if traces.is_empty() or not needed <= set(traces.columns):
        return []
    measured = whole["trace_id"].cast(pl.String).unique().to_list() if "trace_id" in whole.columns else []
    bare = traces.filter(
        (pl.col("host_op_count").fill_null(0) > 0) & (pl.col("device_op_count").fill_null(0) == 0)
        & ~pl.col("trace_id").cast(pl.String).is_in(measured)
    )
    if bare.is_empty():
        return []
    ranks = tuple(sorted({int(r) for r in bare["rank"].drop_nulls().to_list()}))
    span = (pl.col("end_ns") - pl.col("start_ns")) if {"start_ns", "end_ns"} <= set(bare.columns) else pl.lit(None)
    spans = bare.select(span.cast(pl.Int64).alias("span_ns"))["span_ns"].drop_nulls()
    steps = int(bare["step_count"].fill_null(0).sum()) if "step_count" in bare.columns else 0
    types = sorted({str(t) for t in bare["device_type"].drop_nulls().to_list()}) if "device_type" in bare.columns \
        else []
    what = f"{bare.height} trace{'s' if bare.height > 1 else ''}" + (f" ({rank_words(ranks)})" if ranks else "")
    can_say = [f"{int(bare['host_op_count'].sum()):,} host ops"]
    if spans.len():
        can_say.append(f"host time {_ms(int(spans.max()))}"  # type: ignore[arg-type]
                       + (" on the longest trace" if bare.height > 1 else ""))
    can_say.append(f"{steps:,} profiler steps" if steps else "no profiler steps")
    return [Finding(
        "no_device_ops",
        f"no device op recognised in {what}",
        f"the trace{'s hold' if bare.height > 1 else ' holds'} no GPU, TPU or MTIA op that tracelake reads "
        f"(device type {', '.join(types) or 'unknown'}: a CPU-only run, or an accelerator it does not read yet), "
        "so there is no device time to break down and no device finding can be made; what it can still say: "
        + ", ".join(can_say) + " (host_ops and steps hold them)",
        0,
        traces=tuple(str(t) for t in bare["trace_id"].to_list()), ranks=ranks,
    )]
