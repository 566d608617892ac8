"""Benchmark: ingest of many rank traces, single process vs a Dask LocalCluster.

Run it from the repository root with the dev virtualenv (Dask installed: ``pip install -e '.[dask]'``)::

    python benchmarks/dask_ingest.py                         # 200 traces, LocalCluster(2 workers)
    python benchmarks/dask_ingest.py --runs 3 --json figures.json    # fastest of 3 alternating runs
    python benchmarks/dask_ingest.py --files 50 --workers 4

What it measures, all in one run:

1. The project's generator writes ``--files`` rank traces (``.json.gz``): jobs of 8
   ranks of the ``ddp_straggler`` scenario (``--steps``, ``--layers``), each job with
   its own seed, so every file is a distinct trace.
2. A ``LocalCluster(n_workers=--workers, threads_per_worker=1, processes=True)`` is
   started once (its start-up is timed apart and reported).
3. **single process**: ``Warehouse(<fresh dir>).ingest(files, job="bench")``, timed
   around that call (the cluster idles meanwhile).
4. **Dask**: ``Warehouse(<another fresh dir>).ingest(files, job="bench", client=client)``,
   timed the same way. Both warehouses must hold every trace with the same row
   counts per table, or the benchmark fails. With ``--runs N``, steps 3 and 4
   alternate N times and the fastest run of each path is reported (every run is in
   the JSON).
5. **Scheduling overhead per task**: ``--noop`` empty tasks are submitted to the same
   cluster and collected with ``as_completed``, as the ingest does; wall time divided
   by the task count. The script also prints the worker-seconds per file not spent
   computing the ingest task (``(wall x workers - sum of the tasks' compute time) /
   files``, compute times from Dask's task stream), which adds to that the time
   workers wait for the client to hand out work, idle workers at the end, and data
   transfer.

Figures: files/s for each path and the speed-up (single-process seconds / Dask
seconds). The speed-up is bounded by the cores: the single process already keeps
more than one core busy (DuckDB and polars threads; the script prints how many),
so on a 2-core machine 2 workers can add little; the machines these run on are shared and noisy, so compare
ratios, not absolute times. There are no timing assertions.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tracelake.sample_traces.generate import SCENARIOS, write_trace
from tracelake.warehouse import Warehouse

RANKS_PER_JOB = 8


def generate(out: Path, files: int, steps: int, layers: int) -> list[Path]:
    """``files`` rank traces under ``out``: jobs of 8 ranks, a seed per job."""
    paths = []
    base = SCENARIOS["ddp_straggler"]
    for i in range(files):
        job, rank = divmod(i, RANKS_PER_JOB)
        scenario = dataclasses.replace(base, name=f"fleet{job:03d}", ranks=RANKS_PER_JOB, steps=steps,
                                       layers=layers, straggler_rank=job % RANKS_PER_JOB, seed=base.seed + job)
        path = out / f"job-{job:03d}" / f"rank-{rank}.json.gz"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_trace(path, scenario, rank)
        paths.append(path)
    return paths


def row_counts(home: Path) -> dict[str, int]:
    """Rows per table, for checking that both paths wrote the same warehouse."""
    wh = Warehouse(home)
    names = [r[0] for r in wh.query("SELECT table_name FROM information_schema.tables ORDER BY 1").rows]
    return {name: wh.query(f'SELECT count(*) FROM "{name}"').rows[0][0] for name in names}


def cpu_seconds() -> float:
    """CPU time of this process so far, every thread (DuckDB's and polars' too)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def timed_ingest(home: Path, files: list[Path], client: Any = None) -> tuple[float, list[float], float]:
    """Seconds for one ingest call, each file's own seconds, and this process's CPU seconds meanwhile.

    Fails unless every file ingested.
    """
    wh = Warehouse(home)
    started, cpu = time.perf_counter(), cpu_seconds()
    report = wh.ingest(files, job="bench", client=client)
    seconds, cpu = time.perf_counter() - started, cpu_seconds() - cpu
    bad = [r for r in report.results if r.status != "ingested"]
    if bad:
        sys.exit(f"ingest went wrong: {len(bad)} files, e.g. {bad[0].path}: {bad[0].status} {bad[0].error}")
    return seconds, [r.seconds for r in report.results], cpu


def noop(i: int) -> int:
    """An empty task."""
    return i


def scheduling_overhead(client: Any, tasks: int) -> float:
    """Seconds per empty task, submitted and collected like the ingest's tasks."""
    from distributed import as_completed

    client.submit(noop, -1, pure=False).result()  # warm the path once
    started = time.perf_counter()
    futures = [client.submit(noop, i, key=f"noop-{i}", pure=False) for i in range(tasks)]
    for future in as_completed(futures):
        future.result()
    return (time.perf_counter() - started) / tasks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=200, help="rank traces to generate (default 200)")
    parser.add_argument("--workers", type=int, default=2, help="LocalCluster worker processes (default 2)")
    parser.add_argument("--steps", type=int, default=6, help="profiler steps per trace (default 6)")
    parser.add_argument("--layers", type=int, default=16, help="compute kernels per step (default 16)")
    parser.add_argument("--noop", type=int, default=1000, help="empty tasks for the overhead figure (default 1000)")
    parser.add_argument("--runs", type=int, default=1,
                        help="runs of each path, alternating; the fastest of each is reported (default 1)")
    parser.add_argument("--workdir", type=Path, help="where traces and warehouses go (default: a temporary dir)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--json", type=Path, help="also write every figure as JSON to this file")
    args = parser.parse_args(argv)
    try:
        import distributed
    except ImportError:
        sys.exit("this benchmark needs Dask: pip install -e '.[dask]'")

    work = args.workdir or Path(tempfile.mkdtemp(prefix="tracelake-dask-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        started = time.perf_counter()
        files = generate(work / "traces", args.files, args.steps, args.layers)
        mb = sum(p.stat().st_size for p in files) / 1e6
        print(f"{len(files)} rank traces ({mb:.1f} MB gzipped) generated in {time.perf_counter() - started:.1f}s "
              f"in {work / 'traces'}", flush=True)

        started = time.perf_counter()
        with distributed.LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                                      dashboard_address=None, silence_logs=logging.ERROR) as cluster, \
                distributed.Client(cluster) as client:
            cluster_start_s = time.perf_counter() - started
            runs: list[dict[str, Any]] = []
            for run in range(args.runs):  # alternate the two paths, so that both see the same noise
                single_s, single_tasks, single_cpu = timed_ingest(work / f"single-{run}", files)
                with distributed.get_task_stream(client=client) as stream:
                    dask_s, dask_tasks, _ = timed_ingest(work / f"dask-{run}", files, client)
                compute_s = [sum(s["stop"] - s["start"] for s in task["startstops"] if s["action"] == "compute")
                             for task in stream.data if str(task["key"]).startswith("tracelake-ingest")]
                single_counts, dask_counts = row_counts(work / f"single-{run}"), row_counts(work / f"dask-{run}")
                if single_counts != dask_counts:
                    sys.exit(f"the two warehouses differ: {single_counts} vs {dask_counts}")
                runs.append({"single_seconds": single_s, "dask_seconds": dask_s, "single_tasks": single_tasks,
                             "single_cores": single_cpu / single_s,
                             "dask_tasks": dask_tasks, "compute_s": compute_s})
                print(f"run {run + 1}: single process {single_s:.2f}s, Dask LocalCluster({args.workers} workers) "
                      f"{dask_s:.2f}s (cluster started once, in {cluster_start_s:.1f}s)", flush=True)
            overhead_s = scheduling_overhead(client, args.noop)
        single = min(runs, key=lambda r: r["single_seconds"])
        fastest = min(runs, key=lambda r: r["dask_seconds"])
        single_s, single_tasks = single["single_seconds"], single["single_tasks"]
        dask_s, dask_tasks, compute_s = fastest["dask_seconds"], fastest["dask_tasks"], fastest["compute_s"]

        n = len(files)
        idle_per_task = (dask_s * args.workers - sum(compute_s)) / n
        figures = {
            "files": n, "gzipped_mb": round(mb, 2), "workers": args.workers,
            "single_seconds": round(single_s, 3), "single_files_per_s": round(n / single_s, 2),
            "dask_seconds": round(dask_s, 3), "dask_files_per_s": round(n / dask_s, 2),
            "speedup": round(single_s / dask_s, 2),
            "dask_with_cluster_start_seconds": round(dask_s + cluster_start_s, 3),
            "cluster_start_seconds": round(cluster_start_s, 3),
            "scheduling_overhead_ms_per_task": round(overhead_s * 1e3, 3),
            "worker_ms_per_file_outside_tasks": round(idle_per_task * 1e3, 1),
            "mean_task_ms_single": round(sum(single_tasks) / n * 1e3, 1),
            "single_process_cores_busy": round(single["single_cores"], 2),
            "mean_task_ms_dask": round(sum(compute_s) / max(1, len(compute_s)) * 1e3, 1),
            "mean_file_ms_dask_with_publish": round(sum(dask_tasks) / n * 1e3, 1),
            "runs": [{"single_seconds": round(r["single_seconds"], 3), "dask_seconds": round(r["dask_seconds"], 3)}
                     for r in runs],
            "rows": dask_counts,
        }
        print()
        print(f"| path | seconds | files/s |\n|---|---|---|\n"
              f"| single process | {single_s:.2f} | {n / single_s:.1f} |\n"
              f"| Dask LocalCluster({args.workers} workers) | {dask_s:.2f} | {n / dask_s:.1f} |")
        if args.runs > 1:
            print(f"\nfastest of {args.runs} runs each; every run: " + ", ".join(
                f"{r['single_seconds']:.1f}s vs {r['dask_seconds']:.1f}s" for r in runs))
        print(f"\nthe single process kept {single['single_cores']:.2f} cores busy on average "
              f"(DuckDB and polars threads); this machine has {os.cpu_count()}")
        print(f"speed-up {single_s / dask_s:.2f}x; cluster start {cluster_start_s:.1f}s "
              f"(with it: {n / (dask_s + cluster_start_s):.1f} files/s)")
        print(f"scheduling overhead: {overhead_s * 1e3:.2f} ms per empty task ({args.noop} tasks); "
              f"{idle_per_task * 1e3:.0f} worker-ms per file outside the ingest task "
              f"(mean task {figures['mean_task_ms_dask']:.0f} ms on a Dask worker, "
              f"{figures['mean_task_ms_single']:.0f} ms per file single-process)")
        if args.json:
            args.json.write_text(json.dumps(figures, indent=2) + "\n")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
