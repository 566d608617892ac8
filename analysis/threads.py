"""Waits between the threads of a rank that the trace has no event for (docs/analyses.md, "Critical path").

A thread that sits idle and then resumes may have been waiting for another thread: gloo's worker threads run
collectives while the caller blocks in ``wait()``; the autograd engine runs a CUDA backward on its own thread
while ``backward()`` blocks; a process group's worker picks up a collective that another thread enqueued.
:func:`cross_thread` finds these hand-offs among one rank's host moments, turns the idle gaps they explain into
slack (so a what-if can shorten them) and says which edges the graph gains. Pure numpy and polars.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from tracelake.contracts.critical import ENQUEUE_CALL, PATH_KINDS, PathKind

#: Code of each kind in the graph's int8 arrays.
CODE = {kind: i for i, kind in enumerate(PATH_KINDS)}
#: An op that starts within this long after an op on another stream ended, and later than its launch and its own
#: stream explain by more than this, is taken to have waited for that op (an event wait the trace does not record);
#: a thread idle for longer than this before an event may have been waiting for another thread.
WAIT_WINDOW_NS = 20_000
#: Before a thread's first moment: far enough back that any gap counts as idle, far from int64 overflow.
_LONG_AGO = -(2 ** 62)


@dataclass
class Moments:
    """One rank's host moments in thread-then-time order, and the host-order edges between neighbours.

    ``row``: the event of each moment; ``tid``: per event; ``same``: whether moment i + 1 is on moment i's
    thread (an edge between them); ``open_after``, ``gap`` and ``then`` are per edge: the event open after its
    source (-1: none), its weight and the slack kind of its target. :func:`cross_thread` changes ``gap`` and
    ``then`` in place.
    """

    when: np.ndarray
    is_start: np.ndarray
    row: np.ndarray
    tid: np.ndarray
    same: np.ndarray
    open_after: np.ndarray
    gap: np.ndarray
    then: np.ndarray


@dataclass
class CrossThread:
    """The edges the waits add: ``after_end`` (waker event row, waiter moment, kind): the waiter no earlier
    than the waker's end; ``workers``/``calls`` (event rows): a worker's event no earlier than the start of the
    call that enqueued it; ``open_waits`` (collective event rows, waiter moments): waits for a collective
    still open at the resume, answered by the collective's meeting once the ranks are matched."""

    after_end: list[tuple[np.ndarray, np.ndarray, PathKind]]
    workers: np.ndarray
    calls: np.ndarray
    open_waits: tuple[np.ndarray, np.ndarray]


def cross_thread(m: Moments, host: pl.DataFrame, ts: np.ndarray, end: np.ndarray,
                 slack_kind: np.ndarray) -> CrossThread:
    """The waits between one rank's threads; the idle gaps they explain become slack in ``m``."""
    n = len(ts)
    target = np.flatnonzero(m.same) + 1  # the moment each host-order edge ends in
    resumed, waited_for, late, late_for = _resumes(m, ts, end, slack_kind)
    m.gap[resumed | late] = 0
    m.then[resumed] = CODE[PathKind.SYNC]
    m.then[late] = CODE[PathKind.COMMUNICATION]
    # work handed from another thread: the waiter's idle gap before it is slack, the waker an in-edge
    first = np.concatenate([[True], ~m.same])
    edge_into = np.cumsum(m.same) - 1  # at a moment that is not its thread's first: its host-order edge's index
    handed = _handoffs(m, _autograd_threads(host), first)
    start_moment = np.empty(n, np.int64)
    start_moment[m.row[m.is_start]] = np.flatnonzero(m.is_start)
    workers, calls = _enqueues(host, ts, m.tid, slack_kind)
    enqueued = start_moment[workers]
    idle = ~first[enqueued]
    before = edge_into[enqueued[idle] - 1]
    idle[idle] = (m.open_after[before] < 0) & (m.gap[before] > WAIT_WINDOW_NS)
    for waiter, kind in [*((w, k) for _, w, k in handed), (enqueued[idle], PathKind.HOST)]:
        into = edge_into[waiter[~first[waiter]] - 1]
        m.gap[into] = 0
        m.then[into] = CODE[kind]
    # inside a collective's own event (gloo with CUDA tensors), a child that starts after a long gap was waiting
    # for the other ranks' data: that gap is the collective's, from its meeting on
    holder = np.maximum(m.open_after, 0)
    inside = ((m.open_after >= 0) & (slack_kind[holder] == CODE[PathKind.COMMUNICATION]) & m.is_start[target]
              & (m.gap > WAIT_WINDOW_NS))
    m.gap[inside] = 0
    m.then[inside] = CODE[PathKind.COMMUNICATION]
    after_end = [(waited_for, target[resumed], PathKind.SYNC)]
    after_end += [(m.row[waker], waiter, kind) for waker, waiter, kind in handed]
    return CrossThread(after_end, workers, calls, (np.concatenate([late_for, holder[inside]]),
                                                   np.concatenate([target[late], target[inside]])))


def _autograd_threads(host: pl.DataFrame) -> set[tuple[int, int]]:
    """(forward thread, backward thread) pairs: a backward op (``fwd_thread_id`` set: PyTorch's own thread
    numbering, not a ``tid``) on another thread than the forward op of the same ``sequence_number``."""
    if "sequence_number" not in host.columns or "fwd_thread_id" not in host.columns:
        return set()
    ops = host.filter(pl.col("sequence_number").is_not_null()).select(
        "tid", "sequence_number", (pl.col("fwd_thread_id").fill_null(0) > 0).alias("backward"))
    forward = ops.filter(~pl.col("backward")).group_by("sequence_number").agg(pl.col("tid").first().alias("f"))
    backward = ops.filter(pl.col("backward")).select("sequence_number", pl.col("tid").alias("b")).unique()
    both = backward.join(forward, on="sequence_number").filter(pl.col("f") != pl.col("b"))
    return {(int(f), int(b_)) for f, b_ in both.select("f", "b").unique().iter_rows()}


def _handoffs(m: Moments, pairs: set[tuple[int, int]],
              first: np.ndarray) -> list[tuple[np.ndarray, np.ndarray, PathKind]]:
    """Work handed between a thread and the autograd thread that runs its backward
    (:func:`_autograd_threads`): which moments waited for the other thread, and the end that woke each.

    The autograd thread starts a burst of work (its first moment, or a start after more than
    :data:`WAIT_WINDOW_NS` of nothing) after the latest end on the forward thread (``loss.backward()``
    handing over); the forward thread resumes after such a gap once the autograd thread's latest end within
    the gap has come (``backward()`` returning). The first is host dispatch, the second a wait. Returns
    (moment of the waker, moment of the waiter, kind) per direction.
    """
    when, is_start = m.when, m.is_start
    thread = m.tid[m.row]
    out: list[tuple[np.ndarray, np.ndarray, PathKind]] = []
    prev = np.where(first, _LONG_AGO, np.concatenate([[_LONG_AGO], when[:-1]]))
    idle_before = is_start & (when - prev > WAIT_WINDOW_NS)
    for forward, backward in sorted(pairs):
        for waiter_tid, waker_tid, kind in ((backward, forward, PathKind.HOST), (forward, backward, PathKind.SYNC)):
            ends = np.flatnonzero((thread == waker_tid) & ~is_start)
            if not len(ends):
                continue
            ends = ends[np.argsort(when[ends], kind="stable")]
            waiting = np.flatnonzero((thread == waiter_tid) & idle_before)
            at = np.searchsorted(when[ends], when[waiting], side="right") - 1
            waker = ends[np.maximum(at, 0)]
            ok = (at >= 0) & (when[waker] > prev[waiting])
            out.append((waker[ok], waiting[ok], kind))
    return out


def _enqueues(host: pl.DataFrame, ts: np.ndarray, tid: np.ndarray,
              slack_kind: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A collective's event on a worker thread starts no earlier than the call that enqueued it: the latest
    :data:`~tracelake.contracts.critical.ENQUEUE_CALL` on another thread starting before it. Returns the rows
    of the workers' events and of their calls."""
    worker = np.flatnonzero(slack_kind == CODE[PathKind.COMMUNICATION])
    calls = np.flatnonzero(host["name"].fill_null("").str.contains(ENQUEUE_CALL).to_numpy())
    if not len(worker) or not len(calls):
        return np.empty(0, np.int64), np.empty(0, np.int64)
    calls = calls[np.argsort(ts[calls], kind="stable")]
    at = np.searchsorted(ts[calls], ts[worker], side="right") - 1
    call = calls[np.maximum(at, 0)]
    ok = (at >= 0) & (tid[call] != tid[worker])
    return worker[ok], call[ok]


def _resumes(m: Moments, ts: np.ndarray, end: np.ndarray,
             slack_kind: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Threads that resumed once a collective on another thread had its data (a blocking wait the trace has no
    event for: gloo's ``work.wait()``): which host-order edges end in such a resume, and the collective of each.

    A resume is an event start after more than :data:`WAIT_WINDOW_NS` with nothing open on its thread.
    It waited for a collective's event (one whose end waits for other ranks) on another thread either when it
    comes within :data:`WAIT_WINDOW_NS` after that event's end (the latest such end: ``resumed``,
    ``waited_for``), or, where none ended just before, when that event is still open at the resume (gloo with
    CUDA tensors copies the result back and completes the work before its annotation ends): the collective
    started last before the resume (``late``, ``late_for``). The latter's wait is for the collective's last
    arrival; the edge from its meeting is added once the ranks are matched.
    """
    when, is_start, row, tid, same, open_after = m.when, m.is_start, m.row, m.tid, m.same, m.open_after
    n_edges = int(same.sum())
    collective = np.flatnonzero(slack_kind == CODE[PathKind.COMMUNICATION])
    if not len(collective) or not n_edges:
        none = np.zeros(n_edges, bool)
        return none, np.empty(0, np.int64), none.copy(), np.empty(0, np.int64)
    collective = collective[np.argsort(end[collective], kind="stable")]
    ends = end[collective]
    t_to, t_from = when[1:][same], when[:-1][same]
    candidate = is_start[1:][same] & (open_after < 0) & (t_to - t_from > WAIT_WINDOW_NS)
    at = np.searchsorted(ends, t_to, side="right") - 1
    ok = candidate & (at >= 0)
    chosen = collective[np.maximum(at, 0)]
    other = tid[row[1:][same]]
    ok &= (t_to - end[chosen] <= WAIT_WINDOW_NS) & (tid[chosen] != other) & (end[chosen] > t_from)
    by_start = collective[np.argsort(ts[collective], kind="stable")]
    before = np.searchsorted(ts[by_start], t_to, side="left") - 1
    open_one = by_start[np.maximum(before, 0)]
    late = candidate & ~ok & (before >= 0) & (end[open_one] > t_to) & (tid[open_one] != other)
    return ok, chosen[ok], late, open_one[late]
