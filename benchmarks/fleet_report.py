"""Benchmark: building the fleet report as the warehouse grows to 10,000 traces.

Run it from the repository root with the dev virtualenv::

    python benchmarks/fleet_report.py                      # 100, 1,000, 3,000, 10,000 traces (~30 min to ingest)
    python benchmarks/fleet_report.py --sizes 100,1000 --workdir /tmp/fleet-bench --json out.json

What happens: the project's generator writes small 4-rank DDP jobs (``ddp_straggler``
with 2 steps of 2 layers, a different seed per job, a straggler in every third job; about
6 KB per rank file), and every file is ingested through the normal path
(``Warehouse.ingest_file``, two worker processes) into one warehouse of the largest size,
labelled with one of 5 teams and 3 clusters (``--workdir`` keeps it: a later run only
ingests what is missing). For each size N, a warehouse holding the first N traces is
made of hard links to that one's files (every table: what an ingest of those N traces
leaves), and a fresh child process times, best of ``--runs`` where repeated:

* ``cold``: ``Warehouse(home).fleet()`` in a process that has read nothing yet and with
  no cache snapshot on disk (it reads every ``traces``, ``breakdown`` and ``collectives``
  file once, and summarises each job's collectives: the first request after an upgrade);
* ``fresh``: the same from a new ``Warehouse`` once the snapshots under ``cache/`` exist
  (registry, breakdown rows, per-job collective summaries): what ``tracelake report
  fleet`` (a new process) pays from then on;
* ``warm``: ``fleet()`` again on the same ``Warehouse``, as in a running server;
* ``render``: ``tracelake.api.reports.fleet_report(fleet, ...)``, the HTML page;
* the anchors (the view scan once, it is slow): the raw read of the same traces' ``breakdown`` files with polars
  (``pl.scan_parquet(files).collect()`` of the fleet's columns, nothing else), and the
  whole-trace rows through the DuckDB catalog view (``SELECT ... FROM breakdown WHERE
  step IS NULL``), which reads the footer of every file of the table and is what the
  fleet code avoids.

Nothing is asserted; compare the columns (the machine is shared and noisy).
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

from tracelake.sample_traces.generate import SCENARIOS, write_scenario
from tracelake.warehouse import Warehouse
from tracelake.warehouse.executor import IngestTask, ProcessExecutor

RANKS = 4
TEAMS = ("infra", "llm", "vision", "speech", "ranking")
CLUSTERS = ("a", "b", "c")

#: The timed child: argv = home, runs, result.json.
CHILD = r"""
import json, shutil, sys, time
from pathlib import Path
import polars as pl
from tracelake.warehouse import Warehouse
from tracelake.api.reports import fleet_report

home, runs, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
shutil.rmtree(Path(home) / "cache", ignore_errors=True)
figures = {}

def best(fn, runs):
    times, value = [], None
    for _ in range(runs):
        started = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - started)
    return min(times), value

started = time.perf_counter()
wh = Warehouse(home)
fleet = wh.fleet()
figures["cold_s"] = time.perf_counter() - started
figures["fresh_s"], _ = best(lambda: Warehouse(home).fleet(), runs)
figures["warm_s"], fleet = best(lambda: wh.fleet(), runs)
figures["render_s"], page = best(lambda: fleet_report(fleet, lambda job: f"jobs/{job}.html"), runs)
figures["page_mb"] = len(page.encode()) / 1e6
traces = wh.registry.frame()
figures["traces"] = traces.height
figures["device_timelines"] = int(fleet.totals["devices"][0])
columns = ["trace_id", "rank", "step", "span_ns", "busy_ns", "idle_ns", "compute_ns", "communication_ns",
           "exposed_communication_ns", "flops", "flops_utilisation_pct"]

def raw_read():
    files = [str(wh.store.path("breakdown", j, t)) for j, t in zip(traces["job"], traces["trace_id"])]
    return pl.scan_parquet(files).select(columns).collect().height

figures["raw_breakdown_read_s"], figures["breakdown_rows"] = best(raw_read, runs)

def view_scan():
    con = wh.connect()
    try:
        con.execute("SET enable_progress_bar = false")
        return con.sql("SELECT " + ", ".join(columns) + " FROM breakdown WHERE step IS NULL").pl().height
    finally:
        con.close()

figures["duckdb_view_scan_s"], _ = best(view_scan, 1)  # slow: once
json.dump(figures, open(out, "w"))
"""


def _scenario(index: int) -> Any:
    return dataclasses.replace(
        SCENARIOS["ddp_straggler"], name=f"fleet-{index:05d}", ranks=RANKS, steps=2, layers=2, seed=1000 + index,
        straggler_rank=index % RANKS if index % 3 == 0 else None,
    )


def grow(home: Path, traces: int, sources: Path, workers: int) -> float:
    """Ingest generated jobs until the warehouse holds ``traces`` traces; returns the seconds it took."""
    wh = Warehouse(home)
    have = wh.count_traces()
    if have >= traces:
        return 0.0
    first_job = have // RANKS
    jobs = range(first_job, (traces + RANKS - 1) // RANKS)
    work = []
    for index in jobs:
        folder = sources / f"job-{index:05d}"
        paths = write_scenario(folder, _scenario(index))
        labels = {"team": TEAMS[index % len(TEAMS)], "cluster": CLUSTERS[index % len(CLUSTERS)]}
        work += [(path, f"job-{index:05d}", labels) for path in paths]
    started = time.perf_counter()
    pool = ProcessExecutor(dataclasses.replace(wh.settings, threads=1), workers)
    try:
        futures = [pool.submit(IngestTask(path, job, labels)) for path, job, labels in work]
        for done, future in enumerate(futures, start=1):
            result = future.result()
            if not result.ok:
                raise SystemExit(f"ingest failed: {result.error}")
            if done % 500 == 0:
                print(f"  ingested {have + done:,} traces ({time.perf_counter() - started:.0f} s)", flush=True)
    finally:
        pool.shutdown(wait=True)
    return time.perf_counter() - started


def subset(home: Path, traces: int, target: Path) -> Path:
    """A warehouse at ``target`` holding the first ``traces`` traces of ``home`` (by job name): hard links."""
    if target.exists():
        shutil.rmtree(target)
    jobs = sorted(p.name for p in (home / "tables" / "traces").iterdir() if p.name != "job=_schema")
    keep = set(jobs[: (traces + RANKS - 1) // RANKS])
    for table in (home / "tables").iterdir():
        for folder in table.iterdir():
            if folder.name == "job=_schema" or folder.name in keep:
                (target / "tables" / table.name / folder.name).mkdir(parents=True)
                for file in folder.iterdir():
                    os.link(file, target / "tables" / table.name / folder.name / file.name)
    Warehouse(target)  # writes its catalog (views over its own folders): not part of what is timed
    return target


def measure(home: Path, runs: int) -> dict[str, Any]:
    """The timings of one fresh child process over the warehouse as it is."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "figures.json"
        subprocess.run([sys.executable, "-c", CHILD, str(home), str(runs), str(out)], check=True)
        figures: dict[str, Any] = json.loads(out.read_text())
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100,1000,3000,10000", help="trace counts to measure at (ascending)")
    parser.add_argument("--runs", type=int, default=3, help="repeats of each timed call; the fastest counts")
    parser.add_argument("--workers", type=int, default=2, help="ingest processes")
    parser.add_argument("--workdir", type=Path, help="keep the warehouse (and the generated traces) here")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON")
    args = parser.parse_args(argv)
    sizes = sorted(int(s) for s in args.sizes.split(","))
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tracelake-fleet-bench-"))
    home, sources = workdir / "warehouse", workdir / "traces"
    print(f"growing the warehouse to {sizes[-1]:,} traces...", flush=True)
    seconds = grow(home, sizes[-1], sources, args.workers)
    print(f"  {seconds:.0f} s of ingest", flush=True)
    rows = []
    for size in sizes:
        figures = measure(subset(home, size, workdir / "measured"), args.runs)
        rows.append(figures)
        print(json.dumps(figures), flush=True)
    shutil.rmtree(workdir / "measured", ignore_errors=True)
    print()
    print("| traces | fleet() cold, s | fleet() fresh process, s | fleet() warm, s | render, s "
          "| fresh + render, s | raw breakdown read, s | DuckDB view scan, s |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['traces']:,} | {r['cold_s']:.2f} | {r['fresh_s']:.2f} | {r['warm_s']:.2f} | {r['render_s']:.2f} "
              f"| {r['fresh_s'] + r['render_s']:.2f} | {r['raw_breakdown_read_s']:.2f} "
              f"| {r['duckdb_view_scan_s']:.2f} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    print(f"\nwarehouse: {home}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
