"""Findings from NCCL records: nccl-tests bandwidth against the link, hangs, unreached collectives, transports.

Pure functions over the NCCL analyses (:mod:`tracelake.analysis.nccl`), in the words and with the
attribution every finding has (docs/analyses.md, "Findings", "Link peaks").
"""

from __future__ import annotations

import polars as pl

from .findings import Finding, rank_words
from .nccl import LOW_SHARE


def _benchmark_ranks(ranks: int | None) -> str:
    return rank_words(tuple(range(ranks))) if ranks else "ranks not listed in its output"


def _benchmark_where(row: dict) -> str:
    nodes = f" on {row['nodes']} node(s)" if row.get("nodes") else ""
    return f"nccl-tests (trace {str(row['trace_id'])[:8]}) over {_benchmark_ranks(row['ranks'])}{nodes}"


def _benchmark_name(row: dict) -> str:
    collective = row.get("collective")
    return "a benchmark of an unnamed collective" if collective in (None, "unknown") else str(collective)


def from_nccl_benchmarks(summary: pl.DataFrame) -> list[Finding]:
    """nccl-tests runs whose bus bandwidth peaks well under what their link carries, and runs whose link is
    unknown (docs/analyses.md, "Link peaks"): those say so instead of giving a share."""
    if summary.is_empty():
        return []
    low = summary.filter(~pl.col("in_place") & (pl.col("peak_share_pct") < 100 * LOW_SHARE))
    found = [
        Finding(
            "low_bus_bandwidth",
            f"{_benchmark_name(row)} peaks at {row['peak_busbw_gbs']:,.1f} GB/s bus bandwidth, "
            f"{row['peak_share_pct']:.0f}% of {row['link']}",
            f"{_benchmark_where(row)} of {row.get('gpu') or 'unnamed GPUs'} reaches at most "
            f"{row['peak_busbw_gbs']:,.1f} GB/s (at {row['peak_at_bytes']:,} bytes) where {row['link']} carries about "
            f"{row['link_peak_gbs']:,.0f} GB/s: check the transport (NCCL_DEBUG=INFO shows it), the topology "
            "and NCCL_ALGO/NCCL_PROTO settings", 0, traces=(str(row["trace_id"]),), ranks=tuple(range(row["ranks"] or 0)),
        ) for row in low.to_dicts()
    ]
    return found + [Finding(
        "nccl_link_unknown", f"{_benchmark_name(row)} peaks at {row['peak_busbw_gbs']:,.1f} GB/s bus bandwidth; "
        f"{row['link_note']}", f"{_benchmark_where(row)}. No share of the link is given; "
        "TRACELAKE_LINK_PEAKS (e.g. ib=400) says what a rank's link carries", 0,
        traces=(str(row["trace_id"]),), ranks=tuple(range(row["ranks"] or 0)),
    ) for row in summary.filter(~pl.col("in_place") & pl.col("link_note").is_not_null()).to_dicts()]


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
        ranks=tuple(int(r) for r in ahead["rank"].to_list()),
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
        ranks=tuple(int(r) for r in behind["rank"].to_list()),
    )]


def from_topology(topology: pl.DataFrame) -> list[Finding]:
    """Transport surprises in NCCL's topology (socket where IB exists, SHM inside a node, no GDRDMA)."""
    return [
        Finding("transport", f"NCCL transport: {surprise}",
                f"{_benchmark_ranks(row['ranks'])} on {row['nodes']} node(s), transports {row['transports']}; "
                "check NCCL_IB_HCA / NCCL_SOCKET_IFNAME / NCCL_P2P_DISABLE and the NCCL INFO lines of the init", 0,
                traces=(str(row["trace_id"]),), ranks=tuple(range(row["ranks"] or 0)))
        for row in topology.filter(pl.col("surprises").is_not_null()).to_dicts()
        for surprise in str(row["surprises"]).split("; ")
    ]
