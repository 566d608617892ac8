"""The operators' pass of the derived tables: each trace's operator calls, read from ``host_ops`` a row group at a time.

:func:`operators` feeds :class:`~tracelake.analysis.op_attribution.Attribution` (which launch call each operator
owns, and each operator's scope) and names the operators that launched device work
(:class:`~tracelake.analysis.op_stats.Operators`), for :func:`.derived.write_derived` (docs/analyses.md,
"Operators"; docs/architecture.md, "Memory").
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tracelake.analysis import event_index
from tracelake.analysis.event_flags import EventFlags
from tracelake.analysis.flops import counted
from tracelake.analysis.launches import GRAPH_CALL
from tracelake.analysis.op_attribution import Attribution, BackRefs, Events, ScopeTexts
from tracelake.analysis.op_owners import OwnerCursor, Owners
from tracelake.analysis.op_scope import scope_kind
from tracelake.analysis.op_stats import GROUP_COLUMNS, KEY_COLUMNS, Operators
from tracelake.analysis.recompute import recompute_kind
from tracelake.contracts.allocators import freed_memory_kept, release_free_memory
from tracelake.ingest.source import read_ahead

from .call_table import CallSink, CallTable
from .derived_inputs import ints as _ints, pinned_trace
from .derived_names import CallNames
from .launch_table import LaunchSink, LaunchTable
from .spill_log import SpillLog

#: What is known of a name, once looked up: whether it is a counted operator, its scope kind (as a
#: ``python_function``), its recompute kind, its number among the names kept for scopes (-1: not kept) and whether
#: it is a graph launch call's (:data:`GRAPH_CALL`).
_Known = tuple[bool, int, int, int, bool]
_UNKNOWN: _Known = (False, 0, 0, -1, False)


#: What :func:`operators` finds: per trace, its operator calls, its launch calls (by correlation id, each with its
#: operator) and the name of each graph launch call by correlation id.
Found = tuple[dict[str, Operators], dict[str, LaunchTable], dict[str, dict[int, str]]]


def operators(host_ops: Path, folder: Path, shared: dict[str, np.ndarray]) -> Found:
    """Per trace, its operator calls (:class:`Operators`), its launch calls (:class:`LaunchTable`, written into
    ``folder``, each with its operator; ``shared``: per trace, the ids more than one kernel carries) and its graph
    launch calls' names; nothing for a trace without operator calls.

    A row group at a time, in Arrow and numpy: the event ids alone first, into each trace's
    :class:`~tracelake.analysis.event_index.EventIndex`; then the parent ids, for which events a later row group's
    events name as parent (:class:`BackRefs`); then the attribution, which writes each launch call with its operator
    as it is settled (:class:`LaunchSink`: sorted by correlation id, as soon as no call to come can have a lower id,
    which the row groups' statistics of ``correlation`` tell), logs each operator that launched work with its scope
    on disk (:class:`~tracelake.analysis.op_owners.OwnerLog` in a :class:`SpillLog`), and keeps nothing per host
    event; then the names and shapes of those operators only, as dictionary codes, a row group at a time, each
    group's calls written as they are named (:class:`CallSink`, read back by position: :class:`CallTable`).
    """
    names = set(pq.read_schema(host_ops).names)
    if not _has_operators(host_ops):  # XLA's host events, say: every device op goes to no operator
        return {}, {}, {}
    # shapes repeat (a few hundred distinct in 100,000s of calls): read as dictionaries, they stay small
    file = pq.ParquetFile(host_ops, read_dictionary=[c for c in ("trace_id", "cat", "name", "input_dims",
                                                                 "input_types", "concrete_inputs") if c in names])
    autograd = [c for c in ("sequence_number", "fwd_thread_id") if c in names]
    groups = range(file.num_row_groups)
    # First the event ids alone, for each trace's index of them: then a row group's parent ids become positions as
    # it is read, and no array of every event's id or parent id is held (docs/architecture.md, "Memory")
    indexes = _indexes(file, groups)
    release_free_memory()  # the row groups read on the reading thread, back before the next pass reads its own
    refs = _back_refs(file, groups, indexes)
    floors = _floors(file)
    sinks: dict[str, LaunchSink] = {}
    graph_names: dict[str, dict[int, str]] = {}
    words: list[str | None] = []  # the names of modules and frames, for their paths' texts
    texts = ScopeTexts(words)
    traces: dict[str, _Trace] = {}
    known: dict[str, _Known] = {}
    # (row group, trace, first position, rows, whether the group is that trace's part as it is) of each trace's part
    spans: list[tuple[int, str, int, int, bool]] = []
    columns = ["trace_id", "event_id", "parent_id", "cat", "name", "correlation", "ts_ns", "dur_ns", *autograd]
    with freed_memory_kept():  # each row group's buffers reuse the last one's pages
        for group, part in zip(groups, _read_ahead(file, [(group, columns) for group in groups]), strict=True):
            for trace_id, mine, whole in _by_trace(part):
                trace = traces.get(trace_id)
                if trace is None:
                    attribution = Attribution(refs[trace_id], texts, SpillLog(folder / f"owners-{len(sinks)}.i64"))
                    trace = traces[trace_id] = _Trace(indexes[trace_id], attribution,
                                                      graph_names.setdefault(trace_id, {}))
                    sinks[trace_id] = LaunchSink(folder / f"launch-calls-{len(sinks)}.parquet")
                spans.append((group, trace_id, trace.size, mine.num_rows, whole))
                trace.add(mine, known, words)
                waiting, later = trace.attribution.waiting_floor(), floors[group]
                floor = later if waiting is None or later is None else min(later, waiting)
                sinks[trace_id].add(trace.attribution.take_launches(), floor)
            del part
    tables: dict[str, LaunchTable] = {}
    cursors: dict[str, OwnerCursor] = {}
    for trace_id, trace in traces.items():
        sink = sinks.pop(trace_id)
        sink.add(trace.attribution.take_launches(), None)
        sink.close()
        tables[trace_id] = LaunchTable(sink.path, sink.count, shared.get(trace_id, np.zeros(0, dtype=np.int64)))
        cursors[trace_id] = OwnerCursor(trace.attribution.owner_chunks())
    del traces
    release_free_memory()  # the attribution's pieces, back before the names are read
    # the operators that launched work, by position, with their row groups: each group's calls named and written
    # away as they come (call_table.CallSink), so nothing per call is held (docs/architecture.md, "Memory")
    wanted = [c for c in ("name", "dur_ns", *KEY_COLUMNS[1:]) if c in names]

    def holding_calls() -> Iterator[tuple[str, int, bool, Owners, pa.Table]]:
        """Each span with its operators, and its row group read: only the groups that hold one (on the reading
        thread, which takes the operators from the log too)."""
        for group, trace_id, first, count, whole in spans:
            owners = cursors[trace_id].below(first + count)
            if len(owners):
                yield trace_id, first, whole, owners, file.read_row_group(
                    group, columns=wanted if whole else ["trace_id", "event_id", *wanted])

    named = {trace_id: CallNames(texts.texts) for trace_id in cursors}
    calls = {trace_id: CallSink(folder / f"operator-calls-{n}.parquet") for n, trace_id in enumerate(cursors)}
    for trace_id, first, whole, owners, part in read_ahead(holding_calls(), depth=1, name="tracelake-operators-read"):
        if not whole:
            part = part.filter(pc.and_(pc.equal(part["trace_id"], trace_id), pc.is_valid(part["event_id"])))
        key, host_ns = named[trace_id].add(part.take(pa.array(owners.rows - first)).select(wanted), owners.scope)
        calls[trace_id].add(owners.rows, key, host_ns, owners.recomputed)
        del part
    found: dict[str, Operators] = {}
    for trace_id, call_sink in calls.items():
        call_sink.close()
        rank, distinct = named.pop(trace_id).ranked()
        found[trace_id] = Operators.from_calls(CallTable(call_sink.path, call_sink.count, rank), distinct)
    return found, tables, {trace_id: names for trace_id, names in graph_names.items() if trace_id in found}


#: Above every correlation id: no row group to come holds one.
_NO_ID = 2**63 - 1


def _floors(file: pq.ParquetFile) -> list[int | None]:
    """After each row group, the least correlation id any later one holds (from their statistics; None where a
    later one's are not known)."""
    meta = file.metadata
    column = file.schema_arrow.get_field_index("correlation")
    floors: list[int | None] = []
    least: int | None = _NO_ID
    for group in reversed(range(meta.num_row_groups)):
        floors.append(least)
        stats = meta.row_group(group).column(column).statistics
        if stats is not None and stats.has_min_max:
            least = None if least is None else min(least, int(stats.min))
        elif not (stats is not None and stats.has_null_count and stats.null_count == meta.row_group(group).num_rows):
            least = None  # a row group whose ids are not known: every call is held until the end
    return floors[::-1]


def _indexes(file: pq.ParquetFile, groups: range) -> dict[str, event_index.EventIndex]:
    """Per trace, the index of its events' ids (:class:`~tracelake.analysis.event_index.Builder`), a row group's ids
    at a time: their number and span from :func:`_id_spans`, and no piece of them held."""
    builders = {trace_id: event_index.Builder(*span) for trace_id, span in _id_spans(file, groups).items()}
    ids = [(group, ["trace_id", "event_id"]) for group in groups]
    for part in _read_ahead(file, ids):
        for trace_id, mine, _ in _by_trace(part):
            builders[trace_id].add(event_index.narrow(_ints(mine["event_id"], -1)))
    if any(builder.again for builder in builders.values()):  # ids out of order: each one's first position
        for part in _read_ahead(file, ids):
            for trace_id, mine, _ in _by_trace(part):
                if builders[trace_id].again:
                    builders[trace_id].add_again(_ints(mine["event_id"], -1))
    return {trace_id: builder.index() for trace_id, builder in builders.items()}


def _id_spans(file: pq.ParquetFile, groups: range) -> dict[str, tuple[int, int, int]]:
    """Per trace, how many events it has (the rows :func:`_by_trace` gives) and their lowest and highest id: from the
    row groups' statistics where each group holds one trace's events and every row has a trace and an id (as
    ``host_ops`` is written), else read."""
    meta = file.metadata
    spans: dict[str, tuple[int, int, int]] = {}
    at = file.schema_arrow.get_field_index("event_id")
    for group in groups:
        trace, ids = pinned_trace(file, group), meta.row_group(group).column(at).statistics
        if trace is None or ids is None or not (ids.has_min_max and ids.has_null_count and ids.null_count == 0):
            break
        _widen(spans, trace, meta.row_group(group).num_rows, int(ids.min), int(ids.max))
    else:
        return spans
    spans.clear()
    for part in _read_ahead(file, [(group, ["trace_id", "event_id"]) for group in groups]):
        for trace_id, mine, _ in _by_trace(part):
            low, high = pc.min_max(mine["event_id"]).values()
            _widen(spans, trace_id, mine.num_rows, low.as_py(), high.as_py())
    return spans


def _widen(spans: dict[str, tuple[int, int, int]], trace_id: str, rows: int, low: int, high: int) -> None:
    """Count ``rows`` more events of ``trace_id``, with ids from ``low`` to ``high``, into ``spans``."""
    count, least, most = spans.get(trace_id, (0, low, high))
    spans[trace_id] = (count + rows, min(least, low), max(most, high))


def _back_refs(file: pq.ParquetFile, groups: range, indexes: dict[str, event_index.EventIndex]
               ) -> dict[str, BackRefs]:
    """Per trace, the events that an event of a later part (a row group's, numbered as :func:`operators` feeds them)
    names as parent: the attribution carries those events' states until their last such part, and no other's."""
    found: dict[str, list[tuple[int, int, np.ndarray]]] = {trace_id: [] for trace_id in indexes}
    sizes = dict.fromkeys(indexes, 0)
    for part in _read_ahead(file, [(group, ["trace_id", "event_id", "parent_id"]) for group in groups]):
        for trace_id, mine, _ in _by_trace(part):
            parent = indexes[trace_id].positions(_ints(mine["parent_id"], -1))
            first = sizes[trace_id]
            earlier = parent[(parent >= 0) & (parent < first)]
            found[trace_id].append((len(found[trace_id]), first, earlier))
            sizes[trace_id] += mine.num_rows
    return {trace_id: BackRefs.of(mine) for trace_id, mine in found.items()}


def _by_trace(part: pa.Table) -> Iterator[tuple[str, pa.Table, bool]]:
    """The rows of each trace in a row group of host events (rows without a trace or an event id left out), and
    whether they are the row group as it is (one trace, nothing left out)."""
    whole = not (part["trace_id"].null_count or part["event_id"].null_count)
    if not whole:
        part = part.filter(pc.and_(pc.is_valid(part["trace_id"]), pc.is_valid(part["event_id"])))
    ids = pc.unique(part["trace_id"]).to_pylist()
    for trace_id in ids:
        yield str(trace_id), part if len(ids) == 1 else part.filter(pc.equal(part["trace_id"], trace_id)), \
            whole and len(ids) == 1


def _read_ahead(file: pq.ParquetFile, groups: list[tuple[int, list[str]]]) -> Iterator[pa.Table]:
    """The row groups (each with its columns), in order, the next one read on a thread while the caller works on
    this one (Parquet decoding lets go of the GIL)."""
    return read_ahead((file.read_row_group(group, columns=columns) for group, columns in groups), depth=1,
                      name="tracelake-operators-read")


def _has_operators(host_ops: Path) -> bool:
    """Whether any host event is a ``cpu_op`` (an operator call): a trace without any attributes nothing to one, as
    :class:`Operators` would find, and is not read further. Reads the ``cat`` column only, as a dictionary."""
    file = pq.ParquetFile(host_ops, read_dictionary=["cat"])
    for group in range(file.num_row_groups):
        for chunk in file.read_row_group(group, columns=["cat"])["cat"].chunks:
            if "cpu_op" in chunk.dictionary.to_pylist() and pc.any(pc.equal(chunk, "cpu_op")).as_py():
                return True
    return False


class _Trace:
    """One trace's host events on their way into its :class:`Attribution`, a part (a row group's) at a time."""

    def __init__(self, index: event_index.EventIndex, attribution: Attribution, graph_names: dict[int, str]) -> None:
        self.size = 0
        self.parts = 0
        self.index = index
        self.attribution = attribution
        self.graph_names = graph_names  # the name of each graph launch call, by correlation id

    def add(self, part: pa.Table, known: dict[str, _Known], words: list[str | None]) -> None:
        """The next rows of the trace (a row group, or the trace's rows of one). ``known``: what is known of each
        name met so far; ``words``: the names of modules and frames (a module's or frame's name is its index)."""
        offset, rows = self.size, part.num_rows
        self.size += rows
        cat = pc.dictionary_encode(part["cat"]).combine_chunks()  # a handful of categories: test each once
        cats = cat.dictionary.to_pylist()
        cat_codes = pc.fill_null(cat.indices, len(cats)).to_numpy(zero_copy_only=False)
        is_op = np.array([c == "cpu_op" for c in cats] + [False])[cat_codes]
        is_py = np.array([c == "python_function" for c in cats] + [False])[cat_codes]
        name = pc.dictionary_encode(part["name"]).combine_chunks()
        words_here = name.dictionary.to_pylist()
        for w in words_here:  # each name's tests run once, not once a row group
            if w and w not in known:
                scope = scope_kind("python_function", w)
                if scope:
                    words.append(w)
                known[w] = (counted(w), scope, recompute_kind(w), len(words) - 1 if scope else -1,
                            re.match(GRAPH_CALL, w) is not None)
        flags = [known[w] if w else _UNKNOWN for w in words_here] + [_UNKNOWN]
        codes = pc.fill_null(name.indices, len(flags) - 1).to_numpy(zero_copy_only=False)
        kind = np.where(is_py, np.array([f[1] for f in flags], dtype=np.int8)[codes], 0).astype(np.int8)
        packed = EventFlags.pack(is_op, np.array([f[0] for f in flags], dtype=bool)[codes], kind,
                                 np.array([f[2] for f in flags], dtype=np.int8)[codes])
        calls = np.flatnonzero(pc.and_(pc.is_valid(part["correlation"]), pc.is_valid(part["ts_ns"]))
                               .to_numpy(zero_copy_only=False))
        correlation = _ints(part["correlation"], 0)[calls]
        graph = np.array([f[4] for f in flags], dtype=bool)[codes[calls]]
        for at in np.flatnonzero(graph).tolist():  # graph launches: a few per step
            name_ = words_here[int(codes[calls[at]])]
            key = int(correlation[at])
            self.graph_names[key] = min(self.graph_names.get(key, name_), name_)
        sequence = np.full(rows, -1, dtype=np.int64)
        forward = np.zeros(0, dtype=np.int64)
        forward_sequence = forward_id = forward
        if "sequence_number" in part.column_names:
            marked = np.flatnonzero(part["sequence_number"].is_valid().to_numpy(zero_copy_only=False))
            backward = (_ints(part["fwd_thread_id"], 0) > 0)[marked] if "fwd_thread_id" in part.column_names else \
                np.zeros(len(marked), dtype=bool)
            seq = _ints(part["sequence_number"], 0)[marked]
            sequence[marked[backward]] = seq[backward]
            forward, forward_sequence = marked[~backward], seq[~backward]
            forward_id = _ints(part["event_id"], -1)[forward]
        events = Events(np.arange(offset, offset + rows), self.index.positions(_ints(part["parent_id"], -1)),
                        packed.bits, np.where(kind != 0, np.array([f[3] for f in flags], dtype=np.int64)[codes], -1),
                        sequence, calls, correlation, _ints(part["ts_ns"], 0)[calls], _ints(part["dur_ns"], 0)[calls],
                        graph, forward, forward_sequence, forward_id)
        self.attribution.add(self.parts, events)
        self.parts += 1
