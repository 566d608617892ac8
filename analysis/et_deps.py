"""Data dependencies between the operators of a PyTorch execution trace (docs/formats.md, "PyTorch execution trace").

An execution trace (table ``et_nodes``) lists every record function with the tensors it
read and wrote, in the order they finished. A read depends on the write that produced the
data: :func:`data_edges` finds, for each tensor an operator reads, the operator that last
wrote that data before it, and returns one edge per producer-consumer pair, keyed by the
record function ids a Kineto trace of the same run carries (``Record function id``, or
``External id`` in traces older than PyTorch 2.1), so the edges can order host ops.

The rule, exactly:

- Data is identified by its **storage id** (``input_storages``/``output_storages``): views and
  in-place ops share their base's storage, and a storage freed and allocated again starts a
  new history at the op that allocates it (which lists it as an output). Storage id 0 (a
  tensor without storage) is never followed.
- Only nodes with an ``rf_id`` take part, as producers and as consumers.
- Nodes are taken in ``position`` order (the file's order, the order they finished). For a
  consumer C reading storage S, the producer is the last node before C in that order that
  wrote S, **not counting C's own ancestors and descendants** in ``ctrl_deps``: nesting
  already orders a node against those (a parent's own write of its output comes after its
  children's, and what C's children write is not what C read). An op writing its own input
  in place is no edge to itself: its producer is the writer before it.
- Each (producer, consumer) pair counts once; ``tensor`` is the smallest storage id that
  links them. A read with no earlier writer (parameters, inputs made before the trace
  started) has no edge.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np
import polars as pl

#: Columns :func:`data_edges` needs.
NEEDS = ("node_id", "parent_id", "position", "rf_id", "input_storages", "output_storages")

SCHEMA = {"trace_id": pl.String, "src_rf_id": pl.Int64, "dst_rf_id": pl.Int64, "tensor": pl.Int64}


def data_edges(et_nodes: pl.DataFrame) -> pl.DataFrame:
    """The producer -> consumer edges between operators of each trace in ``et_nodes`` (the module's rule).

    Args:
        et_nodes: rows of table ``et_nodes`` (one or more traces); ``trace_id`` is optional when
            the frame holds one trace.

    Returns:
        ``trace_id``, ``src_rf_id`` (the producer), ``dst_rf_id`` (the consumer) and ``tensor``
        (a storage id linking them), sorted by trace, consumer and producer.

    Raises:
        KeyError: a column of :data:`NEEDS` is missing.
    """
    missing = [c for c in NEEDS if c not in et_nodes.columns]
    if missing:
        raise KeyError(f"et_nodes lacks the columns {missing}")
    frame = et_nodes if "trace_id" in et_nodes.columns else et_nodes.with_columns(trace_id=pl.lit(None, pl.String))
    rows: list[tuple[str | None, int, int, int]] = []
    for (trace_id,), nodes in frame.sort("position").group_by(["trace_id"], maintain_order=True):
        rows.extend((trace_id, src, dst, tensor) for src, dst, tensor in _trace_edges(nodes))
    return pl.DataFrame(rows, schema=SCHEMA, orient="row").sort(["trace_id", "dst_rf_id", "src_rf_id"])


def _trace_edges(nodes: pl.DataFrame) -> list[tuple[int, int, int]]:
    """Edges (src rf_id, dst rf_id, storage) of one trace whose rows are in position order."""
    node_ids: list[int] = nodes["node_id"].to_list()
    parents: list[int | None] = nodes["parent_id"].to_list()
    inside = _Nesting(node_ids, parents)
    # Once a node that writes S has finished (everything inside it is listed before it), no later node can
    # take a write of S by one of its descendants as its producer: it finds the node's own write first, or
    # skips both as its own descendants. Dropping those keeps deep nesting over one storage linear.
    finished = inside.finished()
    writers: dict[int, list[tuple[int, int]]] = defaultdict(list)  # storage -> [(node, rf_id)] in order
    best: dict[tuple[int, int], int] = {}
    for node, rf_id, reads, writes in zip(node_ids, nodes["rf_id"].to_list(), nodes["input_storages"].to_list(),
                                          nodes["output_storages"].to_list(), strict=True):
        if rf_id is None:
            continue
        for storage in set(reads or ()):
            if not storage:
                continue
            for writer, writer_rf in reversed(writers.get(storage, ())):
                if not inside.related(writer, node):
                    key = (writer_rf, rf_id)
                    best[key] = min(storage, best.get(key, storage))
                    break
        for storage in set(writes or ()):
            if storage:
                written = writers[storage]
                while node in finished and written and inside.related(written[-1][0], node):
                    written.pop()
                written.append((node, rf_id))
    return [(src, dst, tensor) for (src, dst), tensor in best.items()]


class _Nesting:
    """Answers "is one node the other's ancestor?" in O(1) from pre/post-order numbers of the ``ctrl_deps`` forest.

    A parent id that names no node (or the node itself) makes a root. Built without recursion,
    so nesting depth does not matter; a loop (the parser refuses those) leaves its nodes unnumbered,
    related to nothing.
    """

    def __init__(self, node_ids: Sequence[int], parents: Sequence[int | None]) -> None:
        known = set(node_ids)
        children: dict[int, list[int]] = defaultdict(list)
        roots: list[int] = []
        for node, parent in zip(node_ids, parents, strict=True):
            if parent is None or parent == node or parent not in known:
                roots.append(node)
            else:
                children[parent].append(node)
        self._enter: dict[int, int] = {}
        self._leave: dict[int, int] = {}
        self._order = {node: index for index, node in enumerate(node_ids)}
        self._last_inside: dict[int, int] = {}  # the latest position of a node's descendants (-1: none)
        clock = 0
        for root in roots:
            stack: list[tuple[int, bool]] = [(root, False)]
            while stack:
                node, leaving = stack.pop()
                clock += 1
                if leaving:
                    self._leave[node] = clock
                    self._last_inside[node] = max(
                        (max(self._order[c], self._last_inside[c]) for c in children.get(node, ())), default=-1)
                    continue
                self._enter[node] = clock
                stack.append((node, True))
                stack.extend((child, False) for child in children.get(node, ()))

    def finished(self) -> set[int]:
        """The nodes listed after every node inside them."""
        return {node for node, last in self._last_inside.items() if last < self._order[node]}

    def related(self, a: int, b: int) -> bool:
        """True when ``a`` is ``b``'s ancestor or descendant (or ``b`` itself)."""
        if a not in self._leave or b not in self._leave:
            return a == b
        return (self._enter[a] <= self._enter[b] and self._leave[b] <= self._leave[a]) or (
            self._enter[b] <= self._enter[a] and self._leave[a] <= self._leave[b])


def host_rows(edges: pl.DataFrame, host: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """The rows of ``host`` (one rank's ``host_ops``) that each edge's producer and consumer are.

    Operators are named by record function id: Kineto's ``Record function id`` of a ``cpu_op``
    (``record_function_id``), or, in traces older than PyTorch 2.1 that have none, its ``External id``
    (docs/formats.md, "PyTorch execution trace"). Edges whose ends are not both found are left out.
    """
    ops = host.with_row_index("row").filter(pl.col("cat") == "cpu_op")
    key = "record_function_id" if ops["record_function_id"].is_not_null().any() else "external_id"
    by_id = ops.filter(pl.col(key).is_not_null()).group_by(key).agg(pl.col("row").first()).rename({key: "rf"})
    linked = (edges.select(pl.col("src_rf_id").alias("rf"), "dst_rf_id").join(by_id, on="rf")
              .rename({"row": "src"}).drop("rf").join(by_id.rename({"rf": "dst_rf_id"}), on="dst_rf_id"))
    return linked["src"].to_numpy().astype(np.int64), linked["row"].to_numpy().astype(np.int64)
