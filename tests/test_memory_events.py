"""``memory_events`` and ``host_ops.record_function_id`` from Kineto traces, against what the JSON itself says.

Every count here is made from the trace with the json module (docs/formats.md, section 1, "Memory
instants"), and both Kineto engines must give the same rows.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter, defaultdict
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from support import ROOT, real_kineto_files
from tracelake import ingest
from tracelake.contracts.errors import TraceFormatError
from tracelake.ingest import kineto_memory_facts, kineto_scan, kineto_sql_facts, kineto_sql_tables
from tracelake.ingest.kineto_sql_events import DEVICE_TYPES
from tracelake.ingest.model import ParseOptions

ENGINES = ["duckdb", "native"] if kineto_scan.AVAILABLE else ["duckdb"]
MEMORY_NAMES = ("[memory]", "[OutOfMemory]")
#: The project's own H200 traces (``profile_memory=True`` in train/ and leak/; leak/ ends in an out-of-memory).
GPU_TRACES = sorted((ROOT / "sample_traces" / "gpu_h200").glob("*/*.pt.trace.json.gz"))
TRACES = [pytest.param(p, id=f"gpu_h200/{p.parent.name}") for p in GPU_TRACES] + [
    pytest.param(p, id=f"real/{p.parent.name}/{p.name[:24]}", marks=pytest.mark.slow) for p in real_kineto_files()]


def load_events(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.read_bytes()[:2] == b"\x1f\x8b" else open
    with opener(path, "rb") as f:
        doc = json.load(f)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    return [e for e in events if isinstance(e, dict)]


def ns(value: object) -> int:
    """Microseconds as the trace writes them -> ns, rounded half away from zero (as the parser reads them)."""
    return int((Decimal(str(value)) * 1000).quantize(Decimal(1), rounding=ROUND_HALF_UP))


def parse(path: Path, tmp_path: Path, engine: str, **options: Any) -> dict[str, pa.Table]:
    staging = tmp_path / f"{path.name}-{engine}-{len(options)}"
    staging.mkdir()
    ingest.parse_into(path, staging, ParseOptions(source_name=path.name, trace_id="t", kineto_engine=engine,
                                                  **options))
    tables = {}
    for name in ("memory_events", "host_ops", "counters"):
        table = pq.read_table(staging / f"{name}.parquet")
        table = table.cast(pa.schema([f.with_nullable(True) for f in table.schema]))
        keys = [(c, "ascending") for c in ("event_id", "name", "ts_ns", "device") if c in table.column_names]
        tables[name] = table.sort_by(keys)
    return tables


def parse_both(path: Path, tmp_path: Path, **options: Any) -> dict[str, pa.Table]:
    """The tables of the last engine, after checking every engine made the same ``memory_events`` and ids."""
    results = [parse(path, tmp_path, engine, **options) for engine in ENGINES]
    for other in results[:-1]:
        for name in ("memory_events", "counters"):
            assert other[name].to_pylist() == results[-1][name].to_pylist(), f"{path.name}: {name}"
        for column in ("event_id", "record_function_id"):
            assert other["host_ops"].column(column).to_pylist() == results[-1]["host_ops"].column(column).to_pylist()
    return results[-1]


def device_of(args: dict[str, Any]) -> int:
    return -1 if args.get("Device Type") == 0 else int(args["Device Id"])


def innermost_cpu_ops(events: list[dict[str, Any]], memory: list[tuple[int, dict[str, Any]]]) -> dict[int, str | None]:
    """By event index, the innermost ``cpu_op`` on the instant's thread whose span holds it: of those with
    start <= t < end (or t = start for a zero-length op), the latest to start, then the first to end."""
    ops: dict[tuple[object, object], list[tuple[int, int, str]]] = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "cpu_op":
            ops[(e.get("pid"), e.get("tid"))].append((ns(e["ts"]), ns(e["ts"]) + max(ns(e["dur"]), 0), e["name"]))
    arrays = {k: (np.array([o[0] for o in v]), np.array([o[1] for o in v]), [o[2] for o in v]) for k, v in ops.items()}
    found: dict[int, str | None] = {}
    for index, e in memory:
        starts, ends, names = arrays.get((e.get("pid"), e.get("tid")), (np.array([]), np.array([]), []))
        t = ns(e["ts"])
        holding = np.flatnonzero((starts <= t) & ((t < ends) | ((starts == ends) & (starts == t))))
        found[index] = names[max(holding, key=lambda i: (starts[i], -ends[i], i))] if len(holding) else None
    return found


def steps_of(events: list[dict[str, Any]]) -> dict[int, tuple[int, int]]:
    spans: dict[int, tuple[int, int]] = {}
    for e in events:
        name = e.get("name")
        if e.get("ph") == "X" and isinstance(name, str) and name.startswith("ProfilerStep#"):
            n, start, end = int(name.removeprefix("ProfilerStep#")), ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])
            old = spans.get(n, (start, end))
            spans[n] = (min(old[0], start), max(old[1], end))
    return spans


def step_at(t: int, steps: dict[int, tuple[int, int]]) -> int | None:
    """The documented step of a time: of the steps containing it, the last to start, then first to end."""
    holding = [(start, -end, n) for n, (start, end) in steps.items() if start <= t < end]
    return max(holding)[2] if holding else None


@pytest.mark.parametrize("path", TRACES)
def test_memory_events_match_the_traces_own_numbers(path: Path, tmp_path: Path) -> None:
    events = load_events(path)
    memory = [(i, e) for i, e in enumerate(events) if e.get("name") in MEMORY_NAMES]
    tables = parse_both(path, tmp_path)
    rows = tables["memory_events"].to_pylist()

    assert len(rows) == len(memory)
    assert [r["event_id"] for r in rows] == [i for i, _ in memory]
    assert Counter(r["kind"] for r in rows)["oom"] == sum(e["name"] == "[OutOfMemory]" for _, e in memory)
    peaks: dict[int, int] = {}
    sums: Counter[int] = Counter()
    for _, e in memory:
        device = device_of(e["args"])
        peaks[device] = max(peaks.get(device, e["args"]["Total Allocated"]), e["args"]["Total Allocated"])
        sums[device] += e["args"]["Bytes"]
    got_peaks: dict[int, int] = {}
    got_sums: Counter[int] = Counter()
    for r in rows:
        got_peaks[r["device"]] = max(got_peaks.get(r["device"], r["total_allocated"]), r["total_allocated"])
        got_sums[r["device"]] += r["bytes"]
    assert got_peaks == peaks
    assert got_sums == sums
    for r, (_, e) in zip(rows, memory, strict=True):
        assert r["device_type"] == DEVICE_TYPES[e["args"]["Device Type"]]
        assert r["addr"] == e["args"].get("Addr")
        assert r["total_reserved"] == e["args"]["Total Reserved"]
        assert r["kind"] == ("oom" if e["name"] == "[OutOfMemory]" else "alloc" if e["args"]["Bytes"] > 0 else "free")

    ops = innermost_cpu_ops(events, memory)
    assert {r["event_id"]: r["op"] for r in rows} == ops
    steps = steps_of(events)
    base = rows[0]["ts_ns"] - ns(memory[0][1]["ts"]) if rows else 0
    assert [r["step"] for r in rows] == [step_at(r["ts_ns"] - base, steps) for r in rows]

    # Record function ids: every host op that carries the arg, by event index.
    ids = {i: e["args"]["Record function id"] or None for i, e in enumerate(events)  # 0: no id
           if e.get("ph") == "X" and "Record function id" in (e.get("args") or {})}
    host = dict(zip(tables["host_ops"].column("event_id").to_pylist(),
                    tables["host_ops"].column("record_function_id").to_pylist(), strict=True))
    assert {i: host[i] for i in ids if i in host} == {i: v for i, v in ids.items() if i in host}
    assert all(i in host for i in ids if events[i].get("cat") == "cpu_op")
    assert sum(v is not None for v in host.values()) == sum(i in host and ids[i] is not None for i in ids)


def test_the_gpu_traces_have_the_memory_events_they_were_made_with(tmp_path: Path) -> None:
    """train/ and leak/ were profiled with ``profile_memory=True``; leak/ ends in one ``[OutOfMemory]``."""
    by_folder = {p.parent.name: p for p in GPU_TRACES}
    if not {"train", "leak"} <= set(by_folder):
        pytest.skip("sample_traces/gpu_h200 lacks train/ or leak/")
    leak = parse_both(by_folder["leak"], tmp_path)["memory_events"].to_pylist()
    ooms = [r for r in leak if r["kind"] == "oom"]
    assert len(ooms) == 1 and ooms[0]["addr"] is None and ooms[0]["device_type"] == "cuda"
    assert ooms[0]["bytes"] > 10**14 and ooms[0]["op"] == "aten::empty"
    train = parse_both(by_folder["train"], tmp_path)["memory_events"]
    assert train.num_rows > 1000 and set(train.column("device_type").to_pylist()) == {"cuda"}


def test_small_batches_give_the_same_rows(tmp_path: Path) -> None:
    """Memory instants cut across many batches and groups of batches (the DuckDB path reads some batches twice)."""
    leak = [p for p in GPU_TRACES if p.parent.name == "leak"]
    if not leak:
        pytest.skip("sample_traces/gpu_h200/leak is absent")
    whole = parse_both(leak[0], tmp_path)
    cut = parse_both(leak[0], tmp_path, batch_bytes=4096)
    assert cut["memory_events"].to_pylist() == whole["memory_events"].to_pylist()
    assert cut["counters"].to_pylist() == whole["counters"].to_pylist()


def ranges_made(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[int]]:
    """Memory instants' ops named and facts joined about 10 a range (at a 100 MB share); per relation, how many
    ranges each call of ``id_ranges`` made."""
    for name in ("OP_NAME_BYTES_PER_ROW", "FACTS_BYTES_PER_ROW"):
        monkeypatch.setattr(kineto_memory_facts, name, 10 << 20)
    ranges = kineto_memory_facts.id_ranges
    made: dict[str, list[int]] = defaultdict(list)

    def counted(con: object, facts: str, rows: int) -> list[tuple[int, int]]:
        found = ranges(con, facts, rows)  # type: ignore[arg-type]
        made[facts].append(len(found))
        return found

    monkeypatch.setattr(kineto_memory_facts, "id_ranges", counted)
    return made


def test_memory_instants_joined_by_ranges_give_the_same_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where one join would not fit DuckDB's memory limit, the instants get their op and step range by range; the
    native path names their ops by ranges of the ops' ids and sorts their facts by ranges of their own."""
    leak = [p for p in GPU_TRACES if p.parent.name == "leak"]
    if not leak:
        pytest.skip("sample_traces/gpu_h200/leak is absent")
    whole = parse_both(leak[0], tmp_path)
    for name in ("MEMORY_JOIN_BYTES_PER_ROW", "NATIVE_MEMORY_JOIN_BYTES_PER_ROW"):  # both engines' budgets
        monkeypatch.setattr(kineto_sql_facts, name, 20 << 20)  # 10 instants a range at 200 MB
    made = ranges_made(monkeypatch)
    ranged = parse_both(leak[0], tmp_path, memory_limit="200MB", threads=1)
    assert ranged["memory_events"].to_pylist() == whole["memory_events"].to_pylist()
    assert max(made["mem_op_keys"]) > 1  # the ops named in several ranges (its instants are not in time order)


def test_instants_in_time_order_give_the_same_facts_by_ranges(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    """Instants in time order are merged with their facts, which are sorted a range of instants at a time (and their
    ops named a range of ops at a time): the same rows as one range of each, with several ranges of each made."""
    events: list[object] = [op("ProfilerStep#1", 0, 300, cat="user_annotation"),
                            op("ProfilerStep#2", 300, 300, cat="user_annotation")]
    events += [op(f"op{i}", 10 * i, 8) for i in range(60)]
    events += [instant(10 * i + 2 * k, {"Bytes": k + 1, "Addr": 16 * i + k, "Device Type": 1, "Device Id": 0})
               for i in range(60) for k in range(5)]  # in time order; those at 10i + 8 after their op
    path = tmp_path / "ordered.json"
    path.write_text(json.dumps({"traceEvents": events}))
    (tmp_path / "whole").mkdir()
    (tmp_path / "ranged").mkdir()
    whole = parse_both(path, tmp_path / "whole")["memory_events"]
    made = ranges_made(monkeypatch)
    merged: list[bool] = []
    original = kineto_sql_tables._memory_merged
    monkeypatch.setattr(kineto_sql_tables, "_memory_merged", lambda *a, **k: merged.append(original(*a, **k))
                        or merged[-1])
    ranged = parse_both(path, tmp_path / "ranged")["memory_events"]
    assert ranged.to_pylist() == whole.to_pylist() and ranged.num_rows == 300
    assert max(made["mem_op_keys"]) > 1 and max(made["mem_n"]) > 1
    assert merged[-1]  # the native engine's (parsed last) facts lined up with the instants: merged, not sorted
    ops = [r["op"] for r in ranged.to_pylist()]
    assert ops.count(None) == 60 and ops[:5] == ["op0"] * 4 + [None]  # the instants at 10i + 8 are after op i
    assert [r["step"] for r in ranged.to_pylist()][149:151] == [1, 2]


def instant(ts: float, args: dict[str, object], name: str = "[memory]", tid: object = 1) -> dict[str, object]:
    return {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": name, "pid": 7, "tid": tid, "ts": ts,
            "args": args}


def op(name: str, ts: float, dur: float, tid: int = 1, cat: str = "cpu_op", rf_id: object = None) -> dict[str, object]:
    args = {} if rf_id is None else {"Record function id": rf_id}
    return {"ph": "X", "cat": cat, "name": name, "pid": 7, "tid": tid, "ts": ts, "dur": dur, "args": args}


def test_a_hand_made_trace_gives_the_known_op_step_and_values(tmp_path: Path) -> None:
    gpu: dict[str, object] = {"Device Type": 1, "Device Id": 0, "Total Allocated": 512, "Total Reserved": 2048}
    events: list[object] = [
        op("ProfilerStep#1", 0, 100, cat="user_annotation"),
        op("ProfilerStep#2", 100, 100, cat="user_annotation"),
        op("outer", 10, 50, rf_id=11),
        op("inner", 20, 10, rf_id="12"),
        op("annotation", 35, 15, cat="user_annotation"),
        op("zero", 55, 0, rf_id=0),
        op("parent", 70, 20),
        op("child", 70, 10),
        op("worker", 0, 300, tid=2, rf_id="x"),
        instant(25, {"Bytes": 512, "Addr": 4096, **gpu}),               # 1: inner
        instant(30, {"Bytes": -512, "Addr": 4096, **gpu}),              # 2: inner ended at 30: outer
        instant(40, {"Bytes": "abc", **gpu}),                           # 3: in an annotation inside outer
        instant(55, {"Bytes": 8, "Addr": "0x10", **gpu, "Device Type": 0, "Device Id": -1}),  # 4: zero-length op
        instant(60, {"Bytes": 1, "Addr": 1, **gpu, "Device Type": 6}),  # 5: after outer: no op, step 1
        instant(70, {"Bytes": 2, "Addr": 2, **gpu}),                    # 6: child (starts with its parent)
        instant(85, {"Bytes": 3, "Addr": 3, **gpu}),                    # 7: parent
        instant(150, {"Bytes": 4, "Addr": 4, **gpu}, tid=2),            # 8: worker thread, step 2
        instant(150, {"Bytes": 5, "Addr": 5, **gpu, "Device Type": 99}, tid=3),  # 9: no op on thread 3
        instant(250, {"Bytes": 0, "Addr": 6, **gpu}),                   # 10: outside the steps
        instant(22, {"Bytes": 1 << 40, **gpu}, "[OutOfMemory]"),        # 11: inner, oom
    ]
    path = tmp_path / "hand.json"
    path.write_text(json.dumps({"schemaVersion": 1, "baseTimeNanoseconds": 1000, "traceEvents": events}))
    tables = parse_both(path, tmp_path)
    rows = {r["event_id"] - 8: r for r in tables["memory_events"].to_pylist()}
    assert {n: (r["op"], r["step"]) for n, r in rows.items()} == {
        1: ("inner", 1), 2: ("outer", 1), 3: ("outer", 1), 4: ("zero", 1), 5: (None, 1), 6: ("child", 1),
        7: ("parent", 1), 8: ("worker", 2), 9: (None, 2), 10: (None, None), 11: ("inner", 1)}
    assert {n: r["kind"] for n, r in rows.items()} == {
        1: "alloc", 2: "free", 3: None, 4: "alloc", 5: "alloc", 6: "alloc", 7: "alloc", 8: "alloc", 9: "alloc",
        10: None, 11: "oom"}
    assert [(rows[n]["device"], rows[n]["device_type"]) for n in (1, 4, 5, 9)] == [
        (0, "cuda"), (-1, "cpu"), (0, "hip"), (0, None)]
    assert [rows[n]["addr"] for n in (1, 3, 4, 11)] == [4096, None, 16, None]
    assert rows[3]["bytes"] is None and rows[11]["bytes"] == 1 << 40
    assert rows[1]["ts_ns"] == 1000 + 25_000 and rows[1]["tid"] == 1 and rows[1]["pid"] == 7
    assert (rows[1]["total_allocated"], rows[1]["total_reserved"]) == (512, 2048)
    # The allocator totals are in memory_events only: counters holds the trace's own `C` events (none here).
    assert tables["counters"].num_rows == 0
    host = {r["name"]: r["record_function_id"] for r in tables["host_ops"].to_pylist()}
    assert (host["outer"], host["inner"], host["worker"], host["zero"]) == (11, 12, None, None)


def test_memory_instants_where_no_op_runs_keep_a_null_op(tmp_path: Path) -> None:
    """Instants on a thread with no ``cpu_op`` (so no op to name, nothing for the names' ranges): every engine keeps
    each instant, with no op and the step of its time."""
    gpu: dict[str, object] = {"Device Type": 1, "Device Id": 0, "Total Allocated": 0, "Total Reserved": 0}
    events: list[object] = [op("ProfilerStep#1", 0, 100, cat="user_annotation"),
                            op("annotation", 10, 20, cat="user_annotation"),
                            instant(15, {"Bytes": 8, "Addr": 1, **gpu}), instant(120, {"Bytes": -8, "Addr": 1, **gpu})]
    path = tmp_path / "no_ops.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    rows = parse_both(path, tmp_path)["memory_events"].to_pylist()
    assert [(r["bytes"], r["op"], r["step"]) for r in rows] == [(8, None, 1), (-8, None, None)]


@pytest.mark.parametrize("order", ["by time", "shuffled", "two threads"])
def test_the_table_is_kept_by_time_merged_or_sorted(order: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                    ) -> None:
    """Instants in time order in the file are merged with their op and step (no sort), out of it sorted: either way
    the file holds them by time, then event id, with the same rows in both engines."""
    rng = np.random.default_rng(5)
    events: list[object] = [op("ProfilerStep#1", 0, 500, cat="user_annotation")]
    events += [op(f"op{i}", 10 * i, 8) for i in range(40)]
    instants = [instant(10 * i + 2 * k, {"Bytes": k + 1, "Addr": 16 * i + k, "Device Type": 1, "Device Id": 0},
                        tid=1 + (order == "two threads") * (k % 2)) for i in range(40) for k in range(3)]
    instants += [instant(t, {"Bytes": 9, "Addr": 9, "Device Type": 1, "Device Id": 0}) for t in (74, 19)]
    instants.sort(key=lambda e: e["ts"])  # in time order in the file
    if order == "shuffled":
        instants = [instants[i] for i in rng.permutation(len(instants))]
    elif order == "two threads":  # each thread in time order, the second written after the first
        instants = [e for e in instants if e["tid"] == 1] + [e for e in instants if e["tid"] == 2]
    path = tmp_path / "ordered.json"
    path.write_text(json.dumps({"traceEvents": events + instants}))
    merged: list[bool] = []
    original = kineto_sql_tables._memory_merged
    monkeypatch.setattr(kineto_sql_tables, "_memory_merged", lambda *a, **k: merged.append(original(*a, **k))
                        or merged[-1])
    tables = parse_both(path, tmp_path)
    staging = tmp_path / f"{path.name}-{ENGINES[-1]}-0"
    stored = pq.read_table(staging / "memory_events.parquet")
    keys = list(zip(stored.column("ts_ns").to_pylist(), stored.column("event_id").to_pylist(), strict=True))
    assert keys == sorted(keys) and len(keys) == 122
    assert stored.cast(tables["memory_events"].schema).sort_by("event_id").equals(tables["memory_events"])
    ops = {(r["ts_ns"] // 1000, r["tid"]): r["op"] for r in stored.to_pylist()}
    assert (ops[(14, 1)], ops[(19, 1)], ops[(74, 1)]) == ("op1", None, "op7")  # inside op1, after it, inside op7
    second = order == "two threads"
    assert ops[(12, 2 if second else 1)] == (None if second else "op1")  # the second thread runs no op
    assert merged[-1] is (order == "by time")  # the native engine's, parsed last


@pytest.mark.parametrize(("parts", "ordered"), [
    ([[(1, 5), (2, 5)], [(3, 7)]], True),
    ([[(1, 5), (2, 4)], [(3, 7)]], False),   # back in time within a part
    ([[(1, 5), (2, 8)], [(3, 7)]], False),   # ... from one part to the next
    ([[(1, 5), (2, None)], [(3, 7)]], False),  # an instant without a time
    ([[(1, 5), (3, 6)], [(2, 7)]], False),   # the event ids not in file order
    ([[], [(3, 7)]], True),
])
def test_instants_in_time_order_are_told_apart(parts: list[list[tuple[int, int | None]]], ordered: bool,
                                               tmp_path: Path) -> None:
    for n, rows in enumerate(parts):
        pq.write_table(pa.table({"event_id": pa.array([r[0] for r in rows], pa.int64()),
                                 "ts_ns": pa.array([r[1] for r in rows], pa.int64())}),
                       tmp_path / f"memory-{n:06d}.parquet")
    assert kineto_sql_facts._in_time_order(tmp_path) is ordered


def test_a_trace_without_memory_instants_has_an_empty_table(tmp_path: Path) -> None:
    path = tmp_path / "plain.json"
    path.write_text(json.dumps({"traceEvents": [op("a", 0, 1)]}))
    tables = parse_both(path, tmp_path)
    assert tables["memory_events"].num_rows == 0
    assert tables["memory_events"].column_names[:3] == ["trace_id", "event_id", "rank"]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_device_id_beyond_32_bits_is_an_error_naming_the_file(engine: str, tmp_path: Path) -> None:
    """As for the memory counters: the native scanner names the event too; DuckDB's reader cannot tell which."""
    path = tmp_path / "bad-device.json"
    events = [op("a", 0, 5), instant(1, {"Bytes": 5, "Device Type": 1, "Device Id": 1 << 40}, "[OutOfMemory]")]
    path.write_text(json.dumps({"traceEvents": events}))
    with pytest.raises(TraceFormatError, match="bad-device.json") as caught:
        ingest.parse_into(path, tmp_path, ParseOptions(source_name=path.name, kineto_engine=engine))
    if engine == "native":
        assert "'Device Id' out of range" in str(caught.value) and "traceEvents[1]" in str(caught.value)
