"""NCCL debug logs (``NCCL_DEBUG=INFO``, docs/formats.md, section 3) into ``communicators``, ``comm_channels``
and ``collectives``.

Lines read ``[timestamp ]host:pid:tid [cudaDev] NCCL INFO <msg>``, possibly behind a
launcher prefix (``[1,0]<stdout>:``, ``host: ``), ranks interleaved. The log is read in
chunks of :data:`CHUNK_BYTES`. COLL lines, most of a log, are made typed rows by the native
scanner (``_nccl_scan.c``, :mod:`.nccl_log_scan`, the GIL released), which hands the other
NCCL lines on; where it is not built, is turned off (``TRACELAKE_NCCL_LOG_ENGINE=polars``)
or meets a COLL line it is not sure of, polars reads the chunk: it splits it into lines, and
cuts the COLL lines at literal markers (:mod:`.nccl_log_coll`; the same rows, tests hold the
two equal). The other kinds' lines are picked by a literal marker (the rare kinds' markers
at once) and matched with one regular expression (Rust, vectorised; every shape is in
:mod:`.nccl_log_lines`). Python never touches a line:

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

Chunks are scanned on the ingest's threads (the scanner and polars work without the GIL)
and taken in log order; a plain file is read into a few buffers used in turn. Memory stays
flat in the size of the log: a chunk's COLL rows are typed at once and handed to
:mod:`.nccl_log_writer`, which stages them in compressed Arrow parts;
only the small facts they are joined with (communicators, TUNING choices, the first
warnings) are held whole. Once the log is read, each part is joined with them and
appended to ``collectives.parquet`` (:func:`.nccl_log_writer.write_collectives`), since
an init or TUNING line may come after the COLL lines it describes.

Lines of anything else are skipped and counted; a file without any NCCL line is an error.
"""

from __future__ import annotations

import itertools
import re
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from tracelake.contracts.errors import TraceFormatError
from tracelake.contracts.lazy import polars as pl

from . import nccl_log_scan
from .model import ParseOptions, TraceInfo
from .nccl_log_coll import DTYPE, _i32, _i64, coll_fields, coll_rows  # noqa: F401  (DTYPE, coll_fields: re-exported)
from .nccl_log_lines import _VERSION, COLL_MARKER, COUNTED, KINDS
from .nccl_log_writer import COMM_KEY, PART_ROWS, TUNING_KEY, Parts, write_collectives
from .source import is_gzip, iter_chunks
from .tables import append_table, write_table

FORMAT = "nccl_log"

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


Piece = bytes | memoryview


def _chunks(source: Path, options: ParseOptions, chunk_bytes: int,
            buffers: int) -> Iterator[tuple[bytes | bytearray, int]]:
    """The log's bytes a chunk at a time, as (buffer, bytes read into it).

    A plain file is read into ``buffers`` buffers in turn, each one read over again ``buffers``
    chunks later (the caller has scanned it by then): no new chunk, page faults and copy each
    time, as :func:`.source.iter_chunks` makes, which reads gzip files (and names the errors).
    """
    if is_gzip(source) or not source.stat().st_size:
        for chunk in iter_chunks(source, on_bytes=options.on_bytes, name=options.source_name, chunk_bytes=chunk_bytes):
            yield chunk, len(chunk)
        return
    ring: list[bytearray] = []
    with open(source, "rb", buffering=0) as raw:
        for turn in itertools.count():
            if len(ring) < buffers:
                ring.append(bytearray(chunk_bytes))
            buffer = ring[turn % buffers]
            read = raw.readinto(buffer)
            if not read:
                return
            if options.on_bytes is not None:
                options.on_bytes(read)
            yield buffer, read


def _pieces(source: Path, options: ParseOptions, chunk_bytes: int, buffers: int = 1) -> Iterator[list[Piece]]:
    """The log's bytes a chunk at a time, whole lines only (one or two pieces, each of whole lines).

    A line cut by the chunk's end is finished with the next chunk's first line, without copying
    the chunk: the second piece is a view of it, valid until ``buffers`` more chunks are read
    (:func:`_chunks`).
    """
    pending = b""
    for chunk, end in _chunks(source, options, chunk_bytes, buffers):
        cut = chunk.rfind(b"\n", 0, end) + 1
        if not cut:
            pending += chunk[:end]
            continue
        start = chunk.find(b"\n", 0, end) + 1 if pending else 0
        pieces: list[Piece] = [pending + chunk[:start]] if pending else []
        pieces.append(memoryview(chunk)[start:cut])
        pending = bytes(chunk[cut:end])
        yield pieces
    if pending:
        yield [pending]


@dataclass
class _Found:
    """What one chunk holds: its non-empty lines, the version line's version, each kind's well-formed lines
    (COLL lines as typed rows, :func:`coll_rows`; the others as their pattern's groups)."""

    lines: int
    version: str | None = None
    version_lines: int = 0
    kinds: dict[str, pl.DataFrame] = field(default_factory=dict)


def _scan(pieces: list[Piece]) -> _Found:
    """Find every kind's lines in one chunk (:func:`_pieces`) with polars; runs on a worker thread."""
    # polars splits the lines (in Rust: several times faster than str.split and a list of Python strings);
    # str.isascii() reads a flag CPython keeps, so knowing that byte offsets index characters is free
    texts = [str(piece, "utf-8", "replace") for piece in pieces]
    lines = pl.Series("line", texts, dtype=pl.String).str.split("\n").explode()
    found = _Found(int((lines.str.len_bytes() > 0).sum()))
    is_coll = lines.str.contains(COLL_MARKER, literal=True)
    _read_rare(lines.filter(lines.str.contains(_RARE) & ~is_coll), found)
    coll = lines.filter(is_coll)
    if coll.len():  # most of a log: cut into fields instead of one regex with 14 captures
        found.kinds["coll"] = coll_rows(coll, all(text.isascii() for text in texts))
    return found


def _scan_native(pieces: list[Piece]) -> _Found:
    """:func:`_scan` by the native scanner (:mod:`.nccl_log_scan`), the GIL released; the rare kinds' lines it
    picks are read by polars, and a chunk with a COLL line the scanner is not sure of is read by :func:`_scan`."""
    scanned = []
    for piece in pieces:
        if (one := nccl_log_scan.scan(piece)) is None:
            return _scan(pieces)
        scanned.append(one)
    found = _Found(sum(one.lines for one in scanned))
    rare = b"".join(one.rare for one in scanned)
    if rare:
        _read_rare(pl.Series("line", [rare.decode("utf-8", "replace")], dtype=pl.String).str.split("\n").explode(),
                   found)
    rows = [one.rows for one in scanned if one.rows is not None]
    if rows:
        found.kinds["coll"] = pl.concat(rows) if len(rows) > 1 else rows[0]
    return found


def _read_rare(rare: pl.Series, found: _Found) -> None:
    """Read the lines of every kind but COLL lines into ``found`` (``rare``: the lines :data:`_RARE` picks)."""
    versions = rare.filter(rare.str.contains(_VERSION.pattern))
    found.version_lines = versions.len()
    for line in versions.head(1):
        if version := _VERSION.search(line):
            found.version = version.group("version")
    for kind, (marker, pattern) in _KINDS.items():
        if kind == "coll":
            continue
        if isinstance(marker, str):
            picked = rare.filter(rare.str.contains(marker, literal=True))
        else:
            picked = rare.filter(rare.str.contains("|".join(re.escape(m) for m in marker)))
        if picked.len():
            found.kinds[kind] = picked.str.extract_groups(pattern).struct.unnest().filter(pl.col("host").is_not_null())


def _scan_all(source: Path, options: ParseOptions, chunk_bytes: int, state: _State) -> None:
    """Scan the log's chunks on ``options.threads`` threads, at most :data:`SCAN_THREADS` (polars runs
    without the GIL), merged in log order.

    At most that many chunks are in flight, plus the one being read, so memory stays bounded.
    """
    workers = min(max(1, options.threads), SCAN_THREADS)
    scan = _scan_native if nccl_log_scan.use_native(options.nccl_log_engine) else _scan
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tracelake-nccl-log") as pool:
        running: deque[Future[_Found]] = deque()
        try:
            # a chunk's buffer is read over again once `workers` + 1 more are read: the loop below has merged it
            for pieces in _pieces(source, options, chunk_bytes, workers + 1):
                running.append(pool.submit(scan, pieces))
                while len(running) >= workers:
                    state.merge(running.popleft().result())
            while running:
                state.merge(running.popleft().result())
        finally:
            for future in running:
                future.cancel()


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
        trace_id = options.final_trace_id()  # the file may still be hashed until now (detect.Format.late_id)
        write_table(staging, "communicators", {c: comms[c].to_arrow() for c in _COMM_COLUMNS if c in comms.columns},
                    trace_id=trace_id)
        write_table(staging, "comm_channels", _channels(_frame(state, "channel")), trace_id=trace_id)
        if nics := _nics(_frame(state, "nics")):
            append_table(staging, "devices", {"device": [i for i, _ in nics], "kind": ["nic"] * len(nics),
                                              "name": [n for _, n in nics]}, trace_id=trace_id)
        write_collectives(staging, trace_id, state.parts, comms, state.choices)
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
