"""The time breakdown per rank, for the whole trace and per step (docs/analyses.md, "Breakdown").

One sweep over each window's device ops: every op contributes a start (+1) and an
end (-1) to the counter of its category; between two consecutive points the state
(which categories are active) is constant, so each segment's length goes to the
buckets its state belongs to. Unions, the communication/compute intersection and
the exclusive buckets all come out of the same pass, with no per-nanosecond arrays
(docs/analyses.md, "How the stored figures are computed"). Where the C module is built
(``_sweep.c``'s ``window``) one pass over the window's columns makes the sweep, the spans and
the carried intervals without the GIL; elsewhere numpy sorts and cumulative sums make the same
(:func:`_sweeps`). Sync ops are not work and never count as busy.

Async collective windows (XLA's ``Async XLA Ops``: start to done) join the sweep as
a fourth state that is never busy: the part of them no device op covers is
``exposed_async_collective_ns``. FLOPs are summed per window, and with the device's
peak (``devices.peak_tflops``) give ``flops_utilisation_pct`` over the span; the model FLOPs
(an op's optional ``model_flops``, else its ``flops``) give ``hfu_pct`` against the same peak, and without
the recomputed ones (an op's optional ``recomputed_flops``: activation checkpointing) ``mfu_pct``
(docs/analyses.md, "Operators", "HFU and MFU").

:class:`BreakdownParts` takes one (trace, rank)'s ops window by window, as ingest feeds
them; :func:`breakdown_frame` is the same for frames in memory.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from tracelake.contracts.classify import Category
from tracelake.contracts.lazy import optional_module

#: Output columns, in order (all integer ns except ``overlap_pct``).
COLUMNS = (
    "trace_id", "rank", "step", "span_ns", "busy_ns", "idle_ns",
    "compute_ns", "communication_ns", "memory_ns",
    "overlapped_communication_ns", "exposed_communication_ns", "overlap_pct",
    "compute_only_ns", "communication_only_ns", "memory_only_ns",
    "compute_communication_ns", "other_overlap_ns",
    "async_collective_ns", "exposed_async_collective_ns", "flops", "flops_utilisation_pct", "mfu_pct", "hfu_pct",
)

_native = optional_module(f"{__package__}._sweep")  # None where no compiler built it: the numpy sweep
#: Whether the sweep runs in C (``_sweep.c``: one pass, the GIL released) rather than in numpy.
NATIVE = _native is not None

_CODES = {Category.COMPUTE: 0, Category.COMMUNICATION: 1, Category.MEMORY: 2}
_ASYNC, _OTHER = 3, 4
#: The code of an op that is not work (sync, or no category), which the C window skips.
_SKIP = 5
_STATE_BUCKETS = {
    # bucket: predicate over the 4-bit state (1 compute, 2 communication, 4 memory, 8 async window)
    "busy_ns": lambda s: (s & 7) != 0,
    "compute_ns": lambda s: (s & 1) != 0,
    "communication_ns": lambda s: (s & 2) != 0,
    "memory_ns": lambda s: (s & 4) != 0,
    "overlapped_communication_ns": lambda s: (s & 3) == 3,
    "compute_only_ns": lambda s: (s & 7) == 1,
    "communication_only_ns": lambda s: (s & 7) == 2,
    "memory_only_ns": lambda s: (s & 7) == 4,
    "compute_communication_ns": lambda s: (s & 7) == 3,
    "async_collective_ns": lambda s: (s & 8) != 0,
    "exposed_async_collective_ns": lambda s: s == 8,
}


#: ``_BUCKET_MASKS[b, s]``: whether state ``s`` counts towards bucket ``b`` (in ``_STATE_BUCKETS`` order).
_BUCKET_MASKS = np.array([[bool(test(s)) for s in range(16)] for test in _STATE_BUCKETS.values()])
#: The same as integers, (state, bucket): a row of time per state times it is the time per bucket, exactly.
_BUCKETS_OF_STATES = _BUCKET_MASKS.T.astype(np.int64)


def _stable_order(values: np.ndarray) -> np.ndarray:
    """A stable argsort: timsort, linear on the nearly sorted columns traces hold (and on merging sorted runs)."""
    return np.argsort(values, kind="stable")


def _deltas(low: int) -> np.ndarray:
    """By ``code * 2 + is_start``: the change a point makes to the running count of codes ``low`` (bits 0-31) and
    ``low + 1`` (bits 32-63); 0 for the other codes."""
    table = np.zeros(2 * (_OTHER + 1), dtype=np.int64)
    for code in (low, low + 1):
        table[2 * code], table[2 * code + 1] = -(1 << (32 * (code - low))), 1 << (32 * (code - low))
    return table


#: :func:`_deltas` of compute and communication (codes 0 and 1), and of memory and async windows (2 and 3).
_DELTAS = (_deltas(0), _deltas(2))


def _states(code: np.ndarray, is_start: np.ndarray) -> np.ndarray:
    """The 4-bit state after each point of a sweep (points in order; a key's points sum to zero per category)."""
    return _states_of(code.astype(np.intp) * 2 + is_start)


def _states_of(index: np.ndarray) -> np.ndarray:
    """:func:`_states` of points given as ``code * 2 + is_start``.

    Two running counts hold the four categories' active intervals, 32 bits each (compute and communication in
    one, memory and async windows in the other): a count never falls below 0 (an interval's start comes before
    its end) nor reaches 2**31 (no more intervals than points), so no field borrows from or carries into the next.
    """
    state = np.zeros(len(index), dtype=np.int8)
    for bit, table in zip((1, 4), _DELTAS, strict=True):
        running = np.cumsum(table[index])
        state |= ((running & 0xFFFFFFFF) != 0).view(np.int8) * np.int8(bit)
        state |= ((running >> 32) != 0).view(np.int8) * np.int8(bit * 2)
    return state


def _bucket_sums(per_state: np.ndarray) -> np.ndarray:
    """(keys, 16) time per state -> (keys, buckets) integer sums (exact: integral values far below 2**53).

    Column sums, not a matrix product: that would wake OpenBLAS's threads, which then spin on the
    cores the ingest needs.
    """
    return np.rint(np.stack([per_state[:, mask].sum(axis=1) for mask in _BUCKET_MASKS], axis=1)).astype(np.int64)


def _step_index(step: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct steps (>= 0, sorted) and each interval's index into them; ``len(values)`` for no step."""
    in_step = step >= 0
    if not in_step.any():
        return np.zeros(0, dtype=np.int64), np.zeros(len(step), dtype=np.int64)
    mine = step[in_step]
    low, high = int(mine.min()), int(mine.max())
    dense = np.empty(len(step), dtype=np.int64)
    if high - low < 2**15:  # a short range: counted, not sorted
        values = np.flatnonzero(np.bincount(mine - low, minlength=high - low + 1)) + low
        lookup = np.zeros(high - low + 1, dtype=np.int64)
        lookup[values - low] = np.arange(len(values))
        dense[in_step] = lookup[mine - low]
    else:
        values, inverse = np.unique(mine, return_inverse=True)
        dense[in_step] = inverse.reshape(-1)
    dense[~in_step] = len(values)
    return values.astype(np.int64), dense


def _whole_sums(state: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Bucket sums of one sweep: each segment between consecutive points goes to the state after its first."""
    return _bucket_sums(np.bincount(state[:-1].astype(np.intp), weights=np.diff(t), minlength=16)[None, :16])[0]


def _sweeps(start: np.ndarray, end: np.ndarray, code: np.ndarray,
            step: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Bucket sums of the whole window and of each step (``step`` < 0: in no step), from one time order: numpy's
    sweep, where the C window is not built.

    The start and end points are each sorted with a stable (near-linear on traces) sort and merged;
    the per-step sweep reuses that order, stably re-sorted by step only when steps interleave in time.
    Each point carries its step index, code and kind packed in one integer (``step << 4 | code << 1 |
    is_start``), so the merge moves two arrays. Returns (whole sums, step values, per-step sums).
    """
    values, dense = _step_index(step)
    none = len(values)
    packed = (dense << 4) | (code.astype(np.int64) << 1)
    del dense
    o_start, o_end = _stable_order(start), _stable_order(end)
    t = np.concatenate([start[o_start], end[o_end]])
    p = np.concatenate([packed[o_start] | 1, packed[o_end]])
    del o_start, o_end, packed
    merged = _stable_order(t)
    t, p = t[merged], p[merged]
    del merged
    state = _states_of(p & 15)
    k = p >> 4
    in_step = k != none
    every = bool(in_step.all())
    whole = None
    if not every:  # the whole sweep has points in no step: its own sums
        whole = _whole_sums(state, t)
        if not none:
            return whole, values, np.zeros((0, len(_STATE_BUCKETS)), dtype=np.int64)
        t, k, p = t[in_step], k[in_step], p[in_step]
    del in_step
    if len(k) > 1 and bool((k[1:] < k[:-1]).any()):  # steps interleave in time
        if whole is None:
            whole = _whole_sums(state, t)
        order = _stable_order(k.astype(np.int16) if none < 2**15 else k)  # int16: radix sort
        t, k, p = t[order], k[order], p[order]
        del order
        state = _states_of(p & 15)
    elif not every:
        state = _states_of(p & 15)
    # else: the same points in the same order as the whole sweep, hence the same states
    length = np.diff(t)
    cross = k[1:] != k[:-1]
    # the whole sweep's segments are the steps' plus those running from one step into the next (exact integer sums)
    crossing = np.bincount(state[:-1][cross].astype(np.intp), weights=length[cross], minlength=16) \
        if whole is None else None
    length[cross] = 0  # no segment runs from one step into the next
    per_state = np.bincount(k[:-1] * 16 + state[:-1], weights=length, minlength=none * 16).reshape(-1, 16)
    if whole is None:
        whole = _bucket_sums((per_state.sum(axis=0) + crossing)[None, :16])[0]
    return whole, values, _bucket_sums(per_state)


def breakdown_frame(
    device_ops: pl.DataFrame,
    async_windows: pl.DataFrame | None = None,
    peak_tflops: dict[tuple[str, int], float] | None = None,
) -> pl.DataFrame:
    """The breakdown rows (:data:`COLUMNS`) of device ops in memory: per (trace, rank) whole-trace rows, then
    one per step with ops.

    Args:
        device_ops: ``trace_id``, ``rank``, ``step``, ``category``, ``ts_ns``, ``dur_ns`` and (optional) ``flops``.
        async_windows: async collective spans (``trace_id``, ``rank``, ``step``, ``ts_ns``, ``dur_ns``).
        peak_tflops: the device's peak per (trace, rank), for ``flops_utilisation_pct``.
    """
    ops = device_ops if "flops" in device_ops.columns else \
        device_ops.with_columns(pl.lit(None, dtype=pl.Float64).alias("flops"))
    rows: list[dict[str, object]] = []
    one = ops.height and ops["trace_id"].n_unique() == 1 and ops["rank"].n_unique() == 1
    groups = [((ops["trace_id"][0], ops["rank"][0]), ops)] if one else \
        ops.group_by(["trace_id", "rank"], maintain_order=True)
    for (trace_id, rank), group in groups:
        mine = async_windows.filter((pl.col("trace_id") == trace_id) & (pl.col("rank") == rank)) \
            if async_windows is not None else None
        parts = BreakdownParts()
        parts.add(group, mine)
        rows.extend(parts.rows(str(trace_id), int(rank), (peak_tflops or {}).get((str(trace_id), int(rank)))))
    return rows_frame(rows)


def rows_frame(rows: list[dict[str, object]]) -> pl.DataFrame:
    """Breakdown rows (from :meth:`BreakdownParts.rows`) as a frame of :data:`COLUMNS`, whole-trace rows first."""
    schema = {c: (pl.String if c == "trace_id" else pl.Int32 if c == "rank" else
                  pl.Float64 if c in ("overlap_pct", "flops", "flops_utilisation_pct", "mfu_pct", "hfu_pct")
                  else pl.Int64)
              for c in COLUMNS}
    frame = pl.DataFrame(rows, schema=schema) if rows else pl.DataFrame(schema=schema)
    return frame.sort(["trace_id", "rank", pl.col("step").is_not_null(), "step"], nulls_last=False)


# -- the breakdown of one (trace, rank), window by window -------------------------------
#
# The sweep is additive over disjoint time windows once every interval is clipped to the
# window: the state at an instant depends only on the intervals covering it. So a rank's
# ops can be fed in windows [low, high) of start times, each op in the window its start
# falls in; the part of an interval past ``high`` is carried into the next window. Spans
# and FLOPs are plain minima, maxima and sums over the ops, counted where each op starts.

#: Open bounds of the first and last window (no clipping).
LOWEST, HIGHEST = -(2**63), 2**63 - 1


@dataclass
class _Span:
    """First start, last end, FLOPs and model FLOPs of a step's (or the whole rank's) ops."""

    first: int
    last: int
    flops: float
    has_flops: bool
    model_flops: float = 0.0
    has_model_flops: bool = False
    #: Of ``model_flops``, those of recomputed forward ops (counted by HFU, not by MFU).
    recomputed_flops: float = 0.0

    def merge(self, other: _Span) -> _Span:
        return _Span(min(self.first, other.first), max(self.last, other.last), self.flops + other.flops,
                     self.has_flops or other.has_flops, self.model_flops + other.model_flops,
                     self.has_model_flops or other.has_model_flops, self.recomputed_flops + other.recomputed_flops)


def _empty_sums() -> np.ndarray:
    return np.zeros(len(_STATE_BUCKETS), dtype=np.int64)


def _categories(ops: pl.DataFrame, skip: bool = False) -> np.ndarray:
    """Each op's sweep code (:data:`_CODES`, else :data:`_OTHER`; with ``skip``, :data:`_SKIP` for sync ops and
    ops of no category, int64)."""
    category = pl.col("category")
    codes = pl.when(category == Category.COMPUTE).then(_CODES[Category.COMPUTE]) \
        .when(category == Category.COMMUNICATION).then(_CODES[Category.COMMUNICATION]) \
        .when(category == Category.MEMORY).then(_CODES[Category.MEMORY])
    if skip:
        codes = codes.when(category.is_null() | (category == Category.SYNC)).then(_SKIP)
    return ops.select(codes.otherwise(_OTHER).cast(pl.Int64 if skip else pl.Int8))[:, 0].to_numpy()


#: The columns of the ops :meth:`BreakdownParts.add` reads (the last two optional).
_SPAN_COLUMNS = ("category", "ts_ns", "dur_ns", "step", "flops", "model_flops", "recomputed_flops")


@dataclass
class BreakdownParts:
    """The breakdown of one (trace, rank) so far: bucket sums and spans, plus the intervals running past the window.

    Feed it consecutive windows of start times with :meth:`add`, then read :meth:`rows`.
    The result does not depend on how the ops were cut into windows (a test checks it).
    """

    whole: np.ndarray = field(default_factory=_empty_sums)
    steps: dict[int, np.ndarray] = field(default_factory=dict)
    spans: dict[int | None, _Span] = field(default_factory=dict)
    #: Intervals (start, end, code, step; step -1 for none) that end after the last window's ``high``.
    carry: tuple[np.ndarray, ...] = field(default_factory=lambda: tuple(np.zeros(0, dtype=np.int64)
                                                                         for _ in range(4)))
    #: The C window's work space (:data:`_native`), reused by each window.
    _work: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64), repr=False)

    def add(self, ops: pl.DataFrame, async_windows: pl.DataFrame | None = None, low: int = LOWEST,
            high: int = HIGHEST) -> None:
        """Add the ops (``category``, ``ts_ns``, ``dur_ns``, ``step``, ``flops``) and async windows (``ts_ns``,
        ``dur_ns``, ``step``) that start in ``[low, high)``; windows must come in time order.
        """
        if _native is not None:  # the same, each column read once (_sweep.c's window)
            self._add_native(ops, async_windows, low, high)
            return
        ops = ops.select(c for c in _SPAN_COLUMNS if c in ops.columns).filter(  # only the columns read are copied
            (pl.col("category") != Category.SYNC) & (pl.col("dur_ns") >= 0))
        start = ops["ts_ns"].to_numpy().astype(np.int64)
        end = start + ops["dur_ns"].to_numpy().astype(np.int64)
        code = _categories(ops).astype(np.int64)
        steps = ops["step"].fill_null(-1).to_numpy().astype(np.int64)
        if async_windows is not None:
            windows = async_windows.filter(pl.col("dur_ns") >= 0)
            w_start = windows["ts_ns"].to_numpy().astype(np.int64)
            start = np.concatenate([start, w_start])
            end = np.concatenate([end, w_start + windows["dur_ns"].to_numpy().astype(np.int64)])
            code = np.concatenate([code, np.full(windows.height, _ASYNC, dtype=np.int64)])
            steps = np.concatenate([steps, windows["step"].fill_null(-1).to_numpy().astype(np.int64)])
        self._add_spans(ops)
        start, end, code, steps = (np.concatenate([old, new]) for old, new in
                                   zip(self.carry, (start, end, code, steps)))
        carried = end > high
        self.carry = (start[carried], end[carried], code[carried], steps[carried])
        clipped_start, clipped_end = np.maximum(start, low), np.minimum(end, high)
        useful = clipped_end > clipped_start  # zero-length pieces add nothing to any bucket
        if not useful.all():
            clipped_start, clipped_end, code, steps = (a[useful] for a in (clipped_start, clipped_end, code, steps))
        if not len(clipped_start):
            return
        whole, step_values, step_sums = _sweeps(clipped_start, clipped_end, code, steps)
        self.whole += whole
        for value, sums in zip(step_values.tolist(), step_sums):
            if value in self.steps:
                self.steps[value] = self.steps[value] + sums
            else:
                self.steps[value] = sums

    def _add_native(self, ops: pl.DataFrame, async_windows: pl.DataFrame | None, low: int, high: int) -> None:
        assert _native is not None  # for the type checker: add() checks it
        if ops["ts_ns"].null_count():  # an op without a start is nowhere in time (windows hold none)
            ops = ops.filter(pl.col("ts_ns").is_not_null())
        flops = _valued(ops["flops"])
        model = _valued(ops["model_flops"]) if "model_flops" in ops.columns else flops  # else the ops' own, once
        again = _valued(ops["recomputed_flops"]) if "recomputed_flops" in ops.columns else \
            [np.zeros(ops.height), np.ones(ops.height, dtype=bool)]
        floats = [*flops, *model, *again]
        extra = self.carry
        if async_windows is not None and async_windows.height:
            windows = async_windows.filter(pl.col("dur_ns") >= 0)
            start = _ints(windows["ts_ns"])
            extra = tuple(np.concatenate([old, new]) for old, new in zip(self.carry, (
                start, start + _ints(windows["dur_ns"]), np.full(windows.height, _ASYNC, dtype=np.int64),
                _ints(windows["step"].fill_null(-1)))))
        size = ops.height + len(extra[0])
        if len(self._work) < 10 * size:  # kept from window to window: fresh memory each time cost more than the sweep
            # mapped, not numpy's: numpy asks for huge pages from 4 MB, and then every part of the space the window
            # does not use (the orders, where the ops are in order) would be memory held too
            self._work = np.frombuffer(mmap.mmap(-1, 10 * size * 8), dtype=np.int64)
        whole, steps, spans, carried = _native.window(
            _ints(ops["ts_ns"]), _ints(ops["dur_ns"].fill_null(-1)), _categories(ops, skip=True),
            _ints(ops["step"].fill_null(-1)), *floats, *extra, low, high, self._work)
        self.carry = tuple(self._work[i * size:i * size + carried].copy() for i in range(4))
        self.whole += np.array(whole, dtype=np.int64) @ _BUCKETS_OF_STATES
        for value, states in steps:
            sums = np.array(states, dtype=np.int64) @ _BUCKETS_OF_STATES
            self.steps[value] = self.steps[value] + sums if value in self.steps else sums
        for step, first, last, flops_sum, has_flops, model, has_model, recomputed in spans:
            span = _Span(first, last, flops_sum, bool(has_flops), model, bool(has_model), recomputed)
            self.spans[step] = self.spans[step].merge(span) if step in self.spans else span

    def _add_spans(self, ops: pl.DataFrame) -> None:
        if not ops.height:
            return
        end = pl.col("ts_ns") + pl.col("dur_ns")
        model = pl.col("model_flops") if "model_flops" in ops.columns else pl.col("flops")
        aggs = (pl.col("ts_ns").min().alias("first"), end.max().alias("last"), pl.col("flops").sum().alias("flops"),
                pl.col("flops").is_not_null().any().alias("has_flops"), model.sum().alias("model_flops"),
                model.is_not_null().any().alias("has_model_flops"),
                (pl.col("recomputed_flops").sum() if "recomputed_flops" in ops.columns else pl.lit(0.0))
                .alias("recomputed_flops"))
        whole = ops.select(*aggs).with_columns(pl.lit(None, dtype=ops.schema["step"]).alias("step"))
        per_step = ops.filter(pl.col("step").is_not_null()).group_by("step").agg(*aggs)
        for row in [*whole.to_dicts(), *per_step.to_dicts()]:
            if row["first"] is None:
                continue
            span = _Span(int(row["first"]), int(row["last"]), float(row["flops"] or 0.0), bool(row["has_flops"]),
                         float(row["model_flops"] or 0.0), bool(row["has_model_flops"]),
                         float(row["recomputed_flops"] or 0.0))
            step = None if row["step"] is None else int(row["step"])
            self.spans[step] = self.spans[step].merge(span) if step in self.spans else span

    def rows(self, trace_id: str, rank: int, peak: float | None) -> list[dict[str, object]]:
        """The rank's breakdown rows: the whole trace (step None), then each step with ops."""
        names = list(_STATE_BUCKETS)
        out = []
        for step in sorted(self.spans, key=lambda s: (s is not None, s or 0)):
            span = self.spans[step]
            found = self.whole if step is None else self.steps.get(step)
            sums = dict(zip(names, found.tolist())) if found is not None else dict.fromkeys(names, 0)
            out.append(_row(trace_id, rank, step, span, sums, peak))
        return out


def _ints(column: pl.Series) -> np.ndarray:
    """A column without nulls as int64 values (not copied where they are int64 already)."""
    return column.to_numpy().astype(np.int64, copy=False)


def _valued(column: pl.Series) -> list[np.ndarray]:
    """A float column's values (0 where null) and whether each is not null."""
    return [column.fill_null(0.0).to_numpy().astype(np.float64, copy=False), column.is_not_null().to_numpy()]


def _row(trace_id: str, rank: int, step: int | None, span: _Span, sums: dict[str, int],
         peak: float | None) -> dict[str, object]:
    """One output row from a span and its bucket sums."""
    length = span.last - span.first
    flops = span.flops if span.has_flops else None
    executed = span.model_flops if span.has_model_flops else None
    model = max(span.model_flops - span.recomputed_flops, 0.0) if executed is not None else None
    communication = sums["communication_ns"]
    return {
        "trace_id": trace_id, "rank": rank, "step": step, "span_ns": length,
        "busy_ns": sums["busy_ns"], "idle_ns": length - sums["busy_ns"],
        "compute_ns": sums["compute_ns"], "communication_ns": communication, "memory_ns": sums["memory_ns"],
        "overlapped_communication_ns": sums["overlapped_communication_ns"],
        "exposed_communication_ns": communication - sums["overlapped_communication_ns"],
        "overlap_pct": 100.0 * sums["overlapped_communication_ns"] / communication if communication else None,
        "compute_only_ns": sums["compute_only_ns"], "communication_only_ns": sums["communication_only_ns"],
        "memory_only_ns": sums["memory_only_ns"], "compute_communication_ns": sums["compute_communication_ns"],
        "other_overlap_ns": sums["busy_ns"] - sums["compute_only_ns"] - sums["communication_only_ns"]
        - sums["memory_only_ns"] - sums["compute_communication_ns"],
        "async_collective_ns": sums["async_collective_ns"],
        "exposed_async_collective_ns": sums["exposed_async_collective_ns"],
        "flops": flops,
        "flops_utilisation_pct": 100.0 * flops / (peak * 1e12 * length / 1e9)
        if flops is not None and peak and length > 0 else None,
        "mfu_pct": 100.0 * model / (peak * 1e12 * length / 1e9)
        if model is not None and peak and length > 0 else None,
        "hfu_pct": 100.0 * executed / (peak * 1e12 * length / 1e9)
        if executed is not None and peak and length > 0 else None,
    }
