"""The ``op`` of each Kineto memory instant: the innermost ``cpu_op`` on its thread running at its time.

Used by :func:`.kineto_sql_facts.memory_events` (docs/formats.md, "Memory instants"). Per thread, the
``cpu_op`` events are sorted by start (longer first, then by event id) and nested as a stack nests them
(:func:`.xla_host.nesting`: touching is not nesting); an instant's candidate is the last op to start at or
before it, and its answer the first op up that candidate's chain of parents that holds it (start <= t < end,
or t = start for an op of zero length). Every op holding the instant is on that chain (it started before the
candidate and ends after the candidate's start, so the stack still held it), and the first one up the chain
is the latest in the sort: of the ops holding the instant, the last to start, then the first to end.

On whole arrays (numpy), a thread at a time: the work is a sort of the thread's ops, where a sweep of
their starts and ends in SQL sorted twice as many points and joined them again (about 4x slower).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from .xla_host import nesting


def innermost_ops(ops: pa.Table, instants: pa.Table) -> pa.Table:
    """``event_id`` of each instant (``instants``: ``event_id``, ``pid``, ``tid``, ``ts_ns``, none null) and
    ``op``, the ``name`` of its op among ``ops`` (``event_id``, ``pid``, ``tid``, ``ts_ns``, ``dur_ns``, ``name``;
    a null or negative length counts as 0), null where no op holds it."""
    op_pid, op_tid = (ops.column(c).to_numpy(zero_copy_only=False).astype(np.int64, copy=False) for c in ("pid", "tid"))
    ids = ops.column("event_id").to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    starts = ops.column("ts_ns").to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    lengths = np.maximum(ops.column("dur_ns").fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64, copy=False), 0)
    mem_pid, mem_tid = (instants.column(c).to_numpy(zero_copy_only=False).astype(np.int64, copy=False) for c in ("pid", "tid"))
    mem_ids = instants.column("event_id").to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    times = instants.column("ts_ns").to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    found = np.full(len(mem_ids), -1, dtype=np.int64)  # the op's row in ``ops``
    for pid, tid in _threads(mem_pid, mem_tid):  # a few threads allocate: one pass over the ops each
        mine = np.flatnonzero((mem_pid == pid) & (mem_tid == tid))
        theirs = np.flatnonzero((op_pid == pid) & (op_tid == tid))
        if len(theirs):
            at = _innermost(ids[theirs], starts[theirs], lengths[theirs], times[mine])
            found[mine] = np.where(at >= 0, theirs[np.maximum(at, 0)], -1)
    rows = pa.array(found, mask=found < 0, type=pa.int64())
    return pa.table({"event_id": pa.array(mem_ids), "op": ops.column("name").take(rows)})


def _threads(pid: np.ndarray, tid: np.ndarray) -> list[tuple[int, int]]:
    """The distinct (pid, tid) pairs: through one 64-bit key where both fit 32 bits (a sort of one column)."""
    if not len(pid):
        return []
    if pid.min() >= 0 and tid.min() >= 0 and max(int(pid.max()), int(tid.max())) < 1 << 31:
        keys = np.unique(pid << 32 | tid)
        return list(zip((keys >> 32).tolist(), (keys & 0xFFFFFFFF).tolist(), strict=True))
    return [(int(p), int(t)) for p, t in np.unique(np.stack([pid, tid], axis=1), axis=0).tolist()]


def _innermost(ids: np.ndarray, starts: np.ndarray, lengths: np.ndarray, times: np.ndarray) -> np.ndarray:
    """For each time, the position (in the arrays given) of the op holding it that starts last (then ends first,
    then has the larger id); -1 for none."""
    order = np.lexsort((ids, -lengths, starts))
    start, end = starts[order], starts[order] + lengths[order]
    _, parent = nesting(start, end)
    at = np.searchsorted(start, times, side="right") - 1
    out = np.full(len(times), -1, dtype=np.int64)
    pending = np.flatnonzero(at >= 0)
    while len(pending):
        here = at[pending]
        t = times[pending]
        holds = (t < end[here]) | ((start[here] == end[here]) & (start[here] == t))
        out[pending[holds]] = order[here[holds]]
        up = pending[~holds]
        at[up] = parent[at[up]]
        pending = up[at[up] >= 0]
    return out
