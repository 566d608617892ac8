"""The final tables of a Kineto trace: the Parquet parts joined with their cross-event facts.

:func:`write_tables` writes ``<table>.parquet`` for every data table into the staging
directory. The big tables (host and device ops) are the parts, which hold their events in
event-id order, merged with their facts sorted by event id (:func:`_write_merged`; the parts
read by Arrow, a part at a time: :mod:`.part_rows`): no hash table, so their memory does not grow
with the trace. Parts that are not in that order go by DuckDB's hash join instead, by ranges of event ids
when one join would not fit DuckDB's memory limit (:data:`JOIN_BYTES_PER_ROW`).
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from contextlib import ExitStack, closing, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from tracelake.contracts import schema
from tracelake.contracts.allocators import GLIBC_MAPPED_THRESHOLD, large_buffers_mapped, release_free_memory
from tracelake.contracts.lazy import duckdb
from tracelake.contracts.schema import sql_literal

from .encoding import EncodingWriter
from .part_rows import PartColumns
from .row_batches import FileRows, HeldBatches


_ORDER = {
    "collectives": "ts_ns, event_id",
    "steps": "step",
    "counters": "name, ts_ns",
    "memory_events": "ts_ns, event_id",
}

#: Bytes of DuckDB's memory limit per row of the parts joined at once with their
#: cross-event columns, by table. DuckDB does not spill a hash join far enough to join a
#: multi-gigabyte trace within the limit in one go: at 200 MB a 2 GB trace's 3.2M host ops
#: fail, and its 0.94M device ops (their side of the join holds the category text) go out
#: of core at a third of the speed. Larger tables are joined by ranges of event ids, into
#: one file: at the default 200 MB, 1.25M host ops or 250K device ops a range.
JOIN_BYTES_PER_ROW = {"host_ops": 160, "device_ops": 800}
#: Rows per row group of a joined table, at most: each is held whole, as Arrow and encoded, until
#: written, beside the batches DuckDB prepares. Half DuckDB's own writer's size (122,880) took 40-65 MB off
#: each join's peak on a 1 GB trace (long kernel names) at the same speed; a quarter took 70 MB, but the
#: stored analyses, which read a row group at a time, took 0.2 s longer.
_ROW_GROUP_ROWS = 65_536
#: ... and the Arrow bytes a row group holds, at most, with never fewer rows than :data:`_ROW_GROUP_MIN_ROWS`.
#: Host ops run about 200 bytes a row (65,536 rows, 13 MB); the device ops of the real 1 GB Qwen shape 580, their
#: kernel names 380 characters long. Alone, on that trace's parts, the device ops' merge peaked 150 MiB above the
#: process at 65,536 rows a group, 105 at 32,768 and 80 at 16,384; but each group more cost the stored analyses,
#: which read a group at a time, 10 ms (0.08 s at 21,000 rows a group). At 24 MiB (43,000 rows) the ingest's peak
#: at that merge was 251-256 MiB, under the nesting's 312, at the stored analyses' time of before.
_ROW_GROUP_BYTES = 24 << 20
_ROW_GROUP_MIN_ROWS = 16_384

#: The host events' facts (from the nesting), as ``host_ops`` names them.
HOST_FACTS = ("depth", "parent_id", "step")
#: The joined tables' columns taken from their parts (the table's name: the parts'); ``ts_ns`` is shifted by the
#: trace's base time. The others are the facts' and the trace's id and rank.
PART_SOURCES = {
    "device_ops": {
        "event_id": "event_id", "device": "device", "stream": "stream", "kind": "kind", "name": "name",
        "ts_ns": "ts_ns", "dur_ns": "dur_ns", "correlation": "correlation", "external_id": "external_id",
        "bytes": "bytes", "grid": "grid", "block": "block", "registers_per_thread": "regs",
        "shared_memory_bytes": "smem", "occupancy_pct": "occupancy", "graph_id": "graph_id",
    },
    "host_ops": {
        "event_id": "event_id", "pid": "pid", "tid": "tid", "cat": "cat", "name": "name",
        "ts_ns": "ts_ns", "dur_ns": "dur_ns", "correlation": "correlation", "external_id": "external_id",
        "sequence_number": "sequence_number", "fwd_thread_id": "fwd_thread_id",
        "input_dims": "input_dims", "input_types": "input_types", "flops": "flops",
        "concrete_inputs": "concrete_inputs", "record_function_id": "record_function_id",
    },
}

_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def memory_limit(con: duckdb.DuckDBPyConnection) -> int:
    """The connection's memory limit in bytes (1 GB where DuckDB words it in a way not known here): what the joins
    plan their ranges by."""
    return _limit_bytes(con)


def _limit_bytes(con: duckdb.DuckDBPyConnection) -> int:
    limit = str(con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0])
    number, _, unit = limit.strip().partition(" ")
    try:
        return int(float(number) * _UNITS[unit.upper() or "B"])
    except (KeyError, ValueError):
        return 10**9


#: Settings of every DuckDB connection of an ingest (:func:`side_connection`, and the ingest's own in
#: ``pytorch_profiler_sql``): rows in any order unless a statement asks (:func:`_insertion_order`); and no cache of
#: the files opened: each Parquet part is read a few times and never changed, and that cache kept about 1.5 KiB a
#: part to the end (the 8 GB Qwen shape's 2,900 parts: 2 MiB), growing with the trace.
PARTS_SETTINGS = {"preserve_insertion_order": False, "enable_external_file_cache": False}


#: The share of the ingest's DuckDB memory limit a statement gets on a :func:`side_connection`, and the least it
#: gets. The nesting's sort of the host events took about 280 MB of RSS under the whole 200 MB limit on a 1 GB
#: trace, the peak of the ingest: at half the limit it spills sooner, 87 MB off that peak for +0.17 s of CPU in 12.
#: The final tables' sorts (each joined table's facts by event id, the memory instants by time) run under the same
#: share on the ingest's own connection (:func:`memory_share`): at 1 GB the memory instants' sort peaked 50 MiB
#: lower for 0.09 s. (Hash joins under the share went by twice the ranges, each reading all the facts again: 3-5%
#: more time on the 1 GB Qwen shape; the merge has no ranges.) So do the memory instants' ordered scan for their
#: merge (:func:`_sql_batches`; the ops' merges read their parts by Arrow: their scan in DuckDB peaked at 339 MiB
#: on the 4 GB Qwen shape under the share, against 346-358) and the device ops' steps' group of the launch calls by
#: correlation (``kineto_sql_facts.device_steps``: 1.29 M correlations at 4 GB reached 374 MiB of RSS under the
#: whole limit, 278-282 under the share). Not below 100 MB, where it would spill for little gain; a lower limit a
#: person set holds.
SIDE_SHARE = 0.5
SIDE_FLOOR = 100 * 10**6


def _shared(limit: int, share: float, floor: int) -> int:
    """``share`` of ``limit`` bytes, never below ``floor`` unless ``limit`` itself is lower."""
    return min(limit, max(int(limit * share), floor))


@contextmanager
def side_connection(con: duckdb.DuckDBPyConnection, share: float = SIDE_SHARE,
                    floor: int = SIDE_FLOOR) -> Iterator[duckdb.DuckDBPyConnection]:
    """A fresh in-memory DuckDB for a statement over the Parquet parts, with ``share`` of ``con``'s memory limit
    (never below ``floor`` bytes, unless ``con``'s is lower: then that), its threads, and a temporary folder of
    its own beside ``con``'s (``<folder>-side``: two databases spilling into one folder could take each other's
    files; DuckDB makes the folder when it first spills, and the staging folder holding both goes after the ingest).

    Its own database holds none of ``con``'s tables, so its limit binds its statement alone.
    """
    limit = _limit_bytes(con)
    threads, temp = con.execute("SELECT current_setting('threads'), current_setting('temp_directory')").fetchall()[0]
    side = duckdb.connect(config={"memory_limit": f"{_shared(limit, share, floor)}B",
                                  "threads": int(threads), "temp_directory": f"{temp}-side", **PARTS_SETTINGS})
    try:
        yield side
    finally:
        side.close()


def write_tables(
    con: duckdb.DuckDBPyConnection, staging: Path, parts: Path, trace_id: str, rank: int, base_ns: int
) -> None:
    """Write ``<table>.parquet`` into ``staging`` for every data table, times shifted by ``base_ns``."""
    constants: dict[str, str | int] = {"trace_id": trace_id, "rank": int(rank)}

    def taken(table_name: str, shifted: tuple[str, ...], sources: dict[str, str] | None = None,
              leave: tuple[str, ...] = ()) -> PartColumns:
        """``table_name``'s columns: from ``sources``, else each from the source's column of its name (less
        ``leave``); the trace's id and rank as constants; ``shifted`` moved by the base time."""
        tbl = schema.table(table_name)
        own = {c: c for c in tbl.column_names if c not in constants and c not in leave}
        return PartColumns(tbl, own if sources is None else sources, constants, frozenset(shifted), int(base_ns))

    # Per table: the parts' prefix, the facts (a relation on ``con`` keyed by ``event_id``) and their columns.
    joined = {"device_ops": ("device", "dev_d", ("category", "step")), "host_ops": ("host", "host_d", HOST_FACTS)}
    for table_name, (part, facts, fact_columns) in joined.items():
        _write_joined(con, staging / f"{table_name}.parquet", taken(table_name, ("ts_ns",), PART_SOURCES[table_name]),
                      parts, part, _Facts(facts, fact_columns, facts_file(parts, part)))
        release_free_memory()  # the merge's batches and row groups, freed on two threads: back before the next
    # Per table: the relation on ``con`` it is read from, and its columns as SQL.
    sources = {
        "collectives": ("coll", taken("collectives", ("ts_ns", "cpu_ts_ns"), leave=("is_async", "channels")).sql()
                        | {"is_async": "FALSE"}),
        "steps": ("step_rows", taken("steps", ("ts_ns", "device_start_ns", "device_end_ns")).sql()),
        "counters": ("counter_rows", taken("counters", ("ts_ns",)).sql()),
    }
    if any(parts.glob("memory-*.parquet")):  # the trace has memory instants (kineto_sql_facts.memory_events)
        columns = taken("memory_events", ("ts_ns",)).sql()
        if not _memory_merged(con, staging / "memory_events.parquet", parts, columns):
            sources["memory_events"] = ("mem_d", columns)
    for table_name, (source, exprs) in sources.items():
        select = schema.select_list(schema.table(table_name), exprs)
        out = sql_literal(str(staging / f"{table_name}.parquet"))
        with memory_share(con, SIDE_SHARE):  # the memory instants' sort spills sooner: 50 MiB off its peak at 1 GB
            con.execute(f"COPY (SELECT {select} FROM {source} ORDER BY {_ORDER[table_name]}) TO {out} "
                        "(FORMAT parquet, COMPRESSION zstd)")


def facts_file(parts: Path, part: str) -> Path:
    """The file holding the facts of the parts ``<part>-*`` in event-id order for their merge (:func:`_write_merged`
    sorts them into it; the sliced native sweep writes the host events' itself: ``kineto_nesting.sweep``)."""
    return parts / f"{part}_facts_by_id.parquet"


def part_files(parts: Path, part: str) -> list[Path]:
    """The parts ``<part>-<batch>.parquet`` in ``parts``, in the order of their batches."""
    return sorted(parts.glob(f"{part}-*.parquet"), key=lambda path: int(path.stem.rpartition("-")[2]))


#: The memory instants' columns that come from their facts (:data:`MEMORY_FACTS_FILE`), not from their parts.
_MEMORY_FACTS = ("op", "step")
#: The memory instants' facts sorted by id, for their merge (``kineto_memory_facts.sorted_facts`` makes it).
MEMORY_FACTS_FILE = "memory_facts_by_id.parquet"


def _memory_merged(con: duckdb.DuckDBPyConnection, out: Path, parts: Path, exprs: dict[str, str]) -> bool:
    """``out``: the memory instants merged with their op and step (:func:`_write_merged`), in order of time as the
    table is kept, where ``kineto_sql_facts.memory_events`` found them in that order in the file (it then made the
    view ``mem_rows`` and the facts' file :data:`MEMORY_FACTS_FILE`). False, with nothing at ``out``, where it did not
    or the merge could not keep that order: the instants are then sorted (``mem_d``)."""
    facts = parts / MEMORY_FACTS_FILE
    if not facts.exists():
        return False
    rows = {name: expr for name, expr in exprs.items() if name not in _MEMORY_FACTS}
    select = schema.select_list(schema.MEMORY_EVENTS, rows)  # the facts' columns NULL here, filled by the merge
    return _write_merged(con, out, schema.MEMORY_EVENTS, _sql_batches(con, select, "mem_rows"),
                         _Facts(f"read_parquet({sql_literal(str(facts))})", _MEMORY_FACTS, facts), ordered_by="ts_ns")


def parquet_files(paths: list[Path]) -> str:
    """The Parquet files ``paths`` as one relation, read in the order given."""
    return "read_parquet([" + ", ".join(sql_literal(str(path)) for path in paths) + "])"


def in_order(parts: Path, part: str) -> str:
    """The parts ``<part>-<batch>.parquet`` in ``parts`` as one relation, their files in the order of their batches
    (named out in a list: the order of a glob's matches is not a documented promise)."""
    files = part_files(parts, part)
    return parquet_files(files) if files else f"read_parquet({sql_literal(str(parts / f'{part}-*.parquet'))})"


@dataclass(frozen=True)
class _Facts:
    """The cross-event facts of a joined table: ``relation`` (on the ingest's connection, keyed by ``event_id``),
    its ``columns`` (named as the table's), and the file their copy sorted by event id goes to."""

    relation: str
    columns: tuple[str, ...]
    sorted_file: Path


def _write_joined(
    con: duckdb.DuckDBPyConnection, out: Path, columns: PartColumns, parts: Path, part: str, facts: _Facts,
) -> None:
    """``out``: the rows of the parts ``<part>-*`` in ``parts`` (each column as ``columns`` says) joined with
    ``facts`` on ``event_id``, the rows of either without a match left out.

    Merged (:func:`_write_merged`) where the parts come in event-id order, as both readers write them; else by
    DuckDB's hash join (:func:`_write_hash_joined`).
    """
    if not _write_merged(con, out, columns.table, columns.batches(part_files(parts, part)), facts):
        _write_hash_joined(con, out, columns.table, columns.sql(), in_order(parts, part), facts)


def _write_merged(
    con: duckdb.DuckDBPyConnection, out: Path, tbl: schema.Table, batches: Generator[pa.RecordBatch, None, None],
    facts: _Facts, ordered_by: str | None = None,
) -> bool:
    """``out`` (as :func:`_write_joined`) by a merge: the facts sorted by event id into a file (DuckDB's sort,
    under :data:`SIDE_SHARE` of the limit, spills), then ``batches`` (``tbl``'s rows, the facts' columns null) read
    in order beside them.
    False, with nothing left at ``out``, where the two do not line up one to one (the rows are out of order or
    either side has a row the other lacks), or where ``ordered_by`` names a column the rows must come in order of
    (no nulls, never decreasing) and they do not: the hash join or the sort is left to do it.

    A hash join holds a table of the facts (a range of them at a time) and the rows coming through: on a 1 GB
    trace it took 180-210 MiB above the process for either table; the merge 70-100 MiB, at the same CPU time.
    """
    if not facts.sorted_file.exists():  # the sliced native sweep writes the host events' facts so itself
        with memory_share(con, SIDE_SHARE):
            con.execute(f"COPY (SELECT event_id, {', '.join(facts.columns)} FROM {facts.relation} ORDER BY event_id) "
                        f"TO {sql_literal(str(facts.sorted_file))} "
                        f"(FORMAT parquet, COMPRESSION lz4, ROW_GROUP_SIZE {_ROW_GROUP_ROWS})")
    arrow_schema = tbl.arrow_schema
    at = [arrow_schema.get_field_index(name) for name in facts.columns]
    sorted_facts = FileRows(facts.sorted_file)
    order = _Order(ordered_by)
    with closing(batches), ExitStack() as mapped, _GroupedWriter(out, arrow_schema) as writer:
        mapping = False
        for batch in batches:
            if not mapping and _largest_text(batch) >= GLIBC_MAPPED_THRESHOLD // 2:
                mapped.enter_context(large_buffers_mapped())  # the next batches' texts: mapped apart
                mapping = True
            ids, values = sorted_facts.take(batch.num_rows)
            if not np.array_equal(ids, batch.column("event_id").to_numpy()) or not order.holds(batch):
                break
            arrays = batch.columns
            for i, name in zip(at, facts.columns, strict=True):
                arrays[i] = values.column(name).combine_chunks().cast(arrow_schema.field(i).type)
            writer.write(pa.RecordBatch.from_arrays(arrays, schema=arrow_schema))
        else:
            if sorted_facts.exhausted():
                return True
        writer.abandon()
    return False


def _largest_text(batch: pa.RecordBatch) -> int:
    """The bytes of the largest text column's characters in ``batch``: where a merge's batches hold texts of half
    :data:`.GLIBC_MAPPED_THRESHOLD` or more (the Qwen shape's device ops: 650 KB of kernel names a part), it reads
    them with such buffers mapped apart (:func:`.large_buffers_mapped`): read by Arrow, the 8 GB shape's device ops'
    merge peaked at 111-118 MiB so, at 134-140 without (1.5-2.0 s against 1.3 s). The host ops' texts (under half a
    MiB a part) are not: through DuckDB they gained nothing so and took 0.2-0.4 s longer of 5.3 s."""
    sizes = [column.buffers()[2].size for column in batch.columns
             if pa.types.is_string(column.type) and column.buffers()[2] is not None]
    return max(sizes, default=0)


def _sql_batches(con: duckdb.DuckDBPyConnection, select: str, relation: str
                 ) -> Generator[pa.RecordBatch, None, None]:
    """The rows of ``select`` over ``relation`` as DuckDB's batches, in the relation's order, under
    :data:`SIDE_SHARE` of ``con``'s limit."""
    with _insertion_order(con), memory_share(con, SIDE_SHARE):
        yield from con.sql(f"SELECT {select} FROM {relation}").to_arrow_reader(_ROW_GROUP_ROWS)


class _Order:
    """Whether batches come in order of a column (none: any order does): no nulls, never decreasing, within a
    batch and from one to the next."""

    def __init__(self, column: str | None) -> None:
        self._column = column
        self._last: int | None = None

    def holds(self, batch: pa.RecordBatch) -> bool:
        if self._column is None or not batch.num_rows:
            return True
        column = batch.column(self._column)
        if column.null_count:
            return False
        values = column.to_numpy()
        if (np.diff(values) < 0).any() or (self._last is not None and values[0] < self._last):
            return False
        self._last = int(values[-1])
        return True


def _write_hash_joined(
    con: duckdb.DuckDBPyConnection, out: Path, tbl: schema.Table, exprs: dict[str, str], part_rows: str,
    facts: _Facts,
) -> None:
    """``out`` (as :func:`_write_joined`) by DuckDB's hash join: one statement when the join fits DuckDB's memory
    limit (see :data:`JOIN_BYTES_PER_ROW`), else one range of event ids at a time (:func:`id_ranges`), streamed
    into a single Parquet writer."""
    select = schema.select_list(tbl, exprs | {name: name for name in facts.columns})
    query = (f"SELECT {select} FROM {part_rows} p "
             f"JOIN (SELECT event_id, {', '.join(facts.columns)} FROM {facts.relation}) d USING (event_id)")
    ranges = id_ranges(con, facts.relation, max(memory_limit(con) // JOIN_BYTES_PER_ROW[tbl.name], 1))
    if len(ranges) <= 1:
        con.execute(f"COPY ({query}) TO {sql_literal(str(out))} (FORMAT parquet, COMPRESSION zstd)")
        return
    with _GroupedWriter(out, tbl.arrow_schema) as writer:
        for first, stop in ranges:
            reader = con.sql(f"{query} WHERE p.event_id >= {first} AND p.event_id < {stop} "
                             f"AND d.event_id >= {first} AND d.event_id < {stop}").to_arrow_reader(_ROW_GROUP_ROWS)
            for batch in reader:
                writer.write(batch.cast(tbl.arrow_schema))


class _GroupedWriter:
    """A Parquet file of a joined table, written from batches of any size in row groups of about
    :data:`_ROW_GROUP_BYTES` (the rows per group set by the first rows written), each encoded while the next is
    prepared (:class:`.encoding.EncodingWriter`); ``abandon`` removes it."""

    def __init__(self, out: Path, arrow_schema: pa.Schema) -> None:
        # Dictionaries pay for the texts (names, categories) only; for numbers they cost writing time.
        texts = [f.name for f in arrow_schema if pa.types.is_string(f.type)]
        self._out = out
        # Each row group is encoded on a thread of its own while the next is read and joined.
        self._writer: EncodingWriter | None = EncodingWriter(out, arrow_schema, compression="zstd",
                                                             use_dictionary=texts)
        self._held = HeldBatches(arrow_schema)
        self._rows = 0  # per row group; 0 until rows come

    def write(self, batch: pa.RecordBatch) -> None:
        if not batch.num_rows or self._writer is None:
            return
        if not self._rows:
            self._rows = min(_ROW_GROUP_ROWS, max(_ROW_GROUP_MIN_ROWS, _ROW_GROUP_BYTES * batch.num_rows
                                                  // max(batch.nbytes, 1)))
        self._held.add(batch)
        while self._held.count >= self._rows:
            self._writer.write_table(self._held.take(self._rows), row_group_size=self._rows)

    def abandon(self) -> None:
        """Close and remove the file."""
        if self._writer is not None:
            writer, self._writer = self._writer, None
            with suppress(Exception):  # a failed write of a file being removed
                writer.close()
            self._out.unlink()

    def __enter__(self) -> _GroupedWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._writer is None:
            return
        writer, self._writer = self._writer, None
        if exc[0] is not None:
            with suppress(Exception):  # the error under way is the one to report
                writer.close()
            return
        if self._held.count:
            writer.write_table(self._held.take(self._held.count), row_group_size=self._rows)
        writer.close()


@contextmanager
def memory_share(con: duckdb.DuckDBPyConnection, share: float) -> Iterator[None]:
    """``con`` under ``share`` of its memory limit (never below :data:`SIDE_FLOOR`, unless its limit is lower),
    then its limit again."""
    limit = _limit_bytes(con)
    con.execute(f"SET memory_limit = '{_shared(limit, share, SIDE_FLOOR)}B'")
    try:
        yield
    finally:
        con.execute(f"SET memory_limit = '{limit}B'")


@contextmanager
def _insertion_order(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """``con`` keeping the rows of a scan in the order of its files (the ingest's connection does not, for speed)."""
    before = con.execute("SELECT current_setting('preserve_insertion_order')").fetchall()[0][0]
    con.execute("SET preserve_insertion_order = true")
    try:
        yield
    finally:
        con.execute(f"SET preserve_insertion_order = {'true' if before else 'false'}")


#: Buckets of event ids counted to cut the ranges of a join.
_ID_BUCKETS = 1024


def id_ranges(con: duckdb.DuckDBPyConnection, facts: str, rows_per_range: int) -> list[tuple[int, int]]:
    """Half-open ranges of event ids covering ``facts``, each holding at most ``rows_per_range`` of its rows.

    Cut at bucket edges (a bucket holds ``1/1024`` of the ids; one larger than the budget
    makes a range of its own), so that ops clustered in one part of a trace (Kineto writes
    a thread's CPU ops together) do not overfill a range. Empty for no rows.
    """
    rows, low, high = con.execute(f"SELECT count(*), min(event_id), max(event_id) FROM {facts}").fetchall()[0]
    if not rows:
        return []
    if rows <= rows_per_range:
        return [(low, high + 1)]
    width = -(-(high - low + 1) // _ID_BUCKETS)
    counts = con.execute(f"SELECT (event_id - {low}) // {width} AS bucket, count(*) FROM {facts} "
                         "GROUP BY bucket ORDER BY bucket").fetchall()
    ranges: list[tuple[int, int]] = []
    first, held = low, 0
    for bucket, count in counts:
        if held and held + count > rows_per_range:
            edge = low + bucket * width
            ranges.append((first, edge))
            first, held = edge, 0
        held += count
    ranges.append((first, high + 1))
    return ranges
