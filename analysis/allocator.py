"""PyTorch CUDA allocator snapshots: what the caching allocator holds, how broken up its free memory is, what is
live, and what an out-of-memory asked for against what was free (docs/analyses.md, "Allocator snapshots").

Pure functions over polars frames of the ``allocator_segments`` rows (one per block, its segment's figures
repeated: ``trace_id``, ``rank``, ``device``, ``segment_index``, ``segment_bytes``, ``is_expandable``,
``block_index``, ``block_bytes``, ``block_requested_bytes``, ``block_state``, ``block_frame``) and the
``allocator_events`` rows (the recorded history: ``action``, ``bytes``, ``device_free_bytes``, ``ts_ns``,
``frame``). Everything is per (trace, rank, device): one snapshot is one trace, and its figures are those
at the moment it was taken. The findings in words are :func:`findings`.
"""

from __future__ import annotations

from typing import Literal

import polars as pl

from tracelake.contracts.errors import InvalidArgument

from .findings import Finding, rank_words
from .memory_findings import size

KEY = ("trace_id", "rank", "device")
#: A free block smaller than this serves no request of the large pool's usual sizes (PyTorch rounds requests
#: above 1 MiB to 2 MiB multiples and carves them from the large pool): free memory in such pieces is lost.
SMALL_BLOCK_BYTES = 2 << 20
#: Free memory is reported as fragmented from this many bytes...
FRAGMENTATION_MIN_BYTES = 1 << 30
#: ...this share of what the segments hold...
FRAGMENTATION_SHARE = 0.10
#: ...and when the largest free block holds less than this share of it (the rest is in smaller pieces).
LARGEST_SHARE = 0.5
#: The labels of :func:`live_by_frame`'s groups that are not a frame.
NO_FRAME = "(no frame)"
OTHER_FRAMES = "(other frames)"

SNAPSHOT_COLUMNS = ("trace_id", "rank", "device", "segments", "expandable", "reserved_bytes", "allocated_bytes",
                    "requested_bytes", "awaiting_free_bytes", "free_bytes", "free_blocks", "largest_free_bytes",
                    "small_free_bytes", "stranded_free_bytes", "fragmentation_pct")
LIVE_COLUMNS = ("trace_id", "rank", "device", "frame", "blocks", "bytes", "share_pct")
OOM_COLUMNS = ("trace_id", "rank", "device", "ts_ns", "requested_bytes", "device_free_bytes", "frame",
               "free_bytes", "largest_free_bytes", "cause")
#: Why an allocation failed, by :func:`out_of_memory`: larger than everything free; enough free in all but in no
#: one piece (fragmentation); or it would have fitted at the snapshot (memory freed since, or no snapshot).
Cause = Literal["too_large", "fragmentation", "fits_now"]


def _need(frame: pl.DataFrame, columns: tuple[str, ...], what: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise InvalidArgument(f"{what} lack the column(s) {', '.join(missing)} (have {', '.join(frame.columns)})")


def _keyed(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.with_columns(pl.col("trace_id").cast(pl.String), pl.col("rank").cast(pl.Int64),
                              pl.col("device").cast(pl.Int64))


def snapshot_summary(segments: pl.DataFrame) -> pl.DataFrame:
    """What the allocator holds per (trace, rank, device) at the snapshot (:data:`SNAPSHOT_COLUMNS`).

    ``reserved_bytes`` is the segments' total (each segment once); ``allocated_bytes`` the blocks in use
    (``active_allocated``), ``requested_bytes`` what those asked for before rounding (null where the snapshot
    does not say), ``awaiting_free_bytes`` the blocks freed but waiting for another stream, ``free_bytes`` the
    cached ones (``inactive``) and ``largest_free_bytes`` the largest of them: no request above it can be served
    without a new cudaMalloc. ``small_free_bytes`` is free in blocks under :data:`SMALL_BLOCK_BYTES`;
    ``stranded_free_bytes`` free in segments that also hold a block in use (``empty_cache()`` cannot give those
    back). ``fragmentation_pct`` is the share of free memory outside the largest free block (null without any).
    """
    _need(segments, (*KEY, "segment_index", "segment_bytes", "block_bytes", "block_state"), "allocator segments")
    seg = _keyed(segments)
    for optional, dtype in (("block_requested_bytes", pl.Int64), ("is_expandable", pl.Boolean)):
        if optional not in seg.columns:
            seg = seg.with_columns(pl.lit(None, dtype=dtype).alias(optional))
    state, block = pl.col("block_state"), pl.col("block_bytes")
    free, used = state == "inactive", state == "active_allocated"
    seg = seg.with_columns(
        (state.is_in(["active_allocated", "active_awaiting_free"]).any().over([*KEY, "segment_index"]))
        .alias("_has_active"))
    per_segment = seg.unique([*KEY, "segment_index"], keep="first").group_by(KEY).agg(
        pl.len().cast(pl.Int64).alias("segments"), pl.col("segment_bytes").sum().cast(pl.Int64).alias("reserved_bytes"),
        pl.col("is_expandable").fill_null(False).any().alias("expandable"))
    per_block = seg.group_by(KEY).agg(
        block.filter(used).sum().cast(pl.Int64).alias("allocated_bytes"),
        pl.when(pl.col("block_requested_bytes").filter(used).is_null().any()).then(None)
        .otherwise(pl.col("block_requested_bytes").filter(used).sum()).cast(pl.Int64).alias("requested_bytes"),
        block.filter(state == "active_awaiting_free").sum().cast(pl.Int64).alias("awaiting_free_bytes"),
        block.filter(free).sum().cast(pl.Int64).alias("free_bytes"),
        free.sum().cast(pl.Int64).alias("free_blocks"),
        block.filter(free).max().cast(pl.Int64).alias("largest_free_bytes"),
        block.filter(free & (block < SMALL_BLOCK_BYTES)).sum().cast(pl.Int64).alias("small_free_bytes"),
        block.filter(free & pl.col("_has_active")).sum().cast(pl.Int64).alias("stranded_free_bytes"))
    out = per_segment.join(per_block, on=list(KEY), how="left").with_columns(
        pl.when(pl.col("free_bytes") > 0)
        .then(100.0 * (1 - pl.col("largest_free_bytes") / pl.col("free_bytes"))).alias("fragmentation_pct"))
    return out.sort(KEY).select(SNAPSHOT_COLUMNS)


def live_by_frame(segments: pl.DataFrame, top: int = 10) -> pl.DataFrame:
    """The blocks in use at the snapshot (allocated or awaiting free) by the frame that allocated them
    (:data:`LIVE_COLUMNS`): the ``top`` frames per device by bytes, then one :data:`OTHER_FRAMES` row.
    ``share_pct`` is of the device's blocks in use, so a device's shares add up to 100."""
    _need(segments, (*KEY, "block_bytes", "block_state"), "allocator segments")
    seg = _keyed(segments)
    if "block_frame" not in seg.columns:
        seg = seg.with_columns(pl.lit(None, dtype=pl.String).alias("block_frame"))
    live = seg.filter(pl.col("block_state").is_in(["active_allocated", "active_awaiting_free"]))
    grouped = live.group_by(*KEY, pl.col("block_frame").fill_null(NO_FRAME).alias("frame")).agg(
        pl.len().cast(pl.Int64).alias("blocks"), pl.col("block_bytes").sum().cast(pl.Int64).alias("bytes"))
    ranked = grouped.sort([*KEY, "bytes", "frame"], descending=[False, False, False, True, False]).with_columns(
        pl.int_range(pl.len()).over(KEY).alias("_n"), pl.col("bytes").sum().over(KEY).alias("_all"))
    head = ranked.filter(pl.col("_n") < top)
    rest = ranked.filter(pl.col("_n") >= top).group_by(KEY).agg(
        pl.lit(OTHER_FRAMES).alias("frame"), pl.col("blocks").sum(), pl.col("bytes").sum(), pl.col("_all").first())
    both = pl.concat([head.drop("_n"), rest.select(head.drop("_n").columns)]) if rest.height else head.drop("_n")
    out = both.with_columns((100.0 * pl.col("bytes") / pl.col("_all")).alias("share_pct"))
    return out.with_columns((pl.col("frame") == OTHER_FRAMES).alias("_o")).sort(
        [*KEY, "_o", "bytes"], descending=[False, False, False, False, True]).select(LIVE_COLUMNS)


def out_of_memory(events: pl.DataFrame, summary: pl.DataFrame) -> pl.DataFrame:
    """The ``oom`` actions of the history (:data:`OOM_COLUMNS`), each against the snapshot of the same trace.

    ``cause`` (:data:`Cause`): ``too_large`` where the request exceeds the device's free memory plus the free
    cached blocks together; ``fragmentation`` where those add up to enough but neither the device nor any one
    cached block has it; ``fits_now`` where one of them would hold it at the snapshot (taken after the OOM,
    memory may have been freed since). Without a snapshot row the cache's figures are null and so is the cause.
    """
    _need(events, (*KEY, "action", "bytes", "ts_ns"), "allocator events")
    ev = _keyed(events)
    for optional, dtype in (("device_free_bytes", pl.Int64), ("frame", pl.String)):
        if optional not in ev.columns:
            ev = ev.with_columns(pl.lit(None, dtype=dtype).alias(optional))
    ooms = ev.filter(pl.col("action") == "oom").select(
        *KEY, "ts_ns", pl.col("bytes").alias("requested_bytes"), "device_free_bytes", "frame")
    cache = summary.select(*KEY, "free_bytes", "largest_free_bytes") if summary.height else pl.DataFrame(
        schema={"trace_id": pl.String, "rank": pl.Int64, "device": pl.Int64, "free_bytes": pl.Int64,
                "largest_free_bytes": pl.Int64})
    out = ooms.join(cache, on=list(KEY), how="left")
    ask, device_free = pl.col("requested_bytes"), pl.col("device_free_bytes").fill_null(0)
    largest, cached = pl.col("largest_free_bytes").fill_null(0), pl.col("free_bytes")
    cause = (pl.when(cached.is_null() | ask.is_null()).then(None)
             .when(ask > device_free + cached).then(pl.lit("too_large"))
             .when((ask > largest) & (ask > device_free)).then(pl.lit("fragmentation"))
             .otherwise(pl.lit("fits_now")))
    return out.with_columns(cause.alias("cause")).sort([*KEY, "ts_ns"]).select(OOM_COLUMNS)


def _place(row: dict) -> str:
    return f"rank {row['rank']}, device {row['device']}"


def from_snapshot(summary: pl.DataFrame) -> list[Finding]:
    """Fragmented free memory at the snapshot: at least :data:`FRAGMENTATION_MIN_BYTES` and
    :data:`FRAGMENTATION_SHARE` of the segments free, with the largest free block under :data:`LARGEST_SHARE` of it."""
    if summary.is_empty():
        return []
    free = pl.col("free_bytes")
    broken = summary.filter((free >= FRAGMENTATION_MIN_BYTES) & (free >= FRAGMENTATION_SHARE * pl.col("reserved_bytes"))
                            & (pl.col("largest_free_bytes") < LARGEST_SHARE * free)).sort("free_bytes", descending=True)
    if broken.is_empty():
        return []
    row = broken.row(0, named=True)
    advice = ("sizes that change from step to step (pad them to a few fixed shapes) or "
              "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb to stop large blocks being split"
              if row["expandable"] else "try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    small = (f", {size(row['small_free_bytes'])} of it in blocks under {size(SMALL_BLOCK_BYTES)}"
             if row["small_free_bytes"] else "")
    stranded = (f"; {size(row['stranded_free_bytes'])} sits in segments that also hold live blocks, so "
                "empty_cache() cannot return it" if row["stranded_free_bytes"] else "")
    more = f" ({broken.height} devices like it)" if broken.height > 1 else ""
    return [Finding(
        "allocator_fragmentation",
        f"segments hold {size(row['reserved_bytes'])}, {size(row['free_bytes'])} of it free in "
        f"{row['free_blocks']} blocks, the largest {size(row['largest_free_bytes'])}: fragmentation",
        f"in the allocator snapshot of {_place(row)}{more}, {size(row['allocated_bytes'])} is in use and "
        f"{size(row['free_bytes'])} cached free{small}; a request above {size(row['largest_free_bytes'])} needs a "
        f"new cudaMalloc (or fails) although that much is free{stranded}: {advice}",
        0, traces=(str(row["trace_id"]),), ranks=(int(row["rank"]),),
    )]


def from_ooms(ooms: pl.DataFrame) -> list[Finding]:
    """The first out-of-memory of the history, its request against the free memory then and the cache's pieces."""
    if ooms.is_empty():
        return []
    row = ooms.sort("ts_ns").row(0, named=True)
    ranks = tuple(sorted({int(r) for r in ooms["rank"]}))
    ask = row["requested_bytes"]
    device_free = f"{size(row['device_free_bytes'])} free on the device" if row["device_free_bytes"] is not None \
        else "the device's free memory not recorded"
    cache = (f"{size(row['free_bytes'])} cached free, the largest block {size(row['largest_free_bytes'] or 0)}"
             if row["free_bytes"] is not None else "no snapshot of the cache")
    why = {"too_large": "the request alone is larger than all free memory: a wrong size, or too large a batch or "
                        "sequence for this device",
           "fragmentation": "enough memory was free in all, but not in one piece: fragmentation; try "
                            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
           "fits_now": "it would fit in the cache as the snapshot (taken after the failure) has it: memory was "
                       "freed since"}.get(row["cause"] or "", "")
    where = f" at {row['frame']}" if row["frame"] else ""
    return [Finding(
        "allocator_oom",
        f"{rank_words(ranks)} failed to allocate {size(ask)}"
        + ("" if ooms.height == 1 else f" ({ooms.height} failures)"),
        f"{_place(row)} asked for {size(ask)}{where} with {device_free} and {cache}" + (f": {why}" if why else ""),
        0, traces=tuple(sorted({str(t) for t in ooms["trace_id"]})), ranks=ranks,
    )]


def findings(summary: pl.DataFrame, ooms: pl.DataFrame) -> list[Finding]:
    """Every allocator snapshot finding of one selection: out of memory first, then fragmentation."""
    return from_ooms(ooms) + from_snapshot(summary)
