"""Kineto batches cut without a check, checked by the scanner as it reads them (docs/formats.md, section 1).

The strict scan must vouch for exactly the batches the separate check vouches for (an independent
decoder, msgspec, stands behind both); a cut that falls inside a string, and any bad trace, must end
in the checked reading, with the tables and the error messages that reading gives.
"""

from __future__ import annotations

import gzip
import json
import random
import threading
from pathlib import Path

import msgspec
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support import SAMPLES, real_kineto_files
from tracelake import ingest
from tracelake.contracts.errors import TraceFormatError
from tracelake.ingest import kineto_scan, pytorch_profiler, pytorch_profiler_sql
from tracelake.ingest.chrome_json import ChromeTraceReader
from tracelake.ingest.model import ParseOptions
from tracelake.ingest.pytorch_profiler_sql import Abandoned, EventNumbering
from tracelake.ingest.source import BatchBuffers, DecodedStream, iter_chunks

pytestmark = pytest.mark.skipif(not kineto_scan.AVAILABLE, reason="the native Kineto scanner is not built")

TABLES = ("device_ops", "host_ops", "collectives", "steps", "counters", "memory_events", "devices")
_RAW = msgspec.json.Decoder(list[msgspec.Raw])


def outcome(data: bytes, strict: bool) -> tuple[str, object]:
    """What a scan of ``data`` gives: its rows, the error it names, or that it does not vouch for it."""
    try:
        scanned = kineto_scan.scan(data, 0, "b.json", strict=strict)
    except kineto_scan.Unvouched:
        return "unvouched", None
    except TraceFormatError as exc:
        return "error", str(exc)
    return "rows", {name: table.to_pylist() for name, table in scanned.tables.items()}


def vouched(data: bytes) -> bool:
    """The separate check vouches for ``data``, its elements are objects, and it is UTF-8: what a strict
    scan must then read (msgspec, the independent decoder, must agree with the check)."""
    count = kineto_scan.json_array_length(data)
    if count is None:
        return False
    values = _RAW.decode(data)
    assert len(values) == count
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return all(bytes(value).lstrip().startswith(b"{") for value in values)


SEED = json.dumps([
    {"ph": "X", "cat": "kernel", "name": "k\\n\u00e9", "pid": 0, "tid": "stream 7", "ts": 1.5, "dur": 2,
     "args": {"grid": [1, "2", [3]], "block": [4], "stream": "0x1", "correlation": 9, "nested": {"a": [{}]}}},
    {"ph": "X", "cat": "cpu_op", "name": "ProfilerStep#1", "pid": 1, "tid": 2, "ts": 0, "dur": 10,
     "args": {"Input Dims": [[1, 2.50]], "Input type": ["float"], "flag": True, "none": None}},
    {"ph": "i", "name": "[memory]", "ts": 3e0, "args": {"Total Allocated": -1, "Device Type": 1, "Device Id": 0}},
]).encode()


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, len(SEED) - 1), st.sampled_from(b'{}[]",:\\ 0-.eEtfnu\x01\xe9x')),
                max_size=4), st.integers(0, len(SEED)))
def test_the_strict_scan_vouches_exactly_where_the_check_does(edits: list[tuple[int, int]], cut: int) -> None:
    data = bytearray(SEED)
    for at, value in edits:
        data[at] = value
    batch = bytes(data[:cut]) if cut < len(SEED) else bytes(data)
    strict = outcome(batch, strict=True)
    assert (strict[0] != "unvouched") == vouched(batch)
    if strict[0] != "unvouched":  # where it reads, it reads as the scan of a checked batch does
        assert strict == outcome(batch, strict=False)


@pytest.mark.parametrize("depth", [60, 61, 62, 63, 64])
def test_nesting_is_vouched_for_as_deep_as_the_check_goes(depth: int) -> None:
    for where in ("event", "args"):
        value = "[" * depth + "]" * depth
        event = f'{{"ph": "X", "ts": 1, "dur": 1, "v": {value}}}' if where == "event" else (
            f'{{"ph": "X", "ts": 1, "dur": 1, "args": {{"v": {value}}}}}')
        batch = f"[{event}]".encode()
        assert (outcome(batch, strict=True)[0] != "unvouched") == vouched(batch), (depth, where)


def event(i: int, note: str) -> dict[str, object]:
    return {"ph": "X", "cat": "cpu_op", "name": f"op{i % 7}", "pid": 1, "tid": 1 + i % 3, "ts": 10 * i,
            "dur": 5 + i % 4, "args": {"note": note, "External id": i}}


def trace(path: Path, events: list[dict[str, object]]) -> Path:
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events, "displayTimeUnit": "ms"}))
    return path


def parse(path: Path, staging: Path, *, checked: bool, monkeypatch: pytest.MonkeyPatch, batch_bytes: int,
          on_bytes: object = None) -> tuple[str, object]:
    """Parse natively, with the unchecked cut first or (``checked``) the checked reading alone."""
    with monkeypatch.context() as patch:
        if checked:
            def refuse(*args: object, **kwargs: object) -> None:
                raise kineto_scan.Unvouched()
            patch.setattr(pytorch_profiler, "_scan_unchecked", refuse)
        staging.mkdir()
        options = ParseOptions(source_name=path.name, trace_id="t", kineto_engine="native", batch_bytes=batch_bytes,
                               on_bytes=on_bytes)  # type: ignore[arg-type]
        try:
            _, info = ingest.parse_into(path, staging, options)
        except TraceFormatError as exc:
            return "error", str(exc)
    tables = {}
    for name in TABLES:
        table = pq.read_table(staging / f"{name}.parquet")
        keys = [(c, "ascending") for c in ("event_id", "step", "name", "ts_ns", "device") if c in table.column_names]
        tables[name] = table.sort_by(keys).to_pylist()
    return "tables", (tables, info.event_count)


def test_a_cut_inside_a_string_reads_the_trace_again_with_the_check(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Notes that look like the gap between two events: some batches are cut inside them at first."""
    path = trace(tmp_path / "lookalikes.json", [event(i, "a}, {b" * (i % 5)) for i in range(400)])
    restarts = []
    restart = pytorch_profiler_sql.Normaliser.restart
    monkeypatch.setattr(pytorch_profiler_sql.Normaliser, "restart",
                        lambda self: (restarts.append(1), restart(self))[1])
    seen: list[int] = []
    fast = parse(path, tmp_path / "fast", checked=False, monkeypatch=monkeypatch, batch_bytes=1500,
                 on_bytes=seen.append)
    assert restarts, "no cut fell inside a string: the test no longer tests what it says"
    assert sum(seen) == path.stat().st_size  # the second reading does not count bytes twice
    assert fast == parse(path, tmp_path / "checked", checked=True, monkeypatch=monkeypatch, batch_bytes=1500)
    assert fast[0] == "tables" and fast[1][1] == 400  # type: ignore[index]
    events = json.loads(path.read_text())["traceEvents"]
    rows = fast[1][0]["host_ops"]  # type: ignore[index]
    assert [row["name"] for row in rows] == [e["name"] for e in events]


def test_every_batch_is_placed_after_the_ones_before_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = trace(tmp_path / "many.json", [event(i, "x" * (i % 40)) for i in range(3000)])
    with monkeypatch.context() as patch:
        patch.setattr(pytorch_profiler_sql.Normaliser, "restart", lambda self: pytest.fail("read twice"))
        fast = parse(path, tmp_path / "fast", checked=False, monkeypatch=monkeypatch, batch_bytes=4096)
    assert fast[0] == "tables"
    host = fast[1][0]["host_ops"]  # type: ignore[index]
    assert [row["event_id"] for row in host] == list(range(3000))
    assert [row["ts_ns"] for row in host] == [10_000 * i for i in range(3000)]
    assert fast == parse(path, tmp_path / "checked", checked=True, monkeypatch=monkeypatch, batch_bytes=4096)


GOOD = [event(i, "n") for i in range(60)]
TEXT = json.dumps({"traceEvents": GOOD, "deviceProperties": []}).encode()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(edits=st.lists(st.tuples(st.integers(0, len(TEXT) - 1), st.sampled_from(b'{}[]",:\\ 0-.xQ\xe9')),
                      min_size=1, max_size=3),
       batch_bytes=st.sampled_from([600, 2000, 1 << 20]))
def test_a_damaged_trace_reads_or_fails_as_the_checked_reading_does(
        edits: list[tuple[int, int]], batch_bytes: int, tmp_path_factory: pytest.TempPathFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    data = bytearray(TEXT)
    for at, value in edits:
        data[at] = value
    folder = tmp_path_factory.mktemp("damaged")
    path = folder / "damaged.json"
    path.write_bytes(bytes(data))
    fast = parse(path, folder / "fast", checked=False, monkeypatch=monkeypatch, batch_bytes=batch_bytes)
    assert fast == parse(path, folder / "checked", checked=True, monkeypatch=monkeypatch, batch_bytes=batch_bytes)


@pytest.mark.parametrize("seed", range(5))
def test_batches_learn_where_they_are_whatever_order_they_finish_in(seed: int) -> None:
    rng = random.Random(seed)
    counts = [rng.randrange(0, 50) for _ in range(40)]
    numbering = EventNumbering()
    firsts: dict[int, int] = {}
    order = list(range(len(counts)))
    rng.shuffle(order)

    def place(batch: int) -> None:
        firsts[batch] = numbering.place(batch, counts[batch])

    threads = [threading.Thread(target=place, args=(batch,)) for batch in order]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert firsts == {n: sum(counts[:n]) for n in range(len(counts))}
    assert numbering.total == sum(counts)


def test_a_failed_batch_abandons_only_the_ones_after_it() -> None:
    numbering = EventNumbering()
    results: dict[int, object] = {}

    def place(batch: int, count: int | None) -> None:
        try:
            results[batch] = numbering.place(batch, count)
        except Abandoned:
            results[batch] = "abandoned"

    # 2 fails, and still learns where it is (to name its event); 3 and 4 wait for it in vain
    waiting = [threading.Thread(target=place, args=args) for args in ((2, None), (3, 3), (4, 3))]
    for thread in waiting:
        thread.start()
    place(0, 5)
    place(1, 7)
    for thread in waiting:
        thread.join(timeout=10)
    assert not any(thread.is_alive() for thread in waiting)
    assert results == {0: 0, 1: 5, 2: 12, 3: "abandoned", 4: "abandoned"}
    with pytest.raises(Abandoned):
        numbering.place(5, 1)


TRACES = sorted(SAMPLES.glob("*/*.json.gz")) + real_kineto_files()


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.parent.name + "/" + p.name)
def test_every_trace_we_have_is_read_in_one_pass(trace: Path) -> None:
    """No batch of a real or sample trace needs the second, checked reading (else the gain silently
    vanishes), and the strict scan reads every event the separate check counts."""
    head = gzip.open(trace, "rb").read(1 << 16) if trace.suffix == ".gz" else trace.read_bytes()[: 1 << 16]
    if b"traceEvents" not in head:
        pytest.skip("not a Chrome trace object")
    events = 0
    buffers = BatchBuffers((1 << 20) + 2)
    with DecodedStream(trace) as stream:  # as the ingest reads it: cut in place (tests/test_cut_in_place.py)
        reader = ChromeTraceReader(stream.chunks(), msgspec.Raw, trace.name, batch_bytes=1 << 20,
                                   count_events=kineto_scan.json_array_length, fill=stream.readinto)
        for batch in reader.unchecked_batches(buffers):
            events += kineto_scan.scan(batch, 0, trace.name, strict=True).events
            buffers.give_back(batch)
    checked = ChromeTraceReader(iter_chunks(trace), msgspec.Raw, trace.name, batch_bytes=1 << 20,
                                count_events=kineto_scan.json_array_length)
    for _ in checked.batches():
        pass
    assert events == checked.event_count > 0
