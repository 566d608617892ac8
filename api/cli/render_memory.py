"""How ``tracelake analyze`` prints device memory: peaks, headroom, fragmentation and growth per rank and device.

Presentation only, over the frames of :class:`tracelake.analysis.assemble.Analysis` (docs/analyses.md, "Memory");
``--json`` keeps every value whole.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracelake.contracts.lazy import lazy_module, polars as pl

if TYPE_CHECKING:
    from tracelake.analysis import memory_findings
else:  # loaded by the commands that show analyses, not by every command (contracts/lazy.py)
    memory_findings = lazy_module("tracelake.analysis.memory_findings")

#: Bytes in a GiB and a MiB: memory is shown in binary units, as the findings word it.
GIB = float(1 << 30)
MIB = float(1 << 20)
#: Ops named per device in the line of what is live at the peak.
HOLDERS = 3
#: Characters of a trace id shown where a rank has several traces.
SHORT_ID = 12

TITLE = ("device memory per rank and device, GiB (peaks of the trace's own totals; headroom = capacity - peak "
         "reserved; fragmentation = reserved - allocated at the allocated peak; growth = of what survives each step)")


def memory_view(memory: pl.DataFrame) -> pl.DataFrame:
    """One row per (trace, rank, device) of ``Analysis.memory``, in GiB, % and MiB per step."""
    several = memory["trace_id"].n_unique() > 1 and memory.select(
        pl.struct(*(["run"] if "run" in memory.columns else []), "rank", "device").is_duplicated().any()).item()
    where = pl.when(pl.col("device") < 0).then(pl.lit("cpu")).otherwise(
        pl.format("{}:{}", pl.col("device_type").fill_null("device"), pl.col("device")))
    return memory.sort(*(["run"] if "run" in memory.columns else []), "rank", "device", "trace_id").select(
        *(["run"] if "run" in memory.columns else []),
        *([pl.col("trace_id").str.slice(0, SHORT_ID).alias("trace")] if several else []),
        "rank", where.alias("device"),
        (pl.col("peak_allocated_bytes") / GIB).round(2).alias("peak allocated"),
        (pl.col("peak_reserved_bytes") / GIB).round(2).alias("peak reserved"),
        (pl.col("capacity_bytes") / GIB).round(1).alias("capacity"),
        pl.col("headroom_pct").round(1).alias("headroom %"),
        (pl.col("fragmentation_bytes") / GIB).round(2).alias("fragmentation"),
        (pl.col("slope_bytes_per_step") / MIB).round(1).alias("growth MiB/step"),
        pl.col("peak_step").alias("peak step"),
        pl.col("ooms").alias("OOMs"),
    )


def holders_lines(live: pl.DataFrame, categories: pl.DataFrame) -> list[str]:
    """A line per accelerator device of what holds its memory at the peak: the top ops, then the timeline's categories."""
    size = memory_findings.size
    lines = []
    if live.height:
        devices = live.filter(pl.col("device") >= 0).select(
            *(["run"] if "run" in live.columns else []), "trace_id", "rank", "device").unique(maintain_order=True)
        for row in devices.iter_rows(named=True):
            mine = live.filter(*(pl.col(c) == v for c, v in row.items())).sort("bytes", descending=True)
            parts = [f"{r['op']} {size(r['bytes'])} ({r['share_pct']:.0f}%)" for r in mine.head(HOLDERS).to_dicts()]
            first = mine.row(0, named=True)
            if first["before_trace_bytes"]:
                parts.append(f"allocated before the trace {size(first['before_trace_bytes'])}")
            run = f"{row['run']} " if row.get("run") else ""
            step = f" in step {first['step']}" if first["step"] is not None else ""
            lines.append(f"{run}rank {row['rank']}, device {row['device']}: at its peak{step}, "
                         f"{size(first['allocated_bytes'])} allocated: " + ", ".join(parts))
    if categories.height:
        keys = [c for c in ("run", "trace_id", "rank", "device") if c in categories.columns]
        for _, part in categories.group_by(keys, maintain_order=True):
            top = part.filter(pl.col("bytes") > 0).sort("bytes", descending=True)
            if top.is_empty():
                continue
            first = top.row(0, named=True)
            run = f"{first['run']} " if first.get("run") else ""
            lines.append(f"{run}rank {first['rank']}: at the memory timeline's peak ({size(first['peak_bytes'])}): "
                         + ", ".join(f"{r['category']} {size(r['bytes'])} ({r['share_pct']:.0f}%)"
                                     for r in top.to_dicts()))
    return lines


def snapshot_lines(snapshots: pl.DataFrame, live: pl.DataFrame) -> list[str]:
    """A line per CUDA allocator snapshot (``Analysis.allocator_snapshots``): what its segments hold, in use and
    free, the largest free block, and the frames holding the most (``Analysis.allocator_live``)."""
    size = memory_findings.size
    lines = []
    for row in snapshots.to_dicts():
        mine = live.filter(*(pl.col(c) == row[c] for c in ("trace_id", "rank", "device") if c in live.columns)) \
            if live.height else live
        holders = ", ".join(f"{r['frame']} {size(r['bytes'])} ({r['share_pct']:.0f}%)"
                            for r in mine.head(HOLDERS).to_dicts())
        run = f"{row['run']} " if row.get("run") else ""
        largest = f", the largest {size(row['largest_free_bytes'])}" if row["largest_free_bytes"] is not None else ""
        lines.append(f"{run}rank {row['rank']}, device {row['device']}: allocator snapshot: {row['segments']} segments "
                     f"hold {size(row['reserved_bytes'])}, {size(row['allocated_bytes'])} in use, "
                     f"{size(row['free_bytes'])} free in {row['free_blocks']} blocks{largest}"
                     + (f"; in use by: {holders}" if holders else ""))
    return lines
