"""Benchmark: what operator attribution and FLOPs (``op_stats``, ``breakdown.mfu_pct``) add to a Kineto ingest.

Run it from the repository root with the dev virtualenv::

    python benchmarks/op_stats_cost.py                      # 500 MB generated trace, 3 runs each
    python benchmarks/op_stats_cost.py --size-mb 100 --runs 2
    python benchmarks/op_stats_cost.py --trace sample_traces/gpu_h200/train/train.pt.trace.json.gz --runs 5

The anchor is the same ingest with the step left out: in the child measured "without", the
function that reads the operator calls (``warehouse.derived_operators.operators``) answers nothing, so
every kernel goes to no operator and no FLOPs are counted, and the rest of the ingest is
unchanged. The two alternate in separate child processes (``benchmarks/ingest_kineto.py``'s
generator and child runner), so each peak RSS belongs to one run; the table shows each
side's fastest run and largest peak RSS, and the ratios. #23's budget: within 10% of the
anchor's time and peak memory. The machines are shared and noisy: read the ratio.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ingest_kineto import GENERATE_CHILD, HERE, MB, run_child, warm_page_cache

CHILD = """
import json, resource, sys, time
mode = sys.argv[1]
import tracelake.warehouse.derived as derived
if mode == "without":  # the operators' pass answers nothing (derived._operators in trees before it moved)
    if hasattr(derived, "derived_operators"):
        derived.derived_operators.operators = lambda path: {}
    else:
        derived._operators = lambda path: {}
from tracelake.warehouse import Warehouse
trace, home, out = sys.argv[2:5]
wh = Warehouse(home=home)
started = time.perf_counter()
report = wh.ingest([trace], job="bench")
seconds = time.perf_counter() - started
res = report.results[0]
if res.status != "ingested":
    sys.exit(f"ingest went wrong: status={res.status!r} error={res.error!r}")
ops = wh.query("SELECT count(*) FROM op_stats WHERE op <> '(no operator)'").rows[0][0]
if (ops > 0) != (mode == "with"):
    sys.exit(f"{mode}: {ops} operator rows")
json.dump({"seconds": seconds, "op_rows": ops}, open(out, "w"))
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=500, help="generated trace size (default 500)")
    parser.add_argument("--trace", type=Path, help="measure this trace instead of a generated one")
    parser.add_argument("--runs", type=int, default=3, help="runs per side, alternating (default 3)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per child run")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="tracelake-opstats-"))
    try:
        trace = args.trace
        if trace is None:
            trace = workdir / "ddp_straggler-rank0.json"
            generated = workdir / "generated.json"
            subprocess.run([sys.executable, "-c", GENERATE_CHILD, str(HERE), str(trace), str(args.size_mb * MB),
                            "20", "0", str(generated)], check=True)
        size = trace.stat().st_size
        print(f"trace: {trace} ({size / MB:,.1f} MB on disk)", flush=True)
        seconds: dict[str, list[float]] = {"without": [], "with": []}
        rss: dict[str, list[int]] = {"without": [], "with": []}
        for run in range(1, args.runs + 1):
            for mode in ("without", "with"):
                home = workdir / f"home-{mode}"
                warm_page_cache(trace)
                started = time.perf_counter()
                out, peak = run_child(sys.executable, CHILD, [Path(mode), trace, home], workdir, args.timeout)
                shutil.rmtree(home, ignore_errors=True)
                seconds[mode].append(out["seconds"])
                rss[mode].append(peak)
                print(f"run {run}: {mode:<8} {out['seconds']:.2f} s, peak {peak / MB:,.0f} MB "
                      f"({time.perf_counter() - started:.1f} s with the child's start)", flush=True)
        print(f"\n{'ingest':<22} {'seconds':>8} {'peak RSS MB':>12}")
        for mode, label in (("without", "without op_stats"), ("with", "with op_stats")):
            print(f"{label:<22} {min(seconds[mode]):>8.2f} {max(rss[mode]) / MB:>12,.0f}")
        time_ratio = min(seconds["with"]) / min(seconds["without"])
        rss_ratio = max(rss["with"]) / max(rss["without"])
        print(f"\nop_stats costs {100 * (time_ratio - 1):+.1f}% time and {100 * (rss_ratio - 1):+.1f}% peak memory "
              f"(budget: +10% each)")
        print(json.dumps({"time_ratio": time_ratio, "rss_ratio": rss_ratio, "seconds": seconds, "peak_rss": rss}))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
