"""Crash safety: ingests, deletes and recomputes killed with SIGKILL at random points.

Afterwards the warehouse opens, every registered trace is whole (its row counts match
a reference ingest of the same file, in its files and in the views), no file of an
unregistered trace shows in a query, ``check`` lists what the dead process left and
``--repair`` removes it, and running the ingest again completes the rest.

A process is killed in one of two ways: after a random delay (the parent sends
SIGKILL), or at the n-th rename or unlink it makes, just before or just after it (the
child SIGKILLs itself from a wrapper around ``os.replace`` / ``os.unlink``): a
publication is a few renames in a millisecond, too short a window for timing alone.
Children are forked from a forkserver that has tracelake imported, so a trial costs
the work killed, not an interpreter start. The trials are drawn from a fixed seed by
default; ``TRACELAKE_CRASH_SEED=<n>`` picks another and ``TRACELAKE_CRASH_SEED=random``
a new one each run (the seed is printed, and named in every failure). Where a timer kills
a child, the moment still depends on the machine's speed.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tracelake.contracts import schema
from tracelake.warehouse import Warehouse
from tracelake.warehouse.check import COUNTED

pytestmark = pytest.mark.slow  # crash trials: processes killed with SIGKILL, about a minute

ROOT = Path(__file__).resolve().parent.parent / "sample_traces"
#: Small traces of five formats: one Kineto rank, one XLA host, three NCCL dumps (about a second in all).
FILES = [
    ROOT / "kineto" / "ddp_straggler" / "rank-0.json.gz",
    ROOT / "xla" / "tpu_allreduce" / "host0.xplane.pb",
    ROOT / "nccl" / "flight_recorder" / "nccl_trace_rank_0.json",
    ROOT / "nccl" / "nccl_tests" / "all_reduce_perf.txt",
    ROOT / "nccl" / "profiler_plugin" / "nccl_profile_4242424242_0.json",
]
TRIALS = 60
DEFAULT_SEED = 20261204
JOBS = ("alpha", "beta")

Reference = dict[str, dict[str, int]]  # trace id -> rows per data table


# -- the killed child ---------------------------------------------------------------------------
def _die_at(nth: int, before: bool) -> None:
    """SIGKILL this process at its ``nth`` file rename or unlink, just ``before`` it or just after."""
    calls = 0

    def wrap(real: Callable[..., Any]) -> Callable[..., Any]:
        def hooked(*args: Any, **kwargs: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls == nth and before:
                os.kill(os.getpid(), signal.SIGKILL)
            result = real(*args, **kwargs)
            if calls == nth:
                os.kill(os.getpid(), signal.SIGKILL)
            return result
        return hooked

    for name in ("replace", "rename", "unlink"):
        setattr(os, name, wrap(getattr(os, name)))


def _child(home: str, action: str, job: str, targets: list[str], nth: int, before: bool) -> None:
    """What a trial runs (in a forked child): ingest ``targets`` (files), delete them (trace ids) or recompute."""
    if nth:
        _die_at(nth, before)
    warehouse = Warehouse(home)
    if action == "ingest":
        warehouse.ingest([Path(t) for t in targets], job=job)
    elif action == "delete":
        for trace_id in targets:
            warehouse.delete(trace_id)
    else:
        warehouse.recompute()


# -- invariants -----------------------------------------------------------------------------------
def _view_counts(con: Any) -> dict[tuple[str, str, str], int]:
    """``(table, trace_id, job) -> rows`` of every data table, through the views, in one query."""
    sql = " UNION ALL ".join(f"SELECT '{name}' AS t, trace_id, job, count(*) AS n FROM {name} GROUP BY ALL"
                             for name in schema.DATA_TABLES)
    return {(t, trace_id, job): n for t, trace_id, job, n in con.execute(sql).fetchall()}


def _expected_counts(registered: dict[str, str], reference: Reference) -> dict[tuple[str, str, str], int]:
    return {(name, trace_id, job): reference[trace_id][name]
            for trace_id, job in registered.items() for name in schema.DATA_TABLES if reference[trace_id][name]}


def _assert_consistent(home: Path, reference: Reference, context: str, *, in_memory: bool = True) -> dict[str, str]:
    """Check every invariant a crash must keep; returns the registered traces (``trace_id -> job``).

    The views are read through the catalog file (what the DuckDB shell reads) and, with
    ``in_memory``, through :meth:`Warehouse.connect` (what ``tracelake sql`` and the API read).
    """
    warehouse = Warehouse(home)  # opens: catalog current or rewritten
    report = warehouse.check(stale_after=0)
    assert report.problems == [], f"{context}: damaged registered traces: {report.problems}"
    assert {o.kind for o in report.orphans} <= {"partial", "staging", "temp"}, context
    rows = warehouse.traces()
    registered = {row["trace_id"]: row["job"] for row in rows}
    assert len(registered) == len(rows), f"{context}: a trace registered twice: {rows}"
    assert set(registered) <= set(reference), context
    for row in rows:  # the registration holds the reference counts
        for table, column in COUNTED.items():
            assert row[column] == reference[row["trace_id"]][table], (context, row["trace_id"], table)
    expected = _expected_counts(registered, reference)
    with duckdb.connect(str(warehouse.store.catalog_path), read_only=True) as catalog:
        # every registered trace whole in the views, nothing of any other
        assert _view_counts(catalog) == expected, f"{context}: the views show partial or missing rows"
        traces = catalog.execute("SELECT count(*), count(DISTINCT trace_id) FROM traces").fetchone()
    assert traces == (len(registered), len(registered)), context
    if in_memory:
        con = warehouse.connect()
        try:
            assert _view_counts(con) == expected, f"{context}: Warehouse.connect shows partial or missing rows"
        finally:
            con.close()
    return registered


#: File renames and unlinks, about: opening a new warehouse, ingesting one file, deleting or recomputing one trace.
OPS = {"open": 20, "ingest": 17, "delete": 16, "recompute": 9}


# -- fixtures ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Reference, float]:
    """Rows per table of each file's trace, from an uninterrupted ingest; and how long that ingest took."""
    warehouse = Warehouse(tmp_path_factory.mktemp("reference") / "warehouse")
    started = time.perf_counter()
    report = warehouse.ingest(FILES)
    seconds = time.perf_counter() - started
    assert report.ok, [r.error for r in report.failed]
    return {r.trace_id or "": dict(r.rows) for r in report.results}, seconds


@pytest.fixture(scope="module")
def forkserver() -> multiprocessing.context.BaseContext:
    """A context whose children fork from a server that has tracelake (and this module) imported."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["tracelake.warehouse.core", __name__])
    return ctx


@pytest.fixture(scope="module")
def seed() -> int:
    """The trials' seed: ``TRACELAKE_CRASH_SEED`` (a number, or ``random`` for a new one), else a fixed one."""
    chosen = os.environ.get("TRACELAKE_CRASH_SEED") or str(DEFAULT_SEED)
    value = random.SystemRandom().randrange(2**32) if chosen == "random" else int(chosen)
    print(f"\ncrash test seed: TRACELAKE_CRASH_SEED={value}")
    return value


# -- tests -------------------------------------------------------------------------------------------
def test_sigkill_at_random_points_never_leaves_a_partial_trace(
    tmp_path: Path, reference: tuple[Reference, float], forkserver: multiprocessing.context.BaseContext, seed: int,
) -> None:
    refs, ingest_seconds = reference
    rng = random.Random(seed)
    home = tmp_path / "warehouse"
    registered: dict[str, str] = {}
    tally = {"killed": 0, "finished": 0, "orphans repaired": 0, "ingests completed": 0}
    actions: dict[str, int] = {}
    started = time.perf_counter()
    for trial in range(TRIALS):
        # ingest until everything is registered, then kill deletes and recomputes so there is work again
        if len(registered) < len(refs):
            action, targets = "ingest", [str(f) for f in FILES]
        else:
            action = rng.choice(["delete", "delete", "recompute"])
            targets = rng.sample(sorted(registered), rng.randint(1, len(registered))) if action == "delete" else []
        job = rng.choice(JOBS)
        missing = len(refs) - len(registered)
        ops = {"ingest": OPS["ingest"] * missing + (OPS["open"] if trial == 0 else 0),
               "delete": OPS["delete"] * len(targets), "recompute": OPS["recompute"] * len(registered)}[action]
        by_timer = action != "delete" and rng.random() < 0.4  # a delete takes milliseconds
        nth = 0 if by_timer else rng.randint(1, ops)
        before = rng.random() < 0.5
        seconds = ingest_seconds * (missing / len(refs) if action == "ingest" else 1.0)
        context = f"seed {seed}, trial {trial}: {action} killed " + (
            "by timer" if by_timer else f"{'before' if before else 'after'} rename/unlink #{nth}")
        actions[action] = actions.get(action, 0) + 1

        process = forkserver.Process(target=_child, args=(str(home), action, job, targets, nth, before))
        process.start()
        if by_timer:
            process.join(rng.uniform(0.0, seconds))
            if process.exitcode is None:
                os.kill(process.pid or 0, signal.SIGKILL)
        process.join(120)
        assert process.exitcode is not None, f"{context}: the child hangs"
        assert process.exitcode in (0, -signal.SIGKILL), f"{context}: exit code {process.exitcode}"
        tally["killed" if process.exitcode == -signal.SIGKILL else "finished"] += 1

        registered = _assert_consistent(home, refs, context, in_memory=trial % 10 == 0)
        if rng.random() < 0.5:  # sometimes leave the leftovers to the next trials
            report = Warehouse(home).check(repair=True, stale_after=0)
            assert report.ok, f"{context}: repair left {report.remaining}"
            tally["orphans repaired"] += len(report.orphans)
        if action == "ingest" and rng.random() < 0.3:  # running the ingest again completes it
            again = Warehouse(home).ingest(FILES, job=job)
            assert again.ok, (context, [r.error for r in again.failed])
            registered = _assert_consistent(home, refs, context + " and ingested again", in_memory=False)
            assert set(registered) == set(refs), context
            tally["ingests completed"] += 1

    # finally: one more ingest completes every trace; repair leaves a clean warehouse
    final = Warehouse(home).ingest(FILES, job="alpha")
    assert final.ok, [r.error for r in final.failed]
    registered = _assert_consistent(home, refs, f"seed {seed}: final")
    assert set(registered) == set(refs)
    report = Warehouse(home).check(repair=True, stale_after=0)
    assert report.ok and Warehouse(home).check(stale_after=0).orphans == []
    elapsed = time.perf_counter() - started
    print(f"{TRIALS} trials in {elapsed:.1f}s {actions}: {tally}")
    assert tally["killed"] >= TRIALS // 2, f"seed {seed}: too few kills landed ({tally}): the trials test nothing"

    # the CLI and the stock DuckDB shell agree with the reference
    env = {**os.environ, "TRACELAKE_HOME": str(home)}
    out = subprocess.run([sys.executable, "-m", "tracelake.api.cli", "check"], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    total = sum(r["device_ops"] for r in refs.values())
    out = subprocess.run([sys.executable, "-m", "tracelake.api.cli", "sql", "-f", "csv",
                          "SELECT count(*) AS n FROM device_ops"], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["n", str(total)]
    shell = shutil.which("duckdb") or str(Path(sys.executable).parent / "duckdb")
    out = subprocess.run([shell, "-readonly", "-csv", "-noheader", str(home / "tracelake.duckdb"), "-c",
                          "SELECT count(*) FROM device_ops"], capture_output=True, text=True, timeout=120, cwd="/")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(total)


def test_killed_cli_ingest_then_check_repair_and_ingest_again(
    tmp_path: Path, reference: tuple[Reference, float], seed: int,
) -> None:
    """The real ``tracelake ingest`` process, killed at random moments; ``tracelake check --repair``; ingest again."""
    refs, ingest_seconds = reference
    rng = random.Random(seed + 1)
    home = tmp_path / "warehouse"
    env = {**os.environ, "TRACELAKE_HOME": str(home)}
    cli = [sys.executable, "-m", "tracelake.api.cli"]
    Warehouse(home)  # so that every run's time goes to ingesting
    for trial in range(3):
        process = subprocess.Popen([*cli, "ingest", "-q", *map(str, FILES)], env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.5, 0.8 + ingest_seconds))  # the interpreter starts in about half a second
        process.send_signal(signal.SIGKILL)
        process.wait(60)
        _assert_consistent(home, refs, f"seed {seed}: CLI trial {trial}")
    out = subprocess.run([*cli, "check", "--repair", "--stale-after", "0", "--json"], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    out = subprocess.run([*cli, "ingest", "-q", *map(str, FILES)], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert set(_assert_consistent(home, refs, f"seed {seed}: CLI final")) == set(refs)
    out = subprocess.run([*cli, "check", "--stale-after", "0"], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "healthy" in out.stdout, out.stdout + out.stderr


def test_check_reports_damaged_traces_and_repair_leaves_them(tmp_path: Path) -> None:
    """A registered trace with a missing file, a wrong count or a second registration is reported, never repaired."""
    warehouse = Warehouse(tmp_path / "warehouse")
    results = warehouse.ingest(FILES[2:5], job="alpha").results
    a, b, c = (r.trace_id or "" for r in results)
    store = warehouse.store
    store.path("breakdown", "alpha", a).unlink()
    rows = pq.read_table(store.path("collectives", "alpha", a))  # 13 rows, b's registration says 0
    pq.write_table(rows.set_column(0, "trace_id", pa.array([b] * rows.num_rows)), store.path("collectives", "alpha", b))
    for name in ("traces", *schema.DATA_TABLES):  # c registered under a second job too
        target = store.path(name, "beta", c)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(store.path(name, "alpha", c), target)
    report = warehouse.check(repair=True, stale_after=0)
    found = {(p.trace_id, p.table, p.kind) for p in report.problems}
    assert found == {(a, "breakdown", "missing"), (b, "collectives", "count"), (c, "traces", "duplicate")}
    assert not report.ok and report.orphans == []
    assert store.path("collectives", "alpha", b).exists()


def test_publish_of_a_trace_registered_meanwhile_moves_nothing(tmp_path: Path) -> None:
    """Two ingests of one file racing: the second publication finds the first's registration (under the lock)."""
    warehouse = Warehouse(tmp_path / "warehouse")
    store = warehouse.store
    trace_id = warehouse.ingest([FILES[2]], job="alpha").results[0].trace_id or ""
    staging = store.new_staging(trace_id)
    for name in ("traces", *schema.DATA_TABLES):
        shutil.copy(store.path(name, "alpha", trace_id), staging / f"{name}.parquet")
    assert store.publish(staging, "beta", trace_id) == "alpha"
    assert not (store.tables / "traces" / "job=beta").exists()
    assert sorted(staging.iterdir())  # nothing moved: the caller discards its staging
    store.discard(staging)
    assert warehouse.check(stale_after=0).ok
