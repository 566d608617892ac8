"""The bulk XPlane event decoders (ingest/xspace_events.py, in numpy and in C) against protobuf's own decoding.

Event batches decoded in bulk equal protobuf's ``XLine`` decoding, on the TPU sample, the real XLA
profiles and random lines (in whole lines and in read windows of any size); varints of every length;
damaged events name the file and the byte. Every test here runs with each decoder (the ``engine``
fixture); tests/test_xspace_native.py compares the two directly.
"""

from __future__ import annotations

import itertools
import random
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support import TPU_SAMPLE, len_field, real_xplanes, varint
from tracelake.ingest import xspace_events
from tracelake.ingest.xspace import Space

ENGINES = ["native", "numpy"]


@pytest.fixture(autouse=True, params=ENGINES)
def engine(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test with the C decoders (skipped where they are not built) and with the numpy ones."""
    if request.param == "numpy":
        monkeypatch.setattr(xspace_events, "_native", None)
    elif not xspace_events.native():
        pytest.skip("the C decoders (ingest/_xspace.c) are not built here")
    return str(request.param)


def _random_value(rng: random.Random) -> int:
    """Values whose varints take 1 to 10 bytes, with 0x22 bytes (event tags) turning up inside them."""
    kind = rng.random()
    if kind < 0.1:
        return -rng.randrange(1, 1 << 62)  # 10 bytes
    if kind < 0.2:
        return rng.choice([0, 0x22, 0x22 << 7 | 0x22, 0x2222_2222_2222, (1 << 63) - 1])
    return rng.randrange(0, 1 << rng.choice([7, 14, 21, 35, 49, 56, 63]))


def _random_event(rng: random.Random, stat_ids: list[int]) -> bytes:
    """An XEvent written by hand: fields in any order, some repeated or missing, unknown fields, stats."""
    fields: list[bytes] = []
    for number in (1, 2, 3, 5):
        for _ in range(rng.choice([0, 1, 1, 1, 2])):  # absent, once, or twice (the last one counts)
            fields.append(varint(number << 3) + varint(_random_value(rng)))
    for _ in range(rng.choice([0, 0, 1, 3])):
        stat = varint(1 << 3) + varint(rng.choice(stat_ids))
        kind = rng.randrange(4)
        if kind == 0:
            stat += varint(4 << 3) + varint(_random_value(rng))
        elif kind == 1:
            stat += varint(2 << 3 | 1) + struct.pack("<d", rng.random())
        elif kind == 2:
            stat += len_field(6, bytes(rng.choice([0x22, 0x05, 0x08, 0xFF, 0x41]) for _ in range(rng.randrange(30))))
        else:
            stat += varint(7 << 3) + varint(rng.choice(stat_ids))
        fields.append(len_field(4, stat))
    for _ in range(rng.choice([0, 0, 1, 2])):  # unknown fields: skipped
        kind = rng.randrange(4)
        number = rng.choice([6, 9, 15, 16, 2000])
        if kind == 0:
            fields.append(varint(number << 3) + varint(_random_value(rng)))
        elif kind == 1:  # a fake event tag and length inside, so that a false event chain starts here
            fields.append(len_field(number, b"\x22\x03\x08\x01\x22" * rng.randrange(4) + bytes(rng.randrange(9))))
        elif kind == 2:
            fields.append(varint(number << 3 | 1) + bytes([0x22]) * 8)
        else:
            fields.append(varint(number << 3 | 5) + bytes([0x22, 0x02, 0x22, 0x00]))
    rng.shuffle(fields)
    return b"".join(fields)


def _random_line(rng: random.Random, events: int) -> bytes:
    """An XLine: header fields before, between and after events; some events empty (zero length)."""
    parts = [varint(1 << 3) + varint(rng.randrange(1 << 20)), len_field(2, b"XLA Ops"),
             varint(3 << 3) + varint(rng.randrange(1 << 40))]
    for i in range(events):
        parts.append(len_field(4, b"" if rng.random() < 0.05 else _random_event(rng, [1, 2, 3])))
        if i % 97 == 50:
            parts.append(varint(9 << 3) + varint(rng.randrange(1 << 30)))  # duration_ps between events
    parts.append(len_field(11, b"XLA Ops"))
    return b"".join(parts)


def _space_with_line(tmp_path: Path, line: bytes) -> Path:
    """An XSpace file with one TPU plane holding ``line`` (and stat metadata for the random stats)."""
    from tracelake.ingest.xplane_proto import XPlaneHeader

    header = XPlaneHeader(id=1, name="/device:TPU:0")
    for sid in (1, 2, 3):
        header.stat_metadata[sid].id = sid
        header.stat_metadata[sid].name = f"stat{sid}"
    header.event_metadata[1].name = "op"
    plane = header.SerializeToString() + len_field(3, line)
    path = tmp_path / "random.xplane.pb"
    path.write_bytes(len_field(1, plane))
    return path


def _batches(space: Space, plane: Any, ahead: bool) -> Iterator[Any]:
    """The plane's batches as read in place, or ``ahead``: decoded on :meth:`Space.decoded`'s thread (every other
    line, so that both ways of decoding meet)."""
    if not ahead:
        return space.batches(plane)
    picked = itertools.count()
    return space.decoded(plane, lambda batch: next(picked) % 2 == 0, stats=True)


def _assert_batches_match_protobuf(path: Path, ahead: bool = False) -> int:
    """Every plane's line runs, decoded in bulk, equal protobuf's ``XLine`` decoding of the same lines."""
    from tracelake.ingest.xplane_proto import XLine, XStat

    checked = 0
    with Space(path, path.name) as space:
        for plane in space.planes:
            fast: list[tuple[int, int, int, int, list[bytes]]] = []
            names = []
            for batch in _batches(space, plane, ahead):
                names.append(str(batch.header.name))
                f = batch.fields()
                who, starts, ends = f.stats
                stats: list[list[bytes]] = [[] for _ in range(len(batch))]
                for w, s, e in zip(who.tolist(), starts.tolist(), ends.tolist(), strict=True):
                    stats[w].append(XStat.FromString(batch.data[s:e].tobytes()).SerializeToString())
                fast += [(int(a), int(b), int(c), int(d), st) for a, b, c, d, st in zip(
                    f.metadata_id, f.offset_ps, f.duration_ps, f.num_occurrences, stats, strict=True)]
            slow = []
            for start, end in plane.line_ranges:
                line = XLine.FromString(path.read_bytes()[start:end])
                slow += [(e.metadata_id, e.offset_ps, e.duration_ps, e.num_occurrences,
                          [s.SerializeToString() for s in e.stats]) for e in line.events]
                assert str(line.name) in names or not line.events
            assert fast == slow, plane.name
            checked += len(slow)
    return checked


def test_bulk_event_decoder_matches_protobuf_on_the_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    from tracelake.ingest import xspace

    paths = [TPU_SAMPLE, *real_xplanes()]
    for chunk in (1 << 30, 700):  # whole lines, then windows of 700 bytes
        monkeypatch.setattr(xspace, "LINE_CHUNK_BYTES", chunk)
        for path in paths:
            assert _assert_batches_match_protobuf(path) > 0
            assert _assert_batches_match_protobuf(path, ahead=True) > 0


@settings(max_examples=6, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), one_sweep=st.booleans(), small_window=st.integers(1, 64))
def test_bulk_event_decoder_matches_protobuf_on_random_lines(
    seed: int, one_sweep: bool, small_window: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tracelake.ingest import xspace, xspace_events

    rng = random.Random(seed)  # the line is drawn from a seed: thousands of choices, more than hypothesis draws well
    path = _space_with_line(tmp_path, _random_line(rng, 400))
    with monkeypatch.context() as m:
        if one_sweep:  # a sweep of one round: false event chains are then left to the chain walk
            m.setattr(xspace_events, "SWEEP_ROUNDS", 1)
        for chunk in (1 << 30, small_window, 1000):  # a window smaller than an event is widened to it
            m.setattr(xspace, "LINE_CHUNK_BYTES", chunk)
            assert _assert_batches_match_protobuf(path) == 400
            assert _assert_batches_match_protobuf(path, ahead=True) == 400


def test_varints_of_every_length_match_protobuf() -> None:
    from tracelake.ingest import xspace_events

    values = [0, 0x22, *[(1 << 7 * k) - 1 for k in range(1, 10)], *[1 << 7 * k for k in range(1, 9)], -1, -(1 << 40)]
    data = b"".join(varint(v) for v in values)
    buf = xspace_events.padded(np.frombuffer(data, dtype=np.uint8))
    starts = np.cumsum([0] + [len(varint(v)) for v in values[:-1]])
    decoded, after, ok = xspace_events.varints(buf, starts, len(data))
    assert decoded.view(np.int64).tolist() == values and ok.all()
    assert after.tolist() == [*starts[1:].tolist(), len(data)]
    assert sorted({len(varint(v)) for v in values}) == list(range(1, 11))


@pytest.mark.parametrize(("damage", "reason", "offset"), [
    (b"\x22\x03\x10\xff\xff", "truncated varint", 3),  # offset_ps cut short inside its event
    (b"\x22\x10\x08\x01", "runs past the end", 0),  # an event longer than its line
    (b"\x22\x02\x12\x05", "runs past the end", 2),  # a field longer than its event
    (b"\x22\x01\x00", "field number 0", 2),
    (b"\x22\xff\xff", "truncated varint", 1),  # the event's length cut short
    (b"\x22\x0b\x10" + b"\xff" * 10, "longer than 10 bytes", 3),
])
@pytest.mark.parametrize("window", [1 << 20, 4])
def test_damaged_events_name_the_file_and_byte(
    damage: bytes, reason: str, offset: int, window: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read in place or decoded ahead, in one window or in windows of 4 bytes (an event each): the same error, after
    the same good events."""
    from tracelake.contracts.errors import TraceFormatError
    from tracelake.ingest import xspace

    monkeypatch.setattr(xspace, "LINE_CHUNK_BYTES", window)
    good = len_field(4, b"\x08\x01\x10\x02\x18\x03")
    line = len_field(2, b"XLA Ops") + good * 3
    path = _space_with_line(tmp_path, line + damage)
    at = path.read_bytes().index(line + damage) + len(line) + offset
    seen = {}
    for ahead in (False, True):
        seen[ahead] = 0
        with Space(path, path.name) as space, pytest.raises(TraceFormatError) as caught:
            for plane in space.planes:
                for batch in _batches(space, plane, ahead):
                    seen[ahead] += len(batch.fields().metadata_id)
        assert caught.value.source == "random.xplane.pb"
        assert reason in str(caught.value) and caught.value.where == f"byte {at}", str(caught.value)
    assert seen[True] == seen[False] <= 3
    if window > len(line):  # one window: the damaged event is found inside it
        assert seen[False] == 0


def test_a_reader_stopping_early_stops_the_decoding_thread() -> None:
    """Leaving :meth:`Space.decoded` part way (a ``break``, an error in the caller) ends its thread at once."""
    with Space(TPU_SAMPLE, TPU_SAMPLE.name) as space:
        plane = next(p for p in space.planes if p.line_ranges)
        batches = space.decoded(plane, lambda batch: True, stats=False)
        first = next(batches)
        assert len(first.fields().metadata_id) == len(first)
        assert any(t.name == "tracelake-xspace-decode" for t in threading.enumerate())
        batches.close()
        assert not any(t.name == "tracelake-xspace-decode" for t in threading.enumerate())


def test_rounds_of_one_field_in_all_or_some_events_match_protobuf(tmp_path: Path) -> None:
    """Events with the same fields in the same order (each round reads one field of every event, or of those
    not done yet) decode as protobuf decodes them, with a varint of every length in each field."""
    rng = random.Random(7)
    events = []
    for i in range(300):
        numbers = (1, 2, 3) if i % 3 else (1, 2)  # a third stop one field early: the last round reads the others
        events.append(b"".join(varint(n << 3) + varint(_random_value(rng)) for n in numbers))
    line = len_field(2, b"XLA Ops") + b"".join(len_field(4, event) for event in events)
    assert _assert_batches_match_protobuf(_space_with_line(tmp_path, line)) == 300


def test_stat_values_written_twice_keep_the_last_as_protobuf_does() -> None:
    """An ``XStat`` holding several members of its value oneof: the one written last wins, whatever its kind."""
    from tracelake.ingest import xspace_events
    from tracelake.ingest.xplane_proto import XStat

    members = {
        2: lambda v: varint(2 << 3 | 1) + struct.pack("<d", v / 7),
        3: lambda v: varint(3 << 3) + varint(v),
        4: lambda v: varint(4 << 3) + varint(-v),
        5: lambda v: len_field(5, b"s%d" % v),
        6: lambda v: len_field(6, b"\x22b%d" % v),
        7: lambda v: varint(7 << 3) + varint(v),
    }
    rng = random.Random(11)
    stats = [varint(1 << 3) + varint(9)]  # no value at all
    for _ in range(400):
        chosen = [rng.choice(list(members)) for _ in range(rng.randrange(1, 4))]
        stats.append(varint(1 << 3) + varint(rng.randrange(1, 50))
                     + b"".join(members[k](rng.randrange(1, 1 << 40)) for k in chosen))
    data = b"".join(stats)
    buf = xspace_events.padded(np.frombuffer(data, dtype=np.uint8))
    ends = np.cumsum([len(s) for s in stats])
    starts = ends - [len(s) for s in stats]
    got = xspace_events.stat_fields(buf, np.arange(len(stats)), starts, ends)
    fields = {"double_value": 2, "uint64_value": 3, "int64_value": 4, "str_value": 5, "bytes_value": 6,
              "ref_value": 7}
    for i, raw in enumerate(stats):
        stat = XStat.FromString(raw)
        which = stat.WhichOneof("value")
        assert got.kind[i] == (fields[which] if which else xspace_events.STAT_NONE), i
        assert got.metadata_id[i] == stat.metadata_id
        if which in ("str_value", "bytes_value"):
            value = getattr(stat, which)
            assert data[got.start[i]:got.end[i]] == (value.encode() if isinstance(value, str) else value)
        elif which == "double_value":
            assert got.value[i:i + 1].view(np.float64)[0] == stat.double_value
        elif which is not None:
            assert int(got.value[i]) == getattr(stat, which) % (1 << 64)


def test_a_damaged_event_ends_the_decoding_thread_with_the_parse(tmp_path: Path) -> None:
    """The parser meets the damage on its own thread (the decoding thread leaves bytes it cannot decode to it) and
    raises; the decoding thread is gone when the error reaches the caller, not whenever the garbage is collected."""
    from tracelake import ingest
    from tracelake.contracts.errors import TraceFormatError

    good = len_field(4, b"\x08\x01\x10\x02\x18\x03")
    line = len_field(2, b"XLA Ops") + good * 200 + b"\x22\x03\x10\xff\xff" + good * 200
    path = _space_with_line(tmp_path, line)
    staging = tmp_path / "staging"
    staging.mkdir()
    with pytest.raises(TraceFormatError, match="truncated varint") as caught:
        ingest.parse_into(path, staging, ingest.ParseOptions(source_name=path.name, trace_id="t"))
    assert caught.value.source == "random.xplane.pb"
    assert not any(t.name.startswith("tracelake-xspace-decode") for t in threading.enumerate())

