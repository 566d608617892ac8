"""PyTorch execution traces (Chakra ET JSON): the parser, ``et_nodes``, and the data edges between operators.

The real ET and the Kineto trace of the same run (HTA's execution-trace test data) are in
../shared/real_traces; the tests that need them skip when it is absent. The edges are checked
against a second implementation written here from the raw JSON (ancestors as sets, a scan
backwards), and against hand-made traces whose dependencies are known.
"""

from __future__ import annotations

import gc
import gzip
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from support import REAL_KINETO, REAL_TRACES, ROOT
from tracelake import ingest
from tracelake.analysis.et_deps import data_edges
from tracelake.api.cli import app
from tracelake.contracts.errors import TraceFormatError
from tracelake.ingest import ParseOptions, execution_trace
from tracelake.warehouse import Warehouse

REAL_ET = REAL_TRACES / "pytorch_other" / "hta_execution_trace" / "benchmark_simple_add_et.json.gz"
REAL_RUN_KINETO = REAL_KINETO / "hta_execution_trace" / "benchmark_simple_add_trace.json.gz"
needs_real = pytest.mark.skipif(not (REAL_ET.is_file() and REAL_RUN_KINETO.is_file()),
                                reason="../shared/real_traces (execution trace and its Kineto trace) is absent")


# -- hand-made traces --------------------------------------------------------------------

def tensor(tid: int, storage: int, numel: int = 16) -> list[object]:
    """A tensor argument as recent schemas write it: [tensor id, storage id, offset, numel, itemsize, device]."""
    return [tid, storage, 0, numel, 4, "cuda:0"]


def op(node_id: int, name: str, parent: int, rf_id: int | None, reads: Sequence[list[object]] = (),
       writes: Sequence[list[object]] = ()) -> dict[str, Any]:
    """A node in the 1.0.2+ shape (``ctrl_deps``, ``inputs``/``outputs`` objects, ``attrs``)."""
    attrs = [{"name": "fw_parent", "type": "uint64", "value": 0}, {"name": "seq_id", "type": "int64", "value": -1},
             {"name": "scope", "type": "uint64", "value": 0}, {"name": "tid", "type": "uint64", "value": 1},
             {"name": "fw_tid", "type": "uint64", "value": 0},
             {"name": "op_schema", "type": "string", "value": f"{name}(Tensor self) -> Tensor"}]
    if rf_id is not None:
        attrs.insert(0, {"name": "rf_id", "type": "uint64", "value": rf_id})
    return {"id": node_id, "name": name, "ctrl_deps": parent,
            "inputs": {"values": [*reads, 1.0], "shapes": [[16]] * len(reads) + [[]],
                       "types": ["Tensor(float)"] * len(reads) + ["Double"]},
            "outputs": {"values": list(writes), "shapes": [[16]] * len(writes),
                        "types": ["Tensor(float)"] * len(writes)},
            "attrs": attrs}


def roots() -> list[dict[str, Any]]:
    """The process and thread nodes every trace has (the process names itself as its parent)."""
    return [op(1, "[pytorch|profiler|execution_trace|process]", 1, 0),
            op(2, "[pytorch|profiler|execution_trace|thread]", 1, 0)]


def et_doc(nodes: list[Any]) -> dict[str, Any]:
    return {"schema": "1.0.2-chakra.0.0.4", "pid": 7, "time": "2026-12-04 10:00:00", "start_ts": 1, "finish_ts": 2,
            "nodes": nodes}


def write_et(path: Path, doc: object) -> Path:
    path.write_text(json.dumps(doc))
    return path


def et_frame(path: Path) -> pl.DataFrame:
    nodes = pl.from_arrow(ingest.parse(path).tables["et_nodes"])
    assert isinstance(nodes, pl.DataFrame)
    return nodes


def edges_of(path: Path) -> set[tuple[int, int, int]]:
    nodes = et_frame(path)
    return {(r["src_rf_id"], r["dst_rf_id"], r["tensor"]) for r in data_edges(nodes).iter_rows(named=True)}


def test_a_chain_gives_one_edge_per_link(tmp_path: Path) -> None:
    # a writes X; b reads X, writes Y; c reads Y. Nodes are listed as they finish.
    nodes = [*roots(), op(3, "a", 2, 30, writes=[tensor(1, 100)]),
             op(4, "b", 2, 40, reads=[tensor(1, 100)], writes=[tensor(2, 200)]),
             op(5, "c", 2, 50, reads=[tensor(2, 200)], writes=[tensor(3, 300)])]
    assert edges_of(write_et(tmp_path / "chain.json", et_doc(nodes))) == {(30, 40, 100), (40, 50, 200)}


def test_a_fan_out_gives_an_edge_to_each_reader_and_a_pair_counts_once(tmp_path: Path) -> None:
    nodes = [*roots(), op(3, "a", 2, 30, writes=[tensor(1, 100), tensor(2, 200)]),
             op(4, "b", 2, 40, reads=[tensor(1, 100)]), op(5, "c", 2, 50, reads=[tensor(1, 100)]),
             op(6, "d", 2, 60, reads=[tensor(2, 200), tensor(1, 100)])]  # two tensors of a: one edge, smallest storage
    assert edges_of(write_et(tmp_path / "fan.json", et_doc(nodes))) == {(30, 40, 100), (30, 50, 100), (30, 60, 100)}


def test_an_in_place_op_is_the_producer_of_what_it_overwrote(tmp_path: Path) -> None:
    # a writes X; relu_ reads and writes X (in place); c reads X: c depends on relu_, not on a; no self edge.
    nodes = [*roots(), op(3, "a", 2, 30, writes=[tensor(1, 100)]),
             op(4, "relu_", 2, 40, reads=[tensor(1, 100)], writes=[tensor(1, 100)]),
             op(5, "c", 2, 50, reads=[tensor(9, 100)])]  # a view: another tensor id, the same storage
    assert edges_of(write_et(tmp_path / "inplace.json", et_doc(nodes))) == {(30, 40, 100), (40, 50, 100)}


def test_nesting_is_no_data_edge_and_a_parent_produces_for_later_ops(tmp_path: Path) -> None:
    # rand(3) { empty(4) writes X; uniform_(5) reads/writes X } then add(6) reads X; listed as they finish.
    # A later copy_(8) inside a wrapper(7) that read X itself reads X too, and a node without rf_id is ignored.
    nodes = [*roots(), op(4, "aten::empty", 3, 41, writes=[tensor(1, 100)]),
             op(5, "aten::uniform_", 3, 51, reads=[tensor(1, 100)], writes=[tensor(1, 100)]),
             op(3, "aten::rand", 2, 31, writes=[tensor(1, 100)]),
             op(6, "aten::add", 2, 61, reads=[tensor(1, 100)], writes=[tensor(2, 200)]),
             op(9, "no_rf_id", 2, None, writes=[tensor(2, 200)]),
             op(8, "aten::copy_", 7, 81, reads=[tensor(2, 200)], writes=[tensor(3, 300)]),
             op(7, "wrapper", 2, 71, reads=[tensor(2, 200), tensor(3, 300)], writes=[tensor(3, 300)])]
    assert edges_of(write_et(tmp_path / "nested.json", et_doc(nodes))) == {
        (41, 51, 100),  # uniform_ overwrites what empty allocated
        (31, 61, 100),  # add reads rand's output: rand finished last among its writers
        (61, 81, 200),  # the node without rf_id takes no part
        (61, 71, 200),  # wrapper's own child copy_ wrote storage 300 inside it: no edge from a descendant
    }


def test_the_old_flat_shape_reads_the_same(tmp_path: Path) -> None:
    def flat(node: dict[str, Any]) -> dict[str, Any]:
        out = {"id": node["id"], "name": node["name"], "parent": node["ctrl_deps"]}
        out.update({a["name"]: a["value"] for a in node["attrs"]})
        for side in ("input", "output"):
            out[f"{side}s"] = node[f"{side}s"]["values"]
            out[f"{side}_shapes"] = node[f"{side}s"]["shapes"]
            out[f"{side}_types"] = node[f"{side}s"]["types"]
        return out

    nodes = [*roots(), op(3, "a", 2, 30, writes=[tensor(1, 100)]), op(4, "b", 2, 40, reads=[tensor(1, 100)])]
    doc = {**et_doc([flat(n) for n in nodes]), "schema": "1.0.1"}
    path = write_et(tmp_path / "flat.json", doc)
    assert edges_of(path) == {(30, 40, 100)}
    row = et_frame(path).filter(pl.col("node_id") == 4).row(0, named=True)
    assert (row["parent_id"], row["rf_id"], row["tid"], row["seq_id"], row["input_tensors"], row["input_storages"],
            row["input_shapes"], row["input_types"]) == (2, 40, 1, -1, [1], [100], "[[16],[]]",
                                                         '["Tensor(float)","Double"]')


def test_edges_are_per_trace_and_an_empty_frame_gives_none(tmp_path: Path) -> None:
    nodes = [*roots(), op(3, "a", 2, 30, writes=[tensor(1, 100)]), op(4, "b", 2, 40, reads=[tensor(1, 100)])]
    one = et_frame(write_et(tmp_path / "one.json", et_doc(nodes)))
    # the second trace reads storage 100 before anything in it writes it: no edge may cross from the first
    two = et_frame(write_et(tmp_path / "two.json", et_doc(nodes[:2] + nodes[:1:-1]))).with_columns(
        trace_id=pl.lit("second"))
    both = pl.concat([two, one.sort("position", descending=True)])
    assert data_edges(both).rows() == [(one["trace_id"][0], 30, 40, 100)]
    empty = data_edges(one.clear())
    assert empty.is_empty() and empty.columns == ["trace_id", "src_rf_id", "dst_rf_id", "tensor"]


def test_a_list_of_tensors_is_followed(tmp_path: Path) -> None:
    nodes = [*roots(), op(3, "a", 2, 30, writes=[tensor(1, 100)]), op(4, "b", 2, 40, writes=[tensor(2, 200)]),
             op(5, "aten::cat", 2, 50)]
    nodes[-1]["inputs"] = {"values": [[tensor(1, 100), tensor(2, 200)], 0], "shapes": [[[16], [16]], []],
                           "types": ["GenericList[Tensor(float),Tensor(float)]", "Int"]}
    path = write_et(tmp_path / "cat.json", et_doc(nodes))
    assert edges_of(path) == {(30, 50, 100), (40, 50, 200)}


# -- hostile input ----------------------------------------------------------------------

@pytest.mark.parametrize(("doc", "message", "where"), [
    ({"schema": "1.0.1", "nodes": {"id": 1}}, "not a list of nodes", "at nodes"),
    (et_doc([*roots(), "aten::add"]), "a node that is a str", "at nodes[2]"),
    (et_doc([*roots(), {**op(3, "a", 2, 30), "id": "3"}]), "node id '3' is not an integer", "at nodes[2].id"),
    (et_doc([*roots(), {**op(3, "a", 2, 30), "id": 1 << 70}]), "is not an integer", "at nodes[2].id"),
    (et_doc([*roots(), op(2, "again", 1, 5)]), "node id 2 appears twice (first at nodes[1])", "at nodes[2].id"),
    (et_doc([*roots(), {**op(3, "a", 2, 30), "ctrl_deps": "2"}]), "parent '2' is not a node id", "nodes[2].ctrl_deps"),
    (et_doc([*roots(), {**op(3, "a", 2, 30), "name": None}]), "node name None is not a string", "at nodes[2].name"),
    (et_doc([*roots(), {**op(3, "a", 2, 30), "attrs": {"rf_id": 3}}]), "'attrs' is a dict", "at nodes[2].attrs"),
    (et_doc([*roots(), op(3, "a", 2, 30, reads=[["x", 100, 0, 1, 4, "cpu"]])]), "a tensor argument",
     "at nodes[2].inputs.values[0]"),
    (et_doc([*roots(), op(3, "a", 4, 30), op(4, "b", 3, 40)]), "its own ancestor through ctrl_deps", "ctrl_deps"),
])
def test_malformed_nodes_are_refused_naming_file_and_place(tmp_path: Path, doc: object, message: str,
                                                           where: str) -> None:
    path = write_et(tmp_path / "rank-3.et.json", doc)
    assert ingest.detect(path).name == execution_trace.FORMAT
    with pytest.raises(TraceFormatError) as caught:
        ingest.parse(path)
    assert "rank-3.et.json" in str(caught.value) and message in str(caught.value), str(caught.value)
    assert where in str(caught.value), str(caught.value)
    assert gc.isenabled()  # the parser turns the collector off while it reads, and back on whatever happens


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers(-(1 << 70), 1 << 70) | st.floats(allow_nan=False)
                           | st.text(max_size=8), lambda inner: st.lists(inner, max_size=6), max_leaves=12)
NODE_KEYS = ("id", "name", "ctrl_deps", "inputs", "outputs", "attrs", "parent")


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
          derandomize=True)
@given(edits=st.lists(st.tuples(st.integers(0, 5), st.sampled_from(NODE_KEYS), JSON_VALUES), min_size=1, max_size=4))
def test_any_damage_to_nodes_is_a_format_error_or_parses(tmp_path: Path,
                                                        edits: list[tuple[int, str, object]]) -> None:
    nodes = [*roots(), op(3, "a", 2, 30, writes=[tensor(1, 100)]),
             op(4, "b", 2, 40, reads=[tensor(1, 100)], writes=[tensor(2, 200)]),
             op(5, "c", 2, 50, reads=[tensor(2, 200)]), op(6, "d", 5, 60, reads=[tensor(1, 100)])]
    for index, key, value in edits:
        if key in ("inputs", "outputs") and isinstance(value, list) and isinstance(nodes[index][key], dict):
            nodes[index][key]["values"] = value  # damage inside the argument lists too
        else:
            nodes[index][key] = value
    path = write_et(tmp_path / "damaged.json", et_doc(nodes))
    try:
        nodes_frame = et_frame(path)
    except TraceFormatError as exc:
        assert str(exc).startswith("damaged.json: ")
        return
    assert nodes_frame.height == len(nodes)
    data_edges(nodes_frame)


def test_deep_nesting_is_refused_not_a_crash(tmp_path: Path) -> None:
    deep = "[" * 200_000 + "]" * 200_000
    path = tmp_path / "deep.json"
    prefix = '{"schema": "1.0.1", "nodes": [{"id": 1, "name": "x [{", "inputs": '  # a bracket in a string: no level
    path.write_text(prefix + deep + "}]}")
    at = len(prefix) + (901 - 3) - 1  # the prefix opens 3 levels; the 901st level opens at this byte
    with pytest.raises(TraceFormatError, match=rf"deep\.json: JSON nested more than 900 deep: not an execution "
                       rf"trace at byte {at}$"):
        ingest.parse(path)


def test_lists_of_tensors_nested_past_the_limit_are_refused(tmp_path: Path) -> None:
    value: object = tensor(1, 100)
    for _ in range(40):
        value = [value]
    node = op(3, "a", 2, 30)
    node["inputs"] = {"values": [value], "shapes": [[]], "types": ["GenericList[Tensor(float)]"]}
    with pytest.raises(TraceFormatError, match=r"nested more than 32 deep at nodes\[2\]\.inputs\.values\[0\]"):
        ingest.parse(write_et(tmp_path / "lists.json", et_doc([*roots(), node])))


def test_a_deep_chain_of_nested_ops_needs_no_recursion(tmp_path: Path) -> None:
    depth = 5_000  # each op inside the one before (past the recursion limit): found without recursion, in linear time
    nodes = [*roots()] + [op(3 + i, f"op{i}", 2 + i, 100 + i, reads=[tensor(1, 100)], writes=[tensor(1, 100)])
                          for i in range(depth)][::-1]  # innermost finishes first
    nodes.append(op(5 + depth, "after", 2, 99, reads=[tensor(1, 100)]))
    assert edges_of(write_et(tmp_path / "deep-chain.json", et_doc(nodes))) == {(100, 99, 100)}


def test_a_gzip_bomb_is_refused_while_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "bomb.json.gz"
    path.write_bytes(gzip.compress(json.dumps(et_doc(roots())).encode() + b" " * (8 << 20)))
    options = ParseOptions(source_name="bomb.json.gz", max_expansion_ratio=10)
    with pytest.raises(TraceFormatError, match=r"bomb\.json\.gz: expands to more than"):
        execution_trace.parse(path, tmp_path, options)
    assert not list(tmp_path.glob("*.parquet"))  # nothing partial


# -- format detection -------------------------------------------------------------------

def test_detection_takes_ets_and_leaves_every_sample_to_its_own_parser(tmp_path: Path) -> None:
    et = write_et(tmp_path / "et.json", et_doc(roots()))
    assert ingest.detect(et).name == "execution_trace"
    samples = [p for p in (ROOT / "sample_traces").rglob("*") if p.is_file() and not p.name.endswith((".md", ".py"))]
    assert samples
    for sample in samples:
        try:
            assert ingest.detect(sample).name != "execution_trace", sample
        except TraceFormatError:
            pass  # not a trace at all (a generator's helper file)
    kineto_like = write_et(tmp_path / "k.json", {"schemaVersion": 1, "traceEvents": [], "schema": "x", "nodes": []})
    assert ingest.detect(kineto_like).name == "pytorch_profiler"


# -- the real execution trace -----------------------------------------------------------

def raw_doc() -> dict[str, Any]:
    with gzip.open(REAL_ET, "rt") as f:
        doc: dict[str, Any] = json.load(f)
    return doc


def reference_edges(doc: dict[str, Any]) -> set[tuple[int, int, int]]:
    """The edges by the rule of tracelake.analysis.et_deps, from the raw JSON: ancestors as sets, scanning back."""
    nodes = doc["nodes"]
    parent = {n["id"]: n["parent"] for n in nodes}

    def ancestors(node_id: int) -> set[int]:
        found: set[int] = set()
        while parent.get(node_id) not in (None, node_id) and node_id not in found:
            node_id = parent[node_id]
            found.add(node_id)
        return found

    def storages(values: list[object], types: list[str]) -> set[int]:
        return {v[1] for v, t in zip(values, types, strict=True) if t.startswith("Tensor") and isinstance(v, list)}

    pairs: dict[tuple[int, int], int] = {}
    for i, consumer in enumerate(nodes):
        for storage in storages(consumer["inputs"], consumer["input_types"]):
            for j in range(i - 1, -1, -1):  # scan back for the last writer outside the consumer's nesting
                producer = nodes[j]
                if storage not in storages(producer["outputs"], producer["output_types"]):
                    continue
                if producer["id"] in ancestors(consumer["id"]) or consumer["id"] in ancestors(producer["id"]):
                    continue
                key = (producer["rf_id"], consumer["rf_id"])
                pairs[key] = min(pairs.get(key, storage), storage)
                break
    return {(src, dst, tensor) for (src, dst), tensor in pairs.items()}


def kineto_ops() -> dict[int, str]:
    """The name of each Kineto ``cpu_op`` of the same run by its record function id.

    PyTorch 2.1+ writes ``Record function id``; this run is older and its ``External id`` is the
    record function id (HTA correlates this very pair that way).
    """
    with gzip.open(REAL_RUN_KINETO, "rt") as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("cat") == "cpu_op"]
    key = "Record function id" if any("Record function id" in e.get("args", {}) for e in events) else "External id"
    return {int(e["args"][key]): e["name"] for e in events if key in e.get("args", {})}


@needs_real
def test_the_real_et_gives_one_row_per_node() -> None:
    doc = raw_doc()
    parsed = ingest.parse(REAL_ET)
    nodes = pl.from_arrow(parsed.tables["et_nodes"])
    assert isinstance(nodes, pl.DataFrame)
    assert parsed.info.format == "execution_trace" and doc["schema"] == "1.0.1"
    assert nodes.height == len(doc["nodes"]) == parsed.info.event_count == 38
    assert parsed.info.pid == doc["pid"] and parsed.info.rank == 0 and parsed.info.warnings
    assert nodes["node_id"].to_list() == [n["id"] for n in doc["nodes"]]
    assert nodes.filter(pl.col("parent_id").is_null())["name"].to_list() == [
        "[pytorch|profiler|execution_trace|process]"]
    # listed as they finish: every node comes before its parent, but for the thread root, written when tracing starts
    position = dict(zip(nodes["node_id"], nodes["position"], strict=True))
    names = dict(zip(nodes["node_id"], nodes["name"], strict=True))
    assert all(position[c] < position[p] for c, p in zip(nodes["node_id"], nodes["parent_id"], strict=True)
               if p is not None and not names[p].startswith("[pytorch|profiler|execution_trace|"))
    assert names[doc["nodes"][0]["id"]] == "[pytorch|profiler|execution_trace|thread]"
    add = nodes.filter(pl.col("rf_id") == 22).row(0, named=True)
    assert (add["name"], add["input_tensors"], add["input_storages"], add["output_storages"]) == (
        "aten::add", [6, 11], [7, 12], [38])


@needs_real
def test_the_real_et_edges_equal_an_independent_scan() -> None:
    nodes = et_frame(REAL_ET)
    edges = data_edges(nodes)
    got = {(r["src_rf_id"], r["dst_rf_id"], r["tensor"]) for r in edges.iter_rows(named=True)}
    assert got == reference_edges(raw_doc())
    assert edges.height == len(got) == 16  # each pair once
    names = dict(zip(nodes["rf_id"], nodes["name"], strict=True))
    assert (names[2], names[22]) == ("aten::rand", "aten::add") and (2, 22, 7) in got  # add reads rand's output


@needs_real
def test_every_edge_end_is_a_kineto_op_of_the_same_run_with_the_same_name() -> None:
    nodes = et_frame(REAL_ET)
    edges = data_edges(nodes)
    ends = set(edges["src_rf_id"]) | set(edges["dst_rf_id"])
    ops = kineto_ops()
    names = dict(zip(nodes["rf_id"], nodes["name"], strict=True))
    matched = {rf for rf in ends if rf in ops}
    assert matched == ends and len(ends) == 24, f"{len(matched)} of {len(ends)} rf_ids are Kineto cpu_ops"
    assert all(ops[rf] == names[rf] for rf in ends)
    # and every ET operator (scope 0) is a Kineto cpu_op of its name
    operators = nodes.filter(pl.col("scope") == 0)
    assert all(ops.get(rf) == name for rf, name in zip(operators["rf_id"], operators["name"], strict=True))


@needs_real
def test_an_et_beside_its_kineto_trace_in_one_job_is_queryable_and_analyzable(tmp_path: Path) -> None:
    wh = Warehouse(tmp_path / "wh")
    report = wh.ingest([REAL_ET, REAL_RUN_KINETO], job="simple-add")
    assert report.ok, [r.error for r in report.results]
    assert sorted(wh.query("SELECT format FROM traces").rows) == [("execution_trace",), ("pytorch_profiler",)]
    tensors_read = sum(t.startswith("Tensor") for n in raw_doc()["nodes"] for t in n["input_types"])
    rows = wh.query("SELECT count(*), count(rf_id), sum(len(input_storages)) FROM et_nodes WHERE job = 'simple-add'")
    assert rows.rows == [(38, 38, tensors_read)] and tensors_read == 24
    joined = wh.query(
        "SELECT e.name, e.rf_id, e.output_shapes FROM et_nodes e JOIN traces t USING (trace_id) "
        "WHERE t.format = 'execution_trace' AND e.name = 'aten::add' ORDER BY e.rf_id")
    assert joined.rows == [("aten::add", 22, "[[256,256]]"), ("aten::add", 36, "[[256,256]]")]
    analysis = wh.analyze(job="simple-add")
    assert analysis is not None
    result = CliRunner().invoke(app, ["analyze", "--job", "simple-add", "--home", str(tmp_path / "wh")])
    assert result.exit_code == 0, result.output


@needs_real
def test_an_et_alone_ingests_and_its_job_analyzes(tmp_path: Path) -> None:
    wh = Warehouse(tmp_path / "wh")
    assert wh.ingest([REAL_ET], job="et-only").ok
    assert wh.query("SELECT count(*) FROM et_nodes").rows == [(38,)]
    assert wh.query("SELECT count(*) FROM device_ops").rows == [(0,)]
    wh.analyze(job="et-only")
    result = CliRunner().invoke(app, ["analyze", "--job", "et-only", "--home", str(tmp_path / "wh")])
    assert result.exit_code == 0, result.output


def test_a_bad_et_writes_nothing_and_a_good_one_beside_it_still_ingests(tmp_path: Path) -> None:
    good = write_et(tmp_path / "good.json", et_doc([*roots(), op(3, "a", 2, 30, writes=[tensor(1, 100)])]))
    bad = write_et(tmp_path / "bad.json", et_doc([*roots(), {**op(3, "a", 2, 30), "id": None}]))
    wh = Warehouse(tmp_path / "wh")
    report = wh.ingest([bad, good], job="mixed")
    assert [r.ok for r in report.results] == [False, True]
    assert "bad.json" in (report.results[0].error or "") and "nodes[2].id" in (report.results[0].error or "")
    assert wh.query("SELECT count(*) FROM et_nodes").rows == [(3,)]
    assert wh.query("SELECT count(*) FROM traces").rows == [(1,)]
