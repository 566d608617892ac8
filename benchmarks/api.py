"""Benchmark: the REST API, upload + ingest throughput and job-analysis latency, against the library.

Run it from the repository root with the dev virtualenv::

    python benchmarks/api.py                      # 1,000 traces, 64 uploaded by 8 clients
    python benchmarks/api.py --traces 200 --upload-files 32 --json out.json

What it measures, in one run:

1. The project's generator writes ``--traces`` small Kineto traces (4 ranks per job,
   2 steps, 8 layers; each job has its own seed, so every file is distinct).
2. Throughput. The anchor: the library ingests the first ``--upload-files`` files
   in one ``Warehouse.ingest(files, workers=2)`` call (what ``tracelake ingest --workers 2``
   does). Then a real ``tracelake serve --ingest-workers 2`` on 127.0.0.1 receives the
   same files from ``--clients`` concurrent httpx clients, one file per
   ``POST /api/v1/traces?wait=600`` (the answer comes when the ingest is done), into
   a fresh warehouse. Figures: files/s and MB/s (of gzip files as uploaded) of both,
   and their ratio. ``--file-mb N`` uploads separate traces of about N MB of JSON each.
3. Latency. The rest of the traces are ingested into the server's warehouse (the
   library, job by job), so it holds ``--traces`` traces. Then
   ``GET /api/v1/jobs/{job}`` for ``--requests`` different jobs, one at a time
   (cold: the first answer for each job is computed), then the same jobs again (warm:
   answered from the server's cache), and ``GET /api/v1/jobs`` and
   ``GET /api/v1/traces?limit=100``. The anchor: ``Warehouse.analyze(job=...)``
   in this process for the same jobs. Figures: p50 / p99 in ms.

Compare ratios, not absolute times (the machines are shared and noisy); nothing is asserted.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "sample_traces"))

from generate import SCENARIOS, write_trace  # noqa: E402

from tracelake.warehouse import Warehouse  # noqa: E402

RANKS = 4


def generate(folder: Path, traces: int, file_mb: float = 0, seed: int = 1000) -> list[tuple[str, Path]]:
    """``traces`` distinct traces, as (job, path), 4 ranks per job: small ones, or about ``file_mb`` MB of JSON each."""
    base = SCENARIOS["ddp_straggler"]
    out = []
    for index in range(traces):
        job_no, rank = divmod(index, RANKS)
        scenario = dataclasses.replace(base, steps=2, layers=8, seed=seed + job_no)
        path = folder / f"job-{job_no:04d}" / f"rank-{rank}.json.gz"
        target = int(file_mb * 1e6) if file_mb else None
        write_trace(path, scenario, rank, target_bytes=target, compresslevel=6)
        out.append((f"job-{job_no:04d}", path))
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(home: Path, workers: int) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACELAKE_")}
    process = subprocess.Popen(
        [sys.executable, "-m", "tracelake.api.cli", "serve", "--home", str(home), "--port", str(port),
         "--ingest-workers", str(workers)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return process, url
        except httpx.TransportError:
            time.sleep(0.2)
    process.kill()
    raise SystemExit("the server did not start")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def timed_gets(url: str, paths: list[str]) -> list[float]:
    out = []
    with httpx.Client(base_url=url, timeout=60) as client:
        for path in paths:
            started = time.perf_counter()
            answer = client.get(path)
            out.append((time.perf_counter() - started) * 1000)
            if answer.status_code != 200:
                raise SystemExit(f"GET {path}: {answer.status_code} {answer.text[:200]}")
    return out


def summary(values: list[float]) -> dict[str, float]:
    return {"p50_ms": round(percentile(values, 50), 2), "p99_ms": round(percentile(values, 99), 2),
            "mean_ms": round(statistics.fmean(values), 2), "n": len(values)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--traces", type=int, default=1000, help="traces in the warehouse (default 1000)")
    parser.add_argument("--upload-files", type=int, default=64, help="files uploaded through the API (default 64)")
    parser.add_argument("--file-mb", type=float, default=0,
                        help="size of each uploaded trace in MB of JSON (default: the small traces)")
    parser.add_argument("--clients", type=int, default=8, help="concurrent upload clients (default 8)")
    parser.add_argument("--requests", type=int, default=200, help="jobs whose analysis is requested (default 200)")
    parser.add_argument("--workdir", type=Path, help="where traces and warehouses go (default: a temporary folder)")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON")
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="tracelake-bench-api-"))
    work.mkdir(parents=True, exist_ok=True)
    figures: dict[str, object] = {"traces": args.traces, "clients": args.clients}
    try:
        print(f"generating {args.traces} traces in {work} ...", flush=True)
        traces = generate(work / "traces", args.traces)
        upload = generate(work / "uploads", args.upload_files, args.file_mb, seed=9000) if args.file_mb else \
            traces[: args.upload_files]
        upload_bytes = sum(p.stat().st_size for _, p in upload)

        # -- throughput: library anchor, then the API -----------------------------------
        anchor = Warehouse(work / "anchor")
        started = time.perf_counter()
        report = anchor.ingest([p for _, p in upload], job="anchor", workers=2)
        library_s = time.perf_counter() - started
        if not report.ok:
            raise SystemExit(f"library ingest failed: {[r.error for r in report.failed]}")

        process, url = start_server(work / "server", workers=2)
        try:
            def send(item: tuple[str, Path]) -> str:
                job, path = item
                with httpx.Client(base_url=url, timeout=900) as client, path.open("rb") as f:
                    answer = client.post("/api/v1/traces", params={"wait": 600}, data={"job": job},
                                         files={"file": (path.name, f)})
                status = answer.json()["traces"][0]["status"] if answer.status_code == 202 else answer.text
                return str(status)

            started = time.perf_counter()
            with ThreadPoolExecutor(max_workers=args.clients) as pool:
                statuses = list(pool.map(send, upload))
            api_s = time.perf_counter() - started
            if set(statuses) != {"done"}:
                raise SystemExit(f"uploads did not all ingest: {sorted(set(statuses))}")
            mb = upload_bytes / 1e6
            figures["throughput"] = {
                "files": len(upload), "mb": round(mb, 2),
                "library_files_per_s": round(len(upload) / library_s, 2),
                "api_files_per_s": round(len(upload) / api_s, 2),
                "library_mb_per_s": round(mb / library_s, 2), "api_mb_per_s": round(mb / api_s, 2),
                "api_vs_library": round(library_s / api_s, 2),
            }
            print(json.dumps(figures["throughput"]), flush=True)

            # -- latency on a warehouse of --traces traces -------------------------------
            server_wh = Warehouse(work / "server")
            rest = traces if args.file_mb else traces[args.upload_files:]
            print(f"ingesting {len(rest)} more traces ...", flush=True)
            for job in sorted({j for j, _ in rest}):
                report = server_wh.ingest([p for j, p in rest if j == job], job=job)
                if not report.ok:
                    raise SystemExit(f"ingest failed: {[r.error for r in report.failed]}")
            jobs = sorted({j for j, _ in traces})
            chosen = random.Random(1).sample(jobs, min(args.requests, len(jobs)))
            paths = [f"/api/v1/jobs/{j}" for j in chosen]
            cold = timed_gets(url, paths)
            warm = timed_gets(url, paths)
            library = []
            for job in chosen:
                started = time.perf_counter()
                server_wh.analyze(job=job)
                library.append((time.perf_counter() - started) * 1000)
            figures["job_analysis"] = {
                "warehouse_traces": server_wh.count_traces(), "cold": summary(cold), "warm": summary(warm),
                "library_analyze": summary(library),
                "cold_p99_vs_library_p99": round(percentile(cold, 99) / percentile(library, 99), 2),
            }
            figures["list_jobs"] = summary(timed_gets(url, ["/api/v1/jobs"] * 20))
            figures["list_traces"] = summary(timed_gets(url, ["/api/v1/traces?limit=100"] * 20))
            print(json.dumps({k: figures[k] for k in ("job_analysis", "list_jobs", "list_traces")}, indent=1))
        finally:
            process.terminate()
            process.wait(30)
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
