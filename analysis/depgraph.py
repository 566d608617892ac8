"""The dependency graph of a run's steps across its ranks (docs/analyses.md, "Critical path").

A node is a moment: the start or end of a host event or a device op, or the moment every
rank has arrived at a collective. An edge ``u -> v`` says ``v`` cannot happen before
``u`` plus the edge's weight. Every node's measured time is the latest of its
predecessors (time plus weight) plus the node's own *slack*, so replaying the graph
unchanged reproduces every measured time; a what-if changes weights and slacks and
replays (:mod:`tracelake.analysis.critical_path`).

The edges:

* **host order**: the starts and ends of a thread's events in time order (nesting kept);
  the edge between two neighbouring moments weighs the time between them and is spent
  on the innermost event open there (``host``; ``launch`` in a launch call; ``sync`` in
  a blocking call).
* **launch**: a launch call's start -> the start of each op it launched (correlation;
  a graph launch starts many).
* **stream order**: an op's end -> the start of the next op on its stream.
* **device**: an op's start -> its end, weighing its duration (``compute``,
  ``communication``, ``memory`` by category).
* **stream waits**: an op that started well after its launch and its stream allowed,
  right after an op on another stream of its device ended, waited for that op (an
  event wait; inferred, docs/analyses.md, "Critical path").
* **waits between threads** (inferred, :mod:`tracelake.analysis.threads`): a thread idle until a
  collective on another thread ended or met, a worker's collective and the call that enqueued it,
  a CUDA backward handed to the autograd thread and back.
* **synchronisation**: the end of the last op a blocking call waited for -> the call's
  end. The op: launched before the call began, on the call's stream when the trace says
  which (a stream sync), ended by the time the call returned, and the latest such.
* **data** (an execution trace's): the operator that wrote a tensor -> the one that read it.
* **collectives**: the n-th call (a send and its recv: the same group, ranks and ``seq``) of a process group on every rank (``collectives.seq``)
  is one collective. Each rank's op start -> a meeting node (the last arrival) -> each
  rank's op end; the end's slack is the transfer, the time before it a wait for the
  last rank.

An edge whose times disagree (its source later than its target: clocks of host and
device, or of two ranks, out of step) is left out and counted in ``Graph.dropped``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import polars as pl

from tracelake.contracts.classify import Category
from tracelake.contracts.critical import BLOCKING_CALL, P2P_OPS, PathKind

from . import et_deps
from .launches import launch_call_rows
from .threads import CODE, WAIT_WINDOW_NS, Moments, cross_thread
_CATEGORY_KIND = {Category.COMPUTE: PathKind.COMPUTE, Category.COMMUNICATION: PathKind.COMMUNICATION,
                  Category.MEMORY: PathKind.MEMORY}
#: Host events left out of the graph: Python frames add moments, not dependencies.
SKIPPED_CATS = ("python_function",)
BETWEEN_OPS = "(between ops)"
STREAM_GAP = "(stream gap)"
STREAM_WAIT = "(waits for another stream)"

HOST_COLUMNS = ("event_id", "tid", "cat", "name", "ts_ns", "dur_ns", "depth", "parent_id", "correlation", "step",
                "sequence_number", "fwd_thread_id", "record_function_id", "external_id")
DEVICE_COLUMNS = ("event_id", "device", "stream", "kind", "category", "name", "ts_ns", "dur_ns", "correlation", "step")
COLLECTIVE_COLUMNS = ("event_id", "process_group", "seq", "collective", "kernel_event_id", "is_async", "src_rank",
                      "dst_rank", "message_bytes")


@dataclass
class RankInput:
    """One rank's rows: ``host_ops`` (:data:`HOST_COLUMNS`), ``device_ops`` (:data:`DEVICE_COLUMNS`), ``collectives``,
    and the data dependencies of its execution trace where the run has one (``src_rf_id``, ``dst_rf_id``:
    :func:`tracelake.analysis.et_deps.data_edges`)."""

    trace_id: str
    rank: int
    host: pl.DataFrame
    device: pl.DataFrame
    collectives: pl.DataFrame
    data_edges: pl.DataFrame | None = None


@dataclass
class Graph:
    """Nodes (measured time, rank index, step, whether on a device) and edges (source, target, weight, kinds, label)."""

    t: np.ndarray
    rank: np.ndarray
    step: np.ndarray
    on_device: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    w: np.ndarray
    #: Kind code of the time an edge weighs.
    kind: np.ndarray
    #: Kind code of the target's slack when this edge is the target's latest predecessor.
    then: np.ndarray
    label: np.ndarray
    labels: list[str]
    ranks: list[tuple[str, int]]
    dropped: int = 0
    #: The process group of each collective's moments (its ends on every rank and its meeting): node -> group.
    group_of: dict[int, str] = field(default_factory=dict)
    #: Each collective's end on every rank -> (the operation, the ranks that met in it, its message bytes).
    collective_of: dict[int, tuple[str, int, int | None]] = field(default_factory=dict)


class _Builder:
    def __init__(self) -> None:
        self.t: list[np.ndarray] = []
        self.rank: list[np.ndarray] = []
        self.step: list[np.ndarray] = []
        self.on_device: list[np.ndarray] = []
        self.edges: list[tuple[np.ndarray, ...]] = []
        self.labels: dict[str, int] = {}
        self.count = 0

    def label(self, names: list[str] | pl.Series) -> np.ndarray:
        """The label id of each name (ids shared across the graph)."""
        series = names if isinstance(names, pl.Series) else pl.Series(names, dtype=pl.String)
        series = series.cast(pl.String).fill_null("")
        distinct = series.unique(maintain_order=True).to_list()
        ids = [self.labels.setdefault(name, len(self.labels)) for name in distinct]
        return series.replace_strict(distinct, ids, return_dtype=pl.Int32).to_numpy()

    def nodes(self, t: np.ndarray, rank: int, step: np.ndarray, on_device: bool) -> np.ndarray:
        ids = np.arange(self.count, self.count + len(t), dtype=np.int64)
        self.count += len(t)
        self.t.append(t.astype(np.int64, copy=False))
        self.rank.append(np.full(len(t), rank, np.int32))
        self.step.append(step.astype(np.int64, copy=False))
        self.on_device.append(np.full(len(t), on_device))
        return ids

    def edge(self, src: np.ndarray, dst: np.ndarray, w: np.ndarray | int, kind: np.ndarray | PathKind,
             then: np.ndarray | PathKind, label: np.ndarray | int) -> None:
        n = len(src)
        if not n:
            return

        def full(value: np.ndarray | int | PathKind, dtype: type) -> np.ndarray:
            if isinstance(value, PathKind):
                return np.full(n, CODE[value], dtype)
            return np.broadcast_to(np.asarray(value, dtype), (n,)).copy()

        self.edges.append((src.astype(np.int64, copy=False), dst.astype(np.int64, copy=False), full(w, np.int64),
                           full(kind, np.int8),
                           full(then, np.int8), full(label, np.int32)))

    def graph(self, ranks: list[tuple[str, int]]) -> Graph:
        t = np.concatenate(self.t) if self.t else np.empty(0, np.int64)
        parts = list(zip(*self.edges, strict=True)) if self.edges else [[np.empty(0, d)] for d in
                                                                          (np.int64, np.int64, np.int64, np.int8,
                                                                           np.int8, np.int32)]
        src, dst, w, kind, then, label = (np.concatenate(p) for p in parts)
        ok = t[src] + w <= t[dst]  # an edge the measured times contradict is left out
        return Graph(t=t, rank=np.concatenate(self.rank) if self.rank else np.empty(0, np.int32),
                     step=np.concatenate(self.step) if self.step else np.empty(0, np.int64),
                     on_device=np.concatenate(self.on_device) if self.on_device else np.empty(0, bool),
                     src=src[ok], dst=dst[ok], w=w[ok], kind=kind[ok], then=then[ok], label=label[ok],
                     labels=list(self.labels), ranks=ranks, dropped=int((~ok).sum()))


def _int(frame: pl.DataFrame, column: str, fill: int = 0) -> np.ndarray:
    return frame[column].fill_null(fill).to_numpy().astype(np.int64, copy=False)


def _row_of(ids: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """The row of each wanted id in the sorted ``ids``, -1 where it is not there."""
    if not len(ids):
        return np.full(len(wanted), -1, np.int64)
    at = np.minimum(np.searchsorted(ids, wanted), len(ids) - 1)
    return np.where(ids[at] == wanted, at, -1).astype(np.int64, copy=False)


def _at(nodes: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``nodes[rows]``, -1 where a row is -1."""
    out = np.full(len(rows), -1, np.int64)
    ok = rows >= 0
    out[ok] = nodes[rows[ok]]
    return out


def _host(b: _Builder, r: int, host: pl.DataFrame, launch_events: np.ndarray,
          elastic: dict[int, PathKind]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                                 tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Host-order edges of one rank; returns the events' ids (sorted), the start and end node of each,
    the ids of the blocking calls (:data:`~tracelake.contracts.critical.BLOCKING_CALL`), and the waits for a
    collective still open at the resume (its start node, the resume node, its label:
    :func:`~tracelake.analysis.threads.cross_thread`).

    ``launch_events`` holds the ids of the calls that launched a device op; ``elastic``
    the events whose end waits for something off the thread (a collective's last rank),
    with the kind of that wait.
    """
    host = host.filter(pl.col("ts_ns").is_not_null()).sort("event_id")
    n = host.height
    ts, dur = _int(host, "ts_ns"), _int(host, "dur_ns")
    end = ts + np.maximum(dur, 0)
    depth, tid = _int(host, "depth"), _int(host, "tid")
    ids = _int(host, "event_id", -1)
    parent_id = _int(host, "parent_id", -1)
    parent = _row_of(ids, parent_id)
    is_launch = np.isin(ids, launch_events)
    is_blocking = host["name"].fill_null("").str.contains("(?i)" + BLOCKING_CALL).to_numpy()
    kind = np.where(is_blocking, CODE[PathKind.SYNC],
                    np.where(is_launch, CODE[PathKind.LAUNCH], CODE[PathKind.HOST])).astype(np.int8)
    slack_kind = np.where(is_blocking, CODE[PathKind.SYNC], -1).astype(np.int8)
    for event_id, wait in elastic.items():
        hit = np.searchsorted(ids, event_id)
        if hit < n and ids[hit] == event_id:
            slack_kind[hit] = CODE[wait]
    label = b.label(host["name"])
    between = b.label([BETWEEN_OPS])[0]
    # moments: a start and an end per event; in time order per thread, shallower starts and deeper ends first
    is_start = np.concatenate([np.ones(n, bool), np.zeros(n, bool)])
    row = np.concatenate([np.arange(n), np.arange(n)])
    when = np.concatenate([ts, end])
    order = np.lexsort((np.where(is_start, depth[row], -depth[row]), is_start, when, tid[row]))
    row, is_start, when = row[order], is_start[order], when[order]
    nodes = b.nodes(when, r, _int(host, "step", -1)[row], on_device=False)
    start_node, end_node = np.empty(n, np.int64), np.empty(n, np.int64)
    start_node[row[is_start]] = nodes[is_start]
    end_node[row[~is_start]] = nodes[~is_start]
    # the event open after each moment: the event itself after its start, its parent after its end
    inner = np.where(is_start, row, parent[row])
    same = tid[row][1:] == tid[row][:-1]
    open_after = inner[:-1][same]
    gap = when[1:][same] - when[:-1][same]
    k = np.where(open_after >= 0, kind[np.maximum(open_after, 0)], CODE[PathKind.HOST]).astype(np.int8)
    lab = np.where(open_after >= 0, label[np.maximum(open_after, 0)], between)
    # a blocking call's (or a collective's) end waits on something else: the time up to it becomes slack
    target = row[1:][same]
    waits = ~is_start[1:][same] & (slack_kind[target] >= 0)
    gap[waits] = 0
    then = np.where(waits, slack_kind[target], k).astype(np.int8)
    moments = Moments(when, is_start, row, tid, same, open_after, gap, then)
    cross = cross_thread(moments, host, ts, end, slack_kind)
    b.edge(nodes[:-1][same], nodes[1:][same], gap, k, then, lab)
    for waker, waiter, wait in cross.after_end:
        b.edge(end_node[waker], nodes[waiter], 0, wait, wait, label[waker])
    b.edge(start_node[cross.calls], start_node[cross.workers], 0, PathKind.HOST, PathKind.HOST, label[cross.calls])
    collective, resume = cross.open_waits
    waits = (start_node[collective], nodes[resume], label[collective])
    return ids, start_node, end_node, ids[is_blocking], waits


def _late_edges(b: _Builder, waits: list[tuple[np.ndarray, np.ndarray, np.ndarray]], start: np.ndarray,
                meeting: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Edges from a collective's meeting (its last arrival) to the resumes that waited for it while it was open;
    returns those resume nodes (where the transfer's slack lands) and the index into ``start`` of each one's
    collective."""
    if not waits or not len(start):
        return np.empty(0, np.int64), np.empty(0, np.int64)
    start_of, resume, label = (np.concatenate(part) for part in zip(*waits, strict=True))
    order = np.argsort(start, kind="stable")
    at = np.minimum(np.searchsorted(start[order], start_of), len(start) - 1)
    found = start[order][at] == start_of
    b.edge(meeting[order][at][found], resume[found], 0, PathKind.COMMUNICATION, PathKind.COMMUNICATION,
           label[found])
    return resume[found], order[at][found]


@dataclass
class _Ops:
    """One rank's device ops (syncs apart), sorted by ``event_id``, with what the graph needs of them."""

    frame: pl.DataFrame
    ids: np.ndarray
    ts: np.ndarray
    end: np.ndarray
    stream: np.ndarray
    correlation: np.ndarray
    #: Correlation id -> stream of Kineto's ``Stream Sync`` device records (which stream a sync call waited on).
    synced_stream: dict[int, int]


def _ops(device: pl.DataFrame) -> _Ops:
    syncs = device.filter((pl.col("category") == Category.SYNC) & (pl.col("name") == "Stream Sync")
                          & pl.col("correlation").is_not_null())
    frame = device.filter((pl.col("category") != Category.SYNC) & pl.col("ts_ns").is_not_null()).sort("event_id")
    ts = _int(frame, "ts_ns")
    return _Ops(frame, _int(frame, "event_id", -1), ts, ts + np.maximum(_int(frame, "dur_ns"), 0),
                _int(frame, "stream", -1), _int(frame, "correlation", -1),
                dict(zip(syncs["correlation"].to_list(), syncs["stream"].fill_null(-1).to_list(), strict=True)))


def _device(b: _Builder, r: int, ops: _Ops, released: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Device and stream-order edges of one rank; ``released`` marks the ops whose end a collective decides."""
    frame = ops.frame
    step = _int(frame, "step", -1)
    start = b.nodes(ops.ts, r, step, on_device=True)
    end = b.nodes(ops.end, r, step, on_device=True)
    codes = {str(c): CODE[_CATEGORY_KIND.get(c, PathKind.COMPUTE)] for c in Category}
    compute = CODE[PathKind.COMPUTE]
    kind = (frame["category"].cast(pl.String).replace_strict(codes, default=compute, return_dtype=pl.Int8)
            .fill_null(compute).to_numpy())
    label = b.label(frame["name"])
    w = np.where(released, 0, ops.end - ops.ts)
    then = np.where(released, CODE[PathKind.COMMUNICATION], kind).astype(np.int8)
    b.edge(start, end, w, kind, then, label)
    device = _int(frame, "device", -1)
    order = np.lexsort((ops.ts, ops.stream, device))
    same = (ops.stream[order][1:] == ops.stream[order][:-1]) & (device[order][1:] == device[order][:-1])
    gap = b.label([STREAM_GAP])[0]
    b.edge(end[order][:-1][same], start[order][1:][same], 0, PathKind.IDLE, PathKind.IDLE, gap)
    return start, end


def _stream_waits(b: _Builder, ops: _Ops, start: np.ndarray, end: np.ndarray, launch: np.ndarray) -> None:
    """Inferred waits on other streams: an op that started after its launch and its stream allowed, right after
    an op on another stream of its device ended (within :data:`WAIT_WINDOW_NS`), waited for that op."""
    n = len(ops.ids)
    if n < 2:
        return
    device = _int(ops.frame, "device", -1)
    order = np.lexsort((ops.ts, ops.stream, device))
    prev_end = np.full(n, -(2 ** 62), np.int64)
    same = (ops.stream[order][1:] == ops.stream[order][:-1]) & (device[order][1:] == device[order][:-1])
    prev_end[order[1:][same]] = ops.end[order[:-1][same]]
    explained = np.maximum(prev_end, launch)
    src = np.full(n, -1, np.int64)
    best = np.full(n, -(2 ** 62), np.int64)
    for dev, stream in {(int(d), int(s)) for d, s in zip(device, ops.stream, strict=True)}:
        others = np.flatnonzero((device == dev) & (ops.stream != stream))
        mine = np.flatnonzero((device == dev) & (ops.stream == stream))
        if not len(others) or not len(mine):
            continue
        others = others[np.argsort(ops.end[others], kind="stable")]
        at = np.searchsorted(ops.end[others], ops.ts[mine], side="right") - 1
        ok = at >= 0
        cand = others[np.maximum(at, 0)]
        cand_end = np.where(ok, ops.end[cand], -(2 ** 62))
        better = ok & (cand_end > best[mine])
        best[mine[better]] = cand_end[better]
        src[mine[better]] = cand[better]
    waits = (src >= 0) & (best > explained) & (ops.ts - best <= WAIT_WINDOW_NS) & (ops.ts - explained > WAIT_WINDOW_NS)
    b.edge(end[src[waits]], start[waits], 0, PathKind.SYNC, PathKind.SYNC, b.label([STREAM_WAIT])[0])


def _launch_calls(host: pl.DataFrame) -> pl.DataFrame:
    """The call that launched each correlation id (as :func:`tracelake.analysis.launches.launch_calls` picks it),
    sorted by correlation: ``event_id``, ``correlation``, ``ts_ns``."""
    carrying = host.filter(pl.col("correlation").is_not_null() & pl.col("ts_ns").is_not_null())
    _, rows = launch_call_rows(_int(carrying, "correlation"), _int(carrying, "ts_ns"), _int(carrying, "dur_ns"))
    return carrying.select("event_id", "correlation", "ts_ns")[rows]


def _launches(b: _Builder, ops: _Ops, op_start: np.ndarray, host_ids: np.ndarray, host_start: np.ndarray,
              calls: pl.DataFrame) -> np.ndarray:
    """Launch edges: each call's start -> the start of the ops it launched; returns each op's launch time (or start)."""
    if calls.is_empty() or not len(ops.ids):
        return ops.ts.copy()
    call_corr, call_id = _int(calls, "correlation"), _int(calls, "event_id")
    at = _row_of(call_corr, ops.correlation)
    has = (at >= 0) & (ops.correlation >= 0)
    host_row = _row_of(host_ids, call_id[np.maximum(at, 0)])
    has &= host_row >= 0
    src = host_start[np.maximum(host_row, 0)]
    b.edge(src[has], op_start[has], 0, PathKind.LAUNCH, PathKind.LAUNCH, b.label(ops.frame["name"])[has])
    launch = np.where(has, _int(calls, "ts_ns")[np.maximum(at, 0)], ops.ts)
    return launch


def _blocking(b: _Builder, ops: _Ops, op_end: np.ndarray, launch: np.ndarray, host: pl.DataFrame,
              host_ids: np.ndarray, host_end: np.ndarray, blocking_ids: np.ndarray) -> None:
    """Synchronisation edges: the last op each blocking call (``blocking_ids``) waited for -> the call's end."""
    if not len(blocking_ids) or not len(ops.ids):
        return
    calls = host.filter(pl.col("event_id").is_in(blocking_ids)).sort("event_id")
    rows = _row_of(host_ids, _int(calls, "event_id", -1))
    cs, ce = _int(calls, "ts_ns"), _int(calls, "ts_ns") + np.maximum(_int(calls, "dur_ns"), 0)
    corr = _int(calls, "correlation", -1)
    best_end = np.full(len(cs), -1, np.int64)
    best_op = np.full(len(cs), -1, np.int64)
    # a blocking copy waits for its own copy
    direct = np.where(corr >= 0, _row_of(np.sort(ops.correlation), corr), -1)
    by_corr = np.argsort(ops.correlation, kind="stable")
    wanted_stream = np.array([ops.synced_stream.get(int(c), -1) for c in corr], np.int64)
    for stream in np.unique(ops.stream):
        mine = np.flatnonzero(ops.stream == stream)
        mine = mine[np.argsort(launch[mine], kind="stable")]
        ends = ops.end[mine]
        running = np.maximum.accumulate(ends)
        arg = np.maximum.accumulate(np.where(ends >= running, np.arange(len(mine)), 0))
        k = np.searchsorted(launch[mine], cs, side="left")
        ok = (k > 0) & ((wanted_stream < 0) | (wanted_stream == stream))
        cand_end = np.where(ok, running[np.maximum(k - 1, 0)], -1)
        cand_op = mine[arg[np.maximum(k - 1, 0)]]
        better = ok & (cand_end <= ce) & (cand_end > best_end)
        best_end = np.where(better, cand_end, best_end)
        best_op = np.where(better, cand_op, best_op)
    copy = direct >= 0
    if copy.any():
        op = by_corr[direct[copy]]
        fits = ops.end[op] <= ce[copy]
        chosen = np.flatnonzero(copy)[fits]
        best_op[chosen] = op[fits]
    has = best_op >= 0
    b.edge(op_end[best_op[has]], host_end[rows[has]], 0, PathKind.SYNC, PathKind.SYNC,
           b.label(calls["name"])[has])


def build(ranks: list[RankInput]) -> Graph:
    """The dependency graph of every rank's rows (one run: its ranks' clocks comparable)."""
    b = _Builder()
    ops = [_ops(r.device) for r in ranks]
    # collectives: (group, seq, collective) -> per rank the op (device row, or host event when no kernel)
    keyed: list[pl.DataFrame] = []
    for i, (r, o) in enumerate(zip(ranks, ops, strict=True)):
        c = r.collectives
        if c.is_empty() or "seq" not in c.columns:
            continue
        c = c.filter(pl.col("seq").is_not_null() & ~pl.col("is_async").fill_null(False))
        kernel = _row_of(o.ids, _int(c, "kernel_event_id", -1))
        # a send and its recv are one transfer: keyed by the pair of ranks, the same on both sides
        p2p = c["collective"].fill_null("").is_in(P2P_OPS)
        pair = pl.when(p2p).then(pl.format("{}->{}", pl.col("src_rank"), pl.col("dst_rank")))
        keyed.append(c.select(
            pl.lit(i, pl.Int32).alias("index"), pl.col("process_group").fill_null("").cast(pl.String).alias("group"),
            pl.col("seq").cast(pl.Int64),
            pl.when(p2p).then(pl.lit("send/recv")).otherwise(pl.col("collective").fill_null("")).cast(pl.String)
            .alias("collective"), pl.Series("pair", c.select(pair.fill_null("")).to_series()).cast(pl.String),
            pl.Series("device_row", kernel), pl.col("event_id").fill_null(-1).cast(pl.Int64).alias("host_event"),
            (pl.col("message_bytes") if "message_bytes" in c.columns else pl.lit(None)).cast(pl.Int64).alias("bytes")))
    matched = pl.DataFrame(schema={"index": pl.Int32, "group": pl.String, "seq": pl.Int64, "collective": pl.String,
                                   "pair": pl.String, "device_row": pl.Int64, "host_event": pl.Int64,
                                   "bytes": pl.Int64})
    if keyed:
        key = ["group", "seq", "collective", "pair"]
        every = pl.concat(keyed).unique(["index", *key], keep="first")
        ranks_in = every.group_by(key).agg(pl.col("index").n_unique().alias("n"))
        matched = every.join(ranks_in.filter(pl.col("n") > 1), on=key).drop("n")
    starts: list[np.ndarray] = []
    ends: list[np.ndarray] = []
    late_waits: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    for i, (r, o) in enumerate(zip(ranks, ops, strict=True)):
        mine = matched.filter((pl.col("index") == i))
        released = np.zeros(len(o.ids), bool)
        rows = mine.filter(pl.col("device_row") >= 0)["device_row"].to_numpy()
        released[rows] = True
        elastic = {int(e): PathKind.COMMUNICATION for e in mine.filter(pl.col("device_row") < 0)["host_event"]}
        host = r.host.filter(~pl.col("cat").is_in(SKIPPED_CATS))
        calls = _launch_calls(host)
        launching = calls.filter(pl.col("correlation").is_in(o.correlation[o.correlation >= 0]))
        host_ids, host_start, host_end, blocking, waits = _host(b, i, host, _int(launching, "event_id", -1),
                                                                elastic)
        if r.data_edges is not None:  # an execution trace's: the writer's end -> the reader's start
            ordered = host.filter(pl.col("ts_ns").is_not_null()).sort("event_id")
            src, dst = et_deps.host_rows(r.data_edges, ordered)
            b.edge(host_end[src], host_start[dst], 0, PathKind.HOST, PathKind.HOST, b.label(ordered["name"])[src])
        late_waits.append(waits)
        op_start, op_end = _device(b, i, o, released)
        launch = _launches(b, o, op_start, host_ids, host_start, calls)
        _stream_waits(b, o, op_start, op_end, launch)
        _blocking(b, o, op_end, launch, host, host_ids, host_end, blocking)
        # the collective's two moments on this rank
        dev = mine["device_row"].to_numpy()
        hrow = _row_of(host_ids, mine["host_event"].to_numpy())
        s = np.where(dev >= 0, _at(op_start, dev), _at(host_start, hrow))
        e = np.where(dev >= 0, _at(op_end, dev), _at(host_end, hrow))
        starts.append(s)
        ends.append(e)
    group_of: dict[int, str] = {}
    collective_of: dict[int, tuple[str, int, int | None]] = {}
    if matched.height:
        s, e = np.concatenate(starts), np.concatenate(ends)
        keys = pl.concat([matched.filter(pl.col("index") == i) for i in range(len(ranks))]).with_columns(
            pl.Series("s", s), pl.Series("e", e)).filter(pl.col("s") >= 0)
        t = np.concatenate(b.t)
        step = np.concatenate(b.step)
        keys = keys.with_columns(pl.Series("t", t[keys["s"].to_numpy()]), pl.Series("step", step[keys["s"].to_numpy()]))
        groups = keys.group_by("group", "seq", "collective", "pair", maintain_order=True).agg(
            pl.col("t").max().alias("meet"), pl.col("step").max(), pl.col("s"), pl.col("e"), pl.col("bytes").max())
        meetings = b.nodes(groups["meet"].to_numpy(), -1, groups["step"].to_numpy(), on_device=False)
        sizes = groups["s"].list.len().to_numpy()
        meeting_of = np.repeat(meetings, sizes)
        label = b.label(groups["collective"].to_list())
        labels = np.repeat(label, sizes)
        b.edge(groups["s"].explode().to_numpy(), meeting_of, 0, PathKind.COMMUNICATION, PathKind.COMMUNICATION, labels)
        b.edge(meeting_of, groups["e"].explode().to_numpy(), 0, PathKind.COMMUNICATION, PathKind.COMMUNICATION,
               labels)
        resumes, of = _late_edges(b, late_waits, groups["s"].explode().to_numpy(), meeting_of)
        names = groups["group"].to_list()
        group_of.update(zip(meetings.tolist(), names, strict=True))
        facts = list(zip(groups["collective"].to_list(), sizes.tolist(), groups["bytes"].to_list(), strict=True))
        for name, (op, n, size), ends_of in zip(names, facts, groups["e"].to_list(), strict=True):
            group_of.update((int(node), name) for node in ends_of if node >= 0)
            collective_of.update((int(node), (op, int(n), size)) for node in ends_of if node >= 0)
        # a wait for a collective still open: its transfer lands on the resume, which stands for the collective there
        group_index = np.repeat(np.arange(groups.height), sizes)
        for node, index in zip(resumes.tolist(), group_index[of].tolist(), strict=True):
            op, n, size = facts[index]
            group_of[int(node)] = names[index]
            collective_of[int(node)] = (op, int(n), size)
    graph = b.graph([(r.trace_id, r.rank) for r in ranks])
    graph.group_of = {node: name for node, name in group_of.items() if name}
    graph.collective_of = collective_of
    return graph
