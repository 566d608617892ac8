"""Idle time between consecutive ops on one stream, by cause (docs/analyses.md, "Idle gaps by cause").

For each gap on a stream (the next op starts after the previous one ended):
``host_wait`` when the runtime call that launched the next op started after the
previous op had ended (the CPU was late), else ``kernel_wait`` when the gap is at
most ``kernel_wait_ns`` (back-to-back launch gaps), else ``other``.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from tracelake.contracts.classify import Category
from tracelake.contracts.lazy import optional_module

#: Gaps up to this long, with the launch already issued, are launch-to-launch gaps.
KERNEL_WAIT_NS = 30_000

COLUMNS = ("trace_id", "rank", "stream", "ops", "op_ns", "gaps", "idle_ns", "host_wait_ns", "kernel_wait_ns",
           "other_ns")

_native = optional_module(f"{__package__}._sweep")  # None where no compiler built it: the numpy sweep

#: Stands for "no earlier op on this stream" in a carry, and for a missing stream number in :func:`idle_window`.
_NO_END = -(2**63)


def idle_frame(ops: pl.DataFrame, launches: pl.DataFrame | None = None,
               kernel_wait_ns: int = KERNEL_WAIT_NS) -> pl.DataFrame:
    """The idle rows (:data:`COLUMNS`) per (trace, rank, stream) of device ops in memory.

    The same computation as ingest's (:func:`idle_window` over each (trace, rank) in one window);
    ops without a start or a duration are left out.

    Args:
        ops: device ops (``trace_id``, ``rank``, ``stream``, ``category``, ``ts_ns``, ``dur_ns``,
            ``correlation``).
        launches: the first host event per (``trace_id``, ``correlation``) as ``launch_ns``.
    """
    work = ops.filter((pl.col("category") != Category.SYNC) & pl.col("ts_ns").is_not_null()
                      & pl.col("dur_ns").is_not_null()).select(
        "trace_id", "rank", "stream", "ts_ns", (pl.col("ts_ns") + pl.col("dur_ns")).alias("end_ns"), "correlation")
    if launches is not None and launches.height and work["correlation"].null_count() < work.height:
        work = work.join(launches, on=["trace_id", "correlation"], how="left", maintain_order="left")
    else:
        work = work.with_columns(pl.lit(None, dtype=pl.Int64).alias("launch_ns"))
    work = work.drop("correlation")
    return combine_windows([idle_window(rank, {}, kernel_wait_ns)
                            for rank in work.partition_by("trace_id", "rank", maintain_order=True)])


def _one_rank(work: pl.DataFrame, kernel_wait_ns: int, carry: dict[int, int] | None = None) -> pl.DataFrame:
    """The idle rows of one (trace, rank) with no missing times or streams, in numpy.

    Sorts by (stream, ts, end) with stable sorts (near-linear on a trace's nearly sorted columns),
    takes each stream's running maximum of the ends in one pass, and sums per stream by segment.
    ``carry`` (see :func:`idle_window`) gives each stream's latest end before these ops, and is updated.
    """
    stream, ts, end = (work[name].to_numpy().astype(np.int64, copy=False) for name in ("stream", "ts_ns", "end_ns"))
    streams = _distinct(stream)
    order = _by_start_end(ts, end)
    if _native is not None:
        return _one_rank_native(work, kernel_wait_ns, carry, stream, ts, end, streams, order)
    if len(streams) > 1:
        dense = np.searchsorted(streams, stream)
        order = order[np.argsort(dense[order], kind="stable")]
        dense = dense[order]
    else:
        dense = np.zeros(len(order), dtype=np.int64)
    stream, ts, end = stream[order], ts[order], end[order]
    launch_col = work["launch_ns"]
    if launch_col.null_count() == len(launch_col):  # no op's launch known (XLA on TPU)
        has_launch = np.zeros(len(order), dtype=bool)
        launch = np.zeros(len(order), dtype=np.int64)
    else:
        has_launch = launch_col.is_not_null().to_numpy()[order]
        launch = launch_col.fill_null(0).to_numpy().astype(np.int64)[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = dense[1:] != dense[:-1]
    starts = np.flatnonzero(first)
    low, span = int(end.min()), int(end.max()) - int(end.min()) + 1
    if len(streams) * span < 2**62:  # offset each stream above the previous ones: one running maximum
        offset = dense * span - low
        running = np.maximum.accumulate(end + offset) - offset
    else:
        running = np.empty_like(end)
        bounds = [*starts.tolist(), len(end)]
        for a, b in zip(bounds[:-1], bounds[1:]):
            running[a:b] = np.maximum.accumulate(end[a:b])
    prev_end = np.empty_like(end)
    prev_end[1:] = running[:-1]
    prev_end[first] = 0
    if carry:
        known = [int(s) in carry for s in stream[starts].tolist()]
        before = np.array([carry.get(int(s), _NO_END) for s in stream[starts].tolist()], dtype=np.int64)
        counts = np.diff(np.append(starts, len(order)))
        running = np.maximum(running, np.repeat(before, counts))
        prev_end[1:] = running[:-1]
        prev_end[starts] = np.where(np.array(known, dtype=bool), before, 0)
        first[starts[np.array(known, dtype=bool)]] = False  # the stream's earlier ops precede these
    if carry is not None:
        carry.update(zip(stream[starts].tolist(), running[np.append(starts[1:], len(order)) - 1].tolist()))
    gap = ts - prev_end
    is_gap = ~first & (ts > prev_end)
    host = has_launch & (launch > prev_end)
    kernel = ~host & (gap <= kernel_wait_ns)

    def per_stream(values: np.ndarray) -> np.ndarray:
        return np.add.reduceat(values.astype(np.int64), starts)

    gap = np.where(is_gap, gap, 0)
    out = work.select("trace_id", "rank", "stream")[order[starts].tolist()]
    return out.with_columns(
        pl.Series("ops", np.diff(np.append(starts, len(order))), dtype=pl.Int64),
        pl.Series("op_ns", per_stream(end - ts), dtype=pl.Int64),
        pl.Series("gaps", per_stream(is_gap), dtype=pl.Int64),
        pl.Series("idle_ns", per_stream(gap), dtype=pl.Int64),
        pl.Series("host_wait_ns", per_stream(np.where(host, gap, 0)), dtype=pl.Int64),
        pl.Series("kernel_wait_ns", per_stream(np.where(kernel, gap, 0)), dtype=pl.Int64),
        pl.Series("other_ns", per_stream(np.where(~host & ~kernel, gap, 0)), dtype=pl.Int64),
    ).select(COLUMNS)


def _one_rank_native(work: pl.DataFrame, kernel_wait_ns: int, carry: dict[int, int] | None, stream: np.ndarray,
                     ts: np.ndarray, end: np.ndarray, streams: np.ndarray, order: np.ndarray) -> pl.DataFrame:
    """:func:`_one_rank` in one pass over the ops in (start, end) order, each stream's sums kept as it goes, with the
    GIL released (``_sweep.idle``): no sort by stream."""
    assert _native is not None
    dense = np.searchsorted(streams, stream) if len(streams) > 1 else np.zeros(len(stream), dtype=np.int64)
    launch_col = work["launch_ns"]
    if launch_col.null_count() == len(launch_col):  # no op's launch known (XLA on TPU)
        has_launch = launch = np.zeros(len(ts), dtype=np.int64)
    else:
        has_launch = launch_col.is_not_null().to_numpy().astype(np.int64)
        launch = launch_col.fill_null(0).to_numpy().astype(np.int64, copy=False)
    listed = streams.tolist()
    known = np.array([s in carry for s in listed] if carry else np.zeros(len(listed)), dtype=np.int64)
    before = np.array([carry.get(s, _NO_END) for s in listed] if carry else np.full(len(listed), _NO_END),
                      dtype=np.int64)
    sums = np.zeros((len(listed), 9), dtype=np.int64)
    _native.idle(order.astype(np.int64, copy=False), dense.astype(np.int64, copy=False), ts, end, has_launch, launch,
                 known, before, kernel_wait_ns, sums)
    if carry is not None:
        carry.update(zip(listed, sums[:, 7].tolist()))
    out = work.select("trace_id", "rank", "stream")[sums[:, 8].tolist()]
    return out.with_columns(
        pl.Series(name, sums[:, i], dtype=pl.Int64) for i, name in enumerate(COLUMNS[3:])).select(COLUMNS)


def _by_start_end(ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """The positions in (``ts``, ``end``) order, ties in input order (two stable sorts' result), cheaply for ops
    that come in start order (windows do): none moves when the ends of each start are in order too, and else one
    stable sort of (rank of the start, end) as one integer, where that fits in 63 bits."""
    if bool((ts[1:] >= ts[:-1]).all()):
        tied = ts[1:] == ts[:-1]
        if not bool((tied & (end[1:] < end[:-1])).any()):
            return np.arange(len(ts))
        rank = np.concatenate([[0], np.cumsum(~tied)])
        low, span = int(end.min()), int(end.max()) - int(end.min()) + 1
        if int(rank[-1]) * span + span < 2**63:
            return np.argsort(rank * span + (end - low), kind="stable")
    order = np.argsort(end, kind="stable")
    return order[np.argsort(ts[order], kind="stable")]


def _distinct(values: np.ndarray) -> np.ndarray:
    """The distinct values of an int64 array, sorted: by counting where they span a short range (stream numbers)."""
    if not len(values):
        return values[:0]
    low, high = int(values.min()), int(values.max())
    if high - low < 1 << 16:
        return np.flatnonzero(np.bincount(values - low, minlength=high - low + 1)) + low
    return np.unique(values)


def idle_window(ops: pl.DataFrame, carry: dict[int, int], kernel_wait_ns: int = KERNEL_WAIT_NS) -> pl.DataFrame:
    """Idle sums per stream of one (trace, rank)'s ops whose starts fall in one window of time.

    Feed a rank's ops in consecutive windows of start times (every op with the same start in the
    same window) with the same ``carry`` (each stream's latest end so far, updated here), then add
    the parts up with :func:`combine_windows`: the result does not depend on how the ops were cut.

    Args:
        ops: ``trace_id``, ``rank``, ``stream``, ``ts_ns``, ``end_ns`` and ``launch_ns`` (null if
            unknown), sync ops already left out; no missing ``ts_ns`` or ``end_ns``.
    """
    if not ops.height:
        return pl.DataFrame(schema={c: ops.schema[c] if c in ops.schema else pl.Int64 for c in COLUMNS})
    missing = ops["stream"].null_count() > 0
    if missing:  # the ops without a stream number are a stream of their own
        ops = ops.with_columns(pl.col("stream").fill_null(_NO_END))
    part = _one_rank(ops, kernel_wait_ns, carry)
    if missing:
        part = part.with_columns(pl.when(pl.col("stream") != _NO_END).then(pl.col("stream")).alias("stream"))
    return part


def combine_windows(parts: list[pl.DataFrame]) -> pl.DataFrame:
    """The per-stream rows of :func:`idle_window` parts, added up: the rank's idle rows (:data:`COLUMNS`)."""
    keys = ["trace_id", "rank", "stream"]
    if not parts:
        return pl.DataFrame(schema={c: pl.String if c == "trace_id" else pl.Int32 if c == "rank" else pl.Int64
                                    for c in COLUMNS})
    frame = pl.concat(parts, how="vertical_relaxed")
    return frame.group_by(keys).agg(pl.exclude(keys).sum()).sort(keys).select(COLUMNS)
