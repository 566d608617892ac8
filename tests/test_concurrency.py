"""Concurrency: two ``tracelake ingest`` processes and a real server write overlapping sets of files into one
warehouse (under different jobs) while readers query it the three ways users do.

Checked: no trace lost, none registered twice (not even for a moment, not even under two jobs), every
trace's rows match a reference ingest, ``check`` finds nothing wrong, the catalog opens in the DuckDB
shell, and no reader fails. Reader latencies are printed (max and median per kind); the only timing
asserted is a hang guard.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tracelake import ingest
from tracelake.warehouse import Warehouse
from tracelake.warehouse.check import COUNTED

from support.server import running_server

pytestmark = pytest.mark.slow  # CLI processes and a real server writing at once

ROOT = Path(__file__).resolve().parent.parent / "sample_traces"
DDP = ROOT / "kineto" / "ddp_straggler"
NCCL = ROOT / "nccl"
TOKEN = "concurrency-token"
HANG = 60.0  # seconds: a reader slower than this is stuck, not slow

#: Overlapping sets: every file but two is wanted by at least two writers, under different jobs.
CLI_ALPHA = [DDP / f"rank-{r}.json.gz" for r in range(4)] + [
    NCCL / "flight_recorder" / "nccl_trace_rank_0.json", NCCL / "flight_recorder" / "nccl_trace_rank_1.json"]
CLI_BETA = [DDP / "rank-3.json.gz", DDP / "rank-2.json.gz", NCCL / "flight_recorder" / "nccl_trace_rank_1.json",
            NCCL / "nccl_tests" / "all_reduce_perf.txt", NCCL / "inspector" / "node-a-pid4100.log"]
UPLOADS = [DDP / "rank-0.json.gz", ROOT / "xla" / "tpu_allreduce" / "host0.xplane.pb",
           NCCL / "inspector" / "node-a-pid4100.log", NCCL / "profiler_plugin" / "nccl_profile_4242424242_0.json",
           DDP / "rank-1.json.gz"]


class Reader(threading.Thread):
    """Runs ``probe`` in a loop until stopped, recording each call's latency and any failure."""

    def __init__(self, name: str, probe: Callable[[], int], stop: threading.Event) -> None:
        super().__init__(name=name, daemon=True)
        self.probe = probe
        self.stop = stop
        self.latencies: list[float] = []
        self.errors: list[str] = []
        self.seen: list[int] = []

    def run(self) -> None:
        while not self.stop.is_set():
            started = time.perf_counter()
            try:
                self.seen.append(self.probe())
            except Exception as exc:  # recorded, asserted on in the test
                self.errors.append(f"{type(exc).__name__}: {exc}")
            self.latencies.append(time.perf_counter() - started)
            time.sleep(0.05)


def _traces_probe(home: Path) -> Callable[[], int]:
    def probe() -> int:
        rows = Warehouse(home).query("SELECT count(*), count(DISTINCT trace_id) FROM traces").rows
        total, distinct = rows[0]
        assert total == distinct, f"a trace registered twice: {total} rows, {distinct} ids"
        Warehouse(home).query("SELECT job, count(*) FROM device_ops GROUP BY job")
        return int(total)
    return probe


def _shell_probe(home: Path) -> Callable[[], int]:
    shell = shutil.which("duckdb") or str(Path(sys.executable).parent / "duckdb")

    def probe() -> int:
        out = subprocess.run([shell, "-readonly", "-csv", "-noheader", str(home / "tracelake.duckdb"), "-c",
                              "SELECT count(*), count(DISTINCT trace_id) FROM traces"],
                             capture_output=True, text=True, timeout=HANG, cwd="/")
        assert out.returncode == 0, out.stderr
        total, distinct = out.stdout.strip().split(",")
        assert total == distinct, out.stdout
        return int(total)
    return probe


def _api_probe(url: str) -> Callable[[], int]:
    def probe() -> int:
        answer = httpx.post(f"{url}/api/v1/sql", json={"sql": "SELECT count(*) FROM traces"},
                            headers={"Authorization": f"Bearer {TOKEN}"}, timeout=HANG)
        assert answer.status_code == 200, answer.text
        return int(answer.json()["rows"][0][0])
    return probe


def _upload(url: str, path: Path) -> str:
    with path.open("rb") as f:
        answer = httpx.post(f"{url}/api/v1/traces", data={"job": "gamma"}, files={"file": (path.name, f)},
                            headers={"Authorization": f"Bearer {TOKEN}"}, timeout=HANG)
    assert answer.status_code == 202, answer.text
    return str(answer.json()["traces"][0]["trace_id"])


def test_concurrent_ingests_and_server_with_readers(tmp_path: Path) -> None:
    files = sorted({*CLI_ALPHA, *CLI_BETA, *UPLOADS})
    reference = Warehouse(tmp_path / "reference").ingest(files)
    assert reference.ok, [r.error for r in reference.failed]
    expected = {r.trace_id: r.rows for r in reference.results}
    assert set(expected) == {ingest.content_id(f) for f in files}

    home = tmp_path / "warehouse"
    Warehouse(home)
    env = {**os.environ, "TRACELAKE_HOME": str(home), "TRACELAKE_TOKENS": f"{TOKEN}:read,write"}
    stop = threading.Event()
    with running_server([], env, tmp_path / "server.log") as url:
        readers = [Reader("Warehouse.query", _traces_probe(home), stop),
                   Reader("duckdb -readonly", _shell_probe(home), stop),
                   Reader("POST /api/v1/sql", _api_probe(url), stop)]
        for reader in readers:
            reader.start()
        started = time.perf_counter()
        cli = [sys.executable, "-m", "tracelake.api.cli", "ingest", "-q"]
        writers = [subprocess.Popen([*cli, "--job", job, *map(str, paths)], env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
                   for job, paths in (("alpha", CLI_ALPHA), ("beta", CLI_BETA))]
        with ThreadPoolExecutor(max_workers=len(UPLOADS)) as pool:
            uploaded = list(pool.map(lambda p: _upload(url, p), UPLOADS))
        outputs = [w.communicate(timeout=300)[0] for w in writers]
        pending, deadline = set(uploaded), time.monotonic() + 300
        while pending and time.monotonic() < deadline:
            for trace_id in sorted(pending):
                status = httpx.get(f"{url}/api/v1/traces/{trace_id}",
                                   headers={"Authorization": f"Bearer {TOKEN}"}).json()["status"]
                assert status != "failed", trace_id
                if status == "done":
                    pending.discard(trace_id)
            time.sleep(0.2)
        writing = time.perf_counter() - started
        time.sleep(0.3)  # let every reader see the end state at least once
        stop.set()
        for reader in readers:
            reader.join(HANG)
    assert not pending, f"uploads not ingested in time: {pending}"
    for writer, output in zip(writers, outputs):
        assert writer.returncode == 0, output

    # no lost trace, no duplicate, every row there
    warehouse = Warehouse(home)
    rows = warehouse.traces()
    assert len(rows) == len(expected), [(r["trace_id"], r["job"]) for r in rows]
    assert {r["trace_id"] for r in rows} == set(expected)
    for row in rows:
        for table, column in COUNTED.items():
            assert row[column] == expected[row["trace_id"]][table], (row["trace_id"], table)
    report = warehouse.check()
    assert report.ok and not report.orphans, report.as_dict()
    assert not warehouse.check(stale_after=0).orphans
    assert _shell_probe(home)() == len(expected)

    print(f"\nwrites: 2 CLI ingests + {len(UPLOADS)} uploads, {len(expected)} distinct traces in {writing:.1f}s")
    for reader in readers:
        assert not reader.errors, f"{reader.name}: {reader.errors[:3]}"
        assert reader.latencies and not reader.is_alive(), f"{reader.name} is stuck"
        assert reader.seen == sorted(reader.seen), f"{reader.name}: the trace count went down: {reader.seen}"
        print(f"{reader.name}: {len(reader.latencies)} queries, max {max(reader.latencies) * 1000:.0f} ms, "
              f"median {statistics.median(reader.latencies) * 1000:.0f} ms")
        assert max(reader.latencies) < HANG
    assert readers[0].seen[-1] == len(expected)
