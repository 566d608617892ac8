"""The native scanner of Kineto event batches (``_kineto.c``), as Arrow tables.

One call turns a batch of events (the JSON array the cutter made) into the
row-local columns of device and host ops, of memory instants, and the few rows
the end needs (step marks, collective args, memory counters), with the GIL released: the two
loader threads scan on both cores while the cutter reads on. It converts every
value as the DuckDB path (:mod:`tracelake.ingest.kineto_sql_events`) does,
which stays as the fallback where the extension is not built, and as the
reference the tests compare it with.
"""

from __future__ import annotations

import heapq
import importlib
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracelake.contracts.concrete import CONCRETE_OPS
from tracelake.contracts.errors import TraceFormatError

_kineto: ModuleType | None
try:
    _kineto = importlib.import_module(f"{__package__}._kineto")
except ImportError:  # not built (no compiler at install): the DuckDB path takes over
    _kineto = None
else:
    _kineto.set_concrete_ops(sorted(CONCRETE_OPS))  # the engines keep the same Concrete Inputs

#: Whether the native scanner is built.
AVAILABLE = _kineto is not None


def _native() -> ModuleType:
    """The extension module; a clear error where it is not built (callers check :data:`AVAILABLE`)."""
    if _kineto is None:
        raise RuntimeError("the native Kineto scanner is not built")
    return _kineto


def json_array_length(data: bytes) -> int | None:
    """The number of elements of the JSON array ``data``, where the native strict check vouches for its syntax
    (without the GIL); None where it does not (msgspec then judges, and names any error)."""
    count: int | None = _native().json_array_length(data)
    return count


_PRIMITIVE: dict[str, pa.DataType] = {"int64": pa.int64(), "int32": pa.int32(), "float64": pa.float64()}


@dataclass
class ScannedBatch:
    """What one batch holds, by table (``device``, ``host``, ``step_marks``, ``coll_args``, ``memory``,
    ``memory_events``)."""

    tables: dict[str, pa.Table]
    #: The index of its first event in ``traceEvents``.
    first: int
    events: int
    hip_calls: int
    #: Complete events of MTIA's device category (``mtia_ccp_events``): the trace is of an MTIA.
    mtia_ops: int
    #: ``"ph": "C"`` events (their args are read from the batch's text, as the DuckDB path does).
    counter_events: int

    def starting_at(self, first: int) -> ScannedBatch:
        """The same batch with its first event at ``traceEvents[first]``: every ``event_id`` moved on."""
        shift = first - self.first
        if not shift:
            return self
        tables = dict(self.tables)
        for table, data in tables.items():
            if "event_id" in data.column_names:
                at = data.column_names.index("event_id")
                tables[table] = data.set_column(at, "event_id", pc.add(data.column(at), pa.scalar(shift, pa.int64())))
        return replace(self, tables=tables, first=first)


def arrow_type(name: str) -> pa.DataType:
    """The Arrow type of a scanner column type name."""
    if name == "string":
        return pa.string()
    if name == "list<int32>":
        return pa.list_(pa.int32())
    return _PRIMITIVE[name]


def layout() -> dict[str, pa.Schema]:
    """The scanner's tables and their Arrow schemas."""
    return {table: pa.schema([(name, arrow_type(type_)) for name, type_ in cols])
            for table, cols in _native().layout().items()}


def constants() -> dict[str, Any]:
    """The args keys, device categories, other categories and phases compiled into the scanner."""
    result: dict[str, Any] = _native().constants()
    return result


def _array(column: tuple[Any, ...]) -> pa.Array:
    name, type_, length, nulls, valid, offsets, data, child_length, child_nulls, child_valid = column
    validity = None if valid is None else pa.py_buffer(valid)
    if type_ == "string":
        return pa.Array.from_buffers(pa.string(), length, [validity, pa.py_buffer(offsets), pa.py_buffer(data)],
                                     null_count=nulls)
    if type_ == "list<int32>":
        child_validity = None if child_valid is None else pa.py_buffer(child_valid)
        values = pa.Array.from_buffers(pa.int32(), child_length, [child_validity, pa.py_buffer(data)],
                                       null_count=child_nulls)
        return pa.Array.from_buffers(pa.list_(pa.int32()), length, [validity, pa.py_buffer(offsets)],
                                     null_count=nulls, children=[values])
    return pa.Array.from_buffers(_PRIMITIVE[type_], length, [validity, pa.py_buffer(data)], null_count=nulls)


class Unvouched(Exception):
    """A batch cut without a check is not one the strict check vouches for: cut inside a string, or not
    valid JSON (or beyond what the check knows, or not UTF-8). Never reaches a user: the caller cuts
    again with the check, which finds the true boundary or names the error (docs/formats.md, section 1)."""


def scan(batch: bytes | memoryview, first: int, source: str, *, strict: bool = False) -> ScannedBatch:
    """Scan one batch whose first event is ``traceEvents[first]``.

    ``strict``: the batch was cut without a check, so its syntax is checked while it is read.

    Raises:
        TraceFormatError: an event cannot be read; the message names it by index.
        Unvouched: (``strict`` only) the batch may be no whole events; it is not read.
    """
    columns, events, hip_calls, mtia_ops, counter_events, error = _native().scan(batch, first, strict)
    if error is not None and error[1] == "unvouched":
        raise Unvouched()
    if error is not None:
        raise _error(error, first, source)
    tables = {
        table: pa.Table.from_arrays([_array(c) for c in cols], names=[c[0] for c in cols])
        for table, cols in columns.items()
    }
    return ScannedBatch(tables=tables, first=first, events=events, hip_calls=hip_calls, mtia_ops=mtia_ops,
                        counter_events=counter_events)


def _error(error: tuple[Any, ...], first: int, source: str) -> TraceFormatError:
    index, problem, key, name, ph = error
    return TraceFormatError(source, problem_message(problem, name, ph, key), where=f"traceEvents[{first + index}]")


def problem_message(problem: str, name: str | None, ph: str | None, key: str | None = None) -> str:
    """What is wrong with an event, for a person: both readers name problems by these codes."""
    what = f"event {name!r}" if name else "an event"
    messages = {
        "missing": f"{what} has no 'ph' (event phase)",
        "phase": f"{what} has an unknown phase 'ph': {ph!r}",
        "ts": f"{what} has no 'ts' (or it is null)",
        "dur": f"{what} has no 'dur' (or it is null)",
        "id": f"{what} has a non-numeric 'args.{key}'",
        "ts type": f"{what} has a 'ts' that is not a number",
        "dur type": f"{what} has a 'dur' that is not a number",
        "ts range": f"{what} has a 'ts' too large for 64-bit nanoseconds",
        "dur range": f"{what} has a 'dur' too large for 64-bit nanoseconds",
        "args": f"{what} has 'args' that is not an object",
        "range": f"{what} has a {key!r} out of range",
        "escape": "a string with an invalid escape (\\u of a lone surrogate, or an unknown letter)",
        "utf8": "text that is not valid UTF-8",
        "too large": "more than 2 GB of text in one field of a batch of events",
    }
    return messages.get(problem, "an event that could not be read")


#: Times beyond this many nanoseconds take the SQL nesting (twice an end must fit 64 bits).
NEST_LIMIT = 1 << 61


#: The disjoint spans of :func:`step_spans`: their starts, ends and steps.
StepSpans = tuple[np.ndarray, np.ndarray, np.ndarray]


def step_spans(steps: pa.Table) -> StepSpans:
    """Starts, ends and steps of the disjoint spans ``[start, end)`` that ``steps`` (``step, ts_ns, dur_ns``) cover.

    A time belongs to the step that contains it (``ts_ns <= t < ts_ns + dur_ns``) and, where
    steps overlap or nest, to the one that starts last, then ends first (the innermost), then
    has the highest number: a sweep over the step starts and ends, the steps open at each
    point in a heap ordered by that rule (those that ended leave it as they reach its top).
    """
    starts = [int(t) for t in steps.column("ts_ns").to_pylist()]
    ends = [t + int(d) for t, d in zip(starts, steps.column("dur_ns").to_pylist(), strict=True)]
    numbers = [int(n) for n in steps.column("step").to_pylist()]
    order = sorted((i for i in range(len(starts)) if ends[i] > starts[i]), key=starts.__getitem__)
    bounds = sorted({starts[i] for i in order} | {ends[i] for i in order})
    span_start: list[int] = []
    span_end: list[int] = []
    span_step: list[int] = []
    open_steps: list[tuple[int, int, int]] = []  # (-start, end, -step): the top is the step a time belongs to
    at = 0
    for point, following in zip(bounds, bounds[1:]):
        while at < len(order) and starts[order[at]] <= point:
            i = order[at]
            heapq.heappush(open_steps, (-starts[i], ends[i], -numbers[i]))
            at += 1
        while open_steps and open_steps[0][1] <= point:
            heapq.heappop(open_steps)
        if open_steps:
            span_start.append(point)
            span_end.append(following)
            span_step.append(-open_steps[0][2])
    return (np.array(span_start, dtype=np.int64), np.array(span_end, dtype=np.int64),
            np.array(span_step, dtype=np.int64))


def thread_columns(batch: pa.RecordBatch) -> list[np.ndarray]:
    """What tells a row's thread apart: ``pid`` (nulls as 0), whether it is null, ``tid``, whether it is null."""
    columns: list[np.ndarray] = []
    for name in ("pid", "tid"):
        column = batch.column(name)
        columns += [column.fill_null(0).to_numpy(), column.is_null().to_numpy(zero_copy_only=False)]
    return columns


class HostNesting:
    """Depth, parent and step of host events, natively, fed in batches sorted by thread and start.

    The batches (``event_id, pid, tid, ts_ns, dur_ns, correlation``, ordered by
    ``pid, tid, ts_ns, dur_ns DESC, event_id``) come back with ``depth``, ``step``
    and ``parent_id`` added, as ``kineto_sql_facts.nesting_sql`` defines them.
    ``steps`` (``step, ts_ns, dur_ns``, any order) become the disjoint spans of
    :func:`step_spans`, as ``kineto_sql_facts.step_spans`` cuts them. Times must
    stay within :data:`NEST_LIMIT`. It follows one thread at a time: a thread left and
    taken up again later starts afresh (several threads in turns go to one each).
    """

    def __init__(self, steps: pa.Table | StepSpans) -> None:
        """``steps``: the steps, or their :func:`step_spans` where several sweeps share them."""
        self._nester = _native().Nester()
        self._step_ts, self._step_end, self._step_no = steps if isinstance(steps, tuple) else step_spans(steps)
        self._last_thread: tuple[object, ...] | None = None
        self._last_ts = 0

    def add(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The nesting of the next sorted batch."""
        return self._nest(batch, None)[0]

    def add_with_instants(self, batch: pa.RecordBatch) -> tuple[pa.RecordBatch, pa.RecordBatch]:
        """The next sorted batch of host events and memory instants together, told apart by ``kind`` (0 a host
        event, 1 a host ``cpu_op``, 2 a memory instant; instants after the host events of their time).

        Returns the host events' nesting, as :meth:`add` does, and each instant's ``event_id`` with ``op_id``,
        the event id of its op (null: none), by the rule of :mod:`.kineto_memory_ops`.
        """
        kind = batch.column("kind").to_numpy(zero_copy_only=False).astype(np.uint8)
        nested, op = self._nest(batch, kind)
        host, instants = np.flatnonzero(kind != 2), np.flatnonzero(kind == 2)
        assert op is not None
        found = op[instants]
        return (nested.drop_columns(["kind"]).take(pa.array(host)),
                pa.RecordBatch.from_arrays([batch.column("event_id").take(pa.array(instants)),
                                            pa.array(found, mask=found < 0)], names=["event_id", "op_id"]))

    def _nest(self, batch: pa.RecordBatch, kind: np.ndarray | None) -> tuple[pa.RecordBatch, np.ndarray | None]:
        rows = batch.num_rows
        new_thread = np.zeros(rows, dtype=np.uint8)
        thread = thread_columns(batch)
        for values in thread:
            new_thread[1:] |= values[1:] != values[:-1]
        if rows:
            first = tuple(values[0] for values in thread)
            new_thread[0] = first != self._last_thread
            self._last_thread = tuple(values[-1] for values in thread)
        ts = batch.column("ts_ns").fill_null(0).to_numpy()
        dur = batch.column("dur_ns").fill_null(0).to_numpy()
        backwards = (ts[1:] < ts[:-1]) & (new_thread[1:] == 0)
        if rows and ((not new_thread[0] and ts[0] < self._last_ts) or backwards.any()):
            raise RuntimeError("host events reached the nesting out of order")  # a bug, never bad input
        if rows:
            self._last_ts = int(ts[-1])
        end_key = 2 * (ts + dur) + np.where(dur == 0, 2, 0)
        arrays = [new_thread, np.ascontiguousarray(ts, dtype=np.int64), end_key.astype(np.int64),
                  np.ascontiguousarray(batch.column("event_id").fill_null(-1).to_numpy(), dtype=np.int64)]
        op: np.ndarray | None = None
        if kind is None:
            depth_bytes, parent_bytes = self._nester.nest(*arrays)
        else:
            length = np.maximum(dur, 0)
            op_end_key = (2 * (ts + length) + np.where(length == 0, 2, 0)).astype(np.int64)
            depth_bytes, parent_bytes, op_bytes = self._nester.nest(*arrays, np.ascontiguousarray(kind), op_end_key)
            op = np.frombuffer(op_bytes, dtype=np.int64)
        depth = np.frombuffer(depth_bytes, dtype=np.int32)
        parent = np.frombuffer(parent_bytes, dtype=np.int64)
        at = np.searchsorted(self._step_ts, ts, side="right") - 1
        safe = np.maximum(at, 0)
        if len(self._step_ts):
            in_step = (at >= 0) & (ts < self._step_end[safe])
            step = pa.array(self._step_no[safe], type=pa.int64(), mask=~in_step)
        else:
            step = pa.nulls(rows, pa.int64())
        return pa.RecordBatch.from_arrays(
            [*batch.columns, pa.array(depth), step, pa.array(parent, mask=parent < 0)],
            names=[*batch.schema.names, "depth", "step", "parent_id"]), op
