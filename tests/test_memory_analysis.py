"""Memory analyses (docs/analyses.md, "Memory"): exact answers on built sequences, properties on generated
ones, and the real H200 traces and real Kineto traces read here from their raw JSON, independently of ingest."""

from __future__ import annotations

import bisect
import gzip
import itertools
import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st

from support import REAL_TRACES, ROOT, real_kineto_files
from tracelake.analysis import memory, memory_findings

H200 = ROOT / "sample_traces" / "gpu_h200"
MIB = 1 << 20


# ---------------------------------------------------------------- builders
def build(ops: list[tuple], before: int = 0, device: int = 0, rank: int = 0, trace: str = "t",
          reserve: int = 0) -> pl.DataFrame:
    """``memory_events`` rows from (kind, addr, bytes, op, step) tuples, the totals chained by a running sum here.

    ``before`` bytes were allocated before the first event; reserved is the running max of allocated plus ``reserve``.
    """
    rows, total, high = [], before, before
    for i, (kind, addr, size, op, step) in enumerate(ops):
        if kind != "oom":
            total += size
        high = max(high, total)
        rows.append({"trace_id": trace, "rank": rank, "pid": 1, "tid": 1, "device": device, "device_type": "cuda",
                     "ts_ns": 1000 * (i + 1), "kind": kind, "addr": addr, "bytes": size, "total_allocated": total,
                     "total_reserved": high + reserve, "op": op, "step": step})
    schema = {"trace_id": pl.String, "rank": pl.Int64, "pid": pl.Int64, "tid": pl.Int64, "device": pl.Int64,
              "device_type": pl.String, "ts_ns": pl.Int64, "kind": pl.String, "addr": pl.Int64, "bytes": pl.Int64,
              "total_allocated": pl.Int64, "total_reserved": pl.Int64, "op": pl.String, "step": pl.Int64}
    return pl.DataFrame(rows, schema=schema)


def devices(capacity: int, device: int = 0, rank: int = 0, trace: str = "t") -> pl.DataFrame:
    return pl.DataFrame({"trace_id": [trace], "rank": [rank], "device": [device], "kind": ["gpu"],
                         "memory_bytes": [capacity]})


def replay_live(ops: list[tuple], before: int) -> tuple[int, dict[int, int], int]:
    """Independent replay: (index of the first max total, live blocks {addr: bytes} there, pre-existing bytes there)."""
    totals = list(itertools.accumulate((o[2] if o[0] != "oom" else 0 for o in ops), initial=before))[1:]
    peak = totals.index(max(totals))
    live: dict[int, int] = {}
    pre = before
    for kind, addr, size, _op, _step in ops[:peak + 1]:
        if kind == "alloc":
            live[addr] = size
        elif kind == "free":
            if addr in live:
                del live[addr]
            else:
                pre += size
    return peak, live, pre


# ---------------------------------------------------------------- exact answers on a built sequence
def test_known_live_set_and_reconciliation() -> None:
    ops = [("alloc", 1, 100, "aten::mm", 1), ("alloc", 2, 200, "aten::add", 1), ("free", 9, -300, None, 1),
           ("alloc", 3, 50, "aten::mm", 1), ("alloc", 4, 400, None, 1), ("free", 4, -400, None, 1),
           ("alloc", 5, 1000, "aten::cat", 2), ("free", 1, -100, None, 2), ("free", 5, -1000, None, 2)]
    events = build(ops, before=1000, reserve=64)
    peak = memory.peaks(events, devices(10_000)).row(0, named=True)
    # totals: 1100 1300 1000 1050 1450 1050 2050 1950 950
    assert peak["peak_allocated_bytes"] == 2050 and peak["peak_ts_ns"] == 7000 and peak["peak_step"] == 2
    assert peak["before_trace_bytes"] == 1000 and peak["peak_reserved_bytes"] == 2050 + 64
    assert peak["fragmentation_bytes"] == 64 and peak["capacity_bytes"] == 10_000
    assert peak["headroom_bytes"] == 10_000 - 2114 and peak["headroom_pct"] == pytest.approx(100 * 7886 / 10_000)
    [live] = memory.live_at_peak(events, top=2)
    assert (live.allocated_bytes, live.live_bytes, live.live_blocks, live.before_trace_bytes, live.residual_bytes) == (
        2050, 1350, 4, 700, 0)
    assert [(s.op, s.blocks, s.bytes) for s in live.by_op] == [("aten::cat", 1, 1000), ("aten::add", 1, 200),
                                                                (memory.OTHER_OPS, 2, 150)]
    assert sum(s.share_pct for s in live.by_op) + 100 * 700 / 2050 == pytest.approx(100)


def test_totals_that_do_not_chain_leave_a_residual() -> None:
    lost = build([("alloc", 1, 10, None, None), ("free", 1, -10, None, None), ("free", 1, -100, None, None),
                  ("alloc", 2, 500, None, None)], before=100)  # a free after a free: it freed a block from before
    [live] = memory.live_at_peak(lost)
    assert (live.allocated_bytes, live.live_bytes, live.before_trace_bytes, live.residual_bytes) == (500, 500, 0, 0)
    events = build([("alloc", 1, 100, None, None), ("alloc", 2, 100, None, None)])
    events = events.with_columns(pl.when(pl.col("addr") == 2).then(pl.col("total_allocated") + 7)
                                 .otherwise(pl.col("total_allocated")).alias("total_allocated"))
    [live] = memory.live_at_peak(events)
    assert (live.allocated_bytes, live.live_bytes, live.residual_bytes) == (207, 200, 7)


def test_no_capacity_no_headroom_and_cpu_reserves_nothing() -> None:
    events = build([("alloc", 1, 8, None, None)], device=-1).with_columns(pl.lit(0).alias("total_reserved"))
    row = memory.peaks(events).row(0, named=True)
    assert row["capacity_bytes"] is None and row["headroom_pct"] is None and row["fragmentation_bytes"] is None


def test_peaks_accept_ts_and_reject_missing_columns() -> None:
    events = build([("alloc", 1, 8, None, None)]).rename({"ts_ns": "ts"})
    assert memory.peaks(events)["peak_ts_ns"].to_list() == [1000]
    with pytest.raises(Exception, match="total_reserved"):
        memory.peaks(events.drop("total_reserved"))


# ---------------------------------------------------------------- properties on generated sequences
@st.composite
def sequences(draw: Any) -> tuple[list[tuple], int]:
    """Alloc/free sequences: frees of blocks allocated in the sequence and of blocks allocated before it."""
    pre = draw(st.lists(st.integers(1, 1 << 20), max_size=5))
    before = sum(pre)
    pre_live = {1_000_000 + i: size for i, size in enumerate(pre)}
    live: dict[int, int] = {}
    freed: set[int] = set()  # addresses free again: the caching allocator hands them out anew
    ops: list[tuple] = []
    next_addr = 1
    for _ in range(draw(st.integers(1, 60))):
        choice = draw(st.integers(0, 9))
        if choice < 5 or not (live or pre_live):
            size = draw(st.integers(1, 1 << 24))
            addr = draw(st.sampled_from(sorted(freed))) if freed and draw(st.booleans()) else next_addr
            next_addr += addr == next_addr
            freed.discard(addr)
            ops.append(("alloc", addr, size, draw(st.sampled_from(["a", "b", "c", None])), None))
            live[addr] = size
        elif choice < 9 and live:
            addr = draw(st.sampled_from(sorted(live)))
            ops.append(("free", addr, -live.pop(addr), None, None))
            freed.add(addr)
        elif pre_live:
            addr = draw(st.sampled_from(sorted(pre_live)))
            ops.append(("free", addr, -pre_live.pop(addr), None, None))
            freed.add(addr)
        else:
            ops.append(("oom", None, draw(st.integers(1, 1 << 40)), None, None))
    return ops, before


@given(sequences(), st.integers(0, 1 << 30), st.integers(0, 1 << 26))
def test_generated_peaks_live_sets_and_bounds(seq: tuple[list[tuple], int], capacity: int, reserve: int) -> None:
    ops, before = seq
    events = build(ops, before=before, reserve=reserve)
    running = list(itertools.accumulate((o[2] if o[0] != "oom" else 0 for o in ops), initial=before))[1:]
    row = memory.peaks(events, devices(capacity) if capacity else None).row(0, named=True)
    assert row["peak_allocated_bytes"] == max(running)
    assert row["peak_ts_ns"] == 1000 * (running.index(max(running)) + 1)
    assert row["before_trace_bytes"] == (before if any(o[0] != "oom" for o in ops) else None)
    at = running.index(max(running))
    assert row["reserved_at_peak_bytes"] == max([before, *running[:at + 1]]) + reserve
    # reserved >= allocated in every built event: fragmentation is their difference, never negative
    assert row["fragmentation_bytes"] == row["reserved_at_peak_bytes"] - row["peak_allocated_bytes"] >= reserve
    if capacity:
        assert 0 <= row["headroom_pct"] <= 100 and 0 <= row["headroom_bytes"] <= capacity
    peak, live_set, pre = replay_live(ops, before)
    [live] = memory.live_at_peak(events, top=2)
    assert live.live_bytes == sum(live_set.values()) and live.live_blocks == len(live_set)
    assert live.before_trace_bytes == pre and live.residual_bytes == 0
    assert live.live_bytes + live.before_trace_bytes == row["peak_allocated_bytes"]
    assert all(0 <= s.share_pct <= 100 for s in live.by_op) and sum(s.share_pct for s in live.by_op) <= 100 + 1e-9


@given(st.integers(0, 1 << 26), st.integers(2, 12), st.lists(st.integers(1, 1 << 24), min_size=1, max_size=6),
       st.integers(0, 1 << 30), st.randoms(use_true_random=False))
def test_growth_slope_equals_a_known_leak(leak: int, steps: int, temporaries: list[int], before: int,
                                          rnd: Any) -> None:
    ops, addr = [], 1
    for step in range(1, steps + 1):
        held = []
        for size in temporaries:  # freed by the step's end, their sizes varying from step to step
            size = rnd.randint(1, size)
            ops.append(("alloc", addr, size, "aten::mm", step))
            held.append((addr, size))
            addr += 1
        if leak:
            ops.append(("alloc", addr, leak, "aten::clone", step))  # kept: the leak
            addr += 1
        ops += [("free", a, -s, None, step) for a, s in held]
    row = memory.growth(build(ops, before=before), devices(1 << 40)).row(0, named=True)
    steady = steps - 1 if steps >= 3 else steps
    assert row["steady_steps"] == steady
    if steady >= 2:
        assert row["slope_bytes_per_step"] == leak  # exact: integer least squares on a noise-free line
        assert row["growth_bytes"] == leak * (steady - 1)
    assert row["leak"] == (steady >= memory.LEAK_MIN_STEPS and leak > 0 and (
        leak * (steady - 1) >= memory.LEAK_SHARE * (1 << 40) or row["steps_to_full"] <= memory.LEAK_HORIZON_STEPS))


@given(st.lists(st.integers(-(1 << 30), 1 << 30), min_size=3, max_size=20))
def test_growth_never_claims_more_than_measured(points: list[int]) -> None:
    base = 1 << 32
    ops, total = [], 0
    for step, value in enumerate(points, start=1):
        delta = base + value - total
        ops.append(("alloc" if delta >= 0 else "free", step, delta, None, step))
        total += delta
    row = memory.growth(build(ops)).row(0, named=True)
    lows = [min(a, b) for a, b in itertools.pairwise(points)]  # each step's low: where it started, or its own total
    measured = max(lows) - min(lows)
    assert abs(row["growth_bytes"]) <= measured


@st.composite
def timelines(draw: Any) -> list[list[int]]:
    rows: list[list[int]] = [[-1, 1, draw(st.integers(1, 1 << 20)), draw(st.integers(0, 7))]
                             for _ in range(draw(st.integers(0, 3)))]
    live: list[tuple[int, int]] = []
    t = 10
    for _ in range(draw(st.integers(1, 40))):
        t += draw(st.integers(0, 2))  # repeated timestamps: the total is read after all of them
        action = draw(st.integers(2, 4))
        if action == 2 or not live:
            size, cat = draw(st.integers(1, 1 << 20)), draw(st.integers(0, 7))
            rows.append([t, 2, size, cat])
            live.append((size, cat))
        elif action == 3:
            size, cat = live.pop(draw(st.integers(0, len(live) - 1)))
            new = draw(st.integers(0, 7))
            rows += [[t, 3, -size, cat], [t, 3, size, new]]
            live.append((size, new))
        else:
            size, cat = live.pop(draw(st.integers(0, len(live) - 1)))
            rows.append([t, 4, -size, cat])
    return rows


def replay_timeline(rows: list[list[int]]) -> tuple[int, dict[str, int]]:
    """Independent replay of raw export rows: the first timestamp's largest total, and each category's bytes then."""
    by_cat: Counter[int] = Counter()
    best: tuple[int, dict[str, int]] = (-1, {})
    for _t, group in itertools.groupby(rows, key=lambda r: r[0]):
        for _, _, size, cat in group:
            by_cat[cat] += size
        total = sum(by_cat.values())
        if total > best[0]:
            best = (total, {memory.TIMELINE_CATEGORIES[c]: b for c, b in by_cat.items()})
    return best


def timeline_frame(rows: list[list[int]]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema={"ts_ns": pl.Int64, "action": pl.Int64, "bytes": pl.Int64, "category": pl.Int64},
                        orient="row")


def _nonzero(out: pl.DataFrame) -> dict[str, int]:
    return {c: b for c, b in zip(out["category"], out["bytes"], strict=True) if b}


@given(timelines())
def test_generated_timeline_categories_at_peak(rows: list[list[int]]) -> None:
    total, cats = replay_timeline(rows)
    out = memory.by_category_at_peak(timeline_frame(rows))
    assert _nonzero(out) == {c: b for c, b in cats.items() if b}
    assert set(out["category"]) == {memory.TIMELINE_CATEGORIES[r[3]] for r in rows}  # every category, 0 or not
    assert set(out["peak_bytes"]) == {total}
    assert all(0 <= s <= 100 for s in out["share_pct"]) and sum(out["share_pct"]) <= 100 + 1e-9


def test_timeline_names_and_a_bad_action() -> None:
    frame = pl.DataFrame({"ts_ns": [-1, 5, 6], "action": ["preexisting", "create", "destroy"],
                          "bytes": [10, 20, -20], "category": ["parameter", "activation", "activation"]})
    out = memory.by_category_at_peak(frame)
    assert dict(zip(out["category"], out["bytes"], strict=True)) == {"parameter": 10, "activation": 20}
    assert out["peak_ts_ns"].to_list() == [5, 5]
    with pytest.raises(Exception, match="action 'resize'"):
        memory.by_category_at_peak(frame.with_columns(pl.lit("resize").alias("action")))


def test_churn_counts_synchronising_calls_apart_from_async_ones() -> None:
    events = build([("alloc", s, 10, None, s) for s in (1, 2, 3)] + [("alloc", 9, 5, None, None)])
    names = ["cudaMalloc", "cudaFree", "cudaMallocAsync", "hipFree", "cudaLaunchKernel", "cudaFreeAsync", "cudaMalloc"]
    host = pl.DataFrame({"trace_id": "t", "rank": 0, "name": names, "dur_ns": [5, 7, 100, 11, 1, 100, 3],
                         "step": [1, 2, 2, 3, 3, 3, None]})
    rows = memory.churn(events, host)
    assert rows.select("step", "steady", "allocs", "malloc_calls", "free_calls", "async_calls", "sync_call_ns").rows() \
        == [(1, False, 1, 1, 0, 0, 5), (2, True, 1, 0, 1, 1, 7), (3, True, 1, 0, 1, 1, 11)]
    [finding] = memory_findings.from_churn(rows)
    assert finding.title == "cudaFree called 2 times in 2 steady-state steps on rank 0"
    assert finding.gain_ns == 18


def test_empty_inputs_give_empty_answers() -> None:
    events = build([]).clear()
    host = pl.DataFrame(schema={"trace_id": pl.String, "rank": pl.Int64, "name": pl.String, "step": pl.Int64})
    assert memory.peaks(events).is_empty() and memory.live_at_peak(events) == []
    assert memory.growth(events).is_empty() and memory.churn(events, host).is_empty()
    assert memory.imbalance(memory.peaks(events)) is None
    assert memory_findings.findings(memory.peaks(events), ooms=memory.out_of_memory(events),
                                    growth_rows=memory.growth(events), churn_rows=memory.churn(events, host)) == []


def test_imbalance_and_its_finding() -> None:
    rows = pl.concat([memory.peaks(build([("alloc", 1, size, None, None)], rank=r, trace=f"t{r}"))
                      for r, size in enumerate([40, 42, 60, 41])])
    result = memory.imbalance(rows)
    assert result is not None and (result.max_rank, result.min_rank, result.ranks) == (2, 0, 4)
    assert result.median_bytes == 41.5 and result.ratio == pytest.approx(60 / 41.5)
    [finding] = memory_findings.from_imbalance(result)
    assert finding.title == "rank 2's peak is 1.4x the median rank's" and finding.ranks == (2,)
    assert memory.imbalance(rows.head(1)) is None


def test_headroom_and_fragmentation_findings() -> None:
    gib = 1 << 30
    events = build([("alloc", 1, 70 * gib, "aten::mm", 12)], reserve=8 * gib)
    rows = memory.peaks(events, devices(80 * gib))
    found = {f.kind: f for f in memory_findings.from_peaks(rows, memory.live_at_peak(events))}
    assert found["memory_headroom"].title == "rank 0 peaks at 78.0 of 80.0 GiB reserved (2% headroom) in step 12"
    assert "aten::mm 70.0 GiB (100%)" in found["memory_headroom"].detail
    assert found["memory_fragmentation"].title.startswith("reserved exceeds allocated by 8.0 GiB at the peak")
    assert "expandable_segments:True" in found["memory_fragmentation"].detail
    over = memory.peaks(build([("alloc", 1, 90 * gib, None, None)]), devices(80 * gib))  # bad capacity: still bounded
    assert over["headroom_pct"].to_list() == [0.0]
    assert "(0% headroom)" in memory_findings.from_peaks(over)[0].title


# ---------------------------------------------------------------- real traces, read here from the raw JSON
DEVICE_TYPES = {0: "cpu", 1: "cuda", 6: "hip"}


def _ns(us: float) -> int:
    return round(us * 1000)


def _innermost(ops: list[tuple[int, int, str]], t: int) -> str | None:
    """The latest-starting op on a thread that contains ``t`` (the innermost, ops nesting on a thread)."""
    i = bisect.bisect_right(ops, (t, float("inf"), "")) - 1
    while i >= 0:
        if ops[i][1] >= t:
            return ops[i][2]
        i -= 1
    return None


def kineto_memory(path: Path, trace: str = "t", rank: int = 0) -> tuple[dict, pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """The trace, and ``memory_events``-, ``host_ops``- and ``devices``-shaped frames built from its raw JSON."""
    with gzip.open(path) if path.name.endswith(".gz") else path.open("rb") as f:
        top = json.load(f)
    events = top["traceEvents"] if isinstance(top, dict) else top
    steps = sorted((_ns(e["ts"]), _ns(e["ts"] + e["dur"]), int(e["name"].split("#")[1])) for e in events
                   if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("ProfilerStep#"))

    def step_of(ts: int) -> int | None:
        return next((s for a, b, s in steps if a <= ts <= b), None)

    threads: dict[tuple, list[tuple[int, int, str]]] = defaultdict(list)
    for e in events:
        if e.get("cat") == "cpu_op" and e.get("ph") == "X":
            threads[(e.get("pid"), e.get("tid"))].append((_ns(e["ts"]), _ns(e["ts"] + e.get("dur", 0)), e["name"]))
    for ops in threads.values():
        ops.sort()
    rows = []
    for e in events:
        if e.get("name") not in ("[memory]", "[OutOfMemory]"):
            continue
        a, ts = e["args"], _ns(e["ts"])
        size = int(a["Bytes"])
        kind = "oom" if e["name"] == "[OutOfMemory]" else "alloc" if size > 0 else "free"
        rows.append({"trace_id": trace, "rank": rank, "pid": e.get("pid"), "tid": e.get("tid"),
                     "device": int(a["Device Id"]), "device_type": DEVICE_TYPES.get(a["Device Type"], "other"),
                     "ts_ns": ts, "kind": kind, "addr": a.get("Addr"), "bytes": size,
                     "total_allocated": int(a["Total Allocated"]), "total_reserved": int(a["Total Reserved"]),
                     "op": _innermost(threads.get((e.get("pid"), e.get("tid")), []), ts), "step": step_of(ts)})
    host = [{"trace_id": trace, "rank": rank, "cat": e.get("cat"), "name": e["name"], "ts_ns": _ns(e["ts"]),
             "dur_ns": _ns(e.get("dur", 0)), "step": step_of(_ns(e["ts"]))}
            for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    host_frame = pl.DataFrame(host, schema={"trace_id": pl.String, "rank": pl.Int64, "cat": pl.String,
                                            "name": pl.String, "ts_ns": pl.Int64, "dur_ns": pl.Int64, "step": pl.Int64})
    props = top.get("deviceProperties", []) if isinstance(top, dict) else []
    devs = pl.DataFrame([{"trace_id": trace, "rank": rank, "device": d["id"], "kind": "gpu",
                          "memory_bytes": d.get("totalGlobalMem")} for d in props],
                        schema={"trace_id": pl.String, "rank": pl.Int64, "device": pl.Int64, "kind": pl.String,
                                "memory_bytes": pl.Int64})
    return top, pl.DataFrame(rows, infer_schema_length=None), host_frame, devs


def _own_maxima(top: dict) -> dict[int, tuple[int, int]]:
    out: dict[int, tuple[int, int]] = {}
    for e in top["traceEvents"]:
        if e.get("name") in ("[memory]", "[OutOfMemory]"):
            a = e["args"]
            alloc, res = out.get(a["Device Id"], (0, 0))
            out[a["Device Id"]] = (max(alloc, a["Total Allocated"]), max(res, a["Total Reserved"]))
    return out


def _check_real(path: Path) -> tuple[dict, pl.DataFrame, pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    top, events, host, devs = kineto_memory(path)
    if events.is_empty():
        pytest.skip(f"{path.name} has no memory events")
    rows = memory.peaks(events, devs)
    assert {r["device"]: (r["peak_allocated_bytes"], r["peak_reserved_bytes"]) for r in rows.iter_rows(named=True)} \
        == _own_maxima(top)
    for live in memory.live_at_peak(events):
        # these traces' totals chain event to event: live + allocated-before-the-trace is the total, exactly
        assert live.residual_bytes == 0 and live.live_bytes + live.before_trace_bytes == live.allocated_bytes
    for row in rows.filter(pl.col("capacity_bytes").is_not_null()).iter_rows(named=True):
        assert 0 <= row["headroom_pct"] <= 100
        assert row["capacity_bytes"] == next(d["totalGlobalMem"] for d in top["deviceProperties"]
                                             if d["id"] == row["device"])
    return top, events, host, devs, rows


def _runtime_calls_per_step(top: dict) -> Counter[tuple[str, int]]:
    """cudaMalloc/cudaFree ``cuda_runtime`` events counted per ProfilerStep span, from the raw events."""
    spans = [(e["ts"], e["ts"] + e["dur"], int(e["name"].split("#")[1])) for e in top["traceEvents"]
             if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("ProfilerStep#")]
    return Counter((e["name"], s) for e in top["traceEvents"]
                   if e.get("cat") == "cuda_runtime" and e["name"] in ("cudaMalloc", "cudaFree")
                   for a, b, s in spans if a <= e["ts"] <= b)


def test_h200_leak_trace() -> None:
    top, events, host, devs, rows = _check_real(H200 / "leak" / "leak.pt.trace.json.gz")
    gpu = rows.filter(pl.col("device") == 0).row(0, named=True)
    assert gpu["capacity_bytes"] == 150_109_880_320 and gpu["ooms"] == 1
    # Each step keeps one 2048x4096 fp32 tensor (32 MiB) and frees everything else: the lowest total of
    # each step rises by exactly that; 1% tolerates a stray small allocation kept in a step (a scalar, a
    # cuBLAS workspace) without hiding a wrong slope (the next fp32 tensor shape off would be >= 3% away).
    [grow] = memory.growth(events, devs).filter(pl.col("device") == 0).iter_rows(named=True)
    assert grow["slope_bytes_per_step"] == pytest.approx(32 * MIB, rel=0.01)
    assert grow["leak"] and grow["steady_steps"] == 4 and grow["rising_steps"] == 3
    assert grow["growth_bytes"] <= grow["steady_steps"] * 32 * MIB
    churn = memory.churn(events, host)
    calls = _runtime_calls_per_step(top)
    for row in churn.iter_rows(named=True):
        assert row["malloc_calls"] == calls[("cudaMalloc", row["step"])]
        assert row["free_calls"] == calls[("cudaFree", row["step"])]
    steady = churn.filter(pl.col("steady"))
    assert steady["step"].to_list() == [5, 6, 7, 8] and steady["free_calls"].sum() == 40
    assert steady["malloc_calls"].sum() == sum(n for (name, s), n in calls.items() if name == "cudaMalloc" and s > 4)
    oom = memory.out_of_memory(events).row(0, named=True)
    assert oom["step"] == 8 and oom["requested_bytes"] == 1 << 48
    found = memory_findings.findings(rows, live=memory.live_at_peak(events), ooms=memory.out_of_memory(events),
                                     growth_rows=memory.growth(events, devs), churn_rows=churn)
    kinds = {f.kind: f for f in found}
    assert set(kinds) == {"out_of_memory", "memory_growth", "allocator_churn"}  # 99% headroom: no headroom finding
    assert kinds["out_of_memory"].title == "rank 0 ran out of device memory once"
    assert "in step 8 asked for 256.0 TiB" in kinds["out_of_memory"].detail
    assert kinds["memory_growth"].title == "allocated grows 32.0 MiB per step over 4 steps on rank 0"
    assert kinds["allocator_churn"].title.startswith("cudaMalloc called 46 times and cudaFree 40 times in 4 steady")
    assert 0 < kinds["allocator_churn"].gain_ns <= int(steady["sync_call_ns"].sum())


def test_h200_train_trace() -> None:
    top, events, host, devs, rows = _check_real(H200 / "train" / "train.pt.trace.json.gz")
    row = rows.row(0, named=True)
    assert row["before_trace_bytes"] > 0  # the profile starts with the model and optimizer state allocated
    [grow] = memory.growth(events, devs).iter_rows(named=True)
    assert not grow["leak"]
    [live] = memory.live_at_peak(events, top=3)
    assert live.by_op and live.by_op[0].op != memory.NO_OP  # the trace records its operators
    assert memory.churn(events, host).filter(pl.col("steady"))["malloc_calls"].sum() == 0
    assert memory_findings.findings(rows, growth_rows=memory.growth(events, devs),
                                    churn_rows=memory.churn(events, host)) == []


@pytest.mark.parametrize("path", real_kineto_files(), ids=lambda p: p.parent.name)
def test_real_kineto_traces(path: Path) -> None:
    _check_real(path)


TIMELINES = [H200 / "train" / "memory_timeline.raw.json.gz",
             REAL_TRACES / "pytorch_other" / "hta_memory_analysis" / "memory_timeline.raw.gz"]


@pytest.mark.parametrize("path", TIMELINES, ids=lambda p: p.parent.name)
def test_real_memory_timeline(path: Path) -> None:
    if not path.exists():
        pytest.skip(f"{path} is not present")
    with gzip.open(path) as f:
        rows = json.load(f)
    total, cats = replay_timeline(rows)
    out = memory.by_category_at_peak(timeline_frame(rows))
    assert _nonzero(out) == {c: b for c, b in cats.items() if b}
    assert out["peak_bytes"][0] == total and sum(out["bytes"]) == total
