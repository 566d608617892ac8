"""Benchmark: critical paths and what-ifs of a multi-rank job, against its ingest and against HTA.

Run it from the repository root with the dev virtualenv::

    python benchmarks/critical_path.py                           # 8 ranks x 100 MB, ~20 steps
    python benchmarks/critical_path.py --ranks 4 --size-mb 20 --json out.json

What it measures: the project's generator writes ``--ranks`` rank traces of the
``ddp_straggler`` scenario (``dataclasses.replace(..., ranks=N)``), each about
``--size-mb`` MB of JSON and about ``--steps`` training steps (the layer count comes
from ``ingest_kineto.layers_for_steps``); every rank has the same steps and the same
collectives, which is checked. Then, each in its own child process, so that every peak
RSS belongs to one operation:

* **ingest**: ``Warehouse(home).ingest(<all rank files>, job="bench")``, checked;
* **job critical path**: ``critical_inputs.read(store, pairs, traces, collectives)`` (the columns of
  ``host_ops``, ``device_ops``, ``collectives`` the graph needs, every rank), timed apart
  from ``critical_path.analyse(inputs)`` (graph, the path of every step, and the
  what-if replays of every step); then ``critical_inputs.analyse(...)`` whole, as
  ``Warehouse.analyze`` calls it (read + analyse + whatever it adds);
* **Warehouse.analyze(job="bench")**, the whole analysis set, for context;
* **rank 0 alone**: the same read + analyse with a list of one ``RankInput``;
* **HTA 0.5.0** (``benchmarks/.venv-hta``) on rank 0's file alone:
  ``TraceAnalysis(trace_dir=<dir with only rank 0>)`` timed as the load, then
  ``critical_path_analysis(rank=0, annotation="ProfilerStep", instance_id=i)`` for every
  step ``i`` (HTA answers one instance, or one range of instances, per call; its instances
  are the ``ProfilerStep#N`` annotations, on the CPU and on the GPU: the CPU's are given).

Each tracelake child does ``--runs`` calls and the fastest counts; the HTA loop over the
steps runs once. ``--profile`` adds a child that runs the job's read + analyse under
cProfile (not timed) and prints its top entries. Peak RSS is the child's ``ru_maxrss`` (``os.wait4``). Nothing is
asserted; compare the ratios, not absolute times (the machines are shared and noisy).
"""

from __future__ import annotations

import argparse
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
    HTA_REQUIREMENTS, MB, hta_python, run_child, tracelake_source_id, warm_page_cache)

#: The tracelake subpackages measured; their hash is printed, and checked again at the end.
SOURCES = ("ingest", "warehouse", "analysis", "contracts")

# Child programs: argv = [inputs..., result.json]; each writes its figures there as JSON.
GENERATE_CHILD = """
import dataclasses, json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from ingest_kineto import layers_for_steps
from tracelake.sample_traces.generate import SCENARIOS, write_trace
paths, target_bytes, steps, layers, ranks, out = (json.loads(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]),
                                                   int(sys.argv[5]), int(sys.argv[6]), sys.argv[7])
scenario = dataclasses.replace(SCENARIOS["ddp_straggler"], ranks=ranks)
scenario = dataclasses.replace(scenario, layers=layers or layers_for_steps(scenario, target_bytes, steps))
written = [write_trace(path, scenario, rank, target_bytes=int(target_bytes)) for rank, path in enumerate(paths)]
# each rank stops when its own file is big enough: make sure every rank ran the same steps (same collectives)
fixed = []
if len({w["steps"] for w in written}) > 1:
    same = dataclasses.replace(scenario, steps=written[0]["steps"])
    for rank, path in enumerate(paths):
        if written[rank]["steps"] != same.steps:
            written[rank] = write_trace(path, same, rank)
            fixed.append(rank)
assert len({(w["steps"], w["nccl_kernels"]) for w in written}) == 1, [(w["steps"], w["nccl_kernels"]) for w in written]
json.dump({"written": written, "layers": scenario.layers, "rewritten_ranks": fixed}, open(out, "w"))
"""
INGEST_CHILD = """
import json, resource, sys, time
from tracelake.warehouse import Warehouse
paths, home, workers, out = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
wh = Warehouse(home=home)
base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
started = time.perf_counter()
report = wh.ingest(paths, job="bench", workers=workers)
seconds = time.perf_counter() - started
bad = [(r.status, r.error) for r in report.results if r.status != "ingested" or r.rows.get("device_ops", 0) <= 0]
if bad or len(report.results) != len(paths):
    sys.exit(f"tracelake ingest went wrong: {bad}")
events = wh.query("select sum(event_count) from traces").rows[0][0]
rows = {t: sum(r.rows.get(t, 0) for r in report.results) for t in ("host_ops", "device_ops", "collectives")}
json.dump({"seconds": [seconds], "events": int(events), "rows": rows, "base_rss_bytes": base_rss}, open(out, "w"))
"""
# argv: home, which ("job" | "rank0"), runs, profile file ("" = none), result.json
CRITICAL_CHILD = """
import json, resource, sys, time
from tracelake.warehouse import Warehouse, critical_inputs
from tracelake.analysis import critical_path
home, which, runs, profile, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
wh = Warehouse(home)
store = wh.store
pairs = [("bench", i) for i in store.job_traces("bench")]
traces = store.read_frame("traces", pairs)
if which == "rank0":
    rank0 = traces.filter(traces["rank"] == 0)["trace_id"].to_list()
    pairs = [p for p in pairs if p[1] in rank0]
    traces = traces.filter(traces["rank"] == 0)
assert pairs, "no traces"
base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
whole_args = [store, pairs, traces, store.read_frame("collectives", pairs)]
if profile:
    import cProfile, io, pstats
    prof = cProfile.Profile()
    prof.enable()
    paths = critical_path.analyse(critical_inputs.read(*whole_args))
    prof.disable()
    prof.dump_stats(profile)
    text = {}
    for key in ("tottime", "cumulative"):
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(25)
        text[key] = buf.getvalue()
    json.dump({"profile": text}, open(out, "w"))
    sys.exit(0)
read_s, analyse_s, whole_s = [], [], []
for _ in range(runs):
    started = time.perf_counter()
    inputs = critical_inputs.read(store, pairs, traces, store.read_frame("collectives", pairs))
    read_s.append(time.perf_counter() - started)
    started = time.perf_counter()
    paths = critical_path.analyse(inputs)
    analyse_s.append(time.perf_counter() - started)
    del inputs
    started = time.perf_counter()
    critical_inputs.analyse(*whole_args)
    whole_s.append(time.perf_counter() - started)
totals = critical_path.totals(paths.what_if)
json.dump({"read_seconds": read_s, "analyse_seconds": analyse_s, "whole_seconds": whole_s, "base_rss_bytes": base_rss,
           "ranks": traces.height, "steps": paths.steps.height, "path_rows": paths.path.height,
           "what_if_rows": paths.what_if.height, "scenarios": paths.what_if["scenario"].unique(maintain_order=True).to_list(),
           "dropped_edges": paths.dropped_edges,
           "max_abs_residual_pct": float(paths.steps["residual_pct"].abs().max() or 0),
           "totals": totals.to_dicts()}, open(out, "w"), default=str)
"""
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
json.dump({"seconds": seconds, "base_rss_bytes": base_rss, "findings": len(result.findings)}, open(out, "w"))
"""
# argv: trace_dir, max steps (0 = all), result.json
HTA_CHILD = """
import json, logging, resource, sys, time
from hta.trace_analysis import TraceAnalysis
trace_dir, limit, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
started = time.perf_counter()
a = TraceAnalysis(trace_dir=trace_dir)
load_seconds = time.perf_counter() - started
load_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
df = a.t.get_trace(0)
ids = [v for k, v in a.t.symbol_table.get_sym_id_map().items() if "ProfilerStep" in k]
annotations = df[df["name"].isin(ids)]  # what HTA's instance ids index (by position), in its order
instances = len(annotations)
# ProfilerStep#N is there twice: the CPU's user_annotation and the GPU's gpu_user_annotation (both stream -1);
# one critical path per step: the instances of the CPU annotation, the window HTA's docs mean
cats = a.t.symbol_table.get_sym_table()
steps = [i for i, c in enumerate(annotations["cat"].tolist()) if cats[c] == "user_annotation"]
logging.getLogger("hta").setLevel(logging.WARNING)
per_step, ok, path_edges = [], 0, []
for i in steps if not limit else steps[:limit]:
    started = time.perf_counter()
    result = a.critical_path_analysis(rank=0, annotation="ProfilerStep", instance_id=i)
    per_step.append(time.perf_counter() - started)
    if result and result[1]:
        ok += 1
        path_edges.append(len(result[0].critical_path_edges_set))
    del result
json.dump({"load_seconds": load_seconds, "load_rss_bytes": load_rss, "instances": instances,
           "steps": len(steps), "per_step_seconds": per_step,
           "succeeded": ok, "path_edges": path_edges, "rows": len(df)}, open(out, "w"))
"""


def measure(name: str, python: str, code: str, inputs: list[Any], workdir: Path, timeout: float) -> dict[str, Any]:
    """One child run: its figures plus ``peak_rss_bytes``; ``error`` set if it failed."""
    started = time.perf_counter()
    try:
        out, rss = run_child(python, code, list(inputs), workdir, timeout)
    except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
        print(f"{name} FAILED: {exc}", flush=True)
        return {"error": str(exc)}
    out["peak_rss_bytes"] = rss
    print(f"{name}: done in {time.perf_counter() - started:.1f} s (child wall), peak RSS {rss / MB:,.0f} MB", flush=True)
    return out


def ratio_words(numerator: float, denominator: float) -> str:
    return f"{numerator / denominator:.2f}x" if denominator else "n/a"


def report(res: dict[str, dict[str, Any]], hta_limited: bool) -> dict[str, Any]:
    """Print the table and the ratio lines; return the headline figures for ``--json``."""
    head: dict[str, Any] = {}
    rows: list[tuple[str, float | None, int | None, str]] = []

    def best(fig: dict[str, Any], key: str) -> float | None:
        return min(fig[key]) if fig.get(key) else None

    ing, job, rank0 = res.get("ingest", {}), res.get("job", {}), res.get("rank0", {})
    ana, hta = res.get("analyze", {}), res.get("HTA", {})
    if "seconds" in ing:
        head["ingest_s"] = best(ing, "seconds")
        rows.append(("ingest (all ranks)", head["ingest_s"], ing["peak_rss_bytes"], "Warehouse.ingest"))
    for key, fig in (("job", job), ("rank0", rank0)):
        if "read_seconds" in fig:
            r, a, w = best(fig, "read_seconds"), best(fig, "analyse_seconds"), best(fig, "whole_seconds")
            head[f"{key}_read_s"], head[f"{key}_analyse_s"], head[f"{key}_whole_s"] = r, a, w
            head[f"{key}_read_plus_analyse_s"] = r + a  # type: ignore[operator]
            who = "all ranks" if key == "job" else "rank 0"
            rows.append((f"{key}: read", r, None, f"critical_inputs.read, {who}"))
            rows.append((f"{key}: analyse", a, None, f"critical_path.analyse: graph, paths, {len(fig['scenarios'])} "
                         f"replays x {fig['steps']} steps"))
            rows.append((f"{key}: read + analyse", r + a, fig["peak_rss_bytes"], ""))  # type: ignore[operator]
            rows.append((f"{key}: critical_inputs.analyse", w, None, "as Warehouse.analyze calls it"))
    if "seconds" in ana:
        head["analyze_s"] = best(ana, "seconds")
        rows.append(("Warehouse.analyze(job)", head["analyze_s"], ana["peak_rss_bytes"], "whole analysis set"))
    if "load_seconds" in hta:
        steps = sum(hta["per_step_seconds"])
        head.update(hta_load_s=hta["load_seconds"], hta_steps_s=steps, hta_steps_done=len(hta["per_step_seconds"]),
                    hta_steps=hta["steps"])
        rows.append(("HTA: load", hta["load_seconds"], hta["load_rss_bytes"], "TraceAnalysis(trace_dir), rank 0"))
        rows.append((f"HTA: critical_path_analysis x {len(hta['per_step_seconds'])}", steps, hta["peak_rss_bytes"],
                     f"of {hta['steps']} steps, rank 0, path only"))
        if hta_limited and hta["per_step_seconds"]:
            head["hta_steps_s_extrapolated"] = steps / len(hta["per_step_seconds"]) * hta["steps"]
            rows.append(("HTA: every step (extrapolated)", head["hta_steps_s_extrapolated"], None,
                         "mean per step x steps"))
    print(f"\n{'timed':<40} {'best s':>9} {'peak RSS MB':>12}  what")
    for name, s, rss, what in rows:
        print(f"{name:<40} {s:>9.3f} {'' if rss is None else f'{rss / MB:,.0f}':>12}  {what}")
    for name, fig in res.items():
        if "error" in fig:
            last = [line for line in fig["error"].splitlines() if line.strip()][-1]
            print(f"{name:<40} did not run: {last}")
    print()
    if "ingest_s" in head and "job_read_plus_analyse_s" in head:
        head["job_over_ingest"] = head["job_read_plus_analyse_s"] / head["ingest_s"]
        head["job_whole_over_ingest"] = head["job_whole_s"] / head["ingest_s"]
        print(f"job critical path (read + analyse) / ingest = {head['job_over_ingest']:.2f} "
              f"(target < 0.5); critical_inputs.analyse whole / ingest = {head['job_whole_over_ingest']:.2f}")
    if "hta_steps_s" in head and "rank0_read_plus_analyse_s" in head:
        hta_all = head.get("hta_steps_s_extrapolated", head["hta_steps_s"])
        head["hta_over_rank0"] = hta_all / head["rank0_read_plus_analyse_s"]
        head["hta_with_load_over_rank0"] = (hta_all + head["hta_load_s"]) / head["rank0_read_plus_analyse_s"]
        print(f"rank 0: HTA's critical paths of every step{' (extrapolated)' if hta_limited else ''} / tracelake's "
              f"read + analyse (paths + what-ifs) = {head['hta_over_rank0']:.1f}x (target >= 10x); "
              f"counting HTA's load: {head['hta_with_load_over_rank0']:.1f}x")
        if "job_read_plus_analyse_s" in head:
            head["hta_rank0_over_job"] = hta_all / head["job_read_plus_analyse_s"]
            print(f"HTA on rank 0 alone / tracelake on the whole {job.get('ranks', '?')}-rank job = "
                  f"{head['hta_rank0_over_job']:.1f}x")
    if "steps" in job:
        print(f"\njob: {job['ranks']} ranks, {job['steps']} steps, {job['path_rows']:,} path stretches, "
              f"{job['what_if_rows']} what-if rows ({', '.join(job['scenarios'])}); {job['dropped_edges']} edges "
              f"dropped; largest |replay residual| {job['max_abs_residual_pct']:.3f}% of a step")
        for row in job["totals"]:
            print(f"  {row['scenario']:<26} saves {row['saving_pct'] or 0:6.2f}% of {row['steps']} steps")
    if "instances" in hta:
        print(f"HTA: {hta['steps']} steps (of {hta['instances']} ProfilerStep annotations, CPU and GPU), "
              f"{hta['succeeded']}/{len(hta['per_step_seconds'])} paths found, "
              f"{sum(hta['path_edges']):,} critical path edges in all")
    base = [f"{k} {v['base_rss_bytes'] / MB:,.0f} MB" for k, v in res.items() if "base_rss_bytes" in v]
    print(f"(RSS before the timed calls, i.e. interpreter + imports: {', '.join(base)})")
    return head


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8, help="ranks in the job (default 8)")
    parser.add_argument("--size-mb", type=float, default=100, help="uncompressed JSON per rank (default 100)")
    parser.add_argument("--steps", type=int, default=20, help="about how many training steps (default 20); "
                        "sets --layers")
    parser.add_argument("--layers", type=int, help="compute kernels per step, instead of --steps")
    parser.add_argument("--runs", type=int, default=1, help="timed calls per tracelake child; the fastest counts "
                        "(default 1). Ingest and HTA run once")
    parser.add_argument("--ingest-workers", type=int, default=1, help="Warehouse.ingest(workers=N) (default 1)")
    parser.add_argument("--hta-steps", type=int, default=0, help="give HTA only the first N step instances and "
                        "extrapolate to all (default 0: every instance)")
    parser.add_argument("--profile", action="store_true", help="also run the job's read + analyse under cProfile "
                        "(an extra child, not timed) and print the top entries")
    parser.add_argument("--workdir", type=Path, help="where the traces and the warehouse go (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the traces, warehouse, child logs and profile")
    parser.add_argument("--skip-hta", action="store_true", help="measure tracelake only")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per child run (default 3600)")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)

    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="tracelake-bench-cp-", dir=args.workdir))
    try:
        rank0_dir, home = workdir / "rank0", workdir / "warehouse"  # HTA takes a directory: rank 0's file only
        paths = [rank0_dir / "ddp_straggler-rank0.json",
                 *(workdir / "ranks" / f"ddp_straggler-rank{r}.json" for r in range(1, args.ranks))]
        started, source_id = time.perf_counter(), tracelake_source_id(*SOURCES)
        generated = workdir / "generated.json"
        subprocess.run([sys.executable, "-c", GENERATE_CHILD, str(Path(__file__).resolve().parent),
                        json.dumps([str(p) for p in paths]), str(args.size_mb * MB), str(args.steps),
                        str(args.layers or 0), str(args.ranks), str(generated)], check=True)
        made = json.loads(generated.read_text())
        written = made["written"]
        total = sum(w["bytes"] for w in written)
        rewritten = f", ranks {made['rewritten_ranks']} rewritten to match steps" if made["rewritten_ranks"] else ""
        print(f"job: {args.ranks} ranks x {written[0]['bytes'] / MB:,.1f} MB JSON ({total / MB:,.0f} MB), "
              f"{written[0]['events']:,} events and {written[0]['steps']} steps per rank, {made['layers']} layers"
              f"{rewritten}; "
              f"written in {time.perf_counter() - started:.1f} s; tracelake sources {source_id}", flush=True)
        res: dict[str, dict[str, Any]] = {}
        home.mkdir()
        for p in paths:
            warm_page_cache(p)
        res["ingest"] = measure("ingest", sys.executable, INGEST_CHILD,
                                [json.dumps([str(p) for p in paths]), home, args.ingest_workers], workdir, args.timeout)
        if "error" in res["ingest"]:
            raise SystemExit("tracelake ingest FAILED")
        for key in ("job", "rank0"):
            res[key] = measure(f"critical path, {key}", sys.executable, CRITICAL_CHILD,
                               [home, key, args.runs, ""], workdir, args.timeout)
        res["analyze"] = measure("Warehouse.analyze", sys.executable, ANALYZE_CHILD, [home, args.runs], workdir,
                                 args.timeout)
        if not args.skip_hta:
            try:
                python = hta_python()
            except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
                print(f"HTA FAILED, continuing with tracelake only: {exc}", flush=True)
                res["HTA"] = {"error": str(exc)}
            else:
                warm_page_cache(paths[0])
                res["HTA"] = measure("HTA", python, HTA_CHILD, [rank0_dir, args.hta_steps], workdir, args.timeout)
        head = report(res, bool(args.hta_steps))
        if args.profile:
            prof = measure("profile (job read + analyse, cProfile)", sys.executable, CRITICAL_CHILD,
                           [home, "job", 1, workdir / "critical_path.prof"], workdir, args.timeout)
            for key, text in prof.get("profile", {}).items():
                print(f"\ncProfile of the job's read + analyse, by {key}:")
                lines = text.splitlines()
                start = next((i for i, line in enumerate(lines) if "ncalls" in line), 0)
                print("\n".join(line for line in lines[max(0, start - 4):] if line.strip()))
            res["profile"] = prof
        source_end = tracelake_source_id(*SOURCES)
        if source_end != source_id:  # the tree is being edited: each child imported what was there when it started
            print(f"\nWARNING: the tracelake sources changed during the run ({source_id} -> {source_end}): "
                  f"the figures may mix versions; run it again", flush=True)
        if args.json:
            meta = {"ranks": args.ranks, "size_mb": args.size_mb, "layers": made["layers"], "runs": args.runs,
                    "ingest_workers": args.ingest_workers, "hta_steps": args.hta_steps, "generator": written,
                    "rewritten_ranks": made["rewritten_ranks"], "total_bytes": total,
                    "tracelake_sources": source_id, "tracelake_sources_at_end": source_end,
                    "python": sys.version, "cpus": os.cpu_count(),
                    "load_avg": os.getloadavg(), "hta_requirements": HTA_REQUIREMENTS}
            args.json.write_text(json.dumps({"meta": meta, "headline": head, "results": res},
                                            indent=2, default=str) + "\n")
    finally:
        if args.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
