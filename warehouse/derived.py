"""Derived tables: analysis results materialised next to each trace's parsed tables.

The analyses are pure functions in :mod:`tracelake.analysis` (:class:`~tracelake.analysis.derived.DerivedTables`
feeds them); this module only reads a trace's files, rank by rank in windows of time,
and writes their results, so the SQL shell, the API and fleet reports read them
without recomputing (docs/analyses.md, "Stored at ingest").
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from itertools import pairwise
from pathlib import Path

import numpy as np
import polars as pl
import polars.selectors
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tracelake.analysis import breakdown, event_index
from tracelake.analysis.derived import DerivedTables, RankRows, Window
from tracelake.analysis.event_flags import EventFlags
from tracelake.analysis.flops import counted
from tracelake.analysis.op_scope import Autograd, Paths, path_name, scope_kind
from tracelake.analysis.op_stats import GROUP_COLUMNS, KEY_COLUMNS, Operators, launch_positions
from tracelake.analysis.recompute import recompute_kind
from tracelake.analysis.peaks import Override, Peaks, matches, resolve
from tracelake.contracts import schema
from tracelake.contracts.allocators import release_free_memory
from tracelake.ingest.source import read_ahead

from .derived_inputs import ints as _ints, keys, launch_times, only

#: The parsed tables the derived ones are computed from.
INPUTS = ("device_ops", "host_ops", "collectives", "devices")


#: The dtype of the peak an XLA profile states for its chip (TPUs and GPUs state their bf16 matrix peak).
PROFILE_PEAK_DTYPE = "bf16"


def write_derived(parsed: Path, out_dir: Path, peak_overrides: tuple[Override, ...] = (), threads: int = 1) -> None:
    """Compute every derived table of one trace from its parsed tables in ``parsed`` into ``out_dir``.

    ``parsed`` holds ``<table>.parquet`` for each table in :data:`INPUTS` (a staging
    directory, or a folder of links to a stored trace's files); writes
    ``<table>.parquet`` for each table in :data:`schema.DERIVED_TABLES`. ``peak_overrides``: the device peaks a
    person gave (``TRACELAKE_DEVICE_PEAKS``, :func:`tracelake.analysis.peaks.parse_overrides`). ``threads``: ranks
    computed at once, each on a thread of its own (the analyses spend most of their time in polars, Arrow and
    numpy, which let go of the GIL); the tables are the same whatever the number.

    Rank by rank in windows of :data:`CHUNK_ROWS` ops: memory follows ``threads`` windows, plus the host
    launch calls (13 bytes each and their ids' index, under 4 more: bits or offsets; 4 more for each one's operator),
    the distinct (name, duration) pairs of a rank and what :class:`~tracelake.analysis.launches.LaunchParts` keeps of
    each launched op.
    """
    windows = _read(parsed / "collectives.parquet", ["trace_id", "rank", "step", "ts_ns", "dur_ns", "is_async"])
    windows = windows.filter(pl.col("is_async").fill_null(False)).drop("is_async").sort("ts_ns")
    devices = _read(parsed / "devices.parquet", ["trace_id", "rank", "device", "kind", "name", "core_count",
                                                 "memory_bytes", "peak_tflops"])
    hardware = _hardware(devices, peak_overrides)
    # The chip's own peak (XLA; its bf16 matrix peak) is preferred, unless a person gave the device's FLOP/s in
    # the settings: then theirs (docs/analyses.md, "Peaks").
    given = [o for o in peak_overrides if set(o.figures) - {"hbm"}]
    peaks: dict[tuple[str, int], float] = {}
    for t, r, p, name in devices.select("trace_id", "rank", "peak_tflops", "name").drop_nulls(
            ["trace_id", "rank", "peak_tflops"]).iter_rows():
        key = (str(t), int(r))
        mine = hardware.get(key) if any(matches(o, name) for o in given) else None
        figure = mine.flops_for(PROFILE_PEAK_DTYPE) if mine is not None else None
        peaks[key] = figure / 1e12 if figure else float(p)
    operators = _operators(parsed / "host_ops.parquet")
    release_free_memory()  # the operators' passes freed their row groups: hand them back before the windows
    launches, graph_calls = launch_times(parsed / "host_ops.parquet", parsed / "device_ops.parquet")
    tables = DerivedTables(launches, graph_calls, windows, peaks, operators, hardware)
    ranks = keys(parsed / "device_ops.parquet")

    def rows(key: tuple[str, int]) -> RankRows:
        done = tables.rank_rows(*key, _windows(parsed / "device_ops.parquet", *key, CHUNK_ROWS))
        release_free_memory()  # the rank's windows and accumulators, back before the next rank's
        return done

    if threads > 1 and len(ranks) > 1:
        with ThreadPoolExecutor(min(threads, len(ranks)), thread_name_prefix="tracelake-derived") as pool:
            for done in pool.map(rows, ranks):  # in the ranks' order, whichever finishes first
                tables.add(done)
    else:
        for key in ranks:
            tables.add(rows(key))
    computed = tables.tables()
    for name in schema.DERIVED_TABLES:  # a table computed per run (critical_path) starts empty: docs/schema.md
        frame = computed.get(name)
        tbl = schema.table(name)
        if frame is None:
            arrow = tbl.arrow_schema.empty_table()
        else:
            frame = frame.select(tbl.column_names).with_columns(pl.selectors.categorical().cast(pl.String))
            arrow = (frame.sort("trace_id", "rank", "name") if name == "kernel_stats" else frame).to_arrow()
        pq.write_table(arrow.cast(tbl.arrow_schema), out_dir / f"{name}.parquet", compression="zstd")


def _read(path: Path, columns: list[str]) -> pl.DataFrame:
    """``columns`` of a small parsed table, read by Arrow, which the parse has loaded already. polars' own Parquet
    reader starts its I/O runtime and threads on first use: 15 MB more at the peak of a 30 MB TPU profile's ingest,
    and 40 ms (docs/architecture.md, "Memory"). Read as one file, not by ``pq.read_table``, which loads Arrow's
    datasets (another 15 MB)."""
    with pq.ParquetFile(path) as file:
        return pl.DataFrame(file.read(columns=columns))


def _hardware(devices: pl.DataFrame, overrides: tuple[Override, ...] = ()) -> dict[tuple[str, int], Peaks]:
    """Per (trace, rank), the peaks of its accelerator (the lowest device index that the table of known devices
    matches by name, SM count and memory: :func:`tracelake.analysis.peaks.lookup`), from the ``devices`` rows."""
    frame = devices.select("trace_id", "rank", "device", "kind", "name", "core_count", "memory_bytes")
    found: dict[tuple[str, int], Peaks] = {}
    for trace_id, rank, _, _, name, cores, memory in frame.filter(
            pl.col("trace_id").is_not_null() & pl.col("rank").is_not_null() & (pl.col("kind") != "nic")).sort(
            "trace_id", "rank", "device", nulls_last=True).iter_rows():
        key = (str(trace_id), int(rank))
        if key not in found and (peaks := resolve(name, cores, memory, overrides)) is not None:
            found[key] = peaks
    return found


def _operators(host_ops: Path) -> dict[str, Operators]:
    """Per trace, its operator calls and what each launch call is attributed to (:class:`Operators`).

    A row group at a time, in Arrow and numpy: the event ids alone first, into each trace's
    :class:`~tracelake.analysis.event_index.EventIndex`; then a pass that keeps 5 bytes per host event (its parent's
    position and its :class:`~tracelake.analysis.event_flags.EventFlags`: the chain from a launch call up to its
    operator runs through Python functions and annotations, so every event's parent is needed), 28 per launch call
    and the names of Python scope events; then the names and shapes of the calls that launched device ops only, as
    dictionary codes.
    """
    names = set(pq.read_schema(host_ops).names)
    if not _has_operators(host_ops):  # XLA's host events, say: every device op goes to no operator
        return {}
    # shapes repeat (a few hundred distinct in 100,000s of calls): read as dictionaries, they stay small
    file = pq.ParquetFile(host_ops, read_dictionary=[c for c in ("trace_id", "cat", "name", "input_dims",
                                                                 "input_types", "concrete_inputs") if c in names])
    autograd = [c for c in ("sequence_number", "fwd_thread_id") if c in names]
    groups = range(file.num_row_groups)
    # First the event ids alone, for each trace's index of them: then a row group's parent ids become positions as
    # it is read, and no array of every event's id or parent id is held (docs/architecture.md, "Memory")
    pieces: dict[str, list[np.ndarray]] = {}
    for part in _read_ahead(file, [(group, ["trace_id", "event_id"]) for group in groups]):
        for trace_id, mine, _ in _by_trace(part):
            pieces.setdefault(trace_id, []).append(event_index.narrow(_ints(mine["event_id"], -1)))
    indexes = {trace_id: event_index.build(found) for trace_id, found in pieces.items()}
    del pieces
    traces: dict[str, _Trace] = {}
    known: dict[str, tuple[bool, int, int]] = {}
    # (row group, trace, first position, rows, whether the group is that trace's part as it is) of each trace's part
    spans: list[tuple[int, str, int, int, bool]] = []
    columns = ["trace_id", "event_id", "parent_id", "cat", "name", "correlation", "ts_ns", "dur_ns", *autograd]
    for group, part in zip(groups, _read_ahead(file, [(group, columns) for group in groups]), strict=True):
        for trace_id, mine, whole in _by_trace(part):
            trace = traces.setdefault(trace_id, _Trace(indexes[trace_id]))
            spans.append((group, trace_id, trace.size, mine.num_rows, whole))
            trace.add(mine, known)
        # No release per row group: Arrow's pool is the system's (contracts/allocators.py), whose freed tops go back
        # as they form; a trim here handed back pages the next row group faulted in again (docs/architecture.md)
        del part
    found = {trace_id: trace.operators() for trace_id, trace in traces.items()}
    release_free_memory()  # the attribution's arrays (every host event's), back before the second pass reads
    wanted = [c for c in ("name", "dur_ns", *KEY_COLUMNS[1:]) if c in names]
    kept: dict[str, list[pa.Table]] = {}
    taken = dict.fromkeys(found, 0)  # per trace, how many of its calls' rows are read
    reads: list[tuple[int, str, int, bool, np.ndarray]] = []  # the row groups holding calls, and the calls' positions
    for group, trace_id, first, count, whole in spans:
        rows = found[trace_id].rows
        stop = int(np.searchsorted(rows, first + count))
        if stop > taken[trace_id]:
            reads.append((group, trace_id, first, whole, rows[taken[trace_id]:stop]))
            taken[trace_id] = stop
    read = _read_ahead(file, [(group, wanted if whole else ["trace_id", "event_id", *wanted])
                              for group, _, _, whole, _ in reads])
    for (_, trace_id, first, whole, calls), part in zip(reads, read, strict=True):
        if not whole:
            part = part.filter(pc.and_(pc.equal(part["trace_id"], trace_id), pc.is_valid(part["event_id"])))
        kept.setdefault(trace_id, []).append(part.take(calls - first).select(wanted))
    for trace_id, operators in found.items():
        parts = kept.pop(trace_id, None)
        table = pa.concat_tables(parts).unify_dictionaries() if parts else pa.table({})
        del parts
        # the trace's first-pass leftovers (its scope events' names) go once its modules are named
        module = traces.pop(trace_id).modules(operators.scope_rows, operators.scope_paths)
        size = table.num_rows
        host_ns = event_index.narrow(_ints(table["dur_ns"], 0)) if "dur_ns" in table.column_names \
            else np.zeros(size, dtype=np.int32)
        keyed = {name: table[name] for name in KEY_COLUMNS if name in table.column_names}
        del table  # _keyed lets go of each column once it is folded into the key
        key, distinct = _keyed(keyed, size, module)
        operators.set_keyed(key, distinct, host_ns)
        operators.drop_scopes()
    return found


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
    """What the first pass keeps of one trace's host events (:func:`_operators`)."""

    def __init__(self, index: event_index.EventIndex) -> None:
        self.size = 0
        self.index = index
        self.pieces: list[list[np.ndarray]] = [[] for _ in range(6)]  # parents, flags, the launch calls' four
        self.marks: list[list[np.ndarray]] = [[], [], [], []]  # autograd: positions, sequence numbers, backward, ids
        self.scope_rows: list[np.ndarray] = []
        self.scope_names: list[pa.Array] = []

    def add(self, part: pa.Table, known: dict[str, tuple[bool, int, int]]) -> None:
        """The next rows of the trace (a row group, or the trace's rows of one)."""
        offset, rows = self.size, part.num_rows
        self.size += rows
        cat = pc.dictionary_encode(part["cat"]).combine_chunks()  # a handful of categories: test each once
        cats = cat.dictionary.to_pylist()
        cat_codes = pc.fill_null(cat.indices, len(cats)).to_numpy(zero_copy_only=False)
        is_op = np.array([c == "cpu_op" for c in cats] + [False])[cat_codes]
        is_py = np.array([c == "python_function" for c in cats] + [False])[cat_codes]
        name = pc.dictionary_encode(part["name"]).combine_chunks()
        words = name.dictionary.to_pylist()
        for w in words:  # each name's tests run once, not once a row group
            if w and w not in known:
                known[w] = (counted(w), scope_kind("python_function", w), recompute_kind(w))
        flags = [known[w] if w else (False, 0, 0) for w in words] + [(False, 0, 0)]
        codes = pc.fill_null(name.indices, len(words)).to_numpy(zero_copy_only=False)
        kind = np.where(is_py, np.array([f[1] for f in flags], dtype=np.int8)[codes], 0).astype(np.int8)
        calls = np.flatnonzero(pc.and_(pc.is_valid(part["correlation"]), pc.is_valid(part["ts_ns"]))
                               .to_numpy(zero_copy_only=False))
        packed = EventFlags.pack(is_op, np.array([f[0] for f in flags], dtype=bool)[codes], kind,
                                 np.array([f[2] for f in flags], dtype=np.int8)[codes])
        position = event_index.position_type(self.index.size)
        at = (calls + offset).astype(position)
        columns = (self.index.positions(_ints(part["parent_id"], -1)), packed.bits, at,
                   *(_ints(part[c], 0)[calls] for c in ("correlation", "ts_ns", "dur_ns")))
        for piece, column in zip(self.pieces, columns, strict=True):
            piece.append(column)
        scoped = np.flatnonzero(kind)
        self.scope_rows.append((scoped + offset).astype(position))
        self.scope_names.append(name.take(pa.array(scoped)))
        if "sequence_number" in part.column_names:
            marked = np.flatnonzero(part["sequence_number"].is_valid().to_numpy(zero_copy_only=False))
            backward = (_ints(part["fwd_thread_id"], 0) > 0)[marked] if "fwd_thread_id" in part.column_names else \
                np.zeros(len(marked), dtype=bool)
            # 13 bytes a marked event, not 25 (a training trace marks every operator call): positions, sequence
            # numbers and ids int32 where they fit
            for piece, column in zip(self.marks, ((marked + offset).astype(position), event_index.narrow(
                    _ints(part["sequence_number"], 0)[marked]), backward,
                    event_index.narrow(_ints(part["event_id"], -1)[marked])), strict=True):
                piece.append(column)

    def operators(self) -> Operators:
        pieces, self.pieces = self.pieces, []

        def joined(column: int) -> np.ndarray:  # one column's pieces let go as it is joined: one copy at a time
            whole = np.concatenate(pieces[column])
            pieces[column] = []
            release_free_memory()  # the pieces lie freed between live buffers of the heap: their pages handed back
            return whole

        # the launch calls first: each correlation's call found, their four columns go before the rest is joined
        launches = launch_positions(joined(2), joined(3), joined(4), joined(5))
        parent, flags = joined(0), EventFlags(joined(1))
        marks = Autograd(*(np.concatenate(piece) for piece in self.marks)) if self.marks[0] else Autograd.empty()
        self.marks = [[], [], [], []]  # their pieces go now, not with the trace (at 4 GB, 35 MB)
        return Operators.from_arrays(parent, flags, launches, autograd=marks)

    def modules(self, scope_rows: np.ndarray, paths: Paths) -> tuple[np.ndarray, list[str | None]]:
        """For the positions ``scope_rows`` (-1: none) and each one's path of scope events, a code each into the
        returned names (the last: none).

        A path's text (:func:`~tracelake.analysis.op_scope.path_name`) is made once per distinct sequence of names:
        the events' names are dictionary codes, and the 100,000s of paths of a long trace repeat a few thousand
        sequences (the same modules, step after step), so no string is made or held per path. The sequences are
        looked up :data:`PATHS_CHUNK` paths at a time: the Python lists made of them are a chunk long (whole, at 4 GB
        of trace, they took 30 MB)."""
        code = np.zeros(len(scope_rows), dtype=np.int64)
        if not self.scope_names or not len(paths):
            return code, [None]
        rows = np.concatenate(self.scope_rows)
        members, inverse = np.unique(paths.members, return_inverse=True)
        at = np.minimum(np.searchsorted(rows, members), len(rows) - 1)
        # one dictionary for every row group's names, then codes only: no name is made a string per member
        named = pa.chunked_array(self.scope_names).unify_dictionaries().combine_chunks().take(pa.array(at))
        words: list[str | None] = named.dictionary.to_pylist()
        word = pc.fill_null(named.indices, len(words)).to_numpy(zero_copy_only=False).astype(np.int64)
        word[rows[at] != members] = len(words)  # an event that is not a scope event: no name
        words.append(None)
        inverse = inverse.reshape(-1)
        texts: dict[str | None, int] = {}  # each path text, numbered as first met
        numbered: dict[tuple[int, ...], int] = {}  # each sequence of names, by its text's number
        shown = np.empty(len(paths) + 1, dtype=np.int64)  # each path's text's number; the last: no path
        for first in range(0, len(paths), PATHS_CHUNK):
            last = min(first + PATHS_CHUNK, len(paths))
            sequence = word[inverse[paths.offsets[first]:paths.offsets[last]]].tolist()
            mine = []
            for begin, end in pairwise((paths.offsets[first:last + 1] - paths.offsets[first]).tolist()):
                key = tuple(sequence[begin:end])
                if (number := numbered.get(key)) is None:
                    number = numbered[key] = texts.setdefault(path_name([words[w] for w in key]), len(texts))
                mine.append(number)
            shown[first:last] = mine
        shown[-1] = texts.setdefault(None, len(texts))
        distinct = sorted(t for t in texts if t is not None)
        where: dict[str | None, int] = {t: i for i, t in enumerate(distinct)}
        order = np.array([where.get(t, len(distinct)) for t in texts], dtype=np.int64)  # by number: code, none last
        code[:] = order[shown][paths.index(scope_rows)]  # -1 (no scope) has no path: the last code, none
        return code, [*distinct, None]


#: Paths whose sequences of names :meth:`_Trace.modules` looks up at once.
PATHS_CHUNK = 1 << 16


def _keyed(columns: dict[str, pa.ChunkedArray], rows: int,
           module: tuple[np.ndarray, list[str | None]]) -> tuple[np.ndarray, pl.DataFrame]:
    """Each row's index into the distinct (name, input_dims, input_types, concrete_inputs, module) of the calls'
    ``columns`` (read as dictionaries, one dictionary per column; each taken out of ``columns`` once folded in;
    ``module``: codes and their names), and those distinct rows, sorted by their codes: from the dictionaries' codes,
    no string is copied per row. The key is built a column at a time, in place: one column's codes are held at once,
    not five (at 4 GB of trace, 690K calls: 22 MB less); its distinct values are found by hashing (Arrow's
    dictionary encoding: the codes as int32 and the distinct values), not by a sort, which held three more arrays
    of the calls at once."""
    words: list[list[str | None]] = []
    combined = np.zeros(rows, dtype=np.int64)
    for column in KEY_COLUMNS:
        values = columns.pop(column, None)
        if values is None or not values.num_chunks:
            words.append([None])
            continue
        if not pa.types.is_dictionary(values.type):
            values = pc.dictionary_encode(values)
        known = values.chunk(0).dictionary.to_pylist()
        combined *= len(known) + 1
        at = 0
        for chunk in values.chunks:
            combined[at:at + len(chunk)] += pc.fill_null(chunk.indices, len(known)).to_numpy(zero_copy_only=False)
            at += len(chunk)
        words.append([*known, None])
        del values
    combined *= len(module[1])
    combined += module[0]
    words.append(module[1])
    encoded = pc.dictionary_encode(pa.array(combined, type=pa.int64()))
    del combined
    found = encoded.dictionary.to_numpy()  # in order of first sight: renumbered in the codes' order, as a sort has them
    order = np.argsort(found, kind="stable")
    distinct = found[order]
    renumber = np.empty(len(found), dtype=np.int32)
    renumber[order] = np.arange(len(found), dtype=np.int32)
    key = renumber[encoded.indices.to_numpy(zero_copy_only=False)]
    del encoded
    texts: dict[str, list[str | None]] = {}
    for column, known in zip(reversed(GROUP_COLUMNS), reversed(words), strict=True):
        texts[column] = [known[i] for i in (distinct % len(known)).tolist()]
        distinct = distinct // len(known)
    return key.reshape(-1), pl.DataFrame({c: texts[c] for c in GROUP_COLUMNS},
                                         schema={c: pl.String for c in GROUP_COLUMNS})


#: Rows of a rank's device ops analysed at once: memory follows this, not the trace.
CHUNK_ROWS = 100_000

#: The device_ops columns the windowed analyses read.
_WINDOW_COLUMNS = ("trace_id", "rank", "stream", "step", "kind", "category", "name", "ts_ns", "dur_ns",
                   "correlation", "flops", "graph_id", "event_id")


def _row_groups(meta: pq.FileMetaData, trace_id: str, rank: int) -> list[tuple[int, int, bool]]:
    """(row group, smallest ``ts_ns``, whether every row is the rank's with a start) of the row groups that may hold
    ``rank``'s ops, earliest first.

    A row group without statistics may hold anything and comes first (smallest start unknown). The last item
    says, from the statistics, that the group holds no other (trace, rank) and no op without a start, so it
    needs no filter.
    """
    names = meta.schema.to_arrow_schema().names
    rank_col, ts_col, trace_col = names.index("rank"), names.index("ts_ns"), names.index("trace_id")
    found = []
    for i in range(meta.num_row_groups):
        group = meta.row_group(i)
        ranks, ts = group.column(rank_col).statistics, group.column(ts_col).statistics
        if ranks is not None and ranks.has_min_max and not ranks.min <= rank <= ranks.max:
            continue
        found.append((i, int(ts.min) if ts is not None and ts.has_min_max else breakdown.LOWEST,
                      only(ranks, rank) and only(group.column(trace_col).statistics, trace_id)
                      and ts is not None and ts.has_null_count and ts.null_count == 0))
    return sorted(found, key=lambda item: item[1])


def _windows(path: Path, trace_id: str, rank: int, chunk_rows: int) -> Iterator[Window]:
    """One (trace, rank)'s device ops in consecutive windows ``[low, high)`` of start times, each op once.

    The windows run from :data:`breakdown.LOWEST` to :data:`breakdown.HIGHEST` (the last one may hold no
    ops), ops with the same start share a window, and each window's ops are in start order. Row
    groups are read in order of their smallest start (Parquet statistics): once a row group is read,
    the ops starting before the next one's smallest start are all known. Those are cut off as a window
    before the next group would take the ops held past ``chunk_rows``: a window is then most often one
    row group as it was read, which polars takes without copying (a window of pieces of two groups is
    copied into one: 6 ms for 140,000 ops of a TPU trace, with their dictionaries). The parsers write each
    rank's ops nearly in time order, so few are held back; out of order, up to a whole rank is.
    Ops without a start are left out. Ops already in start order (the usual case) are cut, not sorted.
    """
    file = pq.ParquetFile(path, read_dictionary=["trace_id", "kind", "category", "name"])  # texts as codes
    groups = _row_groups(file.metadata, trace_id, rank)
    pending: list[pa.Table] = []  # in Arrow until a window is cut: one conversion to polars per window
    held = 0
    low = breakdown.LOWEST
    for position, (index, _, pure) in enumerate(groups):
        part = file.read_row_group(index, columns=_present(file))
        if not pure:
            part = part.filter(pc.and_(pc.and_(pc.equal(part["rank"], rank), pc.equal(part["trace_id"], trace_id)),
                                       pc.is_valid(part["ts_ns"])))
        pending.append(part)
        held += part.num_rows
        last = position + 1 == len(groups)
        high = breakdown.HIGHEST if last else groups[position + 1][1]
        coming = 0 if last else file.metadata.row_group(groups[position + 1][0]).num_rows
        if last or (held + coming > chunk_rows and high > low):  # cut before the next group would overfill it
            buffer = pa.concat_tables(pending) if len(pending) > 1 else pending[0]
            ts = buffer["ts_ns"].to_numpy()
            if not bool((ts[1:] >= ts[:-1]).all()):  # a stable sort: ops of one start keep the order they came in
                order = np.argsort(ts, kind="stable")  # timsort: linear on the few sorted runs a row group holds
                buffer, ts = buffer.take(order), ts[order]
                del order
            at = len(ts) if last else int(np.searchsorted(ts, high, side="left"))
            ready, pending = buffer.slice(0, at), [] if last else [buffer.slice(at)]
            held = sum(p.num_rows for p in pending)
            del buffer, ts
            yield from _cut(_with_graph_id(pl.DataFrame(ready)), low, high, chunk_rows)
            del ready
            low = high
    if not groups:
        yield low, breakdown.HIGHEST, pl.DataFrame(schema=_window_schema(path))


def _window_schema(path: Path) -> dict[str, pl.DataType]:
    empty = pq.read_schema(path).empty_table()
    return dict(_with_graph_id(pl.DataFrame(empty.select([c for c in _WINDOW_COLUMNS if c in empty.column_names])))
                .schema)


def _present(file: pq.ParquetFile) -> list[str]:
    """The :data:`_WINDOW_COLUMNS` the file has: files stored before ``graph_id`` existed lack it."""
    names = set(file.schema_arrow.names)
    return [c for c in _WINDOW_COLUMNS if c in names]


def _with_graph_id(ops: pl.DataFrame) -> pl.DataFrame:
    return ops if "graph_id" in ops.columns else ops.with_columns(pl.lit(None, dtype=pl.Int64).alias("graph_id"))


def _cut(ops: pl.DataFrame, low: int, high: int, chunk_rows: int) -> Iterator[Window]:
    """``[low, high)`` split into windows of about ``chunk_rows`` of ``ops`` (sorted by start), never within a start."""
    ts = ops["ts_ns"].to_numpy()
    done = 0
    while len(ts) - done > chunk_rows:
        at = int(np.searchsorted(ts, ts[done + chunk_rows], side="left"))
        if at <= done:  # one start shared by more than chunk_rows ops: they stay together
            at = int(np.searchsorted(ts, ts[done + chunk_rows], side="right"))
            if at >= len(ts):
                break
        yield low, int(ts[at]), ops[done:at]
        low, done = int(ts[at]), at
    yield low, high, ops[done:]
