"""Findings in plain words, each with an upper bound on what fixing it would save.

Pure functions over analysis results (polars frames in, findings out). The
estimated gain is per rank and whole trace: time that would disappear from the
timeline if the cause were removed entirely, so a reader knows what to attack first.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import polars as pl

from .nccl import LOW_SHARE


@dataclass(frozen=True)
class Finding:
    """One thing worth fixing."""

    kind: str
    title: str
    detail: str
    #: Upper bound of the saving on the worst rank's timeline, ns.
    gain_ns: int

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict."""
        return asdict(self)


def _ms(ns: float) -> str:
    return f"{ns / 1e6:,.1f} ms"


def from_breakdown(whole: pl.DataFrame) -> list[Finding]:
    """Exposed communication and idle time, from the whole-trace breakdown rows of one job or trace."""
    findings: list[Finding] = []
    if whole.is_empty():
        return findings
    comm = int(whole["communication_ns"].sum())
    exposed = int(whole["exposed_communication_ns"].sum())
    if comm > 0 and exposed > 0:
        worst = whole.sort("exposed_communication_ns", descending=True).row(0, named=True)
        findings.append(Finding(
            "exposed_communication",
            f"{100 * exposed / comm:.0f}% of communication is exposed",
            f"nothing overlaps {_ms(exposed / whole.height)} of communication per rank on average; "
            f"worst is rank {worst['rank']} with {_ms(worst['exposed_communication_ns'])} "
            f"({100 * worst['exposed_communication_ns'] / max(worst['span_ns'], 1):.0f}% of its span)",
            int(worst["exposed_communication_ns"]),
        ))
    span = int(whole["span_ns"].sum())
    idle = int(whole["idle_ns"].sum())
    if span > 0 and idle > 0:
        worst = whole.sort("idle_ns", descending=True).row(0, named=True)
        findings.append(Finding(
            "idle",
            f"devices are idle {100 * idle / span:.0f}% of the time",
            f"rank {worst['rank']} is idle {_ms(worst['idle_ns'])} "
            f"({100 * worst['idle_ns'] / max(worst['span_ns'], 1):.0f}% of its span)",
            int(worst["idle_ns"]),
        ))
    return findings


#: A straggler is reported only when its lateness adds up to this share of a rank's span...
MIN_GAIN_SHARE = 0.001
#: ...and it arrives at least this late on average.
MIN_SKEW_NS = 10_000


def from_last_arrivals(arrivals: pl.DataFrame, ranks: int, whole: pl.DataFrame | None = None) -> list[Finding]:
    """A straggler: a rank that starts collectives last far more often than 1/n of the time.

    With the whole-trace breakdown, the evidence adds the straggler's compute time
    against the median rank's (more compute points at the rank's own work; equal
    compute points at its host, data loading or hardware).
    """
    if arrivals.is_empty() or ranks < 2:
        return []
    top = arrivals.row(0, named=True)
    total = int(top["collectives"])
    share = top["times_last"] / max(total, 1)
    if share <= 2 / ranks:
        return []
    skew_ns = float(top["mean_skew_us"] or 0) * 1e3
    if skew_ns < MIN_SKEW_NS:
        return []  # microseconds apart: clock noise, not a straggler
    if whole is not None and not whole.is_empty():
        span = whole.select(pl.col("span_ns").cast(pl.Float64).median()).item() or 0
        if skew_ns * top["times_last"] < MIN_GAIN_SHARE * span:
            return []  # arrival order within noise: nobody is really waiting
    evidence = ""
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
    )]


def from_launches(launches: pl.DataFrame) -> list[Finding]:
    """Kernels shorter than their own launch call: candidates for fusion or CUDA graphs."""
    if launches.is_empty():
        return []
    per_rank = launches.group_by("rank").agg(
        pl.col("launches").sum(), pl.col("shorter_than_launch").sum(), pl.col("launch_overhead_ns").sum()
    )
    worst = per_rank.sort("launch_overhead_ns", descending=True, nulls_last=True).row(0, named=True)
    if not worst["shorter_than_launch"]:
        return []
    return [Finding(
        "short_kernels",
        f"{worst['shorter_than_launch']} of {worst['launches']} kernels on rank {worst['rank']} "
        "are shorter than their launch",
        f"their launch calls take {_ms(worst['launch_overhead_ns'] or 0)}; fusing them or capturing them "
        "in a CUDA graph removes that host time",
        int(worst["launch_overhead_ns"] or 0),
    )]


def from_step_outliers(outliers: pl.DataFrame) -> list[Finding]:
    """Steps far slower than their rank's typical step (data stalls, GC, checkpoints, recompiles)."""
    if outliers.is_empty():
        return []
    worst = outliers.row(0, named=True)
    return [Finding(
        "slow_steps",
        f"{outliers.height} step(s) run far slower than usual",
        f"step {worst['step']} on rank {worst['rank']} took {_ms(worst['dur_ns'])}, "
        f"{_ms(worst['excess_ns'])} more than the rank's median step",
        int(worst["excess_ns"]),
    )]


def rank(findings: list[Finding]) -> list[Finding]:
    """Findings ordered by estimated gain, largest first; a hang (no gain to estimate: nothing moves) first of all."""
    return sorted(findings, key=lambda f: (f.kind != "hang", -f.gain_ns))


def from_nccl_benchmarks(summary: pl.DataFrame) -> list[Finding]:
    """nccl-tests runs whose bus bandwidth peaks well under what their link carries."""
    if summary.is_empty():
        return []
    low = summary.filter(~pl.col("in_place") & (pl.col("peak_share_pct") < 100 * LOW_SHARE))
    return [
        Finding(
            "low_bus_bandwidth",
            f"{row['collective']} peaks at {row['peak_busbw_gbs']:,.1f} GB/s bus bandwidth, "
            f"{row['peak_share_pct']:.0f}% of {row['link']}",
            f"nccl-tests over {row['ranks']} ranks on {row['nodes']} node(s) reaches at most "
            f"{row['peak_busbw_gbs']:,.1f} GB/s (at {row['peak_at_bytes']:,} bytes) where {row['link']} carries about "
            f"{row['link_peak_gbs']:,.0f} GB/s: check the transport (NCCL_DEBUG=INFO shows it), the topology "
            "and NCCL_ALGO/NCCL_PROTO settings",
            0,
        )
        for row in low.to_dicts()
    ]


def from_lagging_ranks(lagging: pl.DataFrame) -> list[Finding]:
    """Ranks behind the rest of their process group in Flight Recorder dumps: the likely cause of a hang."""
    if lagging.is_empty():
        return []
    worst = lagging.row(0, named=True)
    ahead = lagging.filter(pl.col("process_group") == worst["process_group"])
    ranks = ", ".join(str(r) for r in ahead["rank"].to_list())
    return [Finding(
        "hang",
        f"rank{'s' if ahead.height > 1 else ''} {ranks} stopped behind process group {worst['process_group']}",
        f"Flight Recorder: the group enqueued collectives up to seq {worst['group_enqueued']}, but rank "
        f"{worst['rank']} completed only up to {worst['last_completed']}: it is stuck in (or never reached) "
        f"seq {(worst['last_completed'] or 0) + 1}; look at what that rank was doing (its stack, its data loader, "
        "its GPU)",
        0,
    )]


def from_unreached(unreached: pl.DataFrame) -> list[Finding]:
    """Ranks whose NCCL records stop before the others' (Inspector, debug logs): hung, crashed or cut short."""
    if unreached.is_empty():
        return []
    worst = unreached.row(0, named=True)
    behind = unreached.filter(pl.col("process_group") == worst["process_group"])
    ranks = ", ".join(str(r) for r in behind["rank"].to_list())
    return [Finding(
        "hang",
        f"rank{'s' if behind.height > 1 else ''} {ranks} never reached collective {worst['group_last_seq']} "
        f"of communicator {worst['process_group']}",
        f"NCCL's records: other ranks of the communicator reached collective {worst['group_last_seq']}, but "
        f"rank {worst['rank']}'s last one is {worst['last_seq']} ({worst['behind']} behind): it hung, crashed or "
        "its records were cut short; if the job hung, look at what that rank was doing (its stack, its data "
        "loader, its GPU)",
        0,
    )]


def from_topology(topology: pl.DataFrame) -> list[Finding]:
    """Transport surprises in NCCL's topology (socket where IB exists, SHM inside a node, no GDRDMA)."""
    return [
        Finding("transport", f"NCCL transport: {surprise}",
                f"{row['ranks']} ranks on {row['nodes']} node(s), transports {row['transports']}; check "
                "NCCL_IB_HCA / NCCL_SOCKET_IFNAME / NCCL_P2P_DISABLE and the NCCL INFO lines of the init", 0)
        for row in topology.filter(pl.col("surprises").is_not_null()).to_dicts()
        for surprise in str(row["surprises"]).split("; ")
    ]
