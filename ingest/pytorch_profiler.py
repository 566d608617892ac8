"""PyTorch profiler (Kineto) Chrome-trace JSON: ``.json`` and ``.json.gz``.

Two stages keep memory bounded whatever the trace size:

1. Stream: the ``traceEvents`` array is decoded batch by batch into compact typed
   structs (msgspec), split by kind (device op, host op, collective arguments,
   counter) into Arrow columns and appended to staging Parquet files.
2. Normalise: DuckDB turns the staged rows into the warehouse tables (timestamps
   to epoch ns, categories, steps, nesting, collective-to-kernel links), out of
   core and on all cores; see :mod:`tracelake.ingest.pytorch_profiler_sql`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import compress
from operator import attrgetter
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tracelake.warehouse.errors import TraceFormatError

from . import pytorch_profiler_sql
from .chrome_json import ChromeTraceReader
from .model import ParseOptions, TraceInfo
from .source import iter_chunks

FORMAT = "pytorch_profiler"

#: Event categories that are operations on a device stream.
DEVICE_CATS = frozenset(
    {"kernel", "gpu_memcpy", "gpu_memset", "cuda_sync", "Kernel", "Memcpy", "Memset", "mtia_ccp_events"}
)
#: Complete events that are neither device ops nor host ops.
NOT_HOST_CATS = DEVICE_CATS | {"gpu_user_annotation", "Trace", "ac2g", "async_cpu_to_gpu", "fwdbwd"}

_RANK_IN_NAME = re.compile(r"(?:^|[^a-z])rank[-_]?(\d+)(?:[^0-9]|$)", re.IGNORECASE)
_HOST_IN_NAME = re.compile(r"^(?P<host>[A-Za-z0-9.-]+)_(?P<pid>\d+)\.\d+\.pt\.trace\.json")


#: Numeric args: some back-ends write them as strings ("stream": "0x0", "bytes": "256").
Num = int | float | str | None


class Args(msgspec.Struct, frozen=True, gc=False, rename={
    "external_id": "External id",
    "seq_nr": "Sequence number",
    "fwd_tid": "Fwd thread id",
    "input_dims": "Input Dims",
    "input_types": "Input type",
    "regs": "registers per thread",
    "smem": "shared memory",
    "occupancy": "est. achieved occupancy %",
    "coll_name": "Collective name",
    "in_nelems": "In msg nelems",
    "out_nelems": "Out msg nelems",
    "group_size": "Group size",
    "pg_name": "Process Group Name",
    "pg_desc": "Process Group Description",
    "pg_ranks": "Process Group Ranks",
    "coll_seq": "Seq",
    "src_rank": "Src Rank",
    "dst_rank": "Dst Rank",
    "total_allocated": "Total Allocated",
    "total_reserved": "Total Reserved",
    "device_id": "Device Id",
    "device_type": "Device Type",
}):
    """The ``args`` keys tracelake keeps; unknown keys are skipped by the decoder."""

    external_id: Num = None
    correlation: Num = None
    device: Num = None
    stream: Num = None
    bytes: Num = None
    grid: list[int] | None = None
    block: list[int] | None = None
    regs: Num = None
    smem: Num = None
    occupancy: Num = None
    seq_nr: Num = None
    fwd_tid: Num = None
    input_dims: msgspec.Raw = msgspec.Raw(b"")
    input_types: msgspec.Raw = msgspec.Raw(b"")
    flops: Num = None
    coll_name: str | None = None
    dtype: str | None = None
    in_nelems: Num = None
    out_nelems: Num = None
    group_size: Num = None
    pg_name: msgspec.Raw = msgspec.Raw(b"")
    pg_desc: str | None = None
    pg_ranks: msgspec.Raw = msgspec.Raw(b"")
    coll_seq: Num = None
    src_rank: Num = None
    dst_rank: Num = None
    name: str | None = None
    total_allocated: Num = None
    total_reserved: Num = None
    device_id: Num = None
    device_type: Num = None


_NO_ARGS = Args()


class Event(msgspec.Struct, gc=False):
    """One element of ``traceEvents``; ``ts``/``dur`` stay as JSON text for exact ns."""

    ph: str
    cat: str = ""
    name: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: msgspec.Raw = msgspec.Raw(b"")
    dur: msgspec.Raw = msgspec.Raw(b"")
    args: Args = _NO_ARGS


class CounterEvent(msgspec.Struct, gc=False):
    """A ``"ph": "C"`` event, whose args are arbitrary series names."""

    ph: str
    name: str = ""
    pid: int | str = 0
    ts: msgspec.Raw = msgspec.Raw(b"")
    args: dict[str, Any] = {}


def sniff(head: bytes, filename: str) -> bool:
    """True for a Chrome-trace JSON object that looks like PyTorch profiler output."""
    text = head.lstrip()
    if not text.startswith(b"{"):
        return False
    markers = (b'"traceEvents"', b'"schemaVersion"', b'"deviceProperties"', b'"distributedInfo"')
    return any(m in head for m in markers)


# -- stage 1: stream into staging Parquet ------------------------------------------

_get = {name: attrgetter(name) for name in ("ph", "cat", "name", "pid", "tid", "ts", "dur")}


def _args(field: str) -> Callable[[Event], Any]:
    return attrgetter(f"args.{field}")


_SEP = b"\x1f"


def _raw_text(values: list[msgspec.Raw]) -> pa.Array:
    """JSON text of raw values as strings; empty (absent) values become null.

    The values are joined with a control character, which valid JSON never holds
    unescaped (not even in whitespace), and split again in one vectorised call.
    """
    if not values:
        return pa.array([], pa.string())
    joined = _SEP.join(values)
    parts = pc.split_pattern(pa.array([joined], pa.large_binary()).cast(pa.large_string()), _SEP.decode())
    arr = parts.flatten().cast(pa.string())
    return pc.if_else(pc.equal(arr, ""), pa.scalar(None, pa.string()), arr)


def _ids(values: list[Any]) -> tuple[pa.Array, pa.Array]:
    """pid/tid are ints in most events, strings in some; keep both forms."""
    try:
        return pa.array(values, pa.int64()), pa.nulls(len(values), pa.string())
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
        ints = [v if type(v) is int else None for v in values]
        strs = [v if type(v) is str else None for v in values]
        return pa.array(ints, pa.int64()), pa.array(strs, pa.string())


def _common(events: list[Event], event_ids: np.ndarray) -> dict[str, pa.Array]:
    pid_i, pid_s = _ids(list(map(_get["pid"], events)))
    tid_i, tid_s = _ids(list(map(_get["tid"], events)))
    return {
        "event_id": pa.array(event_ids, pa.int64()),
        "cat": pa.array(list(map(_get["cat"], events)), pa.string()),
        "name": pa.array(list(map(_get["name"], events)), pa.string()),
        "pid": pid_i,
        "pid_s": pid_s,
        "tid": tid_i,
        "tid_s": tid_s,
        "ts": _raw_text(list(map(_get["ts"], events))),
        "dur": _raw_text(list(map(_get["dur"], events))),
    }


def _columns(events: list[Event], fields: dict[str, pa.DataType]) -> dict[str, pa.Array]:
    out: dict[str, pa.Array] = {}
    for name, type_ in fields.items():
        values = list(map(_args(name), events))
        if name in _RAW_ARGS:
            out[name] = _raw_text(values)
        else:
            out[name] = _typed(values, type_, name)
    return out


def _typed(values: list[Any], type_: pa.DataType, name: str) -> pa.Array:
    """Arrow array of ``values``; numbers written as strings or floats are converted."""
    try:
        return pa.array(values, type_)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
        pass
    if pa.types.is_integer(type_):
        return pa.array([_to_int(v) for v in values], type_)
    if pa.types.is_floating(type_):
        return pa.array([_to_float(v) for v in values], type_)
    return pa.array([None if v is None else str(v) for v in values], type_)


def _to_int(value: Any) -> int | None:
    if value is None or type(value) is int:
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    try:
        return int(str(value).strip(), 0)
    except ValueError:
        try:
            return int(float(value))
        except (ValueError, OverflowError):
            return None


def _to_float(value: Any) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


_RAW_ARGS = {"input_dims", "input_types", "pg_name", "pg_ranks"}
_INT = pa.int64()
_DEVICE_FIELDS: dict[str, pa.DataType] = {
    "device": _INT, "stream": _INT, "correlation": _INT, "external_id": _INT, "bytes": _INT,
    "grid": pa.list_(pa.int32()), "block": pa.list_(pa.int32()), "regs": _INT, "smem": _INT,
    "occupancy": pa.float64(),
}
_HOST_FIELDS: dict[str, pa.DataType] = {
    "correlation": _INT, "external_id": _INT, "seq_nr": _INT, "fwd_tid": _INT,
    "input_dims": pa.string(), "input_types": pa.string(), "flops": pa.float64(),
}
_COLL_FIELDS: dict[str, pa.DataType] = {
    "coll_name": pa.string(), "dtype": pa.string(), "in_nelems": _INT, "out_nelems": _INT,
    "group_size": _INT, "pg_name": pa.string(), "pg_desc": pa.string(), "pg_ranks": pa.string(),
    "coll_seq": _INT, "src_rank": _INT, "dst_rank": _INT,
}
_MEMORY_FIELDS: dict[str, pa.DataType] = {
    "total_allocated": pa.float64(), "total_reserved": pa.float64(), "device_id": _INT,
}


class _StagingWriter:
    """Appends record batches to staging Parquet files on a background thread."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._writers: dict[str, pq.ParquetWriter] = {}
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tracelake-staging")
        self._pending: list[Future[None]] = []

    def append(self, name: str, columns: dict[str, pa.Array]) -> None:
        batch = pa.RecordBatch.from_pydict(columns)
        if batch.num_rows == 0:
            return
        self._pending.append(self._pool.submit(self._write, name, batch))
        # Bound memory: never more than a few batches waiting to be written.
        while len(self._pending) > 4:
            self._pending.pop(0).result()

    def _write(self, name: str, batch: pa.RecordBatch) -> None:
        writer = self._writers.get(name)
        if writer is None:
            writer = pq.ParquetWriter(self.directory / f"raw_{name}.parquet", batch.schema, compression="lz4")
            self._writers[name] = writer
        writer.write_batch(batch)

    def close(self) -> list[str]:
        """Finish writing; return the names of the staged tables that got rows."""
        try:
            for fut in self._pending:
                fut.result()
        finally:
            self._pending.clear()
            self._pool.shutdown(wait=True)
            for writer in self._writers.values():
                writer.close()
        return list(self._writers)


def _stage_batch(writer: _StagingWriter, first: int, events: list[Event], data: bytes | None) -> dict[str, int]:
    ids = np.arange(first, first + len(events), dtype=np.int64)
    cats = list(map(_get["cat"], events))
    phs = list(map(_get["ph"], events))

    is_device = [c in DEVICE_CATS for c in cats]
    device = list(compress(events, is_device))
    if device:
        dev_ids = ids[np.fromiter(is_device, bool, len(events))]
        writer.append("device", _common(device, dev_ids) | _columns(device, _DEVICE_FIELDS))
        _stage_collective_args(writer, device, dev_ids, "kernel")

    is_host = [p == "X" and c not in NOT_HOST_CATS for p, c in zip(phs, cats)]
    host = list(compress(events, is_host))
    if host:
        host_ids = ids[np.fromiter(is_host, bool, len(events))]
        writer.append("host", _common(host, host_ids) | _columns(host, _HOST_FIELDS))
        _stage_collective_args(writer, host, host_ids, "cpu_op")

    is_other = [p != "X" and p not in ("s", "f") for p in phs]
    other = list(compress(events, is_other))
    if other:
        _stage_other(writer, other, ids[np.fromiter(is_other, bool, len(events))], data)
    return {"device": len(device), "host": len(host)}


def _stage_collective_args(writer: _StagingWriter, events: list[Event], ids: np.ndarray, source: str) -> None:
    has = [n is not None for n in map(_args("coll_name"), events)]
    if not any(has):
        return
    coll = list(compress(events, has))
    cols = {"event_id": pa.array(ids[np.fromiter(has, bool, len(events))], pa.int64()),
            "source": pa.array([source] * len(coll), pa.string())}
    writer.append("coll", cols | _columns(coll, _COLL_FIELDS))


def _stage_other(writer: _StagingWriter, events: list[Event], ids: np.ndarray, data: bytes | None) -> None:
    """Metadata (``M``), memory instants and counters (``C``)."""
    meta = [e for e in events if e.ph == "M"]
    if meta:
        writer.append("meta", {
            "name": pa.array([e.name for e in meta], pa.string()),
            "pid": _ids([e.pid for e in meta])[0],
            "pid_s": _ids([e.pid for e in meta])[1],
            "tid": _ids([e.tid for e in meta])[0],
            "value": pa.array([e.args.name for e in meta], pa.string()),
        })
    memory = [e for e in events if e.ph == "i" and e.name == "[memory]"]
    if memory:
        writer.append("memory", {
            "pid": _ids([e.pid for e in memory])[0],
            "ts": _raw_text([e.ts for e in memory]),
        } | _columns(memory, _MEMORY_FIELDS))
    if data is not None and any(e.ph == "C" for e in events):
        counters = [e for e in msgspec.json.decode(data, type=list[CounterEvent]) if e.ph == "C"]
        names, series, values, ts, pids = [], [], [], [], []
        for e in counters:
            for key, value in e.args.items():
                if isinstance(value, int | float) and not isinstance(value, bool):
                    names.append(e.name)
                    series.append(key)
                    values.append(float(value))
                    ts.append(e.ts)
                    pids.append(e.pid)
        if values:
            writer.append("counter", {
                "name": pa.array([f"{n}.{s}" if s and s != n else n for n, s in zip(names, series)], pa.string()),
                "pid": _ids(pids)[0],
                "ts": _raw_text(ts),
                "value": pa.array(values, pa.float64()),
            })


def _stream(source: Path, staging: Path, options: ParseOptions) -> tuple[ChromeTraceReader[Event], list[str]]:
    chunks: Iterator[bytes] = iter_chunks(source, on_bytes=options.on_bytes, name=options.source_name)
    reader: ChromeTraceReader[Event] = ChromeTraceReader(
        chunks, Event, options.source_name, batch_bytes=options.batch_bytes
    )
    writer = _StagingWriter(staging)
    try:
        for first, events, data in reader.batches():
            _stage_batch(writer, first, events, data)
    finally:
        staged = writer.close()
    return reader, staged


# -- trace-level facts ----------------------------------------------------------------

def _trace_info(source: Path, options: ParseOptions, top: dict[str, Any], event_count: int, json_bytes: int) -> TraceInfo:
    info = TraceInfo(format=FORMAT, event_count=event_count, uncompressed_bytes=json_bytes)
    dist = top.get("distributedInfo")
    if isinstance(dist, dict) and isinstance(dist.get("rank"), int):
        info.rank = dist["rank"]
        info.rank_source = "distributedInfo"
    else:
        match = _RANK_IN_NAME.search(options.source_name)
        if match:
            info.rank = int(match.group(1))
            info.rank_source = "file name"
        else:
            info.warnings.append(
                "no rank in distributedInfo or in the file name (e.g. rank-3.json); assumed rank 0"
            )
    if isinstance(dist, dict):
        if isinstance(dist.get("world_size"), int):
            info.world_size = dist["world_size"]
        info.backend = _str_or_none(dist.get("backend"))
        info.nccl_version = _str_or_none(dist.get("nccl_version"))
    info.host = _str_or_none(top.get("host_name"))
    match = _HOST_IN_NAME.match(options.source_name)
    if match:
        info.host = info.host or match.group("host")
        info.pid = int(match.group("pid"))
    props = top.get("deviceProperties")
    if isinstance(props, list) and props and isinstance(props[0], dict):
        info.device_name = _str_or_none(props[0].get("name"))
    return info


def _str_or_none(value: object) -> str | None:
    return str(value) if value is not None and value != "" else None


def _base_time_ns(top: dict[str, Any], source: str) -> int:
    base = top.get("baseTimeNanoseconds", 0)
    if base is None:
        return 0
    if not isinstance(base, int):
        raise TraceFormatError(source, f"baseTimeNanoseconds is {type(base).__name__}, expected an integer")
    return base


def parse(source: Path, staging: Path, options: ParseOptions) -> TraceInfo:
    """Parse one Kineto trace into ``<table>.parquet`` files in ``staging``.

    Raises:
        TraceFormatError: the file is not a readable PyTorch profiler trace; the
            message names the file and the byte offset or event index.
    """
    reader, staged = _stream(source, staging, options)
    top = {**reader.header, **reader.tail}
    info = _trace_info(source, options, top, reader.event_count, reader.json_bytes)
    pytorch_profiler_sql.normalise(
        staging,
        staged,
        info,
        trace_id=options.trace_id,
        base_ns=_base_time_ns(top, options.source_name),
        memory_limit=options.memory_limit,
        threads=options.threads,
        source=options.source_name,
    )
    return info
