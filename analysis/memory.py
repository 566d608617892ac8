"""Device memory: peaks, headroom, what is live at the peak, growth, churn and imbalance (docs/analyses.md, "Memory").

Pure functions over polars frames. ``events`` are rows of the ``memory_events`` table (Kineto ``[memory]``
and ``[OutOfMemory]`` instants): ``trace_id``, ``rank``, ``device`` (-1 = CPU), ``device_type``, ``ts_ns``
(``ts`` is accepted too), ``kind`` (``alloc``, ``free``, ``oom``), ``addr``, ``bytes`` (signed),
``total_allocated``, ``total_reserved`` (the allocator's running totals after the event, as the trace gives
them), ``op`` and ``step`` (both nullable). Events are ordered by time within each (trace, rank, device),
ties kept in the order given. The findings in words are in :mod:`tracelake.analysis.memory_findings`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

import polars as pl

from tracelake.contracts.errors import InvalidArgument

from .steps import WARMUP_MIN_STEPS

Kind = Literal["alloc", "free", "oom"]
#: A (trace, rank, device): the allocator's totals are per device.
KEY = ("trace_id", "rank", "device")

PEAK_COLUMNS = (
    "trace_id", "rank", "device", "device_type", "events", "ooms", "before_trace_bytes", "peak_allocated_bytes",
    "peak_reserved_bytes", "peak_ts_ns", "peak_step", "reserved_at_peak_bytes", "fragmentation_bytes",
    "capacity_bytes", "headroom_bytes", "headroom_pct",
)
STEP_COLUMNS = ("trace_id", "rank", "device", "step", "min_allocated_bytes", "end_allocated_bytes",
                "max_allocated_bytes", "max_reserved_bytes", "allocs", "frees", "alloc_bytes")
GROWTH_COLUMNS = ("trace_id", "rank", "device", "steady_steps", "first_step", "last_step", "slope_bytes_per_step",
                  "growth_bytes", "rising_steps", "capacity_bytes", "headroom_bytes", "steps_to_full", "leak")
CHURN_COLUMNS = ("trace_id", "rank", "step", "steady", "allocs", "frees", "alloc_bytes", "malloc_calls",
                 "free_calls", "async_calls", "sync_call_ns")
CATEGORY_COLUMNS = ("category", "bytes", "share_pct", "peak_bytes", "peak_ts_ns")

#: Runtime calls that allocate or free device memory and synchronise the device (``cudaFree`` waits for all
#: work; ``cudaMalloc`` may): in steady-state steps they mean the caching allocator missed or was emptied.
SYNC_MALLOC_CALLS = frozenset({"cudaMalloc", "hipMalloc"})
SYNC_FREE_CALLS = frozenset({"cudaFree", "hipFree"})
#: Stream-ordered calls (the ``cudaMallocAsync`` allocator backend makes one per allocation by design): they
#: do not synchronise the device, so they are counted apart and never flagged.
ASYNC_CALLS = frozenset({"cudaMallocAsync", "cudaFreeAsync", "hipMallocAsync", "hipFreeAsync"})

#: A leak needs at least this many steady-state steps...
LEAK_MIN_STEPS = 3
#: ...growth in more than half of its step-to-step changes, and a measured growth of at least this share of
#: the device's capacity (of its peak reserved when the capacity is unknown)...
LEAK_SHARE = 0.01
#: ...or a rate that would fill the remaining headroom within this many more steps (a long training run).
LEAK_HORIZON_STEPS = 100_000

#: The PyTorch memory timeline export's codes (``torch.profiler._memory_profiler``: ``Action`` values and
#: ``_CATEGORY_TO_INDEX``), as the names the ``memory_timeline`` table stores.
TIMELINE_ACTIONS = {1: "preexisting", 2: "create", 3: "increment_version", 4: "destroy"}
TIMELINE_CATEGORIES = {0: "parameter", 1: "optimizer_state", 2: "input", 3: "temporary", 4: "activation",
                       5: "gradient", 6: "autograd_detail", 7: "unknown"}

#: The labels of ``live_at_peak``'s groups that are not an operator.
NO_OP = "(no op)"
OTHER_OPS = "(other ops)"


def _need(frame: pl.DataFrame, columns: tuple[str, ...], what: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise InvalidArgument(f"{what} lack the column(s) {', '.join(missing)} (have {', '.join(frame.columns)})")


def _ordered(events: pl.DataFrame) -> pl.DataFrame:
    """Events sorted by (trace, rank, device, time, given order), with ``ts_ns`` and a per-device ``_idx``."""
    if "ts_ns" not in events.columns and "ts" in events.columns:
        events = events.rename({"ts": "ts_ns"})
    _need(events, (*KEY, "ts_ns", "kind", "bytes", "total_allocated", "total_reserved"), "memory events")
    for optional, dtype in (("addr", pl.Int64), ("op", pl.String), ("step", pl.Int64), ("device_type", pl.String)):
        if optional not in events.columns:
            events = events.with_columns(pl.lit(None, dtype=dtype).alias(optional))
    return (events.with_row_index("_row").sort([*KEY, "ts_ns", "_row"])
            .with_columns(pl.int_range(pl.len(), dtype=pl.Int64).over(KEY).alias("_idx")))


def _at_peak(ordered: pl.DataFrame) -> pl.DataFrame:
    """The first event of each device that reaches its maximum ``total_allocated``."""
    total = pl.col("total_allocated")
    return (ordered.filter(total.is_not_null() & (total == total.max().over(KEY)))
            .unique(KEY, keep="first", maintain_order=True))


def _capacity(capacity: pl.DataFrame | None) -> pl.DataFrame:
    schema = {"trace_id": pl.String, "rank": pl.Int64, "device": pl.Int64, "capacity_bytes": pl.Int64}
    if capacity is None or capacity.is_empty():
        return pl.DataFrame(schema=schema)
    _need(capacity, ("trace_id", "rank", "device", "memory_bytes"), "devices rows")
    rows = capacity.filter(pl.col("memory_bytes").is_not_null() & (pl.col("memory_bytes") > 0))
    if "kind" in rows.columns:
        rows = rows.filter(pl.col("kind").is_null() | (pl.col("kind") != "nic"))
    return (rows.group_by(pl.col("trace_id").cast(pl.String), pl.col("rank").cast(pl.Int64),
                          pl.col("device").cast(pl.Int64))
            .agg(pl.col("memory_bytes").max().cast(pl.Int64).alias("capacity_bytes")))


def peaks(events: pl.DataFrame, capacity: pl.DataFrame | None = None) -> pl.DataFrame:
    """Peak allocated and reserved memory per (trace, rank, device), headroom and fragmentation (:data:`PEAK_COLUMNS`).

    The peaks are the maxima of the trace's own running totals, never re-summed; the peak event is the
    first to reach the allocated maximum. ``before_trace_bytes`` is what was allocated before the first
    event (its total minus its own bytes): a trace that starts mid-run starts above zero. Headroom is
    capacity minus peak reserved, in [0, capacity]; fragmentation is reserved minus allocated at the
    allocated peak, null where the allocator reports less reserved than allocated (the CPU reports no
    reserve). ``capacity`` are ``devices`` rows (``trace_id``, ``rank``, ``device``, ``memory_bytes``).
    docs/analyses.md, "Memory".
    """
    ev = _ordered(events).with_columns(pl.col("trace_id").cast(pl.String), pl.col("rank").cast(pl.Int64),
                                       pl.col("device").cast(pl.Int64))
    moves = pl.col("kind").is_in(["alloc", "free"])
    summary = ev.group_by(KEY, maintain_order=True).agg(
        pl.col("device_type").drop_nulls().first(),
        pl.len().cast(pl.Int64).alias("events"),
        (pl.col("kind") == "oom").sum().cast(pl.Int64).alias("ooms"),
        (pl.col("total_allocated") - pl.col("bytes")).filter(moves).first().alias("before_trace_bytes"),
        pl.col("total_reserved").max().alias("peak_reserved_bytes"),
    )
    top = _at_peak(ev).select(
        *KEY, pl.col("total_allocated").alias("peak_allocated_bytes"), pl.col("ts_ns").alias("peak_ts_ns"),
        pl.col("step").alias("peak_step"), pl.col("total_reserved").alias("reserved_at_peak_bytes"))
    out = summary.join(top, on=list(KEY), how="left").join(_capacity(capacity), on=list(KEY), how="left")
    cap, reserved, allocated = pl.col("capacity_bytes"), pl.col("peak_reserved_bytes"), pl.col("peak_allocated_bytes")
    headroom = pl.when(cap.is_not_null()).then(pl.min_horizontal(pl.max_horizontal(cap - reserved, 0), cap))
    out = out.with_columns(
        pl.when(pl.col("reserved_at_peak_bytes") >= allocated)
        .then(pl.col("reserved_at_peak_bytes") - allocated).alias("fragmentation_bytes"),
        headroom.alias("headroom_bytes"),
    ).with_columns((100.0 * pl.col("headroom_bytes") / cap).alias("headroom_pct"))
    return out.sort(KEY).select(PEAK_COLUMNS)


@dataclass(frozen=True)
class OpShare:
    """Bytes live at the peak that one operator allocated."""

    op: str
    blocks: int
    bytes: int
    #: Of the bytes accounted for at the peak (live in the trace plus allocated before it): at most 100.
    share_pct: float


@dataclass(frozen=True)
class LiveAtPeak:
    """What holds a device's memory at its allocated peak (docs/analyses.md, "Memory", "Live at the peak")."""

    trace_id: str
    rank: int
    device: int
    ts_ns: int
    step: int | None
    #: ``total_allocated`` at the peak, as the trace gives it.
    allocated_bytes: int
    #: Blocks allocated inside the trace and not yet freed at the peak.
    live_bytes: int
    live_blocks: int
    #: Allocated before the trace began and not freed before the peak (never below 0).
    before_trace_bytes: int
    #: ``allocated_bytes - live_bytes - before_trace_bytes``: 0 when the trace's totals chain event to event.
    residual_bytes: int
    by_op: tuple[OpShare, ...]

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict."""
        return {**asdict(self), "by_op": [asdict(s) for s in self.by_op]}


def live_at_peak(events: pl.DataFrame, top: int = 10) -> list[LiveAtPeak]:
    """Blocks live at each device's allocated peak, by the operator that allocated them (``top`` ops, then the rest).

    Blocks are paired by address, in time order: an alloc lives until the next event at its address (its
    free; a second alloc at a live address means the free was not recorded). A free with no alloc before it
    at its address freed a block allocated before the trace: those frees come off ``before_trace_bytes``.
    docs/analyses.md, "Memory".
    """
    ev = _ordered(events)
    peak = _at_peak(ev).select(*KEY, pl.col("_idx").alias("_peak"), pl.col("ts_ns").alias("_peak_ts"),
                               pl.col("step").alias("_peak_step"), pl.col("total_allocated").alias("_peak_total"))
    moves = ev.filter(pl.col("kind").is_in(["alloc", "free"]))
    first = moves.unique(KEY, keep="first", maintain_order=True).select(
        *KEY, (pl.col("total_allocated") - pl.col("bytes")).alias("_before"))
    blocks = moves.sort([*KEY, "addr", "_idx"]).with_columns(
        pl.col("kind").shift(1).over([*KEY, "addr"]).alias("_prev_kind"),
        pl.col("_idx").shift(-1).over([*KEY, "addr"]).alias("_end"),
    ).join(peak, on=list(KEY), how="inner")
    upto = pl.col("_idx") <= pl.col("_peak")
    still = pl.col("_end").is_null() | (pl.col("_end") > pl.col("_peak"))
    live = blocks.filter((pl.col("kind") == "alloc") & upto & still)
    orphan_frees = blocks.filter((pl.col("kind") == "free") & upto
                                 & (pl.col("_prev_kind").is_null() | (pl.col("_prev_kind") == "free")))
    freed_before = orphan_frees.group_by(KEY).agg(pl.col("bytes").sum().alias("_freed"))
    by_op = live.group_by(*KEY, pl.col("op").fill_null(NO_OP)).agg(
        pl.len().alias("blocks"), pl.col("bytes").sum().alias("bytes"))
    out = []
    devices = peak.join(first, on=list(KEY), how="left").join(freed_before, on=list(KEY), how="left").sort(KEY)
    for row in devices.iter_rows(named=True):
        mine = by_op.filter((pl.col("trace_id") == row["trace_id"]) & (pl.col("rank") == row["rank"])
                            & (pl.col("device") == row["device"])).sort(["bytes", "op"], descending=[True, False])
        live_bytes, blocks_n = int(mine["bytes"].sum()), int(mine["blocks"].sum())
        before = max(int(row["_before"] or 0) + int(row["_freed"] or 0), 0)
        total = int(row["_peak_total"])
        accounted = max(live_bytes + before, 1)
        shares = [OpShare(str(r["op"]), int(r["blocks"]), int(r["bytes"]), 100.0 * r["bytes"] / accounted)
                  for r in mine.head(top).iter_rows(named=True)]
        rest = mine.slice(top)
        if rest.height:
            shares.append(OpShare(OTHER_OPS, int(rest["blocks"].sum()), int(rest["bytes"].sum()),
                                  100.0 * int(rest["bytes"].sum()) / accounted))
        out.append(LiveAtPeak(str(row["trace_id"]), int(row["rank"]), int(row["device"]), int(row["_peak_ts"]),
                              None if row["_peak_step"] is None else int(row["_peak_step"]), total, live_bytes,
                              blocks_n, before, total - live_bytes - before, tuple(shares)))
    return out


def by_category_at_peak(timeline: pl.DataFrame) -> pl.DataFrame:
    """Bytes live per category at the memory timeline's peak (:data:`CATEGORY_COLUMNS`; per trace/rank/device if given).

    ``timeline`` are rows of PyTorch's memory timeline export (``ts_ns`` or ``ts``, ``action``, ``bytes``,
    ``category``; codes or the names of :data:`TIMELINE_ACTIONS`, :data:`TIMELINE_CATEGORIES`). The replay adds
    preexisting and created bytes, takes destroyed ones away, and moves an increment_version's bytes
    between its two rows' categories (signed as exported: the old version's row negative). The total is read
    after all rows of one timestamp, as PyTorch's own plot does; pre-existing rows (time -1 or null) come
    first. The peak is the first timestamp with the largest total. docs/analyses.md, "Memory".
    """
    tl = timeline.rename({"ts": "ts_ns"}) if "ts_ns" not in timeline.columns and "ts" in timeline.columns else timeline
    _need(tl, ("ts_ns", "action", "bytes", "category"), "memory timeline rows")
    key = [c for c in KEY if c in tl.columns]
    if tl.schema["action"].is_integer():
        tl = tl.with_columns(pl.col("action").replace_strict(TIMELINE_ACTIONS, default=None, return_dtype=pl.String))
    if tl.schema["category"].is_integer():
        tl = tl.with_columns(pl.col("category").replace_strict(TIMELINE_CATEGORIES, default="unknown",
                                                               return_dtype=pl.String))
    unknown = tl.with_row_index("_at").filter(~pl.col("action").is_in(list(TIMELINE_ACTIONS.values()))
                                              | pl.col("action").is_null())
    if unknown.height:
        raise InvalidArgument(f"memory timeline row {unknown['_at'][0]} has action {unknown['action'][0]!r}; "
                              f"expected one of {', '.join(TIMELINE_ACTIONS.values())}")
    size, action = pl.col("bytes").cast(pl.Int64), pl.col("action")
    group = [*key, "_g"]  # "_g" stands in for the key where the rows carry none
    tl = tl.with_columns(
        pl.when(action == "destroy").then(-size.abs()).when(action == "increment_version").then(size)
        .otherwise(size.abs()).alias("_delta"),
        pl.when(pl.col("ts_ns").is_null() | (pl.col("ts_ns") < 0)).then(-1).otherwise(pl.col("ts_ns"))
        .cast(pl.Int64).alias("_t"),
        pl.col("category").fill_null("unknown"),
        pl.lit(0).alias("_g"),
    )
    per_t = (tl.group_by(*group, "_t").agg(pl.col("_delta").sum()).sort([*group, "_t"])
             .with_columns(pl.col("_delta").cum_sum().over(group).alias("_total")))
    peak = (per_t.filter(pl.col("_total") == pl.col("_total").max().over(group))
            .unique(group, keep="first", maintain_order=True)
            .select(*group, pl.col("_t").alias("_peak_t"), pl.col("_total").alias("peak_bytes")))
    live = tl.join(peak, on=group, how="inner", nulls_equal=True).group_by(*group, "category").agg(
        pl.col("_delta").filter(pl.col("_t") <= pl.col("_peak_t")).sum().alias("bytes"),
        pl.col("peak_bytes").first(), pl.col("_peak_t").first().alias("peak_ts_ns"))
    total = pl.col("bytes").clip(0).sum().over(group)
    live = live.with_columns(
        pl.when(total > 0).then(100.0 * pl.col("bytes").clip(0) / total).otherwise(0.0).alias("share_pct"),
        pl.when(pl.col("peak_ts_ns") >= 0).then(pl.col("peak_ts_ns")).alias("peak_ts_ns"))
    order = [*key, "bytes", "category"]
    return live.sort(order, descending=[c == "bytes" for c in order]).select(*key, *CATEGORY_COLUMNS)


def step_memory(events: pl.DataFrame) -> pl.DataFrame:
    """Per (trace, rank, device, step): lowest, last and highest allocated total, allocations (:data:`STEP_COLUMNS`).

    The minimum counts the total the step started with (before its first alloc or free) as well as the
    totals after each of its events. Events outside steps (null ``step``) are left out.
    """
    ev = _ordered(events).filter(pl.col("step").is_not_null())
    kind = pl.col("kind")
    start = (pl.col("total_allocated") - pl.col("bytes")).filter(kind.is_in(["alloc", "free"])).first()  # in time order
    return (ev.group_by(*KEY, "step").agg(
        pl.min_horizontal(pl.col("total_allocated").min(), start).alias("min_allocated_bytes"),
        pl.col("total_allocated").sort_by("_idx").last().alias("end_allocated_bytes"),
        pl.col("total_allocated").max().alias("max_allocated_bytes"),
        pl.col("total_reserved").max().alias("max_reserved_bytes"),
        (kind == "alloc").sum().cast(pl.Int64).alias("allocs"),
        (kind == "free").sum().cast(pl.Int64).alias("frees"),
        pl.col("bytes").filter(kind == "alloc").sum().cast(pl.Int64).alias("alloc_bytes"),
    ).sort([*KEY, "step"]).select(STEP_COLUMNS))


def _steady(frame: pl.DataFrame, key: list[str]) -> pl.Expr:
    """Not the first step of its ``key`` where that has :data:`~.steps.WARMUP_MIN_STEPS` steps or more."""
    first = pl.col("step") == pl.col("step").min().over(key)
    return ~(first & (pl.col("step").n_unique().over(key) >= WARMUP_MIN_STEPS))


def _slope(steps: list[int], values: list[int]) -> float | None:
    """The least-squares slope, in exact integer sums: a noise-free line gives its slope exactly."""
    n = len(steps)
    sx, sy = sum(steps), sum(values)
    den = n * sum(x * x for x in steps) - sx * sx
    if n < 2 or den == 0:
        return None
    return (n * sum(x * y for x, y in zip(steps, values, strict=True)) - sx * sy) / den


def growth(events: pl.DataFrame, capacity: pl.DataFrame | None = None) -> pl.DataFrame:
    """Growth of the memory that survives each steady-state step, and whether it is a leak (:data:`GROWTH_COLUMNS`).

    Each step's point is its lowest allocated total, the one it started with included (:func:`step_memory`:
    what outlives the step's activations and temporaries); the first step is left out as a warm-up (as in
    "Steps"). The slope is a least-squares fit in bytes per step; ``growth_bytes`` is the slope times the
    steps it spans, never more in size than the measured range of the points. A leak: at least
    :data:`LEAK_MIN_STEPS` steady steps, a positive slope, growth in more than half of the step-to-step
    changes, and a growth of at least :data:`LEAK_SHARE` of capacity (of peak reserved where the capacity
    is unknown) or a rate that fills the headroom within :data:`LEAK_HORIZON_STEPS` steps. docs/analyses.md,
    "Memory".
    """
    per_step = step_memory(events)
    per_step = per_step.filter(_steady(per_step, list(KEY)))
    known = peaks(events, capacity).select(*KEY, "capacity_bytes", "headroom_bytes", "peak_reserved_bytes")
    rows = []
    for (trace_id, rank, device), part in per_step.sort([*KEY, "step"]).group_by(KEY, maintain_order=True):
        x = [int(s) for s in part["step"]]
        y = [int(v) for v in part["min_allocated_bytes"]]
        slope = _slope(x, y)
        diffs = [b - a for a, b in zip(y, y[1:], strict=False)]
        measured = max(y) - min(y)
        grown = None if slope is None else max(-measured, min(measured, slope * (x[-1] - x[0])))
        rows.append({"trace_id": str(trace_id), "rank": rank, "device": device,
                     "steady_steps": len(x), "first_step": x[0], "last_step": x[-1], "slope_bytes_per_step": slope,
                     "growth_bytes": grown, "rising_steps": sum(d > 0 for d in diffs), "_changes": len(diffs)})
    schema = {"trace_id": pl.String, "rank": pl.Int64, "device": pl.Int64, "steady_steps": pl.Int64,
              "first_step": pl.Int64, "last_step": pl.Int64, "slope_bytes_per_step": pl.Float64,
              "growth_bytes": pl.Float64, "rising_steps": pl.Int64, "_changes": pl.Int64}
    out = pl.DataFrame(rows, schema=schema).join(known.with_columns(pl.col("trace_id").cast(pl.String)),
                                                 on=list(KEY), how="left")
    rate = pl.col("slope_bytes_per_step")
    reference = pl.coalesce("capacity_bytes", "peak_reserved_bytes")
    out = out.with_columns(
        pl.when((rate > 0) & pl.col("headroom_bytes").is_not_null())
        .then((pl.col("headroom_bytes") / rate).floor().cast(pl.Int64)).alias("steps_to_full"))
    leak = ((pl.col("steady_steps") >= LEAK_MIN_STEPS) & (rate > 0) & (2 * pl.col("rising_steps") > pl.col("_changes"))
            & ((pl.col("growth_bytes") >= LEAK_SHARE * reference)
               | (pl.col("steps_to_full").fill_null(LEAK_HORIZON_STEPS + 1) <= LEAK_HORIZON_STEPS)))
    return out.with_columns(leak.fill_null(False).alias("leak")).sort(KEY).select(GROWTH_COLUMNS)


def churn(events: pl.DataFrame, host_ops: pl.DataFrame) -> pl.DataFrame:
    """Allocator churn per (trace, rank, step): allocations, and malloc/free runtime calls (:data:`CHURN_COLUMNS`).

    ``allocs``, ``frees``, ``alloc_bytes`` count accelerator events (the CPU's, device -1, are left out);
    ``malloc_calls``/``free_calls`` count :data:`SYNC_MALLOC_CALLS`/:data:`SYNC_FREE_CALLS` in the host ops
    (``trace_id``, ``rank``, ``name``, ``step``, and ``dur_ns`` or ``dur`` for ``sync_call_ns``),
    ``async_calls`` :data:`ASYNC_CALLS`. ``steady`` is false on the first step of a (trace, rank) with
    :data:`~tracelake.analysis.steps.WARMUP_MIN_STEPS` steps or more. docs/analyses.md, "Memory".
    """
    key = ["trace_id", "rank", "step"]
    ev = _ordered(events).filter(pl.col("step").is_not_null() & (pl.col("device") >= 0))
    kind = pl.col("kind")
    allocs = ev.group_by(pl.col("trace_id").cast(pl.String), pl.col("rank").cast(pl.Int64),
                         pl.col("step").cast(pl.Int64)).agg(
        (kind == "alloc").sum().cast(pl.Int64).alias("allocs"), (kind == "free").sum().cast(pl.Int64).alias("frees"),
        pl.col("bytes").filter(kind == "alloc").sum().cast(pl.Int64).alias("alloc_bytes"))
    ops = host_ops.rename({"dur": "dur_ns"}) if "dur_ns" not in host_ops.columns and "dur" in host_ops.columns \
        else host_ops
    _need(ops, ("trace_id", "rank", "name", "step"), "host ops")
    if "dur_ns" not in ops.columns:
        ops = ops.with_columns(pl.lit(None, dtype=pl.Int64).alias("dur_ns"))
    name = pl.col("name")
    sync = name.is_in(list(SYNC_MALLOC_CALLS | SYNC_FREE_CALLS))
    counted = list(SYNC_MALLOC_CALLS | SYNC_FREE_CALLS | ASYNC_CALLS)
    calls = (ops.filter(pl.col("step").is_not_null() & name.is_in(counted))
             .group_by(pl.col("trace_id").cast(pl.String), pl.col("rank").cast(pl.Int64), pl.col("step").cast(pl.Int64))
             .agg(name.is_in(list(SYNC_MALLOC_CALLS)).sum().cast(pl.Int64).alias("malloc_calls"),
                  name.is_in(list(SYNC_FREE_CALLS)).sum().cast(pl.Int64).alias("free_calls"),
                  name.is_in(list(ASYNC_CALLS)).sum().cast(pl.Int64).alias("async_calls"),
                  pl.col("dur_ns").filter(sync).sum().cast(pl.Int64).alias("sync_call_ns")))
    out = allocs.join(calls, on=key, how="full", coalesce=True).with_columns(
        pl.col(c).fill_null(0) for c in ("allocs", "frees", "alloc_bytes", "malloc_calls", "free_calls",
                                         "async_calls", "sync_call_ns"))
    return out.with_columns(_steady(out, ["trace_id", "rank"]).alias("steady")).sort(key).select(CHURN_COLUMNS)


@dataclass(frozen=True)
class Imbalance:
    """Peak allocated memory across the ranks of a run (docs/analyses.md, "Memory", "Imbalance")."""

    ranks: int
    max_rank: int
    max_bytes: int
    min_rank: int
    min_bytes: int
    median_bytes: float
    #: ``max_bytes / median_bytes`` (at least 1); None where the median is 0.
    ratio: float | None
    traces: tuple[str, ...]


def imbalance(peak_rows: pl.DataFrame) -> Imbalance | None:
    """The rank with the largest peak allocated against the median rank's, on accelerators (None below 2 ranks).

    ``peak_rows`` are :func:`peaks` rows of one run; a rank's figure is its largest device peak.
    """
    acc = peak_rows.filter((pl.col("device") >= 0) & pl.col("peak_allocated_bytes").is_not_null())
    per_rank = acc.group_by("rank").agg(pl.col("peak_allocated_bytes").max(),
                                        pl.col("trace_id").cast(pl.String).unique().sort()).sort("rank")
    if per_rank.height < 2:
        return None
    top = per_rank.sort(["peak_allocated_bytes", "rank"], descending=[True, False]).row(0, named=True)
    low = per_rank.sort(["peak_allocated_bytes", "rank"]).row(0, named=True)
    median = per_rank.select(pl.col("peak_allocated_bytes").cast(pl.Float64).median()).item() or 0.0
    return Imbalance(per_rank.height, int(top["rank"]), int(top["peak_allocated_bytes"]), int(low["rank"]),
                     int(low["peak_allocated_bytes"]), median,
                     top["peak_allocated_bytes"] / median if median > 0 else None,
                     tuple(sorted({t for ts in per_rank["trace_id"].to_list() for t in ts})))


def out_of_memory(events: pl.DataFrame) -> pl.DataFrame:
    """The ``oom`` events (``[OutOfMemory]``): when, in which step, the request's size and the totals then."""
    ev = _ordered(events).filter(pl.col("kind") == "oom")
    return ev.select(*KEY, "ts_ns", "step", pl.col("bytes").abs().alias("requested_bytes"),
                     pl.col("total_allocated").alias("allocated_bytes"),
                     pl.col("total_reserved").alias("reserved_bytes")).sort([*KEY, "ts_ns"])
