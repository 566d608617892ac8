"""The native strict JSON check the batch cutter uses instead of msgspec (ingest/_json_check.c).

It may only vouch for what msgspec accepts, with the same element count; what it refuses goes to
msgspec, so errors are unchanged. Checked against msgspec itself (an independent decoder) on
generated JSON, on random damage to real-shaped batches, and on every trace we have.
"""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tracelake.contracts.errors import TraceFormatError
from tracelake.ingest import kineto_scan
from tracelake.ingest.chrome_json import ChromeTraceReader

pytestmark = pytest.mark.skipif(not kineto_scan.AVAILABLE, reason="the native Kineto scanner is not built")

ROOT = Path(__file__).resolve().parent.parent
REAL = ROOT.parent / "shared" / "real_traces" / "pytorch_profiler"
TRACES = sorted(ROOT.glob("sample_traces/**/*.json*")) + sorted(REAL.glob("**/*.json*"))
_RAW = msgspec.json.Decoder(list[msgspec.Raw])


def msgspec_count(data: bytes) -> int | None:
    try:
        return len(_RAW.decode(data))
    except (msgspec.DecodeError, RecursionError):
        return None


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(json_values, max_size=8), st.booleans(), st.booleans())
def test_valid_arrays_are_counted_as_msgspec_counts(values: list, indent: bool, ascii_only: bool) -> None:
    data = json.dumps(values, indent=2 if indent else None, ensure_ascii=ascii_only).encode()
    assert msgspec_count(data) == len(values)
    if b"\\ud" in data.lower():  # an escaped surrogate pair: left to msgspec, which checks the pairing
        assert kineto_scan.json_array_length(data) in (None, len(values))
    else:
        assert kineto_scan.json_array_length(data) == len(values)


@pytest.mark.parametrize("data", [
    b'[{"a":1x}]', b'[{"a":tru}]', b'[{"a":"\\q"}]', b'[{"a":01}]', b'[{"a" 1}]', b'[{"a":1,}]', b'[1,]',
    b'[1.]', b'[.5]', b'[1e]', b'[-]', b'[+1]', b'[Infinity]', b'[NaN]', b'[\x0c1]', b'["a\x01"]',
    b'["\\ud800"]', b'["\\udc00x"]', b'["\\u00G9"]', b'[1]\x00', b'[1 2]', b'[', b'', b'{}', b'[{"a":1]',
    b'[' * 70 + b']' * 70, b'["abc', b'[{"a":1}',
])
def test_what_msgspec_refuses_is_not_vouched_for(data: bytes) -> None:
    assert kineto_scan.json_array_length(data) is None


@pytest.mark.parametrize("data, count", [
    (b"[]", 0), (b" [ ] ", 0), (b'[{"a": "\\u00e9\\n\\"x\\\\"}]', 1), (b"[1E+2, -0, 0.5e-3, true, false, null]", 6),
    (b'["\xff\xfe"]', 1), (b'[{"a": 1, "a": 2}]', 1), (b"[" * 60 + b"]" * 60, 1), (b'["' + b"x" * 1000 + b'"]', 1),
])
def test_edge_cases_counted(data: bytes, count: int) -> None:
    assert kineto_scan.json_array_length(data) == count == msgspec_count(data)


def _batch(trace: Path) -> bytes:
    raw = gzip.open(trace, "rb").read() if trace.suffix == ".gz" else trace.read_bytes()
    document = msgspec.json.decode(raw)
    events = document["traceEvents"] if isinstance(document, dict) else document
    return json.dumps(events[:400], indent=1).encode()


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_damaged_batches_are_vouched_for_only_when_msgspec_accepts(data: st.DataObject) -> None:
    """Random byte damage to a real-shaped batch: never vouched for where msgspec refuses it; same count."""
    kineto = [t for t in TRACES if "kineto" in str(t) or "pytorch" in str(t)] or TRACES
    base = bytearray(_cached_batch(data.draw(st.sampled_from(kineto[:6]))))
    rng = random.Random(data.draw(st.integers(0, 2**32)))
    for _ in range(data.draw(st.integers(1, 3))):
        at = rng.randrange(len(base))
        action = rng.choice(("delete", "insert", "replace"))
        byte = rng.choice(b'{}[]",:\\ 0123456789eE.-+tfnul\x00\x1f\xc3')
        if action == "delete":
            del base[at]
        elif action == "insert":
            base.insert(at, byte)
        else:
            base[at] = byte
    damaged = bytes(base)
    vouched = kineto_scan.json_array_length(damaged)
    if vouched is not None:
        assert msgspec_count(damaged) == vouched


_BATCHES: dict[Path, bytes] = {}


def _cached_batch(trace: Path) -> bytes:
    if trace not in _BATCHES:
        _BATCHES[trace] = _batch(trace)
    return _BATCHES[trace]


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.parent.name + "/" + p.name)
def test_every_trace_we_have_takes_the_fast_path(trace: Path) -> None:
    """The check vouches for every real and sample trace's events (else the speed-up would silently vanish)."""
    raw = gzip.open(trace, "rb").read() if trace.suffix == ".gz" else trace.read_bytes()
    document = msgspec.json.decode(raw)
    if not isinstance(document, dict) or "traceEvents" not in document:
        pytest.skip("not a Chrome trace object")
    data = msgspec.json.encode(document["traceEvents"])
    assert kineto_scan.json_array_length(data) == len(document["traceEvents"])


def _read(text: bytes, checked: bool, batch_bytes: int = 64) -> list[tuple[int, int, bytes]] | str:
    reader = ChromeTraceReader(iter([text]), msgspec.Raw, "t.json", batch_bytes=batch_bytes,
                               count_events=kineto_scan.json_array_length if checked else None)
    try:
        return [(first, len(events), data) for first, events, data in reader.batches()]
    except TraceFormatError as exc:
        return str(exc)


@pytest.mark.parametrize("text", [
    b'{"traceEvents": [{"ph": "X", "name": "a"}, {"ph": "X", "name": "b\\"},"}, {"ph": "i"}]}',
    b'{"traceEvents": [{"ph": "X"}, {"ph": "X", "ts": 01}, {"ph": "i"}]}',
    b'{"traceEvents": [{"ph": "X"}, {"ph": "X", "args": {"a": [1, 2,]}}]}',
    b'{"traceEvents": [{"ph": "X"}, {"ph": "X", "name": "\\ud800"}]}',
    b'{"traceEvents": [{"ph": "X"},, {"ph": "X"}]}',
    b'{"traceEvents": [{"ph": "X"}, {"ph": "X"}',
    b'{"traceEvents": [' + b", ".join(b'{"ph": "X", "name": "e%d", "args": {"k": [1, {"z": null}]}}' % i
                                       for i in range(50)) + b"]}",
])
@pytest.mark.parametrize("batch_bytes", [16, 64, 4096])
def test_reader_batches_and_errors_are_the_same_with_the_check(text: bytes, batch_bytes: int) -> None:
    assert _read(text, True, batch_bytes) == _read(text, False, batch_bytes)
