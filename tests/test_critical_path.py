"""Critical paths and what-if replays (docs/analyses.md, "Critical path").

Known answers worked out by hand on small timelines, a generated straggler job against the same
job generated without the straggler, HTA's own critical path on its test trace, and properties
of random multi-rank timelines. The invariants on every real and sample trace are in
tests/test_invariants.py (``critical_path_replays_the_steps``).
"""

from __future__ import annotations

import dataclasses
import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import REAL_TRACES
from tracelake.analysis import critical_path, replay
from tracelake.analysis.depgraph import COLLECTIVE_COLUMNS, DEVICE_COLUMNS, HOST_COLUMNS, RankInput, build
from tracelake.analysis.nccl import Curve, bandwidth_curves
from tracelake.contracts.critical import GROWING, PATH_KINDS, Scenario
from tracelake.sample_traces import generate
from tracelake.warehouse import Warehouse, critical_inputs

US = 1000


@dataclass
class Timeline:
    """One rank's rows, built event by event (times in microseconds)."""

    rank: int
    host: list[dict[str, object]] = field(default_factory=list)
    device: list[dict[str, object]] = field(default_factory=list)
    collectives: list[dict[str, object]] = field(default_factory=list)
    _next: int = 1

    def _id(self) -> int:
        self._next += 1
        return self._next

    def host_op(self, name: str, start: float, dur: float, *, cat: str = "cpu_op", depth: int = 0,
                parent: int | None = None, correlation: int | None = None, step: int | None = 1) -> int:
        event = self._id()
        self.host.append({"event_id": event, "tid": 1, "cat": cat, "name": name, "ts_ns": int(start * US),
                          "dur_ns": int(dur * US), "depth": depth, "parent_id": parent, "correlation": correlation,
                          "step": step})
        return event

    def kernel(self, name: str, launch_at: float, start: float, dur: float, *, stream: int = 7,
               category: str = "compute", step: int | None = 1, parent: int | None = None) -> int:
        correlation = self._id()
        self.host_op("cudaLaunchKernel", launch_at, 1, cat="cuda_runtime", depth=1, parent=parent,
                     correlation=correlation, step=step)
        event = self._id()
        self.device.append({"event_id": event, "device": 0, "stream": stream, "kind": "kernel", "category": category,
                            "name": name, "ts_ns": int(start * US), "dur_ns": int(dur * US),
                            "correlation": correlation, "step": step})
        return event

    def allreduce(self, seq: int, launch_at: float, start: float, dur: float, *, parent: int | None = None,
                  step: int = 1, message_bytes: int | None = None) -> None:
        kernel = self.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", launch_at, start, dur, stream=20,
                             category="communication", parent=parent, step=step)
        self.collectives.append({"event_id": self._id(), "process_group": "0", "seq": seq, "collective": "allreduce",
                                 "kernel_event_id": kernel, "is_async": False, "message_bytes": message_bytes})

    def rows(self) -> RankInput:
        def frame(rows: list[dict[str, object]], columns: tuple[str, ...]) -> pl.DataFrame:
            schema = {c: (pl.String if c in ("cat", "name", "kind", "category", "process_group", "collective")
                          else pl.Boolean if c == "is_async" else pl.Int64) for c in columns}
            return pl.DataFrame(rows, schema=schema) if rows else pl.DataFrame(schema=schema)

        return RankInput(f"trace{self.rank}", self.rank, frame(self.host, HOST_COLUMNS),
                         frame(self.device, DEVICE_COLUMNS), frame(self.collectives, COLLECTIVE_COLUMNS))


def _predicted(paths: critical_path.CriticalPaths) -> dict[str, float]:
    """Predicted step time per scenario, microseconds (one step)."""
    return {row["scenario"]: row["predicted_ns"] / US for row in paths.what_if.iter_rows(named=True)}


def _late_allreduce(compute: tuple[float, float], message_bytes: int | None = None) -> list[RankInput]:
    """Two ranks: a compute kernel each (rank 1's longer), then an allreduce that ends for both 50 us after the
    later one arrives. Each rank's host launches both kernels at 0 and 2 us inside a 10 us step annotation."""
    ranks = []
    for rank, length in enumerate(compute):
        t = Timeline(rank)
        step = t.host_op("ProfilerStep#1", 0, 10, cat="user_annotation")
        t.kernel("gemm", 0, 5, length, parent=step)
        t.allreduce(1, 2, 5 + length, max(compute) - length + 50, parent=step, message_bytes=message_bytes)
        ranks.append(t.rows())
    return ranks


def test_a_late_rank_bounds_the_step_and_overlap_saves_only_the_transfer() -> None:
    paths = critical_path.analyse(_late_allreduce((100, 200)))
    step = paths.steps.row(0, named=True)
    # the step: host starts at 0; rank 1's kernel runs 5..205, the allreduce ends at 255 on both ranks
    assert step["measured_ns"] == step["length_ns"] == 255 * US
    assert step["bounding_rank"] == 1
    assert (step["compute_ns"], step["communication_ns"], step["launch_ns"]) == (200 * US, 50 * US, 5 * US)
    assert sum(step[f"{k}_ns"] for k in PATH_KINDS) == step["length_ns"]
    predicted = _predicted(paths)
    # rank 0 is exposed for 200 us (150 of waiting, 50 of transfer); overlapping removes only the transfer
    assert predicted[Scenario.COMMUNICATION_OVERLAPPED] == 205
    assert predicted[Scenario.BANDWIDTH_X2] == 230
    # kernels 50 and 100 us long: rank 1 arrives at 105, +50 transfer
    assert predicted[Scenario.COMPUTE_X2] == 155
    # the median of 100 and 200 us is 150: rank 1 arrives at 155, +50
    assert predicted[Scenario.SLOWEST_RANK_AT_MEDIAN] == 205
    assert predicted[Scenario.AS_MEASURED] == 255
    # two ranks become four: an all-reduce moves (4 - 1) / 4 of the data instead of (2 - 1) / 2, 1.5x the transfer
    assert predicted[Scenario.RANKS_X2] == 255 + 25


def test_collectives_at_nccl_tests_bandwidth_move_their_bytes_at_its_bus_bandwidth() -> None:
    """A 2-rank all-reduce of 4 MB moves 2 (n - 1) / n x 4 MB = 4 MB per rank (docs/formats.md, "Bus bandwidth")."""
    flat = {"all_reduce": Curve(np.array([1e3, 1e9]), np.array([80.0, 80.0]))}
    paths = critical_path.analyse(_late_allreduce((100, 200), message_bytes=4_000_000), curves=flat)
    # rank 1 arrives at 205 us; 4 MB at 80 GB/s is 50 us: the measured transfer, so nothing changes
    assert _predicted(paths)[Scenario.NCCL_TESTS_BANDWIDTH] == 255
    # 1 MB at 10 GB/s and 16 MB at 90 GB/s: 4 MB lies halfway in log2, at 50 GB/s, so 80 us
    curve = {"all_reduce": Curve(np.array([2.0 ** 20, 2.0 ** 24]), np.array([10.0, 90.0]))}
    paths = critical_path.analyse(_late_allreduce((100, 200), message_bytes=4 * 2 ** 20), curves=curve)
    assert _predicted(paths)[Scenario.NCCL_TESTS_BANDWIDTH] == pytest.approx(205 + 4 * 2 ** 20 / 50 / US, abs=0.01)
    # beyond the measured sizes, the nearest figure; no curve for the collective, no scenario
    assert curve["all_reduce"].at(2 ** 30) == 90.0 and curve["all_reduce"].at(1) == 10.0
    none = critical_path.analyse(_late_allreduce((100, 200), message_bytes=4_000_000), curves={"all_gather": flat[
        "all_reduce"]})
    assert Scenario.NCCL_TESTS_BANDWIDTH not in _predicted(none)


def test_bandwidth_curves_prefer_out_of_place_runs_and_take_the_median() -> None:
    rows = [("all_reduce", 1024, False, 1.0), ("all_reduce", 1024, True, 9.0), ("all_reduce", 2048, True, 4.0),
            ("all_reduce", 4096, False, 3.0), ("all_reduce", 4096, False, 5.0), ("all_reduce", 4096, False, 100.0),
            ("all_gather", 1024, False, 0.0)]
    frame = pl.DataFrame(rows, schema={"collective": pl.String, "size_bytes": pl.Int64, "in_place": pl.Boolean,
                                       "busbw_gbs": pl.Float64}, orient="row")
    curves = bandwidth_curves(frame)
    assert set(curves) == {"all_reduce"}  # a curve of no positive bandwidth is no curve
    assert curves["all_reduce"].sizes.tolist() == [1024, 2048, 4096]
    assert curves["all_reduce"].busbw_gbs.tolist() == [1.0, 4.0, 5.0]


def test_exposed_communication_gives_way_to_the_replay() -> None:
    paths = critical_path.analyse(_late_allreduce((100, 200)))
    from tracelake.analysis.findings import Finding

    bound = Finding("exposed_communication", "exposed", "rank 0 exposed 200 us", 200 * US, ("trace0",), (0,))
    found = critical_path.with_replay([bound], paths.what_if, ("trace0", "trace1"), (0, 1))
    exposed = next(f for f in found if f.kind == "exposed_communication")
    assert exposed.gain_ns == 50 * US  # the replay's saving, not the 200 us upper bound
    assert "replaying" in exposed.detail
    assert not any(f.kind == f"what_if_{Scenario.COMMUNICATION_OVERLAPPED}" for f in found)


def test_a_blocking_sync_waits_for_the_kernel_and_moves_with_it() -> None:
    t = Timeline(0)
    step = t.host_op("ProfilerStep#1", 0, 130, cat="user_annotation")
    t.kernel("gemm", 0, 5, 100, parent=step)
    t.host_op("cudaDeviceSynchronize", 10, 100, cat="cuda_runtime", depth=1, parent=step)  # returns at 110
    t.host_op("aten::add", 110, 20, depth=1, parent=step)
    paths = critical_path.analyse([t.rows()])
    step_row = paths.steps.row(0, named=True)
    assert step_row["length_ns"] == 130 * US
    assert (step_row["compute_ns"], step_row["sync_ns"], step_row["host_ns"], step_row["launch_ns"]) == (
        100 * US, 5 * US, 20 * US, 5 * US)
    # the kernel at half length ends at 55, the sync returns 5 us later, then 20 us of host work
    assert _predicted(paths)[Scenario.COMPUTE_X2] == 80


def test_a_wait_on_another_stream_is_inferred() -> None:
    t = Timeline(0)
    step = t.host_op("ProfilerStep#1", 0, 10, cat="user_annotation")
    t.kernel("producer", 0, 5, 100, parent=step)  # stream 7, 5..105
    t.kernel("consumer", 1, 108, 10, stream=9, parent=step)  # launched at 1, waits for the producer
    paths = critical_path.analyse([t.rows()])
    stretches = paths.path.sort("position")
    assert stretches["name"].to_list()[-3:] == ["producer", "(waits for another stream)", "consumer"]
    # both at half length, the consumer still 3 us after the producer: 5 + 50 + 3 + 5
    assert _predicted(paths)[Scenario.COMPUTE_X2] == 63


def _ranks_of(wh: Warehouse, job: str) -> float:
    whole = critical_path.totals(wh.analyze(job=job).what_if)
    return {r["scenario"]: r["predicted_ns"] / r["steps"] for r in whole.iter_rows(named=True)}


@pytest.mark.slow  # generates and ingests two four-rank jobs
def test_the_straggler_fix_predicts_the_job_without_the_straggler(tmp_path: Path) -> None:
    base = generate.SCENARIOS["ddp_straggler"]
    wh = Warehouse(tmp_path / "wh")
    for name, scenario in (("slow", base), ("even", dataclasses.replace(base, straggler_rank=None))):
        wh.ingest(generate.write_scenario(tmp_path / name, scenario), job=name)
    slow, even = _ranks_of(wh, "slow"), _ranks_of(wh, "even")
    assert slow[Scenario.AS_MEASURED] > 1.15 * even[Scenario.AS_MEASURED]  # the straggler costs ~25%
    predicted, known = slow[Scenario.SLOWEST_RANK_AT_MEDIAN], even[Scenario.AS_MEASURED]
    assert abs(predicted - known) <= 0.03 * known, (predicted, known)
    # with no straggler, evening the ranks out changes next to nothing
    assert even[Scenario.SLOWEST_RANK_AT_MEDIAN] >= 0.99 * known


HTA_TRACE = REAL_TRACES / "pytorch_profiler" / "hta_critical_path_simple_add"
HTA_ANSWER = REAL_TRACES / "pytorch_profiler" / "hta_critical_path_simple_add_expected"


@pytest.mark.skipif(not HTA_ANSWER.is_dir(), reason="../shared/real_traces is not here")
def test_device_ops_on_the_path_agree_with_htas(tmp_path: Path) -> None:
    """HTA's copies on the path are ours; the kernels only HTA has ended before the host synchronised."""
    answer = json.loads(gzip.decompress(next(HTA_ANSWER.glob("*.json.gz")).read_bytes()))
    flagged = [e for e in answer["traceEvents"] if e.get("ph") == "X" and e.get("args", {}).get("critical")]
    device = {(e["name"], e["ts"] * US) for e in flagged if e["cat"] in ("kernel", "gpu_memcpy", "gpu_memset")}
    copies = {d for d in device if d[0].startswith("Memcpy")}
    wh = Warehouse(tmp_path / "wh")
    wh.ingest([HTA_TRACE], job="hta")
    a = wh.analyze(job="hta")
    ours = {(n, s) for n, s, k in a.critical_path_stretches.select("name", "start_ns", "kind").rows()
            if k in ("compute", "memory", "communication")}
    assert ours <= device
    assert copies <= ours and len(copies) == 16
    only_hta = device - ours
    host_synced = min(e["ts"] * US for e in flagged if e["name"] == "cudaDeviceSynchronize"
                      and e["ts"] * US >= max(start for _, start in only_hta))
    ends = {(e["name"], e["ts"] * US): (e["ts"] + e["dur"]) * US for e in flagged if e["cat"] != "cpu_op"}
    assert only_hta and all(ends[d] < host_synced for d in only_hta)


@st.composite
def jobs(draw: st.DrawFn) -> list[RankInput]:
    """Ranks with compute kernels between allreduces, arrivals skewed at random; each allreduce ends on every
    rank 20 us after the last rank arrived, and the rank's next kernel follows it (as after a wait)."""
    n_ranks, n_coll, steps = draw(st.integers(1, 4)), draw(st.integers(0, 3)), draw(st.integers(1, 2))
    timelines = [Timeline(rank) for rank in range(n_ranks)]
    clock = [0.0] * n_ranks  # each rank's host
    free = [0.0] * n_ranks  # each rank's device
    for s in range(1, steps + 1):
        annotations = [t.host_op(f"ProfilerStep#{s}", clock[r], 5, cat="user_annotation", step=s)
                       for r, t in enumerate(timelines)]
        for seq in range(n_coll + 1):
            arrive = []
            for r, t in enumerate(timelines):
                start = max(clock[r] + 2 + draw(st.floats(0, 10)), free[r] + draw(st.floats(0, 30)))
                dur = draw(st.floats(1, 300))
                t.kernel("gemm", clock[r] + 1, start, dur, step=s, parent=annotations[r])
                free[r] = start + dur
                clock[r] += draw(st.floats(0.5, 3))
                arrive.append(free[r])
            if seq < n_coll:
                end = max(arrive) + 20
                for r, t in enumerate(timelines):
                    t.allreduce(s * 10 + seq, clock[r], arrive[r], end - arrive[r], parent=annotations[r], step=s)
                    free[r] = end
                    clock[r] += 1
        for r in range(n_ranks):
            clock[r] = max(clock[r], free[r]) + draw(st.floats(1, 20))
    return [t.rows() for t in timelines]


@settings(max_examples=40, deadline=None)
@given(jobs())
def test_random_timelines_replay_exactly_and_never_predict_longer(ranks: list[RankInput]) -> None:
    paths = critical_path.analyse(ranks)
    assert paths.dropped_edges == 0
    for row in paths.steps.iter_rows(named=True):
        assert row["length_ns"] == row["measured_ns"]
        assert sum(row[f"{k}_ns"] for k in PATH_KINDS) == row["length_ns"]
    for (step,), part in paths.path.group_by("step"):
        part = part.sort("position")
        starts, durs = part["start_ns"].to_list(), part["dur_ns"].to_list()
        assert all(d >= 0 for d in durs)
        assert all(starts[i] + durs[i] == starts[i + 1] for i in range(len(starts) - 1))
    w = paths.what_if
    shrinking = w.filter(~pl.col("scenario").is_in(list(GROWING)))
    assert (shrinking["predicted_ns"] <= shrinking["measured_ns"]).all()
    assert (w["predicted_ns"] >= 0).all()
    # halving compute saves at most half the compute on the measured path, and so does halving bandwidth
    measured = paths.steps.select("step", "compute_ns", "communication_ns")
    halves = w.filter(pl.col("scenario") == Scenario.COMPUTE_X2).join(measured, on="step", suffix="_path")
    assert (halves["saving_ns"] <= halves["measured_ns"]).all()


@pytest.mark.skipif(not replay.NATIVE, reason="the C loops are not built here")
@settings(max_examples=25, deadline=None)
@given(jobs())
def test_the_c_loops_and_the_python_loops_agree(ranks: list[RankInput]) -> None:
    native = critical_path.analyse(ranks)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(replay, "_native", None)
        python = critical_path.analyse(ranks)
    for name in ("path", "steps", "what_if"):
        assert getattr(native, name).equals(getattr(python, name)), name


ET_KINETO = REAL_TRACES / "pytorch_profiler" / "hta_execution_trace"
ET = REAL_TRACES / "pytorch_other" / "hta_execution_trace"


@pytest.mark.skipif(not ET.is_dir(), reason="../shared/real_traces is not here")
def test_an_execution_traces_data_dependencies_join_the_graph_and_agree_with_the_kineto_times(tmp_path: Path) -> None:
    wh = Warehouse(tmp_path / "wh")
    wh.ingest([ET_KINETO, ET], job="et")
    traces = pl.read_parquet(wh.store.glob("traces"), hive_partitioning=True)
    pairs = list(traces.select("job", "trace_id").rows())
    inputs = critical_inputs.read(wh.store, pairs, traces, wh.store.read_frame("collectives", pairs))
    kineto = next(i for i in inputs if i.host.height)
    assert kineto.data_edges is not None and kineto.data_edges.height
    # independently: the Kineto ops by External id (this 2023 trace has no Record function id), from the JSON
    events = json.loads(gzip.decompress(next(ET_KINETO.glob("*.json.gz")).read_bytes()))["traceEvents"]
    ops = {e["args"]["External id"]: e for e in events if e.get("cat") == "cpu_op" and "External id" in e["args"]}
    pairs_found = [(ops[s], ops[d]) for s, d in kineto.data_edges.select("src_rf_id", "dst_rf_id").rows()
                   if s in ops and d in ops]
    assert pairs_found
    # every producer the execution trace names ended before its consumer began, on the profiler's clock
    assert all(p["ts"] + p["dur"] <= c["ts"] for p, c in pairs_found)
    with_et, without = build(inputs), build([dataclasses.replace(i, data_edges=None) for i in inputs])
    assert len(with_et.src) - len(without.src) == len(pairs_found) and with_et.dropped == without.dropped
