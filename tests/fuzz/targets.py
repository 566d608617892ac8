"""What the fuzzers feed and how one input is judged.

Each fuzz target is one parser, named as the warehouse names its format
(``pytorch_profiler``, ``xla``, ...). A target has a file name (parsers read ranks,
hosts and collectives from names, so fuzzed bytes are written under a realistic
one) and seed inputs: small files from ``sample_traces/`` (trimmed where the
sample is large, so every fuzzed input parses in milliseconds) and, for the XLA
trace-viewer JSON that has no sample, a small document built here.

:func:`run_input` is the property every fuzzer checks: parsing a file either
succeeds or raises the project's own :class:`TracelakeError` whose message names
the file. Anything else escapes and is a bug.
"""

from __future__ import annotations

import gzip
import json
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from itertools import count
from pathlib import Path
from typing import Any

from tracelake import ingest
from tracelake.contracts.errors import TracelakeError

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "sample_traces"
REGRESSIONS = Path(__file__).resolve().parent / "regressions"

_serial = count()


@dataclass(frozen=True)
class Target:
    """One parser under fuzzing: the name its input is written under and its seeds."""

    format: str
    filename: str
    seeds: Callable[[], list[bytes]]


def _read(*parts: str) -> bytes:
    return SAMPLES.joinpath(*parts).read_bytes()


def kineto_seed() -> bytes:
    """A small Kineto trace: the header of a DDP sample and a few events of every phase and category."""
    doc = json.loads(gzip.decompress(_read("kineto", "ddp_straggler", "rank-0.json.gz")))
    seen: dict[tuple[object, object], int] = {}
    events = []
    for event in doc["traceEvents"]:
        key = (event.get("ph"), event.get("cat"))
        seen[key] = seen.get(key, 0) + 1
        if seen[key] <= 6 or key[0] in ("M", "i") or "nccl" in str(event.get("name", "")).lower()[:40] \
                and seen[key] <= 20:
            events.append(event)
    doc["traceEvents"] = events
    return json.dumps(doc, indent=1).encode()


def kineto_seeds() -> list[bytes]:
    seed = kineto_seed()
    return [seed, gzip.compress(seed, mtime=0)]


def xla_json_seed() -> bytes:
    """A small trace-viewer JSON of an XLA run: a TPU with steps and ops, a GPU stream, a host with a step."""
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:TPU:0"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "Steps"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "XLA Ops"}},
        {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/device:GPU:0"}},
        {"ph": "M", "name": "thread_name", "pid": 2, "tid": 16, "args": {"name": "Stream #16(Kernel)"}},
        {"ph": "M", "name": "process_name", "pid": 3, "args": {"name": "/host:CPU"}},
        {"ph": "M", "name": "thread_name", "pid": 3, "tid": 7, "args": {"name": "python/7"}},
        {"ph": "X", "name": "1", "pid": 1, "tid": 1, "ts": 0.0, "dur": 100.0, "args": {"step_num": "1"}},
        {"ph": "X", "name": "fusion.1", "pid": 1, "tid": 2, "ts": 1.0, "dur": 20.5,
         "args": {"hlo_module": "jit_step", "hlo_category": "convolution", "long_name": "%fusion.1 = f32[8]",
                  "flops": "1024", "bytes_accessed": "4096", "program_id": "7"}},
        {"ph": "X", "name": "all-reduce.2", "pid": 1, "tid": 2, "ts": 30.0, "dur": 40.0,
         "args": {"hlo_module": "jit_step", "hlo_category": "all-reduce"}},
        {"ph": "X", "name": "gemm_kernel", "pid": 2, "tid": 16, "ts": 5.0, "dur": 7.25,
         "args": {"hlo_op": "dot.3", "hlo_module": "jit_step", "correlation_id": "11"}},
        {"ph": "X", "name": "ncclDevKernel_AllReduce", "pid": 2, "tid": 16, "ts": 15.0, "dur": 9.0,
         "args": {"hlo_op": "all-reduce.4", "hlo_module": "jit_step"}},
        {"ph": "X", "name": "train_step", "pid": 3, "tid": 7, "ts": 0.0, "dur": 120.0, "args": {"step_num": "1"}},
        {"ph": "X", "name": "dot.3", "pid": 3, "tid": 7, "ts": 2.0, "dur": 3.0,
         "args": {"hlo_op": "dot.3", "hlo_module": "jit_step", "device_ordinal": "0"}},
        {"ph": "X", "name": "PjitFunction(step)", "pid": 3, "tid": 7, "ts": 1.0, "dur": 50.0,
         "args": {"correlation_id": "3"}},
    ]
    doc = {"displayTimeUnit": "ns", "metadata": {"highres-ticks": True}, "traceEvents": events}
    return json.dumps(doc, indent=1).encode()


def xplane_seeds() -> list[bytes]:
    from tracelake.sample_traces import generate_xla

    return [_read("xla", "tpu_allreduce", "host0.xplane.pb"), generate_xla.build(steps=1)]


def _nccl_generated(function: str, rank: int) -> bytes:
    """A shape the committed samples lack, from the generator (pretty-printed Inspector, NCCL 2.28's plugin)."""
    from tracelake.sample_traces import generate_nccl

    text: str = getattr(generate_nccl, function)(rank)
    return text.encode()


TARGETS: dict[str, Target] = {t.format: t for t in (
    Target("pytorch_profiler", "rank-0.json", kineto_seeds),
    Target("xla", "host0.xplane.pb", xplane_seeds),
    Target("xla_json", "host0.trace.json", lambda: [xla_json_seed()]),
    Target("nccl_tests", "all_reduce_perf.txt", lambda: [
        _read("nccl", "nccl_tests", "all_reduce_perf.txt"), _read("nccl", "nccl_tests", "all_gather_perf_old.txt"),
        _read("nccl", "nccl_tests", "reduce_scatter_perf.json")]),
    Target("nccl_inspector", "node-a-pid4100.log", lambda: [_read("nccl", "inspector", "node-a-pid4100.log"),
                                                           _nccl_generated("inspector_pretty", 0)]),
    Target("nccl_profiler", "nccl_profile_4242424242_0.json",
           lambda: [_read("nccl", "profiler_plugin", "nccl_profile_4242424242_0.json"),
                    _nccl_generated("profiler_plugin_228_dump", 1)]),  # bare datatype/Stream, (nil)
    Target("flight_recorder", "nccl_trace_rank_0", lambda: [
        _read("nccl", "flight_recorder", "nccl_trace_rank_0.json"),
        _read("nccl", "flight_recorder", "nccl_trace_rank_3")]),
    Target("nccl_log", "train-4ranks.log", lambda: [_read("nccl", "debug_log", "train-4ranks.log")]),
)}


class Crash(AssertionError):
    """A parser let something other than the project's own error escape, or its message lost the file name."""


def run_input(target: Target, data: bytes, workdir: Path) -> str:
    """Write ``data`` under the target's file name and parse it as the warehouse would (detect, then parse).

    Returns:
        ``"parsed"`` or ``"rejected"`` (a :class:`TracelakeError` naming the file).

    Raises:
        Crash: the error's message does not name the file.
        Exception: whatever else the parser let escape (the bug the fuzzers look for).
    """
    folder = workdir / f"in-{next(_serial)}"
    staging = folder / "staging"
    staging.mkdir(parents=True)
    path = folder / target.filename
    path.write_bytes(data)
    try:
        options = ingest.ParseOptions(source_name=path.name, trace_id="f" * 20, threads=1, memory_limit="256MB")
        try:
            ingest.parse_into(path, staging, options)
        except TracelakeError as exc:
            if path.name not in str(exc):
                raise Crash(f"error message does not name {path.name}: {exc}") from exc
            return "rejected"
        return "parsed"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def write_corpus(target: Target, folder: Path) -> list[Path]:
    """Write the target's seeds (and its kept regressions) into ``folder`` as an atheris/libFuzzer corpus."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    inputs = target.seeds() + [p.read_bytes() for p in regression_files(target.format)]
    for i, data in enumerate(inputs):
        path = folder / f"seed-{i:03d}"
        path.write_bytes(data)
        paths.append(path)
    return paths


def regression_files(fmt: str) -> list[Path]:
    """The crashing inputs kept for ``fmt`` under ``regressions/<format>/``."""
    folder = REGRESSIONS / fmt
    return sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")) \
        if folder.is_dir() else []


def scratch() -> Path:
    """A temporary folder for the fuzzers' input files."""
    return Path(tempfile.mkdtemp(prefix="tracelake-fuzz-"))
