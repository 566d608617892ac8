"""Deterministic generator of realistic multi-rank PyTorch profiler (Kineto) traces.

Each rank's trace is a Kineto Chrome-trace JSON object, pretty-printed the way
libkineto writes it (several lines per event, 2-space indent), with the launch
chain cpu_op -> cudaLaunchKernel -> kernel joined by ``ac2g`` flows, DDP-style
bucketed all-reduces and one all-gather per step, and ``M`` metadata at the end.

All ranks share one simulated clock. Every rank's step is a coroutine that yields
when it reaches a collective (its arrival time on the NCCL stream) and is resumed
with the collective's completion time, which is the same on every rank: the
latest arrival plus the transfer time. Early ranks therefore show long NCCL
kernels (waiting) and a straggler the shortest ones.

Output is streamed (one step's events are formatted and written at a time) and
byte-identical between runs: seeded RNGs, no wall-clock time, gzip mtime 0.
The static catalog of ops is in ``generate_catalog.py`` and the per-rank simulation and event
output in ``generate_events.py``; this module holds the scenarios, the file header and the API.
Standard library only; run ``python generate.py --help`` for the CLI.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

try:
    from .generate_events import _Rank, _run_step, _Sink
except ImportError:  # run as a script
    from generate_events import _Rank, _run_step, _Sink  # type: ignore[no-redef]

__all__ = ["EXTRA_SCENARIOS", "SCENARIOS", "Scenario", "write_scenario", "write_trace"]


@dataclass(frozen=True)
class Scenario:
    """What to simulate. ``layers`` is the number of compute kernels per forward pass."""

    name: str
    ranks: int
    steps: int
    layers: int
    straggler_rank: int | None
    straggler_delay_us: float  # extra data-loading stall per step on the straggler's CPU
    launch_bound: bool  # tiny kernels launched one by one from Python: host gaps on the stream
    seed: int
    straggler_slowdown: float = 1.25  # compute-kernel duration multiplier on the straggler
    buckets: int = 2  # DDP gradient all-reduce buckets per step
    first_step: int = 1  # number N of the first ProfilerStep#N
    busbw_gbps: float = 150.0  # NCCL bus bandwidth used for transfer times
    base_time_ns: int = 1764547200000000000  # baseTimeNanoseconds: epoch of ts == 0
    #: The forward pass replays a captured CUDA graph: one cudaGraphLaunch per step starts all its kernels
    #: (one correlation, "graph id"/"graph node id" args as Kineto writes them with CUDA 12).
    cuda_graph: bool = False
    #: False: collectives as PyTorch <= 2.0 wrote them (no "Collective name" args, no pg_config; kernels named
    #: ncclKernel_<Op>_RING_LL_Sum_<type>), the input shape only in the nccl: annotation's "Input Dims".
    comm_metadata: bool = True


SCENARIOS: dict[str, Scenario] = {
    "ddp_straggler": Scenario(
        name="ddp_straggler", ranks=4, steps=6, layers=16, straggler_rank=2,
        straggler_delay_us=150.0, launch_bound=False, seed=20251201),
    "launch_bound": Scenario(
        name="launch_bound", ranks=1, steps=3, layers=200, straggler_rank=None,
        straggler_delay_us=0.0, launch_bound=True, seed=7),
}

#: Scenarios the generator writes on request only (``--scenario``); none is committed under sample_traces/.
EXTRA_SCENARIOS: dict[str, Scenario] = {
    "cuda_graph": Scenario(
        name="cuda_graph", ranks=1, steps=3, layers=24, straggler_rank=None,
        straggler_delay_us=0.0, launch_bound=False, seed=17, cuda_graph=True),
}


# ---------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------


def _header(sc: Scenario, rank: int) -> str:
    dev = rank % 8
    dist: dict[str, object] = {
        "backend": "nccl", "rank": rank, "world_size": sc.ranks, "pg_count": 1,
        "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl",
                       "pg_size": sc.ranks, "ranks": list(range(sc.ranks))}], "nccl_version": "2.21.5"}
    if not sc.comm_metadata:  # PyTorch <= 2.0 wrote no process groups
        dist = {"backend": "nccl", "rank": rank, "world_size": sc.ranks}
    trace_id = hashlib.md5(f"{sc.name}:{sc.seed}:{rank}".encode()).hexdigest().upper()
    return (
        '{\n  "schemaVersion": 1,\n  "deviceProperties": [\n    {\n'
        f'      "id": {dev}, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 84929216512,\n'
        '      "computeMajor": 9, "computeMinor": 0,\n'
        '      "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048,\n'
        '      "regsPerBlock": 65536, "regsPerMultiprocessor": 65536, "warpSize": 32,\n'
        '      "sharedMemPerBlock": 49152, "sharedMemPerMultiprocessor": 233472,\n'
        '      "numSms": 132, "sharedMemPerBlockOptin": 232448\n    }\n  ],\n'
        f'  "distributedInfo": {json.dumps(dist)},\n  "record_shapes": 1,\n  "with_flops": 0,\n'
        f'  "cuda_runtime_version": 12040,\n  "cuda_driver_version": 12040,\n  "trace_id": "{trace_id}",\n'
        f'  "host_name": "trainer-{rank // 8:03d}",\n  "baseTimeNanoseconds": {sc.base_time_ns},\n'
        '  "traceEvents": [\n')


@contextmanager
def _open_out(path: Path, compresslevel: int) -> Iterator[BinaryIO]:
    with open(path, "wb", buffering=1 << 20) as raw:
        if path.suffix != ".gz":
            yield raw
            return
        # filename="" and mtime=0 keep the gzip header independent of path and time
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=compresslevel, mtime=0) as gz:
            yield gz


def write_trace(path: str | Path, scenario: Scenario, rank: int, *, target_bytes: int | None = None,
                compresslevel: int | None = None) -> dict:
    """Write ``rank``'s trace of ``scenario`` to ``path`` (gzip if it ends with .gz), streaming.

    With ``target_bytes``, steps repeat past ``scenario.steps`` until the uncompressed JSON is
    about that size. ``compresslevel`` defaults to 9 for sample files, 1 with ``target_bytes``.
    Returns counts of what was written (see the README for the keys).
    """
    if not 0 <= rank < scenario.ranks:
        raise ValueError(f"rank {rank} outside 0..{scenario.ranks - 1}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    level = compresslevel if compresslevel is not None else (9 if target_bytes is None else 1)
    with _open_out(path, level) as fh:
        sink = _Sink(fh)
        ranks = [_Rank(scenario, r, sink if r == rank else None) for r in range(scenario.ranks)]
        sink.write(_header(scenario, rank))
        steps = last = 0

        def more() -> bool:  # with a target: stop when less than half a step is missing
            if target_bytes is None:
                return steps < scenario.steps
            return steps == 0 or target_bytes - sink.nbytes > last // 2

        while more():
            before = sink.nbytes
            _run_step(ranks, scenario.first_step + steps)
            sink.flush()
            steps, last = steps + 1, sink.nbytes - before
        for cat, text in ranks[rank].trailer():
            sink.add(cat, text)
        sink.flush()
        sink.write('\n  ],\n  "traceName": "/tmp/libkineto_activities_%d.json",\n  "displayTimeUnit": "ms"\n}\n'
                   % ranks[rank].pid)
    return {
        "scenario": scenario.name, "rank": rank, "world_size": scenario.ranks, "steps": steps,
        "events": sink.events, "cat_counts": dict(sorted(sink.cats.items())),
        "device_ops": {k: sink.cats[k] for k in ("kernel", "gpu_memcpy", "gpu_memset")},
        "nccl_kernels": sink.nccl, "bytes": sink.nbytes, "file_bytes": path.stat().st_size,
    }


def write_scenario(out_dir: str | Path, scenario: Scenario) -> list[Path]:
    """Write ``rank-<r>.json.gz`` for every rank of ``scenario`` into ``out_dir``."""
    paths = [Path(out_dir) / f"rank-{r}.json.gz" for r in range(scenario.ranks)]
    for rank, path in enumerate(paths):
        write_trace(path, scenario, rank)
    return paths


def main(argv: list[str] | None = None) -> int:
    default_out = Path(__file__).resolve().parent / "kineto"
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    known = SCENARIOS | EXTRA_SCENARIOS
    parser.add_argument("--scenario", default="all", help=f"one of {', '.join(known)}, or all (default: the "
                        f"committed ones, {', '.join(SCENARIOS)})")
    parser.add_argument("--out", type=Path, help=f"output folder (default {default_out}); with --target-mb, "
                        "the output file (default ./<scenario>-rank<R>-<N>mb.json; .gz compresses)")
    parser.add_argument("--target-mb", type=float, help="write one rank, repeating steps up to N MB of JSON")
    parser.add_argument("--rank", type=int, default=0, help="rank to write with --target-mb (default 0)")
    args = parser.parse_args(argv)
    if args.scenario != "all" and args.scenario not in known:
        parser.error(f"unknown scenario {args.scenario!r}")
    if args.target_mb is not None:
        name = "ddp_straggler" if args.scenario == "all" else args.scenario
        out = args.out or Path(f"{name}-rank{args.rank}-{args.target_mb:g}mb.json")
        started = time.perf_counter()
        summary = write_trace(out, known[name], args.rank, target_bytes=int(args.target_mb * 1e6))
        seconds = time.perf_counter() - started
        summary["mb_per_s"] = round(summary["bytes"] / 1e6 / seconds, 1)
        print(json.dumps({"path": str(out), **summary}))
        return 0
    names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    for name in names:
        for path in write_scenario((args.out or default_out) / name, known[name]):
            print(path, path.stat().st_size, "bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
