"""Kineto batches cut in place: the file read straight into reused buffers (``source.DecodedStream.readinto``,
``source.BatchBuffers``) and each batch handed out as a view of its buffer
(``chrome_json.ChromeTraceReader.unchecked_batches`` with buffers).

The events a trace's batches hold must be the trace's events, in order, whatever the buffers' size, however
many batches are held at once, and whether or not a buffer holds a boundary at all: an independent decoder
(the standard library's ``json``, over the whole file) says what they are. A buffer comes back for reuse
only once its batch is given back.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import tracemalloc
from collections import deque
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.archives import plain_or_gzip
from tracelake import ingest
from tracelake.contracts.errors import TraceFormatError
from tracelake.ingest.chrome_json import ChromeTraceReader
from tracelake.ingest.source import BatchBuffers, DecodedStream, iter_chunks

_RAW = msgspec.json.Decoder(list[msgspec.Raw])

#: Texts of names and args that hold brackets, commas and long or non-ASCII runs, but nothing like a boundary.
_TEXTS = st.sampled_from(["]", "[", "{", "}", ",", "}]", ",{", '\\"', "x" * 300, "é", ""])
#: Texts that look like a boundary between events ("}", a comma, "{") where they sit inside a string.
_BOUNDARIES = st.sampled_from(["}, {", "},{", "} ,\n{", '\\"}, {'])


def _event(i: int, text: str, nested: bool) -> dict[str, object]:
    event: dict[str, object] = {"ph": "X", "name": f"op{i}{text}", "ts": i, "dur": 1, "pid": 1, "tid": 2}
    if nested:
        event["args"] = {"inner": {"deeper": [text, {"k": text}]}, "Input Dims": [[1, 2], []]}
    return event


def _trace_text(events: list[dict[str, object]], indent: int | None, tail: bool) -> bytes:
    trace: dict[str, object] = {"schemaVersion": 1, "deviceProperties": [{"id": 0}], "traceEvents": events}
    if tail:
        trace["displayTimeUnit"] = "ms"
        trace["baseTimeNanoseconds"] = 1
    return json.dumps(trace, indent=indent, ensure_ascii=False).encode()



VIEWS: list[bool] = []


def _cut(path: Path, batch_bytes: int, held: int) -> tuple[list[bytes], ChromeTraceReader[msgspec.Raw], int]:
    """The batches' texts as the in-place cut gives them, each read only when ``held`` later batches have been
    handed out (as the loaders hold them), then given back; and how many buffers were made. ``VIEWS`` says which
    batches were views of a buffer."""
    buffers = BatchBuffers(batch_bytes + 2)
    made = 0
    take = buffers.take

    def counting_take() -> bytearray:
        nonlocal made
        free = len(buffers._free)
        buffer = take()
        made += free == 0
        return buffer

    buffers.take = counting_take  # type: ignore[method-assign]
    texts: list[bytes] = []
    VIEWS.clear()
    waiting: deque[bytes | memoryview] = deque()
    with DecodedStream(path) as stream:
        reader = ChromeTraceReader(stream.chunks(64), msgspec.Raw, path.name, batch_bytes=batch_bytes,
                                   fill=stream.readinto)
        for batch in reader.unchecked_batches(buffers):
            VIEWS.append(isinstance(batch, memoryview))
            waiting.append(batch)
            while len(waiting) > held:
                done = waiting.popleft()
                texts.append(bytes(done))
                buffers.give_back(done)
        for done in waiting:
            texts.append(bytes(done))
            buffers.give_back(done)
    return texts, reader, made


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(_TEXTS, min_size=0, max_size=60), hidden=st.one_of(st.none(), st.tuples(st.integers(0, 60),
                                                                                              _BOUNDARIES)),
       nested=st.booleans(),
       indent=st.sampled_from([None, 0, 2]), tail=st.booleans(), compressed=st.booleans(),
       batch_bytes=st.integers(48, 3000), held=st.integers(0, 4))
def test_the_batches_hold_the_traces_events_in_order(
    tmp_path: Path, texts: list[str], hidden: tuple[int, str] | None, nested: bool, indent: int | None, tail: bool,
    compressed: bool, batch_bytes: int, held: int,
) -> None:
    if hidden is not None:
        texts = [*texts[:hidden[0]], hidden[1], *texts[hidden[0]:]]
    events = [_event(i, text, nested) for i, text in enumerate(texts)]
    text = _trace_text(events, indent, tail)
    path = plain_or_gzip(tmp_path / "trace.json", text, compressed)
    # A cut inside a string makes a batch the strict scan refuses, or a last batch that does not decode: the trace
    # is then read again with the check (tests/test_unchecked_cut.py). Only a string can hide a likely boundary.
    try:
        batches, reader, made = _cut(path, batch_bytes, held)
    except TraceFormatError:
        assert hidden is not None
        return
    decoded: list[object] = []
    for batch in batches:
        try:
            decoded += [json.loads(bytes(raw)) for raw in _RAW.decode(batch)]
        except msgspec.DecodeError:
            assert hidden is not None
            return
    whole = json.loads(text)
    assert decoded == whole["traceEvents"]
    assert reader.header == {k: v for k, v in whole.items() if k in ("schemaVersion", "deviceProperties")}
    assert reader.tail == {k: v for k, v in whole.items() if k in ("displayTimeUnit", "baseTimeNanoseconds")}
    assert reader.json_bytes == len(text)
    assert made <= held + 1  # a buffer is reused once its batch is given back, never before


def test_an_event_larger_than_a_buffer_is_cut_from_chunks(tmp_path: Path) -> None:
    small = [_event(i, "a", False) for i in range(60)]
    events = [*small, _event(60, "b" * 5000, True), *small]
    path = plain_or_gzip(tmp_path / "trace.json", _trace_text(events, None, True), False)
    batches, _, _ = _cut(path, 1024, 1)
    assert [json.loads(bytes(raw)) for batch in batches for raw in _RAW.decode(batch)] == events
    assert any(VIEWS) and not VIEWS[-1]  # in place until the large event, from chunks after it


def test_a_long_first_batch_after_the_header_is_cut_from_chunks(tmp_path: Path) -> None:
    """The header's read leaves most of a batch behind it: more than half a buffer is cut as from chunks."""
    events = [_event(i, "x" * 40, False) for i in range(400)]
    path = plain_or_gzip(tmp_path / "trace.json", _trace_text(events, 1, False), False)
    batches, _, made = _cut(path, 4096, 0)
    assert [json.loads(bytes(raw)) for batch in batches for raw in _RAW.decode(batch)] == events
    assert made == 1
    assert not VIEWS[0] and all(VIEWS[1:-1]) and len(batches) > 3


def test_a_buffer_comes_back_only_as_a_view_of_its_own_size() -> None:
    buffers = BatchBuffers(16)
    first = buffers.take()
    buffers.give_back(memoryview(first)[:5])
    assert buffers.take() is first
    buffers.give_back(b"[]")  # a batch cut from chunks
    buffers.give_back(memoryview(bytearray(8)))  # another size
    assert buffers.take() is not first and not buffers._free


@pytest.mark.parametrize("compressed", [False, True], ids=["plain", "gzip"])
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(size=st.integers(1, 200_000), view=st.integers(1, 70_000))
def test_readinto_fills_each_view_and_counts_every_byte_of_the_file(
    tmp_path: Path, compressed: bool, size: int, view: int
) -> None:
    content = bytes(range(256)) * (size // 256) + b"t" * (size % 256)
    path = plain_or_gzip(tmp_path / "trace.json", content, compressed)
    counted: list[int] = []
    buffer = memoryview(bytearray(view))
    read: list[bytes] = []
    with DecodedStream(path, on_bytes=counted.append) as stream:
        while n := stream.readinto(buffer):
            read.append(bytes(buffer[:n]))
    assert b"".join(read) == content
    assert all(len(piece) == view for piece in read[:-1])  # full but at the content's end
    assert sum(counted) == path.stat().st_size


def test_a_truncated_gzip_file_is_named_where_it_ends(tmp_path: Path) -> None:
    path = tmp_path / "trace.json.gz"
    whole = gzip.compress(b"{" + b'"a": 1, ' * 50_000 + b"}")
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(TraceFormatError, match="gzip stream ends early") as raised, DecodedStream(path) as stream:
        stream.readinto(memoryview(bytearray(1 << 20)))
    assert "trace.json.gz" in str(raised.value) and "compressed byte" in str(raised.value)


@pytest.mark.parametrize("compressed", [False, True], ids=["plain", "gzip"])
def test_the_content_id_is_the_sha256_of_the_decoded_content(tmp_path: Path, compressed: bool) -> None:
    content = b"".join(b"%d," % i for i in range(3_000_000))  # larger than one block of the hash
    path = plain_or_gzip(tmp_path / "trace.json", content, compressed)
    assert ingest.content_id(path) == hashlib.sha256(content).hexdigest()[: ingest.ID_DIGITS]
    assert b"".join(iter_chunks(path)) == content


@pytest.mark.parametrize("compressed", [False, True], ids=["plain", "gzip"])
def test_a_reader_read_to_its_end_keeps_no_text(tmp_path: Path, compressed: bool) -> None:
    """The ingest keeps the reader through the rest of its work for the header and tail: the last batch's text and
    the decompressor's blocks must not stay with it (they held 4-8 MiB through a trace's normalising)."""
    events = [_event(i, "x" * 200, True) for i in range(20_000)]
    path = plain_or_gzip(tmp_path / "trace.json", _trace_text(events, None, True), compressed)
    tracemalloc.start()
    try:
        buffers = BatchBuffers((1 << 20) + 2)
        with DecodedStream(path) as stream:
            reader = ChromeTraceReader(stream.chunks(), msgspec.Raw, path.name, batch_bytes=1 << 20,
                                       fill=stream.readinto)
            for batch in reader.unchecked_batches(buffers):
                buffers.give_back(batch)
        del buffers, batch
        kept = tracemalloc.get_traced_memory()[0]
        del reader, stream
        assert kept - tracemalloc.get_traced_memory()[0] < 256 << 10
    finally:
        tracemalloc.stop()
