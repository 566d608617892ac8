"""Attacks beside normal traffic: a real ``tracelake serve``, first quiet, then under attack, in one run.

Run it from the repository root with the dev virtualenv::

    python benchmarks/load_attacks.py                    # 20 s quiet, then 20 s under attack
    python benchmarks/load_attacks.py --seconds 60 --json attacks.json

A server over a fresh warehouse (the 4-rank DDP sample as job ``sample``) takes normal
traffic for ``--seconds`` (the baseline), then the same traffic while a read-only token
and an anonymous client attack it for ``--seconds`` more (issue 18):

* memory: ``len(range(1e8))``, ``list(i) FROM range(1e8)``, a huge ``count(DISTINCT ...)``;
* a flood of slow queries (45 at once from one token), and huge answers (1.5 GB of rows);
* writes through functions that run serialized SQL (``destroy_external_resource``);
* made-up HTTP methods, and ``--idle`` idle connections held open (default 2,000).

Normal traffic: a ``/healthz`` probe every 50 ms, ``GET /api/v1/jobs/sample`` and a normal
``POST /api/v1/sql`` from another token. Reported per phase: p50 / p99 / max of each, their
errors, the attacks' answers by status, and the peak RSS of the server process and of its
SQL workers (from /proc). Nothing is asserted; the exit code is 1 when normal traffic saw errors.
"""

from __future__ import annotations

import argparse
import json
import random
import secrets
import shutil
import socket
import string
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from load import SAMPLE, SAMPLE_JOB, _percentile, _Recorder, _timed, run_for, serve  # noqa: E402

NORMAL_SQL = "SELECT rank, category, count(*) AS ops, sum(dur_ns) AS ns FROM device_ops GROUP BY ALL ORDER BY ALL"
NORMAL = ("GET /healthz", "GET /api/v1/jobs/{job}", "POST /api/v1/sql")


def _attacks(home: Path) -> list[str]:
    inner = f"WITH x AS (COPY (SELECT 1) TO '{home}/tables/traces/job=forged/x.parquet') SELECT 1"
    payload = duckdb.execute("SELECT json_serialize_sql(?)", [inner]).fetchone()[0].replace("'", "''")  # type: ignore[index]
    return [
        "SELECT len(range(100000000))",
        "SELECT list(i) FROM range(100000000) t(i)",
        "SELECT count(DISTINCT i::VARCHAR || 'x') FROM range(50000000) t(i)",
        "SELECT repeat('x', 10000) FROM range(150000)",
        "SELECT count(*) FROM range(1000000) a, range(1000000) b WHERE a.range + b.range = -1",
        f"SELECT * FROM destroy_external_resource('json_execute_serialized_sql', '{payload}')",
    ]


def _rss(server: psutil.Process) -> tuple[int, int]:
    """RSS of the server process, and of it with its SQL workers, bytes."""
    try:
        own = server.memory_info().rss
        sql = sum(c.memory_info().rss for c in server.children(recursive=True)
                  if "sql_worker" in " ".join(c.cmdline()))
    except psutil.Error:
        return 0, 0
    return own, own + sql


def run(seconds: float, idle: int, workdir: Path) -> dict[str, Any]:
    """Both phases against one server; the figures."""
    user, attacker = secrets.token_hex(16), secrets.token_hex(16)
    home = workdir / "warehouse"
    extra = {"TRACELAKE_TOKENS": f"{user}:read,write;{attacker}:read"}
    with serve(home, user, 1, workdir / "server.log", extra_env=extra) as (url, server):
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {user}"}, timeout=120) as client:
            files = [("file", (p.name, p.read_bytes())) for p in sorted(SAMPLE.glob("*.json.gz"))]
            answer = client.post("/api/v1/traces", params={"wait": 300}, data={"job": SAMPLE_JOB}, files=files)
            assert answer.status_code == 202, answer.text
            client.get(f"/api/v1/jobs/{SAMPLE_JOB}")
            client.post("/api/v1/sql", json={"sql": NORMAL_SQL})
        quiet = _phase(url, server, user, attacker, home, seconds, attack=False, idle=0)
        attacked = _phase(url, server, user, attacker, home, seconds, attack=True, idle=idle)
    return {"seconds": seconds, "idle_connections": idle, "quiet": quiet, "attacked": attacked}


def _phase(url: str, server: psutil.Process, user: str, attacker: str, home: Path, seconds: float, *,
           attack: bool, idle: int) -> dict[str, Any]:
    recorder, stop = _Recorder(), threading.Event()
    outcomes: Counter[str] = Counter()
    peaks = [0, 0]
    auth = {"Authorization": f"Bearer {user}"}
    attacks = _attacks(home)

    def loop(call: Callable[[httpx.Client], None], pause: float = 0.0, headers: dict[str, str] | None = None) -> None:
        with httpx.Client(base_url=url, headers=headers or {}, timeout=120) as c:
            while not stop.is_set():
                call(c)
                stop.wait(pause)

    def sample() -> None:
        while not stop.is_set():
            own, total = _rss(server)
            peaks[0], peaks[1] = max(peaks[0], own), max(peaks[1], total)
            stop.wait(0.05)

    def attack_sql(c: httpx.Client) -> None:
        query = random.choice(attacks)
        try:
            outcomes[f"sql {c.post('/api/v1/sql', json={'sql': query}).status_code}"] += 1
        except httpx.HTTPError as exc:
            outcomes[type(exc).__name__] += 1

    def made_up_method(c: httpx.Client) -> None:
        method = "".join(random.choices(string.ascii_uppercase, k=8))
        try:
            outcomes[f"method {c.request(method, '/x' + secrets.token_hex(4)).status_code}"] += 1
        except httpx.HTTPError as exc:
            outcomes[type(exc).__name__] += 1

    threads = [
        threading.Thread(target=sample),
        threading.Thread(target=loop, args=(lambda c: _timed(recorder, NORMAL[0], lambda: c.get("/healthz"), 200),
                                            0.05)),
        threading.Thread(target=loop, args=(lambda c: _timed(recorder, NORMAL[1], lambda: c.get(
            f"/api/v1/jobs/{SAMPLE_JOB}"), 200), 0.1, auth)),
        threading.Thread(target=loop, args=(lambda c: _timed(recorder, NORMAL[2], lambda: c.post(
            "/api/v1/sql", json={"sql": NORMAL_SQL}), 200), 0.1, auth)),
    ]
    sockets: list[socket.socket] = []
    if attack:
        bad = {"Authorization": f"Bearer {attacker}"}
        threads += [threading.Thread(target=loop, args=(attack_sql, 0.0, bad)) for _ in range(45)]
        threads += [threading.Thread(target=loop, args=(made_up_method, 0.0)) for _ in range(2)]
        host, port = url.removeprefix("http://").split(":")
        for _ in range(idle):
            try:
                sockets.append(socket.create_connection((host, int(port)), timeout=5))
            except OSError:
                outcomes["idle connection refused"] += 1
    run_for(threads, stop, seconds)
    for s in sockets:
        s.close()
    figures: dict[str, Any] = {}
    for name in NORMAL:
        values = recorder.latencies.get(name, [])
        figures[name] = {"requests": len(values), "errors": len(recorder.errors.get(name, [])),
                         "p50_ms": round(_percentile(values, 50), 1), "p99_ms": round(_percentile(values, 99), 1),
                         "max_ms": round(max(values, default=0.0), 1), "first_errors": recorder.errors.get(name, [])[:3]}
    figures["attacks"] = dict(sorted(outcomes.items()))
    figures["server_rss_peak_mb"] = round(peaks[0] / 1e6)
    figures["server_and_sql_workers_rss_peak_mb"] = round(peaks[1] / 1e6)
    return figures


def table(report: dict[str, Any]) -> str:
    """Both phases side by side, as Markdown."""
    lines = ["| | quiet: requests | p50 / p99 / max ms | errors | under attack: requests | p50 / p99 / max ms "
             "| errors |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name in NORMAL:
        q, a = report["quiet"][name], report["attacked"][name]
        lines.append(f"| {name} | {q['requests']:,} | {q['p50_ms']} / {q['p99_ms']} / {q['max_ms']} | {q['errors']} | "
                     f"{a['requests']:,} | {a['p50_ms']} / {a['p99_ms']} / {a['max_ms']} | {a['errors']} |")
    for key, label in (("server_rss_peak_mb", "server RSS peak, MB"),
                       ("server_and_sql_workers_rss_peak_mb", "server + SQL workers RSS peak, MB")):
        lines.append(f"| {label} | | {report['quiet'][key]} | | | {report['attacked'][key]} | |")
    lines += ["", f"{report['seconds']:g} s per phase; {report['idle_connections']:,} idle connections held during "
              "the attack; attack answers: " + ", ".join(f"{k}: {v:,}" for k, v in report["attacked"]["attacks"].items())]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=20, help="length of each phase (default 20)")
    parser.add_argument("--idle", type=int, default=2000, help="idle connections held during the attack")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tracelake-attacks-"))
    try:
        report = run(args.seconds, args.idle, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(table(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 1 if any(report[p][n]["errors"] for p in ("quiet", "attacked") for n in NORMAL) else 0


if __name__ == "__main__":
    sys.exit(main())
