"""Ingest and recompute on a real Dask LocalCluster (2 worker processes), checked against the local path.

One cluster serves the whole module (starting one costs seconds). The reference is
a local ingest of the same files; a Dask ingest must give the same files, the same
rows in every table and the same analyses, also when a worker is killed mid-task.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from polars.testing import assert_frame_equal
from typer.testing import CliRunner

from support import FLEET_JOBS, SAMPLES
from tracelake.api.cli import app
from tracelake.contracts import schema
from tracelake.warehouse import InvalidArgument, Warehouse
from tracelake.warehouse import distributed as dist
from tracelake.warehouse.distributed import ClusterTarget, resolve_target, warehouse_path
from tracelake.warehouse.job_tables import PER_RUN

pytestmark = pytest.mark.slow  # a Dask LocalCluster of worker processes

distributed = pytest.importorskip("distributed")
cloudpickle = pytest.importorskip("cloudpickle")

#: Columns of ``traces`` that differ between any two ingests of the same file.
VOLATILE = {"traces": ["ingested_at", "parse_seconds"]}


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    """A LocalCluster of 2 worker processes, one thread each, shared by this module's tests."""
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  silence_logs=logging.ERROR) as cluster:
        with distributed.Client(cluster) as c:
            yield c


def _ingest_all(wh: Warehouse, client: Any = None) -> list[tuple[str, str | None, str | None]]:
    """Every fleet sample job into ``wh``; (file name, status, error) per input."""
    out = []
    for job, folder, labels in FLEET_JOBS:
        report = wh.ingest([folder], job=job, labels=labels, client=client)
        out += [(r.path.name, r.status, r.error) for r in report.results]
    return out


@pytest.fixture(scope="module")
def local_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference: the fleet samples ingested in this process."""
    home = tmp_path_factory.mktemp("local") / "warehouse"
    statuses = _ingest_all(Warehouse(home))
    assert {s for _, s, _ in statuses} == {"ingested"}, statuses
    return home


@pytest.fixture(scope="module")
def dask_home(tmp_path_factory: pytest.TempPathFactory, client: Any) -> Path:
    """The same samples ingested on the cluster."""
    home = tmp_path_factory.mktemp("dask") / "warehouse"
    statuses = _ingest_all(Warehouse(home), client)
    assert {s for _, s, _ in statuses} == {"ingested"}, statuses
    return home


def _registered(home: Path) -> list[str]:
    """The trace ids with a ``traces`` file (a registration), one per file."""
    return [p.stem for p in (home / "tables" / "traces").glob("job=*/*.parquet") if p.parent.name != "job=_schema"]


def _files(home: Path) -> list[str]:
    return sorted(str(p.relative_to(home / "tables")) for p in (home / "tables").rglob("*") if p.is_file())


def _tables(home: Path) -> dict[str, pl.DataFrame]:
    """Every table's rows (less the volatile columns), in a total order on every column."""
    con = Warehouse(home).connect()
    try:
        out = {}
        for name in schema.TABLES:
            columns = [c for c in con.sql(f"SELECT * FROM {name} LIMIT 0").columns if c not in VOLATILE.get(name, [])]
            out[name] = con.sql(f"SELECT {', '.join(columns)} FROM {name} ORDER BY ALL").pl()
        return out
    finally:
        con.close()


def assert_same_warehouse(a: Path, b: Path) -> None:
    """Same table files, same rows in every table, same analyses of every job; nothing left in staging."""
    assert _files(a) == _files(b)
    tables_a, tables_b = _tables(a), _tables(b)
    for name in schema.TABLES:
        if name not in PER_RUN:  # written when a job is analysed, not at ingest: compared as analyses below
            assert_frame_equal(tables_a[name], tables_b[name], check_exact=True)
    for home in (a, b):
        assert not any((home / "staging").iterdir()), list((home / "staging").iterdir())
    wa, wb = Warehouse(a), Warehouse(b)
    for job, _, _ in FLEET_JOBS:
        left, right = wa.analyze(job=job), wb.analyze(job=job)
        assert [f.as_dict() for f in left.findings] == [f.as_dict() for f in right.findings]
        for field in left.as_dict():
            if field != "findings":
                assert_frame_equal(getattr(left, field), getattr(right, field), check_exact=True)


def test_dask_ingest_equals_local_ingest(local_home: Path, dask_home: Path) -> None:
    assert len(Warehouse(dask_home).traces()) == len(Warehouse(local_home).traces()) > 5
    assert_same_warehouse(local_home, dask_home)


def test_failures_are_reported_per_file_like_the_local_path(
    tmp_path: Path, client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = tmp_path / "in" / "broken.json"
    bad.parent.mkdir()
    bad.write_text('{"traceEvents": [ {"ph": "X", ')
    monkeypatch.chdir(tmp_path)  # relative names are reported as given, as by a local ingest
    inputs = [Path("in/broken.json"), Path("in/missing.json.gz"), SAMPLES / "launch_bound"]
    local = Warehouse(tmp_path / "a").ingest(inputs, job="j")
    remote = Warehouse(tmp_path / "b").ingest(inputs, job="j", client=client)
    assert [(r.path, r.status, r.error) for r in remote.results] == \
        [(r.path, r.status, r.error) for r in local.results]
    assert [r.status for r in remote.results] == ["failed", "failed", "ingested"]
    assert (remote.results[0].error or "").startswith("broken.json: ")
    assert remote.results[1].error == "in/missing.json.gz: no such file"


def test_duplicates_are_published_once(tmp_path: Path, client: Any) -> None:
    copies = tmp_path / "copies"
    copies.mkdir()
    for name in ("a.json.gz", "b.json.gz"):  # same bytes, two names: one trace
        shutil.copy(SAMPLES / "launch_bound" / "rank-0.json.gz", copies / name)
    wh = Warehouse(tmp_path / "wh")
    first = wh.ingest([copies], job="j", client=client)
    assert sorted(r.status for r in first.results) == ["duplicate", "ingested"]
    again = wh.ingest([copies, SAMPLES / "launch_bound"], job="other", client=client)
    assert {r.status for r in again.results} == {"duplicate"} and {r.job for r in again.results} == {"j"}
    assert len(_registered(tmp_path / "wh")) == 1
    assert not any((tmp_path / "wh" / "staging").iterdir())


def test_progress_is_fed_by_task_completions(tmp_path: Path, client: Any) -> None:
    seen: list[tuple[str, Any]] = []

    class Recorder:
        def start(self, files: list[tuple[Path, int]]) -> None:
            seen.append(("start", len(files)))

        def file_started(self, path: Path) -> None:
            seen.append(("started", path.name))

        def advance(self, nbytes: int) -> None:
            seen.append(("bytes", nbytes))

        def file_done(self, result: Any) -> None:
            seen.append(("done", (result.path.name, result.status)))

    Warehouse(tmp_path / "wh").ingest([SAMPLES / "ddp_straggler"], job="j", progress=Recorder(), client=client)
    assert seen[0] == ("start", 4)
    assert sorted(v for k, v in seen if k == "done") == [(f"rank-{i}.json.gz", "ingested") for i in range(4)]
    assert sum(v for k, v in seen if k == "bytes") == sum(p.stat().st_size for p in (SAMPLES / "ddp_straggler").iterdir())


def test_recompute_on_dask_restores_the_analyses(local_home: Path, dask_home: Path, client: Any) -> None:
    for path in (dask_home / "tables" / "breakdown").glob("job=*/*.parquet"):
        path.unlink()  # recompute must bring them back, equal to the ones the local ingest wrote
    done: list[str] = []
    count = Warehouse(dask_home).recompute(client=client, on_trace=done.append)
    assert count == len(done) == len(Warehouse(local_home).traces())
    assert_same_warehouse(local_home, dask_home)


def test_cli_ingest_and_recompute_with_scheduler(tmp_path: Path, client: Any) -> None:
    runner = CliRunner()
    address = client.scheduler.address
    home = tmp_path / "wh"
    result = runner.invoke(app, ["ingest", str(SAMPLES / "ddp_straggler"), "--job", "ddp", "--scheduler", address,
                                 "--home", str(home)])
    assert result.exit_code == 0, result.output
    assert "4 ingested" in result.output and address in result.output
    # DASK_SCHEDULER_ADDRESS when no option is given; a file:// URL for the warehouse
    result = runner.invoke(app, ["analyze", "--recompute", "--job", "ddp", "--home", f"file://{home}"],
                           env={"DASK_SCHEDULER_ADDRESS": address})
    assert result.exit_code == 0, result.output
    assert "recomputed the analyses of 4 traces" in result.output
    assert not any((home / "staging").iterdir())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["ingest", "x.json", "--scheduler", "tcp://127.0.0.1:8786", "--workers", "2"], "not both"),
        (["analyze", "--job", "j", "--workers", "2"], "--recompute only"),
        (["ingest", "x.json", "--home", "s3://bucket/warehouse"], "mount the bucket"),
    ],
)
def test_cli_usage_errors(tmp_path: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1
    assert message in result.output and "Traceback" not in result.output


def test_unreachable_scheduler_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dist, "CONNECT_TIMEOUT_S", 1)
    result = CliRunner().invoke(app, ["ingest", str(SAMPLES / "launch_bound"), "--home", str(tmp_path / "wh"),
                                      "--scheduler", "tcp://127.0.0.1:9"])
    assert result.exit_code == 1
    assert "cannot reach the Dask scheduler at tcp://127.0.0.1:9" in result.output
    assert "Traceback" not in result.output


def test_where_work_runs() -> None:
    env = {"DASK_SCHEDULER_ADDRESS": "tcp://s:8786"}
    assert resolve_target(None, None, {}) == ClusterTarget()
    assert resolve_target(None, None, env) == ClusterTarget(scheduler="tcp://s:8786")
    assert resolve_target("tcp://t:1", None, env) == ClusterTarget(scheduler="tcp://t:1")
    assert resolve_target(None, 3, env) == ClusterTarget(workers=3)  # an option beats the environment
    assert resolve_target(None, 1, {}) == ClusterTarget()
    with pytest.raises(InvalidArgument, match="not both"):
        resolve_target("tcp://t:1", 2, {})


def test_warehouse_locations(tmp_path: Path) -> None:
    assert warehouse_path(tmp_path) == tmp_path
    assert warehouse_path(f"file://{tmp_path}") == tmp_path
    assert warehouse_path(Path(f"file://{tmp_path}")) == tmp_path  # Path() folds '//' into '/'
    assert warehouse_path("relative/dir") == Path("relative/dir")
    for url in ("s3://bucket/wh", "memory://wh", "gs://b/wh", "file://otherhost/wh"):
        with pytest.raises(InvalidArgument):
            warehouse_path(url)


class KillOnceWhileStaging(distributed.WorkerPlugin):
    """Kills its worker process (SIGKILL) the first time staged files appear while it runs an ingest task.

    The marker file makes it happen once in the whole cluster; the killed task was
    executing, so Dask must run it again on another worker.
    """

    def __init__(self, staging: str, marker: str) -> None:
        self.staging, self.marker = staging, marker
        self.running: set[str] = set()

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        if "tracelake-ingest" not in str(key):
            return
        if finish == "executing":
            self.running.add(str(key))
            threading.Thread(target=self._kill_when_staged, args=(str(key),), daemon=True).start()
        elif start == "executing":
            self.running.discard(str(key))

    def _kill_when_staged(self, key: str) -> None:
        while key in self.running:
            if any(Path(self.staging).glob("dask-*/*/*.parquet")):
                try:
                    os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                except FileExistsError:
                    return
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(0.002)


def test_killed_worker_tasks_are_retried_and_nothing_is_written_twice(
    tmp_path: Path, local_home: Path, client: Any
) -> None:
    home = tmp_path / "warehouse"
    wh = Warehouse(home)
    marker = tmp_path / "killed"
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this test module
    client.register_plugin(KillOnceWhileStaging(str(home / "staging"), str(marker)), name="kill-once")
    try:
        statuses = _ingest_all(wh, client)
    finally:
        client.unregister_worker_plugin("kill-once")
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    assert marker.exists(), "no worker was killed: the test did not test anything"
    assert {s for _, s, _ in statuses} == {"ingested"}, statuses
    ids = _registered(home)
    assert len(ids) == len(set(ids)) == len(statuses)
    assert_same_warehouse(local_home, home)
    client.wait_for_workers(2, timeout=60)  # the nanny restarted the killed one
