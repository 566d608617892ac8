"""Rows of the warehouse tables built from XLA ops, shared by the XSpace and trace-viewer JSON parsers.

Both parsers feed :class:`RowBuilder` the same facts (device ops with their HLO
category, host events, step windows, devices) so that the same run gives the same
tables whichever file it is read from.
"""

from __future__ import annotations

import bisect
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

from tracelake.contracts import schema
from tracelake.contracts.classify import Category

from . import xla_ops
from .encoding import statistics_for
from .model import ParseOptions, TraceInfo
from .tables import TableWriter, write_table
from .xspace import BatchStats
from .xspace_events import STAT_INT64, STAT_NONE, STAT_UINT64

#: Columns of the big tables that grow along the file (ids, times) or are spread wide (durations): written with
#: Parquet's delta encoding. Dictionary encoding, Arrow's default for every column, tries them, fails (almost
#: every value differs) and falls back after having hashed them all.
DELTA_COLUMNS = ("event_id", "parent_id", "ts_ns", "dur_ns", "step")


#: :func:`distinct_inverse` counts ids by a table of ``max + 1`` slots where that is at most this many times the ids.
DENSE_SLOTS_PER_ID = 4


def distinct_inverse(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(ids, return_inverse=True)`` for the metadata ids of a line's events: the distinct ids, sorted, and
    each event's index into them.

    Metadata ids are small numbers (1 up to the plane's count of entries), so where the largest is at most
    :data:`DENSE_SLOTS_PER_ID` times the ids' count a table of them does it in two passes over the ids, not a sort
    (a sort was the parse's largest single cost on a TPU line of millions of short ops). Other ids: ``np.unique``.
    """
    if not len(ids):
        return np.unique(ids, return_inverse=True)
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= DENSE_SLOTS_PER_ID * len(ids) + 1024:
        return np.unique(ids, return_inverse=True)
    seen = np.zeros(high + 1, dtype=bool)
    seen[ids] = True
    distinct = np.flatnonzero(seen)
    slot = np.cumsum(seen) - 1
    return distinct.astype(ids.dtype, copy=False), slot[ids]


def writer_options(table: str) -> dict[str, Any]:
    """``ParquetWriter`` options for one of the big tables (``device_ops``, ``host_ops``, ``collectives``).

    Each column of :data:`DELTA_COLUMNS` the table has is delta-encoded, every other column dictionary-encoded
    (names, categories, per-op figures: a few distinct values each). Only the encoding changes, not what is
    read back; for 2 million TPU ops this writes the file in about two thirds of the time, 30 times smaller, and
    it reads back three times faster (the stored analyses read it again). The op names' and descriptions'
    statistics are left out (:data:`.encoding.UNPRUNED_TEXTS`): a further quarter of the writing time.
    """
    tbl = schema.table(table)
    delta = [c for c in DELTA_COLUMNS if c in tbl.column_names]
    return {"use_dictionary": [c for c in tbl.column_names if c not in delta],
            "column_encoding": dict.fromkeys(delta, "DELTA_BINARY_PACKED"),
            "write_statistics": statistics_for(tbl.arrow_schema)}


@dataclass
class Columns:
    """Column lists of one table, appended row by row."""

    names: tuple[str, ...]
    data: dict[str, list[object]] = field(init=False)

    def __post_init__(self) -> None:
        self.data = {n: [] for n in self.names}

    def __len__(self) -> int:
        return len(self.data[self.names[0]])

    def take(self) -> dict[str, list[object]]:
        data, self.data = self.data, {n: [] for n in self.names}
        return data


DEVICE_COLUMNS = (
    "event_id", "rank", "device", "stream", "kind", "category", "name", "ts_ns", "dur_ns", "correlation",
    "step", "bytes", "hlo_module", "program_id", "hlo_category", "long_name", "flops", "bytes_accessed",
)
HOST_COLUMNS = ("event_id", "rank", "pid", "tid", "cat", "name", "ts_ns", "dur_ns", "depth", "parent_id",
                 "correlation", "step")
COLLECTIVE_COLUMNS = ("event_id", "rank", "collective", "process_group", "seq", "message_bytes", "ts_ns",
                       "dur_ns", "kernel_event_id", "kernel_name", "stream", "step", "is_async", "source")


@dataclass
class Steps:
    """Step windows per rank (``None``: for every rank of the file), and device figures per step."""

    windows: dict[int | None, list[tuple[int, int, int]]] = field(default_factory=dict)
    device: dict[tuple[int, int], list[int]] = field(default_factory=dict)

    def add(self, rank: int | None, step: int, ts_ns: int, dur_ns: int) -> None:
        self.windows.setdefault(rank, []).append((ts_ns, dur_ns, step))

    def finish(self) -> None:
        for windows in self.windows.values():
            windows.sort()

    def step_at(self, rank: int | None, ts_ns: int) -> int | None:
        windows = self.windows.get(rank) if rank in self.windows else self.windows.get(None)
        if not windows:
            return None
        i = bisect.bisect_right(windows, (ts_ns, float("inf"), 0)) - 1
        if i < 0:
            return None
        start, dur, step = windows[i]
        return step if ts_ns < start + dur else None

    def steps_of(self, rank: int | None, ts_ns: np.ndarray) -> np.ndarray:
        """:meth:`step_at` for many times at once; -1 outside every step."""
        windows = self.windows.get(rank) if rank in self.windows else self.windows.get(None)
        if not windows:
            return np.full(len(ts_ns), -1, dtype=np.int64)
        starts = np.array([w[0] for w in windows], dtype=np.int64)
        ends = starts + np.array([w[1] for w in windows], dtype=np.int64)
        numbers = np.array([w[2] for w in windows], dtype=np.int64)
        i = np.searchsorted(starts, ts_ns, side="right") - 1
        inside = (i >= 0) & (ts_ns < ends[np.maximum(i, 0)])
        return np.where(inside, numbers[np.maximum(i, 0)], -1)

    def count_many(self, rank: int, steps: np.ndarray, ts_ns: np.ndarray, end_ns: np.ndarray) -> None:
        """:meth:`count` for many ops at once (``steps`` -1: outside every step)."""
        inside = steps >= 0
        if not inside.any():
            return
        s, t, e = steps[inside], ts_ns[inside], end_ns[inside]
        if len(s) > 1 and (s[1:] < s[:-1]).any():  # ops in time order are in step order already
            order = np.argsort(s, kind="stable")
            s, t, e = s[order], t[order], e[order]
        starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
        counts = np.diff(np.r_[starts, len(s)])
        for step, first, last, count in zip(s[starts].tolist(), np.minimum.reduceat(t, starts).tolist(),
                                            np.maximum.reduceat(e, starts).tolist(), counts.tolist(), strict=True):
            figures = self.device.get((rank, step))
            if figures is None:
                self.device[(rank, step)] = [first, last, count]
            else:
                figures[0] = min(figures[0], first)
                figures[1] = max(figures[1], last)
                figures[2] += count

    def count(self, rank: int, step: int | None, ts_ns: int, end_ns: int) -> None:
        if step is None:
            return
        figures = self.device.get((rank, step))
        if figures is None:
            self.device[(rank, step)] = [ts_ns, end_ns, 1]
        else:
            figures[0] = min(figures[0], ts_ns)
            figures[1] = max(figures[1], end_ns)
            figures[2] += 1


# -- parsing ---------------------------------------------------------------------------

class RowBuilder:
    """Event ids, extents, device op rows, collectives, steps and devices of one XLA trace."""

    def __init__(self, staging: Path, options: ParseOptions, fmt: str, uncompressed_bytes: int) -> None:
        self.staging = staging
        self.options = options
        self.source = options.source_name
        self.next_id = 0
        self.events = 0
        self.steps = Steps()
        self.devices: dict[int, dict[str, object]] = {}
        self.first_ns: int | None = None
        self.last_ns: int | None = None
        self.collective_seq: dict[tuple[int, str], int] = {}
        self.collectives = Columns(COLLECTIVE_COLUMNS)
        self.collective_writer = TableWriter(staging, "collectives", trace_id=options.trace_id,
                                             **writer_options("collectives"))
        self.hostnames: list[str] = []
        self.info = TraceInfo(format=fmt, uncompressed_bytes=uncompressed_bytes)

    def _event_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def _extent(self, ts_ns: int, end_ns: int) -> None:
        if self.first_ns is None or ts_ns < self.first_ns:
            self.first_ns = ts_ns
        if self.last_ns is None or end_ns > self.last_ns:
            self.last_ns = end_ns

    def _device_row(
        self, rows: Columns, event_id: int, rank: int, device: int, stream: int, kind: str, category: str,
        name: str, ts: int, dur: int, correlation: int | None, module: str | None, program: int | None,
        hlo_category: str | None, long_name: str | None, flops: float | None, bytes_accessed: int | None,
    ) -> None:
        step = self.steps.step_at(rank, ts)
        self.steps.count(rank, step, ts, ts + dur)
        self._extent(ts, ts + dur)
        data = rows.data
        for key, value in (
            ("event_id", event_id), ("rank", rank), ("device", device), ("stream", stream), ("kind", kind),
            ("category", category), ("name", name), ("ts_ns", ts), ("dur_ns", dur), ("correlation", correlation),
            ("step", step), ("bytes", None), ("hlo_module", module), ("program_id", program),
            ("hlo_category", hlo_category), ("long_name", long_name), ("flops", flops),
            ("bytes_accessed", bytes_accessed),
        ):
            data[key].append(value)

    def _seq(self, rank: int, group: str) -> int:
        key = (rank, group)
        self.collective_seq[key] = self.collective_seq.get(key, 0) + 1
        return self.collective_seq[key]

    def _collectives_of(self, rows: Columns) -> None:
        """Each communication op is also a collective: module = process group, order in it = seq."""
        data = rows.data
        order = sorted(
            (i for i, c in enumerate(data["category"]) if c == Category.COMMUNICATION),
            key=lambda i: (cast(int, data["rank"][i]), cast(int, data["ts_ns"][i])),
        )
        out = self.collectives.data
        for i in order:
            hlo_category = data["hlo_category"][i]
            name = str(data["name"][i])
            collective = xla_ops.collective_name(hlo_category if isinstance(hlo_category, str) else None) \
                or xla_ops.collective_name(xla_ops.opcode_of(name)) or nccl_collective(name)
            if collective is None:
                continue
            rank = int(data["rank"][i])  # type: ignore[call-overload]
            group = str(data["hlo_module"][i] or data["program_id"][i] or "")
            long_name = data["long_name"][i]
            out["event_id"].append(self._event_id())
            out["rank"].append(rank)
            out["collective"].append(collective)
            out["process_group"].append(group)
            out["seq"].append(self._seq(rank, group))
            out["message_bytes"].append(xla_ops.message_bytes(
                xla_ops.result_bytes(long_name if isinstance(long_name, str) else None),
                data["bytes_accessed"][i]))  # type: ignore[arg-type]
            out["ts_ns"].append(data["ts_ns"][i])
            out["dur_ns"].append(data["dur_ns"][i])
            out["kernel_event_id"].append(data["event_id"][i])
            out["kernel_name"].append(name)
            out["stream"].append(data["stream"][i])
            out["step"].append(data["step"][i])
            out["is_async"].append(False)
            out["source"].append("xla")

    def finish(self, device_rows: int) -> TraceInfo:
        self.collective_writer.write(self.collectives.take())
        self.collective_writer.close()
        steps = Columns(("rank", "step", "ts_ns", "dur_ns", "device_start_ns", "device_end_ns", "device_op_count"))
        ranks = sorted(self.devices) or [0]
        for owner, windows in sorted(self.steps.windows.items(), key=lambda kv: -1 if kv[0] is None else kv[0]):
            for rank in ranks if owner is None else [owner]:
                for ts, dur, step in windows:
                    figures = self.steps.device.get((rank, step))
                    for key, value in (("rank", rank), ("step", step), ("ts_ns", ts), ("dur_ns", dur),
                                       ("device_start_ns", figures[0] if figures else None),
                                       ("device_end_ns", figures[1] if figures else None),
                                       ("device_op_count", figures[2] if figures else 0)):
                        steps.data[key].append(value)
        write_table(self.staging, "steps", steps.take(), trace_id=self.options.trace_id)
        write_table(self.staging, "counters", {}, trace_id=self.options.trace_id)
        devices = Columns(("rank", "device", "kind", "name", "vendor", "peak_tflops", "peak_hbm_gbps",
                            "core_count", "clock_mhz", "memory_bytes", "compute_capability"))
        for index in sorted(self.devices):
            for key in devices.names:
                devices.data[key].append(self.devices[index].get(key))
        write_table(self.staging, "devices", devices.take(), trace_id=self.options.trace_id)

        info = self.info
        info.event_count = self.events
        info.rank = ranks[0]
        info.rank_source = "device index"
        info.device_count = len(self.devices) if device_rows else 0
        info.start_ns, info.end_ns = self.first_ns, self.last_ns
        kinds = {str(d.get("kind")) for d in self.devices.values()}
        vendors = {str(d.get("vendor") or "").lower() for d in self.devices.values()}
        info.device_type = "tpu" if "tpu" in kinds else ("rocm" if "amd" in vendors else "cuda") if "gpu" in kinds \
            else "cpu"
        names = [str(d["name"]) for d in self.devices.values() if d.get("name")]
        info.device_name = names[0] if names else None
        info.host = self.hostnames[0] if self.hostnames else host_from_name(self.source)
        return info



def nccl_collective(name: str) -> str | None:
    match = re.search(r"(AllReduce|AllGather|ReduceScatter|AllToAll|Broadcast|Reduce|SendRecv|Send|Recv)", name)
    if not match or not re.match(r"^(nccl|rccl)", name, re.IGNORECASE):
        return None
    return {"AllReduce": "all_reduce", "AllGather": "all_gather", "ReduceScatter": "reduce_scatter",
            "AllToAll": "all_to_all", "Broadcast": "broadcast", "Reduce": "reduce", "SendRecv": "send",
            "Send": "send", "Recv": "recv"}[match.group(1)]


def host_from_name(source: str) -> str | None:
    name = Path(source).name
    for suffix in (".xplane.pb.gz", ".xplane.pb", ".trace.json.gz", ".trace.json"):
        if name.endswith(suffix):
            return name[: -len(suffix)] or None
    return None


def as_int(value: object) -> int | None:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float):
        value = int(value) if math.isfinite(value) else None
    elif isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
        value = int(value)
    if isinstance(value, int):
        return value if -(1 << 63) <= value < (1 << 63) else None
    return None


def stat_ints(stats: BatchStats, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Each event's stat ``name`` as :func:`as_int` reads it, and whether it has one: integers in bulk,
    the rare others (doubles, strings, references) one by one."""
    last = stats.last(name)
    if not (last >= 0).any():  # no event has one (and maybe no event has stats at all)
        return np.zeros(len(last), dtype=np.int64), np.zeros(len(last), dtype=bool)
    kind = np.where(last >= 0, stats.fields.kind[last], STAT_NONE)
    raw = stats.fields.value[last]
    signed = (kind == STAT_INT64) | ((kind == STAT_UINT64) & (raw < np.uint64(1 << 63)))
    values = np.where(signed, raw, np.uint64(0)).view(np.int64)
    valid = signed.copy()
    others = np.flatnonzero((last >= 0) & ~signed & (kind != STAT_UINT64) & (kind != STAT_NONE))
    if len(others):
        objects, codes = stats.values(last[others])
        converted = [as_int(v) for v in objects]
        for i, code in zip(others.tolist(), codes.tolist(), strict=True):
            if converted[code] is not None:
                values[i], valid[i] = converted[code], True
    return values, valid


def as_uint(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value % (1 << 64)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value) % (1 << 64)
    return None


def as_float(value: object) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return float(value)
    return None


def as_str(value: object) -> str | None:
    if value is None or value == "":
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)
