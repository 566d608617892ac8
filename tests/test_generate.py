"""Tests for sample_traces/generate.py, the synthetic Kineto trace generator."""

from __future__ import annotations

import gzip
import importlib.util
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import orjson
import pytest

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_traces" / "kineto"


def _load_generator():
    try:
        from tracelake.sample_traces import generate
    except ImportError:  # package not installed: load the file itself
        spec = importlib.util.spec_from_file_location("_tracelake_generate", ROOT / "sample_traces" / "generate.py")
        generate = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = generate
        spec.loader.exec_module(generate)
    return generate


gen = _load_generator()
DDP = gen.SCENARIOS["ddp_straggler"]
LAUNCH = gen.SCENARIOS["launch_bound"]


def _read(path: Path) -> bytes:
    return gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()


@pytest.fixture(scope="module")
def ddp(tmp_path_factory) -> list[tuple[dict, dict]]:
    """(summary, parsed trace) for every rank of ddp_straggler."""
    out = tmp_path_factory.mktemp("ddp")
    runs = []
    for rank in range(DDP.ranks):
        path = out / f"rank-{rank}.json.gz"
        runs.append((gen.write_trace(path, DDP, rank), orjson.loads(_read(path))))
    return runs


@pytest.fixture(scope="module")
def launch(tmp_path_factory) -> tuple[dict, dict]:
    path = tmp_path_factory.mktemp("launch") / "rank-0.json.gz"
    return gen.write_trace(path, LAUNCH, 0), orjson.loads(_read(path))


def test_two_runs_are_byte_identical(tmp_path):
    for scenario, rank in ((DDP, 2), (LAUNCH, 0)):
        a, b = tmp_path / "a" / "t.json.gz", tmp_path / "b" / "other-name.json.gz"
        gen.write_trace(a, scenario, rank)
        gen.write_trace(b, scenario, rank)
        assert a.read_bytes() == b.read_bytes()


def test_committed_samples_are_current(tmp_path):
    for name, scenario in gen.SCENARIOS.items():
        for rank in range(scenario.ranks):
            committed = SAMPLES / name / f"rank-{rank}.json.gz"
            if not committed.exists():
                pytest.skip(f"{committed} not generated")
            assert committed.stat().st_size < 400_000
            fresh = tmp_path / f"{name}-{rank}.json.gz"
            gen.write_trace(fresh, scenario, rank)
            assert _read(fresh) == _read(committed), f"regenerate {committed}"


def test_top_level_shape(ddp, launch):
    for (summary, trace), scenario in [(run, DDP) for run in ddp] + [(launch, LAUNCH)]:
        rank = summary["rank"]
        assert list(trace)[:3] == ["schemaVersion", "deviceProperties", "distributedInfo"]
        assert list(trace)[-2:] == ["traceName", "displayTimeUnit"]
        assert isinstance(trace["traceEvents"], list) and trace["traceEvents"]
        info = trace["distributedInfo"]
        assert (info["rank"], info["world_size"], info["backend"]) == (rank, scenario.ranks, "nccl")
        assert info["pg_config"][0]["ranks"] == list(range(scenario.ranks))
        (device,) = trace["deviceProperties"]
        assert device["id"] == rank % 8 and device["numSms"] == 132
        assert trace["baseTimeNanoseconds"] == scenario.base_time_ns


def test_summary_matches_a_recount(ddp, launch):
    for summary, trace in [*ddp, launch]:
        events = trace["traceEvents"]
        cats = Counter(e["cat"] for e in events if "cat" in e)
        assert summary["events"] == len(events)
        assert summary["cat_counts"] == dict(cats)
        assert summary["device_ops"] == {k: cats[k] for k in ("kernel", "gpu_memcpy", "gpu_memset")}
        nccl = [e for e in events if e.get("cat") == "kernel" and e["name"].startswith("ncclDevKernel")]
        assert summary["nccl_kernels"] == len(nccl)
        steps = [e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")]
        assert summary["steps"] == len(steps)
    assert ddp[0][0]["steps"] == DDP.steps and ddp[0][0]["nccl_kernels"] == DDP.steps * (DDP.buckets + 1)
    assert launch[0]["nccl_kernels"] == 0


def test_bytes_reported_match_file(tmp_path):
    path = tmp_path / "r.json"
    summary = gen.write_trace(path, DDP, 1)
    assert summary["bytes"] == summary["file_bytes"] == path.stat().st_size


def test_target_bytes_reaches_about_the_target(tmp_path):
    target = 5_000_000
    path = tmp_path / "big.json"
    summary = gen.write_trace(path, DDP, 3, target_bytes=target)
    assert abs(path.stat().st_size - target) < 0.1 * target
    assert summary["steps"] > DDP.steps
    assert summary["bytes"] == path.stat().st_size
    assert orjson.loads(path.read_bytes())["distributedInfo"]["rank"] == 3


def test_launch_chains_are_consistent(ddp, launch):
    for _, trace in [*ddp, launch]:
        events = trace["traceEvents"]
        assert all(e.get("dur", 0) >= 0 for e in events)
        launches = {e["args"]["correlation"]: e for e in events
                    if e.get("cat") in ("cuda_runtime", "cuda_driver")}
        device = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
        flows = defaultdict(dict)
        for e in events:
            if e.get("cat") == "ac2g":
                flows[e["id"]][e["ph"]] = e
        for op in device:
            api = launches[op["args"]["correlation"]]
            assert op["ts"] > api["ts"]
            assert op["args"]["External id"] == api["args"]["External id"]
            assert op["tid"] == op["args"]["stream"] and op["pid"] == op["args"]["device"]
            flow = flows[op["args"]["correlation"]]
            assert flow["s"]["ts"] == api["ts"] and flow["f"]["ts"] == op["ts"] and flow["f"]["bp"] == "e"
        assert len(flows) == len(device)


def test_collectives_complete_together_and_straggler_arrives_last(ddp):
    by_seq: dict[int, dict[int, dict]] = defaultdict(dict)
    for summary, trace in ddp:
        for e in trace["traceEvents"]:
            if e.get("cat") == "kernel" and e["name"].startswith("ncclDevKernel"):
                by_seq[e["args"]["Seq"]][summary["rank"]] = e
    assert len(by_seq) == DDP.steps * (DDP.buckets + 1)
    last = 0
    for seq, kernels in by_seq.items():
        assert set(kernels) == set(range(DDP.ranks))
        ends = [k["ts"] + k["dur"] for k in kernels.values()]
        assert max(ends) - min(ends) < 0.01, f"Seq {seq} ends differ across ranks"
        assert len({k["args"]["Collective name"] for k in kernels.values()}) == 1
        arrival = max(kernels, key=lambda r: kernels[r]["ts"])
        last += arrival == DDP.straggler_rank
        shortest = min(kernels, key=lambda r: kernels[r]["dur"])
        assert shortest == arrival
    assert last >= 0.8 * len(by_seq)


def test_record_param_comms_matches_kernel(ddp):
    summary, trace = ddp[0]
    events = trace["traceEvents"]
    comms = {e["args"]["Seq"]: e for e in events if e.get("name") == "record_param_comms"}
    kernels = {e["args"]["Seq"]: e for e in events if e.get("name", "").startswith("ncclDevKernel")}
    assert comms.keys() == kernels.keys()
    for seq, comm in comms.items():
        args = comm["args"]
        assert args["Group size"] == DDP.ranks and args["Rank"] == 0
        assert args["Process Group Ranks"] == "[0, 1, 2, 3]"
        assert args["In msg nelems"] == kernels[seq]["args"]["In msg nelems"]
        assert comm["ts"] < kernels[seq]["ts"] + kernels[seq]["dur"]


def test_launch_bound_has_host_gaps(launch):
    _, trace = launch
    events = trace["traceEvents"]
    launches = {e["args"]["correlation"]: e for e in events if e.get("cat") == "cuda_runtime"}
    kernels = [e for e in events if e.get("cat") == "kernel"]
    assert len(kernels) >= LAUNCH.steps * 2 * LAUNCH.layers
    tiny = [k for k in kernels if k["dur"] < launches[k["args"]["correlation"]]["dur"]]
    assert len(tiny) >= 0.9 * len(kernels)
    busy = sum(k["dur"] for k in kernels)
    span = max(k["ts"] + k["dur"] for k in kernels) - min(k["ts"] for k in kernels)
    assert busy < 0.5 * span
    assert any(e.get("cat") == "python_function" for e in events)


def test_cli_help():
    result = subprocess.run([sys.executable, str(ROOT / "sample_traces" / "generate.py"), "--help"],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0 and "--target-mb" in result.stdout
