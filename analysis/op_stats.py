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
from .event_flags import EventFlags
from . import event_index
from .event_index import narrow, parent_rows, position_type
from .launches import LaunchArrays, Launched, launch_call_rows
from .op_calls import Bits, CallArrays, CallLookup, CallRows
from .op_scope import MODULE, Autograd, Paths, chains, nearest, path_name, scope_kind, scopes
from .recompute import recompute_kind, recomputed
from .peaks import Peaks

#: The ``op`` of device ops no operator launched (no launch call, or no ``cpu_op`` around the call).
NO_OPERATOR = "(no operator)"

#: Cost kinds whose FLOPs are the model's (MFU's numerator); the others (norms, elementwise,
#: reductions, the optimizer's updates) are counted in ``flops`` but not in model FLOPs.
MODEL_KINDS = frozenset({"matmul", "conv", "attention"})

#: Output columns of :meth:`OpParts.rows`, in order.
COLUMNS = ("trace_id", "rank", "op", "input_shapes", "dtype", "kind", "module", "count", "host_ns", "device_ns",
           "kernels", "flops", "bytes", "achieved_tflops", "arithmetic_intensity", "bound", "pct_of_roofline",
           "above_roofline")

SCHEMA: dict[str, Any] = {
    "trace_id": pl.String, "rank": pl.Int32, "op": pl.String, "input_shapes": pl.String, "dtype": pl.String,
    "kind": pl.String, "module": pl.String, "count": pl.Int64, "host_ns": pl.Int64, "device_ns": pl.Int64,
    "kernels": pl.Int64, "flops": pl.Float64, "bytes": pl.Int64, "achieved_tflops": pl.Float64,
    "arithmetic_intensity": pl.Float64, "bound": pl.String, "pct_of_roofline": pl.Float64, "above_roofline": pl.Boolean,
}

#: The host_ops columns :class:`Operators` reads.
HOST_COLUMNS = ("event_id", "rank", "cat", "name", "ts_ns", "dur_ns", "parent_id", "correlation", "input_dims",
                "input_types", "concrete_inputs")

#: The columns that tell an operator call's cost: calls alike in all three share one row of :attr:`Operators.kinds`.
KEY_COLUMNS = ("name", "input_dims", "input_types", "concrete_inputs")
#: A call's row of :attr:`Operators.kinds`: its cost's columns and its scope (:mod:`.op_scope`).
GROUP_COLUMNS = (*KEY_COLUMNS, "module")

#: The columns of an operator call :class:`Operators` reads from its host events.
CALL_SCHEMA: dict[str, Any] = {"event_id": pl.Int64, "name": pl.String, "rank": pl.Int32, "dur_ns": pl.Int64,
                               "input_dims": pl.String, "input_types": pl.String, "concrete_inputs": pl.String}



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


def launch_positions(call_row: np.ndarray, correlation: np.ndarray, ts_ns: np.ndarray,
                     dur_ns: np.ndarray) -> tuple[event_index.EventIndex, np.ndarray]:
    """Of the host events with a correlation and a start (``call_row``: their positions; ``dur_ns`` 0 for none), the
    distinct correlation ids as an index (their ranks: the order of the ids) and the position of each one's launch
    call, in that order (:func:`launch_call_rows`). The ids themselves (8 bytes a call) are let go here."""
    found, chosen = launch_call_rows(correlation, ts_ns, dur_ns)
    return event_index.build([found]), call_row[chosen]


def _owners(start: np.ndarray, parent: np.ndarray, flags: EventFlags) -> np.ndarray:
    """For each start event (an index), the nearest event on its parent chain (itself included) that is a counted
    operator, else the nearest operator; -1 for none. Walks up from the starts only (:func:`.op_scope.nearest`):
    memory follows the launch calls, not every host event."""
    counted_op = nearest(start, parent, flags.counted_op())
    return np.where(counted_op >= 0, counted_op, nearest(start, parent, flags.is_op()))


class Operators:
    """One trace's operator calls that launched device work, and the call each correlation id is attributed to.

    Args:
        host: the trace's host events, columns :data:`HOST_COLUMNS` (any order; ``input_dims`` and
            ``input_types`` are JSON text, as ``host_ops`` stores them). A caller reading a large trace uses
            :meth:`from_arrays` and then :meth:`set_keyed` with the rows of :attr:`rows` only.
    """

    def __init__(self, host: pl.DataFrame) -> None:
        host = host.filter(pl.col("event_id").is_not_null())
        calls = host.select(pl.int_range(pl.len()).alias("row"), "correlation", "ts_ns", "dur_ns").filter(
            pl.col("correlation").is_not_null() & pl.col("ts_ns").is_not_null())
        pairs = host.select("cat", "name").unique()
        kinds = {(c, n): scope_kind(c, n) for c, n in pairs.iter_rows()}
        kind = np.array([kinds[(c, n)] for c, n in host.select("cat", "name").iter_rows()], dtype=np.int8)
        autograd = Autograd.empty()
        if "sequence_number" in host.columns:
            marks = host.select(pl.int_range(pl.len()).alias("row"), "sequence_number",
                                (pl.col("fwd_thread_id") > 0).fill_null(False).alias("backward")
                                if "fwd_thread_id" in host.columns else pl.lit(False).alias("backward")
                                ).filter(pl.col("sequence_number").is_not_null())
            autograd = Autograd(marks["row"].to_numpy().astype(np.int64),
                                marks["sequence_number"].to_numpy().astype(np.int64), marks["backward"].to_numpy(),
                                host["event_id"].to_numpy().astype(np.int64)[marks["row"].to_numpy()])
        ids = host["event_id"].to_numpy().astype(np.int64)
        self._attribute(
            parent_rows(ids, host["parent_id"].fill_null(-1).to_numpy().astype(np.int64)),
            EventFlags.pack((host["cat"] == "cpu_op").fill_null(False).to_numpy(), counted_mask(host["name"]), kind,
                            np.array([recompute_kind(n) for n in host["name"].cast(pl.String).to_list()],
                                     dtype=np.int8)),
            launch_positions(*(calls[c].fill_null(0).to_numpy().astype(np.int64)
                               for c in ("row", "correlation", "ts_ns", "dur_ns"))), autograd)
        names = host["name"].cast(pl.String).to_list()
        chosen = host[self.rows.tolist()]
        self.set_calls(chosen.select(*(pl.col(c).cast(t) if c in chosen.columns else pl.lit(None, dtype=t).alias(c)
                                       for c, t in CALL_SCHEMA.items())).with_columns(
            pl.Series("module", [path_name([names[p] for p in self.scope_paths.of(r)]) if r >= 0 else None
                                 for r in self.scope_rows.tolist()], dtype=pl.String)))

    @classmethod
    def from_arrays(cls, parent: np.ndarray, flags: EventFlags, launches: tuple[event_index.EventIndex, np.ndarray],
                    autograd: Autograd | None = None) -> Operators:
        """From one trace's host events as arrays: every event's parent's position (``parent``, from an
        :class:`~.event_index.EventIndex` of the ids: a caller holding many events need not hold their ids) and its
        :class:`~.event_flags.EventFlags` (a ``cpu_op``, a counted one, its :func:`scope_kind` and
        :func:`~.recompute.recompute_kind`); the ``launches`` (:func:`launch_positions` of the events with a
        correlation and a start: a caller lets those events' columns go first); the autograd marks
        (:class:`~.op_scope.Autograd`), for the calls' modules (:attr:`scope_rows`). The calls have no name nor cost
        until :meth:`set_keyed`."""
        self = cls.__new__(cls)
        self._attribute(parent, flags, launches, autograd)
        self.set_keyed(np.zeros(0, dtype=np.int64), pl.DataFrame(schema={c: pl.String for c in GROUP_COLUMNS}),
                       np.zeros(0, dtype=np.int64))
        return self

    @classmethod
    def from_calls(cls, calls: CallLookup, distinct: pl.DataFrame) -> Operators:
        """From a trace's calls that launched work as a :class:`~.op_calls.CallLookup` (each with its row of
        ``distinct``, columns :data:`GROUP_COLUMNS`; the warehouse keeps them on disk) whose launch calls come with
        their operators (:class:`~.launches.Launched`'s ``owner``): :attr:`launches` is None, and nothing per call is
        held here."""
        self = cls.__new__(cls)
        self.rows = np.zeros(0, dtype=np.int64)
        self.launches = None
        self.recomputed = np.zeros(0, dtype=bool)
        self.scope_rows = np.zeros(0, dtype=np.int64)
        self.scope_paths = Paths.empty()
        self._set_kinds(distinct)
        self._calls = calls
        return self

    def _attribute(self, parent: np.ndarray, flags: EventFlags, launches: tuple[event_index.EventIndex, np.ndarray],
                   autograd: Autograd | None) -> None:
        found, starts = launches
        target = _owners(starts, parent, flags) if len(starts) else np.zeros(0, dtype=np.int64)
        # the calls that own a launch, in input order: a mark per event (no sort), and each launch's call found
        # among them by bisection (a running count per event took 4 bytes for every host event)
        marked = np.zeros(len(parent), dtype=bool)
        marked[target[target >= 0]] = True
        #: The input positions of the operator calls that launched device ops, ascending.
        self.rows = np.flatnonzero(marked).astype(position_type(len(parent)))
        del marked
        nothing = np.zeros(found.size, dtype=np.int64)
        #: The launch calls by correlation id, each with its operator's position (-1: none): what :meth:`owners_of`
        #: asks (None where the calls come with their operators from elsewhere: :meth:`from_calls`).
        self.launches: LaunchArrays | None = LaunchArrays(found, nothing, nothing, nothing > 0,
                                                          narrow(target.astype(np.int64)))
        del target  # gone before the walks below: 8 bytes a launch call
        #: Whether each call runs as a recomputation (docs/analyses.md, "HFU and MFU"): MFU leaves its FLOPs out.
        self.recomputed = recomputed(self.rows, parent, flags.recompute())
        kind = flags.kind()
        #: The position of each call's scope event (docs/analyses.md, "Module"), -1 for none.
        self.scope_rows = scopes(self.rows, parent, kind, autograd or Autograd.empty()).astype(
            position_type(len(parent)))
        is_module = kind == MODULE
        del kind  # the paths' walk reads the modules' mask alone: a byte per host event less at its peak
        #: Of each scope event, the scope events of its path, outermost first (:func:`.op_scope.chains`).
        self.scope_paths = chains(self.scope_rows[self.scope_rows >= 0], parent, is_module)

    def set_calls(self, calls: pl.DataFrame) -> None:
        """The calls of :attr:`rows`, in that order: ``name``, ``dur_ns``, ``input_dims``, ``input_types`` and
        optionally ``concrete_inputs`` and ``module`` (:data:`GROUP_COLUMNS`)."""
        shapes = calls.select(*(pl.col(c).cast(pl.String) if c in calls.columns else pl.lit(None, dtype=pl.String)
                                .alias(c) for c in GROUP_COLUMNS))
        distinct = shapes.unique(maintain_order=True)
        key = shapes.with_row_index("_row").join(distinct.with_row_index("_key"), on=list(GROUP_COLUMNS),
                                                 how="left", nulls_equal=True).sort("_row")["_key"]
        self.set_keyed(key.to_numpy().astype(np.int64), distinct, calls["dur_ns"].fill_null(0).to_numpy())

    def set_keyed(self, key: np.ndarray, distinct: pl.DataFrame, host_ns: np.ndarray) -> None:
        """The calls of :attr:`rows`, in that order, as the index ``key`` of each one's row in ``distinct`` (columns
        :data:`GROUP_COLUMNS`: a few hundred rows for 100,000s of calls) and its host duration ``host_ns``."""
        self._set_kinds(distinct)
        self._calls: CallLookup = CallArrays(self.rows, key.astype(position_type(len(distinct)), copy=False),
                                             narrow(host_ns), self.recomputed)

    def _set_kinds(self, distinct: pl.DataFrame) -> None:
        #: One row per distinct (name, shapes, types, concrete inputs, module) of a call: ``op``, ``input_shapes``,
        #: ``module`` and its cost.
        self.kinds = _costs(distinct)
        self._flops = self.kinds["flops"].to_numpy()
        self._model = self.kinds["model_flops"].to_numpy()
        self._dtype_names: list[str] = self.kinds["dtype"].drop_nulls().unique().sort().to_list()
        self._dtype_code = self.kinds["dtype"].replace_strict(
            {name: i for i, name in enumerate(self._dtype_names)}, default=-1, return_dtype=pl.Int64).to_numpy()

    def drop_scopes(self) -> None:
        """Let go of what only naming the calls reads, once :meth:`set_keyed` has them: their scope events
        (:attr:`scope_rows`, :attr:`scope_paths`). :attr:`rows` stays: :meth:`find` finds a call by it."""
        self.scope_rows = np.zeros(0, dtype=np.int64)
        self.scope_paths = Paths.empty()

    @property
    def calls(self) -> int:
        """How many operator calls launched device ops."""
        return len(self._calls)

    def find(self, owner: np.ndarray) -> CallRows:
        """Each operator position of ``owner`` (-1: none) as a call that launched work (:class:`~.op_calls.CallRows`:
        its number among the calls, by position, -1 where it is none; its row of :attr:`kinds`; its host time;
        whether it is recomputed)."""
        return self._calls.find(owner)

    def totals(self, count: np.ndarray, host_ns: np.ndarray, device_ns: np.ndarray,
               kernels: np.ndarray) -> pl.DataFrame:
        """The rows of :attr:`kinds` with ``count`` calls that ran device ops (one figure per row of :attr:`kinds`, as
        are the others: those calls' host time ``host_ns``, their ops' device time ``device_ns`` and number
        ``kernels``); rows with no such call are left out: ``op``, ``input_shapes``, ``dtype``, ``kind``, ``count``,
        ``host_ns``, ``device_ns``, ``kernels``, ``flops``, ``bytes`` (those two for all the calls; null where a call
        has no estimate)."""
        return self.kinds.with_columns(*(pl.Series(name, values.astype(np.int64)) for name, values in (
            ("count", count), ("host_ns", host_ns), ("device_ns", device_ns), ("kernels", kernels)))
        ).filter(pl.col("count") > 0).with_columns(
            pl.col("flops") * pl.col("count"), pl.col("bytes") * pl.col("count"),
        ).drop("input_types", "concrete_inputs", "model_flops")

    def credited(self, key: np.ndarray, recomputed: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, float]]:
        """The ``flops``, ``model_flops`` and recomputed model FLOPs (0 where the call is not recomputed) of calls of
        the rows ``key`` of :attr:`kinds`, each ``recomputed`` or not, and their positive model FLOPs summed per
        dtype."""
        flops, model = self._flops[key], self._model[key]
        again = np.where(recomputed, model, np.where(np.isnan(model), np.nan, 0.0))
        codes = self._dtype_code[key]
        keep = (codes >= 0) & (model > 0)  # NaN compares false: calls with no estimate drop out
        sums = np.bincount(codes[keep], weights=model[keep], minlength=len(self._dtype_names))
        return flops, model, again, {name: float(sums[i]) for i, name in enumerate(self._dtype_names) if sums[i] > 0}

    def owners_of(self, correlation: pl.Series) -> np.ndarray:
        """The operator position each op's correlation is attributed to; -1 where none (a trace whose calls come with
        their operators, :meth:`from_calls`, has its launch calls' ``owner`` instead)."""
        if self.launches is None:
            raise ValueError("these operators were made without their launch calls: ask with the calls' owners")
        return self.launches.find(correlation).owner


def _costs(distinct: pl.DataFrame) -> pl.DataFrame:
    """Each distinct call (:data:`KEY_COLUMNS`) with its cost: ``op``, ``input_shapes``, ``input_types``, ``flops``,
    ``bytes``, ``dtype``, ``kind``, ``model_flops`` (flops of :data:`MODEL_KINDS`, else 0 where estimated)."""
    costs = [op_cost(name, _json(dims), _json(types), _json(concrete)) if name else None
             for name, dims, types, concrete in distinct.select(KEY_COLUMNS).iter_rows()]
    return distinct.select(pl.col("name").alias("op"), pl.col("input_dims").alias("input_shapes"), "input_types",
                           "concrete_inputs", "module").with_columns(
        pl.Series("flops", [c.flops if c else None for c in costs], dtype=pl.Float64),
        pl.Series("bytes", [c.bytes if c else None for c in costs], dtype=pl.Float64),
        pl.Series("dtype", [c.dtype if c else None for c in costs], dtype=pl.String),
        pl.Series("kind", [c.kind if c else None for c in costs], dtype=pl.String),
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
    are (for the breakdown's ``flops`` and ``mfu_pct``); :meth:`rows` the rank's rows. Keeps two bits per launching
    operator call (credited; ran a device op) and the sums per row of :attr:`Operators.kinds` (a few hundred, not a
    figure per call: at 4 GB of trace, 690K calls took 11 MB more as two int64 each).
    """

    def __init__(self, operators: Operators | None) -> None:
        self._operators = operators
        self._calls = operators.calls if operators is not None else 0
        kinds = operators.kinds.height if operators is not None else 0
        self._credited = Bits(self._calls)
        self._ran = Bits(self._calls)  # whether the call has had a device op (not a sync) yet
        self._count = np.zeros(kinds, dtype=np.int64)
        self._host_ns = np.zeros(kinds, dtype=np.int64)
        self._device_ns = np.zeros(kinds + 1, dtype=np.int64)  # the last slot: no operator
        self._kernels = np.zeros(kinds + 1, dtype=np.int64)
        self._model_by_dtype: dict[str, float] = {}

    def credit(self, ops: pl.DataFrame,
               launched: Launched | None = None) -> tuple[pl.Series, pl.Series, pl.Series] | None:
        """Add one window's ops (``category``, ``ts_ns``, ``dur_ns``, ``correlation``, ``event_id``; ``launched``:
        their launch calls with their operators, else the operators' own :meth:`Operators.owners_of`) and return each
        op's credited ``flops``, ``model_flops`` and ``recomputed_flops`` (of its model FLOPs, those of a recomputed
        call), null where it is not the first device op of an estimated call; None where the rank has no operator
        call to credit (every op's three are null)."""
        none = self._count.size
        if self._operators is None or not self._calls:  # no call to credit: every op goes to no operator
            working = (pl.col("category") != Category.SYNC).fill_null(False)
            busy, count = ops.select(pl.col("dur_ns").fill_null(0).filter(working).sum(), working.sum()).row(0)
            self._device_ns[none] += busy  # integer sums, here and below
            self._kernels[none] += count
            return None
        work = ops.select((pl.col("category") != Category.SYNC).fill_null(False))[:, 0].to_numpy()
        dur = ops["dur_ns"].fill_null(0).to_numpy().astype(np.int64)
        calls = self._operators.find(self._operators.owners_of(ops["correlation"]) if launched is None
                                     else launched.owner)
        target = calls.index
        working, keys = target[work], calls.key[work]
        has = working >= 0
        slot = np.where(has, keys, none)
        # added in place at the window's slots, per row of the kinds
        np.add.at(self._device_ns, slot, dur[work])
        np.add.at(self._kernels, slot, 1)
        first, at = np.unique(working[has], return_index=True)
        new = ~self._ran.get(first)  # calls whose first device op is in this window: counted once, here
        self._ran.set(first[new])
        keys, host = keys[has][at][new], calls.host_ns[work][has][at][new]
        np.add.at(self._count, keys, 1)
        np.add.at(self._host_ns, keys, host)
        flops = np.full(ops.height, np.nan)
        model = np.full(ops.height, np.nan)
        again = np.full(ops.height, np.nan)
        eligible = work & (target >= 0) & (ops["dur_ns"].fill_null(-1).to_numpy() >= 0)
        if eligible.any():
            rows = np.flatnonzero(eligible)
            rows = rows[~self._credited.get(target[rows])]
            if len(rows):
                # per call, its first device op here: by start, then event_id (nulls first, as a sort puts them)
                low = np.iinfo(np.int64).min
                ts = ops["ts_ns"].fill_null(low).to_numpy()[rows]
                event = ops["event_id"].fill_null(low).to_numpy()[rows]
                order = np.lexsort((event, ts, target[rows]))
                chosen = target[rows][order]
                rows = rows[order[np.r_[True, chosen[1:] != chosen[:-1]]]]
                self._credited.set(target[rows])
                flops[rows], model[rows], again[rows], by_dtype = self._operators.credited(calls.key[rows],
                                                                                           calls.recomputed[rows])
                for dtype, value in by_dtype.items():
                    self._model_by_dtype[dtype] = self._model_by_dtype.get(dtype, 0.0) + value
        return (pl.Series("flops", flops).fill_nan(None), pl.Series("model_flops", model).fill_nan(None),
                pl.Series("recomputed_flops", again).fill_nan(None))

    def dominant_dtype(self) -> str | None:
        """The dtype of most of the model FLOPs credited so far (the peak MFU is measured against)."""
        if not self._model_by_dtype:
            return None
        return max(sorted(self._model_by_dtype), key=lambda d: self._model_by_dtype[d])

    def rows(self, trace_id: str, rank: int, peaks: Peaks | None) -> pl.DataFrame:
        """The rank's ``op_stats`` rows (:data:`COLUMNS`): one per (op, input shapes, dtype) that launched device ops,
        and a :data:`NO_OPERATOR` row for the device ops no operator launched."""
        none = self._count.size
        parts = []
        if bool((self._count > 0).any()) and self._operators is not None:
            parts.append(self._operators.totals(self._count, self._host_ns, self._device_ns[:none],
                                                self._kernels[:none])
                .group_by("op", "input_shapes", "dtype", "kind", "module").agg(
                    pl.col("count").sum(), pl.col("host_ns").sum(), pl.col("device_ns").sum(),
                    pl.col("kernels").sum(), *(_sum_or_null(c) for c in ("flops", "bytes"))))
        if self._kernels[none]:
            parts.append(pl.DataFrame({"op": [NO_OPERATOR], "device_ns": [int(self._device_ns[none])],
                                       "kernels": [int(self._kernels[none])]}))
        if not parts:
            return pl.DataFrame(schema=SCHEMA)
        frame = pl.concat(parts, how="diagonal_relaxed")
        frame = frame.with_columns(
            pl.lit(trace_id).alias("trace_id"), pl.lit(rank, dtype=pl.Int32).alias("rank"),
            *(pl.lit(None, dtype=SCHEMA[c]).alias(c) for c in ("input_shapes", "dtype", "kind", "module", "count",
                                                                "host_ns", "flops", "bytes") if c not in frame.columns))
        return roofline(frame, peaks).select(COLUMNS).cast(SCHEMA).sort(  # type: ignore[arg-type]
            "device_ns", "op", "input_shapes", "dtype", "module", descending=[True, False, False, False, False],
            nulls_last=True)


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
