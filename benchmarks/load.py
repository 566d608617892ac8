"""Load test: a real ``tracelake serve`` on loopback under concurrent uploads and queries for a fixed time.

Run it from the repository root with the dev virtualenv::

    python benchmarks/load.py                          # 30 s, 2 uploading + 6 querying clients
    python benchmarks/load.py --seconds 120 --uploaders 4 --readers 12 --json load.json

What happens:

1. ``tracelake serve --ingest-workers N`` starts on a free 127.0.0.1 port over a fresh
   warehouse in a temporary folder, with an API token (every request carries it).
   One job (the 4-rank DDP sample) is uploaded first so the queries have data.
2. For ``--seconds``, ``--uploaders`` threads each upload one trace after another
   (``POST /api/v1/traces?wait=120``: the answer comes when the ingest is done, as a CI
   job would use it); every upload is a distinct file (a sample rank with a unique
   top-level key, gzipped), so its ingest really runs. ``--readers`` threads meanwhile
   cycle through ``GET /api/v1/traces?limit=50``, ``GET /api/v1/jobs/{job}`` (the
   sample job and the jobs the uploads fill) and ``POST /api/v1/sql`` (an aggregate
   over ``device_ops``).
3. The server process's RSS (and its ingest workers') is sampled every half second.
4. At the end every uploaded trace id is looked up: each must be ``done``.

Reported: per endpoint the requests, requests/s, p50 / p99 / max latency in ms and
errors (any answer but the expected status, or a transport error); the total; the
server's RSS at the start, middle and end of the run; and how many uploads were
registered. Nothing is asserted here (``tests/test_load.py`` runs the same code for a
few seconds and asserts zero errors and every upload registered); the exit code is 1
when there were errors or unregistered uploads.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "sample_traces" / "kineto" / "ddp_straggler"
SAMPLE_JOB = "sample"
SQL = "SELECT job, rank, category, count(*) AS ops, sum(dur_ns) AS ns FROM device_ops GROUP BY ALL ORDER BY ALL"


@dataclass
class EndpointFigures:
    """What one endpoint saw over the run."""

    requests: int = 0
    errors: int = 0
    per_second: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    max_ms: float = 0.0
    first_errors: list[str] = field(default_factory=list)


@dataclass
class LoadReport:
    """The figures of one load run."""

    seconds: float
    uploaders: int
    readers: int
    ingest_workers: int
    endpoints: dict[str, EndpointFigures]
    total_requests: int
    total_per_second: float
    errors: int
    server_rss_mb: dict[str, float]  # start, middle, end, max
    workers_rss_mb: dict[str, float]
    uploads: int
    registered: int

    def table(self) -> str:
        """The report as a Markdown table plus summary lines."""
        lines = ["| endpoint | requests | req/s | p50 ms | p99 ms | max ms | errors |", "|---|---:|---:|---:|---:|---:|---:|"]
        for name, f in self.endpoints.items():
            lines.append(f"| {name} | {f.requests:,} | {f.per_second:.1f} | {f.p50_ms:.1f} | {f.p99_ms:.1f} | "
                         f"{f.max_ms:.1f} | {f.errors} |")
        lines.append(f"| **all** | {self.total_requests:,} | {self.total_per_second:.1f} | | | | {self.errors} |")
        rss, workers = self.server_rss_mb, self.workers_rss_mb
        lines += [
            "",
            f"{self.seconds:g} s, {self.uploaders} uploading + {self.readers} querying clients, "
            f"{self.ingest_workers} ingest worker(s); uploads registered: {self.registered} of {self.uploads}",
            f"server RSS MB: start {rss['start']:.0f}, middle {rss['middle']:.0f}, end {rss['end']:.0f} "
            f"(max {rss['max']:.0f}); ingest workers: start {workers['start']:.0f}, middle {workers['middle']:.0f}, "
            f"end {workers['end']:.0f} (max {workers['max']:.0f})",
        ]
        for name, f in self.endpoints.items():
            for error in f.first_errors:
                lines.append(f"error {name}: {error}")
        return "\n".join(lines)


class _Recorder:
    """Latencies and errors per endpoint, from many threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.latencies: dict[str, list[float]] = {}
        self.errors: dict[str, list[str]] = {}

    def record(self, endpoint: str, seconds: float, error: str | None) -> None:
        with self._lock:
            self.latencies.setdefault(endpoint, []).append(seconds * 1000)
            if error is not None:
                self.errors.setdefault(endpoint, []).append(error)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))] if ordered else 0.0


def distinct_trace(template: bytes, n: int) -> bytes:
    """The sample trace ``template`` (JSON) made unique by a top-level key, gzipped: a new trace id each time."""
    return gzip.compress(b'{"tracelakeLoadUpload": %d, ' % n + template.lstrip()[1:], compresslevel=1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serve(home: Path, token: str, ingest_workers: int, log: Path,
          extra_env: dict[str, str] | None = None) -> Iterator[tuple[str, psutil.Process]]:
    """Run ``tracelake serve`` on a free loopback port until ``/healthz`` answers; yield its URL and process."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACELAKE_")}
    env.update(TRACELAKE_HOME=str(home), TRACELAKE_TOKENS=f"{token}:read,write")
    env.update(extra_env or {})
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "tracelake.api.cli", "serve", "--port", str(port),
             "--ingest-workers", str(ingest_workers)], env=env, stdout=out, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the server did not start: {log.read_text()[-2000:]}")
                time.sleep(0.2)
            yield url, psutil.Process(process.pid)
        finally:
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _rss_mb(process: psutil.Process) -> tuple[float, float]:
    """RSS of the server process and of its children (the ingest workers), MB."""
    try:
        own = process.memory_info().rss
        children = sum(c.memory_info().rss for c in process.children(recursive=True))
    except psutil.Error:
        return 0.0, 0.0
    return own / 1e6, children / 1e6


def _timed(recorder: _Recorder, endpoint: str, call: Callable[[], httpx.Response], expected: int) -> httpx.Response | None:
    started = time.perf_counter()
    try:
        answer = call()
    except httpx.HTTPError as exc:
        recorder.record(endpoint, time.perf_counter() - started, f"{type(exc).__name__}: {exc}")
        return None
    error = None if answer.status_code == expected else f"{answer.status_code} {answer.text[:300]}"
    recorder.record(endpoint, time.perf_counter() - started, error)
    return answer


def run_for(threads: list[threading.Thread], stop: threading.Event, seconds: float) -> float:
    """Start ``threads``, let them run ``seconds``, set ``stop`` and wait for them; the seconds it took."""
    started = time.monotonic()
    for t in threads:
        t.start()
    stop.wait(seconds)
    stop.set()
    for t in threads:
        t.join()
    return time.monotonic() - started


def run_load(url: str, server: psutil.Process, token: str, *, seconds: float, uploaders: int, readers: int,
             ingest_workers: int = 1) -> LoadReport:
    """Upload and query ``url`` from ``uploaders + readers`` threads for ``seconds``; the figures."""
    headers = {"Authorization": f"Bearer {token}"}
    templates = [gzip.decompress((SAMPLE / f"rank-{r}.json.gz").read_bytes()) for r in range(4)]
    with httpx.Client(base_url=url, headers=headers, timeout=300) as client:
        files = [("file", (p.name, p.read_bytes())) for p in sorted(SAMPLE.glob("*.json.gz"))]
        answer = client.post("/api/v1/traces", params={"wait": 300}, data={"job": SAMPLE_JOB}, files=files)
        if answer.status_code != 202 or {t["status"] for t in answer.json()["traces"]} != {"done"}:
            raise RuntimeError(f"the sample job did not ingest: {answer.status_code} {answer.text[:500]}")
        for path in ("/api/v1/traces?limit=50", f"/api/v1/jobs/{SAMPLE_JOB}"):  # warm up: the first answers are computed
            client.get(path)
        client.post("/api/v1/sql", json={"sql": SQL})

    recorder = _Recorder()
    counter = itertools.count()
    uploaded: list[str] = []
    upload_jobs: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()

    def upload_loop() -> None:
        with httpx.Client(base_url=url, headers=headers, timeout=300) as c:
            while not stop.is_set():
                n = next(counter)
                job = f"load-{n // 4:05d}"
                body = distinct_trace(templates[n % 4], n)
                answer = _timed(recorder, "POST /api/v1/traces", lambda: c.post(
                    "/api/v1/traces", params={"wait": 120}, data={"job": job},
                    files=[("file", (f"rank-{n % 4}.json.gz", body))]), 202)
                if answer is not None and answer.status_code == 202:
                    with lock:
                        uploaded.extend(t["trace_id"] for t in answer.json()["traces"])
                        upload_jobs.append(job)

    def read_loop(offset: int) -> None:
        with httpx.Client(base_url=url, headers=headers, timeout=300) as c:
            for i in itertools.count(offset):
                if stop.is_set():
                    return
                kind = i % 3
                if kind == 0:
                    _timed(recorder, "GET /api/v1/traces", lambda: c.get("/api/v1/traces", params={"limit": 50}), 200)
                elif kind == 1:
                    with lock:
                        jobs = upload_jobs[-20:] or [SAMPLE_JOB]
                    job = jobs[i % len(jobs)] if i % 2 else SAMPLE_JOB
                    _timed(recorder, "GET /api/v1/jobs/{job}", lambda: c.get(f"/api/v1/jobs/{job}"), 200)
                else:
                    _timed(recorder, "POST /api/v1/sql", lambda: c.post("/api/v1/sql", json={"sql": SQL}), 200)

    samples: list[tuple[float, float, float]] = []

    def sample_memory() -> None:
        while not stop.is_set():
            samples.append((time.monotonic(), *_rss_mb(server)))
            stop.wait(0.5)

    threads = [threading.Thread(target=sample_memory, name="rss")]
    threads += [threading.Thread(target=upload_loop, name=f"upload-{i}") for i in range(uploaders)]
    threads += [threading.Thread(target=read_loop, args=(i,), name=f"read-{i}") for i in range(readers)]
    elapsed = run_for(threads, stop, seconds)
    samples.append((time.monotonic(), *_rss_mb(server)))

    with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
        registered = sum(client.get(f"/api/v1/traces/{trace_id}").json().get("status") == "done"
                         for trace_id in uploaded)

    endpoints: dict[str, EndpointFigures] = {}
    for name in ("POST /api/v1/traces", "GET /api/v1/traces", "GET /api/v1/jobs/{job}", "POST /api/v1/sql"):
        values = recorder.latencies.get(name, [])
        errors = recorder.errors.get(name, [])
        endpoints[name] = EndpointFigures(
            requests=len(values), errors=len(errors), per_second=round(len(values) / elapsed, 2),
            p50_ms=round(_percentile(values, 50), 1), p99_ms=round(_percentile(values, 99), 1),
            max_ms=round(max(values, default=0.0), 1), first_errors=errors[:3])
    total = sum(f.requests for f in endpoints.values())

    def rss(column: int) -> dict[str, float]:
        values = [s[column] for s in samples]
        return {"start": round(values[0], 1), "middle": round(values[len(values) // 2], 1),
                "end": round(values[-1], 1), "max": round(max(values), 1)}

    return LoadReport(
        seconds=round(elapsed, 1), uploaders=uploaders, readers=readers, ingest_workers=ingest_workers,
        endpoints=endpoints, total_requests=total, total_per_second=round(total / elapsed, 2),
        errors=sum(f.errors for f in endpoints.values()), server_rss_mb=rss(1), workers_rss_mb=rss(2),
        uploads=len(uploaded), registered=registered,
    )


def load_test(*, seconds: float, uploaders: int, readers: int, ingest_workers: int,
              workdir: Path | None = None) -> LoadReport:
    """Start a server over a fresh warehouse in ``workdir`` (default: a temporary folder), load it, stop it."""
    work = workdir or Path(tempfile.mkdtemp(prefix="tracelake-load-"))
    work.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(16)
    try:
        with serve(work / "warehouse", token, ingest_workers, work / "server.log") as (url, process):
            return run_load(url, process, token, seconds=seconds, uploaders=uploaders, readers=readers,
                            ingest_workers=ingest_workers)
    finally:
        if workdir is None:
            shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=30, help="how long the load runs (default 30)")
    parser.add_argument("--uploaders", type=int, default=2, help="clients uploading traces (default 2)")
    parser.add_argument("--readers", type=int, default=6, help="clients querying (default 6)")
    parser.add_argument("--ingest-workers", type=int, default=1, help="the server's ingest workers (default 1)")
    parser.add_argument("--workdir", type=Path, help="where the warehouse and the server log go (default: a "
                                                      "temporary folder, removed afterwards)")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON")
    args = parser.parse_args()
    report = load_test(seconds=args.seconds, uploaders=args.uploaders, readers=args.readers,
                       ingest_workers=args.ingest_workers, workdir=args.workdir)
    print(report.table())
    if args.json:
        args.json.write_text(json.dumps(asdict(report), indent=2) + "\n")
    return 1 if report.errors or report.registered != report.uploads else 0


if __name__ == "__main__":
    sys.exit(main())
