"""The native scanner's column buffers (ingest/_kineto.c): handed to Arrow without a copy, and sized from the batch
before on the same thread without changing a value."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Callable
from typing import TypeVar

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracelake.ingest import kineto_scan

pytestmark = pytest.mark.skipif(not kineto_scan.AVAILABLE, reason="the native Kineto scanner is not built")

T = TypeVar("T")


def batch(seed: int, events: int, name_length: int) -> bytes:
    """A batch as the cutter makes it: kernels, CPU ops with shapes, memory instants and step marks, their mix and
    texts' lengths set by ``seed`` and ``name_length``, some fields missing (nulls)."""
    rng = random.Random(seed)
    rows: list[dict[str, object]] = []
    for n in range(events):
        kind = rng.choice(["kernel", "cpu_op", "memory", "step", "runtime"])
        name = "".join(rng.choice("abcdefgh_:") for _ in range(rng.randint(0, name_length)))
        if kind == "kernel":
            args: dict[str, object] = {"device": rng.randint(0, 7), "stream": rng.randint(1, 40),
                                       "correlation": n, "grid": [rng.randint(1, 99), 1, 1]}
            if rng.random() < 0.5:
                args["registers per thread"] = rng.randint(1, 255)
            rows.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": n * 3.5, "dur": 2.25,
                         "args": args})
        elif kind == "cpu_op":
            args = {"External id": n} if rng.random() < 0.7 else {}
            if rng.random() < 0.5:
                args["Input Dims"] = [[rng.randint(1, 64)] * rng.randint(0, 3)]
                args["Input type"] = ["float"]
            rows.append({"ph": "X", "cat": "cpu_op", "name": "aten::" + name, "pid": 1, "tid": rng.randint(1, 3),
                         "ts": n * 3.5, "dur": rng.randint(0, 9) / 4, "args": args})
        elif kind == "memory":
            rows.append({"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 2, "ts": n * 3.5,
                         "s": "t", "args": {"Device Id": rng.randint(-1, 3), "Device Type": rng.choice([0, 1]),
                                            "Addr": rng.randint(0, 1 << 40), "Bytes": rng.randint(-512, 512),
                                            "Total Allocated": rng.randint(0, 1 << 30)}})
        elif kind == "step":
            rows.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": 1, "tid": 1,
                         "ts": n * 3.5, "dur": 10})
        else:
            rows.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                         "ts": n * 3.5, "dur": 1, "args": {"correlation": n}})
    return json.dumps(rows).encode()


def on_fresh_thread(work: Callable[[], T]) -> T:
    """``work``'s result, run on a thread of its own: the scanner's sizes of the batch before are per thread."""
    out: list[T] = []
    thread = threading.Thread(target=lambda: out.append(work()))
    thread.start()
    thread.join()
    return out[0]


def test_the_columns_reach_arrow_without_a_copy() -> None:
    """The scanner hands over the very memory it wrote, read-only, and Arrow wraps it in place; the tables stay
    readable after the scanner's own result is gone."""
    data = batch(1, 400, 40)
    columns = kineto_scan._native().scan(data, 0, False)[0]
    handed = [c for cols in columns.values() for c in cols if c[2]]  # columns with rows
    assert handed
    for _, type_, _, _, valid, offsets, values, _, _, _ in handed:
        for buffer in (values, offsets if type_ in ("string", "list<int32>") else None, valid):
            if buffer is None or not len(memoryview(buffer)):
                continue
            assert not isinstance(buffer, bytes)
            view = memoryview(buffer)
            assert view.readonly
            wrapped = pa.py_buffer(buffer)
            assert wrapped.address == np.frombuffer(view, dtype=np.uint8).ctypes.data  # the same bytes, not a copy
            assert not wrapped.is_mutable
    scanned = kineto_scan.scan(data, 0, "buffers.json")
    expected = {name: table.to_pylist() for name, table in scanned.tables.items()}
    del columns, handed
    again = kineto_scan.scan(data, 0, "buffers.json")
    del again
    assert {name: table.to_pylist() for name, table in scanned.tables.items()} == expected
    assert len(expected["device"]) > 0 and len(expected["host"]) > 0 and len(expected["memory_events"]) > 0


@settings(max_examples=15, deadline=None)
@given(shapes=st.lists(st.tuples(st.integers(0, 2**16), st.integers(0, 600), st.sampled_from([0, 8, 200])),
                       min_size=2, max_size=5))
def test_sizes_carried_from_the_batch_before_change_no_value(shapes: list[tuple[int, int, int]]) -> None:
    """Batches of other sizes and mixes, one after the other on one thread (each sized from the one before: too
    large, too small, or a table the one before lacked), read exactly as each read alone on a fresh thread."""
    batches = [batch(*shape) for shape in shapes]

    def in_turn() -> list[dict[str, pa.Table]]:
        return [kineto_scan.scan(data, 0, "sizes.json").tables for data in batches]

    together = on_fresh_thread(in_turn)
    for data, tables in zip(batches, together, strict=True):
        alone = on_fresh_thread(lambda data=data: kineto_scan.scan(data, 0, "sizes.json").tables)
        assert tables.keys() == alone.keys()
        for name, table in alone.items():
            assert tables[name].equals(table), name
