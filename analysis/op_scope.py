"""The Python scope of each operator call: the ``nn.Module`` that ran it, else the innermost user Python frame.

docs/analyses.md, "Operators", "Module": a trace recorded ``with_stack`` (and ``with_modules``) has
``python_function`` events around the operators: ``nn.Module: Linear_3`` for a module's forward and
``model.py(42): forward`` for a frame. An operator call's module is the innermost ``nn.Module:`` event
enclosing it. A backward operator runs on the autograd thread, where no Python frame encloses it: it
takes the module of its forward operator, the forward event with the ``sequence_number`` of the nearest
event enclosing it (itself included) with a ``fwd_thread_id`` (autograd marks backward events with the
forward's sequence number; of the forward events with it, the lowest ``event_id``). A call with no module
takes the innermost frame of user code (a ``.py(`` frame outside ``torch/``, ``site-packages`` and
``<built-in``). Pure: numpy in, positions out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: The prefix Kineto gives the ``python_function`` event of an ``nn.Module``'s forward.
MODULE_PREFIX = "nn.Module: "
#: Frames of code that is not the user's: a scope never names them.
_LIBRARY_FRAMES = ("torch/", "<built-in", "site-packages/", "dist-packages/", "threading.py(", "runpy.py(")

NONE, MODULE, FRAME = 0, 1, 2  # what a host event is, as a scope
_MAX_DEPTH = 4096  # deeper than any real stack: a parent chain this long is a cycle


def scope_kind(cat: str | None, name: str | None) -> int:
    """:data:`MODULE` for an ``nn.Module`` event, :data:`FRAME` for a frame of user code, else :data:`NONE`."""
    if cat != "python_function" or not name:
        return NONE
    if name.startswith(MODULE_PREFIX):
        return MODULE
    if ".py(" in name and not any(part in name for part in _LIBRARY_FRAMES):
        return FRAME
    return NONE


def scope_name(name: str | None) -> str | None:
    """What the ``module`` column shows of a scope event's name: a module without its prefix, a frame as it is."""
    if name is None:
        return None
    return name[len(MODULE_PREFIX):] if name.startswith(MODULE_PREFIX) else name


@dataclass
class Autograd:
    """The events with a ``sequence_number`` (positions ``rows``, ascending), its value ``seq``, whether each is a
    backward event (``backward``: a ``fwd_thread_id`` above 0) and its ``event_id`` (``ids``: of the forward events
    of a sequence number, the lowest id is its forward)."""

    rows: np.ndarray
    seq: np.ndarray
    backward: np.ndarray
    ids: np.ndarray

    @classmethod
    def empty(cls) -> Autograd:
        return cls(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool),
                   np.zeros(0, dtype=np.int64))


#: Start positions :func:`nearest` walks up from at once: its temporaries are this long, whatever the trace's length.
WALK_CHUNK = 1 << 16


def nearest(start: np.ndarray, parent: np.ndarray, mask: np.ndarray, chunk: int = WALK_CHUNK) -> np.ndarray:
    """For each start position, the nearest event on its parent chain (itself included) where ``mask`` holds; -1
    for none. Walks up one level a round over the chains not yet settled, ``chunk`` starts at a time: the walk's
    arrays (positions, hits, parents: about 40 bytes a start) are a chunk long, so at 2 GB of trace a walk from every
    launch call no longer leaves tens of MiB of freed temporaries in the heap."""
    found = np.full(len(start), -1, dtype=np.int64)
    for first in range(0, len(start), chunk):
        found[first:first + chunk] = _nearest(start[first:first + chunk], parent, mask)
    return found


def _nearest(start: np.ndarray, parent: np.ndarray, mask: np.ndarray) -> np.ndarray:
    found = np.full(len(start), -1, dtype=np.int64)
    at = start.astype(np.int64)
    live = np.flatnonzero(at >= 0)
    for _ in range(_MAX_DEPTH):
        if not len(live):
            break
        here = at[live]
        hit = mask[here]
        found[live[hit]] = here[hit]
        up = parent[here]
        at[live] = up
        live = live[~hit & (up >= 0)]
    return found


def scopes(calls: np.ndarray, parent: np.ndarray, kind: np.ndarray, autograd: Autograd) -> np.ndarray:
    """The position of the scope event of each call (positions ``calls``; -1 for none), by the rule of the module
    docstring. ``kind`` is :func:`scope_kind` of every event and ``parent`` each event's parent position."""
    if not len(calls) or not (kind != NONE).any():
        return np.full(len(calls), -1, dtype=np.int64)
    module = nearest(calls, parent, kind == MODULE)
    missing = np.flatnonzero(module < 0)
    if len(missing) and autograd.backward.any():
        marked = np.zeros(len(parent), dtype=bool)
        marked[autograd.rows[autograd.backward]] = True
        backward = nearest(calls[missing], parent, marked)  # the event that carries the forward's sequence number
        has = backward >= 0
        if has.any():
            forward = ~autograd.backward
            seq_fwd, row_fwd = autograd.seq[forward], autograd.rows[forward]
            order = np.lexsort((autograd.ids[forward], seq_fwd))  # of each sequence number, its lowest event id first
            seq_fwd, row_fwd = seq_fwd[order], row_fwd[order]
            wanted = autograd.seq[np.searchsorted(autograd.rows, backward[has])]
            at = np.minimum(np.searchsorted(seq_fwd, wanted), max(len(seq_fwd) - 1, 0))
            ok = (len(seq_fwd) > 0) & (seq_fwd[at] == wanted) if len(seq_fwd) else np.zeros(len(wanted), bool)
            inherited = np.full(len(wanted), -1, dtype=np.int64)
            if ok.any():
                inherited[ok] = nearest(row_fwd[at[ok]], parent, kind == MODULE)
            module[missing[has]] = inherited
    missing = np.flatnonzero(module < 0)
    if len(missing):
        module[missing] = nearest(calls[missing], parent, kind == FRAME)
    return module


@dataclass(frozen=True, eq=False)  # arrays: compare :meth:`as_dict`
class Paths:
    """Of each scope event (:attr:`starts`, ascending), its path: the scope events
    ``members[offsets[i]:offsets[i + 1]]``, outermost first. Flat arrays, so a long trace's 100,000s of paths
    take a few bytes each (as tuples in a dict they took 50 MiB while made at 2 GB)."""

    starts: np.ndarray
    offsets: np.ndarray
    members: np.ndarray

    @classmethod
    def empty(cls) -> Paths:
        return cls(np.zeros(0, dtype=np.int64), np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.starts)

    def index(self, positions: np.ndarray) -> np.ndarray:
        """Each position's index among :attr:`starts`; ``len(self)`` for a position that has no path here."""
        at = np.minimum(np.searchsorted(self.starts, positions), max(len(self.starts) - 1, 0))
        found = self.starts[at] == positions if len(self.starts) else np.zeros(len(positions), dtype=bool)
        return np.where(found, at, len(self.starts))

    def of(self, start: int) -> tuple[int, ...]:
        """The path of the scope event at position ``start`` (KeyError if it has none here)."""
        i = int(self.index(np.array([start], dtype=np.int64))[0])
        if i == len(self.starts):
            raise KeyError(start)
        return tuple(self.members[self.offsets[i]:self.offsets[i + 1]].tolist())

    def as_dict(self) -> dict[int, tuple[int, ...]]:
        """Every path, by its scope event (for tests and small traces)."""
        return {start: self.of(start) for start in self.starts.tolist()}


def chains(positions: np.ndarray, parent: np.ndarray, is_module: np.ndarray) -> Paths:
    """For each scope event (positions, in any order; one path each), the modules it is nested in and itself,
    outermost first: the path the ``module`` column shows (``GPT_0/Block_3/Linear_12``). A frame is its own path.
    ``is_module``: whether each event is a module (its :func:`scope_kind` is :data:`MODULE`; the kinds themselves are
    not needed here, so a caller lets go of them first).

    Each module's link to the next module up is found for all of them at once (:func:`_module_links`), and then,
    a level a round from the top, each one's depth and how many events the walk from it up to the top passes.
    A walk passes at most :data:`_MAX_DEPTH` events (a longer chain is a cycle): a path whose walk would pass more,
    or that never reaches the top (a cycle of modules), is walked event by event (:func:`_walk`), as far as that.
    """
    starts = np.unique(np.asarray(positions, dtype=np.int64))
    in_starts = np.flatnonzero(is_module[starts])
    modules = starts[in_starts]
    linked, up, hops = _module_links(modules, parent, is_module)
    above = np.searchsorted(linked, up)  # where each one's module above is among the linked (all are there)
    above[up < 0] = -1
    depth = np.where(above < 0, 1, 0)  # 0: not known yet
    passed = np.where(above < 0, hops, 0)
    pending = np.flatnonzero(above >= 0)
    for _ in range(_MAX_DEPTH + 1):
        known = depth[above[pending]] > 0
        ready, pending = pending[known], pending[~known]
        if not len(ready):
            break
        depth[ready] = depth[above[ready]] + 1
        passed[ready] = passed[above[ready]] + hops[ready]
    at = np.searchsorted(linked, modules)
    whole = (depth[at] > 0) & (passed[at] <= _MAX_DEPTH)  # else walked event by event
    lengths = np.ones(len(starts), dtype=np.int64)
    lengths[in_starts[whole]] = depth[at[whole]]
    walked = {int(i): _walk(int(starts[i]), parent, is_module) for i in in_starts[~whole].tolist()}
    for i, path in walked.items():
        lengths[i] = len(path)
    offsets = np.zeros(len(starts) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    members = np.empty(int(offsets[-1]), dtype=np.int64)
    frames = np.flatnonzero(~is_module[starts])
    members[offsets[frames]] = starts[frames]
    rows, node, level = in_starts[whole], at[whole], np.zeros(int(whole.sum()), dtype=np.int64)
    while len(rows):  # each path from its own module up, written from its end (the innermost) back
        members[offsets[rows] + lengths[rows] - 1 - level] = linked[node]
        node, level = above[node], level + 1
        keep = node >= 0
        rows, node, level = rows[keep], node[keep], level[keep]
    for i, path in walked.items():
        members[offsets[i]:offsets[i + 1]] = path
    return Paths(starts, offsets, members)


def _module_links(modules: np.ndarray, parent: np.ndarray, is_module: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The modules and every module above them (positions, ascending), with the nearest module strictly above
    each (-1: none) and how many events the walk up from it passes before that one (itself included; to the top
    where none), a level a round."""
    linked: list[np.ndarray] = []
    ups: list[np.ndarray] = []
    passes: list[np.ndarray] = []
    seen = np.zeros(0, dtype=np.int64)
    todo = np.unique(modules.astype(np.int64))
    while len(todo):
        found = np.full(len(todo), -1, dtype=np.int64)
        passed = np.ones(len(todo), dtype=np.int64)
        at = parent[todo].astype(np.int64)
        live = np.flatnonzero(at >= 0)
        for _ in range(_MAX_DEPTH):
            if not len(live):
                break
            here = at[live]
            hit = is_module[here]
            found[live[hit]] = here[hit]
            rest = live[~hit]
            passed[rest] += 1
            at[rest] = parent[at[rest]]
            live = rest[at[rest] >= 0]
        passed[live] += _MAX_DEPTH  # still walking after so many rounds: a cycle, walked event by event
        linked.append(todo)
        ups.append(found)
        passes.append(passed)
        seen = np.union1d(seen, todo)
        above = np.unique(found[found >= 0])
        todo = above[~np.isin(above, seen)]
    if not linked:
        return seen, seen.copy(), seen.copy()
    positions = np.concatenate(linked)
    order = np.argsort(positions)
    return positions[order], np.concatenate(ups)[order], np.concatenate(passes)[order]


def _walk(start: int, parent: np.ndarray, is_module: np.ndarray) -> tuple[int, ...]:
    """The modules on the walk up from ``start`` (itself included) over at most :data:`_MAX_DEPTH` events, outermost
    first."""
    path, at = [], start
    for _ in range(_MAX_DEPTH):
        if at < 0:
            break
        if is_module[at]:
            path.append(at)
        at = int(parent[at])
    return tuple(reversed(path))


def path_name(names: list[str | None]) -> str | None:
    """The ``module`` column's text for a path of scope event names."""
    shown = [scope_name(n) for n in names if n is not None]
    return "/".join(n for n in shown if n) or None
