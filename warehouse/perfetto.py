"""One timeline of every rank of a job, for ui.perfetto.dev or chrome://tracing (docs/formats.md, "Perfetto export").

Chrome trace-event JSON, gzipped, written rank by rank so memory follows one trace's rows: a process per rank,
its host threads as threads, each device stream as a thread of its own (``device D stream S``), the critical
path of each step as a thread (``critical path``) with flow arrows from one stretch to the next across ranks,
and tracelake's findings as global instant events at the job's start. Times are microseconds after
``baseTimeNanoseconds`` (the job's first moment), so tracelake's own Kineto parser reads the file back.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from tracelake.analysis.findings import Finding

from .store import Store, temp_name

HOST = ("tid", "cat", "name", "ts_ns", "dur_ns", "correlation", "external_id")
DEVICE = ("device", "stream", "kind", "category", "name", "ts_ns", "dur_ns", "correlation")
#: Device ops' Kineto categories, by ``device_ops.kind`` (what the Kineto parser reads back as device ops).
KIND_CAT = {"kernel": "kernel", "memcpy": "gpu_memcpy", "memset": "gpu_memset", "sync": "cuda_sync",
            "xla_op": "kernel"}
#: Thread ids of device streams and the critical path: far above any host thread id a profiler writes.
STREAM_TID_BASE = 1 << 40
PATH_TID = (1 << 40) - 1  # and the one below it: even and odd steps


@dataclass
class Exported:
    """What :func:`export` wrote."""

    path: Path
    ranks: int
    #: Host and device events (the timeline's own; metadata, findings and the path not counted).
    ops: int
    events: int
    bytes: int


def export(store: Store, pairs: Sequence[tuple[str, str]], ranks: dict[str, int], out: Path, *,
           step: int | None, path: pl.DataFrame, findings: Sequence[Finding]) -> Exported:
    """Write the merged timeline of ``pairs`` (one rank each: ``ranks`` by trace id) to ``out`` (``.json.gz``).

    ``step`` keeps one step's events (``host_ops.step``/``device_ops.step``) and its critical path only.
    ``path``: the critical path stretches (``critical_path_stretches`` of the job's analysis). The file is
    written beside ``out`` and renamed into place, so a failed export leaves nothing half-written.
    """
    frames = [(trace_id, ranks.get(trace_id, 0), _read(store, (job, trace_id), step)) for job, trace_id in pairs]
    starts = [int(f["ts_ns"].to_numpy().min()) for _, _, (h, d) in frames for f in (h, d) if f.height]
    base = min(starts) if starts else 0
    if step is not None and path.height and "step" in path.columns:
        path = path.filter(pl.col("step") == step)
    scratch = temp_name(out)
    count = 0
    try:
        with open(scratch, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as zipped:
            text = _Text(zipped)
            text.write('{"displayTimeUnit": "ns", "baseTimeNanoseconds": %d, "traceEvents": [\n' % base)
            first = True
            for event in _events(frames, path, findings, base):
                text.write(("" if first else ",\n") + json.dumps(event, separators=(",", ":")))
                first = False
                count += 1
            text.write("\n]}\n")
        os.replace(scratch, out)
    finally:
        scratch.unlink(missing_ok=True)
    ops = sum(h.height + d.height for _, _, (h, d) in frames)
    return Exported(out, len({r for _, r, _ in frames}), ops, count, out.stat().st_size)


class _Text:
    """Text written as UTF-8 into a binary stream (gzip), without a wrapper's buffering surprises."""

    def __init__(self, binary: Any) -> None:
        self.binary = binary

    def write(self, text: str) -> int:
        self.binary.write(text.encode())
        return len(text)


def _read(store: Store, pair: tuple[str, str], step: int | None) -> tuple[pl.DataFrame, pl.DataFrame]:
    host = store.read_frame("host_ops", [pair], [*HOST, "step"])
    device = store.read_frame("device_ops", [pair], [*DEVICE, "step"])
    if step is not None:
        host, device = host.filter(pl.col("step") == step), device.filter(pl.col("step") == step)
    return host.filter(pl.col("ts_ns").is_not_null()), device.filter(pl.col("ts_ns").is_not_null())


def _us(ns: int, base: int) -> float:
    return round((ns - base) / 1000, 3)


def _events(frames: list[tuple[str, int, tuple[pl.DataFrame, pl.DataFrame]]], path: pl.DataFrame,
            findings: Sequence[Finding], base: int) -> Iterator[dict[str, Any]]:
    for finding in findings:
        yield {"ph": "i", "s": "g", "pid": 0, "tid": 0, "ts": 0.0, "name": f"finding: {finding.title}",
               "cat": "tracelake_finding", "args": {"detail": finding.detail, "kind": finding.kind}}
    for trace_id, rank, (host, device) in frames:
        yield {"ph": "M", "pid": rank, "tid": 0, "name": "process_name", "args": {"name": f"rank {rank}"}}
        yield {"ph": "M", "pid": rank, "tid": 0, "name": "process_labels", "args": {"labels": f"trace {trace_id}"}}
        for tid in host["tid"].drop_nulls().unique().sort().to_list():
            yield {"ph": "M", "pid": rank, "tid": int(tid), "name": "thread_name", "args": {"name": f"thread {tid}"}}
        streams = device.select("device", "stream").unique().sort("device", "stream").rows()
        tid_of = {(d, s): STREAM_TID_BASE + i for i, (d, s) in enumerate(streams)}
        for (d, s), tid in tid_of.items():
            yield {"ph": "M", "pid": rank, "tid": tid, "name": "thread_name",
                   "args": {"name": f"device {d} stream {s}"}}
        for row in host.sort("ts_ns").iter_rows(named=True):
            args = {name: row[key] for key, name in (("correlation", "correlation"), ("external_id", "External id"))
                    if row[key] is not None}
            yield {"ph": "X", "pid": rank, "tid": int(row["tid"] or 0), "cat": row["cat"] or "cpu_op",
                   "name": row["name"] or "", "ts": _us(row["ts_ns"], base),
                   "dur": round(max(row["dur_ns"] or 0, 0) / 1000, 3), "args": args}
        for row in device.sort("ts_ns").iter_rows(named=True):
            args = {"device": row["device"], "stream": row["stream"]}
            if row["correlation"] is not None:
                args["correlation"] = row["correlation"]
            yield {"ph": "X", "pid": rank, "tid": tid_of[(row["device"], row["stream"])],
                   "cat": KIND_CAT.get(row["kind"] or "", "kernel"), "name": row["name"] or "",
                   "ts": _us(row["ts_ns"], base), "dur": round(max(row["dur_ns"] or 0, 0) / 1000, 3), "args": args}
    yield from _path_events(path, {rank for _, rank, _ in frames}, base)


def _path_events(path: pl.DataFrame, ranks: set[int], base: int) -> Iterator[dict[str, Any]]:
    """The critical path as tracks per rank, stretch by stretch, and a flow from a stretch to the next on another
    rank. A step's path can overlap its neighbours' (ranks end a step at different times), so even and odd steps
    have a track each; events are yielded in time order per track."""
    if not path.height:
        return
    on = sorted(r for r in path["rank"].drop_nulls().unique().to_list() if r in ranks)
    for rank in on:
        for parity in (0, 1):
            yield {"ph": "M", "pid": rank, "tid": PATH_TID - parity, "name": "thread_name",
                   "args": {"name": f"critical path ({'odd' if parity else 'even'} steps)"}}
    slices: list[dict[str, Any]] = []
    flows: list[dict[str, Any]] = []
    previous: tuple[int, int, float] | None = None
    for row in path.sort("step", "position", nulls_last=True).iter_rows(named=True):
        if row["rank"] is None or row["rank"] not in ranks:
            previous = None
            continue
        ts, tid = _us(row["start_ns"], base), PATH_TID - (row["step"] or 0) % 2
        slices.append({"ph": "X", "pid": row["rank"], "tid": tid, "cat": "critical_path",
                       "name": f"{row['kind']}: {row['name']}", "ts": ts, "dur": round(row["dur_ns"] / 1000, 3),
                       "args": {"step": row["step"], "position": row["position"], "kind": row["kind"]}})
        if previous is not None and previous[0] != row["rank"]:  # an arrow where the path changes rank
            flow = len(flows) // 2 + 1
            flows.append({"ph": "s", "id": flow, "pid": previous[0], "tid": previous[1], "ts": previous[2],
                          "cat": "critical_path", "name": "critical path"})
            flows.append({"ph": "f", "bp": "e", "id": flow, "pid": row["rank"], "tid": tid, "ts": ts,
                          "cat": "critical_path", "name": "critical path"})
        previous = (row["rank"], tid, ts)  # a flow starts inside its slice: at the stretch's start
    yield from sorted(slices, key=lambda e: (e["pid"], e["tid"], e["ts"]))
    yield from flows
