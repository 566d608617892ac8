"""Tests of the streaming Chrome-trace reader (tracelake.ingest.chrome_json).

The reader cuts the ``traceEvents`` array into batches at ``},{`` places and
checks each cut by decoding; these tests feed it documents in many shapes, in
random chunks and with tiny batch sizes (so that almost every cut is exercised),
and compare what it yields with a plain whole-document decode.
"""

from __future__ import annotations

import json
import re
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tracelake.contracts.errors import TraceFormatError
from tracelake.ingest.chrome_json import ChromeTraceReader

SOURCE = "rank-7.trace.json"


class Ev(msgspec.Struct):
    """A small event type: unknown keys (ts, pid, ...) are skipped by the decoder."""

    ph: str
    name: str = ""
    args: dict[str, Any] = {}


class Whole(msgspec.Struct):
    traceEvents: list[Ev]


class KinetoArgs(msgspec.Struct, frozen=True):
    """Kineto-style args: keys with spaces, renamed; a typed number."""

    external_id: int | float | str | None = msgspec.field(default=None, name="External id")


class KinetoEvent(msgspec.Struct):
    """Typed like a profiler parser would: ts kept as JSON text, args a struct."""

    ph: str
    name: str = ""
    ts: msgspec.Raw = msgspec.Raw(b"")
    args: KinetoArgs = KinetoArgs()


# -- helpers ---------------------------------------------------------------------------

def split(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)] or [b""]


def read_all(
    doc: bytes, *, batch_bytes: int = 64, chunk: int = 7, event_type: type = Ev, chunks: list[bytes] | None = None
) -> tuple[ChromeTraceReader, list[tuple[int, list, bytes]]]:
    """Run the reader over ``doc`` (in ``chunk``-byte pieces) and return it with every batch."""
    reader = ChromeTraceReader(
        chunks=iter(chunks if chunks is not None else split(doc, chunk)),
        event_type=event_type,
        source=SOURCE,
        batch_bytes=batch_bytes,
    )
    return reader, list(reader.batches())


def events_of(batches: list[tuple[int, list, bytes]]) -> list:
    return [e for _, events, _ in batches for e in events]


def read_error(doc: bytes, **kwargs: Any) -> TraceFormatError:
    with pytest.raises(TraceFormatError) as info:
        read_all(doc, **kwargs)
    message = str(info.value)
    assert message.startswith(f"{SOURCE}: "), message
    return info.value


def byte_offset(error: TraceFormatError) -> int:
    match = re.search(r"\bat byte (\d+)$", str(error))
    assert match, f"no byte offset in {str(error)!r}"
    return int(match.group(1))


def event(i: int, **extra: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 1, "tid": 1, "ts": 1000 + i, "dur": 1,
            "args": {"External id": i, "l": [{"x": 1}, {"y": 2}]}, **extra}


def trace(n: int, **kwargs: Any) -> bytes:
    """A Kineto-like document with ``n`` events, keys before and after the array."""
    doc = {"schemaVersion": 1, "distributedInfo": {"rank": 7}, "traceEvents": [event(i) for i in range(n)],
           "traceName": "x.json", "INFO": ["a", "b"]}
    return json.dumps(doc, **kwargs).encode()


def check_consistent(reader: ChromeTraceReader, batches: list[tuple[int, list, bytes]], doc: bytes) -> None:
    """Indices contiguous, batch JSON is the array text the events came from, counts right."""
    expected_first = 0
    for first, events, data in batches:
        assert first == expected_first
        expected_first += len(events)
        assert msgspec.json.decode(data, type=list[reader.event_type]) == events
        assert data.startswith(b"[") and data.endswith(b"]")
        assert data[1:-1] in doc
    assert reader.event_count == expected_first
    assert reader.json_bytes == len(doc)


# -- the property test -----------------------------------------------------------------

NASTY = [
    "},{", "}, {", "},\n{", "} ,{", '"', "\\", "\\\"", "]", "[", "}", "{", "],", "]}", "},", ",{",
    '"traceEvents": [', '"traceEvents":[',
    "é", "日本語", "\U0001f600", "\u2028", "\n", "\r\n", "\t", "\x00", "\x1f",
]
nasty_text = st.lists(st.one_of(st.sampled_from(NASTY), st.text(max_size=4)), max_size=4).map("".join)
# Top-level keys: anything but "traceEvents" (the array's own key); nested objects may use it too.
keys = nasty_text.filter(lambda k: k != "traceEvents")
nested_keys = st.one_of(keys, st.just("traceEvents"))
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False), nasty_text,
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(nested_keys, inner, max_size=3)),
    max_leaves=8,
)
args = st.one_of(
    st.just({"a": [{"x": 1}, {"y": 2}]}),
    st.dictionaries(nested_keys, json_values, max_size=4),
    st.builds(lambda d, v: {**d, "nested": [{"x": v}, {"y": [{"z": v}]}]},
              st.dictionaries(nested_keys, json_values, max_size=2), json_values),
)
events = st.lists(
    st.fixed_dictionaries(
        {"ph": st.one_of(st.sampled_from(["X", "i", "M", "C", "f", "s"]), nasty_text)},
        optional={"name": nasty_text, "args": args, "ts": st.integers(0, 10**15) | st.floats(0, 1e12),
                  "pid": st.integers(0, 10**6) | nasty_text, "extra": json_values},
    ),
    max_size=30,
)
top_level = st.dictionaries(keys, json_values, max_size=4)
FORMATS = [
    {"separators": (",", ":")},  # compact
    {},  # json.dumps default: ", " and ": "
    {"indent": 2},
    {"indent": "\t", "separators": (",", ": ")},
    {"indent": 1, "sort_keys": True},
]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(
    evs=events,
    before=top_level,
    after=top_level,
    info=st.lists(nasty_text, max_size=3),
    fmt=st.sampled_from(FORMATS),
    ensure_ascii=st.booleans(),
    lead=st.sampled_from(["", " ", "\n", "\r\n\t  \n"]),
    trail=st.sampled_from(["", "\n", " \n "]),
    repeat=st.integers(1, 20),
    batch_bytes=st.one_of(st.integers(64, 256), st.integers(64, 4096)),
    data=st.data(),
)
def test_batches_equal_a_whole_document_decode(
    evs: list[dict], before: dict, after: dict, info: list[str], fmt: dict, ensure_ascii: bool,
    lead: str, trail: str, repeat: int, batch_bytes: int, data: st.DataObject,
) -> None:
    evs = evs * repeat  # longer arrays, so that most documents are cut into several batches
    after = {k: v for k, v in after.items() if k not in before and k != "INFO"}
    if info:  # a list after the array, like Kineto's "INFO": [...]
        after["INFO"] = info
    doc_obj = {**before, "traceEvents": evs, **after}
    doc = (lead + json.dumps(doc_obj, ensure_ascii=ensure_ascii, **fmt) + trail).encode()
    # Chunks of one small size, or cut at random places (empty chunks included); either way
    # boundaries fall anywhere, even inside a UTF-8 character.
    size = data.draw(st.none() | st.integers(1, 128), label="chunk size")
    if size is not None:
        chunks = split(doc, size)
    else:
        cuts = sorted(data.draw(st.lists(st.integers(0, len(doc)), max_size=25), label="chunk cuts"))
        bounds = [0, *cuts, len(doc)]
        chunks = [doc[a:b] for a, b in zip(bounds, bounds[1:])]
    reader, batches = read_all(doc, batch_bytes=batch_bytes, chunks=chunks)

    whole = msgspec.json.decode(doc)  # keeps the document's key order
    assert events_of(batches) == msgspec.json.decode(doc, type=Whole).traceEvents
    check_consistent(reader, batches, doc)
    assert reader.event_count == len(evs)
    keys = list(whole)
    at = keys.index("traceEvents")
    assert reader.header == {k: whole[k] for k in keys[:at]}
    assert reader.tail == {k: whole[k] for k in keys[at + 1 :]}


# -- edge cases ------------------------------------------------------------------------

@pytest.mark.parametrize(
    "text", ['{"traceEvents": []}', '{"a": 1, "traceEvents": [ \n ], "b": [2]}', '{"traceEvents":[]}\n']
)
def test_empty_trace_events(text: str) -> None:
    reader, batches = read_all(text.encode())
    assert events_of(batches) == []
    assert reader.event_count == 0
    assert [(first, events) for first, events, _ in batches] in ([], [(0, [])])


def test_one_event() -> None:
    doc = b'{"traceEvents": [{"ph": "X", "name": "only", "args": {"a": [{"x": 1}, {"y": 2}]}}]}'
    reader, batches = read_all(doc, chunk=1)
    assert events_of(batches) == [Ev("X", "only", {"a": [{"x": 1}, {"y": 2}]})]
    assert reader.event_count == 1
    check_consistent(reader, batches, doc)


@pytest.mark.parametrize("fmt", [{"separators": (",", ":")}, {"indent": 2}])
def test_array_as_the_first_key(fmt: dict) -> None:
    doc = json.dumps({"traceEvents": [event(i) for i in range(50)], "displayTimeUnit": "ms",
                      "INFO": ["x]", "y"]}, **fmt).encode()
    reader, batches = read_all(doc)
    assert [e.name for e in events_of(batches)] == [f"op{i}" for i in range(50)]
    assert reader.tail["displayTimeUnit"] == "ms"
    assert reader.tail["INFO"] == ["x]", "y"]
    check_consistent(reader, batches, doc)


@pytest.mark.parametrize("fmt", [{"separators": (",", ":")}, {"indent": 2}])
def test_array_as_the_last_key(fmt: dict) -> None:
    doc = json.dumps({"schemaVersion": 1, "deviceProperties": [{"id": 0}],
                      "traceEvents": [event(i) for i in range(50)]}, **fmt).encode()
    reader, batches = read_all(doc)
    assert [e.name for e in events_of(batches)] == [f"op{i}" for i in range(50)]
    assert reader.header["schemaVersion"] == 1
    assert reader.header["deviceProperties"] == [{"id": 0}]
    assert reader.tail == {}
    check_consistent(reader, batches, doc)


@pytest.mark.parametrize("lead", [b" ", b"\n\n", b"\r\n\t \n", b"\n" * 5000])
def test_leading_whitespace(lead: bytes) -> None:
    doc = lead + trace(20)
    reader, batches = read_all(doc, chunk=13)
    assert len(events_of(batches)) == 20
    assert reader.header["schemaVersion"] == 1
    check_consistent(reader, batches, doc)


def test_event_bigger_than_batch_bytes() -> None:
    big = {"ph": "X", "name": "big" * 200, "args": {"l": [{"x": i} for i in range(20)]}}  # ~1.2 KB
    evs = [event(0), big, event(2), big, event(4)]
    doc = json.dumps({"traceEvents": evs}).encode()
    reader, batches = read_all(doc, batch_bytes=256, chunk=100)
    assert [e.name for e in events_of(batches)] == [e["name"] for e in evs]
    check_consistent(reader, batches, doc)


def test_kineto_event_type() -> None:
    """A typed event (args with renamed keys, Raw ts) through the reader."""
    doc = trace(200, indent=2)
    reader, batches = read_all(doc, batch_bytes=200, chunk=333, event_type=KinetoEvent)
    got = events_of(batches)
    assert [e.args.external_id for e in got] == list(range(200))
    assert [bytes(e.ts) for e in got] == [str(1000 + i).encode() for i in range(200)]
    assert reader.header["distributedInfo"] == {"rank": 7}
    assert reader.tail["INFO"] == ["a", "b"]
    check_consistent(reader, batches, doc)


@pytest.mark.parametrize("fmt", [{"separators": (",", ":")}, {"indent": 2}])
def test_raw_event_type(fmt: dict) -> None:
    """msgspec.Raw events (no decoding into objects) are the events' JSON text, in order."""
    evs = [event(i, name=f"}},{{ op{i} ]") for i in range(100)]
    doc = json.dumps({"schemaVersion": 1, "traceEvents": evs, "INFO": ["x"]}, **fmt).encode()
    reader, batches = read_all(doc, batch_bytes=100, chunk=61, event_type=msgspec.Raw)
    raws = events_of(batches)
    assert [msgspec.json.decode(r) for r in raws] == evs
    assert all(bytes(r) in doc for r in raws)
    assert reader.event_count == 100
    check_consistent(reader, batches, doc)


# Valid JSON that is hard to cut.

def test_event_much_bigger_than_batch_bytes() -> None:
    evs = [event(0), {"ph": "X", "name": "big" * 3000}, *(event(i) for i in range(2, 200))]
    doc = json.dumps({"traceEvents": evs}).encode()
    reader, batches = read_all(doc, batch_bytes=64, chunk=100)
    assert len(events_of(batches)) == 200


def test_events_with_many_nested_objects() -> None:
    evs = [{"ph": "X", "name": f"e{i}", "args": {"a": [{"x": j} for j in range(100)]}} for i in range(50)]
    doc = json.dumps({"traceEvents": evs}).encode()
    reader, batches = read_all(doc, batch_bytes=256, chunk=1000)
    assert len(events_of(batches)) == 50


def test_many_cut_look_alikes_after_the_last_event() -> None:
    doc = json.dumps({"traceEvents": [event(i) for i in range(5)], "tail": [{"x": i} for i in range(100)]}).encode()
    assert len(doc) > 16 * 64
    reader, batches = read_all(doc, batch_bytes=64, chunk=len(doc))
    assert len(events_of(batches)) == 5
    assert len(reader.tail["tail"]) == 100


@pytest.mark.parametrize("separators", [(" , ", " : "), ("\n,", ":")])
def test_whitespace_before_the_comma_between_events(separators: tuple[str, str]) -> None:
    doc = json.dumps({"traceEvents": [event(i) for i in range(40)]}, separators=separators).encode()
    reader, batches = read_all(doc, batch_bytes=64)
    assert len(events_of(batches)) == 40


def test_header_and_tail_hold_only_the_other_keys() -> None:
    reader, _ = read_all(trace(3))
    assert reader.header == {"schemaVersion": 1, "distributedInfo": {"rank": 7}}
    assert reader.tail == {"traceName": "x.json", "INFO": ["a", "b"]}


def test_nested_traceevents_key_in_the_header() -> None:
    doc = json.dumps({"meta": {"traceEvents": [1]}, "traceEvents": [event(0), event(1)]}).encode()
    reader, batches = read_all(doc)
    assert len(events_of(batches)) == 2
    assert reader.header["meta"] == {"traceEvents": [1]}


# -- errors ----------------------------------------------------------------------------

@pytest.mark.parametrize("where", ["after [", "mid event", "after a comma", "inside a string", "before ]"])
def test_truncated_inside_the_array(where: str) -> None:
    doc = trace(100)
    start = doc.index(b"[", doc.index(b'"traceEvents"')) + 1
    end = doc.rindex(b"]", 0, doc.index(b'"traceName"'))  # the array's closing bracket
    cut = {
        "after [": start,
        "mid event": doc.index(b'"ts": 1050'),
        "after a comma": doc.index(b'{"ph"', doc.index(b'"op60"')),
        "inside a string": doc.index(b'"op70"') + 3,
        "before ]": end,
    }[where]
    truncated = doc[:cut]
    error = read_error(truncated, batch_bytes=128)
    assert "ends inside the traceEvents array" in str(error)
    assert byte_offset(error) == len(truncated)


def test_truncated_after_a_bracket_inside_an_event() -> None:
    doc = b'{"traceEvents": [{"ph": "X", "args": {"a": [1]}}, {"ph": "X", "args": {"a": [1]}'
    error = read_error(doc)
    assert "ends inside the traceEvents array" in str(error)
    assert byte_offset(error) == len(doc)


@pytest.mark.parametrize("garbage", [b"@@", b"}", b",", b"{", b"x", b"]"])
@pytest.mark.parametrize("index", [0, 3, 150, 299])
@pytest.mark.parametrize("batch_bytes", [64, 1024, 1 << 20])
def test_invalid_json_in_the_events_reports_its_byte(garbage: bytes, index: int, batch_bytes: int) -> None:
    doc = trace(300)
    pos = doc.index(b'"name": "op%d"' % index)  # start of a key in the middle of an event
    bad = doc[:pos] + garbage + doc[pos:]
    error = read_error(bad, batch_bytes=batch_bytes, chunk=50)
    assert "invalid JSON" in str(error)
    assert pos <= byte_offset(error) <= pos + 2, (bad[pos - 20 : pos + 20], str(error))


def test_unbalanced_quote_reports_a_nearby_byte() -> None:
    doc = trace(300)
    pos = doc.index(b'"name": "op150"')
    bad = doc[:pos] + b'"' + doc[pos:]
    error = read_error(bad, batch_bytes=256)
    assert abs(byte_offset(error) - pos) <= 3, str(error)


@pytest.mark.parametrize("fmt", [{"separators": (",", ":")}, {"indent": 2}])
@pytest.mark.parametrize("array_last", [False, True])
def test_trailing_comma_after_the_last_event(fmt: dict, array_last: bool) -> None:
    evs = [event(i) for i in range(30)]
    obj = {"schemaVersion": 1, "traceEvents": evs} if array_last else {"traceEvents": evs, "INFO": ["a"]}
    doc = json.dumps(obj, **fmt).encode()
    end = doc.rindex(b"]", 0, doc.index(b'"INFO"')) if not array_last else doc.rindex(b"]")
    last = doc.rindex(b"}", 0, end) + 1  # end of the last event
    bad = doc[:last] + b"," + doc[last:]
    error = read_error(bad)
    assert "trailing comma after the last event" in str(error)
    assert byte_offset(error) == last
    assert bad[last : last + 1] == b","


@pytest.mark.parametrize("index", [0, 1, 37, 99])
@pytest.mark.parametrize("batch_bytes", [64, 1 << 20])
def test_wrongly_typed_field_names_the_event(index: int, batch_bytes: int) -> None:
    evs = [event(i) for i in range(100)]
    evs[index]["ph"] = 5
    doc = json.dumps({"traceEvents": evs}).encode()
    error = read_error(doc, batch_bytes=batch_bytes, event_type=KinetoEvent)
    message = str(error)
    assert f"traceEvents[{index}]" in message
    assert "'ph'" in message
    assert "Expected `str`, got `int`" in message


def test_wrongly_typed_arg_names_the_event_and_field() -> None:
    evs = [event(i) for i in range(60)]
    evs[42]["args"]["External id"] = [1]
    error = read_error(json.dumps({"traceEvents": evs}).encode(), batch_bytes=128, event_type=KinetoEvent)
    assert "traceEvents[42]" in str(error)
    assert "args.External id" in str(error)


def test_missing_required_field_names_the_event() -> None:
    evs = [event(i) for i in range(60)]
    del evs[17]["ph"]
    error = read_error(json.dumps({"traceEvents": evs}).encode(), batch_bytes=128, event_type=KinetoEvent)
    assert "traceEvents[17]" in str(error)
    assert "event has no 'ph'" in str(error)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (b'[{"ph": "X"}]', "a JSON array"),
        (b'\n  [{"ph": "X", "name": "traceEvents"}]', "a JSON array"),
        (b"hello, world", "not JSON"),
        (b"\x00\x01\x02 binary", "not JSON"),
        (b"   \n\t ", "only whitespace"),
        (b'{"a": [1, 2}', "invalid JSON"),
    ],
)
def test_not_a_trace_reports_byte(text: bytes, expected: str) -> None:
    error = read_error(text)
    assert expected in str(error)
    assert 0 <= byte_offset(error) <= len(text)


@pytest.mark.parametrize("text", [b'{"a": 1,', b'{"a": 1, "traceEvents"', b'{"a": {"b": [1, '])
def test_truncated_json_before_trace_events_reports_byte(text: bytes) -> None:
    error = read_error(text)
    assert "invalid JSON" in str(error)
    assert byte_offset(error) == len(text)


@pytest.mark.parametrize("text", [b'{"hello": 1}', b'{"traceEvents": {"a": 1}}', b'{"traceEvents": null}'])
def test_object_without_trace_events(text: bytes) -> None:
    # No position: the whole object was read and has no array (nothing to point at).
    error = read_error(text)
    assert 'without a "traceEvents" array' in str(error)


def test_garbage_after_the_object() -> None:
    doc = trace(5) + b"garbage"
    error = read_error(doc)
    assert "truncated" not in str(error)
    assert byte_offset(error) == len(trace(5))
