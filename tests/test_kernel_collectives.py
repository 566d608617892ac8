"""Collectives derived from NCCL/RCCL kernels and Gloo CPU calls (docs/analyses.md, "Collectives derived from kernels").

Expected values come from the trace JSON read here with plain gzip/json (kernels
counted by name, their launch found by correlation, the enclosing ``nccl:`` op by
time on the launching thread), never from the parser's own output.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from tracelake.analysis import collectives
from tracelake.ingest import nccl_kernels, parse
from tracelake.ingest.kernel_collectives import cpu_collective
from tracelake.sample_traces.generate import SCENARIOS, write_scenario

#: The communication rule of docs/analyses.md, "Classification of device ops", written out again.
COMM = re.compile(r"(?i)^(nccl|rccl|hccl)|ncclkernel|nccldevkernel")
ANNOTATION_NAMES = {"nccl:all_reduce": "allreduce", "nccl:all_to_all": "all_to_all",
                    "nccl:_all_gather_base": "allgather", "nccl:broadcast": "broadcast"}
BYTES = {"float": 4, "long": 8, "int": 4, "unsigned char": 1, "signed char": 1, "c10::BFloat16": 2}


def _events(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as fh:
        return json.load(fh)["traceEvents"]


def _comm_kernels(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e.get("ph") == "X" and str(e.get("cat", "")).lower() == "kernel"
            and COMM.search(e.get("name", ""))]


def _rows(path: Path) -> tuple[int, pl.DataFrame]:
    parsed = parse(path)
    frame = pl.from_arrow(parsed.tables["collectives"])
    assert isinstance(frame, pl.DataFrame)
    return parsed.info.rank, frame.with_columns(pl.lit(parsed.info.rank, dtype=pl.Int32).alias("rank"))


# -- kernel names -----------------------------------------------------------------------

#: Names seen in public NCCL/RCCL sources and profiles, with what they say.
PUBLIC_NAMES = {
    # NCCL 2.19+ generated device kernels (src/device/generate.py: DEFINE_ncclDevKernel(<suffix>, ...)).
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL": ("allreduce", "RING", "LL", "sum", "Float"),
    "ncclDevKernel_AllReduce_Sum_f32_TREE_LL": ("allreduce", "TREE", "LL", "sum", "Float"),
    "ncclDevKernel_AllReduce_Sum_u32_RING_LL": ("allreduce", "RING", "LL", "sum", "UInt32"),
    "ncclDevKernel_Reduce_Sum_f32_RING_LL": ("reduce", "RING", "LL", "sum", "Float"),
    "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)":
        ("allreduce", "RING", "LL", "sum", "BFloat16"),
    "ncclDevKernel_ReduceScatter_Sum_f16_NVLS_SIMPLE": ("reduce_scatter", "NVLS", "SIMPLE", "sum", "Half"),
    "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)": ("allgather", "RING", "LL", None, None),
    "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)": ("sendrecv", None, None, None, None),
    # NCCL 2.19+ and RCCL generic kernels: the name says nothing.
    "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)": (None, None, None, None, None),
    "ncclDevKernel_Generic_1(ncclDevKernelArgsStorage<4096ul>)": (None, None, None, None, None),
    "ncclDevKernel_Generic_4": (None, None, None, None, None),
    # NCCL 2.7 to 2.18 (nvprof and nsys listings).
    "ncclKernel_AllReduce_RING_LL_Sum_half(ncclDevComm*, unsigned long, ncclWork*)":
        ("allreduce", "RING", "LL", "sum", "Half"),
    "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)": ("allreduce", "RING", "LL", "sum", "Float"),
    "ncclKernel_AllReduce_TREE_LL128_Prod___nv_bfloat16": ("allreduce", "TREE", "LL128", "prod", "BFloat16"),
    "ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)":
        ("broadcast", "RING", "LL", None, None),
    "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)":
        ("sendrecv", "RING", "SIMPLE", None, None),
    # NCCL 2.4 to 2.6 (Paddle profiler output) and before.
    "ncclAllReduceRingLLKernel_sum_f32(ncclColl)": ("allreduce", "RING", "LL", "sum", "Float"),
    "ncclAllReduceTreeLL128Kernel_max_f16(ncclColl)": ("allreduce", "TREE", "LL128", "max", "Half"),
    "ncclReduceScatterRingKernel_sum_bf16": ("reduce_scatter", "RING", "SIMPLE", "sum", "BFloat16"),
    "ncclAllGatherRingLLKernel_copy_i8": ("allgather", "RING", "LL", None, None),
    "ncclAllReduceLLKernel_sum_f32": ("allreduce", None, "LL", "sum", "Float"),
}


@pytest.mark.parametrize("name", sorted(PUBLIC_NAMES))
def test_public_kernel_names(name: str) -> None:
    form = nccl_kernels.parse(name)
    assert form is not None
    assert (form.collective, form.algorithm, form.protocol, form.reduction, form.dtype) == PUBLIC_NAMES[name]


@pytest.mark.parametrize("name", ["void at::native::vectorized_elementwise_kernel<4>(int)", "Memcpy DtoD",
                                  "ncclKernel_Bogus_RING_LL_Sum_float", "nccl_something_else"])
def test_other_names_say_nothing(name: str) -> None:
    assert nccl_kernels.parse(name) is None


@pytest.mark.slow  # reads real traces
def test_every_nccl_kernel_name_in_the_real_traces_parses(real_kineto: Path) -> None:
    names = {e["name"] for path in sorted(real_kineto.rglob("*.json.gz")) for e in _comm_kernels(_events(path))}
    assert names  # trace_filter, nccl_parser_config and the B200 trace have some
    for name in names:
        form = nccl_kernels.parse(name)
        assert form is not None and form.collective is not None, name
        assert form.algorithm in nccl_kernels.ALGORITHMS and form.protocol in nccl_kernels.PROTOCOLS, name


def test_cpu_op_names() -> None:
    assert [cpu_collective(n) for n in (
        "nccl:all_reduce", "nccl:_all_gather_base", "nccl:all_to_all", "gloo:broadcast", "c10d::allreduce_",
        "c10d::alltoall_base_", "c10d::_reduce_scatter_base_", "c10d::recv_any_source_", "aten::add",
    )] == ["allreduce", "allgather", "all_to_all", "broadcast", "allreduce", "all_to_all", "reduce_scatter",
           "recv", None]


# -- real traces ------------------------------------------------------------------------

def _expected_kernel_rows(events: list[dict[str, Any]]) -> dict[tuple[int, float], dict[str, Any]]:
    """Per NCCL kernel (stream, ts): the enclosing nccl: op's collective and input bytes, from the JSON."""
    launches = {e["args"]["correlation"]: e for e in events if e.get("ph") == "X"
                and e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    annotations = [e for e in events if e.get("ph") == "X" and e.get("name", "").startswith("nccl:")]
    out = {}
    for k in _comm_kernels(events):
        launch = launches[k["args"]["correlation"]]
        (ann,) = [a for a in annotations if a["tid"] == launch["tid"] and a["pid"] == launch["pid"]
                  and a["ts"] <= launch["ts"] <= a["ts"] + a["dur"]]
        (dims,), (dtype,) = ann["args"]["Input Dims"], ann["args"]["Input type"]
        elements = 1
        for d in dims:
            elements *= d
        out[k["args"]["stream"], k["ts"]] = {"collective": ANNOTATION_NAMES[ann["name"]],
                                             "in_bytes": elements * BYTES[dtype]}
    return out


@pytest.fixture(scope="module")
def trace_filter() -> dict[int, tuple[list[dict[str, Any]], pl.DataFrame]]:
    folder = Path(__file__).resolve().parent.parent.parent / "shared/real_traces/pytorch_profiler/trace_filter"
    if not folder.is_dir():
        pytest.skip("../shared/real_traces/pytorch_profiler/trace_filter is not present")
    out = {}
    for path in sorted(folder.glob("*.json.gz")):
        rank, frame = _rows(path)
        out[rank] = (_events(path), frame)
    return out


@pytest.mark.slow  # reads real traces
def test_trace_filter_has_a_row_per_nccl_kernel(trace_filter: dict[int, Any]) -> None:
    assert sorted(trace_filter) == [0, 1]
    for events, rows in trace_filter.values():
        kernels = _comm_kernels(events)
        expected = _expected_kernel_rows(events)
        assert len(kernels) == 10 and rows.height == len(kernels)
        assert rows["kernel_event_id"].n_unique() == len(kernels)
        assert set(rows["source"]) == {"kernel_name"}
        for row in rows.iter_rows(named=True):
            want = expected[row["stream"], events[row["kernel_event_id"]]["ts"]]
            assert row["collective"] == want["collective"]
            assert (row["algorithm"], row["protocol"]) == ("RING", "SIMPLE")
            if row["collective"] == "allreduce":  # the input is the whole message
                assert row["message_bytes"] == want["in_bytes"]
            else:  # all_to_all, allgather: the larger of input and output
                assert row["message_bytes"] >= want["in_bytes"]


@pytest.mark.slow  # reads real traces
def test_trace_filter_collectives_match_across_ranks(trace_filter: dict[int, Any]) -> None:
    frame = pl.concat([rows for _, rows in trace_filter.values()])
    inst = collectives.instances(frame)
    assert inst.height == 10 and set(inst["ranks"]) == {2}
    # Independently: per rank, kernels per stream in time order; streams numbered by first use.
    starts: dict[tuple[int, int], dict[int, float]] = defaultdict(dict)
    for rank, (events, _) in trace_filter.items():
        by_stream: dict[int, list[float]] = defaultdict(list)
        for k in _comm_kernels(events):
            by_stream[k["args"]["stream"]].append(k["ts"])
        order = sorted(by_stream, key=lambda s: min(by_stream[s]))
        for index, stream in enumerate(order):
            for seq, ts in enumerate(sorted(by_stream[stream]), 1):
                starts[index, seq][rank] = ts
    expected = sorted(round((max(r.values()) - min(r.values())) * 1000) for r in starts.values())
    assert sorted(inst["skew_ns"]) == expected
    assert max(expected) > 0  # there is skew to see


@pytest.mark.slow  # reads real traces
def test_nccl_parser_config_keeps_its_record_param_comms_rows(real_kineto: Path) -> None:
    path = next((real_kineto / "nccl_parser_config").glob("*.json.gz"))
    events = _events(path)
    calls = [e for e in events if e.get("name") == "record_param_comms" and "Collective name" in e["args"]]
    _, rows = _rows(path)
    assert rows.height == len(calls) == 27
    assert set(rows["source"]) == {"record_param_comms"}
    kernels = _comm_kernels(events)
    assert rows["kernel_event_id"].drop_nulls().n_unique() == len(kernels) == 21
    allreduce = rows.filter(pl.col("collective") == "allreduce")
    assert set(allreduce["algorithm"]) == {"RING"} and set(allreduce["protocol"]) == {"LL"}
    assert set(allreduce["reduction"]) == {"sum"}
    assert set(rows.filter(pl.col("collective") == "broadcast")["reduction"]) == {None}


@pytest.mark.slow  # reads real traces
@pytest.mark.parametrize("folder", ["trace_filter", "nccl_parser_config", "tracelens_b200_eager_trace"])
def test_every_nccl_kernel_belongs_to_a_collective(real_kineto: Path, folder: str) -> None:
    for path in sorted((real_kineto / folder).glob("*.json.gz")):
        events = _events(path)
        ids = {i for i, e in enumerate(events) if e.get("ph") == "X" and str(e.get("cat", "")).lower() == "kernel"
               and COMM.search(e.get("name", ""))}
        _, rows = _rows(path)
        assert ids and ids <= set(rows["kernel_event_id"].drop_nulls())


# -- generated traces -------------------------------------------------------------------

@pytest.fixture(scope="module")
def straggler_pair(tmp_path_factory: pytest.TempPathFactory) -> dict[bool, pl.DataFrame]:
    """``ddp_straggler`` (2 steps) with and without collective metadata, every rank's rows."""
    out = {}
    for metadata in (True, False):
        scenario = dataclasses.replace(SCENARIOS["ddp_straggler"], steps=2, comm_metadata=metadata)
        paths = write_scenario(tmp_path_factory.mktemp(f"meta{metadata}"), scenario)
        out[metadata] = pl.concat([_rows(p)[1] for p in paths])
        if not metadata:
            kernels = sum(len(_comm_kernels(_events(p))) for p in paths)
            assert out[metadata].height == kernels > 0
    return out


def test_generated_trace_without_metadata_gives_the_same_instances(straggler_pair: dict[bool, pl.DataFrame]) -> None:
    with_args, derived = straggler_pair[True], straggler_pair[False]
    assert set(with_args["source"]) == {"record_param_comms"} and set(derived["source"]) == {"kernel_name"}
    assert set(derived["process_group"]) == {"nccl-stream-0"}  # no pg_config in PyTorch <= 2.0 traces
    a = collectives.instances(with_args).select("seq", "collective", "ranks", "skew_ns", "last_rank")
    b = collectives.instances(derived).select("seq", "collective", "ranks", "skew_ns", "last_rank")
    assert a.height == b.height > 0
    assert b.to_dicts() == a.with_columns(pl.col("collective").replace({"_allgather_base": "allgather"})).to_dicts()
    sizes = derived.filter(pl.col("collective") == "allreduce").join(
        with_args.select("rank", "seq", pl.col("message_bytes").alias("want")), on=["rank", "seq"])
    assert sizes.height and (sizes["message_bytes"] == sizes["want"]).all()
    assert set(derived["reduction"].drop_nulls()) == {"sum"}
    scenario = SCENARIOS["ddp_straggler"]
    assert collectives.last_arrivals(derived).row(0, named=True)["rank"] == scenario.straggler_rank


# -- Gloo -------------------------------------------------------------------------------

def _gloo_trace(path: Path, rank: int, *, annotations: bool, delay_us: float) -> None:
    """Two Gloo all-reduces and a broadcast: c10d:: ops on the main thread, gloo: ops on a worker."""
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0,
               "dur": 10_000, "args": {}}]
    for i, (op, n) in enumerate((("allreduce_", 1024), ("broadcast_", 256), ("allreduce_", 4096))):
        t = 1000 * (i + 1) + (delay_us if rank == 1 else 0.0)
        events.append({"ph": "X", "cat": "cpu_op", "name": f"c10d::{op}", "pid": 1, "tid": 1, "ts": t, "dur": 50,
                       "args": {"Input Dims": [[]], "Input type": ["TensorList"]}})
        if annotations:
            name = "gloo:all_reduce" if op == "allreduce_" else "gloo:broadcast"
            events.append({"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": 2, "ts": t + 60,
                           "dur": 300, "args": {"Input Dims": [[n]], "Input type": ["float"]}})
    doc = {"distributedInfo": {"backend": "gloo", "rank": rank, "world_size": 2}, "traceEvents": events}
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("annotations", [True, False])
def test_gloo_collectives_come_from_cpu_ops(tmp_path: Path, annotations: bool) -> None:
    frames = []
    for rank in (0, 1):
        path = tmp_path / f"rank-{rank}.json"
        _gloo_trace(path, rank, annotations=annotations, delay_us=7.0)
        frames.append(_rows(path)[1])
    frame = pl.concat(frames)
    assert frame.height == 6 and set(frame["source"]) == {"cpu_op"}
    assert frame.sort("rank", "seq")["collective"].to_list() == ["allreduce", "broadcast", "allreduce"] * 2
    assert frame["kernel_event_id"].null_count() == 6
    if annotations:  # the gloo: op's input: float elements x 4 bytes; its span is the row's time
        assert frame.sort("rank", "seq")["message_bytes"].to_list() == [4096, 1024, 16384] * 2
        assert set(frame["dur_ns"]) == {300_000}
    else:
        assert set(frame["dur_ns"]) == {50_000}
    inst = collectives.instances(frame)
    assert inst.height == 3 and set(inst["skew_ns"]) == {7000} and set(inst["last_rank"]) == {1}


def test_no_cpu_rows_where_record_param_comms_has_the_metadata(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.json"
    _gloo_trace(path, 0, annotations=True, delay_us=0.0)
    doc = json.loads(path.read_text())
    doc["traceEvents"].append({"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1,
                               "ts": 1001, "dur": 40, "args": {"Collective name": "allreduce", "dtype": "Float",
                                                               "In msg nelems": 1024, "Out msg nelems": 1024}})
    path.write_text(json.dumps(doc))
    _, rows = _rows(path)
    assert rows.height == 1 and rows["source"].to_list() == ["record_param_comms"]


def _kernel_only_trace(path: Path, rank: int, *, pg_config: bool) -> None:
    """NCCL kernels on one stream and no host events at all."""
    names = ["ncclDevKernel_AllReduce_Sum_bf16_RING_LL128(ncclDevKernelArgsStorage<4096ul>)",
             "ncclDevKernel_AllGather_RING_SIMPLE(ncclDevKernelArgsStorage<4096ul>)"]
    events = [{"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 20, "ts": 100 * (i + 1) + rank,
               "dur": 50, "args": {"device": 0, "stream": 20, "correlation": i + 1}} for i, name in enumerate(names)]
    dist: dict[str, Any] = {"backend": "nccl", "rank": rank, "world_size": 2}
    if pg_config:
        dist["pg_config"] = [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl", "pg_size": 2,
                              "ranks": [0, 1]},
                             {"pg_name": "1", "pg_desc": "undefined", "backend_config": "cpu:gloo", "pg_size": 2,
                              "ranks": [0, 1]}]
    path.write_text(json.dumps({"distributedInfo": dist, "traceEvents": events}))


@pytest.mark.parametrize("pg_config", [True, False])
def test_kernels_without_host_events(tmp_path: Path, pg_config: bool) -> None:
    frames = []
    for rank in (0, 1):
        path = tmp_path / f"rank-{rank}.json"
        _kernel_only_trace(path, rank, pg_config=pg_config)
        frames.append(_rows(path)[1])
    frame = pl.concat(frames).sort("rank", "seq")
    assert frame["collective"].to_list() == ["allreduce", "allgather"] * 2
    assert frame["protocol"].to_list() == ["LL128", "SIMPLE"] * 2
    assert frame["dtype"].to_list() == ["BFloat16", None] * 2 and frame["message_bytes"].null_count() == 4
    if pg_config:  # the one NCCL group of pg_config
        assert set(frame["process_group"]) == {"0"} and set(frame["group_size"]) == {2}
        assert set(frame["process_group_desc"]) == {"default_pg"}
    else:
        assert set(frame["process_group"]) == {"nccl-stream-0"} and frame["group_size"].null_count() == 4
    inst = collectives.instances(frame)
    assert inst["skew_ns"].to_list() == [1000, 1000] and set(inst["last_rank"]) == {1}


@pytest.mark.parametrize("dims", [[[-1]], [[[2, 3], [4]]], [[2**62, 8]], "not a list", [["x"]]])
def test_odd_input_dims_give_no_size(tmp_path: Path, dims: Any) -> None:
    """Shapes that are negative, nested, overflowing or not numbers leave the size null; the trace still ingests."""
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "nccl:all_reduce", "pid": 1, "tid": 1, "ts": 10, "dur": 20,
         "args": {"Input Dims": dims, "Input type": ["float"]}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 15, "dur": 2,
         "args": {"correlation": 7}},
        {"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce_RING_LL_Sum_float", "pid": 0, "tid": 20,
         "ts": 40, "dur": 5, "args": {"correlation": 7, "stream": 20, "device": 0}},
    ]
    path = tmp_path / "rank-0.json"
    path.write_text(json.dumps({"traceEvents": events}))
    _, rows = _rows(path)
    assert rows.height == 1 and rows["collective"].to_list() == ["allreduce"]
    assert rows["message_bytes"].to_list() == [None]
