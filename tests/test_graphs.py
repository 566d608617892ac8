"""CUDA/HIP graph launches (docs/analyses.md, "Launches", "CUDA/HIP graphs").

Checked against counts made here with plain json/gzip on the real SGLang decode trace (one
``hipGraphLaunch`` starting 544 kernels) and on generated traces with ``cudaGraphLaunch``;
on random timelines, the windowed implementation (:class:`LaunchParts`, :func:`graph_rows`)
against the SQL oracle and both against a plain-Python one.
"""

from __future__ import annotations

import gzip
import json
import random
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oracles.derived import write_derived_sql
from oracles.launches import graph_launches_sql, launch_stats_sql, queue_lengths_sql
from tracelake.analysis import critical_path
from tracelake.analysis.graphs import graph_rows
from tracelake.analysis.launches import GRAPH_CALL, LaunchParts, launch_calls, shared_correlations
from tracelake.contracts.critical import Scenario
from tracelake.warehouse import Warehouse

SGLANG = "tracelens_inference_sglang_decode_sglang_Qwen3-8B_decode"
DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "cuda_sync"}


# -- independent counts from the JSON -------------------------------------------------------------

def _events(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as fh:
        data = json.load(fh)
    return data["traceEvents"] if isinstance(data, dict) else data


def _ns(us: float) -> int:
    return round(us * 1000)


class _Counted:
    """What the trace says about its launches, counted with plain Python."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.kernels = [e for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"
                        and "correlation" in e.get("args", {})]
        self.calls = {e["args"]["correlation"]: e for e in events if e.get("ph") == "X"
                      and e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
        per_id = Counter(k["args"]["correlation"] for k in self.kernels)
        self.graph_ids = {c for c, call in self.calls.items() if re.match(r"(cu|cuda|hip)GraphLaunch", call["name"])}
        self.graph_ids |= {c for c, n in per_id.items() if n > 1 and c in self.calls}
        self.by_graph: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for k in self.kernels:
            if k["args"]["correlation"] in self.graph_ids:
                self.by_graph[k["args"]["correlation"]].append(k)
        self.single = [k for k in self.kernels if k["args"]["correlation"] in self.calls
                       and k["args"]["correlation"] not in self.graph_ids]

    def graph(self, correlation: int) -> dict[str, int]:
        """Kernels, device time, span and gaps of one graph launch, by a sweep over its sorted kernels."""
        spans = sorted((_ns(k["ts"]), _ns(k["ts"]) + _ns(k["dur"])) for k in self.by_graph[correlation])
        busy, cur_lo, cur_hi = 0, *spans[0]
        for lo, hi in spans[1:]:
            if lo > cur_hi:
                busy += cur_hi - cur_lo
                cur_lo, cur_hi = lo, hi
            else:
                cur_hi = max(cur_hi, hi)
        busy += cur_hi - cur_lo
        first, last = spans[0][0], max(hi for _, hi in spans)
        return {"kernels": len(spans), "device_ns": sum(hi - lo for lo, hi in spans), "span_ns": last - first,
                "gaps_ns": last - first - busy}


def _ingest(path: Path, home: Path, job: str) -> Warehouse:
    wh = Warehouse(home)
    report = wh.ingest([path], job=job)
    assert report.ok, [r.error for r in report.failed]
    return wh


# -- the real SGLang decode trace -------------------------------------------------------------------

@pytest.fixture
def sglang(real_kineto: Path, tmp_path: Path) -> tuple[Warehouse, _Counted, Path]:
    """The SGLang decode trace (its README: a hipGraphLaunch whose correlation 544 kernels share), ingested."""
    if not (real_kineto / SGLANG).is_dir():
        pytest.skip(f"../shared/real_traces has no {SGLANG}")
    (path,) = sorted((real_kineto / SGLANG).glob("*.json*"))
    return _ingest(path, tmp_path / "warehouse", "sglang"), _Counted(_events(path)), path


@pytest.mark.slow  # ingests a real trace
def test_sglang_graph_launch_is_found_with_its_kernels(sglang: tuple[Warehouse, _Counted, Path]) -> None:
    wh, counted, _ = sglang
    graphs = pl.DataFrame(wh.query("SELECT * FROM graph_launches").rows,
                          schema=wh.query("SELECT * FROM graph_launches").columns, orient="row")
    assert len(counted.graph_ids) == graphs.height == 1  # the README's hipGraphLaunch, correlation 92178
    row = graphs.row(0, named=True)
    correlation = row["correlation"]
    call = counted.calls[correlation]
    expected = counted.graph(correlation)
    assert call["name"] == row["call"] == "hipGraphLaunch"
    assert row["kernels"] == expected["kernels"] == 544
    assert row["call_ns"] == _ns(call["dur"])
    assert row["graph_id"] is None  # ROCm writes no graph id
    tolerance = expected["kernels"] * 2  # microsecond text rounded to ns per start and duration
    for column in ("device_ns", "span_ns", "gaps_ns"):
        assert abs(row[column] - expected[column]) <= tolerance, (column, row[column], expected[column])
    assert 0 < row["gaps_ns"] < row["span_ns"]


@pytest.mark.slow  # ingests a real trace
def test_sglang_launch_cost_is_counted_once_per_call(sglang: tuple[Warehouse, _Counted, Path]) -> None:
    wh, counted, _ = sglang
    result = wh.query("SELECT * FROM launch_stats")
    stats = dict(zip(result.columns, result.rows[0], strict=True))
    graph_calls = [counted.calls[c] for c in counted.graph_ids]
    assert stats["graph_launches"] == len(graph_calls)
    assert stats["graph_kernels"] == sum(len(v) for v in counted.by_graph.values())
    assert stats["graph_launch_ns"] == sum(_ns(c["dur"]) for c in graph_calls)
    assert stats["launches"] == len(counted.single) == 555 - 544
    shorter = [k for k in counted.single if _ns(k["dur"]) < _ns(counted.calls[k["args"]["correlation"]]["dur"])]
    assert stats["shorter_than_launch"] == len(shorter)
    assert stats["launch_overhead_ns"] == sum(_ns(counted.calls[k["args"]["correlation"]]["dur"]) for k in shorter)
    host_calls = sum(_ns(c["dur"]) for c in counted.calls.values())
    assert stats["launch_overhead_ns"] + stats["graph_launch_ns"] <= host_calls


@pytest.mark.slow  # ingests a real trace
def test_sglang_finding_stays_within_the_launch_calls_and_the_span(sglang: tuple[Warehouse, _Counted, Path]) -> None:
    wh, counted, _ = sglang
    analysis = wh.analyze(job="sglang")
    span = int(analysis.breakdown["span_ns"].max())
    short = [f for f in analysis.findings if f.kind == "short_kernels"]
    assert short, [f.title for f in analysis.findings]
    finding = short[0]
    single_calls = sum(_ns(counted.calls[k["args"]["correlation"]]["dur"]) for k in counted.single)
    assert finding.gain_ns <= single_calls < span  # before: 855.6 ms on a 473 ms span
    assert "already in a CUDA graph" in finding.detail and "544" in finding.detail
    assert f"of {len(counted.single)} kernels launched one by one" in finding.title
    assert analysis.graphs.height == 1 and analysis.as_dict()["graphs"][0]["kernels"] == 544


@pytest.mark.slow  # ingests a real trace
def test_sglang_graph_kernels_enter_the_queue_once_each(sglang: tuple[Warehouse, _Counted, Path]) -> None:
    wh, counted, path = sglang
    queues = {row[0]: row[1:] for row in wh.query("SELECT stream, launches, max_queue FROM stream_queues").rows}
    launched = Counter(e["args"].get("stream") for e in _events(path)
                       if e.get("ph") == "X" and e.get("cat") in DEVICE_CATS - {"cuda_sync"}
                       and e.get("args", {}).get("correlation") in counted.calls)
    assert {s: n for s, (n, _) in queues.items()} == dict(launched)
    graph_stream = counted.by_graph[next(iter(counted.graph_ids))][0]["args"]["stream"]
    # the graph's 544 kernels are queued at the call's start, with what was already queued
    assert 544 <= queues[graph_stream][1] <= launched[graph_stream]


# -- generated traces --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Warehouse, _Counted, Path]:
    from tracelake.sample_traces.generate import EXTRA_SCENARIOS, write_trace

    folder = tmp_path_factory.mktemp("cuda_graph")
    path = folder / "rank-0.json.gz"
    write_trace(path, EXTRA_SCENARIOS["cuda_graph"], 0)
    return _ingest(path, folder / "warehouse", "cuda_graph"), _Counted(_events(path)), path


def test_generated_graph_launches_match_the_json(generated: tuple[Warehouse, _Counted, Path]) -> None:
    wh, counted, path = generated
    result = wh.query("SELECT correlation, graph_id, call, kernels, device_ns, span_ns, gaps_ns, delay_ns "
                      "FROM graph_launches ORDER BY launch_ns")
    rows = [dict(zip(result.columns, r, strict=True)) for r in result.rows]
    launches = [e for e in _events(path) if e.get("name") == "cudaGraphLaunch"]
    assert len(rows) == len(launches) == 3  # one replay per step
    graph_ids = {k["args"]["graph id"] for ks in counted.by_graph.values() for k in ks}
    for row in rows:
        expected = counted.graph(row["correlation"])
        assert row["call"] == "cudaGraphLaunch" and {row["graph_id"]} == graph_ids
        assert row["kernels"] == expected["kernels"] == 24
        for column in ("device_ns", "span_ns", "gaps_ns"):
            assert abs(row[column] - expected[column]) <= 48, column
        call = counted.calls[row["correlation"]]
        first = min(_ns(k["ts"]) for k in counted.by_graph[row["correlation"]])
        assert abs(row["delay_ns"] - max(first - _ns(call["ts"]) - _ns(call["dur"]), 0)) <= 3
    result = wh.query("SELECT * FROM launch_stats")
    stats = dict(zip(result.columns, result.rows[0], strict=True))
    assert stats["launches"] == len(counted.single) and stats["graph_kernels"] == 72


def test_tiny_graph_kernels_behind_a_slow_graph_launch_get_no_graph_advice(
    generated: tuple[Warehouse, _Counted, Path], tmp_path: Path,
) -> None:
    """The generated trace with its kernels cut to 1 us and each cudaGraphLaunch taking 5 ms.

    Charged per kernel, the 72 graph kernels would cost 360 ms of launch calls on a ~40 ms trace;
    counted once per call they cost 15 ms, and none of them is "shorter than its launch"; the kernels
    launched one by one are, and the finding counts those only.
    """
    _, _, path = generated
    data = json.loads(gzip.decompress(path.read_bytes()))
    for e in data["traceEvents"]:
        if e.get("name") == "cudaGraphLaunch":
            e["dur"] = 5000.0
        elif e.get("cat") == "kernel":
            e["dur"] = 1.0
    edited = tmp_path / "rank-0.json"
    edited.write_text(json.dumps(data))
    counted = _Counted(data["traceEvents"])
    wh = _ingest(edited, tmp_path / "warehouse", "slow_graphs")
    result = wh.query("SELECT * FROM launch_stats")
    stats = dict(zip(result.columns, result.rows[0], strict=True))
    shorter = [k for k in counted.single if _ns(k["dur"]) < _ns(counted.calls[k["args"]["correlation"]]["dur"])]
    assert stats["shorter_than_launch"] == len(shorter)
    assert stats["graph_kernels"] == 72 and stats["graph_launch_ns"] == 3 * 5_000_000
    analysis = wh.analyze(job="slow_graphs")
    span = int(analysis.breakdown["span_ns"].max())
    assert stats["launch_overhead_ns"] + stats["graph_launch_ns"] < span < 72 * 5_000_000
    assert all(finding.gain_ns <= span for finding in analysis.findings)
    (finding,) = [f for f in analysis.findings if f.kind == "short_kernels"]
    assert len(shorter) > 0 and stats["launch_overhead_ns"] == sum(
        _ns(counted.calls[k["args"]["correlation"]]["dur"]) for k in shorter)
    # the launch calls' time is the upper bound; the replay without launch overhead answers it
    # (docs/analyses.md, "Findings"): never more than the bound, here far less (the graphs bound the step)
    replayed = critical_path.totals(analysis.what_if).filter(pl.col("scenario") == Scenario.NO_LAUNCH_OVERHEAD)
    assert finding.gain_ns == min(stats["launch_overhead_ns"], int(replayed["saving_ns"][0]))
    assert finding.gain_ns < stats["launch_overhead_ns"] and "replaying" in finding.detail
    assert f"{len(shorter)} of {len(counted.single)} kernels launched one by one" in finding.title
    assert "72 more kernels were started by 3 CUDA graph launches: already in a CUDA graph" in finding.detail


def test_committed_samples_have_no_graph_launches(sample_warehouse: Warehouse) -> None:
    assert sample_warehouse.query("SELECT count(*) FROM graph_launches").rows[0][0] == 0
    assert sample_warehouse.query("SELECT sum(graph_kernels) FROM launch_stats").rows[0][0] == 0


@pytest.mark.parametrize("which", ["generated", "sglang"])
def test_windowed_and_sql_derived_graph_tables_are_equal(which: str, request: pytest.FixtureRequest,
                                                        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ingest's windowed tables, in windows of 7 ops over shuffled row groups, equal the SQL oracle."""
    from tracelake.warehouse import derived

    wh = request.getfixturevalue(which)[0]
    job = "cuda_graph" if which == "generated" else "sglang"
    trace_id = wh.store.job_traces(job)[0]
    parsed = tmp_path / "parsed"
    parsed.mkdir()
    for name in derived.INPUTS:
        frame = pl.read_parquet(wh.store.path(name, job, trace_id))
        if name == "device_ops":
            frame = frame.sample(fraction=1.0, shuffle=True, seed=3)
        frame.write_parquet(parsed / f"{name}.parquet", row_group_size=50)
    out: dict[bool, dict[str, pl.DataFrame]] = {}
    monkeypatch.setattr(derived, "CHUNK_ROWS", 7)
    for sql in (True, False):
        folder = tmp_path / str(sql)
        folder.mkdir()
        (write_derived_sql if sql else derived.write_derived)(parsed, folder)
        out[sql] = {n: pl.read_parquet(folder / f"{n}.parquet") for n in ("launch_stats", "stream_queues",
                                                                            "graph_launches")}
    assert out[True]["graph_launches"].height > 0
    for name, frame in out[True].items():
        keys = [c for c in ("trace_id", "rank", "stream", "correlation") if c in frame.columns]
        assert frame.sort(keys).equals(out[False][name].sort(keys)), name


# -- random timelines ----------------------------------------------------------------------------------

_NAMES = ("cudaLaunchKernel", "cudaLaunchKernel", "cudaGraphLaunch_v10000", "hipGraphLaunch", "cudaMemcpyAsync")


@st.composite
def _timelines(draw: st.DrawFn) -> tuple[pl.DataFrame, pl.DataFrame]:
    """One rank: launch calls one after another on a thread, each starting 0 to 6 ops (some sharing an id)."""
    rng = random.Random(draw(st.integers(0, 2**32)))
    calls, ops = [], []
    t = 0
    for correlation in range(draw(st.integers(1, 14))):
        name = rng.choice(_NAMES)
        dur = rng.choice([None, 0, rng.randint(1, 40) * 10])
        calls.append(("t", correlation, t, dur, name))
        t += (dur or 0) + rng.randint(0, 5) * 10
        for _ in range(rng.choice([0, 1, 1, 2, 5]) if "Graph" in name else rng.choice([0, 1, 1, 1, 2])):
            kind = rng.choice(["kernel"] * 5 + ["memcpy", "sync"])
            ops.append(("t", 0, rng.choice([3, 7]), kind, "sync" if kind == "sync" else "compute",
                        rng.randint(0, 60) * 10, rng.choice([0, 10, rng.randint(1, 30) * 10]),
                        rng.choice([correlation] * 6 + [None, 99]), rng.choice([None, 5])))
    device = pl.DataFrame(ops, orient="row", schema={
        "trace_id": pl.String, "rank": pl.Int32, "stream": pl.Int64, "kind": pl.String, "category": pl.String,
        "ts_ns": pl.Int64, "dur_ns": pl.Int64, "correlation": pl.Int64, "graph_id": pl.Int64})
    host = pl.DataFrame(calls, orient="row", schema={
        "trace_id": pl.String, "correlation": pl.Int64, "ts_ns": pl.Int64, "dur_ns": pl.Int64, "name": pl.String})
    return device, host


def _windowed(device: pl.DataFrame, host: pl.DataFrame, seed: int) -> LaunchParts:
    """LaunchParts fed the ops in random pieces, each op with its call as derived.py joins it."""
    keys, starts, durations, graph = launch_calls(
        *(host[c].fill_null(0).to_numpy().astype(np.int64) for c in ("correlation", "ts_ns", "dur_ns")),
        host["name"].str.contains(GRAPH_CALL).to_numpy())
    kernels = device.filter((pl.col("kind") == "kernel") & pl.col("correlation").is_not_null())
    graph |= np.isin(keys, shared_correlations(kernels["correlation"].to_numpy()))
    calls = pl.DataFrame({"correlation": keys, "launch_ns": starts, "call_ns": durations, "graph": graph})
    ops = device.join(calls, on="correlation", how="left").sample(fraction=1.0, shuffle=True, seed=seed)
    parts = LaunchParts()
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(ops.height + 1), min(3, ops.height + 1)))
    for low, high in zip([0, *cuts], [*cuts, ops.height], strict=True):
        parts.add(ops[low:high])
    return parts


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_timelines(), st.integers(0, 1000))
def test_random_graph_timelines_windowed_equal_sql_and_stay_bounded(
    timeline: tuple[pl.DataFrame, pl.DataFrame], seed: int,
) -> None:
    device, host = timeline
    con = duckdb.connect()
    con.register("d", device.to_arrow())
    con.register("h", host.to_arrow())
    stats = con.sql(launch_stats_sql("d", "h")).pl()
    graphs = con.sql(graph_launches_sql("d", "h")).pl()
    parts = _windowed(device, host, seed)
    got = parts.stats("t", 0)
    assert got.height == stats.height
    if stats.height:
        assert got.row(0) == stats.cast(got.schema).row(0)
    names = {int(c): n for c, n in host.filter(pl.col("name").str.contains(GRAPH_CALL))
             .group_by("correlation").agg(pl.col("name").min()).iter_rows()}
    mine = graph_rows(parts.graph_kernels(), "t", 0, names)
    assert mine.rows() == graphs.cast(mine.schema).rows()
    queues = con.sql(queue_lengths_sql("d", "h")).pl()
    got_queues = parts.queues("t", 0)
    assert got_queues.rows() == queues.cast(got_queues.schema).rows()
    if not stats.height:
        return
    row = stats.row(0, named=True)
    # launch cost once per call: never above the host time of the (distinct) calls that launched kernels
    joined = host.filter(pl.col("correlation").is_in(device.filter(pl.col("kind") == "kernel")["correlation"]
                                                     .drop_nulls().implode()))
    host_time = int(joined["dur_ns"].fill_null(0).sum())
    assert row["launch_overhead_ns"] + row["graph_launch_ns"] <= host_time
    # the calls run one after another on one thread: their time fits in the trace's span
    ends = pl.concat([host.select("ts_ns", (pl.col("ts_ns") + pl.col("dur_ns").fill_null(0)).alias("end")),
                      device.select("ts_ns", (pl.col("ts_ns") + pl.col("dur_ns")).alias("end"))])
    span = int(ends.select(pl.col("end").max() - pl.col("ts_ns").min()).item())
    assert row["launch_overhead_ns"] + row["graph_launch_ns"] <= span
    # the oracle: graph launches and their kernels, counted in plain Python
    calls = {c: (n, t, d or 0) for _, c, t, d, n in host.rows()}
    per_id = Counter(c for k, c in zip(device["kind"], device["correlation"], strict=True) if k == "kernel"
                     and c is not None)
    in_graph = {c for c in calls if re.match(GRAPH_CALL, calls[c][0]) or per_id[c] > 1}
    launched = [c for c in device.filter(pl.col("kind") == "kernel")["correlation"] if c in calls]
    assert row["launches"] == sum(c not in in_graph for c in launched)
    assert row["graph_kernels"] == sum(c in in_graph for c in launched)
    assert row["graph_launches"] == len({c for c in launched if c in in_graph}) == graphs.height
    for g in graphs.iter_rows(named=True):
        spans = sorted((t, t + d) for k, t, d, c in device.select("kind", "ts_ns", "dur_ns", "correlation").rows()
                       if k == "kernel" and c == g["correlation"])
        covered, busy = None, 0
        for lo, hi in spans:
            start = lo if covered is None else max(lo, covered)
            busy += max(hi - start, 0)
            covered = hi if covered is None else max(covered, hi)
        last = max(hi for _, hi in spans)
        assert g["gaps_ns"] == last - spans[0][0] - busy >= 0
        assert g["device_ns"] == sum(hi - lo for lo, hi in spans)
