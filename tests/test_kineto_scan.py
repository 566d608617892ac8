"""The native Kineto scanner reads every trace exactly as DuckDB's JSON reader (the reference) does."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from support import REAL_TRACES, SAMPLES, real_kineto_files
from tracelake import ingest
from tracelake.contracts.errors import InvalidArgument, TraceFormatError
from tracelake.ingest import kineto_scan, kineto_sql_events, kineto_sql_facts
from tracelake.ingest.model import ParseOptions
from tracelake.warehouse import Warehouse

pytestmark = pytest.mark.skipif(not kineto_scan.AVAILABLE, reason="the native Kineto scanner is not built")

TABLES = ("device_ops", "host_ops", "collectives", "steps", "counters", "memory_events", "devices")


def parse_both(path: Path, tmp_path: Path) -> tuple[dict[str, pa.Table], dict[str, pa.Table], Any, Any]:
    """Parse ``path`` with each engine; the tables (nullability aside) and the trace facts."""
    out = []
    for engine in ("duckdb", "native"):
        staging = tmp_path / f"{path.name}-{engine}"
        staging.mkdir()
        options = ParseOptions(source_name=path.name, trace_id="t", kineto_engine=engine)
        _, info = ingest.parse_into(path, staging, options)
        tables = {}
        for name in TABLES:
            table = pq.read_table(staging / f"{name}.parquet")
            table = table.cast(pa.schema([f.with_nullable(True) for f in table.schema]))
            keys = [(c, "ascending") for c in ("event_id", "step", "name", "ts_ns", "device") if c in table.column_names]
            tables[name] = table.sort_by(keys)
        out.append((tables, info))
    (reference, ref_info), (native, native_info) = out
    return reference, native, ref_info, native_info


def assert_same(path: Path, tmp_path: Path) -> dict[str, pa.Table]:
    reference, native, ref_info, native_info = parse_both(path, tmp_path)
    for name in TABLES:
        assert native[name].schema == reference[name].schema, name
        for column in reference[name].column_names:
            assert native[name].column(column).to_pylist() == reference[name].column(column).to_pylist(), (
                f"{path.name}: {name}.{column}")
    assert dataclasses.asdict(native_info) == dataclasses.asdict(ref_info)
    return native


SAMPLE_FILES = sorted(SAMPLES.glob("*/*.json.gz"))
REAL_FILES = real_kineto_files()


@pytest.mark.parametrize("path", SAMPLE_FILES, ids=[f"{p.parent.name}/{p.name}" for p in SAMPLE_FILES])
def test_samples_read_the_same_with_both_engines(path: Path, tmp_path: Path) -> None:
    native = assert_same(path, tmp_path)
    assert native["device_ops"].num_rows > 0 and native["host_ops"].num_rows > 0


@pytest.mark.slow  # reads the real traces with both engines
@pytest.mark.skipif(not REAL_FILES, reason="../shared/real_traces/pytorch_profiler is not present")
@pytest.mark.parametrize("path", REAL_FILES, ids=[p.parent.name for p in REAL_FILES])
def test_real_traces_read_the_same_with_both_engines(path: Path, tmp_path: Path) -> None:
    native = assert_same(path, tmp_path)
    assert native["host_ops"].num_rows > 0


REAL_MTIA = sorted((REAL_TRACES / "pytorch_other" / "hta_mtia_single_rank").glob("*.json.gz"))


@pytest.mark.slow  # reads the real traces with both engines
@pytest.mark.skipif(not REAL_MTIA, reason="../shared/real_traces/pytorch_other/hta_mtia_single_rank is not present")
def test_the_real_mtia_trace_reads_the_same_with_both_engines(tmp_path: Path) -> None:
    native = assert_same(REAL_MTIA[0], tmp_path)
    assert set(native["device_ops"].column("kind").to_pylist()) == {"kernel", "memcpy"}


def write_trace(path: Path, events: list[object], **top: object) -> Path:
    path.write_text(json.dumps({"schemaVersion": 1, **top, "traceEvents": events}))
    return path


def test_odd_values_convert_as_duckdb_converts_them(tmp_path: Path) -> None:
    """Strings for numbers, hex, decimals, exponents, escapes, containers where text goes, nulls, odd ids."""
    kernel = {"ph": "X", "cat": "Kernel", "name": "k", "pid": 0, "tid": "stream 7", "ts": 1.0, "dur": 2}
    events: list[Any] = [
        {"ph": "X", "cat": "cpu_op", "name": "ProfilerStep#3", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
        {"ph": "X", "cat": "cpu_op", "name": "ProfilerStep#x", "pid": 1, "tid": 1, "ts": 0, "dur": 1},
        {**kernel, "ts": "123.4567", "dur": 1.0005, "args": {"stream": "0x1f", "device": 2.5, "bytes": "12.5",
                                                             "grid": [1, "2", 3.5, None, [1], 2147483648],
                                                             "block": "[1,2]", "correlation": " 7 ",
                                                             "External id": "1_000", "shared memory": 1e3,
                                                             "est. achieved occupancy %": "12.5",
                                                             "registers per thread": True}},
        {**kernel, "ts": 1e2, "dur": -0.0015, "pid": "Spawned 7", "args": {"stream": None, "grid": [],
                                                                         "device": "+3", "bytes": "1,000"}},
        {**kernel, "ts": 2.5e-3, "dur": "7", "cat": "GPU_MEMCPY", "name": 12, "args": {"device": None}},
        {**kernel, "cat": "gpu_memset", "name": "m\u00e9\\\"\n", "tid": "-4x", "args": None},
        {"ph": "X", "cat": "cuda_runtime", "name": "hipLaunchKernel", "pid": 1, "tid": 2, "ts": 1, "dur": 1,
         "args": {"correlation": 5, "External id": "0x10"}},
        {"ph": "X", "cat": None, "name": None, "pid": None, "tid": None, "ts": 1, "dur": 0,
         "args": {"Input Dims": [[1, 2], [], 1.50, 2e0, "a\\/b\u0001", {"k": None}], "Input type": "x\"y",
                  "flops": "1e3", "Sequence number": "2.5", "Fwd thread id": -1}},
        {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": 5, "dur": 10,
         "args": {"Collective name": "all_reduce", "dtype": 1.50, "Process Group Name": {"a": [1, 2]},
                  "Process Group Description": True, "Process Group Ranks": "[0, 1]", "In msg nelems": "0x10",
                  "Out msg nelems": 9223372036854775807, "Group size": "1e2", "Seq": " 0x7 ",
                  "Src Rank": "-0x1", "Dst Rank": 9223372036854775808}},
        {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 3,
         "args": {"Total Allocated": 10, "Total Reserved": "20.5", "Device Type": 0, "Device Id": -1}},
        {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 4,
         "args": {"Total Allocated": "x", "Device Type": 1, "Device Id": "3"}},
        {"ph": "s", "ts": 1, "id": 1, "name": "flow"},
        {"ph": "M", "name": "process_name", "args": {"name": "python"}},
        {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler", "ts": 0, "dur": 1000, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "x" * 40, "name": "long category", "ts": 0, "dur": 1, "pid": 1, "tid": 1},
        {"ph": "C", "name": "counter", "ts": 2, "pid": 1, "args": {"a": 1, "b": "2"}},
    ]
    native = assert_same(write_trace(tmp_path / "odd.json", events), tmp_path)
    device = native["device_ops"].to_pylist()
    assert device[0]["stream"] == 31 and device[0]["ts_ns"] == 123457 and device[0]["dur_ns"] == 1001
    assert device[0]["grid"] == [1, 2, 4, None, None, None] and device[0]["external_id"] == 1000
    assert device[1]["device"] == 3 and device[1]["bytes"] is None and device[1]["dur_ns"] == 0
    assert native["steps"].column("step").to_pylist() == [3]


def test_mtia_ops_read_the_same_with_both_engines(tmp_path: Path) -> None:
    """MTIA device ops (docs/formats.md, section 1): DMA requests are copies of ``args.size`` bytes."""
    dma = {"ph": "X", "cat": "mtia_ccp_events", "name": "dma_request", "pid": 9, "tid": 801, "ts": 5, "dur": 2,
           "args": {"direction": "HOST_TO_DEVICE", "size": 16, "sqid": 1}}
    events: list[Any] = [
        {"ph": "X", "cat": "mtia_runtime", "name": "runFunction - job_prep_and_submit_for_execution", "pid": 1,
         "tid": 1, "ts": 1, "dur": 1, "args": {"correlation": 18}},
        {"ph": "X", "cat": "mtia_ccp_events", "name": "fc-dtype_Float", "pid": 9, "tid": 4, "ts": 3, "dur": 1,
         "args": {"correlation": 18, "stream": 1, "column": "0", "row": "0"}},
        dma,
        {**dma, "ts": 8, "args": {**dma["args"], "size": "0x20", "stream": 2}},
        {**dma, "ts": 9, "args": {"size": 7, "bytes": 3}},
        {**dma, "name": "dma_request_x", "ts": 10},
    ]
    native = assert_same(write_trace(tmp_path / "mtia.json", events), tmp_path)
    device = native["device_ops"].to_pylist()
    assert [(d["kind"], d["bytes"], d["device"], d["stream"]) for d in device] == [
        ("kernel", None, 9, 1), ("memcpy", 16, 9, 801), ("memcpy", 32, 9, 2), ("memcpy", 3, 9, 801),
        ("kernel", 16, 9, 801)]
    assert [d["category"] for d in device] == ["compute", "memory", "memory", "memory", "compute"]
    host = native["host_ops"].to_pylist()
    assert [(h["cat"], h["correlation"]) for h in host] == [("mtia_runtime", 18)]


@settings(max_examples=5, deadline=None)
@example(seed=1)  # overlapping ProfilerStep#N starting together: DuckDB once picked any of them
@given(seed=st.integers(0, 2**16))
def test_a_thousand_generated_events_convert_the_same(seed: int, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Randomised values for every field the scanner reads, in one trace."""
    tmp_path = tmp_path_factory.mktemp(f"generated-{seed}")
    rng = random.Random(seed)
    values: list[object] = [None, True, False, 0, -1, 7, 2.5, -2.5, 1e3, 1.5e-3, 1 << 20,
                            "0", " 12 ", "0x1F", "-0x1", "1_000", "12.", ".5", "1e2", "abc", "", "3 4",
                            "Spawned 12", [], [1, 2], {"a": 1}, "é\u00e9", "a\nb"]
    keys = [key for key, _ in (kineto_sql_events.ARGS | kineto_sql_events.MEMORY_ARGS).values()]
    cats = ["kernel", "Kernel", "cpu_op", "cuda_runtime", "gpu_memcpy", "Memset", "cuda_sync", "python_function",
            "user_annotation", "gpu_user_annotation", None, 3, "mtia_ccp_events", "MTIA_CCP_events", "mtia_runtime"]
    events: list[object] = []
    for n in range(1000):
        args = {key: rng.choice(values) for key in rng.sample(keys, rng.randint(0, 8))}
        for key in ("External id", "correlation", "device", "stream"):  # checked ids must be numbers
            if key in args and not isinstance(args[key], int | float) or isinstance(args.get(key), bool):
                args[key] = rng.randint(-5, 1 << 40)
        if abs(args.get("device") or 0) >= 1 << 31:  # a device must fit 32 bits (else both engines refuse)
            args["device"] = rng.randint(-3, 8)
        events.append({
            "ph": rng.choice(["X", "X", "X", "i", "B", "E"]), "cat": rng.choice(cats),
            "name": rng.choice(["ProfilerStep#%d" % rng.randint(0, 9), "[memory]", "[OutOfMemory]", "aten::mm",
                                "hipMalloc", 5, "dma_request", "dma_request "]),
            "pid": rng.choice(values[:9] + values[11:20] + ["Spawned 3", "7 x"]), "tid": rng.choice([1, 2, "3", "stream 4", None]),
            "ts": rng.choice([rng.randint(0, 10**7) / 1000, str(rng.randint(0, 99)), 1.0005]),
            "dur": rng.choice([rng.randint(-5, 10**5) / 7, 0, "2.5e1"]), "args": args,
        })
    assert_same(write_trace(tmp_path / "random.json", events), tmp_path)


def step_by_rule(t: int, steps: dict[int, tuple[int, int]]) -> int | None:
    """The documented step of a time (docs/analyses.md, Breakdown): of the steps ``[start, end)`` containing it,
    the one that starts last, then ends first, then has the highest number."""
    containing = [(start, -end, n) for n, (start, end) in steps.items() if start <= t < end]
    return max(containing)[2] if containing else None


#: ProfilerStep#N intervals (us) that nest, overlap, start together, coincide, and one of zero length.
OVERLAPPING_STEPS = {1: (0, 100), 2: (40, 60), 3: (80, 150), 4: (200, 260), 5: (200, 230), 6: (300, 400),
                     7: (300, 400), 8: (500, 500)}


def test_overlapping_steps_give_every_op_the_documented_step(tmp_path: Path) -> None:
    """Host ops by time; device ops by their launch (the earliest one in a step), else by time; both engines."""
    events: list[object] = [
        {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": 1, "tid": 1, "ts": start,
         "dur": end - start} for n, (start, end) in OVERLAPPING_STEPS.items()]
    times = [-5, 0, 39, 40, 59, 60, 79, 80, 99, 100, 149, 150, 199, 200, 229, 230, 259, 260, 300, 399, 400, 500, 600]
    events += [{"ph": "X", "cat": "cpu_op", "name": f"op@{t}", "pid": 1, "tid": 2, "ts": t, "dur": 1} for t in times]
    # Launches: correlation c is launched at each of launches[c] (a reused correlation launches more than once).
    launches = {1: [45], 2: [90, 10], 3: [-5, 210], 4: [-5], 5: [450, 305]}
    # Correlation -> kernel start (6 to 8: no launch).
    kernels = {1: 600, 2: 45, 3: 90, 4: 220, 5: 0, 6: 170, 7: 350, 8: 250}
    events += [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 3, "ts": t, "dur": 1,
                "args": {"correlation": c}} for c, ts in launches.items() for t in ts]
    events += [{"ph": "X", "cat": "kernel", "name": f"k{c}", "pid": 0, "tid": 7, "ts": t, "dur": 2,
                "args": {"correlation": c, "device": 0, "stream": 7}} for c, t in kernels.items()]
    native = assert_same(write_trace(tmp_path / "overlap.json", events), tmp_path)

    host = {row["name"]: row["step"] for row in native["host_ops"].to_pylist()}
    assert {t: host[f"op@{t}"] for t in times} == {t: step_by_rule(t, OVERLAPPING_STEPS) for t in times}
    expected = {}
    for c, t in kernels.items():
        in_step = sorted((ts, step_by_rule(ts, OVERLAPPING_STEPS)) for ts in launches.get(c, []))
        launched = [step for _, step in in_step if step is not None]
        expected[f"k{c}"] = launched[0] if launched else step_by_rule(t, OVERLAPPING_STEPS)
    device = {row["name"]: row["step"] for row in native["device_ops"].to_pylist()}
    assert device == expected
    # The cases are all there: nested, overlapping, together, identical, a reused correlation, by time.
    assert [host[f"op@{t}"] for t in (39, 40, 80, 100, 200, 230, 300)] == [1, 2, 3, 3, 5, 4, 7]
    assert expected == {"k1": 2, "k2": 1, "k3": 5, "k4": 5, "k5": 7, "k6": None, "k7": 7, "k8": 4}


@settings(max_examples=60)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 12)), max_size=8))
def test_a_time_belongs_to_the_innermost_step_containing_it(intervals: list[tuple[int, int]]) -> None:
    """The spans both engines look steps up in, native and SQL, against the rule applied to every time."""
    steps = {n: (start, start + dur) for n, (start, dur) in enumerate(intervals)}
    table = pa.Table.from_pylist([{"step": n, "ts_ns": start, "dur_ns": end - start}
                                  for n, (start, end) in steps.items()],
                                 schema=pa.schema([(c, pa.int64()) for c in ("step", "ts_ns", "dur_ns")]))
    times = list(range(-1, 45))
    expected = [step_by_rule(t, steps) for t in times]
    starts, ends, numbers = kineto_scan.step_spans(table)
    at = [int(i) for i in np.searchsorted(starts, times, side="right") - 1]
    assert [int(numbers[i]) if i >= 0 and t < ends[i] else None for t, i in zip(times, at, strict=True)] == expected
    con = duckdb.connect()
    con.register("steps", table)
    con.register("times", pa.table({"t": pa.array(times, pa.int64())}))
    kineto_sql_facts.step_spans(con)
    found = con.sql("""SELECT CASE WHEN t < s.end_ns THEN s.step END FROM times ASOF LEFT JOIN step_spans s
                       ON t >= s.ts_ns ORDER BY t""").fetchall()
    assert [step for (step,) in found] == expected


@pytest.mark.parametrize(("event", "message"), [
    ({"cat": "cpu_op", "name": "op", "ts": 1, "dur": 1}, "event 'op' has no 'ph'"),
    ({"ph": "Q", "name": "op", "ts": 1}, "unknown phase 'ph': 'Q'"),
    ({"ph": "X", "name": "op", "dur": 1}, "event 'op' has no 'ts'"),
    ({"ph": "X", "name": "op", "ts": 1, "dur": None}, "event 'op' has no 'dur'"),
    ({"ph": "X", "name": "op", "ts": 1, "dur": 1, "args": {"correlation": "abc"}}, "non-numeric 'args.correlation'"),
    ({"ph": "X", "name": "op", "ts": "soon", "dur": 1}, "'ts' that is not a number"),
    ({"ph": "M", "name": "op", "ts": 1, "dur": [1]}, "'dur' that is not a number"),
    ({"ph": "X", "name": "op", "ts": 1e16, "dur": 1}, "'ts' too large"),
    ({"ph": "X", "name": "op", "ts": 1, "dur": 1, "args": [1]}, "'args' that is not an object"),
    ({"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1, "args": {"device": 1 << 40}}, "'device' out of range"),
])
def test_a_bad_event_is_named_by_its_index(event: dict[str, object], message: str, tmp_path: Path) -> None:
    good = {"ph": "X", "cat": "cpu_op", "name": "fine", "pid": 1, "tid": 1, "ts": 0, "dur": 1}
    text = json.dumps({"traceEvents": [good, good, event]})
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(TraceFormatError) as err:
        ingest.parse_into(path, tmp_path, ParseOptions(source_name=path.name, kineto_engine="native"))
    assert message in err.value.reason
    assert err.value.where == "traceEvents[2]"


@pytest.mark.parametrize("escape", [b"\\ud800", b"\\udc00", b"\\ud800\\u0041", b"\\q", b"\\u12"])
def test_a_bad_escape_is_an_error_of_its_event(escape: bytes) -> None:
    """The cutter refuses these first (msgspec checks escapes); the scanner does not rely on it."""
    batch = b'[{"ph": "i", "ts": 1}, {"ph": "X", "ts": 1, "dur": 1, "name": "a' + escape + b'"}]'
    with pytest.raises(TraceFormatError) as err:
        kineto_scan.scan(batch, 10, "escapes.json")
    assert err.value.where == "traceEvents[11]"


def test_invalid_utf8_is_named_by_its_event(tmp_path: Path) -> None:
    path = tmp_path / "latin1.json"
    good = b'{"ph": "X", "cat": "cpu_op", "name": "fine", "pid": 1, "tid": 1, "ts": 0, "dur": 1}'
    path.write_bytes(b'{"traceEvents": [' + good + b", " + good.replace(b"fine", b"caf\xe9") + b"]}")
    with pytest.raises(TraceFormatError) as err:
        ingest.parse_into(path, tmp_path, ParseOptions(source_name=path.name, kineto_engine="native"))
    assert "UTF-8" in err.value.reason and err.value.where == "traceEvents[1]"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300) | st.text(alphabet='[]{}",:0123456789.eE-+\\u tnrfalsX', max_size=200).map(str.encode))
def test_the_scanner_never_crashes_on_arbitrary_bytes(data: bytes) -> None:
    """The cutter hands it valid JSON only, but whatever it is given it returns or raises cleanly."""
    try:
        kineto_scan.scan(data, 0, "fuzz.json")
    except TraceFormatError:
        pass


SEED_BATCH = json.dumps([
    {"ph": "X", "cat": "kernel", "name": "k\\n\u00e9", "pid": 0, "tid": "stream 7", "ts": 1.5, "dur": 2,
     "args": {"grid": [1, "2", [3]], "block": [4], "stream": "0x1", "correlation": 9, "bytes": "12.5e1"}},
    {"ph": "X", "cat": "cpu_op", "name": "ProfilerStep#1", "pid": 1, "tid": 2, "ts": 0, "dur": 10,
     "args": {"Input Dims": [[1, 2.50]], "Input type": ["float"], "Collective name": "all_reduce", "dtype": "Float"}},
    {"ph": "i", "name": "[memory]", "ts": 3, "args": {"Total Allocated": 1, "Device Type": 1, "Device Id": 0}},
]).encode()


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(SEED_BATCH) - 1), st.integers(0, 255)), min_size=1, max_size=6))
def test_the_scanner_never_crashes_on_mutated_batches(edits: list[tuple[int, int]]) -> None:
    """Bytes of a valid batch replaced at random: a result or a clean error, never a crash."""
    data = bytearray(SEED_BATCH)
    for at, value in edits:
        data[at] = value
    try:
        scanned = kineto_scan.scan(bytes(data), 0, "mutated.json")
    except TraceFormatError:
        return
    assert scanned.events <= 3


def test_truncated_batches_are_errors_not_crashes() -> None:
    batch = json.dumps([{"ph": "X", "cat": "kernel", "name": "k\\n", "ts": 1.5, "dur": 2,
                         "args": {"grid": [1, 2], "Input Dims": [[1]], "stream": "0x1"}}] * 3).encode()
    for cut in range(len(batch)):
        with pytest.raises(TraceFormatError):
            kineto_scan.scan(batch[:cut], 0, "cut.json")
    assert kineto_scan.scan(batch, 0, "whole.json").tables["device"].num_rows == 3


def test_the_scanner_knows_what_the_sql_reads() -> None:
    """The keys, categories and phases compiled into the scanner are the ones the DuckDB path declares."""
    known = kineto_scan.constants()
    read = kineto_sql_events.ARGS | kineto_sql_events.MEMORY_ARGS
    assert known["args"] == {name: key for name, (key, _) in read.items()}
    assert known["kinds"] == kineto_sql_events.KIND_BY_CAT
    assert known["kinds_by_name"] == kineto_sql_events.KIND_BY_CAT_NAME
    assert known["mtia_cat"] == kineto_sql_events.MTIA_CAT
    assert tuple(known["not_host"]) == kineto_sql_events.NOT_HOST_CATS
    assert tuple(known["phases"]) == kineto_sql_events.PHASES
    assert tuple(known["checked"]) == kineto_sql_events.CHECKED_INT_ARGS
    layout = kineto_scan.layout()
    assert set(layout) == {"device", "host", "step_marks", "coll_args", "memory_events"}


def nested(host: pa.Table, steps: pa.Table, *, native: bool, batch_rows: int = 1000) -> list[dict[str, object]]:
    con = duckdb.connect()
    con.register("host_n", host)
    con.register("steps", steps)
    kineto_sql_facts.step_spans(con)
    if native:
        rows = []
        nesting = kineto_scan.HostNesting(con.sql("SELECT * FROM steps ORDER BY ts_ns, step").to_arrow_table())
        reader = con.sql("SELECT * FROM host_n ORDER BY pid, tid, ts_ns, dur_ns DESC, event_id").to_arrow_reader(
            batch_rows)
        for batch in reader:
            rows += nesting.add(batch).to_pylist()
        return sorted(({k: row[k] for k in ("event_id", "depth", "step", "parent_id")} for row in rows),
                      key=lambda row: row["event_id"])
    kineto_sql_facts.nesting_sql(con)
    return con.sql("SELECT event_id, depth, step, parent_id FROM host_d ORDER BY event_id").to_arrow_table().to_pylist()


@settings(max_examples=30)
@given(seed=st.integers(0, 2**32 - 1), batch_rows=st.sampled_from([1, 7, 64, 1000]))
def test_native_nesting_is_the_sql_nesting(seed: int, batch_rows: int) -> None:
    """Random timelines: ties, zero lengths, partial overlaps, null threads, several threads, steps; small batches.

    A timeline is drawn from a seed, so that most have hundreds of events that overlap (checked below)."""
    rng = random.Random(seed)
    rows = []
    for event_id in range(rng.randint(0, 400)):
        ts = rng.randint(0, 60) * rng.choice([1, 1, 10])
        rows.append({"event_id": event_id * 3 + rng.randint(0, 2), "pid": rng.choice([1, 2, None]),
                     "tid": rng.choice([1, 5, None]), "ts_ns": ts, "dur_ns": rng.choice([0, 0, 1, 5, 20, 100, 600]),
                     "correlation": rng.choice([None, event_id])})
    host_schema = pa.schema([(c, pa.int64()) for c in ("event_id", "pid", "tid", "ts_ns", "dur_ns", "correlation")])
    host = pa.Table.from_pylist(rows, schema=host_schema)
    starts = sorted(rng.choice(range(0, 700, 7)) for _ in range(rng.randint(0, 6)))  # some start together
    steps = pa.Table.from_pylist(
        [{"step": n, "ts_ns": t, "dur_ns": rng.randint(1, 120)} for n, t in enumerate(starts)],
        schema=pa.schema([("step", pa.int64()), ("ts_ns", pa.int64()), ("dur_ns", pa.int64())]))
    expected = nested(host, steps, native=False)
    assert nested(host, steps, native=True, batch_rows=batch_rows) == expected
    assert any(row["parent_id"] is not None for row in expected) or len(rows) < 20


def test_the_nesting_refuses_events_out_of_order() -> None:
    """Its input comes sorted from DuckDB; were it not, nesting would be silently wrong: it raises instead."""
    schema = pa.schema([(c, pa.int64()) for c in ("event_id", "pid", "tid", "ts_ns", "dur_ns", "correlation")])
    steps = pa.table({c: pa.array([], pa.int64()) for c in ("step", "ts_ns", "dur_ns")})
    rows = [{"event_id": n, "pid": 1, "tid": 1, "ts_ns": ts, "dur_ns": 1, "correlation": None}
            for n, ts in enumerate([0, 5, 9])]
    nesting = kineto_scan.HostNesting(steps)
    nesting.add(pa.RecordBatch.from_pylist(rows[1:], schema=schema))
    with pytest.raises(RuntimeError, match="out of order"):
        nesting.add(pa.RecordBatch.from_pylist(rows[:1], schema=schema))  # a later batch starting earlier
    with pytest.raises(RuntimeError, match="out of order"):
        kineto_scan.HostNesting(steps).add(pa.RecordBatch.from_pylist(rows[::-1], schema=schema))


def test_times_too_large_for_the_native_nesting_take_the_sql(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "late.json", [
        {"ph": "X", "cat": "cpu_op", "name": "outer", "pid": 1, "tid": 1, "ts": 2.4e15, "dur": 10},
        {"ph": "X", "cat": "cpu_op", "name": "inner", "pid": 1, "tid": 1, "ts": 2.4e15 + 1, "dur": 5},
    ])
    native = assert_same(path, tmp_path)
    assert native["host_ops"].column("depth").to_pylist() == [0, 1]


def test_without_the_scanner_ingest_takes_duckdbs_reader(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the extension is not built, the reference path ingests the same trace."""
    monkeypatch.setattr(kineto_scan, "AVAILABLE", False)
    report = Warehouse(home).ingest([SAMPLE_FILES[0]], job="fallback")
    assert report.ok and report.results[0].rows["device_ops"] > 0
    monkeypatch.setenv("TRACELAKE_KINETO_ENGINE", "native")
    failed = Warehouse(home).ingest([SAMPLE_FILES[1]], job="fallback")
    assert not failed.ok and "native Kineto scanner is not built" in (failed.results[0].error or "")


def test_an_unknown_engine_is_refused(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACELAKE_KINETO_ENGINE", "fast")
    with pytest.raises(InvalidArgument, match="auto, native, duckdb"):
        Warehouse(home).ingest([SAMPLE_FILES[0]], job="x")

