"""The C decoders of XPlane events (ingest/_xspace.c) against the numpy ones (ingest/xspace_events.py).

On random events and stats written by hand, damaged or not, the C decoders locate and decode what
the numpy ones do and find damage where they do; a parse gives the same tables with either. (Both
are checked against protobuf itself in tests/test_xspace_events.py.)
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from support import TPU_SAMPLE, len_field, varint
from test_xspace_events import _random_event
from tracelake.ingest import xspace_events

pytestmark = pytest.mark.skipif(not xspace_events.native(),
                                reason="the C decoders (ingest/_xspace.c) are not built here")


def _native_and_numpy(call: Any) -> tuple[Any, Any]:
    """``call(module)`` with the C decoders and with the numpy ones: each result, or the WireError raised."""
    from tracelake.ingest.protowire import WireError

    got = []
    for native in (xspace_events._native, None):
        try:
            with pytest.MonkeyPatch.context() as m:
                m.setattr(xspace_events, "_native", native)
                got.append(call())
        except WireError as exc:
            got.append(("error", str(exc), exc.offset))
    return got[0], got[1]


def _same(a: Any, b: Any) -> None:
    if isinstance(a, tuple) and a and a[0] == "error":
        assert a == b
        return
    for name in a.__dataclass_fields__:
        x, y = getattr(a, name), getattr(b, name)
        if isinstance(x, tuple):
            for u, v in zip(x, y, strict=True):
                assert u.dtype == v.dtype and u.tolist() == v.tolist(), name
        elif isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and x.tolist() == y.tolist(), name
        else:
            assert x == y, name


def _mutated(rng: random.Random, data: bytes) -> bytes:
    """``data`` with a few bytes changed, dropped or added (damage of every kind: lengths, tags, varints)."""
    out = bytearray(data)
    for _ in range(rng.randrange(4)):
        at = rng.randrange(len(out) + 1)
        kind = rng.randrange(3)
        if kind == 0 and at < len(out):
            out[at] = rng.choice([0x00, 0x22, 0x80, 0xFF, 0x0F, 0x3A, rng.randrange(256)])
        elif kind == 1 and at < len(out):
            del out[at]
        else:
            out[at:at] = bytes([rng.randrange(256)])
    return bytes(out)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), damaged=st.booleans())
def test_c_and_numpy_decoders_agree_on_random_bytes(seed: int, damaged: bool) -> None:
    """Events and stats written by hand, maybe damaged: the C decoders locate and decode what numpy's do, and
    find damage where they do (the error, from the numpy decoder, names the same byte)."""
    rng = random.Random(seed)
    events = [b"" if rng.random() < 0.05 else _random_event(rng, [1, 2, 3]) for _ in range(rng.randrange(1, 60))]
    raw = b"".join(len_field(4, e) for e in events) + rng.choice([b"", varint(9 << 3) + varint(5), b"\x22"])
    if damaged:
        raw = b"\x22" + _mutated(rng, raw[1:])
    data = xspace_events.padded(np.frombuffer(raw, dtype=np.uint8))
    size = rng.choice([len(raw), rng.randrange(1, len(raw) + 1)])
    native, reference = _native_and_numpy(lambda: xspace_events.find_events(data, size))
    _same(native, reference)
    events_native, events_reference = _native_and_numpy(
        lambda: xspace_events.event_fields(data, native.starts, native.ends))
    _same(events_native, events_reference)
    if isinstance(events_native, tuple):
        return
    who, starts, ends = events_native.stats
    stats = _native_and_numpy(lambda: xspace_events.stat_fields(data, who, starts, ends))
    _same(*stats)
    # Damage inside the stats' bodies, which the events' decoding does not look into.
    if len(starts):
        body = bytearray(raw)
        i = rng.randrange(len(starts))
        body[int(starts[i]):int(ends[i])] = _mutated(rng, raw[int(starts[i]):int(ends[i])])[: int(ends[i] - starts[i])]
        bent = xspace_events.padded(np.frombuffer(bytes(body), dtype=np.uint8))
        _same(*_native_and_numpy(lambda: xspace_events.stat_fields(bent, who, starts, ends)))


def test_a_parse_gives_the_same_tables_with_either_decoder(tmp_path: Path) -> None:
    """The TPU sample and a generated GPU profile (stats of every kind) parse to the same tables with the C and
    the numpy decoders."""
    import pyarrow.parquet as pq

    from tracelake import ingest
    from tracelake.sample_traces import generate_xla

    gpu = tmp_path / "gpu" / "gpu.xplane.pb"
    gpu.parent.mkdir()
    gpu.write_bytes(generate_xla.build_gpu(3, 40))
    for path in (TPU_SAMPLE, gpu):
        tables = []
        for native in (xspace_events._native, None):
            staging = tmp_path / f"{path.stem}-{native is not None}"
            staging.mkdir()
            with pytest.MonkeyPatch.context() as m:
                m.setattr(xspace_events, "_native", native)
                ingest.parse_into(path, staging, ingest.ParseOptions(source_name=path.name, trace_id="t"))
            tables.append({f.stem: pq.read_table(f) for f in sorted(staging.glob("*.parquet"))})
        assert tables[0].keys() == tables[1].keys() and tables[0]["device_ops"].num_rows > 0
        for name, table in tables[0].items():
            assert table.equals(tables[1][name]), (path.name, name)


def _random_stat(rng: random.Random) -> bytes:
    """An ``XStat`` holding none, one or several members of its value oneof, in any order, and unknown fields."""
    members = [
        lambda: varint(2 << 3 | 1) + rng.randbytes(8),
        lambda: varint(3 << 3) + varint(rng.randrange(1 << 64)),
        lambda: varint(4 << 3) + varint(-rng.randrange(1 << 40)),
        lambda: len_field(5, rng.randbytes(rng.randrange(12))),
        lambda: len_field(6, bytes([0x22]) * rng.randrange(5)),
        lambda: varint(7 << 3) + varint(rng.randrange(60)),
        lambda: varint(9 << 3 | 5) + rng.randbytes(4),  # unknown fixed32
        lambda: len_field(3, b"\x01"),  # a known number with another wire type: skipped
    ]
    fields = [varint(1 << 3) + varint(rng.randrange(1 << 20))] * rng.randrange(2)
    fields += [rng.choice(members)() for _ in range(rng.randrange(4))]
    rng.shuffle(fields)
    return b"".join(fields)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), damaged=st.booleans())
def test_c_and_numpy_stat_decoders_agree_on_random_stats(seed: int, damaged: bool) -> None:
    """Stats holding several value members (the last one written wins), maybe damaged: the same fields, or the
    same error."""
    rng = random.Random(seed)
    stats = [_random_stat(rng) for _ in range(rng.randrange(1, 80))]
    if damaged:
        i = rng.randrange(len(stats))
        stats[i] = _mutated(rng, stats[i])
    raw = b"".join(stats)
    data = xspace_events.padded(np.frombuffer(raw, dtype=np.uint8))
    ends = np.cumsum([len(s) for s in stats])
    starts = ends - [len(s) for s in stats]
    _same(*_native_and_numpy(lambda: xspace_events.stat_fields(data, np.arange(len(stats)), starts, ends)))
