"""Benchmark: the analysis set on one ingested Kineto trace, tracelake vs HTA.

Run it from the repository root with the dev virtualenv::

    python benchmarks/analyses.py                        # ~50 MB trace, ~20 steps
    python benchmarks/analyses.py --size-mb 100 --json out.json

What it measures: the project's generator writes one rank of the ``ddp_straggler``
scenario (about ``--size-mb`` MB of JSON, about ``--steps`` training steps; the layer
count comes from ``layers_for_steps`` in ``ingest_kineto.py``) once. Then, each in its
own child process, so that every peak RSS belongs to one tool and one operation:

* tracelake ingests the trace into a fresh warehouse (not timed; that is
  ``ingest_kineto.py``'s subject), then times ``Warehouse(home).analyze(job="bench")``
  (breakdown read from the stored table, findings, top kernels, idle by stream,
  launch stats, step stats/outliers, collectives) and, in another child,
  ``Warehouse(home).recompute(job="bench")`` (recomputing the stored breakdown);
* HTA 0.5.0 (the cached ``benchmarks/.venv-hta``) parses the trace with
  ``TraceAnalysis(trace_dir=...)`` (not timed), then times
  ``get_temporal_breakdown`` + ``get_comm_comp_overlap`` + ``get_gpu_kernel_breakdown``
  (all with ``visualize=False``, other arguments at their defaults) together.

Each timed call is repeated ``--runs`` times (default 3) and the fastest counts.
HTA's peak RSS necessarily includes its parsed in-memory trace; tracelake's analyze
and recompute read the stored Parquet tables. Rank 0's idle %, compute % (of the
span) and communication/computation overlap % are printed from both tools, side by
side, to show whether they agree. Compare the ratio, not absolute times (the machines
are shared and noisy); nothing is asserted. If HTA fails, its error is printed and the
script still exits 0 with tracelake's figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ingest_kineto import (  # noqa: E402  (benchmarks/ is not a package)
    HTA_REQUIREMENTS, MB, TRACELAKE_CHILD, hta_python, layers_for_steps, run_child, tracelake_source_id)

# Child programs: argv = [inputs..., runs, result.json]; each writes its figures there as JSON.
ANALYZE_CHILD = """
import json, resource, sys, time
from tracelake.warehouse import Warehouse
home, runs, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
seconds = []
for _ in range(runs):
    started = time.perf_counter()
    result = Warehouse(home).analyze(job="bench")
    seconds.append(time.perf_counter() - started)
row = result.breakdown.filter(result.breakdown["rank"] == 0).to_dicts()[0]
json.dump({"seconds": seconds, "base_rss_bytes": base_rss, "findings": len(result.findings),
           "idle_pct": 100 * row["idle_ns"] / row["span_ns"], "compute_pct": 100 * row["compute_ns"] / row["span_ns"],
           "overlap_pct": row["overlap_pct"], "span_us": row["span_ns"] / 1e3}, open(out, "w"))
"""
RECOMPUTE_CHILD = """
import json, resource, sys, time
from tracelake.warehouse import Warehouse
home, runs, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
seconds = []
for _ in range(runs):
    started = time.perf_counter()
    done = Warehouse(home).recompute(job="bench")
    seconds.append(time.perf_counter() - started)
    assert done == 1, done
json.dump({"seconds": seconds, "base_rss_bytes": base_rss}, open(out, "w"))
"""
HTA_CHILD = """
import json, resource, sys, time
from hta.trace_analysis import TraceAnalysis
trace_dir, runs, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
started = time.perf_counter()
a = TraceAnalysis(trace_dir=trace_dir)
parse_seconds = time.perf_counter() - started
base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
seconds = []
for _ in range(runs):
    started = time.perf_counter()
    temporal = a.get_temporal_breakdown(visualize=False)
    overlap = a.get_comm_comp_overlap(visualize=False)
    kernel_types, kernels = a.get_gpu_kernel_breakdown(visualize=False)
    seconds.append(time.perf_counter() - started)
t0 = temporal[temporal["rank"] == 0].iloc[0]
o0 = overlap[overlap["rank"] == 0].iloc[0]
json.dump({"seconds": seconds, "base_rss_bytes": base_rss, "parse_seconds": parse_seconds,
           "idle_pct": float(t0["idle_time_pctg"]), "compute_pct": float(t0["compute_time_pctg"]),
           "overlap_pct": float(o0["comp_comm_overlap_pctg"]), "span_us": float(t0["kernel_time(us)"]),
           "kernel_rows": len(kernels), "kernel_type_rows": len(kernel_types)}, open(out, "w"))
"""
TIMED = {"tracelake analyze": "analyze(job=...): full analysis set",
         "tracelake recompute": "recompute(job=...): stored breakdown",
         "HTA": "temporal breakdown + overlap + kernel breakdown"}


def measure(name: str, python: str, code: str, inputs: list[Path], runs: int, workdir: Path,
            timeout: float) -> dict[str, Any]:
    """One child run: its figures plus ``peak_rss_bytes``; ``error`` set if it failed."""
    try:
        out, rss = run_child(python, code, [*inputs, Path(str(runs))], workdir, timeout)
    except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
        print(f"{name} FAILED: {exc}", flush=True)
        return {"error": str(exc)}
    out["peak_rss_bytes"] = rss
    out["best_seconds"] = min(out["seconds"])
    print(f"{name}: {', '.join(f'{s:.3f}' for s in out['seconds'])} s", flush=True)
    return out


def faster(ratio: float) -> str:
    """``X.Yx faster`` (or ``X.Yx slower`` when the ratio of HTA's time to tracelake's is below 1)."""
    return f"{ratio:.1f}x faster" if ratio >= 1 else f"{1 / ratio:.1f}x slower"


def report(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Print the table, the ratio line and rank 0's figures; return the ratios for ``--json``."""
    print(f"\n{'timed call':<20} {'best s':>8} {'peak RSS MB':>12} {'RSS before MB':>14}  what")
    for name, what in TIMED.items():
        fig = results.get(name, {"error": "skipped"})
        if "error" in fig:
            last = [line for line in fig["error"].splitlines() if line.strip()][-1]
            print(f"{name:<20} did not run: {last}")
            continue
        print(f"{name:<20} {fig['best_seconds']:>8.3f} {fig['peak_rss_bytes'] / MB:>12,.0f} "
              f"{fig['base_rss_bytes'] / MB:>14,.0f}  {what}")
    ratios: dict[str, Any] = {}
    tl, hta = results["tracelake analyze"], results.get("HTA", {"error": "skipped"})
    if "error" in hta or "error" in tl:
        print("\nHTA (or tracelake analyze) did not run: no ratio")
        return ratios
    ratios["analyze_vs_hta"] = hta["best_seconds"] / tl["best_seconds"]
    print(f"\ntracelake analyze (full set) is {faster(ratios['analyze_vs_hta'])} than HTA's "
          f"temporal breakdown + overlap + kernel breakdown")
    rec = results.get("tracelake recompute", {})
    if "best_seconds" in rec:
        ratios["recompute_vs_hta"] = hta["best_seconds"] / rec["best_seconds"]
        print(f"tracelake recompute of the breakdown is {faster(ratios['recompute_vs_hta'])} than the same HTA set")
    ratios["peak_rss_analyze_vs_hta"] = tl["peak_rss_bytes"] / hta["peak_rss_bytes"]
    print(f"(HTA's untimed parse took {hta['parse_seconds']:.1f} s; its peak RSS includes the parsed trace)")
    print(f"\nrank 0{'':<22} {'tracelake':>10} {'HTA':>10}")
    for key, label in (("idle_pct", "idle % of span"), ("compute_pct", "compute % of span"),
                       ("overlap_pct", "comm/comp overlap %"), ("span_us", "span (us)")):
        cells = ["n/a" if v is None else f"{v:,.2f}" for v in (tl.get(key), hta.get(key))]
        print(f"{label:<28} {cells[0]:>10} {cells[1]:>10}")
    return ratios


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=50, help="uncompressed trace size (default 50)")
    parser.add_argument("--steps", type=int, default=20, help="about how many training steps (default 20)")
    parser.add_argument("--runs", type=int, default=3, help="timed calls per child; the fastest counts (default 3)")
    parser.add_argument("--workdir", type=Path, help="where the trace and warehouse go (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the trace, warehouse and child logs")
    parser.add_argument("--skip-hta", action="store_true", help="measure tracelake only")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per child run (default 3600)")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    from tracelake.sample_traces.generate import SCENARIOS, write_trace

    scenario = SCENARIOS["ddp_straggler"]
    scenario = dataclasses.replace(scenario, layers=layers_for_steps(scenario, args.size_mb * MB, args.steps))
    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="tracelake-bench-analyses-", dir=args.workdir))
    try:
        trace_dir, home = workdir / "trace", workdir / "warehouse"  # HTA takes a directory holding only the trace
        trace = trace_dir / "ddp_straggler-rank0.json"
        source_id = tracelake_source_id()
        written = write_trace(trace, scenario, 0, target_bytes=int(args.size_mb * MB))
        print(f"trace: {trace} ({written['bytes'] / MB:,.1f} MB JSON, {written['events']:,} events, "
              f"{written['steps']} steps, {scenario.layers} layers); tracelake sources {source_id}", flush=True)
        home.mkdir()
        started = time.perf_counter()
        try:  # ingest_kineto.py's child: ingests and checks the status (not timed here)
            ingest, _ = run_child(sys.executable, TRACELAKE_CHILD, [trace, home], workdir, args.timeout)
        except RuntimeError as exc:
            raise SystemExit(f"tracelake ingest FAILED: {exc}") from None
        print(f"ingested {ingest['events']:,} events in {time.perf_counter() - started:.1f} s (not timed)", flush=True)
        results = {
            "tracelake analyze": measure("tracelake analyze", sys.executable, ANALYZE_CHILD, [home],
                                         args.runs, workdir, args.timeout),
            "tracelake recompute": measure("tracelake recompute", sys.executable, RECOMPUTE_CHILD, [home],
                                           args.runs, workdir, args.timeout),
        }
        if "error" in results["tracelake analyze"]:
            raise SystemExit("tracelake analyze FAILED")
        if not args.skip_hta:
            try:
                python = hta_python()
            except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
                print(f"HTA FAILED, continuing with tracelake only: {exc}", flush=True)
                results["HTA"] = {"error": str(exc)}
            else:
                results["HTA"] = measure("HTA", python, HTA_CHILD, [trace_dir], args.runs, workdir, args.timeout)
        ratios = report(results)
        if args.json:
            meta = {"size_mb": args.size_mb, "steps": written["steps"], "layers": scenario.layers,
                    "runs": args.runs, "trace_bytes": written["bytes"], "events": ingest["events"],
                    "tracelake_sources": source_id, "python": sys.version, "cpus": os.cpu_count(),
                    "hta_requirements": HTA_REQUIREMENTS}
            args.json.write_text(json.dumps({"meta": meta, "results": results, "ratios": ratios},
                                            indent=2, default=str) + "\n")
    finally:
        if args.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
