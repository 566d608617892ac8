"""Bad input files, end to end: Warehouse.ingest_file / Warehouse.ingest and the CLI.

Every bad file must fail with a message that names the file (and the place, where
a place makes sense), write nothing into the warehouse, leave the warehouse
queryable, and not stop a good file ingested in the same call. The CLI must exit
with 1 and print the message, never a traceback.
"""

from __future__ import annotations

import gzip
import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from support import ROOT, len_field
from tracelake.api.cli import app
from tracelake.sample_traces import generate_nccl, generate_xla
from tracelake.warehouse import Warehouse

SAMPLE = Path(__file__).resolve().parent.parent / "sample_traces" / "kineto" / "ddp_straggler" / "rank-0.json.gz"
NCCL_TEXT = generate_nccl.all_gather_old_text()
XPLANE = Path(__file__).resolve().parent.parent / "sample_traces" / "xla" / "tpu_allreduce" / "host0.xplane.pb"


# -- building the bad files --------------------------------------------------------------

def sample_bytes() -> bytes:
    return gzip.decompress(SAMPLE.read_bytes())


def sample_doc() -> dict[str, Any]:
    return json.loads(sample_bytes())


def index_of(doc: dict[str, Any], cat: str, nth: int = 10) -> int:
    """Index in traceEvents of the ``nth`` complete ("X") event of category ``cat``."""
    found = [i for i, e in enumerate(doc["traceEvents"]) if e.get("ph") == "X" and e.get("cat") == cat]
    assert len(found) > nth, f"the sample has too few {cat} events"
    return found[nth]


def edited_sample(edit: Callable[[dict[str, Any]], None]) -> bytes:
    doc = sample_doc()
    edit(doc)
    return json.dumps(doc, indent=1).encode()


def without(cat: str, key: str) -> bytes:
    def edit(doc: dict[str, Any]) -> None:
        del doc["traceEvents"][index_of(doc, cat)][key]

    return edited_sample(edit)


def with_value(cat: str, key: str, value: Any) -> bytes:
    def edit(doc: dict[str, Any]) -> None:
        event = doc["traceEvents"][index_of(doc, cat)]
        if key.startswith("args."):
            event.setdefault("args", {})[key[5:]] = value
        else:
            event[key] = value

    return edited_sample(edit)


def with_garbage() -> bytes:
    data = sample_bytes()
    return data[: garbage_at()] + b"@@garbage@@" + data[garbage_at() :]


def garbage_at() -> int:
    """Where with_garbage() inserts its garbage: before a key, some way into the events."""
    data = sample_bytes()
    return data.index(b'"name"', len(data) // 3)


def random_bytes(n: int, seed: int) -> bytes:
    data = random.Random(seed).randbytes(n)
    return b"\x00\xfe" + data  # neither gzip, nor JSON, nor whitespace at the start


@dataclass
class Bad:
    """One bad input: how to make it and what its error must say."""

    id: str
    name: str
    content: Callable[[], bytes] | None  # None: the file does not exist
    says: list[str]  # parts the error message must contain
    at: str | None = None  # regex for the position in the message (None: no position makes sense)
    marks: list[Any] = field(default_factory=list)

    def make(self, folder: Path) -> Path:
        path = folder / self.name
        if self.content is not None:
            folder.mkdir(parents=True, exist_ok=True)
            path.write_bytes(self.content())
        return path

    def param(self) -> Any:
        return pytest.param(self, id=self.id, marks=self.marks)


def xplane_bytes() -> bytes:
    return XPLANE.read_bytes()


def xplane_with_huge_plane() -> bytes:
    """A plane whose length runs far past the end of the file."""
    return b"\x0a\xff\xff\xff\x7f" + xplane_bytes()[5:]


def xplane_without_devices() -> bytes:
    return len_field(1, generate_xla.environment_plane())


BAD = [
    Bad("empty", "rank-0.json", lambda: b"", ["empty"], r"at byte 0\b"),
    Bad("xplane-truncated", "host0.xplane.pb", lambda: xplane_bytes()[: len(xplane_bytes()) // 2],
        ["cut short"], r"at byte \d+"),
    Bad("xplane-huge-length", "host0.xplane.pb", xplane_with_huge_plane, ["runs past the end"], r"at byte 0\b"),
    Bad("xplane-not-xspace", "host0.xplane.pb", lambda: random_bytes(4096, 3), ["XSpace"], r"at byte \d+"),
    Bad("xplane-no-device-planes", "host0.xplane.pb", xplane_without_devices, ["no device", "planes"]),
    Bad("nccl-tests-no-rows", "all_reduce_perf.txt", lambda: NCCL_TEXT.split("#       size")[0].encode(),
        ["without any result rows"]),
    Bad("nccl-tests-bad-number", "all_reduce_perf.txt",
        lambda: NCCL_TEXT.replace("   12.00 ", "   12.x0 ", 1).encode(), ["non-numeric"], r"at line \d+"),
    Bad("whitespace-only", "rank-0.json", lambda: b"  \n\t\r\n   \n", ["whitespace"], r"at byte 0\b"),
    Bad("truncated-gzip", "rank-0.json.gz", lambda: SAMPLE.read_bytes()[: SAMPLE.stat().st_size // 2],
        ["gzip", "truncated"], r"at compressed byte \d+"),
    Bad("truncated-json", "rank-0.json", lambda: sample_bytes()[: len(sample_bytes()) // 2],
        ["ends inside the traceEvents array", "truncated"], rf"at byte {len(sample_bytes()) // 2}\b"),
    Bad("gzip-of-garbage", "rank-0.json.gz", lambda: gzip.compress(random_bytes(4096, 1)),
        ["not a trace format"], r"at byte 0\b"),
    Bad("damaged-gzip", "rank-0.json.gz", lambda: b"\x1f\x8b" + random_bytes(4096, 2), ["not a valid gzip"],
        r"at byte \d+"),
    Bad("invalid-json", "rank-0.json", with_garbage, ["invalid JSON"], rf"at byte {garbage_at()}\b"),
    Bad("not-a-trace", "hello.json", lambda: b'{"hello": 1}', ["traceEvents", "not a"]),
    Bad("json-array", "rank-0.json", lambda: json.dumps(sample_doc()["traceEvents"][:50]).encode(),
        ["traceEvents"]),
    Bad("no-traceEvents", "rank-0.json", lambda: sample_bytes().replace(b'"traceEvents"', b'"traceEventz"'),
        ['"traceEvents"']),
    Bad("cpu-op-without-ts", "rank-0.json", lambda: without("cpu_op", "ts"), ["'ts'"],
        rf"traceEvents\[{index_of(sample_doc(), 'cpu_op')}\]"),
    Bad("kernel-without-ts", "rank-0.json", lambda: without("kernel", "ts"), ["'ts'"],
        rf"traceEvents\[{index_of(sample_doc(), 'kernel')}\]"),
    Bad("cpu-op-without-dur", "rank-0.json", lambda: without("cpu_op", "dur"), ["'dur'"],
        rf"traceEvents\[{index_of(sample_doc(), 'cpu_op')}\]"),
    Bad("kernel-without-dur", "rank-0.json", lambda: without("kernel", "dur"), ["'dur'"],
        rf"traceEvents\[{index_of(sample_doc(), 'kernel')}\]"),
    Bad("ts-not-a-number", "rank-0.json", lambda: with_value("cpu_op", "ts", "abc"), ["'ts'"],
        rf"traceEvents\[{index_of(sample_doc(), 'cpu_op')}\]"),
    Bad("external-id-a-list", "rank-0.json", lambda: with_value("kernel", "args.External id", [1]),
        ["External id"], rf"traceEvents\[{index_of(sample_doc(), 'kernel')}\]"),
    Bad("ph-a-number", "rank-0.json", lambda: with_value("kernel", "ph", 5), ["'ph'"],
        rf"traceEvents\[{index_of(sample_doc(), 'kernel')}\]"),
    Bad("binary", "rank-0.json", lambda: random_bytes(8192, 3), ["not a trace format"], r"at byte 0\b"),
    Bad("binary-any-name", "core.bin", lambda: bytes(range(256)) * 16, ["not a trace format"], r"at byte 0\b"),
    Bad("does-not-exist", "rank-9.json", None, ["no such file"]),
]


# -- checks ------------------------------------------------------------------------------

def check_error(error: str | None, bad: Bad, path: Path) -> None:
    assert error, "a failed result must carry an error message"
    assert path.name in error, f"the message does not name the file: {error!r}"
    for part in bad.says:
        assert part in error, f"{part!r} not in {error!r}"
    if bad.at is not None:
        assert re.search(bad.at, error), f"position {bad.at!r} not in {error!r}"
    assert "Traceback" not in error


def table_files(home: Path) -> list[Path]:
    """Every file under tables/<table>/job=<job>/ except the _schema placeholders."""
    return sorted(p for p in home.glob("tables/*/job=*/*") if p.parent.name != "job=_schema")


def staging_left(home: Path) -> list[Path]:
    return sorted((home / "staging").rglob("*")) if (home / "staging").exists() else []


def check_nothing_written(home: Path) -> None:
    assert table_files(home) == []
    assert staging_left(home) == []


@pytest.fixture
def inputs(tmp_path: Path) -> Path:
    return tmp_path / "inputs"


@pytest.fixture
def good(tmp_path: Path) -> Path:
    """A good sample trace, in a folder of its own."""
    target = tmp_path / "good" / "rank-1.json.gz"
    target.parent.mkdir(parents=True)
    target.write_bytes(SAMPLE.read_bytes())
    return target


# -- the library -------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [b.param() for b in BAD])
def test_ingest_file_fails_cleanly(bad: Bad, warehouse: Warehouse, home: Path, inputs: Path) -> None:
    path = bad.make(inputs)
    result = warehouse.ingest_file(path)
    assert result.status == "failed"
    assert not result.ok
    check_error(result.error, bad, path)
    check_nothing_written(home)
    assert warehouse.query("select count(*) from device_ops").rows == [(0,)]
    assert warehouse.query("select count(*) from traces").rows == [(0,)]


@pytest.mark.parametrize("bad", [b.param() for b in BAD])
def test_bad_file_does_not_stop_a_good_one(bad: Bad, warehouse: Warehouse, home: Path, inputs: Path,
                                           good: Path) -> None:
    path = bad.make(inputs)
    report = warehouse.ingest([path, good])
    assert [r.status for r in report.results] == ["failed", "ingested"], [r.error for r in report.results]
    assert not report.ok
    check_error(report.results[0].error, bad, path)
    good_id = report.results[1].trace_id
    # Only the good trace's files were published; staging is clean.
    assert table_files(home)
    assert {p.name for p in table_files(home)} == {f"{good_id}.parquet"}
    assert staging_left(home) == []
    traces = warehouse.query("select trace_id, source_name from traces").rows
    assert traces == [(good_id, good.name)]
    assert warehouse.query("select count(*) from device_ops").rows[0][0] > 0
    # The bad file can be retried (it was not registered as a duplicate).
    assert warehouse.ingest_file(path).status == "failed"


# -- the CLI -----------------------------------------------------------------------------

def run_cli(*args: str) -> Any:
    return CliRunner().invoke(app, ["ingest", *args, "--quiet"])


@pytest.mark.parametrize("bad", [b.param() for b in BAD])
def test_cli_reports_bad_file(bad: Bad, home: Path, inputs: Path) -> None:
    path = bad.make(inputs)
    result = run_cli(str(path), "--home", str(home))
    assert result.exit_code == 1, result.output
    assert path.name in result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    for part in bad.says:
        assert part in result.output
    assert "1 failed" in result.output
    check_nothing_written(home)


@pytest.mark.parametrize("bad", [b.param() for b in BAD if b.id in ("empty", "invalid-json", "does-not-exist")])
def test_cli_bad_and_good_file(bad: Bad, home: Path, inputs: Path, good: Path) -> None:
    path = bad.make(inputs)
    result = run_cli(str(path), str(good), "--home", str(home))
    assert result.exit_code == 1, result.output
    assert path.name in result.output
    assert "Traceback" not in result.output
    assert "1 ingested" in result.output and "1 failed" in result.output
    assert len(Warehouse(home).traces()) == 1


@pytest.mark.parametrize("relative", ["rank[gpu0].json", "[bold]rank-0.json", "dir[/x]/rank-0.json"])
def test_cli_file_name_with_brackets(relative: str, home: Path, inputs: Path) -> None:
    path = inputs / relative  # does not exist where the folder name holds "/"
    if "/" not in relative:
        inputs.mkdir(parents=True)
        path.write_bytes(b"")
    result = run_cli(str(path), "--home", str(home))
    assert result.exit_code == 1
    assert "Traceback" not in result.output
    assert path.name in result.output


@pytest.mark.parametrize("sample", ["profiler_plugin", "nccl_tests"])
def test_a_whole_document_format_stops_a_gzip_bomb(sample: str, warehouse: Warehouse, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Formats read as one document (JSON) stop reading past a limit instead of filling memory."""
    from tracelake.ingest import source

    original = next(p for p in sorted((ROOT / "sample_traces" / "nccl" / sample).iterdir()) if p.suffix == ".json")
    monkeypatch.setattr(source, "MAX_WHOLE_BYTES", 1 << 20)
    padded = original.read_bytes() + b" " * (2 << 20)  # trailing white space: still the same JSON document
    bomb = tmp_path / f"bomb-{original.name}.gz"
    bomb.write_bytes(gzip.compress(padded))
    assert bomb.stat().st_size < 64 << 10  # it expands more than 30-fold
    result = warehouse.ingest_file(bomb)
    assert result.status == "failed"
    assert f"bomb-{original.name}.gz" in (result.error or "") and "expands to more than 1 MB" in (result.error or "")
    assert warehouse.count_traces() == 0
    # the same document under the limit still ingests
    monkeypatch.setattr(source, "MAX_WHOLE_BYTES", 1 << 30)
    assert warehouse.ingest_file(bomb).status == "ingested"
