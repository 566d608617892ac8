"""The Python client (tracelake.client) and ``tracelake push`` / ``nccl-env`` against a real ``tracelake serve``.

A real uvicorn on 127.0.0.1 (tests/support/server.py) with tokens: a folder uploaded twice
sends nothing the second time (the server's own upload counter says so), ``wait`` returns
once ingested, ``job()`` answers the frames ``Warehouse.analyze`` computes, ``sql()`` the
rows, a 429 from the real SQL per-token limit is waited out, a server killed in the middle
of a 60 MB upload and started again on the same port gets the file after the client's
retries, and a bad token is one clear error (and no traceback from ``tracelake push``).
"""

from __future__ import annotations

import gzip
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import polars as pl
import pytest
from polars.testing import assert_frame_equal
from typer.testing import CliRunner

from tracelake.api.cli import app
from tracelake.client import Client, Sent, ServerError, content_id, trace_files
from tracelake.client.files import RECOGNISED_SUFFIXES, TRACE_SUFFIXES
from tracelake.ingest import content_id as ingest_content_id
from tracelake.warehouse import Warehouse, inputs
from tracelake.warehouse.sql_sandbox import landlock_abi

from support import ROOT, SAMPLES
from support.server import free_port, running_server, wait_healthy

SLOW = pytest.mark.slow  # a real uvicorn server
WRITER = "client-writer-0001"
READER = "client-reader-0001"
DDP = SAMPLES / "ddp_straggler"
NEEDS_SQL = pytest.mark.skipif(landlock_abi() < 1, reason="the API runs SQL only where Landlock confines it")


def _env(home: Path, **settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACELAKE_")}
    return {**env, "TRACELAKE_HOME": str(home), "TRACELAKE_TOKENS": f"{WRITER}:read,write;{READER}:read",
            "TRACELAKE_INGEST_WORKERS": "0", **settings}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    home = tmp_path_factory.mktemp("client") / "wh"
    env = _env(home, TRACELAKE_SQL_PER_TOKEN="1", TRACELAKE_SQL_TIMEOUT_SECONDS="3")
    with running_server([], env, tmp_path_factory.mktemp("log") / "server.log") as url:
        yield url, home


def _copies(folder: Path, to: Path, tag: int) -> Path:
    """The traces of ``folder`` with ``tag`` spaces after their JSON: the same traces under new ids (no test sees
    another's uploads on the shared server)."""
    to.mkdir(parents=True)
    for path in sorted(folder.glob("*.json.gz")):
        (to / path.name).write_bytes(gzip.compress(gzip.decompress(path.read_bytes()) + b" " * tag, compresslevel=1))
    return to


def _uploads(url: str) -> float:
    """The server's own count of upload requests it accepted (``tracelake_uploads_total``)."""
    text = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {READER}"}).text
    return float(re.search(r"^tracelake_uploads_total (\S+)$", text, re.M).group(1))  # type: ignore[union-attr]


# -- offline: the id and the files are the server's -----------------------------------------------------------


def test_content_id_is_the_servers(tmp_path: Path) -> None:
    plain = tmp_path / "rank-0.json"
    plain.write_bytes(gzip.decompress((DDP / "rank-0.json.gz").read_bytes()))
    members = tmp_path / "two-members.json.gz"  # two gzip members with zero padding after the first, as gzip(1) allows
    data = plain.read_bytes()
    members.write_bytes(gzip.compress(data[:1000]) + b"\0" * 16 + gzip.compress(data[1000:], compresslevel=1))
    for path in (*sorted(DDP.glob("*.json.gz")), plain, members):
        assert content_id(path) == ingest_content_id(path), path
    assert content_id(plain) == content_id(DDP / "rank-0.json.gz") == content_id(members)
    truncated = tmp_path / "cut.json.gz"
    truncated.write_bytes((DDP / "rank-0.json.gz").read_bytes()[:5000])
    with pytest.raises(ValueError, match="ends early"):
        content_id(truncated)


def test_a_folder_gives_what_ingest_takes(tmp_path: Path) -> None:
    assert TRACE_SUFFIXES == inputs.TRACE_SUFFIXES and RECOGNISED_SUFFIXES == inputs._RECOGNISED_SUFFIXES
    shutil.copytree(ROOT / "sample_traces" / "nccl", tmp_path / "nccl")
    (tmp_path / "nccl" / ".hidden.json").write_text("{}")
    (tmp_path / "nccl" / "notes.md").write_text("not a trace")
    sent = {p.relative_to(tmp_path).as_posix() for p, _ in trace_files(tmp_path)}
    taken = {p.relative_to(tmp_path).as_posix() for p in inputs.expand_inputs([tmp_path])}
    assert taken <= sent and "nccl/flight_recorder/nccl_trace_rank_3" in sent
    assert all(p.endswith(RECOGNISED_SUFFIXES) for p in sent - taken), sent - taken  # the server decides those


def test_importing_the_client_imports_no_server(tmp_path: Path) -> None:
    code = ("import sys, tracelake.client, tracelake.torch, tracelake.jax; "
            "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('duckdb', 'fastapi', 'starlette', 'uvicorn', 'polars', 'pyarrow', 'numpy', 'torch', 'jax', 'jaxlib') "
            "or m.startswith(('tracelake.warehouse', 'tracelake.ingest', 'tracelake.analysis', 'tracelake.api')))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path)
    assert out.stdout.strip() == "", out.stdout


def test_nccl_env_prints_the_settings(tmp_path: Path) -> None:
    folder = tmp_path / "logs dir"
    result = CliRunner().invoke(app, ["nccl-env", "--dir", str(folder)])
    assert result.exit_code == 0, result.output
    assert "export NCCL_DEBUG=INFO" in result.output and "TORCH_NCCL_TRACE_BUFFER_SIZE=" in result.output
    assert "# export NCCL_INSPECTOR_ENABLE=1" in result.output and "tracelake push" in result.output
    shown = subprocess.run(["bash", "-c", f"{result.output}\nenv"], capture_output=True, text=True, check=True).stdout
    env = dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)
    assert env["NCCL_DEBUG_FILE"] == f"{folder}/nccl.%h.%p.log" and folder.is_dir()
    assert env["NCCL_DEBUG_SUBSYS"] == "INIT,COLL,NET,GRAPH,ENV,TUNING" and "NCCL_INSPECTOR_ENABLE" not in env


# -- against a real server -------------------------------------------------------------------------------------


@SLOW
def test_upload_twice_sends_nothing_twice(server: tuple[str, Path], tmp_path: Path) -> None:
    url, _ = server
    client = Client(url, WRITER)
    folder = _copies(DDP, tmp_path / "ddp", 1)
    before = _uploads(url)
    first = client.upload(folder, job="twice", labels={"team": "infra", "note": "a,b"}, wait=True)
    assert first.ok and len(first.sent) == 4 and not first.present
    assert all(i.status == "done" and i.job == "twice" for i in first.items), first.items
    assert _uploads(url) == before + 4
    again = client.upload([folder, folder / "rank-0.json.gz"], job="twice")
    assert again.ok and not again.sent and len(again.present) == 4 and again.bytes_sent == 0
    assert _uploads(url) == before + 4  # the server received nothing
    state = client.status(first.items[0].trace_id or "")
    assert state["status"] == "done" and state["trace"]["labels"] == {"team": "infra", "note": "a,b"}


@SLOW
def test_job_frames_are_the_warehouses(server: tuple[str, Path]) -> None:
    url, home = server
    Client(url, WRITER).upload(DDP, job="ddp", wait=True)
    frames = Client(url, READER).job("ddp")
    expected = Warehouse(home).analyze(job="ddp")
    assert frames["breakdown"].height == 4
    for name, frame in frames.items():
        if name == "findings":
            assert frame.to_dicts() == [f.as_dict() for f in expected.findings]
            continue
        want = getattr(expected, name)
        if want.is_empty():  # an empty list carries no columns
            assert frame.is_empty(), name
        else:
            assert_frame_equal(frame, want, check_dtypes=False), name


@SLOW
@NEEDS_SQL
def test_sql_and_a_429_waited_out(server: tuple[str, Path]) -> None:
    url, _ = server
    Client(url, WRITER).upload(DDP, job="ddp", wait=True)
    client = Client(url, READER)
    frame = client.sql("SELECT rank, count(*) AS ops FROM device_ops GROUP BY rank ORDER BY rank")
    assert frame.columns == ["rank", "ops"] and frame["rank"].to_list() == [0, 1, 2, 3]
    assert frame.schema["ops"] == pl.Int64 and min(frame["ops"]) > 0
    # TRACELAKE_SQL_PER_TOKEN=1: while a slow query of the same token runs (cut at 3 s), the server answers 429
    slow = "SELECT count(*) FROM range(1000000) a, range(1000000) b WHERE a.range + b.range = -1"
    held: list[int] = []

    def hog() -> None:
        held.append(httpx.post(f"{url}/api/v1/sql", json={"sql": slow}, headers={"Authorization": f"Bearer {READER}"},
                               timeout=60).status_code)

    thread = threading.Thread(target=hog)
    thread.start()
    time.sleep(1.0)  # the slow query has the token's one slot (nothing else of this token may ask meanwhile)
    started = time.monotonic()
    assert client.sql("SELECT 42 AS answer")["answer"].to_list() == [42]
    thread.join()
    assert held == [400]  # the slow query held the slot until its time limit
    assert client.retried.get("429", 0) >= 1 and time.monotonic() - started >= 1.0  # Retry-After: 1
    with pytest.raises(ServerError, match="(?i)select") as bad:
        client.sql("DELETE FROM device_ops")
    assert bad.value.status == 400


@SLOW
def test_a_bad_token_is_one_clear_error(server: tuple[str, Path], tmp_path: Path) -> None:
    url, _ = server
    with pytest.raises(ServerError) as refused:
        Client(url, "not-a-token-0000").upload(DDP, job="ddp")
    assert refused.value.status == 401 and refused.value.kind == "Unauthorized" and "token" in str(refused.value)
    with pytest.raises(ServerError) as read_only:
        Client(url, READER).upload(_copies(DDP, tmp_path / "ro", 2) / "rank-0.json.gz", job="other")
    assert read_only.value.status == 403 and "scope" in str(read_only.value), read_only.value
    with pytest.raises(ServerError) as missing:
        Client(url, READER).job("no-such-job")
    assert missing.value.status == 404


@SLOW
def test_push_from_the_shell(server: tuple[str, Path], tmp_path: Path) -> None:
    url, _ = server
    folder = tmp_path / "run"
    _copies(DDP, folder / "kineto", 3)
    shutil.copytree(ROOT / "sample_traces" / "nccl" / "inspector", folder / "nccl")
    (folder / "nccl" / "launcher.log").write_text("srun: job 42 started\n")  # no trace: left out, not a failure
    env = {**_env(tmp_path), "TRACELAKE_URL": url, "TRACELAKE_TOKEN": WRITER}
    push = [sys.executable, "-m", "tracelake.api.cli", "push", str(folder), "--job", "pushed", "--label", "ci=yes"]
    first = subprocess.run([*push, "--wait"], capture_output=True, text=True, env=env, timeout=300)
    assert first.returncode == 0, first.stderr
    assert re.search(r"\b8 ingested, 0 already there, 0 failed", first.stdout), first.stdout
    again = subprocess.run(push, capture_output=True, text=True, env=env, timeout=300)
    assert again.returncode == 0 and "0 sent, 8 already there" in again.stdout, again.stdout + again.stderr
    bad = subprocess.run([*push, "--token", "not-a-token-0000"], capture_output=True, text=True, env=env, timeout=300)
    assert bad.returncode == 1 and "Traceback" not in bad.stderr + bad.stdout
    assert bad.stderr.startswith("error:") and "401" in bad.stderr, bad.stderr
    damaged = tmp_path / "damaged.json.gz"
    damaged.write_bytes((DDP / "rank-1.json.gz").read_bytes()[:3000])
    broken = subprocess.run([*push, str(damaged), "--retries", "0"], capture_output=True, text=True, env=env,
                            timeout=300)
    assert broken.returncode == 1 and "Traceback" not in broken.stderr and "damaged.json.gz" in broken.stderr
    down = subprocess.run([*push, "--url", f"http://127.0.0.1:{free_port()}", "--retries", "1"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert down.returncode == 1 and "cannot reach" in down.stderr and "Traceback" not in down.stderr


# -- a server killed in the middle of an upload ------------------------------------------------------------------


def _big_trace(path: Path, mb: int) -> Path:
    """A valid Kineto trace of about ``mb`` MB: a sample with JSON whitespace before its last brace."""
    text = gzip.decompress((DDP / "rank-2.json.gz").read_bytes()).rstrip()
    with path.open("wb") as f:
        f.write(text[:-1])
        for _ in range(mb):
            f.write(b" " * (1 << 20))
        f.write(b"}\n")
    return path


class _Killer:
    """An upload's progress (:class:`tracelake.client.UploadProgress`) that kills the server once 8 MB are sent,
    then starts it again on the same port a second later."""

    def __init__(self, launch: Callable[[], subprocess.Popen[bytes]]) -> None:
        self.launch = launch
        self.process = launch()
        self.sent = 0
        self.killed = False
        self.restarted: threading.Thread | None = None

    def start(self, files: list[tuple[Path, int]]) -> None: ...

    def file_started(self, path: Path) -> None: ...

    def file_done(self, item: Sent) -> None: ...

    def advance(self, nbytes: int) -> None:
        self.sent += nbytes
        if self.sent >= 8 << 20 and not self.killed:
            self.killed = True
            os.killpg(self.process.pid, signal.SIGKILL)  # the server and its workers, at once
            self.process.wait(30)

            def restart() -> None:
                time.sleep(1.0)  # the client finds nobody listening for a while
                self.process = self.launch()

            self.restarted = threading.Thread(target=restart)
            self.restarted.start()


@SLOW
def test_a_server_restarted_mid_upload_gets_the_file(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = _env(tmp_path / "wh")
    log = (tmp_path / "server.log").open("ab")

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-m", "tracelake.api.cli", "serve", "--port", str(port)], env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    killer = _Killer(start)
    try:
        wait_healthy(url, tmp_path / "server.log")
        big = _big_trace(tmp_path / "big.pt.trace.json", 60)
        client = Client(url, WRITER, backoff=0.5, retries=10)
        report = client.upload(big, job="restart", wait=True, wait_timeout=120, progress=killer)
        assert killer.killed and killer.restarted is not None
        killer.restarted.join()
        assert report.ok and report.items[0].status == "done" and report.items[0].sent, report.items
        assert client.retried.get("connection", 0) >= 1, client.retried
        assert report.items[0].trace_id == content_id(big)
        assert killer.sent == big.stat().st_size  # the bytes of the try cut short were counted back
    finally:
        if killer.restarted is not None:
            killer.restarted.join()
        if killer.process.poll() is None:
            os.killpg(killer.process.pid, signal.SIGTERM)
            killer.process.wait(30)
        log.close()


def test_bad_names_are_refused_before_anything_is_sent(tmp_path: Path) -> None:
    """contracts/names.py, the rule the server applies: the client and the hooks refuse a bad job or label key
    at once, with no server (the URL would not answer) and nothing spooled."""
    from tracelake.client import Client
    from tracelake.contracts.errors import InvalidArgument

    trace = tmp_path / "rank-0.json"
    trace.write_text('{"traceEvents": []}')
    client = Client("http://127.0.0.1:9", token="t")
    with pytest.raises(InvalidArgument, match="invalid label key 'bad key'"):
        client.upload(trace, job="ok", labels={"bad key": "x"})
    with pytest.raises(InvalidArgument, match="invalid job name"):
        client.upload(trace, job="../etc")
    torch_hook = pytest.importorskip("tracelake.torch")
    with pytest.raises(InvalidArgument, match="invalid label key"):
        torch_hook.upload(job="ok", labels={"1team": "x"}, url="http://127.0.0.1:9", spool=tmp_path / "spool")
    assert not (tmp_path / "spool").exists() or not any((tmp_path / "spool").iterdir())
