"""Which host events run as a recomputation (activation checkpointing): the FLOPs HFU counts and MFU does not.

docs/analyses.md, "Operators", "HFU and MFU": a forward op that checkpointing re-runs inside the backward pass sits
under a checkpoint marker on its thread's parent chain: the backward node of a reentrant checkpoint
(``CheckpointFunctionBackward``, and the engine's ``autograd::engine::evaluate_function: CheckpointFunctionBackward``
around it) or an annotation naming a recomputation (``record_function("recompute ...")``). An event is recomputed
when, walking up from it, the first ancestor that is a marker or a backward node is a marker: the gradient ops a
checkpoint's backward runs afterwards sit under their own backward nodes (``AddmmBackward0``) and are not. Pure:
numpy and polars in, a mask out.
"""

from __future__ import annotations

import re

import numpy as np
import polars as pl

from .op_scope import nearest

#: A checkpoint marker: the backward node of a checkpoint, or an annotation naming a recomputation.
MARKER = re.compile(r"checkpoint\w*backward|recompute", re.IGNORECASE)
#: A backward node (autograd's ``*Backward0`` nodes and the engine's ``evaluate_function: ...Backward0``).
BACKWARD = re.compile(r"backward", re.IGNORECASE)

_NONE, _MARKER, _BACKWARD = 0, 1, 2
KIND_NONE, KIND_MARKER, KIND_BACKWARD = _NONE, _MARKER, _BACKWARD  # what a host event is, for the rule


def recompute_kind(name: str | None) -> int:
    """:data:`KIND_MARKER` for a checkpoint marker, :data:`KIND_BACKWARD` for a backward node, else
    :data:`KIND_NONE`."""
    return _kind(name)


def recomputed(calls: np.ndarray, parent: np.ndarray, kind: np.ndarray) -> np.ndarray:
    """Whether each call (positions into ``parent``/``kind``, every event's parent position and
    :func:`recompute_kind`) runs as a recomputation: it is neither kind itself and the nearest marker-or-backward
    ancestor is a marker."""
    above = parent[calls] if len(calls) else np.zeros(0, dtype=np.int64)
    found = nearest(above, parent, kind != _NONE)
    return (kind[calls] == _NONE) & (found >= 0) & (kind[np.maximum(found, 0)] == _MARKER)


def _kind(name: str | None) -> int:
    if not name:
        return _NONE
    if MARKER.search(name):
        return _MARKER
    return _BACKWARD if BACKWARD.search(name) else _NONE


def recomputed_mask(event_id: np.ndarray, parent_id: np.ndarray, names: pl.Series) -> np.ndarray:
    """For each host event that is neither a marker nor a backward node, whether its nearest marker-or-backward
    ancestor is a marker.

    Args:
        event_id: every host event's id (any order; unique).
        parent_id: each one's parent id, -1 (or any id not in ``event_id``) for none.
        names: each one's name.
    """
    n = len(event_id)
    if not n:
        return np.zeros(0, dtype=bool)
    words = names.cast(pl.String)
    kinds = {w: _kind(w) for w in words.unique().to_list()}
    kind = words.replace_strict(kinds, default=_NONE, return_dtype=pl.Int8).fill_null(_NONE).to_numpy()
    order = np.argsort(event_id, kind="stable")
    ids = event_id[order]
    at = np.minimum(np.searchsorted(ids, parent_id), n - 1)
    parent = np.where((parent_id >= 0) & (ids[at] == parent_id), order[at], -1)
    owner = nearest(parent, parent, kind != _NONE)  # the nearest marker-or-backward ancestor, itself excluded
    settled = np.where(owner >= 0, kind[np.maximum(owner, 0)], _NONE)
    return (settled == _MARKER) & (kind == _NONE)  # a marker or backward node is not itself recomputed work


def recomputed_events(host: pl.DataFrame) -> pl.Series:
    """The ``event_id`` of every host event that runs as a recomputation (``host``: ``event_id``, ``parent_id``,
    ``name``, as ``host_ops`` stores them)."""
    host = host.filter(pl.col("event_id").is_not_null())
    mask = recomputed_mask(host["event_id"].to_numpy().astype(np.int64),
                           host["parent_id"].fill_null(-1).to_numpy().astype(np.int64), host["name"])
    return host["event_id"].filter(pl.Series(mask))
