"""The profiler hooks (tracelake.torch, tracelake.jax), their background uploader and spool, with real parts.

A real ``torch.profiler`` run on CPU and a real ``jax.profiler.trace`` upload to a real
``tracelake serve`` on 127.0.0.1 (tests/support/server.py); the server's own trace list says
what arrived. The training thread's id is compared with the threads that ran ``Client.upload``.
With no server listening, traces land in the spool; a server started on that port then gets
them from ``tracelake push --spool``, which empties the spool. Two ranks under a real ``torchrun``
(gloo) name and label their own traces; a script that ends without ``flush()`` still delivers
its trace, or spools it when the server is down; a full queue spills to the spool on the spot;
a file the server refuses stays in the spool; hook errors are logged, never raised.
"""

from __future__ import annotations

import ast
import gzip
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from tracelake.api.cli import app
from tracelake.client import BackgroundUploader, Client, content_id, send_spool
from tracelake.client.spool import SIDECAR, add_to_spool, spool_entries

from support import ROOT
from support.server import free_port, running_server, wait_healthy

torch = pytest.importorskip("torch")
SLOW = pytest.mark.slow  # a real uvicorn server
#: torch warns that a repeating schedule's cycles each report their own events: what the hook wants.
CYCLE_WARNING = pytest.mark.filterwarnings("ignore:.*Profiler clears events at the end of each cycle")
WRITER = "hooks-writer-0001"
READER = "hooks-reader-0001"
SCHEDULE = {"wait": 1, "warmup": 1, "active": 2, "repeat": 2}
#: The steps a schedule(wait=1, warmup=1, active=2, repeat=2) run hands a trace at: the ends of its two cycles.
CYCLE_ENDS = [4, 8]
SAMPLE = ROOT / "sample_traces" / "kineto" / "ddp_straggler" / "rank-0.json.gz"


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACELAKE_")}
    return {**env, "TRACELAKE_HOME": str(home), "TRACELAKE_TOKENS": f"{WRITER}:read,write;{READER}:read",
            "TRACELAKE_INGEST_WORKERS": "0"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    home = tmp_path_factory.mktemp("hooks") / "wh"
    with running_server([], _env(home), tmp_path_factory.mktemp("log") / "server.log") as url:
        yield url


def _traces(url: str, job: str, expected: int) -> list[dict[str, Any]]:
    """The server's ``traces`` rows of ``job`` once ``expected`` of them are ingested (a minute at most)."""
    deadline = time.monotonic() + 60
    while True:
        doc = httpx.get(f"{url}/api/v1/traces", params={"job": job, "limit": 100},
                        headers={"Authorization": f"Bearer {READER}"}, timeout=10).json()
        rows = doc["traces"]
        if len(rows) >= expected or time.monotonic() > deadline:
            return list(rows)
        time.sleep(0.2)


def _train(on_trace_ready: Any, steps: int = 10) -> None:
    """A tiny model's training loop under ``torch.profiler`` with a two-cycle schedule, on this thread."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                schedule=torch.profiler.schedule(**SCHEDULE), on_trace_ready=on_trace_ready) as prof:
        for _ in range(steps):
            loss = model(torch.randn(32, 64)).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            prof.step()


@pytest.fixture
def upload_threads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, str]]:
    """Every ``Client.upload`` call from now on, as (thread id, file name)."""
    calls: list[tuple[int, str]] = []
    original = Client.upload

    def recording(self: Client, paths: Any, **kwargs: Any) -> Any:
        calls.append((threading.get_ident(), Path(paths).name))
        return original(self, paths, **kwargs)

    monkeypatch.setattr(Client, "upload", recording)
    return calls


def test_the_client_imports_the_standard_library_and_contracts_only() -> None:
    """At module level only the standard library and tracelake.contracts/tracelake.client; torch, jax, polars and
    ISA-L inside functions (read from the source, so a lazy import cannot hide a module-level one)."""
    found = []
    for path in sorted((ROOT / "client").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            for sub in ([node] if not isinstance(node, ast.If) else node.body):  # `if TYPE_CHECKING:` blocks too
                if isinstance(sub, ast.Import):
                    names = [a.name for a in sub.names]
                elif isinstance(sub, ast.ImportFrom) and not sub.level:
                    names = [sub.module or ""]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    ok = top in sys.stdlib_module_names or name.startswith(("tracelake.contracts", "tracelake.client"))
                    if not ok and not (isinstance(node, ast.If) and top == "polars"):  # polars for types only
                        found.append(f"{path.relative_to(ROOT)}:{sub.lineno}: {name}")
    assert not found, found


# -- torch ------------------------------------------------------------------------------------------------------


@SLOW
@CYCLE_WARNING
def test_torch_hook_uploads_one_trace_per_cycle_off_the_training_thread(
        server: str, tmp_path: Path, upload_threads: list[tuple[int, str]]) -> None:
    import tracelake.torch

    hook = tracelake.torch.upload(job="torch-cycles", labels={"team": "infra"}, url=server, token=WRITER,
                                  spool=tmp_path / "spool")
    exports: list[int] = []
    original = torch.profiler.profile.export_chrome_trace

    def export(self: Any, path: str) -> Any:
        exports.append(threading.get_ident())
        return original(self, path)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.profiler.profile, "export_chrome_trace", export)
        _train(hook)
    assert hook.flush(60)
    training = threading.get_ident()
    assert exports == [training, training]  # one export per cycle, on the training thread
    assert len(upload_threads) == 2 and training not in {t for t, _ in upload_threads}, upload_threads
    assert {t for t, _ in upload_threads} == hook.uploader.upload_threads
    assert [name for _, name in upload_threads] == [f"rank-0.{s}.pt.trace.json.gz" for s in CYCLE_ENDS]
    rows = _traces(server, "torch-cycles", 2)
    assert len(rows) == 2, rows
    assert all(r["labels"] == {"team": "infra", "rank": "0", "world_size": "1"} for r in rows), rows
    assert all(r["format"] == "pytorch_profiler" and r["rank"] == 0 for r in rows), rows
    assert sorted(r["source_name"] for r in rows) == [f"rank-0.{s}.pt.trace.json.gz" for s in CYCLE_ENDS]
    assert not list((tmp_path / "spool").glob("*")), "nothing was to be spooled"
    assert hook.uploader.counts["sent"] >= 2


@SLOW
def test_ddp_ranks_name_and_label_their_traces(server: str, tmp_path: Path) -> None:
    script = tmp_path / "ddp.py"
    script.write_text(
        "import torch, torch.distributed as dist, tracelake.torch\n"
        "dist.init_process_group('gloo')\n"
        "model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 8))\n"
        "with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],\n"
        "        schedule=torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=1),\n"
        "        on_trace_ready=tracelake.torch.upload(job='ddp-ranks', labels={'team': 'infra'})) as prof:\n"
        "    for _ in range(5):\n"
        "        model(torch.randn(16, 64)).sum().backward()\n"
        "        prof.step()\n"
        "dist.destroy_process_group()\n")
    env = {**_env(tmp_path / "unused"), "TRACELAKE_URL": server, "TRACELAKE_TOKEN": WRITER,
           "TRACELAKE_SPOOL": str(tmp_path / "spool")}
    torchrun = Path(sys.executable).with_name("torchrun")
    done = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "2", str(script)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = sorted(_traces(server, "ddp-ranks", 2), key=lambda r: int(r["rank"]))
    assert [r["source_name"] for r in rows] == ["rank-0.4.pt.trace.json.gz", "rank-1.4.pt.trace.json.gz"], rows
    assert [(r["rank"], r["rank_source"], r["world_size"], r["backend"]) for r in rows] == [
        (0, "distributedInfo", 2, "gloo"), (1, "distributedInfo", 2, "gloo")]  # the trace's own word, as the label's
    assert [r["labels"] for r in rows] == [{"team": "infra", "rank": str(n), "world_size": "2"} for n in (0, 1)]
    assert not (tmp_path / "spool").exists()


@SLOW
def test_a_short_scripts_last_trace_is_sent_at_exit(server: str, tmp_path: Path) -> None:
    script = tmp_path / "short.py"
    script.write_text(
        "import torch, tracelake.torch\n"
        f"hook = tracelake.torch.upload(job='short-script', url={server!r}, token={WRITER!r}, spool={str(tmp_path)!r})\n"
        "with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], on_trace_ready=hook):\n"
        "    torch.randn(128, 128).matmul(torch.randn(128, 128))\n"
        "# no flush(): the interpreter's exit drains the uploader\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    rows = _traces(server, "short-script", 1)
    assert len(rows) == 1 and rows[0]["labels"] == {"rank": "0", "world_size": "1"}, rows


@SLOW
@CYCLE_WARNING
def test_spooled_while_down_then_push_spool_sends_and_empties(tmp_path: Path) -> None:
    import tracelake.torch

    port = free_port()
    url = f"http://127.0.0.1:{port}"  # nothing listens here yet
    spool = tmp_path / "spool"
    hook = tracelake.torch.upload(job="while-down", labels={"run": "7"}, url=url, token=WRITER, spool=spool, retries=1)
    _train(hook)
    assert hook.flush(60)
    entries, incomplete, damaged = spool_entries(spool)
    assert len(entries) == 2 and not incomplete and not damaged
    names = sorted(f.name for e in entries for f in e.files)
    assert names == sorted(f"rank-0.{s}.pt.trace.json.gz" for s in CYCLE_ENDS)
    for entry in entries:
        sidecar = json.loads((entry.folder / SIDECAR).read_text())
        assert sidecar["job"] == "while-down" and sidecar["labels"] == {"run": "7", "rank": "0", "world_size": "1"}
        assert b'"traceEvents"' in gzip.decompress(entry.files[0].read_bytes())  # a whole Kineto trace, gzipped
    ids = sorted(content_id(f) for e in entries for f in e.files)

    log_path = tmp_path / "server.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "tracelake.api.cli", "serve", "--port", str(port)],
                                   env=_env(tmp_path / "wh"), stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_healthy(url, log_path, process)
            result = CliRunner().invoke(app, ["push", "--spool", str(spool), "--wait", "--url", url, "--token", WRITER])
            assert result.exit_code == 0, result.output
            assert "2 spooled traces sent" in result.output and "0 failed" in result.output, result.output
            assert list(spool.iterdir()) == []
            rows = _traces(url, "while-down", 2)
            assert sorted(r["trace_id"] for r in rows) == ids
            assert all(r["labels"] == {"run": "7", "rank": "0", "world_size": "1"} for r in rows), rows
            again = CliRunner().invoke(app, ["push", "--spool", str(spool), "--url", url, "--token", WRITER])
            assert again.exit_code == 0 and "0 spooled traces sent" in again.output, again.output
        finally:
            process.terminate()
            process.wait(30)


def test_hook_errors_are_logged_never_raised(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import tracelake.torch

    class Broken:
        step_num = 3

        def export_chrome_trace(self, path: str) -> None:
            raise RuntimeError("disk full")

    hook = tracelake.torch.upload(job="broken", url="http://127.0.0.1:1", spool=tmp_path / "spool")
    with caplog.at_level(logging.ERROR, logger="tracelake"):
        hook(Broken())  # must not raise
    assert any("disk full" in (r.exc_text or "") and r.name.startswith("tracelake") for r in caplog.records)
    assert hook.handed == 0


def test_a_bad_url_spools_instead(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    trace = tmp_path / "rank-1.json"
    trace.write_text('{"traceEvents": []}')
    uploader = BackgroundUploader("not a url", spool=tmp_path / "spool")
    with caplog.at_level(logging.WARNING, logger="tracelake"):
        assert uploader.submit(trace, job="j", labels={"a": "b"})
        assert uploader.flush(30)
    assert uploader.counts == {"sent": 0, "present": 0, "spooled": 1, "lost": 0}
    assert trace.is_file()  # the user's file is copied into the spool, never taken
    (entry,), _, _ = spool_entries(tmp_path / "spool")
    assert entry.job == "j" and entry.labels == {"a": "b"} and entry.files[0].read_bytes() == trace.read_bytes()
    assert any("not a server URL" in r.getMessage() for r in caplog.records)


def test_a_full_queue_spools_on_the_spot(tmp_path: Path) -> None:
    gate = threading.Event()
    uploader = BackgroundUploader("http://127.0.0.1:1", spool=tmp_path / "spool", queue_size=1, retries=0)
    original = uploader._handle

    def held(item: Any) -> None:
        gate.wait(30)  # the thread is busy: the queue fills
        original(item)

    uploader._handle = held
    files = []
    for n in range(3):
        files.append(tmp_path / f"t{n}.json")
        files[-1].write_text('{"traceEvents": []}')
    queued = [uploader.submit(f, job="full", gzip_as=f"{f.name}.gz", owned=True) for f in files]
    # the first is taken by the thread (or waits in the queue), so at least one later one finds the queue full
    assert queued[0] and not all(queued)
    entries, _, _ = spool_entries(tmp_path / "spool")
    spilled = [f.name for e in entries for f in e.files]
    assert spilled and all(name.endswith(".json") for name in spilled)  # as it was: not gzipped on the caller's thread
    gate.set()
    assert uploader.flush(60)


def test_exit_spools_what_is_still_waiting(tmp_path: Path) -> None:
    """A script that ends while the uploader still retries a dead server: the drain at exit spools every trace."""
    script = tmp_path / "ends.py"
    script.write_text(
        "import shutil, sys, tracelake.client\n"
        f"u = tracelake.client.BackgroundUploader('http://127.0.0.1:1', spool={str(tmp_path / 'spool')!r}, retries=8,\n"
        "                                         backoff=2.0, drain_timeout=1.0)\n"
        "for n in range(3):\n"
        f"    shutil.copy({str(SAMPLE)!r}, u.staging() / f'rank-{{n}}.json.gz')\n"
        "    u.submit(u.staging() / f'rank-{n}.json.gz', job='ends', owned=True)\n")
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 30  # the drain waited its 1 s, not the retries' minutes
    entries, _, _ = spool_entries(tmp_path / "spool")
    assert sorted(f.name for e in entries for f in e.files) == ["rank-0.json.gz", "rank-1.json.gz", "rank-2.json.gz"]
    assert all(e.job == "ends" and e.files[0].read_bytes() == SAMPLE.read_bytes() for e in entries)
    assert "still waiting at exit" in done.stderr


def test_send_spool_keeps_what_the_server_refuses(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    good, bad = tmp_path / "rank-0.json", tmp_path / "rank-1.json"
    good.write_text('{"traceEvents": []}')
    bad.write_text("not json")
    add_to_spool(spool, good, job="j", labels={})
    kept = add_to_spool(spool, bad, job="j", labels={})

    class Refusing(Client):
        def upload(self, paths: Any, **kwargs: Any) -> Any:
            from tracelake.client import Sent, UploadReport
            return UploadReport([Sent(p, None, "failed" if p.read_text() == "not json" else "queued", True,
                                      error="rank-1.json: not JSON") for p in paths])

    report = send_spool(Refusing("http://127.0.0.1:1"), spool)
    assert len(report.sent) == 1 and [f for f, _ in report.failed] == [kept] and "not JSON" in report.failed[0][1]
    assert [p.name for p in spool.iterdir()] == [kept.name] and (kept / "rank-1.json").is_file()


def test_push_spool_from_the_shell_without_a_server(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    (spool / "broken").mkdir(parents=True)
    (spool / "broken" / SIDECAR).write_text('{"job": 1')
    (spool / "being-written").mkdir()  # no sidecar yet: left alone
    runner = CliRunner()
    both = runner.invoke(app, ["push", "--spool", str(spool), "--job", "x"])
    assert both.exit_code == 1 and "leave out --job" in both.output and "Traceback" not in both.output
    damaged = runner.invoke(app, ["push", "--spool", str(spool), "--url", "http://127.0.0.1:1", "--retries", "0"])
    assert damaged.exit_code == 1, damaged.output
    assert "not a spool sidecar" in damaged.output and "1 being written (left alone)" in damaged.output
    assert sorted(p.name for p in spool.iterdir()) == ["being-written", "broken"]
    add_to_spool(spool, SAMPLE, job="j", labels={})
    down = runner.invoke(app, ["push", "--spool", str(spool), "--url", "http://127.0.0.1:1", "--retries", "0"])
    assert down.exit_code != 0 and "cannot reach" in down.output and "Traceback" not in down.output
    assert len(spool_entries(spool)[0]) == 1  # still there for the next try


# -- jax --------------------------------------------------------------------------------------------------------


@SLOW
def test_jax_trace_uploads_this_hosts_xplane(server: str, tmp_path: Path,
                                              upload_threads: list[tuple[int, str]]) -> None:
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    import tracelake.jax

    with tracelake.jax.trace(tmp_path / "log", job="jax-run", labels={"team": "infra"}, url=server, token=WRITER,
                             spool=tmp_path / "spool") as folder:
        x = jnp.ones((256, 256))
        (x @ x).block_until_ready()
    assert tracelake.jax.flush(60)
    run = tracelake.jax.newest_run(folder)
    (xplane,) = run.glob("*.xplane.pb")  # the user's own file stays where JAX wrote it
    assert [name for _, name in upload_threads] == [xplane.name]
    assert threading.get_ident() not in {t for t, _ in upload_threads}
    rows = _traces(server, "jax-run", 1)
    assert len(rows) == 1 and rows[0]["trace_id"] == content_id(xplane), rows
    assert rows[0]["format"] == "xla" and rows[0]["labels"] == {
        "team": "infra", "process_index": str(jax.process_index()), "process_count": str(jax.process_count())}
    assert not list((tmp_path / "spool").glob("*"))
