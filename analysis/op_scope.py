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
    """The events with a ``sequence_number`` (positions ``rows``, ascending), its value ``seq`` and whether each is a
    backward event (``backward``: a ``fwd_thread_id`` above 0)."""

    rows: np.ndarray
    seq: np.ndarray
    backward: np.ndarray

    @classmethod
    def empty(cls) -> Autograd:
        return cls(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool))


def nearest(start: np.ndarray, parent: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """For each start position, the nearest event on its parent chain (itself included) where ``mask`` holds; -1
    for none. Walks up one level a round over the chains not yet settled."""
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


def scopes(calls: np.ndarray, parent: np.ndarray, kind: np.ndarray, autograd: Autograd, ids: np.ndarray) -> np.ndarray:
    """The position of the scope event of each call (positions ``calls``; -1 for none), by the rule of the module
    docstring. ``kind`` is :func:`scope_kind` of every event, ``parent`` each event's parent position and ``ids``
    its ``event_id`` (of the forward events of a sequence number, the lowest id is its forward)."""
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
            order = np.lexsort((ids[row_fwd], seq_fwd))  # of each sequence number, its lowest event id first
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


def chains(positions: np.ndarray, parent: np.ndarray, kind: np.ndarray) -> dict[int, tuple[int, ...]]:
    """For each scope event (positions, each once), the modules it is nested in and itself, outermost first: the
    path the ``module`` column shows (``GPT_0/Block_3/Linear_12``). A frame is its own path.

    Each module's link to the next module up is found for all of them at once (:func:`_module_links`), and a path
    is its parent module's plus itself, each made once. A walk passes at most :data:`_MAX_DEPTH` events (a longer
    chain is a cycle): a path whose walk would pass more is walked event by event (:func:`_walk`), as far as that.
    """
    found: dict[int, tuple[int, ...]] = {}
    is_module = kind == MODULE
    starts = positions[is_module[positions]] if len(positions) else positions
    for start in positions[~is_module[positions]].tolist() if len(positions) else []:
        found[start] = (start,)
    up, hops = _module_links(np.unique(starts), parent, is_module)
    made: dict[int, tuple[tuple[int, ...], int]] = {}  # a module's path and how many events its walk passes
    for start in starts.tolist():
        chain: list[int] = []
        at = start
        while at >= 0 and at not in made and len(chain) <= _MAX_DEPTH:
            chain.append(at)
            at = up[at]
        if len(chain) > _MAX_DEPTH:
            found[start] = _walk(start, parent, kind)
            continue
        path, passed = made[at] if at >= 0 else ((), 0)
        for module in reversed(chain):
            path, passed = (*path, module), passed + hops[module]
            made[module] = (path, passed)
        found[start] = path if passed <= _MAX_DEPTH else _walk(start, parent, kind)
    return found


def _module_links(modules: np.ndarray, parent: np.ndarray, is_module: np.ndarray) -> tuple[dict[int, int],
                                                                                           dict[int, int]]:
    """For the modules and every module above them: the nearest module strictly above each (-1: none) and how many
    events the walk up from it passes before that one (itself included; to the top where none), a level a round."""
    up: dict[int, int] = {}
    hops: dict[int, int] = {}
    todo = modules.astype(np.int64)
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
        up.update(zip(todo.tolist(), found.tolist()))
        hops.update(zip(todo.tolist(), passed.tolist()))
        above = np.unique(found[found >= 0])
        todo = above[[int(a) not in up for a in above.tolist()]] if len(above) else above
    return up, hops


def _walk(start: int, parent: np.ndarray, kind: np.ndarray) -> tuple[int, ...]:
    """The modules on the walk up from ``start`` (itself included) over at most :data:`_MAX_DEPTH` events, outermost
    first."""
    path, at = [], start
    for _ in range(_MAX_DEPTH):
        if at < 0:
            break
        if kind[at] == MODULE:
            path.append(at)
        at = int(parent[at])
    return tuple(reversed(path))


def path_name(names: list[str | None]) -> str | None:
    """The ``module`` column's text for a path of scope event names."""
    shown = [scope_name(n) for n in names if n is not None]
    return "/".join(n for n in shown if n) or None
