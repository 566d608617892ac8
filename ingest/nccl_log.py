"""NCCL debug logs (``NCCL_DEBUG=INFO``, FORMATS.md section 3) into ``communicators``, ``comm_channels``
and ``collectives``.

Lines read ``[timestamp ]host:pid:tid [cudaDev] NCCL INFO <msg>``, possibly behind a
launcher prefix (``[1,0]<stdout>:``, ``host: ``), ranks interleaved. The log is read in
chunks of 16 MB; polars splits each into lines and picks each message kind's lines by a
literal marker (the rare kinds' markers at once), then matches them with one regular
expression (Rust, vectorised), except COLL lines, most of a log, which are cut at
literal markers instead (:func:`coll_fields`); Python never touches a line:

- communicator init (``comm 0x.. rank R nranks N cudaDev D [nvmlDev M] busId B
  [commId 0x..] - Init COMPLETE``) and ``nRanks .. nNodes .. localRanks ..`` lines;
- transports per channel (``Channel 00/0 : 0[0] -> 1[1] via P2P/IPC``);
- COLL lines (``AllReduce: opCount 1a ... count .. datatype .. op .. root .. comm 0x..
  [nranks=8] stream 0x..``): a ``collectives`` row each, ``seq`` = opCount (the same on
  every rank of the communicator), ``process_group`` = the communicator's ``commId``
  when an init line gave it (else its address on that rank), rank from the init line of
  the same (host, pid, comm). COLL lines have no duration;
- TUNING lines (``AllReduce: 8388608 Bytes -> Algo RING proto LL128 channel{Lo..Hi}={0..15}``):
  the algorithm, protocol and channels of the COLL rows of that process, op and size;
- ``NCCL version``, WARN lines (counted, the first few kept as warnings).

Lines of anything else are skipped and counted; a file without any NCCL line is an error.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pyarrow as pa

from tracelake.warehouse.errors import TraceFormatError

from .model import ParseOptions, TraceInfo
from .nccl_ops import PER_RANK_SHARE, collective_name
from .source import iter_chunks
from .tables import write_table

FORMAT = "nccl_log"

_LINE = (r"^(?:\[\d+,\d+\]<std(?:out|err)>:|[\w.-]+: )?(?:\[(?P<ts>\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:\.\d+)?)\] ?)?"
         r"(?P<host>[\w.-]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] NCCL INFO ")
#: (marker text that every such line holds, pattern); lines are picked by the marker, then matched
#: by polars (Rust regex, vectorised) so that GB logs parse at scanning speed.
_INIT = ("Init COMPLETE",
         _LINE + r"(?:\w+ )?comm (?P<comm>0x[0-9a-f]+) rank (?P<rank>\d+) nranks (?P<nranks>\d+) cudaDev (?P<cuda>\d+)"
         r"(?: nvmlDev (?P<nvml>\d+))? busId (?P<bus>\w+)(?: commId (?P<commid>0x[0-9a-f]+))?")
_NODES = (" nNodes ",
          _LINE + r"comm (?P<comm>0x[0-9a-f]+) rank (?P<rank>\d+) nRanks (?P<nranks>\d+) nNodes (?P<nodes>\d+) "
          r"localRanks (?P<local_ranks>\d+) localRank (?P<local_rank>\d+)")
_CHANNEL = (" via ",
            _LINE + r"Channel (?P<channel>\d+)(?:/\d+)? : (?P<src>\d+)\[(?P<srcdev>\d+)\] -> (?P<dst>\d+)\[(?P<dstdev>\d+)\] "
            r"(?:\[(?P<direction>send|receive)\] )?via (?P<transport>\S+)")
_COLL = (" opCount ",
         _LINE + r"(?P<op>\w+): opCount (?P<opcount>[0-9a-f]+) sendbuff \S+ recvbuff \S+ count (?P<count>\d+) "
         r"datatype (?P<dtype>\d+) op (?P<redop>\d+) root (?P<root>\d+) comm (?P<comm>0x[0-9a-f]+)"
         r"(?: \[nranks=(?P<nranks>\d+)\])? stream (?P<stream>0x[0-9a-f]+)")
_TUNING = (" Bytes -> Algo ",
           _LINE + r"(?P<op>\w+): (?P<bytes>\d+) Bytes -> Algo (?P<algo>\w+) proto (?P<proto>\w+)"
           r"(?: channel\{Lo\.\.Hi\}=\{(?P<lo>\d+)\.\.(?P<hi>\d+)\})?")
_WARN = ("NCCL WARN", r"(?P<host>[\w.-]+):(?P<pid>\d+):\d+ \[\d+\] (?:\S+:\d+ )?(?:\(\w+\) )?NCCL WARN (?P<msg>.*)$")
_VERSION = re.compile(r"NCCL version (?P<version>[\w.+-]+)")

#: FORMATS.md: datatype codes -> bytes per element.
DTYPE = {0: ("int8", 1), 1: ("uint8", 1), 2: ("int32", 4), 3: ("uint32", 4), 4: ("int64", 8), 5: ("uint64", 8),
         6: ("float16", 2), 7: ("float32", 4), 8: ("float64", 8), 9: ("bfloat16", 2), 10: ("float8e4m3", 1),
         11: ("float8e5m2", 1)}
_KEEP_WARNINGS = 5


def sniff(head: bytes, filename: str) -> bool:
    """Text with NCCL's INFO/WARN lines or its version line."""
    return b" NCCL INFO " in head or b" NCCL WARN " in head or b"NCCL version " in head


class _State:
    def __init__(self) -> None:
        self.found: dict[str, list[pl.DataFrame]] = {
            "init": [], "nodes": [], "channel": [], "coll": [], "tuning": [], "warn": []}
        self.version: str | None = None
        self.lines = 0


_KINDS = {"init": _INIT, "nodes": _NODES, "channel": _CHANNEL, "coll": _COLL, "tuning": _TUNING, "warn": _WARN}


#: The markers of every kind but COLL, and of the version line: lines holding none are COLL lines or not NCCL's.
#: One regex of literals (SIMD-searched) picks them in a fraction of the time of one filter per marker.
_RARE = "|".join(re.escape(marker) for marker in [*(v[0] for k, v in _KINDS.items() if k != "coll"), "NCCL version"])


def _scan(text: str, state: _State) -> None:
    # polars splits the lines (in Rust: several times faster than str.split and a list of Python strings)
    lines = pl.Series("line", [text], dtype=pl.String).str.split("\n").explode()
    state.lines += int((lines.str.len_bytes() > 0).sum())
    rare = lines.filter(lines.str.contains(_RARE))
    if state.version is None:
        for line in rare.filter(rare.str.contains("NCCL version", literal=True)):
            if found := _VERSION.search(line):
                state.version = found.group("version")
                break
    for kind, (marker, pattern) in _KINDS.items():
        candidates = lines if kind == "coll" else rare
        picked = candidates.filter(candidates.str.contains(marker, literal=True))
        if picked.len():
            if kind == "coll":  # most of a log: cut into fields instead of one regex with 14 captures
                state.found[kind].append(_coll_rows(picked))
                continue
            groups = picked.str.extract_groups(pattern).struct.unnest()
            state.found[kind].append(groups.filter(pl.col("host").is_not_null()))


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


def _coll_split(lines: pl.Series) -> tuple[pl.DataFrame, pl.DataFrame]:
    """COLL lines cut into ``prefix`` (the origin's key), ``ts``, ``op``, ``opcount`` and ``tail``, with the
    captures of each distinct prefix (``_ORIGIN``; column ``key``: the prefix)."""
    frame = lines.rename("line").to_frame().select(_cut("line", " NCCL INFO ", "prefix", "message")).unnest("line")
    frame = frame.select("prefix", _cut("message", ": opCount ", "op", "after")).unnest("message")
    frame = frame.select("prefix", "op", _cut("after", " ", "opcount", "tail")).unnest("after")
    # The first timestamp (as _TS extracts it), and as the origin's key the prefix without it: _ORIGIN's
    # match lies after any timestamp (it holds no "[" but at its end), so it is the same in what follows.
    prefix, rest = pl.col("prefix"), pl.col("rest")
    if not frame["prefix"].str.contains(_TS_FIND).any():  # NCCL's default: no timestamps on INFO lines
        frame = frame.with_columns(pl.lit(None, dtype=pl.String).alias("ts"))
    elif (lines.str.len_bytes() == lines.str.len_chars()).all():  # ASCII: find's byte offsets index characters
        frame = frame.with_columns(prefix.str.slice(prefix.str.find(_TS_FIND) + 1).alias("rest"))
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


def _coll_rows(lines: pl.Series) -> pl.DataFrame:
    """COLL lines as typed columns (what :func:`_collectives` needs; the numbers of :func:`coll_fields`, cast once).

    A chunk's rows are kept until the end of the log, so they are made small at once: numbers
    and names are converted on the distinct prefixes and message ends, per line only the timestamp
    and the opCount.
    """
    frame, origins = _coll_split(lines)
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


def _frame(state: _State, kind: str) -> pl.DataFrame:
    frames = [f for f in state.found[kind] if f.height]
    return pl.concat(frames) if frames else pl.DataFrame()


def parse(source: Path, staging: Path, options: ParseOptions) -> TraceInfo:
    """Parse one NCCL debug log (any number of ranks interleaved).

    Raises:
        TraceFormatError: no NCCL line in the file.
    """
    state = _State()
    pending = ""
    for chunk in iter_chunks(source, on_bytes=options.on_bytes, name=options.source_name, chunk_bytes=16 << 20):
        text = pending + chunk.decode("utf-8", "replace")
        cut = text.rfind("\n") + 1
        pending = text[cut:]
        _scan(text[:cut], state)
    if pending:
        _scan(pending, state)
    frames = {kind: _frame(state, kind) for kind in _KINDS}
    recognised = sum(f.height for f in frames.values())
    if not recognised and state.version is None:
        raise TraceFormatError(options.source_name, f"no NCCL INFO/WARN lines in {state.lines:,} lines")
    comms = _communicators(frames["init"], frames["nodes"])
    write_table(staging, "communicators", {c: comms[c].to_arrow() for c in _COMM_COLUMNS if c in comms.columns},
                trace_id=options.trace_id)
    write_table(staging, "comm_channels", _channels(frames["channel"], comms), trace_id=options.trace_id)
    write_table(staging, "collectives", _collectives(frames["coll"], comms, frames["tuning"]),
                trace_id=options.trace_id)

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
    warn = frames["warn"]
    for row in warn.head(_KEEP_WARNINGS).iter_rows(named=True):
        info.warnings.append(f"NCCL WARN on {row['host']}:{row['pid']}: {str(row['msg']).strip()}")
    if warn.height > _KEEP_WARNINGS:
        info.warnings.append(f"{warn.height - _KEEP_WARNINGS} more NCCL WARN lines")
    if recognised < state.lines:
        info.warnings.append(f"recognised {recognised:,} of {state.lines:,} lines (the rest is not NCCL "
                             "output tracelake reads)")
    return info


_COMM_COLUMNS = ("rank", "comm", "comm_id", "nranks", "nodes", "local_ranks", "local_rank", "cuda_dev", "nvml_dev",
                 "bus_id", "host", "pid")
_KEY = ["host", "pid", "comm"]


def _communicators(init: pl.DataFrame, nodes: pl.DataFrame) -> pl.DataFrame:
    """One row per (host, pid, comm): what its init and nNodes lines say."""
    parts = []
    if init.height:
        parts.append(init.select(
            *_KEY, _i32("rank"), _i32("nranks"), _i32("cuda").alias("cuda_dev"), _i32("nvml").alias("nvml_dev"),
            pl.col("bus").alias("bus_id"), pl.col("commid").alias("comm_id"),
        ).unique(_KEY, keep="last", maintain_order=True))
    if nodes.height:
        parts.append(nodes.select(
            *_KEY, _i32("rank"), _i32("nranks"), _i32("nodes"), _i32("local_ranks"), _i32("local_rank"),
        ).unique(_KEY, keep="last", maintain_order=True))
    if not parts:
        return pl.DataFrame(schema={"host": pl.String, "pid": pl.String, "comm": pl.String, "rank": pl.Int32,
                                    "nranks": pl.Int32})
    comms = parts[0]
    if len(parts) == 2:
        comms = comms.join(parts[1], on=_KEY, how="full", coalesce=True, suffix="_n").with_columns(
            pl.coalesce("rank", "rank_n").alias("rank"), pl.coalesce("nranks", "nranks_n").alias("nranks"),
        ).drop("rank_n", "nranks_n")
    return comms.with_columns(_i64("pid")).sort("rank", "comm", nulls_last=True)


def _channels(channel: pl.DataFrame, comms: pl.DataFrame) -> dict[str, pa.Array]:
    if not channel.height:
        return {}
    ranks = comms.select("host", "pid", "rank").unique(["host", "pid"], keep="first") if comms.height else None
    frame = channel.with_columns(_i64("pid"))
    frame = frame.join(ranks, on=["host", "pid"], how="left") if ranks is not None else \
        frame.with_columns(pl.lit(None, dtype=pl.Int32).alias("rank"))
    out = frame.select(
        pl.coalesce(pl.col("rank"), _i32("src")).alias("rank"),
        _i32("channel"), _i32("src").alias("src_rank"), _i32("dst").alias("dst_rank"), "transport", "direction",
    )
    return {c: out[c].to_arrow() for c in out.columns}


def _collectives(coll: pl.DataFrame, comms: pl.DataFrame, tuning: pl.DataFrame) -> dict[str, pa.Array]:
    """COLL rows (:func:`_coll_rows`) as ``collectives`` rows; a TUNING line of the same process, op and size gives
    the algorithm, protocol and channel count (NCCL prints it on the ranks that tune, usually rank 0)."""
    if not coll.height:
        return {}
    frame = coll
    if comms.height:
        frame = frame.join(comms.select(*_KEY, "rank", pl.col("nranks").alias("comm_nranks"),
                                        *(["comm_id"] if "comm_id" in comms.columns else [])),
                           on=_KEY, how="left")
    for name, dtype in (("rank", pl.Int32), ("comm_nranks", pl.Int32), ("comm_id", pl.String)):
        if name not in frame.columns:
            frame = frame.with_columns(pl.lit(None, dtype=dtype).alias(name))
    if tuning.height:
        choices = tuning.select(
            "host", _i64("pid"), pl.col("op").alias("tuned_op"),
            _i64("bytes").alias("tuned_bytes"), pl.col("algo").alias("algorithm"),
            pl.col("proto").alias("protocol"),
            (_i32("hi") - _i32("lo") + 1).alias("channels"),
        ).unique(["host", "pid", "tuned_op", "tuned_bytes"], keep="last")
    else:
        choices = None
    nranks = pl.coalesce(pl.col("nranks"), pl.col("comm_nranks"))
    count, size, root = pl.col("count"), pl.col("size"), pl.col("root")
    message = count * size * pl.when(pl.col("collective").is_in(list(PER_RANK_SHARE))).then(
        nranks.cast(pl.Int64)).otherwise(1)
    frame = frame.with_columns(message.alias("message_bytes"))
    if choices is not None:
        # TUNING prints the bytes of one rank's buffer: count x element size
        frame = frame.with_columns((count * size).alias("buffer_bytes")).join(
            choices, left_on=["host", "pid", "op", "buffer_bytes"],
            right_on=["host", "pid", "tuned_op", "tuned_bytes"], how="left")
    for name, dtype in (("algorithm", pl.String), ("protocol", pl.String), ("channels", pl.Int32)):
        if name not in frame.columns:
            frame = frame.with_columns(pl.lit(None, dtype=dtype).alias(name))
    out = frame.select(
        pl.int_range(pl.len(), dtype=pl.Int64).alias("event_id"),
        "rank", "collective",
        pl.coalesce("comm_id", "comm").alias("process_group"),
        nranks.alias("group_size"), "seq", "dtype", count.alias("in_nelems"), "message_bytes",
        pl.when(pl.col("collective") == "send").then(pl.col("rank"))
        .when(pl.col("collective").is_in(["recv", "broadcast"])).then(root).alias("src_rank"),
        pl.when(pl.col("collective") == "send").then(root)
        .when(pl.col("collective") == "recv").then(pl.col("rank")).alias("dst_rank"),
        "ts_ns", "stream", pl.lit(False).alias("is_async"), "algorithm", "protocol", "channels",
    )
    return {c: out[c].to_arrow() for c in out.columns}
