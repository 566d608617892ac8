"""Benchmark: ingesting a large XLA profile (``.xplane.pb``), tracelake vs decoding it whole.

Run it from the repository root with the dev virtualenv::

    python benchmarks/ingest_xla.py                  # ~200 MB XSpace
    python benchmarks/ingest_xla.py --size-mb 500 --json out.json

What it measures: the project's XLA generator (``sample_traces/generate_xla.py``)
writes a TPU profile of 4 chips and 40 training steps, with as many short ops per
step as make about ``--size-mb`` MB. Then, each in its own child process (so each peak RSS belongs to
one tool):

* tracelake ingests it into a fresh warehouse end to end (decode, map, write
  Parquet, per-trace analyses, register);
* the anchor decodes the same file the way tools without a streaming reader do:
  the whole XSpace as one protobuf message (protobuf's C decoder, upb), then walks
  every event once. XProf and TensorBoard also hold the decoded XSpace whole, and
  their users report 20-30 GB of RAM and ~40 s for a 1 GB xplane; that anchor is
  the floor of that approach (no conversion to tables at all).

Read the ratios: the machines are shared and noisy. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
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


#: Training steps in the generated profile (XProf captures a few seconds: tens of steps, many ops each).
STEPS = 40


def bytes_per_small_op() -> float:
    return (len(generate_xla.build(STEPS, 200)) - len(generate_xla.build(STEPS, 100))) / 100


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=200, help="size of the generated .xplane.pb (default 200)")
    parser.add_argument("--workdir", type=Path, help="where the trace and warehouse go (default: a temp dir)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per child run (default 3600)")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tracelake-bench-xla-"))
    workdir.mkdir(parents=True, exist_ok=True)
    small_ops = max(1, int(args.size_mb * MB / bytes_per_small_op()))
    trace = workdir / "host0.xplane.pb"
    trace.write_bytes(generate_xla.build(STEPS, small_ops))
    size = trace.stat().st_size
    steps = STEPS
    print(f"trace: {trace} ({size / MB:,.1f} MB, {STEPS} steps of {small_ops + 8:,} ops on "
          f"{generate_xla.CHIPS} chips)", flush=True)

    results: dict[str, dict[str, Any]] = {}
    out, rss = run_child(sys.executable, TRACELAKE_CHILD, [trace, workdir / "warehouse"], workdir, args.timeout)
    results["tracelake ingest"] = {**out, "peak_rss_bytes": rss}
    out, rss = run_child(sys.executable, WHOLE_CHILD, [trace], workdir, args.timeout)
    results["whole-message decode"] = {**out, "peak_rss_bytes": rss}

    print(f"\n{'':<22} {'seconds':>8} {'MB/s':>8} {'events/s':>12} {'peak RSS MB':>12} {'RSS/trace':>10}")
    for name, fig in results.items():
        print(f"{name:<22} {fig['seconds']:>8.2f} {size / MB / fig['seconds']:>8.1f} "
              f"{fig['events'] / fig['seconds']:>12,.0f} {fig['peak_rss_bytes'] / MB:>12,.0f} "
              f"{fig['peak_rss_bytes'] / size:>10.2f}")
    ours, whole = results["tracelake ingest"], results["whole-message decode"]
    ratios = {
        "time_vs_whole_decode": ours["seconds"] / whole["seconds"],
        "rss_vs_whole_decode": ours["peak_rss_bytes"] / whole["peak_rss_bytes"],
    }
    print(f"\ntracelake's full ingest takes {ratios['time_vs_whole_decode']:.1f}x the time of only decoding the "
          f"file whole, with {ratios['rss_vs_whole_decode']:.2f}x its peak memory")
    if args.json:
        args.json.write_text(json.dumps({"trace_bytes": size, "steps": steps, "results": results,
                                         "ratios": ratios}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
