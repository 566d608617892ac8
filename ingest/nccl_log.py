"""NCCL debug logs (``NCCL_DEBUG=INFO``, FORMATS.md section 3) into ``communicators``, ``comm_channels``
and ``collectives``.

Lines read ``[timestamp ]host:pid:tid [cudaDev] NCCL INFO <msg>``, possibly behind a
launcher prefix (``[1,0]<stdout>:``, ``host: ``), ranks interleaved. Each message kind
is found by one regular expression run over a whole chunk of the log (the regex
engine scans in C; Python only sees the matching lines), so a log of GBs parses at
the speed of the scan:

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


def _scan(text: str, state: _State) -> None:
    lines = pl.Series("line", text.split("\n"), dtype=pl.String)
    state.lines += int((lines.str.len_bytes() > 0).sum())
    if state.version is None and (found := _VERSION.search(text)):
        state.version = found.group("version")
    for kind, (marker, pattern) in _KINDS.items():
        picked = lines.filter(lines.str.contains(marker, literal=True))
        if picked.len():
            if kind == "coll":  # most of a log: split into fields instead of one regex with 14 captures
                state.found[kind].append(coll_fields(picked))
                continue
            groups = picked.str.extract_groups(pattern).struct.unnest()
            state.found[kind].append(groups.filter(pl.col("host").is_not_null()))


_TS = r"\[(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:\.\d+)?)\]"
_ORIGIN = r"(?P<host>[\w.-]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\]$"
#: COLL message words (split at spaces): the keywords at their positions, then the values read after them.
_COLL_KEYWORDS = {1: "opCount", 3: "sendbuff", 5: "recvbuff", 7: "count", 9: "datatype", 11: "op", 13: "root",
                  15: "comm"}
_COLL_VALUES = {"opcount": 2, "count": 8, "dtype": 10, "redop": 12, "root": 14, "comm": 16}


def coll_fields(lines: pl.Series) -> pl.DataFrame:
    """The fields of COLL lines (``_COLL``'s named groups, as strings); lines that are not well-formed are left out.

    The same fields as extracting ``_COLL[1]``'s groups from every line (a test keeps them
    equal on well-formed logs), several times faster: regex captures are slow, so the
    message is split at spaces and each value read at its position after its keyword is
    checked, and only the short ``host:pid:tid [dev]`` end of the prefix is matched. Unlike
    the pattern, any launcher prefix before ``host:pid:tid`` is accepted.
    """
    halves = lines.str.split_exact(" NCCL INFO ", 1).struct.rename_fields(["prefix", "message"]).struct.unnest()
    words = halves["message"].str.split_exact(" ", 19).struct.unnest()
    w = [pl.col(f"field_{i}") for i in range(20)]
    nranks = w[17].str.starts_with("[nranks=")
    stream = pl.when(nranks).then(w[19]).otherwise(w[18])
    stream_key = pl.when(nranks).then(w[18]).otherwise(w[17])
    number = [w[i].str.to_integer(base=10, strict=False).is_not_null() & ~w[i].str.starts_with("+")
              for i in (8, 10, 12, 14)]
    ok = pl.all_horizontal(
        w[0].str.ends_with(":"), *(w[i] == keyword for i, keyword in _COLL_KEYWORDS.items()),
        w[2].str.to_integer(base=16, strict=False).is_not_null() & ~w[2].str.starts_with("+"), *number,
        w[16].str.contains(r"^0x[0-9a-f]+$"), stream_key == "stream", stream.str.contains(r"^0x[0-9a-f]+$"),
        ~nranks | w[17].str.contains(r"^\[nranks=\d+\]$"),
    ).fill_null(False)
    values = words.select(
        ok.alias("ok"), w[0].str.strip_suffix(":").alias("op"), *(w[i].alias(name) for name, i in _COLL_VALUES.items()),
        pl.when(nranks).then(w[17].str.slice(8).str.strip_suffix("]")).alias("nranks"), stream.alias("stream"),
    )
    keep = values["ok"]
    prefix = halves["prefix"].filter(keep)
    origin = prefix.str.extract_groups(_ORIGIN).struct.unnest()
    ts = prefix.str.extract(_TS, 1) if prefix.str.contains(r"\[\d{4}-").any() else pl.repeat(
        None, prefix.len(), dtype=pl.String, eager=True)
    found = pl.concat([origin, values.filter(keep).drop("ok")], how="horizontal").insert_column(0, ts.alias("ts"))
    return found.filter(pl.col("host").is_not_null()).select(
        "ts", "host", "pid", "tid", "dev", "op", *_COLL_VALUES, "nranks", "stream")


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
    """COLL lines as ``collectives`` rows; a TUNING line of the same process, op and size gives the algorithm,
    protocol and channel count (NCCL prints it on the ranks that tune, usually rank 0)."""
    if not coll.height:
        return {}
    frame = coll.with_columns(_i64("pid"))
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
    names = {name: collective_name(name) for name in frame["op"].unique().to_list()}
    op = pl.col("op").replace_strict(names, return_dtype=pl.String)
    dtype_code = _i64("dtype")
    size = dtype_code.replace_strict({k: v[1] for k, v in DTYPE.items()}, default=None, return_dtype=pl.Int64)
    nranks = pl.coalesce(_i32("nranks"), pl.col("comm_nranks"))
    count = _i64("count")
    message = count * size * pl.when(op.is_in(list(PER_RANK_SHARE))).then(nranks.cast(pl.Int64)).otherwise(1)
    root = _i32("root")
    frame = frame.with_columns(op.alias("collective"), message.alias("message_bytes"))
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
        nranks.alias("group_size"),
        pl.col("opcount").str.to_integer(base=16, strict=False).alias("seq"),
        dtype_code.replace_strict({k: v[0] for k, v in DTYPE.items()}, default=pl.col("dtype"),
                                  return_dtype=pl.String).alias("dtype"),
        count.alias("in_nelems"), "message_bytes",
        pl.when(pl.col("collective") == "send").then(pl.col("rank"))
        .when(pl.col("collective").is_in(["recv", "broadcast"])).then(root).alias("src_rank"),
        pl.when(pl.col("collective") == "send").then(root)
        .when(pl.col("collective") == "recv").then(pl.col("rank")).alias("dst_rank"),
        pl.col("ts").str.replace(" ", "T").str.to_datetime("%Y-%m-%dT%H:%M:%S%.f", time_unit="ns", strict=False)
        .dt.epoch("ns").alias("ts_ns"),
        (pl.col("stream").str.slice(2).str.to_integer(base=16, strict=False) % (1 << 62)).alias("stream"),
        pl.lit(False).alias("is_async"), "algorithm", "protocol", "channels",
    )
    return {c: out[c].to_arrow() for c in out.columns}
