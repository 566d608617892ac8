"""NCCL debug logs (``NCCL_DEBUG=INFO``, docs/formats.md, section 3) into ``communicators``, ``comm_channels``
and ``collectives``.

Lines read ``[timestamp ]host:pid:tid [cudaDev] NCCL INFO <msg>``, possibly behind a
launcher prefix (``[1,0]<stdout>:``, ``host: ``), ranks interleaved. The log is read in
chunks of :data:`CHUNK_BYTES`; polars splits each into lines and picks each message kind's
lines by a literal marker (the rare kinds' markers at once), then matches them with one
regular expression (Rust, vectorised; every shape is in :mod:`.nccl_log_lines`), except
COLL lines, most of a log, which are cut at literal markers instead (:func:`coll_fields`);
Python never touches a line:

- communicator init (``comm 0x.. rank R nranks N cudaDev D [nvmlDev M] [busId B]
  [commId 0x..] - Init COMPLETE``) and ``nRanks .. nNodes .. localRanks ..`` lines;
- transports per channel (``Channel 00/0 : 0[0] -> 1[1] via P2P/IPC``, ``Ring 00 : 0 -> 1 [send] via ..``),
  each the row of the rank that wrote it, the transport whole;
- ring orders, trees, ``Connected all rings``, network choices and the like: counted, not stored;
- COLL lines (``AllReduce: opCount 1a ... count .. datatype .. op .. root .. comm 0x..
  [nranks=8] stream 0x..``): a ``collectives`` row each, ``seq`` = opCount (the same on
  every rank of the communicator), ``process_group`` = the communicator's ``commId``
  when an init line gave it (else its address on that rank), rank from the init line of
  the same (host, pid, comm). COLL lines have no duration;
- TUNING lines (``AllReduce: 8388608 Bytes -> Algo RING proto LL128 channel{Lo..Hi}={0..15}``):
  the algorithm, protocol and channels of the COLL rows of that process, op and size;
- ``NCCL version``, WARN lines (counted, the first few kept as warnings).

Chunks are scanned on the ingest's threads (polars works without the GIL) and taken in
log order. Memory stays flat in the size of the log: a chunk's COLL rows are typed at
once and handed to :mod:`.nccl_log_writer`, which stages them in compressed Arrow parts;
only the small facts they are joined with (communicators, TUNING choices, the first
warnings) are held whole. Once the log is read, each part is joined with them and
appended to ``collectives.parquet`` (:func:`.nccl_log_writer.write_collectives`), since
an init or TUNING line may come after the COLL lines it describes.

Lines of anything else are skipped and counted; a file without any NCCL line is an error.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
import pyarrow as pa

from tracelake.contracts.errors import TraceFormatError

from .model import ParseOptions, TraceInfo
from .nccl_log_lines import _VERSION, COLL_MARKER, COUNTED, KINDS
from .nccl_log_writer import COMM_KEY, PART_ROWS, TUNING_KEY, Parts, write_collectives
from .nccl_ops import collective_name
from .source import iter_chunks
from .tables import append_table, write_table

FORMAT = "nccl_log"

#: docs/formats.md (NCCL debug log): datatype codes -> bytes per element.
DTYPE = {0: ("int8", 1), 1: ("uint8", 1), 2: ("int32", 4), 3: ("uint32", 4), 4: ("int64", 8), 5: ("uint64", 8),
         6: ("float16", 2), 7: ("float32", 4), 8: ("float64", 8), 9: ("bfloat16", 2), 10: ("float8e4m3", 1),
         11: ("float8e5m2", 1)}
_KEEP_WARNINGS = 5


def sniff(head: bytes, filename: str) -> bool:
    """Text with NCCL's INFO/WARN lines or its version line."""
    return b" NCCL INFO " in head or b" NCCL WARN " in head or b"NCCL version " in head


#: Bytes of the log read and scanned at a time. Larger chunks spread polars' per-call costs over more lines,
#: but every buffer a chunk needs is allocated afresh (and its pages faulted in) each time; on a 200 MB log
#: 8 MB took the least CPU (4 MB more per call, 16 MB more page faults), and a chunk in flight takes a few
#: tens of MB.
CHUNK_BYTES = 8 << 20
#: The most chunks scanned at once: each takes a few tens of MB while in flight.
SCAN_THREADS = 4


class _State:
    """What the scan keeps between chunks: the rare kinds' rows, the version, counts; COLL rows go to ``parts``."""

    def __init__(self, parts: Parts) -> None:
        self.found: dict[str, list[pl.DataFrame]] = {"init": [], "nodes": [], "channel": [], "nics": []}
        #: One row per (host, pid, op, bytes): the last TUNING line's choice (a log tuned per call has many).
        self.choices: pl.DataFrame | None = None
        #: The first WARN lines (host, pid, msg), at most :data:`_KEEP_WARNINGS`.
        self.warnings: pl.DataFrame | None = None
        self.parts = parts
        self.matched = dict.fromkeys(_KINDS, 0)
        self.version: str | None = None
        self.version_lines = 0
        self.lines = 0

    def merge(self, found: _Found) -> None:
        """Take in the next chunk's lines."""
        self.lines += found.lines
        self.version = self.version or found.version
        self.version_lines += found.version_lines
        for kind, rows in found.kinds.items():
            self.matched[kind] += rows.height
            if not rows.height:
                continue
            if kind == "coll":
                self.parts.add(rows)
            elif kind == "tuning":
                self.keep_tuning(rows)
            elif kind == "warn":
                self.keep_warnings(rows)
            elif kind in COUNTED:
                continue
            else:
                self.found[kind].append(rows)

    def keep_tuning(self, tuning: pl.DataFrame) -> None:
        """Fold a chunk's TUNING lines into :attr:`choices` (later lines win, as they would over the whole log)."""
        found = tuning.select(
            "host", _i64("pid"), pl.col("op").alias("tuned_op"),
            _i64("bytes").alias("tuned_bytes"), pl.col("algo").alias("algorithm"),
            pl.col("proto").alias("protocol"),
            (_i32("hi") - _i32("lo") + 1).alias("channels"),
        )
        if self.choices is not None:
            found = pl.concat([self.choices, found])
        self.choices = found.unique(TUNING_KEY, keep="last", maintain_order=True)

    def keep_warnings(self, warn: pl.DataFrame) -> None:
        """Keep the first WARN lines, up to what the trace's warnings show."""
        found = warn.select("host", "pid", "msg").head(_KEEP_WARNINGS)
        if self.warnings is not None:
            found = pl.concat([self.warnings, found]).head(_KEEP_WARNINGS)
        self.warnings = found


_KINDS = KINDS


#: Every line but COLL lines that may be NCCL's (each kind's marker then picks its own among these): the INFO
#: lines that are not COLL lines, WARN and version lines. One regex of three literals (SIMD-searched) and the
#: COLL mask the scan makes anyway cost less than one search for every kind's marker at once.
_RARE = " NCCL INFO |NCCL WARN|NCCL version"


def _texts(source: Path, options: ParseOptions, chunk_bytes: int) -> Iterator[list[str]]:
    """The log's text a chunk at a time, whole lines only (one or two strings, to be split into lines).

    A line cut by the chunk's end is finished with the next chunk's first line; bytes are decoded
    once, without copying the chunk first.
    """
    pending = b""
    for chunk in iter_chunks(source, on_bytes=options.on_bytes, name=options.source_name, chunk_bytes=chunk_bytes):
        cut = chunk.rfind(b"\n") + 1
        if not cut:
            pending += chunk
            continue
        start = chunk.find(b"\n") + 1 if pending else 0
        texts = [(pending + chunk[:start]).decode("utf-8", "replace")] if pending else []
        texts.append(str(memoryview(chunk)[start:cut], "utf-8", "replace"))
        pending = chunk[cut:]
        yield texts
    if pending:
        yield [pending.decode("utf-8", "replace")]


@dataclass
class _Found:
    """What one chunk holds: its non-empty lines, the version line's version, each kind's well-formed lines
    (COLL lines as typed rows, :func:`coll_rows`; the others as their pattern's groups)."""

    lines: int
    version: str | None = None
    version_lines: int = 0
    kinds: dict[str, pl.DataFrame] = field(default_factory=dict)


def _scan(texts: list[str]) -> _Found:
    """Find every kind's lines in one chunk's text (:func:`_texts`); runs on a worker thread."""
    # polars splits the lines (in Rust: several times faster than str.split and a list of Python strings);
    # str.isascii() reads a flag CPython keeps, so knowing that byte offsets index characters is free
    lines = pl.Series("line", texts, dtype=pl.String).str.split("\n").explode()
    found = _Found(int((lines.str.len_bytes() > 0).sum()))
    is_coll = lines.str.contains(COLL_MARKER, literal=True)
    rare = lines.filter(lines.str.contains(_RARE) & ~is_coll)
    versions = rare.filter(rare.str.contains(_VERSION.pattern))
    found.version_lines = versions.len()
    for line in versions.head(1):
        if version := _VERSION.search(line):
            found.version = version.group("version")
    for kind, (marker, pattern) in _KINDS.items():
        if kind == "coll":
            picked = lines.filter(is_coll)
        elif isinstance(marker, str):
            picked = rare.filter(rare.str.contains(marker, literal=True))
        else:
            picked = rare.filter(rare.str.contains("|".join(re.escape(m) for m in marker)))
        if not picked.len():
            continue
        if kind == "coll":  # most of a log: cut into fields instead of one regex with 14 captures
            found.kinds[kind] = coll_rows(picked, all(text.isascii() for text in texts))
        else:
            found.kinds[kind] = picked.str.extract_groups(pattern).struct.unnest().filter(pl.col("host").is_not_null())
    return found


def _scan_all(source: Path, options: ParseOptions, chunk_bytes: int, state: _State) -> None:
    """Scan the log's chunks on ``options.threads`` threads, at most :data:`SCAN_THREADS` (polars runs
    without the GIL), merged in log order.

    At most that many chunks are in flight, plus the one being read, so memory stays bounded.
    """
    workers = min(max(1, options.threads), SCAN_THREADS)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tracelake-nccl-log") as pool:
        running: deque[Future[_Found]] = deque()
        try:
            for texts in _texts(source, options, chunk_bytes):
                running.append(pool.submit(_scan, texts))
                while len(running) >= workers:
                    state.merge(running.popleft().result())
            while running:
                state.merge(running.popleft().result())
        finally:
            for future in running:
                future.cancel()


_TS = r"\[(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:\.\d+)?)\]"
#: A timestamp, found without capturing (the regex engine's fast path); it holds no ``]`` up to its end.
_TS_FIND = r"\[\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:\.\d+)?\]"
_ORIGIN = r"(?P<host>[\w.-]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\]$"
#: What follows ``<op>: opCount <hex> `` in a COLL line: ``_COLL``'s pattern from there on; its buffers, which
#: change from call to call; and what follows them, the same for many calls.
_COLL_NUMBERS = (r"^(?P<count>\d+) datatype (?P<dtype>\d+) op (?P<redop>\d+) root (?P<root>\d+) "
                 r"comm (?P<comm>0x[0-9a-f]+)(?: \[nranks=(?P<nranks>\d+)\])? stream (?P<stream>0x[0-9a-f]+)")
_COLL_TAIL = r"^sendbuff \S+ recvbuff \S+ count " + _COLL_NUMBERS[1:]
_COLL_BUFFERS = r"^sendbuff \S+ recvbuff \S+$"
_COLL_COLUMNS = ("ts", "host", "pid", "tid", "dev", "op", "opcount", "count", "dtype", "redop", "root", "comm",
                 "nranks", "stream")


def _groups_of_distinct(keys: pl.Series, pattern: str) -> pl.DataFrame:
    """``pattern``'s named groups for each distinct value of ``keys`` (column ``key``: the value)."""
    distinct = keys.unique()
    return pl.concat([distinct.to_frame("key"), distinct.str.extract_groups(pattern).struct.unnest()],
                     how="horizontal")


def _cut(column: str, separator: str, first: str, rest: str) -> pl.Expr:
    """``column`` cut at the first ``separator``: ``first`` before it, ``rest`` after it (null when it has none)."""
    return pl.col(column).str.splitn(separator, 2).struct.rename_fields([first, rest])


def _coll_split(lines: pl.Series, ascii: bool = False) -> tuple[pl.DataFrame, pl.DataFrame]:
    """COLL lines cut into ``prefix`` (the origin's key), ``ts``, ``op``, ``opcount`` and ``tail``, with the
    captures of each distinct prefix (``_ORIGIN``; column ``key``: the prefix). ``ascii``: the lines are
    known to be ASCII (else they are checked)."""
    frame = lines.rename("line").to_frame().select(_cut("line", " NCCL INFO ", "prefix", "message")).unnest("line")
    frame = frame.select("prefix", _cut("message", ": opCount ", "op", "after")).unnest("message")
    frame = frame.select("prefix", "op", _cut("after", " ", "opcount", "tail")).unnest("after")
    # The first timestamp (as _TS extracts it), and as the origin's key the prefix without it: _ORIGIN's
    # match lies after any timestamp (it holds no "[" but at its end), so it is the same in what follows.
    prefix, rest = pl.col("prefix"), pl.col("rest")
    found = frame["prefix"].str.find(_TS_FIND)  # the one pass of the regex over every line
    if found.null_count() == found.len():  # NCCL's default: no timestamps on INFO lines
        frame = frame.with_columns(pl.lit(None, dtype=pl.String).alias("ts"))
    elif ascii or (lines.str.len_bytes() == lines.str.len_chars()).all():  # find's byte offsets index characters
        frame = frame.with_columns(prefix.str.slice(found + 1).alias("rest"))
        closing = rest.str.find("]", literal=True)
        frame = frame.with_columns(rest.str.head(closing).alias("ts"),
                                   pl.coalesce(rest.str.slice(closing + 1), prefix).alias("prefix")).drop("rest")
    else:
        frame = frame.with_columns(prefix.str.extract(_TS, 1).alias("ts"), prefix.str.replace(_TS_FIND, " "))
    return frame, _groups_of_distinct(frame["prefix"], _ORIGIN)


def _coll_join(frame: pl.DataFrame, origins: pl.DataFrame,
               convert: Callable[[pl.DataFrame], pl.DataFrame] = lambda groups: groups) -> pl.DataFrame:
    """``frame``'s lines with the fields of their origin and tail; only the well-formed ones (``_COLL`` matches).

    ``convert`` turns a table of distinct values' captures (column ``key``, the named groups
    as strings, ``comm`` null where the pattern did not match) into the columns wanted, once
    per distinct value rather than per line.
    """
    frame = frame.join(origins.with_columns(pl.col("host").is_not_null().alias("origin_ok")), left_on="prefix",
                       right_on="key", how="left", maintain_order="left")
    # The tail's buffers are checked per line (no captures); what follows them is captured once per distinct value.
    frame = frame.with_columns(_cut("tail", " count ", "buffers", "numbers").alias("cut")).unnest("cut")
    numbers = convert(_groups_of_distinct(frame["numbers"], _COLL_NUMBERS))
    fields = [c for c in numbers.columns if c != "key"]
    frame = frame.join(numbers, left_on="numbers", right_on="key", how="left", maintain_order="left")
    frame = frame.with_columns(
        (pl.col("comm").is_not_null() & pl.col("buffers").str.contains(_COLL_BUFFERS)).fill_null(False)
        .alias("tail_ok"))
    if not frame["tail_ok"].all():  # damaged lines, or a buffer named "count": their whole tail by the pattern
        whole = convert(_groups_of_distinct(frame.filter(~pl.col("tail_ok"))["tail"], _COLL_TAIL))
        frame = frame.join(whole.rename({c: f"{c}_whole" for c in fields}), left_on="tail", right_on="key",
                           how="left", maintain_order="left")
        frame = frame.with_columns(
            *(pl.when("tail_ok").then(pl.col(c)).otherwise(pl.col(f"{c}_whole")).alias(c) for c in fields),
            (pl.col("tail_ok") | pl.col("comm_whole").is_not_null()).alias("tail_ok"))
    ok = pl.col("origin_ok") & pl.col("tail_ok") & pl.col("op").str.contains(r"^\w+$") \
        & pl.col("opcount").str.contains(r"^[0-9a-f]+$")
    return frame.filter(ok.fill_null(False))


def coll_fields(lines: pl.Series) -> pl.DataFrame:
    """The fields of COLL lines (``_COLL``'s named groups, as strings); lines that are not well-formed are left out.

    The same fields as extracting ``_COLL[1]``'s groups from every line (a test keeps them
    equal on well-formed and damaged lines), many times faster: regex captures are slow, so
    each line is only cut at literal markers (``" NCCL INFO "``, ``": opCount "``, the space
    after the opCount) and its timestamp found without capturing; the captures run once per
    *distinct* ``host:pid:tid [dev]`` prefix and per distinct ``count .. stream ..`` end of
    the message (a job's collectives repeat their counts, types, communicators and
    streams), and are joined back; the buffers before that end are only checked. Unlike
    the pattern, any launcher prefix before ``host:pid:tid`` is accepted.
    """
    return _coll_join(*_coll_split(lines)).select(_COLL_COLUMNS)


def coll_rows(lines: pl.Series, ascii: bool = False) -> pl.DataFrame:
    """COLL lines as typed columns (what :func:`.nccl_log_writer.write_collectives` needs; the numbers of
    :func:`coll_fields`, cast once).

    A chunk's rows wait in a part until the end of the log, so they are made small at once: numbers
    and names are converted on the distinct prefixes and message ends, per line only the timestamp
    and the opCount. ``ascii``: the lines are known to be ASCII.
    """
    frame, origins = _coll_split(lines, ascii)
    origins = origins.select("key", "host", _i64("pid"))
    names = {name: collective_name(name) for name in frame["op"].unique().drop_nulls().to_list()}
    code = _i64("dtype")

    def typed(groups: pl.DataFrame) -> pl.DataFrame:
        return groups.select(
            "key", "comm", _i64("count"), code.replace_strict({k: v[1] for k, v in DTYPE.items()}, default=None,
                                                              return_dtype=pl.Int64).alias("size"),
            code.replace_strict({k: v[0] for k, v in DTYPE.items()}, default=pl.col("dtype"),
                                return_dtype=pl.String).alias("dtype"),
            _i32("root"), _i32("nranks"),
            (pl.col("stream").str.slice(2).str.to_integer(base=16, strict=False) % (1 << 62)).alias("stream"),
        )

    stamps = frame["ts"]
    if stamps.null_count() == stamps.len():  # a log without timestamps (the default but for WARN lines)
        ts_ns = pl.lit(None, dtype=pl.Int64)
    elif stamps.str.contains("T", literal=True).any():
        ts_ns = pl.col("ts").str.replace(" ", "T").str.to_datetime("%Y-%m-%dT%H:%M:%S%.f", time_unit="ns",
                                                                  strict=False).dt.epoch("ns")
    else:  # NCCL's default "%F %T": parsed as it is, without the copy that replacing the space makes
        ts_ns = pl.col("ts").str.to_datetime("%Y-%m-%d %H:%M:%S%.f", time_unit="ns", strict=False).dt.epoch("ns")
    return _coll_join(frame, origins, typed).select(
        ts_ns.alias("ts_ns"), "host", "pid", "comm", "op",
        pl.col("op").replace_strict(names, return_dtype=pl.String).alias("collective"),
        pl.col("opcount").str.to_integer(base=16, strict=False).alias("seq"),
        "count", "size", "dtype", "root", "nranks", "stream",
    )


def _i32(name: str) -> pl.Expr:
    """A captured number as Int32, null where it does not fit (a damaged log's 20-digit rank must not stop it)."""
    return pl.col(name).cast(pl.Int32, strict=False)


def _i64(name: str) -> pl.Expr:
    """A captured number as Int64, null where it does not fit."""
    return pl.col(name).cast(pl.Int64, strict=False)


def parse(source: Path, staging: Path, options: ParseOptions, *, chunk_bytes: int = CHUNK_BYTES,
          part_rows: int = PART_ROWS) -> TraceInfo:
    """Parse one NCCL debug log (any number of ranks interleaved).

    Args:
        source, staging, options: As for every parser (:data:`ParseFunction`).
        chunk_bytes: Bytes read and scanned at a time (tests make it small to cross chunk ends).
        part_rows: COLL rows held before they are written out as one part.

    Raises:
        TraceFormatError: no NCCL line in the file.
    """
    state = _State(Parts(staging / "nccl_log_collectives", part_rows))
    try:
        _scan_all(source, options, chunk_bytes, state)
        recognised = sum(state.matched.values()) + state.version_lines
        if not recognised:
            raise TraceFormatError(options.source_name, f"no NCCL INFO/WARN lines in {state.lines:,} lines")
        comms = _communicators(_frame(state, "init"), _frame(state, "nodes"))
        write_table(staging, "communicators", {c: comms[c].to_arrow() for c in _COMM_COLUMNS if c in comms.columns},
                    trace_id=options.trace_id)
        write_table(staging, "comm_channels", _channels(_frame(state, "channel")), trace_id=options.trace_id)
        if nics := _nics(_frame(state, "nics")):
            append_table(staging, "devices", {"device": [i for i, _ in nics], "kind": ["nic"] * len(nics),
                                              "name": [n for _, n in nics]}, trace_id=options.trace_id)
        write_collectives(staging, options.trace_id, state.parts, comms, state.choices)
        return _info(source, state, comms, recognised)
    finally:
        state.parts.remove()


def _frame(state: _State, kind: str) -> pl.DataFrame:
    """Every line of a kind held whole (init, nNodes, transport lines: a few per communicator), as one frame."""
    frames = state.found[kind]
    return pl.concat(frames) if frames else pl.DataFrame()


def _info(source: Path, state: _State, comms: pl.DataFrame, recognised: int) -> TraceInfo:
    """The trace's facts: ranks, world size, version, host, warnings."""
    info = TraceInfo(format=FORMAT, event_count=recognised, uncompressed_bytes=source.stat().st_size)
    ranks = sorted(r for r in comms["rank"].to_list() if r is not None) if comms.height else []
    info.rank = ranks[0] if ranks else 0
    info.rank_source = "NCCL init lines"
    most = comms["nranks"].max() if comms.height else None
    info.world_size = int(most) if isinstance(most, int) else None
    info.nccl_version = state.version
    info.backend = "nccl"
    hosts = sorted(h for h in comms["host"].to_list() if h) if comms.height else []
    info.host = hosts[0] if hosts else None
    if state.warnings is not None:
        for row in state.warnings.iter_rows(named=True):
            info.warnings.append(f"NCCL WARN on {row['host']}:{row['pid']}: {str(row['msg']).strip()}")
    if state.matched["warn"] > _KEEP_WARNINGS:
        info.warnings.append(f"{state.matched['warn'] - _KEEP_WARNINGS} more NCCL WARN lines")
    if recognised < state.lines:
        info.warnings.append(f"recognised {recognised:,} of {state.lines:,} lines (the rest is not NCCL "
                             "output tracelake reads)")
    return info


_COMM_COLUMNS = ("rank", "comm", "comm_id", "nranks", "nodes", "local_ranks", "local_rank", "cuda_dev", "nvml_dev",
                 "bus_id", "host", "pid")


def _communicators(init: pl.DataFrame, nodes: pl.DataFrame) -> pl.DataFrame:
    """One row per (host, pid, comm): what its init and nNodes lines say."""
    parts = []
    if init.height:
        parts.append(init.select(
            *COMM_KEY, _i32("rank"), _i32("nranks"), _i32("cuda").alias("cuda_dev"), _i32("nvml").alias("nvml_dev"),
            pl.col("bus").alias("bus_id"), pl.col("commid").alias("comm_id"),
        ).unique(COMM_KEY, keep="last", maintain_order=True))
    if nodes.height:
        parts.append(nodes.select(
            *COMM_KEY, _i32("rank"), _i32("nranks"), _i32("nodes"), _i32("local_ranks"), _i32("local_rank"),
        ).unique(COMM_KEY, keep="last", maintain_order=True))
    if not parts:
        return pl.DataFrame(schema={"host": pl.String, "pid": pl.String, "comm": pl.String, "rank": pl.Int32,
                                    "nranks": pl.Int32})
    comms = parts[0]
    if len(parts) == 2:
        comms = comms.join(parts[1], on=COMM_KEY, how="full", coalesce=True, suffix="_n").with_columns(
            pl.coalesce("rank", "rank_n").alias("rank"), pl.coalesce("nranks", "nranks_n").alias("nranks"),
        ).drop("rank_n", "nranks_n")
    return comms.with_columns(_i64("pid")).sort("rank", "comm", nulls_last=True)


_NIC = re.compile(r"\[(\d+)\]([^\s\[;]+)")


def _nics(lines: pl.DataFrame) -> list[tuple[int, str]]:
    """The network devices of the ``NET/<net> : Using`` lines, once each: ``mlx5_0:1/IB``, ``mlx5_1:1/RoCE``
    (device, port, link layer) for NET/IB; the interface name alone for NET/Socket (its address left out)."""
    if not lines.height:
        return []
    seen: dict[str, int] = {}
    for net, devices in lines.select("net", "devices").unique(maintain_order=True).iter_rows():
        for index, name in _NIC.findall(str(devices)):
            seen.setdefault(name.split(":")[0] if net == "Socket" else name, int(index))
    return [(index, name) for name, index in seen.items()]


def _channels(channel: pl.DataFrame) -> dict[str, pa.Array]:
    """One row per connection line, ``rank`` the rank that wrote it: the line's own source rank, or its
    destination for a ``[receive]`` line (NCCL prints those as ``peer -> me``). Not the process's rank: one
    process may drive several GPUs, each its own rank, and the ``[N]`` after the pid is only the device."""
    if not channel.height:
        return {}
    out = channel.select(
        pl.when(pl.col("direction") == "receive").then(_i32("dst")).otherwise(_i32("src")).alias("rank"),
        _i32("channel"), _i32("src").alias("src_rank"), _i32("dst").alias("dst_rank"), "transport", "direction",
    )
    return {c: out[c].to_arrow() for c in out.columns}
