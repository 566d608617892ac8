"""Each launch call's operator and that operator's scope, in one pass over a trace's host events, a piece at a time.

docs/analyses.md, "Operators" and "Module", define the rules; :mod:`.op_stats` (``Operators._attribute``) and
:mod:`.op_scope` apply them to arrays of every host event at once, walking up parent chains. This module gets the
same answers from the events a piece at a time (a row group's), keeping nothing per host event
(docs/architecture.md, "Memory"): what a walk up from an event would find is a function of what the walk from its
parent finds and of the event itself, so each event's *state* is made from its parent's:

- the nearest module's path (an id of :class:`ScopeTexts`: the names of the modules from the outermost in, interned
  by (outer path, name)), the nearest user frame, the sequence number of the nearest backward event (autograd's
  ``fwd_thread_id``) and the nearest checkpoint marker or backward node (:mod:`.recompute`), each itself included;
- the same four, and its position, for the nearest ``cpu_op`` and for the nearest counted one (a snapshot taken at
  that op), which is what a launch call's operator is and what its scope comes from.

A piece's events are settled parents first, a level of the tree at a time. A parent in an earlier piece is found
in the *carry*: the states of the events some later piece's event names as parent (:class:`BackRefs`, found in a
pass over the parent ids first), each kept until its last such piece. An event whose parent comes in a later piece
waits, with its descendants, until that piece. So memory follows a piece and the events open across pieces (a few
thousand at 4 GB of trace), not the trace. The launch calls go to the caller as they are settled
(:meth:`Attribution.take_launches`, with each one's operator); each operator that launched work goes, with its scope
and recompute flag, into a log the caller may keep on disk (:class:`~.op_owners.OwnerLog`), given back by position
once the trace is read (:meth:`Attribution.owner_chunks`). Pure: numpy in, arrays out.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, fields

import numpy as np

from .event_index import narrow
from .op_owners import OwnerLog, Owners
from .op_scope import FRAME, MODULE, path_name
from .recompute import KIND_MARKER
from .sorted_values import ValueLog

# An event's state: its nearest module path, frame, backward sequence number and recompute kind (each itself
# included); then its nearest operator's position, the same four at that operator (recomputed: a flag) and the same
# for its nearest counted operator. -1 for none (0 for a recompute kind and a flag).
PATH, FRAME_ID, BACKWARD, RECOMPUTE = 0, 1, 2, 3
OP, COUNTED = 4, 9  # each: position, path, frame, backward sequence number, recomputed
WIDTH = 14
_ROOT = np.array([-1, -1, -1, 0, -1, -1, -1, -1, 0, -1, -1, -1, -1, 0], dtype=np.int64)


class ScopeTexts:
    """The ``module`` texts of scopes: module paths interned by (outer path, module name), frames by name."""

    def __init__(self, names: list[str | None]) -> None:
        #: The names events' word ids point at (the caller's list; it may grow between pieces).
        self.names = names
        #: Each id's text (:func:`.op_scope.path_name`; None where it shows nothing).
        self.texts: list[str | None] = []
        self._paths: list[tuple[str | None, ...]] = []
        self._modules: dict[tuple[int, int], int] = {}
        self._frames: dict[int, int] = {}
        self._frame_of = np.full(1, -1, dtype=np.int64)

    def modules(self, outer: np.ndarray, word: np.ndarray) -> np.ndarray:
        """The path id of a module named ``word`` inside the path ``outer`` (-1: at the top), for each pair."""
        span = len(self.names) + 1
        pairs, inverse = np.unique((outer.astype(np.int64) + 1) * span + (word + 1), return_inverse=True)
        found = np.array([self._module(p // span - 1, p % span - 1) for p in pairs.tolist()], dtype=np.int64)
        return found[inverse.reshape(-1)]

    def frames(self, word: np.ndarray) -> np.ndarray:
        """The id of each frame named ``word`` (a frame is a path of its own)."""
        if len(self._frame_of) < len(self.names) + 1:  # by name, -1 where not made yet (the last: no name)
            grown = np.full(len(self.names) + 1, -1, dtype=np.int64)
            grown[:len(self._frame_of) - 1] = self._frame_of[:-1]
            grown[-1] = self._frame_of[-1]
            self._frame_of = grown
        found = self._frame_of[word]
        for w in np.unique(word[found < 0]).tolist():
            self._frame_of[w] = self._frame(int(w) if w < len(self.names) else -1)
        return self._frame_of[word]

    def _module(self, outer: int, word: int) -> int:
        key = (outer, word)
        if (found := self._modules.get(key)) is None:
            names = (*(self._paths[outer] if outer >= 0 else ()), self.names[word] if word >= 0 else None)
            found = self._modules[key] = self._add(names)
        return found

    def _frame(self, word: int) -> int:
        if (found := self._frames.get(word)) is None:
            found = self._frames[word] = self._add((self.names[word] if word >= 0 else None,))
        return found

    def _add(self, names: tuple[str | None, ...]) -> int:
        self._paths.append(names)
        self.texts.append(path_name(list(names)))
        return len(self.texts) - 1


@dataclass
class BackRefs:
    """Of one trace's events named as parent by an event of a later piece: their positions (ascending) and the
    last piece (its number) that names each."""

    positions: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    last: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    @classmethod
    def of(cls, pieces: list[tuple[int, int, np.ndarray]]) -> BackRefs:
        """From (piece number, first position, its events' parent positions) of each piece."""
        found = [(parent[(parent >= 0) & (parent < first)], number) for number, first, parent in pieces]
        if not found or not sum(len(p) for p, _ in found):
            return cls()
        positions = np.concatenate([p for p, _ in found]).astype(np.int64)
        last = np.concatenate([np.full(len(p), n, dtype=np.int64) for p, n in found])
        order = np.lexsort((-last, positions))  # each position's last piece first
        positions, last = positions[order], last[order]
        first = np.concatenate([[True], positions[1:] != positions[:-1]])
        return cls(positions[first], last[first])

    def until_of(self, positions: np.ndarray, consecutive: int) -> np.ndarray:
        """:meth:`until` of ``positions`` (ascending; consecutive from index ``consecutive`` on: those are found by
        the range of back references they span, not one by one)."""
        found = np.full(len(positions), -1, dtype=np.int64)
        if consecutive < len(positions):
            first = int(positions[consecutive])
            low, high = np.searchsorted(self.positions, [first, int(positions[-1]) + 1])
            found[self.positions[low:high] - first + consecutive] = self.last[low:high]
        if consecutive:
            found[:consecutive] = self.until(positions[:consecutive])
        return found

    def until(self, positions: np.ndarray) -> np.ndarray:
        """The last piece naming each of ``positions`` as parent (-1: none)."""
        at = np.minimum(np.searchsorted(self.positions, positions), max(len(self.positions) - 1, 0))
        hit = (self.positions[at] == positions) if len(self.positions) else np.zeros(len(positions), dtype=bool)
        return np.where(hit, self.last[at] if len(self.last) else -1, -1)


@dataclass
class LaunchRows:
    """Launch calls as they are settled: correlation id, start, duration, their operator's position (-1: none),
    their own position and whether each is named like a graph launch."""

    correlation: np.ndarray
    ts_ns: np.ndarray
    dur_ns: np.ndarray
    owner: np.ndarray
    position: np.ndarray
    graph: np.ndarray

    @classmethod
    def joined(cls, pieces: list[LaunchRows]) -> LaunchRows:
        """The pieces' calls, one after the other."""
        return cls(*(np.concatenate([getattr(piece, f.name) for piece in pieces]) for f in fields(cls)))

    def take(self, rows: np.ndarray) -> LaunchRows:
        """The calls at ``rows`` (indices)."""
        return LaunchRows(*(getattr(self, f.name)[rows] for f in fields(self)))


@dataclass
class Events:
    """Host events as fed to :class:`Attribution`, positions ascending: each one's position, its parent's (-1: none),
    its :class:`~.event_flags.EventFlags` bits, its name's index into :attr:`ScopeTexts.names` (-1: none; wanted for
    modules and frames only) and the sequence number it carries as a backward event (-1: none); which of them are
    launch calls (indices, ascending) with their correlation ids, starts, durations and whether each is named like a
    graph launch; which are forward events
    (indices, ascending) with their sequence numbers and event ids."""

    position: np.ndarray
    parent: np.ndarray
    bits: np.ndarray
    word: np.ndarray
    sequence: np.ndarray
    launch: np.ndarray
    correlation: np.ndarray
    ts_ns: np.ndarray
    dur_ns: np.ndarray
    graph: np.ndarray
    forward: np.ndarray
    forward_sequence: np.ndarray
    forward_id: np.ndarray

    @classmethod
    def empty(cls) -> Events:
        return cls(*(np.zeros(0, dtype=bool if name == "graph" else np.int64) for name in _FIELDS))

    def __len__(self) -> int:
        return len(self.position)

    def then(self, other: Events) -> Events:
        """These events followed by ``other``."""
        if not len(self):
            return other
        rows = len(self)
        return Events(*(np.concatenate([mine, theirs + rows if name in ("launch", "forward") else theirs])
                        for name, mine, theirs in zip(_FIELDS, self.columns(), other.columns(), strict=True)))

    def take(self, keep: np.ndarray) -> Events:
        """The events where ``keep`` (a mask) holds."""
        renumber = np.cumsum(keep) - 1
        launch, forward = keep[self.launch], keep[self.forward]
        return Events(self.position[keep], self.parent[keep], self.bits[keep], self.word[keep], self.sequence[keep],
                      renumber[self.launch[launch]], self.correlation[launch], self.ts_ns[launch],
                      self.dur_ns[launch], self.graph[launch], renumber[self.forward[forward]],
                      self.forward_sequence[forward], self.forward_id[forward])

    def columns(self) -> tuple[np.ndarray, ...]:
        return tuple(getattr(self, name) for name in _FIELDS)


_FIELDS = ("position", "parent", "bits", "word", "sequence", "launch", "correlation", "ts_ns", "dur_ns", "graph",
           "forward", "forward_sequence", "forward_id")


class Attribution:
    """One trace's host events, fed a piece at a time (:meth:`add`), then :meth:`owner_chunks`.
    ``log``: where the operators that launched work wait until then (:class:`~.op_owners.OwnerLog`; in memory
    when none is given)."""

    def __init__(self, refs: BackRefs, texts: ScopeTexts, log: ValueLog | None = None) -> None:
        self.refs, self.texts = refs, texts
        self._pending = Events.empty()
        self._carry_at = np.zeros(0, dtype=np.int64)
        self._dtype: type[np.signedinteger] = np.int32  # the states' integers: int64 once a value needs it
        self._carry = np.zeros((0, WIDTH), dtype=self._dtype)
        self._carry_until = np.zeros(0, dtype=np.int64)
        # the launch calls settled since the caller last took them (:meth:`take_launches`); per piece, the owners'
        # position, path, frame, backward sequence number and whether recomputed (as narrow as their values allow)
        self._launches: list[LaunchRows] = []
        self._owners = OwnerLog(log)  # position, scope (module path, else frame), recomputed
        self._deferred: list[np.ndarray] = []  # (position, backward sequence number) of those with no module
        self._forward: list[list[np.ndarray]] = [[], [], []]  # forward events' sequence numbers, ids and paths
        self._any_backward = False

    def add(self, number: int, events: Events) -> None:
        """The events of piece ``number`` (pieces numbered in the order fed; positions consecutive, after every
        earlier piece's)."""
        self._any_backward |= bool((events.sequence >= 0).any())
        if self._dtype is np.int32 and len(events) and max(int(events.sequence.max()), int(events.position[-1])) \
                >= 2**31:
            self._dtype = np.int64
            self._carry = self._carry.astype(np.int64)
        waiting = len(self._pending)
        self._pending = self._settle(self._pending.then(events), number, waiting)

    def owner_chunks(self) -> Iterator[Owners]:
        """The answers, once every piece is in: the operators that launched work, by position, a chunk at a time.
        Events still waiting (a parent chain that loops, which the parse never writes) are settled with their loop
        cut. Asked once."""
        if len(self._pending):
            self._pending = self._settle(self._pending, -1, len(self._pending), final=True)
        fixed = None
        if self._any_backward and self._forward[0] and self._deferred:  # the forward op's module, by sequence number
            sequence, ids, paths = (_joined(column) for column in self._forward)
            order = np.lexsort((ids, sequence))  # of each sequence number, the lowest id first
            del ids
            sequence, paths = sequence[order], paths[order]
            first = np.concatenate([[True], sequence[1:] != sequence[:-1]])
            sequence, paths = sequence[first], paths[first]
            deferred = np.concatenate(self._deferred)
            deferred = deferred[np.unique(deferred[:, 0], return_index=True)[1]]  # by position, each once
            at = np.minimum(np.searchsorted(sequence, deferred[:, 1]), len(sequence) - 1)
            hit = (sequence[at] == deferred[:, 1]) & (paths[at] >= 0)  # a forward op with no module: the frame
            fixed = (deferred[hit, 0], paths[at[hit]].astype(np.int64))
        self._forward, self._deferred = [[], [], []], []
        return self._owners.chunks(fixed)

    def take_launches(self) -> LaunchRows | None:
        """The launch calls settled since the last call (None: none), let go here."""
        taken, self._launches = self._launches, []
        if not taken:
            return None
        return LaunchRows.joined(taken)

    def waiting_floor(self) -> int | None:
        """The least correlation id of the launch calls still waiting for a parent (None: none waits): a call
        settled later has an id no lower than this, or than those of the pieces still to come."""
        ids = self._pending.correlation
        return int(ids.min()) if len(ids) else None

    def _settle(self, events: Events, number: int, waiting: int, *, final: bool = False) -> Events:
        """Settle what of ``events`` can be (those from ``waiting`` on have consecutive positions); return the
        events that wait."""
        n = len(events)
        if not n:
            return events
        position, parent = events.position, events.parent
        local = _locate(position, parent, waiting)
        if final:
            local[local == np.arange(n)] = -1  # a loop of one
        is_local = local >= 0
        until = self.refs.until_of(position, waiting)
        # an event no other names as parent, that is neither a launch call nor a forward event, adds nothing: a
        # leaf (a third of a trace's events) is not settled at all
        needed = np.bincount(local[is_local], minlength=n) > 0
        needed[events.launch] = True
        needed[events.forward] = True
        needed |= until >= 0
        elsewhere = np.flatnonzero(~is_local & (parent >= 0))  # parents in the carry, or to come: few
        carried = np.zeros(n, dtype=np.int64)
        in_carry = np.zeros(n, dtype=bool)
        if len(self._carry_at) and len(elsewhere):
            at = np.minimum(np.searchsorted(self._carry_at, parent[elsewhere]), len(self._carry_at) - 1)
            carried[elsewhere] = at
            in_carry[elsewhere] = self._carry_at[at] == parent[elsewhere]
        lost = (parent >= 0) & ~is_local & ~in_carry
        if not final and (lost & (parent < position[-1])).any():
            raise RuntimeError("a parent was let go before its last child came")  # a bug, never bad input
        root = (parent < 0) | (lost if final else False)
        state = np.empty((n, WIDTH), dtype=self._dtype)
        # a leaf that changes nothing of its parent's state (a launch call: no operator, scope, mark or name that
        # counts) takes its parent's state once that is settled, outside the walk down the levels
        plain = needed & (events.bits == 0) & (events.sequence < 0) & (until < 0)
        plain[local[is_local & needed]] = False
        plain[events.forward] = False
        done = ~needed | plain
        kids = np.flatnonzero(is_local & ~done)
        kids = kids[np.argsort(local[kids], kind="stable")]  # each event's children, together: bounds[i]:bounds[i + 1]
        bounds = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(local[kids], minlength=n), out=bounds[1:])
        frontier = np.flatnonzero((root | in_carry) & needed)
        above = self._carry[carried[frontier]] if len(self._carry) else np.empty((len(frontier), WIDTH), self._dtype)
        above[root[frontier]] = _ROOT
        while True:
            while len(frontier):
                state[frontier] = self._step(position[frontier], events.bits[frontier], events.word[frontier],
                                             events.sequence[frontier], above)
                done[frontier] = True
                low = bounds[frontier]
                counts = bounds[frontier + 1] - low
                frontier = kids[np.repeat(low - np.cumsum(counts) + counts, counts) + np.arange(int(counts.sum()))]
                above = state[local[frontier]]
            if not final or done.all():
                break
            frontier = np.flatnonzero(~done)[:1]  # a loop: its first event as a root
            above = _ROOT[None, :].astype(self._dtype)
        done[plain] = False
        plain = np.flatnonzero(plain)
        mine = plain[(is_local[plain] & done[local[plain]]) | in_carry[plain] | root[plain]]  # a parent settled
        inside = is_local[mine]
        state[mine[inside]] = state[local[mine[inside]]]
        outside = mine[~inside]
        state[outside] = self._carry[carried[outside]] if len(self._carry) else _ROOT
        state[outside[root[outside]]] = _ROOT
        done[mine] = True
        self._emit(events, state, done & needed, until, number)
        return events.take(~done & needed)

    def _step(self, position: np.ndarray, bits: np.ndarray, word: np.ndarray, sequence: np.ndarray,
              above: np.ndarray) -> np.ndarray:
        """The states of events (their positions, flags' bits, names and backward sequence numbers) from their
        parents' states ``above``."""
        bits = bits.astype(np.int64)
        kind, recompute = (bits >> 2) & 3, (bits >> 4) & 3
        state = above.copy()
        module = np.flatnonzero(kind == MODULE)
        if len(module):
            state[module, PATH] = self.texts.modules(above[module, PATH], word[module])
        frame = np.flatnonzero(kind == FRAME)
        if len(frame):
            state[frame, FRAME_ID] = self.texts.frames(word[frame])
        backward = sequence >= 0
        state[backward, BACKWARD] = sequence[backward]
        state[recompute != 0, RECOMPUTE] = recompute[recompute != 0]
        for start, test in ((OP, 1), (COUNTED, 3)):  # an operator, then a counted one: a snapshot of its own state
            at = np.flatnonzero((bits & test) == test)
            if len(at):
                state[at, start] = position[at]
                state[at, start + 1:start + 4] = state[at, PATH:RECOMPUTE]
                state[at, start + 4] = (recompute[at] == 0) & (above[at, RECOMPUTE] == KIND_MARKER)
        return state

    def _emit(self, events: Events, state: np.ndarray, settled: np.ndarray, until: np.ndarray, number: int) -> None:
        """Keep what the answer needs of the ``settled`` events, and carry those a later piece names as parent."""
        mine = settled[events.launch]
        launch = events.launch[mine]
        if len(launch):
            found = state[launch]
            owner = np.where((found[:, COUNTED] >= 0)[:, None], found[:, COUNTED:COUNTED + 5], found[:, OP:OP + 5])
            self._launches.append(LaunchRows(events.correlation[mine], events.ts_ns[mine], events.dur_ns[mine],
                                             owner[:, 0].copy(), events.position[launch], events.graph[mine]))
            owner = owner[owner[:, 0] >= 0]
            if len(owner):
                owner = owner[np.unique(owner[:, 0], return_index=True)[1]]
                # its module's path, else its frame (9 bytes an operator); one with no module under a backward mark
                # takes its forward op's module where that has one, found at the end
                deferred = (owner[:, 1] < 0) & (owner[:, 3] >= 0)
                if deferred.any():
                    self._deferred.append(owner[deferred][:, [0, 3]].astype(np.int64))
                self._owners.add(owner[:, 0], np.where(owner[:, 1] >= 0, owner[:, 1], owner[:, 2]), owner[:, 4] > 0)
        mine = settled[events.forward]
        if mine.any():  # 12 bytes a forward event, where each fits 4 (a training trace marks every forward op)
            for column, values in zip(self._forward, (events.forward_sequence[mine], events.forward_id[mine],
                                                      state[events.forward[mine], PATH]), strict=True):
                column.append(narrow(values))
        keep = self._carry_until > number
        new = np.flatnonzero(settled & (until > number))
        at = np.concatenate([self._carry_at[keep], events.position[new]])
        order = np.argsort(at, kind="stable")
        self._carry_at = at[order]
        self._carry = np.concatenate([self._carry[keep], state[new]])[order]
        self._carry_until = np.concatenate([self._carry_until[keep], until[new]])[order]


def _locate(position: np.ndarray, parent: np.ndarray, consecutive: int) -> np.ndarray:
    """The index among ``position`` (ascending; consecutive from index ``consecutive`` on) of each parent; -1 where
    it is not there."""
    n = len(position)
    local = np.full(n, -1, dtype=np.int64)
    first = int(position[consecutive]) if consecutive < n else int(position[-1]) + 1
    inside = (parent >= first) & (parent <= int(position[-1]))
    local[inside] = parent[inside] - first + consecutive
    if consecutive:
        rest = np.flatnonzero((parent >= 0) & (parent < first))
        at = np.minimum(np.searchsorted(position[:consecutive], parent[rest]), consecutive - 1)
        hit = position[at] == parent[rest]
        local[rest[hit]] = at[hit]
    return local


def _joined(pieces: list[np.ndarray], kind: type[np.generic] | None = None) -> np.ndarray:
    """The pieces as one array (of ``kind``, else of the widest of theirs), each piece let go as it is copied in."""
    whole = np.empty(sum(len(piece) for piece in pieces),
                     dtype=kind or (np.result_type(*pieces) if pieces else np.int64))
    at = 0
    while pieces:
        piece = pieces.pop(0)
        whole[at:at + len(piece)] = piece
        at += len(piece)
    return whole
