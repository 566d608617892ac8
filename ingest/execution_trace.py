"""PyTorch execution traces (Chakra ET JSON) into ``et_nodes``.

An execution trace (docs/formats.md, "PyTorch execution trace (Chakra ET)") is what
``torch.profiler.ExecutionTraceObserver`` writes: one JSON object per process with
``schema``, ``pid``, ``time``, ``start_ts``, ``finish_ts`` and ``nodes``, one node per
record function (operators, ``record_function`` labels, the process and thread roots).
Each node names its parent (``ctrl_deps``; ``parent`` before schema 1.0.2), its
``rf_id`` (the id the Kineto trace of the same run shows on the op), and its inputs and
outputs with their shapes and types; a tensor argument is a tuple whose first two entries
are the tensor id and the storage id. Two shapes are read: schema 1.0.1 keeps the
attributes and the ``input_*``/``output_*`` lists on the node itself; 1.0.2 and later
(``1.0.2-chakra.0.0.4``, ``1.1.x-chakra...``) nest them in ``inputs``/``outputs``
(``values``, ``shapes``, ``types``) and ``attrs`` (``[{name, type, value}]``).

The whole document is read at once (at most :data:`.source.MAX_WHOLE_BYTES`, and no more
than the expansion limit allows for the file's size, so a gzip bomb is refused while it
is read). JSON cannot share values the way a pickle can, so the rows never hold more
than the document. Malformed nodes are refused with the node's index and key; nothing
is written until every node has been read.
"""

from __future__ import annotations

import gc
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec

from tracelake.contracts.errors import TraceFormatError

from .model import ParseOptions, TraceInfo
from .source import MAX_WHOLE_BYTES, read_whole
from .tables import fit_int, fit_text, write_table

FORMAT = "execution_trace"

_RANK_IN_NAME = re.compile(r"(?:^|[^a-z])rank[-_]?(\d+)(?:[^0-9]|$)", re.IGNORECASE)
#: Node attributes copied to integer columns (the column is named as the attribute).
_INT_ATTRS = ("rf_id", "fw_parent", "seq_id", "scope", "tid", "fw_tid")
#: How deep a list of tensors may nest inside one argument (``GenericList[GenericList[Tensor]]``).
_MAX_LIST_DEPTH = 32
_COLUMNS = ("node_id", "parent_id", "position", "name", "rank", *_INT_ATTRS, "op_schema", "input_tensors",
            "input_storages", "output_tensors", "output_storages", "input_shapes", "output_shapes", "input_types",
            "output_types")
_JSON = msgspec.json.Encoder()


def sniff(head: bytes, filename: str) -> bool:
    """A JSON object with a ``schema`` string and a ``nodes`` list, and no ``traceEvents`` (Kineto, XLA JSON)."""
    text = head.lstrip()
    if not text.startswith(b"{") or b'"traceEvents"' in head:
        return False
    return re.search(rb'"schema"\s*:\s*"', head) is not None and re.search(rb'"nodes"\s*:', head) is not None


def parse(source: Path, staging: Path, options: ParseOptions) -> TraceInfo:
    """Parse one process's execution trace into ``et_nodes``.

    Raises:
        TraceFormatError: invalid JSON, nested too deeply, larger than allowed once
            decompressed, no ``nodes`` list, or a malformed node (naming its index and key).
    """
    name = options.source_name
    limit = min(MAX_WHOLE_BYTES, options.expansion_limit(source.stat().st_size))
    data = read_whole(source, on_bytes=options.on_bytes, name=name, limit=limit)
    with _no_gc():
        return _parse_document(data, staging, options)


@contextmanager
def _no_gc() -> Iterator[None]:
    """The cyclic garbage collector off while the document's millions of lists are made (and back on after).

    They hold no cycles, but each collection would walk all of them: with it on, decoding alone
    takes five times longer.
    """
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def _parse_document(data: bytes, staging: Path, options: ParseOptions) -> TraceInfo:
    name = options.source_name
    try:
        doc = msgspec.json.decode(data)
    except RecursionError:
        depth, at = _DEEPEST, _too_deep_at(data)
        raise TraceFormatError(name, f"JSON nested more than {depth} deep: not an execution trace",
                               where=f"byte {at}" if at is not None else None) from None
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise TraceFormatError(name, f"invalid JSON ({exc})") from None
    if not isinstance(doc, dict) or "nodes" not in doc:
        raise TraceFormatError(name, "no 'nodes' key: not an execution trace", where="top level")
    nodes = doc["nodes"]
    if not isinstance(nodes, list):
        raise TraceFormatError(name, f"'nodes' is a {type(nodes).__name__}, not a list of nodes", where="nodes")
    rank, rank_source = _rank(name)
    rows: dict[str, list[object]] = {c: [] for c in _COLUMNS}
    seen: dict[int, int] = {}
    for index, node in enumerate(nodes):
        _node(node, index, name, rows, seen)
    rows["rank"] = [rank] * len(nodes)
    _refuse_cycles(rows["node_id"], rows["parent_id"], name)  # type: ignore[arg-type]
    write_table(staging, "et_nodes", rows, trace_id=options.trace_id)
    info = TraceInfo(format=FORMAT, event_count=len(nodes), uncompressed_bytes=len(data))
    info.rank, info.rank_source = rank, rank_source
    if rank_source == "default":
        info.warnings.append("an execution trace has no rank; none in the file name (e.g. rank-3.json) "
                             "either: assumed rank 0")
    info.pid = fit_int(doc.get("pid"))
    # start_ts/finish_ts are on the observer's own clock (not the epoch), so the trace's times stay null.
    return info


#: The depth reported for JSON the decoder refuses as nested too deeply (it stops near 1,000 levels).
_DEEPEST = 900


def _too_deep_at(data: bytes) -> int | None:
    """The byte where brackets first nest more than :data:`_DEEPEST` deep, outside strings (for the message)."""
    depth, in_string, escaped = 0, False, False
    for at, byte in enumerate(data):
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > _DEEPEST:
                return at
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return None


def _rank(source_name: str) -> tuple[int, str]:
    match = _RANK_IN_NAME.search(source_name)
    rank = fit_int(int(match.group(1)), 32) if match else None
    return (rank, "file name") if rank is not None else (0, "default")


def _node(node: object, index: int, name: str, rows: dict[str, list[object]], seen: dict[int, int]) -> None:
    """Append one node's row, or refuse it naming ``nodes[index]`` and the key."""
    where = f"nodes[{index}]"
    if not isinstance(node, dict):
        raise TraceFormatError(name, f"a node that is a {type(node).__name__}, not an object", where=where)
    node_id = fit_int(node.get("id"))
    if node_id is None:
        raise TraceFormatError(name, f"node id {_show(node.get('id'))} is not an integer", where=f"{where}.id")
    if node_id in seen:
        raise TraceFormatError(name, f"node id {node_id} appears twice (first at nodes[{seen[node_id]}])",
                               where=f"{where}.id")
    seen[node_id] = index
    parent_key = "ctrl_deps" if "ctrl_deps" in node else "parent"
    parent = node.get(parent_key)
    if isinstance(parent, list) and len(parent) <= 1:  # a Chakra converter's list form
        parent = parent[0] if parent else None
    if parent is not None and fit_int(parent) is None:
        raise TraceFormatError(name, f"parent {_show(parent)} is not a node id", where=f"{where}.{parent_key}")
    label = node.get("name")
    if not isinstance(label, str):
        raise TraceFormatError(name, f"node name {_show(label)} is not a string", where=f"{where}.name")
    attrs = _attrs(node, where, name)
    inputs = _arguments(node, "input", where, name)
    outputs = _arguments(node, "output", where, name)
    row: dict[str, object] = {
        "node_id": node_id, "parent_id": None if parent == node_id else parent, "position": index, "name": label,
        **{key: fit_int(attrs.get(key)) for key in _INT_ATTRS},
        "op_schema": fit_text(attrs.get("op_schema")),
        "input_tensors": inputs[0], "input_storages": inputs[1],
        "output_tensors": outputs[0], "output_storages": outputs[1],
        "input_shapes": inputs[2], "output_shapes": outputs[2], "input_types": inputs[3], "output_types": outputs[3],
    }
    for column, value in row.items():
        rows[column].append(value)


def _attrs(node: dict[str, Any], where: str, name: str) -> dict[str, object]:
    """The node's attributes by name: the ``attrs`` list (1.0.2+) over the node's own keys (1.0.1)."""
    found: dict[str, object] = {key: node.get(key) for key in (*_INT_ATTRS, "op_schema")}
    attrs = node.get("attrs")
    if attrs is None:
        return found
    if not isinstance(attrs, list):
        raise TraceFormatError(name, f"'attrs' is a {type(attrs).__name__}, not a list", where=f"{where}.attrs")
    for i, attr in enumerate(attrs):
        if not isinstance(attr, dict) or not isinstance(attr.get("name"), str):
            raise TraceFormatError(name, "an attribute that is not {name, type, value}", where=f"{where}.attrs[{i}]")
        found[attr["name"]] = attr.get("value")
    return found


def _arguments(node: dict[str, Any], side: str, where: str,
               name: str) -> tuple[list[int], list[int], str | None, str | None]:
    """Tensor ids, storage ids, shapes (JSON) and types (JSON) of one side (``input``/``output``) of a node."""
    key = f"{side}s"
    nested = node.get(key)
    if isinstance(nested, dict):  # 1.0.2+: {"values", "shapes", "types"}
        values, shapes, types = nested.get("values"), nested.get("shapes"), nested.get("types")
        place = f"{where}.{key}.values"
    else:  # 1.0.1: inputs, input_shapes, input_types on the node
        values, shapes, types = nested, node.get(f"{side}_shapes"), node.get(f"{side}_types")
        place = f"{where}.{key}"
    tensors: list[int] = []
    storages: list[int] = []
    if values is not None and not isinstance(values, list):
        raise TraceFormatError(name, f"{key} is a {type(values).__name__}, not a list", where=place)
    kinds = types if isinstance(types, list) else []
    for i, value in enumerate(values or ()):
        kind = kinds[i] if i < len(kinds) and isinstance(kinds[i], str) else ""
        if "Tensor" in kind:
            _tensors(value, kind.startswith("Tensor"), f"{place}[{i}]", name, tensors, storages)
    return tensors, storages, _as_json(shapes), _as_json(types)


def _tensors(value: object, single: bool, place: str, name: str, tensors: list[int], storages: list[int]) -> None:
    """Collect the (tensor id, storage id) of a tensor argument, or of each tensor in a list of them."""
    stack: list[tuple[object, bool, str, int]] = [(value, single, place, 0)]
    while stack:
        item, is_tensor, at, depth = stack.pop()
        if not isinstance(item, list):
            continue  # an undefined tensor ("<None>") or a scalar in a mixed list: no data to follow
        if is_tensor or _looks_like_tensor(item):
            ids = [fit_int(v) for v in item[:2]]
            if len(item) < 2 or None in ids:
                raise TraceFormatError(name, "a tensor argument that is not [tensor id, storage id, offset, numel, "
                                       "itemsize, device]", where=at)
            tensors.append(ids[0])  # type: ignore[arg-type]
            storages.append(ids[1])  # type: ignore[arg-type]
            continue
        if depth >= _MAX_LIST_DEPTH:
            raise TraceFormatError(name, f"lists of tensors nested more than {_MAX_LIST_DEPTH} deep", where=at)
        stack.extend((element, False, f"{at}[{j}]", depth + 1) for j, element in reversed(list(enumerate(item))))


def _looks_like_tensor(item: list[object]) -> bool:
    """An element of a ``GenericList[Tensor...]``: [tensor id, storage id, offset, numel, itemsize, device]."""
    return (len(item) == 6 and all(isinstance(v, int) and not isinstance(v, bool) for v in item[:5])
            and isinstance(item[5], str))


def _as_json(value: object) -> str | None:
    if value is None:
        return None
    return _JSON.encode(value).decode()


def _show(value: object) -> str:
    text = repr(value) if not isinstance(value, dict | list) else type(value).__name__
    return text if len(text) <= 40 else text[:37] + "..."


def _refuse_cycles(node_ids: list[int], parents: list[int | None], name: str) -> None:
    """Refuse a trace whose ``ctrl_deps`` loop (a node its own ancestor): nesting must be a forest."""
    parent_of = dict(zip(node_ids, parents, strict=True))
    done: set[int] = set()
    for start in node_ids:
        path: list[int] = []
        on_path: set[int] = set()
        node: int | None = start
        while node is not None and node in parent_of and node not in done:
            if node in on_path:
                raise TraceFormatError(name, f"node {node} is its own ancestor through ctrl_deps (a loop)",
                                       where=f"nodes[{node_ids.index(node)}].ctrl_deps")
            on_path.add(node)
            path.append(node)
            node = parent_of[node]
        done.update(path)
