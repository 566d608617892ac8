"""Memory findings in words, each with the figure that matters (docs/analyses.md, "Memory").

Pure functions over :mod:`tracelake.analysis.memory`'s results. A memory finding saves no device time,
so its ``gain_ns`` is 0, except churn's: the host time of its synchronising malloc/free calls, which
:func:`~tracelake.analysis.findings.bound` caps at the span like every other gain. Every figure is bounded:
headroom in [0, 100]%, shares at most 100%, a growth never more than the measured range.
"""

from __future__ import annotations

import polars as pl

from .findings import Finding, rank_words
from .memory import Imbalance, LiveAtPeak

#: Headroom below this share of capacity (peak reserved against it) is reported.
LOW_HEADROOM_PCT = 10.0
#: Fragmentation is reported from this many bytes...
FRAGMENTATION_MIN_BYTES = 1 << 30
#: ...and this share of what is reserved at the peak.
FRAGMENTATION_SHARE = 0.10
#: A rank's peak at this multiple of the median rank's is an imbalance.
IMBALANCE_RATIO = 1.2


def size(n: float) -> str:
    """Bytes in binary units: ``512 B``, ``32.0 MiB``, ``78.1 GiB``."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{int(n)} B"


def _of(part: float, whole: float) -> str:
    """``78.1 of 80.0 GiB``: both in the whole's unit."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(whole) >= scale:
            return f"{part / scale:,.1f} of {whole / scale:,.1f} {unit}"
    return f"{int(part)} of {int(whole)} B"


def _pct(part: float, whole: float) -> float:
    """A share in [0, 100]."""
    return 0.0 if whole <= 0 else min(max(100.0 * part / whole, 0.0), 100.0)


def _where(row: dict) -> str:
    step = f" in step {row['peak_step']}" if row.get("peak_step") is not None else ""
    return f"rank {row['rank']}, device {row['device']}{step}"


def _holders(live: list[LiveAtPeak] | None, row: dict) -> str:
    if not live:
        return ""
    for item in live:
        if (item.trace_id, item.rank, item.device) == (str(row["trace_id"]), row["rank"], row["device"]):
            parts = [f"{s.op} {size(s.bytes)} ({min(s.share_pct, 100.0):.0f}%)" for s in item.by_op[:3]]
            if item.before_trace_bytes:
                parts.append(f"allocated before the trace {size(item.before_trace_bytes)}")
            return "; live at the peak: " + ", ".join(parts) if parts else ""
    return ""


def _categories(categories: pl.DataFrame | None, row: dict) -> str:
    if categories is None or categories.is_empty():
        return ""
    mine = categories
    for column in ("trace_id", "rank", "device"):
        if column in mine.columns:
            mine = mine.filter(pl.col(column) == row[column])
    mine = mine.filter(pl.col("bytes") > 0)
    if mine.is_empty():
        return ""
    top = mine.sort("bytes", descending=True).row(0, named=True)
    return (f"; at the memory timeline's peak, {top['category']} holds {size(top['bytes'])} "
            f"({min(top['share_pct'], 100.0):.0f}%)")


def from_peaks(peak_rows: pl.DataFrame, live: list[LiveAtPeak] | None = None,
               categories: pl.DataFrame | None = None) -> list[Finding]:
    """Low headroom (under :data:`LOW_HEADROOM_PCT`) and fragmentation at the peak, from :func:`.memory.peaks` rows."""
    found: list[Finding] = []
    known = peak_rows.filter(pl.col("capacity_bytes").is_not_null() & (pl.col("device") >= 0))
    low = known.filter(pl.col("headroom_pct") < LOW_HEADROOM_PCT).sort("headroom_pct")
    if low.height:
        row = low.row(0, named=True)
        headroom = min(max(float(row["headroom_pct"]), 0.0), 100.0)
        more = f" ({low.height} devices under {LOW_HEADROOM_PCT:.0f}%)" if low.height > 1 else ""
        found.append(Finding(
            "memory_headroom",
            f"rank {row['rank']} peaks at {_of(row['peak_reserved_bytes'], row['capacity_bytes'])} reserved "
            f"({headroom:.0f}% headroom){' in step ' + str(row['peak_step']) if row['peak_step'] is not None else ''}",
            f"on {_where(row)} the allocator holds up to {size(row['peak_reserved_bytes'])} with "
            f"{size(row['peak_allocated_bytes'])} allocated at the peak{more}: a larger batch or model will not fit, "
            "and a spike can run out of memory; activation checkpointing, a smaller micro-batch or sharding "
            f"optimizer state and gradients (FSDP/ZeRO) free memory{_holders(live, row)}{_categories(categories, row)}",
            0, traces=(str(row["trace_id"]),), ranks=(int(row["rank"]),),
        ))
    frag = pl.col("fragmentation_bytes")
    wasted = peak_rows.filter((pl.col("device") >= 0) & (frag >= FRAGMENTATION_MIN_BYTES)
                              & (frag >= FRAGMENTATION_SHARE * pl.col("reserved_at_peak_bytes"))).sort(
        "fragmentation_bytes", descending=True)
    if wasted.height:
        row = wasted.row(0, named=True)
        share = _pct(row["fragmentation_bytes"], row["reserved_at_peak_bytes"])
        found.append(Finding(
            "memory_fragmentation",
            f"reserved exceeds allocated by {size(row['fragmentation_bytes'])} at the peak: fragmentation",
            f"on {_where(row)}, {_of(row['fragmentation_bytes'], row['reserved_at_peak_bytes'])} reserved "
            f"({share:.0f}%) holds no tensor at the allocated peak: cached blocks the allocator cannot reuse for "
            "the sizes asked; try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
            0, traces=(str(row["trace_id"]),), ranks=(int(row["rank"]),),
        ))
    return found


def from_ooms(ooms: pl.DataFrame, peak_rows: pl.DataFrame | None = None) -> list[Finding]:
    """Out-of-memory errors the trace recorded (:func:`~tracelake.analysis.memory.out_of_memory` rows)."""
    if ooms.is_empty():
        return []
    row = ooms.sort("ts_ns").row(0, named=True)
    cap = None
    if peak_rows is not None and peak_rows.height:
        mine = peak_rows.filter((pl.col("trace_id") == row["trace_id"]) & (pl.col("rank") == row["rank"])
                                & (pl.col("device") == row["device"]))
        cap = mine["capacity_bytes"][0] if mine.height else None
    held = (f"{_of(row['reserved_bytes'], cap)} reserved" if cap else f"{size(row['reserved_bytes'])} reserved")
    step = f" in step {row['step']}" if row["step"] is not None else ""
    ranks = tuple(sorted({int(r) for r in ooms["rank"]}))
    return [Finding(
        "out_of_memory",
        f"{rank_words(ranks)} ran out of device memory " + ("once" if ooms.height == 1 else f"{ooms.height} times"),
        f"rank {row['rank']}, device {row['device']}{step} asked for {size(row['requested_bytes'])} with "
        f"{size(row['allocated_bytes'])} allocated and {held}",
        0, traces=tuple(sorted({str(t) for t in ooms["trace_id"]})), ranks=ranks,
    )]


def from_growth(growth_rows: pl.DataFrame) -> list[Finding]:
    """Leaks: steady growth of what survives each step (:func:`.memory.growth` rows flagged ``leak``)."""
    leaks = growth_rows.filter(pl.col("leak")).sort("slope_bytes_per_step", descending=True)
    if leaks.is_empty():
        return []
    row = leaks.row(0, named=True)
    changes = row["steady_steps"] - 1
    projection = ""
    if row["steps_to_full"] is not None and row["headroom_bytes"]:
        projection = (f"; at that rate the {size(row['headroom_bytes'])} of headroom fill in about "
                      f"{row['steps_to_full']:,} more steps")
    return [Finding(
        "memory_growth",
        f"allocated grows {size(row['slope_bytes_per_step'])} per step over {row['steady_steps']} steps "
        f"on rank {row['rank']}",
        f"on device {row['device']}, the memory that survives each step (its lowest allocated total) rises in "
        f"{row['rising_steps']} of {changes} step-to-step changes, steps {row['first_step']}-{row['last_step']}, "
        f"{size(max(row['growth_bytes'], 0))} in all{projection}: tensors kept across steps (a list of losses, "
        "a cache, hooks holding activations) or a cache that grows",
        0, traces=(str(row["trace_id"]),), ranks=(int(row["rank"]),),
    )]


def from_churn(churn_rows: pl.DataFrame, peak_rows: pl.DataFrame | None = None) -> list[Finding]:
    """Synchronising device malloc/free calls in steady-state steps: at least one per steady step on a rank."""
    steady = churn_rows.filter(pl.col("steady"))
    if steady.is_empty():
        return []
    per_rank = steady.group_by("trace_id", "rank").agg(
        pl.len().alias("steps"), pl.col("malloc_calls").sum(), pl.col("free_calls").sum(),
        pl.col("sync_call_ns").sum(), pl.col("allocs").sum())
    per_rank = per_rank.with_columns((pl.col("malloc_calls") + pl.col("free_calls")).alias("calls")).filter(
        (pl.col("calls") > 0) & (pl.col("calls") >= pl.col("steps"))).sort("calls", descending=True)
    if per_rank.is_empty():
        return []
    row = per_rank.row(0, named=True)
    hip = peak_rows is not None and "device_type" in peak_rows.columns and peak_rows.filter(
        (pl.col("trace_id") == row["trace_id"]) & (pl.col("device_type") == "hip")).height > 0
    malloc, free = ("hipMalloc", "hipFree") if hip else ("cudaMalloc", "cudaFree")
    counts = [(name, n) for name, n in ((malloc, row["malloc_calls"]), (free, row["free_calls"])) if n]
    called = " and ".join(f"{name} {n} time{'s' if n != 1 else ''}" for name, n in counts).replace(" ", " called ", 1)
    return [Finding(
        "allocator_churn",
        f"{called} in {row['steps']} steady-state steps on rank {row['rank']}",
        f"after the first step the caching allocator should reuse its blocks; these calls synchronise the device "
        f"and take {row['sync_call_ns'] / 1e6:,.1f} ms of host time ({row['allocs']} allocations in those steps): "
        "torch.cuda.empty_cache() in the loop, sizes that keep changing, or a cache too small for the peak",
        int(row["sync_call_ns"]), traces=(str(row["trace_id"]),), ranks=(int(row["rank"]),),
    )]


def from_imbalance(result: Imbalance | None) -> list[Finding]:
    """A rank whose peak is at least :data:`IMBALANCE_RATIO` times the median rank's."""
    if result is None or result.ratio is None or result.ratio < IMBALANCE_RATIO:
        return []
    return [Finding(
        "memory_imbalance",
        f"rank {result.max_rank}'s peak is {result.ratio:.1f}x the median rank's",
        f"rank {result.max_rank} peaks at {size(result.max_bytes)} allocated against a median of "
        f"{size(result.median_bytes)} over {result.ranks} ranks (lowest: rank {result.min_rank}, "
        f"{size(result.min_bytes)}): uneven pipeline stages or sharding; the largest rank bounds the batch",
        0, traces=result.traces, ranks=(result.max_rank,),
    )]


def findings(peak_rows: pl.DataFrame, *, live: list[LiveAtPeak] | None = None, categories: pl.DataFrame | None = None,
             ooms: pl.DataFrame | None = None, growth_rows: pl.DataFrame | None = None,
             churn_rows: pl.DataFrame | None = None, imbalance: Imbalance | None = None) -> list[Finding]:
    """Every memory finding of one selection, out of memory first, then in the order of the arguments."""
    found = from_ooms(ooms, peak_rows) if ooms is not None else []
    found += from_peaks(peak_rows, live, categories)
    if growth_rows is not None:
        found += from_growth(growth_rows)
    if churn_rows is not None:
        found += from_churn(churn_rows, peak_rows)
    return found + from_imbalance(imbalance)
