"""Benchmark: ingesting a large XLA profile (``.xplane.pb``), tracelake vs decoding it whole.

Run it from the repository root with the dev virtualenv::

    python benchmarks/ingest_xla.py                  # ~200 MB XSpace
    python benchmarks/ingest_xla.py --size-mb 100,300 --json out.json   # two sizes: does memory grow?
    python benchmarks/ingest_xla.py --device gpu --size-mb 100          # a GPU profile instead

What it measures: the project's XLA generator (``sample_traces/generate_xla.py``)
writes a TPU profile of 4 chips and 40 training steps, with as many short ops per
step as make about ``--size-mb`` MB (each size in the list in turn); with ``--device gpu``
a JAX-on-GPU profile of 4 GPUs instead (``generate_xla.build_gpu``: kernels on
``Stream #`` lines with their details as per-event stats, the derived ``XLA Ops`` and
``XLA Modules`` lines, a launch call per kernel on the host), as many short kernels
per step as make the size. Then, each in its own child process (so each peak RSS
belongs to one tool):

* tracelake ingests it into a fresh warehouse end to end (decode, map, write
  Parquet, per-trace analyses, register);
* tracelake only parses it into its Parquet tables (``ingest.parse_into``: the
  streaming XSpace reader, without the per-trace analyses), to tell the two apart;
* the anchor decodes the same file the way tools without a streaming reader do:
  the whole XSpace as one protobuf message (protobuf's C decoder, upb), then walks
  every event once. XProf and TensorBoard also hold the decoded XSpace whole, and
  their users report 20-30 GB of RAM and ~40 s for a 1 GB xplane; that anchor is
  the floor of that approach (no conversion to tables at all).

The trace is generated in a child process as well: on Linux a child's peak RSS
(``ru_maxrss``) starts from its parent's at the fork, so a parent holding the
generated trace would inflate every figure (it did, before this was so).

Read the ratios: the machines are shared and noisy. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ingest_kineto import MB, TRACELAKE_CHILD, run_child  # noqa: E402  (benchmarks/ is not a package)

from tracelake.sample_traces import generate_xla  # noqa: E402

WHOLE_CHILD = """
import json, resource, sys, time
from tracelake.ingest.xplane_proto import XSpaceWhole
trace, out = sys.argv[1:3]
base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
started = time.perf_counter()
space = XSpaceWhole.FromString(open(trace, "rb").read())
events = 0
for plane in space.planes:
    for line in plane.lines:
        for event in line.events:
            events += event.duration_ps > 0
seconds = time.perf_counter() - started
json.dump({"seconds": seconds, "events": events, "base_rss_bytes": base_rss}, open(out, "w"))
"""


GENERATE_CHILD = """
import sys
from pathlib import Path
from tracelake.sample_traces import generate_xla
build = generate_xla.build_gpu if sys.argv[4] == "gpu" else generate_xla.build
Path(sys.argv[1]).write_bytes(build(int(sys.argv[2]), int(sys.argv[3])))
"""
PARSE_CHILD = """
import json, resource, sys, tempfile, time
from pathlib import Path
from tracelake import ingest
trace, out = sys.argv[1:3]
base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
started = time.perf_counter()
with tempfile.TemporaryDirectory(prefix="tracelake-bench-parse-") as staging:
    _, info = ingest.parse_into(Path(trace), Path(staging), ingest.ParseOptions(source_name=Path(trace).name))
seconds = time.perf_counter() - started
json.dump({"seconds": seconds, "events": info.event_count, "base_rss_bytes": base_rss}, open(out, "w"))
"""


#: Training steps in the generated profile (XProf captures a few seconds: tens of steps, many ops each).
STEPS = 40


#: Ops per step besides the short ones: TPU (``generate_xla.OPS``), GPU (GEMMs, all-reduce, copy).
FIXED_OPS = {"tpu": len(generate_xla.OPS), "gpu": generate_xla.GEMMS + len(generate_xla.GPU_FIXED)}
DEVICES = {"tpu": f"{generate_xla.CHIPS} TPU chips", "gpu": f"{generate_xla.GPUS} GPUs"}


def bytes_per_small_op(device: str = "tpu") -> float:
    """File bytes one more short op (TPU) or kernel (GPU) per step adds."""
    build = generate_xla.build_gpu if device == "gpu" else generate_xla.build
    return (len(build(STEPS, 200)) - len(build(STEPS, 100))) / 100


def measure(size_mb: float, workdir: Path, timeout: float, device: str = "tpu") -> dict[str, Any]:
    """Generate a ``device`` profile of about ``size_mb`` MB and run the three children on it; the figures of each."""
    small_ops = max(1, int(size_mb * MB / bytes_per_small_op(device)))
    trace = workdir / "host0.xplane.pb"
    # In a child: a child's peak RSS counts the parent's at the fork, so the parent must not hold the trace.
    subprocess.run([sys.executable, "-c", GENERATE_CHILD, str(trace), str(STEPS), str(small_ops), device],
                   check=True)
    size = trace.stat().st_size
    print(f"\ntrace: {trace} ({size / MB:,.1f} MB, {STEPS} steps of {small_ops + FIXED_OPS[device]:,} ops on "
          f"{DEVICES[device]})", flush=True)
    results: dict[str, dict[str, Any]] = {}
    home = workdir / "warehouse"
    shutil.rmtree(home, ignore_errors=True)
    try:
        results["tracelake ingest"] = _run(TRACELAKE_CHILD, [trace, home], workdir, timeout)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    results["tracelake parse only"] = _run(PARSE_CHILD, [trace], workdir, timeout)
    results["whole-message decode"] = _run(WHOLE_CHILD, [trace], workdir, timeout)
    trace.unlink()

    print(f"\n{'':<22} {'seconds':>8} {'MB/s':>8} {'events/s':>12} {'peak RSS MB':>12} {'RSS/trace':>10}")
    for name, fig in results.items():
        if "error" in fig:
            print(f"{name:<22} FAILED: {fig['error'].strip().splitlines()[-1][:160]}")
            continue
        print(f"{name:<22} {fig['seconds']:>8.2f} {size / MB / fig['seconds']:>8.1f} "
              f"{fig['events'] / fig['seconds']:>12,.0f} {fig['peak_rss_bytes'] / MB:>12,.0f} "
              f"{fig['peak_rss_bytes'] / size:>10.2f}")
    ours, parse, whole = results["tracelake ingest"], results["tracelake parse only"], results["whole-message decode"]
    ratios: dict[str, float] = {}
    if "error" not in whole:
        for prefix, fig in (("", ours), ("parse_", parse)):
            if "error" not in fig:
                ratios[f"{prefix}time_vs_whole_decode"] = fig["seconds"] / whole["seconds"]
                ratios[f"{prefix}rss_vs_whole_decode"] = fig["peak_rss_bytes"] / whole["peak_rss_bytes"]
    if len(ratios) == 4:
        print(f"\ntracelake's full ingest takes {ratios['time_vs_whole_decode']:.1f}x the time of only decoding the "
              f"file whole, with {ratios['rss_vs_whole_decode']:.2f}x its peak memory; parsing alone "
              f"{ratios['parse_time_vs_whole_decode']:.1f}x the time, {ratios['parse_rss_vs_whole_decode']:.2f}x the "
              "memory")
    return {"device": device, "trace_bytes": size, "steps": STEPS, "ops_per_step": small_ops + FIXED_OPS[device],
            "results": results, "ratios": ratios}


def _run(code: str, inputs: list[Path], workdir: Path, timeout: float) -> dict[str, Any]:
    """One child's figures with its peak RSS, or ``{"error": ...}`` if it failed (the others still run)."""
    try:
        out, rss = run_child(sys.executable, code, inputs, workdir, timeout)
    except RuntimeError as exc:
        print(f"child failed, continuing: {exc}", flush=True)
        return {"error": str(exc)}
    return {**out, "peak_rss_bytes": rss}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", default="200",
                        help="size of the generated .xplane.pb; several, comma-separated, run in turn (default 200)")
    parser.add_argument("--device", choices=sorted(DEVICES), default="tpu",
                        help="profile layout: TPU (XLA Ops lines) or GPU (Stream lines, per-event stats); default tpu")
    parser.add_argument("--workdir", type=Path, help="where the trace and warehouse go (default: a temp dir)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per child run (default 3600)")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    try:
        sizes = [float(s) for s in str(args.size_mb).split(",") if s.strip()]
    except ValueError:
        parser.error(f"--size-mb: not a number or a comma-separated list of numbers: {args.size_mb!r}")
    if not sizes or min(sizes) <= 0:
        parser.error("--size-mb: sizes must be positive")

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tracelake-bench-xla-"))
    workdir.mkdir(parents=True, exist_ok=True)
    figures = {f"{size:g}": measure(size, workdir, args.timeout, args.device) for size in sizes}
    if len(sizes) > 1:
        print("\npeak RSS by size (MB):")
        for name in ("tracelake ingest", "tracelake parse only", "whole-message decode"):
            print(f"  {name:<22} " + "  ".join(
                f"{fig['trace_bytes'] / MB:,.0f} MB file: "
                + (f"{fig['results'][name]['peak_rss_bytes'] / MB:,.0f}" if "error" not in fig["results"][name]
                   else "failed")
                for fig in figures.values()))
    if args.json:
        args.json.write_text(json.dumps(figures if len(sizes) > 1 else next(iter(figures.values())), indent=2,
                                        default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
