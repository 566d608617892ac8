"""Fuzzing the parsers: the only outcomes allowed are a parsed trace or the project's own error.

Three layers, one property (:func:`fuzz.targets.run_input`): parsing a damaged file
either succeeds or raises a :class:`TracelakeError` whose message names the file;
any other exception (from DuckDB, pyarrow, protobuf, msgspec, json, pickle, struct,
polars...) is a parser bug.

- Property tests (hypothesis): the seeds of every parser mutated at the byte level
  (bit flips, truncation, splices, deleted and repeated ranges, inserted junk lines),
  at the JSON level (a random value in an event field, a field removed) and at the
  protobuf level (random bytes in a field's payload, stray fields with huge varints);
  the same inputs every run (the deterministic hypothesis profile of conftest.py;
  ``TRACELAKE_HYPOTHESIS=random`` draws new ones).
  One test per format goes end to end through ``Warehouse.ingest_file`` and checks
  that a failed file leaves nothing behind.
- Regressions: every input that once crashed a parser, kept under
  ``tests/fuzz/regressions/<format>/``, must now end cleanly.
- Memory: a small file must not make a parser allocate gigabytes (pickle memo
  indexes, gzip bombs).
- Coverage-guided fuzzing (atheris): each harness runs for a few seconds
  (``TRACELAKE_FUZZ_SECONDS``, default 5; 0 skips) from a fixed libFuzzer seed
  (``TRACELAKE_FUZZ_SEED=<n>`` picks another, ``random`` a new one each run);
  see tests/fuzz/README.md for longer runs.

Every test here is marked ``slow``: ``pytest -m "not slow"`` leaves the module out.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzz import targets
from fuzz.targets import TARGETS, Target
from support import varint
from tracelake import ingest
from tracelake.contracts.errors import TracelakeError
from tracelake.ingest import protowire
from tracelake.warehouse import Warehouse

pytestmark = pytest.mark.slow  # fuzzing: hypothesis mutations of every parser and the atheris harnesses

HARNESS = Path(__file__).resolve().parent / "fuzz" / "fuzz_parsers.py"
FORMATS = sorted(TARGETS)
#: Parsers whose seeds are JSON (a document, or JSON lines for the Inspector).
JSON_FORMATS = ["flight_recorder", "nccl_inspector", "nccl_profiler", "nccl_tests", "pytorch_profiler", "xla_json"]
#: The Kineto parser loads every input into DuckDB: fewer examples keep it inside the CI budget.
EXAMPLES = {"pytorch_profiler": 12}
DEFAULT_EXAMPLES = 40


def fuzz_settings(examples: int) -> settings:
    """The suite's hypothesis profile with ``examples`` examples; ``TRACELAKE_FUZZ_EXAMPLES=<n>`` multiplies them."""
    examples *= max(int(os.environ.get("TRACELAKE_FUZZ_EXAMPLES", "1")), 1)
    return settings(max_examples=examples, deadline=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@cache
def seeds(fmt: str) -> tuple[bytes, ...]:
    return tuple(TARGETS[fmt].seeds())


@cache
def all_seeds() -> tuple[bytes, ...]:
    return tuple(s for fmt in FORMATS for s in seeds(fmt))


@pytest.mark.parametrize("fmt", FORMATS)
def test_seeds_parse(fmt: str, workdir: Path) -> None:
    """Fuzzing starts from inputs that parse, so mutations reach deep into each parser."""
    for seed in seeds(fmt):
        assert targets.run_input(TARGETS[fmt], seed, workdir) == "parsed"


def check(target: Target, data: bytes, workdir: Path) -> None:
    """The fuzz property; with ``TRACELAKE_FUZZ_FAILURES=<folder>`` failing inputs are saved there (to keep)."""
    try:
        assert targets.run_input(target, data, workdir) in ("parsed", "rejected")
    except Exception:
        if folder := os.environ.get("TRACELAKE_FUZZ_FAILURES"):
            saved = Path(folder) / target.format / f"crash-{hashlib.sha1(data).hexdigest()[:12]}"
            saved.parent.mkdir(parents=True, exist_ok=True)
            saved.write_bytes(data)
        raise


# -- byte-level mutations ----------------------------------------------------------------

JUNK_LINES = st.one_of(
    st.binary(max_size=40),
    st.text(max_size=60).map(lambda s: s.encode("utf-8", "surrogatepass")),
    st.sampled_from([b"{", b"}", b"]", b"[", b",", b'{"header": {}}', b"null", b"\x80\x04", b"\x1f\x8b",
                     b"# nThread 1 nGpus 1", b"x:1:1 [0] NCCL INFO ", b"\xff" * 8, b"9" * 400, b"\"" * 3]),
)


@st.composite
def mutation(draw: st.DrawFn, data: bytes) -> Callable[[bytes], bytes]:
    """One edit of a byte string, drawn relative to ``data``'s length."""
    size = max(len(data), 1)
    kind = draw(st.sampled_from(["flip", "truncate", "splice", "junk_line", "delete", "repeat", "byte"]))
    at = draw(st.integers(0, size))
    if kind == "flip":
        bit = draw(st.integers(0, 7))
        return lambda d: d[:at] + bytes([d[at] ^ (1 << bit)]) + d[at + 1:] if at < len(d) else d
    if kind == "truncate":
        return lambda d: d[:at]
    if kind == "splice":
        other = draw(st.sampled_from(all_seeds()))
        lo = draw(st.integers(0, len(other)))
        hi = draw(st.integers(lo, min(len(other), lo + 400)))
        return lambda d: d[:at] + other[lo:hi] + d[at:]
    if kind == "junk_line":
        junk = draw(JUNK_LINES)

        def insert_line(d: bytes) -> bytes:
            cut = d.find(b"\n", at)
            cut = len(d) if cut < 0 else cut + 1
            return d[:cut] + junk + b"\n" + d[cut:]

        return insert_line
    if kind == "byte":
        value = draw(st.sampled_from([0, 0x7F, 0x80, 0xFF, ord('"'), ord("{"), ord("["), ord("-"), ord("9")]))
        return lambda d: d[:at] + bytes([value]) + d[at + 1:]
    length = draw(st.integers(1, 200))
    if kind == "delete":
        return lambda d: d[:at] + d[at + length:]
    times = draw(st.integers(2, 50))
    return lambda d: d[:at] + d[at:at + length] * times + d[at + length:]


@st.composite
def mutated_bytes(draw: st.DrawFn, fmt: str) -> bytes:
    data = draw(st.sampled_from(seeds(fmt)))
    for _ in range(draw(st.integers(1, 3))):
        data = draw(mutation(data))(data)
    return data


@pytest.mark.parametrize("fmt", FORMATS)
def test_byte_mutations(fmt: str, workdir: Path) -> None:
    target = TARGETS[fmt]

    @fuzz_settings(EXAMPLES.get(fmt, DEFAULT_EXAMPLES))
    @given(data=mutated_bytes(fmt))
    def run(data: bytes) -> None:
        check(target, data, workdir)

    run()


# -- JSON-level mutations: random values in event fields ----------------------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
    | st.sampled_from([0, -1, 2**31, 2**63, 2**64, -(2**63) - 1, 1e308, -1e308, 1e-320, "", "0x10", "NaN", "1e999",
                       "-5", "nccl:all_reduce", "send 0->1", "/device:TPU:0", "XLA Ops", "Steps", "X", "M", "b", "e"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


def json_paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value inside a JSON document (keys and indexes)."""
    found = [path] if path else []
    if isinstance(value, dict):
        for key, item in value.items():
            found += json_paths(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += json_paths(item, (*path, index))
    return found


def edit_json(doc: Any, path: tuple[Any, ...], value: Any, delete: bool) -> None:
    parent = doc
    for part in path[:-1]:
        parent = parent[part]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value


@cache
def json_documents(fmt: str) -> tuple[tuple[Any, list[tuple[Any, ...]]], ...]:
    """The JSON seeds of a format as (document, paths); Inspector seeds as a list of their JSON lines."""
    docs = []
    for seed in seeds(fmt):
        if fmt == "nccl_inspector":
            try:
                doc: Any = [json.loads(line) if line.startswith("{") else line for line in seed.decode().splitlines()]
            except ValueError:
                continue  # a pretty-printed seed: fuzzed as bytes only
        else:
            try:
                doc = json.loads(seed)
            except ValueError:
                continue  # a gzip or pickle seed
        docs.append((doc, json_paths(doc)))
    return tuple(docs)


def dump_json(fmt: str, doc: Any) -> bytes:
    if fmt == "nccl_inspector":
        return "\n".join(line if isinstance(line, str) else json.dumps(line) for line in doc).encode()
    return json.dumps(doc, indent=1).encode()


@st.composite
def mutated_json(draw: st.DrawFn, fmt: str) -> bytes:
    doc, paths = draw(st.sampled_from(json_documents(fmt)))
    doc = json.loads(json.dumps(doc))  # a copy to edit
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(paths))
        try:
            edit_json(doc, path, draw(JSON_VALUES), delete=draw(st.booleans()) and draw(st.booleans()))
        except (KeyError, IndexError, TypeError):
            pass  # an earlier edit removed or replaced the path
    return dump_json(fmt, doc)


@pytest.mark.parametrize("fmt", JSON_FORMATS)
def test_json_value_mutations(fmt: str, workdir: Path) -> None:
    target = TARGETS[fmt]

    @fuzz_settings(EXAMPLES.get(fmt, DEFAULT_EXAMPLES))
    @given(data=mutated_json(fmt))
    def run(data: bytes) -> None:
        check(target, data, workdir)

    run()


# -- protobuf-level mutations: random bytes in the XSpace's fields -------------------------

def len_fields(buf: bytes, start: int, end: int, depth: int = 0) -> list[tuple[int, int]]:
    """Payload ranges of the length-delimited fields, nested up to events (space > plane > line > event)."""
    found: list[tuple[int, int]] = []
    try:
        for _, wire, _, value_at, value_end in protowire.fields(buf, start, end):
            if wire == protowire.LEN:
                found.append((value_at, value_end))
                if depth < 3:
                    found += len_fields(buf, value_at, value_end, depth + 1)
    except protowire.WireError:
        pass  # a string or bytes payload, not a message
    return found


@st.composite
def mutated_xspace(draw: st.DrawFn) -> bytes:
    data = draw(st.sampled_from(seeds("xla")))
    ranges = len_fields(data, 0, len(data))
    for _ in range(draw(st.integers(1, 3))):
        start, end = draw(st.sampled_from(ranges))
        kind = draw(st.sampled_from(["same_length", "any_length", "varint"]))
        if kind == "same_length" and end > start:
            lo = draw(st.integers(start, end - 1))
            junk = draw(st.binary(min_size=1, max_size=min(16, end - lo)))
            data = data[:lo] + junk + data[lo + len(junk):]
        elif kind == "any_length":  # the enclosing lengths now disagree with the payload
            data = data[:start] + draw(st.binary(max_size=64)) + data[end:]
        else:  # a field of any number and wire type, with a big or negative varint
            tag = draw(st.integers(1, 40)) << 3 | draw(st.sampled_from([0, 1, 2, 5, 3, 7]))
            value = draw(st.sampled_from([0, 1, 2**31 - 1, 2**32, 2**63, 2**64 - 1]))
            data = data[:start] + varint(tag) + varint(value) + data[start:]
    return data




def test_protobuf_mutations(workdir: Path) -> None:
    @fuzz_settings(DEFAULT_EXAMPLES)
    @given(data=mutated_xspace())
    def run(data: bytes) -> None:
        check(TARGETS["xla"], data, workdir)

    run()


# -- end to end: Warehouse.ingest_file never raises and never publishes half a trace -------

@pytest.fixture(scope="module")
def e2e_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz-warehouse") / "warehouse"


@pytest.mark.parametrize("fmt", FORMATS)
def test_ingest_file_end_to_end(fmt: str, e2e_home: Path, workdir: Path) -> None:
    warehouse = Warehouse(e2e_home)
    target = TARGETS[fmt]
    inputs = workdir / f"e2e-{fmt}"

    @fuzz_settings(4)
    @given(data=mutated_json(fmt) if fmt in JSON_FORMATS else mutated_bytes(fmt))
    def run(data: bytes) -> None:
        inputs.mkdir(exist_ok=True)
        path = inputs / target.filename
        path.write_bytes(data)
        result = warehouse.ingest_file(path, job="fuzz")
        assert result.status in ("ingested", "duplicate", "failed")
        if result.status != "failed":
            return
        assert result.error and path.name in result.error, result.error
        assert "Traceback" not in result.error
        published = list((e2e_home / "tables").glob(f"*/*/{result.trace_id}*")) if result.trace_id else []
        assert published == [], f"a failed ingest left {published}"
        staging = e2e_home / "staging"
        assert not staging.exists() or not any(staging.iterdir())
        assert not any(row[0] == result.trace_id for row in warehouse.query("select trace_id from traces").rows)

    run()


# -- regressions: inputs that once crashed a parser ----------------------------------------

REGRESSIONS = [pytest.param(fmt, path, id=f"{fmt}/{path.name}")
               for fmt in FORMATS for path in targets.regression_files(fmt)]


@pytest.mark.parametrize(("fmt", "path"), REGRESSIONS)
def test_regression_inputs_end_cleanly(fmt: str, path: Path, workdir: Path) -> None:
    check(TARGETS[fmt], path.read_bytes(), workdir)


@pytest.mark.parametrize(("fmt", "path"), REGRESSIONS)
def test_regression_inputs_through_the_warehouse(fmt: str, path: Path, e2e_home: Path, tmp_path: Path) -> None:
    """The warehouse's own steps after parsing (derived tables, the traces row) take the odd values too."""
    source = tmp_path / TARGETS[fmt].filename
    source.write_bytes(path.read_bytes())
    result = Warehouse(e2e_home).ingest_file(source, job="regressions")
    assert result.status in ("ingested", "duplicate") or (result.error and source.name in result.error), result


def test_every_regression_folder_is_a_format() -> None:
    folders = [p.name for p in targets.REGRESSIONS.iterdir() if p.is_dir()] if targets.REGRESSIONS.is_dir() else []
    assert set(folders) <= set(TARGETS), "tests/fuzz/regressions/<format>/ must name a fuzz target"


# -- coverage-guided: each atheris harness for a bounded time -----------------------------

def fuzz_seconds() -> int:
    return int(os.environ.get("TRACELAKE_FUZZ_SECONDS", "5"))


def fuzz_seed() -> list[str]:
    """libFuzzer's ``-seed``: fixed by default, ``TRACELAKE_FUZZ_SEED=<n>`` or ``random`` (libFuzzer picks one)."""
    chosen = os.environ.get("TRACELAKE_FUZZ_SEED") or "1"
    return [] if chosen == "random" else [f"-seed={int(chosen)}"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_atheris_harness(fmt: str, tmp_path: Path) -> None:
    try:
        importlib.import_module("atheris")
    except ImportError as exc:  # not installed, or installed without a usable libFuzzer
        pytest.skip(f"atheris cannot be imported ({exc}); pip install atheris (Linux, CPython wheels)")
    if fuzz_seconds() <= 0:
        pytest.skip("TRACELAKE_FUZZ_SECONDS=0")
    corpus = tmp_path / "corpus"
    targets.write_corpus(TARGETS[fmt], corpus)
    command = [sys.executable, str(HARNESS), fmt, f"-max_total_time={fuzz_seconds()}", "-timeout=60",
               "-rss_limit_mb=3072", f"-artifact_prefix={tmp_path}/", "-print_final_stats=1", *fuzz_seed(), str(corpus)]
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=fuzz_seconds() + 120)
    crashes = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("crash-", "oom-", "timeout-")))
    tail = "\n".join(line for line in done.stderr.splitlines() if not line.startswith("INFO: Instrumenting"))[-6000:]
    assert done.returncode == 0 and not crashes, f"{fmt}: {crashes} (rc {done.returncode})\n{tail}"
    assert "Done" in done.stderr, tail


# -- memory: a small file must not make a parser hold gigabytes ----------------------------

def test_flight_recorder_gzip_bomb_is_refused_while_it_expands(monkeypatch: pytest.MonkeyPatch,
                                                               workdir: Path) -> None:
    from tracelake.ingest import flight_recorder

    monkeypatch.setattr(flight_recorder, "MAX_BYTES", 1 << 20)
    dump = json.dumps({"pg_config": {}, "pg_status": {}, "entries": [], "pad": " " * (8 << 20)}).encode()
    bomb = gzip.compress(dump)
    assert len(bomb) < 64 << 10
    path = workdir / "bomb" / "nccl_trace_rank_0"
    (path.parent / "staging").mkdir(parents=True)
    path.write_bytes(bomb)
    with pytest.raises(TracelakeError, match="nccl_trace_rank_0: expands to more than 1 MB"):
        ingest.parse_into(path, path.parent / "staging", ingest.ParseOptions(source_name=path.name))
