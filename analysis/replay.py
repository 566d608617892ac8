"""Replaying a dependency graph and walking its critical path (docs/analyses.md, "Critical path").

:func:`prepare` turns a :class:`~tracelake.analysis.depgraph.Graph` into in-edge lists by target,
each node's slack (its measured time beyond its latest predecessor) and the kind of that slack,
and each step's nodes in topological order. :meth:`Prepared.replay` replays one step with given
edge weights and slacks, every node outside the step held at its measured time (an edge into the
step keeps its measured weight); :meth:`Prepared.walk` follows the latest in-edges back from the
step's last moment. The two loops run in C (``_replay.c``); where that is not built, the Python
loops below do the same, and a test keeps the two equal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tracelake.contracts.critical import PathKind
from tracelake.contracts.lazy import optional_module

from .depgraph import CODE, Graph

_native = optional_module(f"{__package__}._replay")  # None where no compiler built it: the Python loops
#: Whether the C loops are in use.
NATIVE = _native is not None

#: One stretch of a path: rank index, kind code, label, start, duration, node (-1: before the first moment).
Stretch = tuple[int, int, int, int, int, int]


@dataclass
class Prepared:
    """A graph ready to replay: int64 arrays throughout (the C loops read them as buffers)."""

    graph: Graph
    #: In-edges by target: node v's are ptr[v]..ptr[v + 1]; src their sources; edge their index in the graph.
    ptr: np.ndarray
    src: np.ndarray
    edge: np.ndarray
    #: The measured weights in by-target order.
    w0: np.ndarray
    slack: np.ndarray
    slack_kind: np.ndarray
    slack_label: np.ndarray
    #: Each node's step (-1 when the selection has no steps: one step, -1).
    step_of: np.ndarray
    #: Per step: its nodes in topological order, and those on ranks (the collectives' meetings left out).
    orders: dict[int, np.ndarray]
    on_ranks: dict[int, np.ndarray]
    rank: np.ndarray
    kind: np.ndarray
    label: np.ndarray
    _t: np.ndarray | None = None
    _choice: np.ndarray | None = None

    def replay(self, step: int, ws: np.ndarray, slack: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every node's time with ``step`` replayed (``ws``: weights by target, ``slack`` per node), and each
        replayed node's latest in-edge (-1 elsewhere); both are shared buffers until :meth:`restore`."""
        if self._t is None or self._choice is None:
            self._t, self._choice = self.graph.t.astype(np.int64), np.full(len(self.graph.t), -1, np.int64)
        args = (self.orders[step], self.ptr, self.src, ws, self.w0, self.step_of, slack, self._t, self._choice, step)
        (_native.replay if _native is not None else _replay)(*args)
        return self._t, self._choice

    def restore(self, step: int) -> None:
        """Put back the measured times of the nodes :meth:`replay` changed."""
        if self._t is not None and self._choice is not None:
            order = self.orders[step]
            self._t[order] = self.graph.t[order]
            self._choice[order] = -1

    def walk(self, step: int, t: np.ndarray, choice: np.ndarray, ws: np.ndarray) -> tuple[int, int, list[Stretch]]:
        """The step's critical path: (start, end, stretches in time order).

        The step starts where it was measured to start: what comes before it is held, so a scenario
        that removes the slack of the step's first moment shortens the step, it does not move it.
        """
        nodes = self.on_ranks[step]
        times = t[nodes]
        start, v = int(self.graph.t[nodes].min()), int(nodes[int(times.argmax())])
        room = 2 * len(self.orders[step]) + 2
        out = [np.empty(room, np.int64) for _ in range(6)]
        args: tuple[Any, ...] = (v, start, t, choice, self.src, ws, self.w0, self.step_of, step, self.rank,
                                 self.slack_kind, self.slack_label, self.edge, self.kind, self.label, *out,
                                 CODE[PathKind.IDLE])
        count = int((_native.walk if _native is not None else _walk)(*args))
        columns = [column[:count][::-1].tolist() for column in out]
        return start, max(int(t[v]), start), list(zip(*columns, strict=True))


def prepare(graph: Graph) -> Prepared:
    """In-edge lists, slacks and step orders of ``graph``."""
    n = len(graph.t)
    by_dst = np.lexsort((graph.src, graph.dst))
    src, dst = graph.src[by_dst], graph.dst[by_dst]
    ptr = np.zeros(n + 1, np.int64)
    np.add.at(ptr, dst + 1, 1)
    ptr = np.cumsum(ptr)
    w0 = graph.w[by_dst].astype(np.int64, copy=False)
    reach = graph.t[src] + w0
    best = np.full(n, np.iinfo(np.int64).min, np.int64)
    np.maximum.at(best, dst, reach)
    has_pred = ptr[1:] > ptr[:-1]
    slack = np.where(has_pred, graph.t - best, 0).astype(np.int64, copy=False)
    # the kind of each node's slack: that of its latest predecessor's edge (the first of equals)
    first = np.full(n, -1, np.int64)
    positions = np.flatnonzero(reach == best[dst])[::-1]
    first[dst[positions]] = positions  # written last = the lowest position
    slack_kind = np.where(first >= 0, graph.then[by_dst][np.maximum(first, 0)], CODE[PathKind.IDLE])
    slack_label = np.where(first >= 0, graph.label[by_dst][np.maximum(first, 0)], -1)
    # topological order: by time, and within equal times by the length of the zero-time chains into a node
    level = np.zeros(n, np.int64)
    tie = graph.t[src] == graph.t[dst]
    for _ in range(64):
        before = level.copy()
        np.maximum.at(level, dst[tie], level[src[tie]] + 1)
        if np.array_equal(before, level):
            break
    order = np.lexsort((level, graph.t))
    position = np.empty(n, np.int64)
    position[order] = np.arange(n)
    on_rank = graph.rank >= 0
    steps = np.unique(graph.step[on_rank & (graph.step >= 0)])
    if len(steps):
        step_of = graph.step.astype(np.int64, copy=False)
        members = {int(s): np.flatnonzero(step_of == s) for s in steps}  # with the meetings of its collectives
    else:  # no steps: the whole selection is one
        step_of = np.full(n, -1, np.int64)
        members = {-1: np.arange(n)}
    orders = {s: nodes[np.argsort(position[nodes], kind="stable")].astype(np.int64, copy=False)
              for s, nodes in members.items()}
    on_ranks = {s: nodes[on_rank[nodes]] for s, nodes in members.items()}
    i64 = np.int64
    return Prepared(graph, ptr.astype(i64), src.astype(i64), by_dst.astype(i64), w0, slack, slack_kind.astype(i64),
                    slack_label.astype(i64), step_of, orders, on_ranks, graph.rank.astype(i64), graph.kind.astype(i64),
                    graph.label.astype(i64))


def _replay(order: np.ndarray, ptr: np.ndarray, src: np.ndarray, ws: np.ndarray, w0: np.ndarray,
            step_of: np.ndarray, slack: np.ndarray, t: np.ndarray, choice: np.ndarray, step: int) -> None:
    """The Python twin of ``_replay.replay`` (see the C file's comment)."""
    times, picked = t.tolist(), choice.tolist()
    ptr_l, src_l, ws_l, w0_l, of_step, sl = ptr.tolist(), src.tolist(), ws.tolist(), w0.tolist(), step_of.tolist(), \
        slack.tolist()
    for v in order.tolist():
        lo, hi = ptr_l[v], ptr_l[v + 1]
        if lo >= hi:
            continue
        best, arg = 0, -1
        for e in range(lo, hi):
            u = src_l[e]
            x = times[u] + (ws_l[e] if of_step[u] == step else w0_l[e])
            if arg < 0 or x > best:
                best, arg = x, e
        times[v] = best + sl[v]
        picked[v] = arg
    t[:] = times
    choice[:] = picked


def _walk(v: int, start: int, t: np.ndarray, choice: np.ndarray, src: np.ndarray, ws: np.ndarray, w0: np.ndarray,
          step_of: np.ndarray, step: int, rank: np.ndarray, slack_kind: np.ndarray, slack_label: np.ndarray,
          edge_of: np.ndarray, kind: np.ndarray, label: np.ndarray, *out_and_idle: object) -> int:
    """The Python twin of ``_replay.walk``."""
    *outs, idle = out_and_idle
    out: list[list[int]] = [[] for _ in outs]

    def put(*values: int) -> None:
        for column, value in zip(out, values, strict=True):
            column.append(value)

    while True:
        e, r = int(choice[v]), int(rank[v])
        if e < 0:
            if t[v] > start:
                put(r, int(idle), -1, start, int(t[v]) - start, -1)  # type: ignore[call-overload]
            break
        u, edge = int(src[e]), int(edge_of[e])
        w = int(ws[e] if step_of[u] == step else w0[e])
        reach = int(t[u]) + w
        if t[v] > reach:
            lo = max(reach, start)
            if t[v] > lo:
                put(r, int(slack_kind[v]), int(slack_label[v]), lo, int(t[v]) - lo, v)
        if w > 0 and reach > start:
            lo = max(int(t[u]), start)
            put(r if r >= 0 else int(rank[u]), int(kind[edge]), int(label[edge]), lo, reach - lo, v)
        if t[u] <= start:
            break
        v = u
    for column, values in zip(outs, out, strict=True):
        column[:len(values)] = values  # type: ignore[index]
    return len(out[0])
