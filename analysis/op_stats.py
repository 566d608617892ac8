"""Device time, FLOPs and bytes per PyTorch operator, and each operator's place on the roofline.

docs/analyses.md, "Operators": each device op (kernel, memcpy, memset; syncs excluded) is attributed
through the runtime call that launched it (:func:`launches.launch_call_rows`, the project's one rule) to
a ``cpu_op`` enclosing that call on its thread: the innermost one that carries a cost estimate
(:func:`flops.counted`), else the innermost one. Kernels no operator launched go to :data:`NO_OPERATOR`.
An operator call's FLOPs and bytes (:func:`flops.op_cost`) count once, however many device ops it
launched, on the first of them (by start, then ``event_id``), so a window of time (a step) gets the
FLOPs of the calls whose first device op starts in it. Pure: polars and numpy in, frames out.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import polars as pl

from tracelake.contracts.classify import Category

from .flops import counted, op_cost
from .launches import launch_call_rows
from .peaks import Peaks

#: The ``op`` of device ops no operator launched (no launch call, or no ``cpu_op`` around the call).
NO_OPERATOR = "(no operator)"

#: Cost kinds whose FLOPs are the model's (MFU's numerator); the others (norms, elementwise,
#: reductions, the optimizer's updates) are counted in ``flops`` but not in model FLOPs.
MODEL_KINDS = frozenset({"matmul", "conv", "attention"})

#: Output columns of :meth:`OpParts.rows`, in order.
COLUMNS = ("trace_id", "rank", "op", "input_shapes", "dtype", "kind", "count", "host_ns", "device_ns", "kernels",
           "flops", "bytes", "achieved_tflops", "arithmetic_intensity", "bound", "pct_of_roofline",
           "above_roofline")

SCHEMA: dict[str, Any] = {
    "trace_id": pl.String, "rank": pl.Int32, "op": pl.String, "input_shapes": pl.String, "dtype": pl.String,
    "kind": pl.String, "count": pl.Int64, "host_ns": pl.Int64, "device_ns": pl.Int64, "kernels": pl.Int64,
    "flops": pl.Float64, "bytes": pl.Int64, "achieved_tflops": pl.Float64, "arithmetic_intensity": pl.Float64,
    "bound": pl.String, "pct_of_roofline": pl.Float64, "above_roofline": pl.Boolean,
}

#: The host_ops columns :class:`Operators` reads.
HOST_COLUMNS = ("event_id", "rank", "cat", "name", "ts_ns", "dur_ns", "parent_id", "correlation", "input_dims",
                "input_types")

#: The columns of an operator call :meth:`Operators.add_calls` reads.
_CALL_SCHEMA: dict[str, Any] = {"event_id": pl.Int64, "name": pl.String, "rank": pl.Int32, "dur_ns": pl.Int64,
                                "input_dims": pl.String, "input_types": pl.String}

_MAX_DEPTH = 4096  # deeper than any real stack: a parent chain this long is a cycle


def peak_for(peaks: Peaks | None, dtype: str | None, kind: str | None) -> float | None:
    """The peak FLOP/s an op of ``dtype`` and cost ``kind`` is measured against.

    fp32 matrix work (matmul, conv, attention) uses the tf32 tensor-core figure where the device has
    one: whether an fp32 matmul ran as TF32 is not in the trace, and the higher figure keeps MFU and
    % of roofline at most 100 either way (against the fp32 figure a TF32 matmul would exceed it).
    """
    if peaks is None:
        return None
    if dtype == "fp32" and kind in MODEL_KINDS and peaks.flops_for("tf32"):
        return max(peaks.flops_for("tf32") or 0.0, peaks.flops_for("fp32") or 0.0)
    return peaks.flops_for(dtype)


def counted_mask(names: pl.Series) -> np.ndarray:
    """Whether each name is an operator that carries a cost (:func:`flops.counted`); a name is looked up once."""
    names = names.cast(pl.String)
    known = {name: counted(name) for name in names.unique().to_list() if name}
    return names.replace_strict(known, default=False, return_dtype=pl.Boolean).fill_null(False).to_numpy()


def _owners(start: np.ndarray, parent: np.ndarray, is_op: np.ndarray, is_counted: np.ndarray) -> np.ndarray:
    """For each start event (an index), the nearest event on its parent chain (itself included) that is a counted
    operator, else the nearest operator; -1 for none. Walks up from the starts only, one level a round, over the
    chains not yet settled: memory follows the launch calls, not every host event."""
    innermost = np.full(len(start), -1, dtype=np.int64)
    owner = np.full(len(start), -1, dtype=np.int64)
    at = start.astype(np.int64)
    live = np.flatnonzero(at >= 0)
    for _ in range(_MAX_DEPTH):
        if not len(live):
            break
        here = at[live]
        op = is_op[here]
        first = op & (innermost[live] < 0)
        innermost[live[first]] = here[first]
        hit = op & is_counted[here]
        owner[live[hit]] = here[hit]
        up = parent[here]
        keep = ~hit & (up >= 0)
        at[live] = up
        live = live[keep]
    return np.where(owner >= 0, owner, innermost)


class Operators:
    """One trace's operator calls that launched device work, and the call each correlation id is attributed to.

    Args:
        host: the trace's host events, columns :data:`HOST_COLUMNS` (any order; ``input_dims`` and
            ``input_types`` are JSON text, as ``host_ops`` stores them). A caller reading a large trace uses
            :meth:`from_arrays` and then :meth:`add_calls` with the rows of :attr:`events` only.
    """

    def __init__(self, host: pl.DataFrame) -> None:
        host = host.filter(pl.col("event_id").is_not_null())
        calls = host.select(pl.int_range(pl.len()).alias("row"), "correlation", "ts_ns", "dur_ns").filter(
            pl.col("correlation").is_not_null() & pl.col("ts_ns").is_not_null())
        self._attribute(
            host["event_id"].to_numpy().astype(np.int64), host["parent_id"].fill_null(-1).to_numpy().astype(np.int64),
            (host["cat"] == "cpu_op").fill_null(False).to_numpy(), counted_mask(host["name"]),
            calls["row"].to_numpy().astype(np.int64), calls["correlation"].to_numpy().astype(np.int64),
            calls["ts_ns"].to_numpy().astype(np.int64), calls["dur_ns"].fill_null(0).to_numpy().astype(np.int64))
        self.add_calls(host.filter(pl.col("event_id").is_in(pl.Series(self.events).implode())))

    @classmethod
    def from_arrays(cls, event_id: np.ndarray, parent_id: np.ndarray, is_op: np.ndarray, is_counted: np.ndarray,
                    call_row: np.ndarray, correlation: np.ndarray, ts_ns: np.ndarray,
                    dur_ns: np.ndarray) -> Operators:
        """From one trace's host events as arrays: every event's ``event_id``, ``parent_id`` (-1 for none), whether it
        is a ``cpu_op`` and whether a counted one; and of the events with a correlation and a start (``call_row``:
        their positions), the ``correlation``, ``ts_ns`` and ``dur_ns`` (0 for none). :attr:`ops` is empty until
        :meth:`add_calls`."""
        self = cls.__new__(cls)
        self._attribute(event_id, parent_id, is_op, is_counted, call_row, correlation, ts_ns, dur_ns)
        self.ops = _costs(pl.DataFrame(schema=_CALL_SCHEMA))
        return self

    def _attribute(self, ids: np.ndarray, parent_ids: np.ndarray, is_op: np.ndarray, is_counted: np.ndarray,
                   call_row: np.ndarray, correlation: np.ndarray, ts_ns: np.ndarray, dur_ns: np.ndarray) -> None:
        if len(ids) > 1 and not (ids[1:] > ids[:-1]).all():  # parsers number events in order: rarely sorts
            order = np.argsort(ids, kind="stable")
            ids, parent_ids, is_op, is_counted = (a[order] for a in (ids, parent_ids, is_op, is_counted))
            call_row = np.argsort(order)[call_row]
        parent = np.full(len(ids), -1, dtype=np.int64)
        if len(ids):
            at = np.minimum(np.searchsorted(ids, parent_ids), len(ids) - 1)
            parent = np.where((parent_ids >= 0) & (ids[at] == parent_ids), at, -1)
            del at
        found, chosen_rows = launch_call_rows(correlation, ts_ns, dur_ns)
        target = _owners(call_row[chosen_rows], parent, is_op, is_counted) if len(chosen_rows) else \
            np.zeros(0, np.int64)
        #: Sorted correlation ids and the index (into :attr:`ops`) of each one's operator, -1 for none.
        self.correlation = found
        chosen = np.unique(target[target >= 0])
        self.op_of = np.where(target >= 0, np.searchsorted(chosen, target), -1)
        #: The ``event_id`` of each operator call that launched device ops, sorted (the rows of :attr:`ops`).
        self.events = ids[chosen]

    def add_calls(self, calls: pl.DataFrame) -> None:
        """Give the calls of :attr:`events` their name, rank, duration and shapes (``calls``: ``event_id``, ``name``,
        ``rank``, ``dur_ns``, ``input_dims``, ``input_types`` of any events; a call missing from it has none)."""
        calls = calls.select(*(pl.col(c).cast(t) for c, t in _CALL_SCHEMA.items())).unique("event_id", keep="first")
        self.ops = _costs(pl.DataFrame({"event_id": self.events}, schema={"event_id": pl.Int64}).join(
            calls, on="event_id", how="left", maintain_order="left"))

    def targets(self, correlation: pl.Series) -> np.ndarray:
        """The :attr:`ops` index each op's correlation is attributed to; -1 where none."""
        if not len(self.correlation):
            return np.full(len(correlation), -1, dtype=np.int64)
        wanted = correlation.fill_null(-1).to_numpy().astype(np.int64)
        at = np.minimum(np.searchsorted(self.correlation, wanted), len(self.correlation) - 1)
        found = (self.correlation[at] == wanted) & correlation.is_not_null().to_numpy()
        return np.where(found, self.op_of[at], -1)


def _costs(ops: pl.DataFrame) -> pl.DataFrame:
    """The operator calls with their cost: ``op``, ``input_shapes``, ``rank``, ``host_ns``, ``flops``, ``bytes``,
    ``dtype``, ``kind``, ``model_flops`` (flops of :data:`MODEL_KINDS`, else 0 where estimated)."""
    keys = ["op", "input_dims", "input_types"]
    calls = ops.select(pl.col("name").cast(pl.String).alias("op"), "input_dims", "input_types", "rank",
                       pl.col("dur_ns").fill_null(0).cast(pl.Int64).alias("host_ns")).with_row_index("_row")
    distinct = calls.select(keys).unique()  # a few hundred shapes in a trace of 100,000s of calls
    costs = [op_cost(name, _json(dims), _json(types)) if name else None for name, dims, types in distinct.iter_rows()]
    distinct = distinct.with_columns(
        pl.Series("flops", [c.flops if c else None for c in costs], dtype=pl.Float64),
        pl.Series("bytes", [c.bytes if c else None for c in costs], dtype=pl.Float64),
        pl.Series("dtype", [c.dtype if c else None for c in costs], dtype=pl.String),
        pl.Series("kind", [c.kind if c else None for c in costs], dtype=pl.String))
    return calls.join(distinct, on=keys, how="left", nulls_equal=True).sort("_row").select(
        "op", pl.col("input_dims").alias("input_shapes"), "rank", "host_ns", "flops", "bytes", "dtype", "kind",
    ).with_columns(
        pl.when(pl.col("kind").is_in(list(MODEL_KINDS))).then(pl.col("flops"))
        .otherwise(pl.when(pl.col("flops").is_not_null()).then(0.0)).alias("model_flops"))


def _json(text: str | None) -> list | None:
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, list) else None


class OpParts:
    """The ``op_stats`` rows of one (trace, rank), fed its device ops window by window in time order.

    :meth:`credit` gives each window's ops the FLOPs of the operator calls whose first device op they
    are (for the breakdown's ``flops`` and ``mfu_pct``); :meth:`rows` the rank's rows. Keeps one int64
    per launching operator call and a bit per call credited.
    """

    def __init__(self, operators: Operators | None) -> None:
        self._operators = operators
        n = operators.ops.height if operators is not None else 0
        self._credited = np.zeros(n, dtype=bool)
        self._device_ns = np.zeros(n + 1, dtype=np.int64)  # the last slot: no operator
        self._kernels = np.zeros(n + 1, dtype=np.int64)
        self._model_by_dtype: dict[str, float] = {}

    def credit(self, ops: pl.DataFrame) -> tuple[pl.Series, pl.Series]:
        """Add one window's ops (``category``, ``ts_ns``, ``dur_ns``, ``correlation``, ``event_id``) and return each
        op's credited ``flops`` and ``model_flops`` (null where it is not the first device op of an estimated call)."""
        n = self._credited.size
        target = self._operators.targets(ops["correlation"]) if self._operators is not None else \
            np.full(ops.height, -1, dtype=np.int64)
        work = ops.select((pl.col("category") != Category.SYNC).fill_null(False))[:, 0].to_numpy()
        dur = ops["dur_ns"].fill_null(0).to_numpy().astype(np.int64)
        slot = np.where(target >= 0, target, n)[work]
        np.add.at(self._device_ns, slot, dur[work])
        np.add.at(self._kernels, slot, 1)
        flops = np.full(ops.height, np.nan)
        model = np.full(ops.height, np.nan)
        eligible = work & (target >= 0) & (ops["dur_ns"].fill_null(-1).to_numpy() >= 0)
        if eligible.any() and self._operators is not None:
            rows = np.flatnonzero(eligible)
            rows = rows[~self._credited[target[rows]]]
            if len(rows):
                key = ops[rows.tolist()].select("ts_ns", "event_id").with_columns(
                    pl.Series("row", rows), pl.Series("target", target[rows]))
                first = key.sort("ts_ns", "event_id").unique("target", keep="first")
                rows, chosen = first["row"].to_numpy(), first["target"].to_numpy()
                self._credited[chosen] = True
                info = self._operators.ops
                flops[rows] = info["flops"].to_numpy()[chosen]
                model[rows] = info["model_flops"].to_numpy()[chosen]
                for dtype, value in zip(info["dtype"].to_numpy()[chosen], model[rows], strict=True):
                    if dtype is not None and value == value and value > 0:
                        self._model_by_dtype[dtype] = self._model_by_dtype.get(dtype, 0.0) + float(value)
        return pl.Series("flops", flops).fill_nan(None), pl.Series("model_flops", model).fill_nan(None)

    def dominant_dtype(self) -> str | None:
        """The dtype of most of the model FLOPs credited so far (the peak MFU is measured against)."""
        if not self._model_by_dtype:
            return None
        return max(sorted(self._model_by_dtype), key=lambda d: self._model_by_dtype[d])

    def rows(self, trace_id: str, rank: int, peaks: Peaks | None) -> pl.DataFrame:
        """The rank's ``op_stats`` rows (:data:`COLUMNS`): one per (op, input shapes, dtype) that launched device ops,
        and a :data:`NO_OPERATOR` row for the device ops no operator launched."""
        n = self._credited.size
        used = np.flatnonzero(self._kernels[:n] > 0)
        parts = []
        if len(used) and self._operators is not None:
            parts.append(self._operators.ops[used.tolist()].with_columns(
                pl.Series("device_ns", self._device_ns[used]), pl.Series("kernels", self._kernels[used]))
                .group_by("op", "input_shapes", "dtype", "kind").agg(
                    pl.len().cast(pl.Int64).alias("count"), pl.col("host_ns").sum(), pl.col("device_ns").sum(),
                    pl.col("kernels").sum(), *(_sum_or_null(c) for c in ("flops", "bytes"))))
        if self._kernels[n]:
            parts.append(pl.DataFrame({"op": [NO_OPERATOR], "device_ns": [int(self._device_ns[n])],
                                       "kernels": [int(self._kernels[n])]}))
        if not parts:
            return pl.DataFrame(schema=SCHEMA)
        frame = pl.concat(parts, how="diagonal_relaxed")
        frame = frame.with_columns(
            pl.lit(trace_id).alias("trace_id"), pl.lit(rank, dtype=pl.Int32).alias("rank"),
            *(pl.lit(None, dtype=SCHEMA[c]).alias(c) for c in ("input_shapes", "dtype", "kind", "count", "host_ns",
                                                                "flops", "bytes") if c not in frame.columns))
        return roofline(frame, peaks).select(COLUMNS).cast(SCHEMA).sort(  # type: ignore[arg-type]
            "device_ns", "op", "input_shapes", "dtype", descending=[True, False, False, False], nulls_last=True)


def _sum_or_null(column: str) -> pl.Expr:
    """The sum, null when any call has no estimate (unknown is never 0)."""
    return pl.when(pl.col(column).null_count() == 0).then(pl.col(column).sum()).alias(column)


def roofline(frame: pl.DataFrame, peaks: Peaks | None) -> pl.DataFrame:
    """``frame`` (``flops``, ``bytes``, ``device_ns``, ``dtype``, ``kind``) with the roofline columns added.

    achieved = flops / device time; intensity = flops / bytes; the roof = min(peak, intensity x HBM
    bandwidth), peak as :func:`peak_for` chooses it; ``bound`` is ``compute`` at or past the ridge point
    (peak / bandwidth), else ``memory``. ``pct_of_roofline`` is not clamped: past 100 means the estimate
    or the peak is wrong, and ``above_roofline`` says so.
    """
    peak = [peak_for(peaks, d, k) for d, k in zip(frame["dtype"].to_list(), frame["kind"].to_list(), strict=True)]
    hbm = peaks.hbm if peaks is not None else None
    out = frame.with_columns(pl.Series("_peak", peak, dtype=pl.Float64),
                             pl.lit(hbm, dtype=pl.Float64).alias("_hbm")).with_columns(
        # no division by a literal: polars turns it into a product, which rounds differently from SQL's quotient
        pl.when(pl.col("device_ns") > 0).then(pl.col("flops") / (pl.col("device_ns") * 1000.0))
        .alias("achieved_tflops"),
        pl.when(pl.col("bytes") > 0).then(pl.col("flops") / pl.col("bytes")).alias("arithmetic_intensity"),
    ).with_columns(
        pl.when(pl.col("arithmetic_intensity").is_not_null() & (pl.col("_peak") > 0) & (pl.col("_hbm") > 0)
                & (pl.col("device_ns") > 0))
        .then(pl.when(pl.col("arithmetic_intensity") >= pl.col("_peak") / pl.col("_hbm")).then(pl.lit("compute"))
              .otherwise(pl.lit("memory"))).alias("bound"),
    ).with_columns(
        # memory-bound: achieved bytes/s over the bandwidth (the same as FLOP/s over the roof, and defined
        # for ops that move bytes and compute nothing); compute-bound: achieved FLOP/s over the peak
        pl.when(pl.col("bound") == "memory").then(pl.col("bytes") * 1e11 / (pl.col("device_ns") * pl.col("_hbm")))
        .when(pl.col("bound") == "compute").then(pl.col("flops") * 1e11 / (pl.col("device_ns") * pl.col("_peak")))
        .alias("pct_of_roofline"),
    ).with_columns((pl.col("pct_of_roofline") > 100.0).alias("above_roofline"))
    return out.drop("_peak", "_hbm")
