"""Host lines of XLA profiles decoded in bulk (ingest/xla_host.py) give the tables of the one-event-at-a-time path."""

from __future__ import annotations

import random
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from support import REAL_TRACES, ROOT, len_field, varint
from tracelake import ingest
from tracelake.contracts.errors import TraceFormatError
from tracelake.ingest import xla_host, xspace

REAL_XLA = REAL_TRACES / "xla"
SAMPLE_XLA = ROOT / "sample_traces" / "xla"
JAX_CPU = REAL_XLA / "jax_cpu_4dev" / "vm.xplane.pb"


def _xplanes(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.rglob("*") if p.name.endswith((".xplane.pb", ".xplane.pb.gz")))


def _parse(path: Path, staging: Path) -> tuple[ingest.TraceInfo, dict[str, pl.DataFrame]]:
    staging.mkdir(parents=True)
    _, info = ingest.parse_into(path, staging, ingest.ParseOptions(source_name=path.name, trace_id="0" * 20))
    return info, {p.stem: pl.read_parquet(p) for p in sorted(staging.glob("*.parquet"))}


def _parse_both(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, pl.DataFrame]:
    """Parse ``path`` with the bulk host path and with the one-by-one path; assert every table (and the trace facts)
    agree and that the bulk path decoded events; the bulk path's tables."""
    decoded = []
    bulk_columns = xla_host.HostLines.host_columns

    def counting(self: Any, *args: Any) -> Any:
        done = bulk_columns(self, *args)
        if done is not None and done[0]:
            decoded.append(len(done[0]["event_id"]))
        return done

    def refuse(*_: object) -> None:
        raise TraceFormatError("test", "the bulk path is off")

    with monkeypatch.context() as m:
        m.setattr(xla_host.HostLines, "host_columns", counting)
        bulk_info, bulk = _parse(path, tmp_path / "bulk")
    with monkeypatch.context() as m:
        m.setattr(xla_host.HostLines, "host_columns", refuse)
        slow_info, slow = _parse(path, tmp_path / "slow")
    assert sum(decoded) > 0, "no host events went through the bulk path"
    assert (bulk_info.event_count, bulk_info.start_ns, bulk_info.end_ns, bulk_info.warnings) == \
        (slow_info.event_count, slow_info.start_ns, slow_info.end_ns, slow_info.warnings)
    assert sorted(bulk) == sorted(slow)
    for name, table in slow.items():
        assert table.equals(bulk[name]), (path.name, name)
    assert bulk["host_ops"].height > 0
    return bulk


def _generated(tmp_path: Path, kind: str) -> Path:
    from tracelake.sample_traces import generate_xla

    path = tmp_path / kind / "host0.xplane.pb"
    path.parent.mkdir()
    path.write_bytes(generate_xla.build_gpu(3, 40, 2) if kind == "gpu" else generate_xla.build(4, 20))
    return path


@pytest.mark.parametrize("window", [1 << 20, 700])
@pytest.mark.parametrize("source", ["gpu", "tpu", *_xplanes(SAMPLE_XLA),
                                    *(pytest.param(p, marks=pytest.mark.slow) for p in _xplanes(REAL_XLA))],
                         ids=lambda s: s if isinstance(s, str) else f"{s.parent.name}/{s.name}")
def test_host_lines_decode_in_bulk_as_one_by_one(source: str | Path, window: int, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Every table equal, event ids included, whole lines or lines read in windows of 700 bytes."""
    monkeypatch.setattr(xspace, "LINE_CHUNK_BYTES", window)
    monkeypatch.setattr(xla_host, "HOST_FLUSH_ROWS", 300)
    path = _generated(tmp_path, source) if isinstance(source, str) else source
    tables = _parse_both(path, tmp_path, monkeypatch)
    if source == "gpu":  # a launch per kernel, each with its kernel's correlation id
        launches = tables["host_ops"].filter(pl.col("name").str.starts_with("cu"))
        kernels = tables["device_ops"].filter(pl.col("correlation").is_not_null())
        assert launches.height == kernels.height > 0
        assert sorted(launches["correlation"].to_list()) == sorted(kernels["correlation"].to_list())


def test_no_real_xla_traces_skips() -> None:
    if not REAL_XLA.is_dir():
        pytest.skip("../shared/real_traces/xla is not present")
    assert _xplanes(REAL_XLA)


def test_cpu_backend_ops_stay_on_the_one_by_one_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if not JAX_CPU.is_file():
        pytest.skip(f"{JAX_CPU} is not present")
    tables = _parse_both(JAX_CPU, tmp_path, monkeypatch)
    ops = tables["device_ops"]
    assert ops.height > 0 and set(ops["kind"].to_list()) == {"xla_op"}
    # device ops and host rows share one sequence of event ids
    ids = ops["event_id"].to_list() + tables["host_ops"]["event_id"].to_list()
    assert len(set(ids)) == len(ids)


# -- hand-made host lines -------------------------------------------------------------------------------------





#: The host plane's stat metadata: id -> name ("77": a name a reference can point at).
HOST_STATS = {1: "correlation_id", 2: "step_num", 3: "hlo_op", 4: "device_ordinal", 5: "77", 6: "other"}
START_NS = 1_700_000_000_000_000_000


def _space(lines: list[bytes], extra_host_lines: list[Any] | None = None) -> bytes:
    """An XSpace: a GPU plane with one kernel, a ``/host:CPU`` plane holding ``lines`` (serialized ``XLine`` s) and
    ``extra_host_lines`` (``XLine`` messages), and a ``Task Environment``."""
    from tracelake.ingest.xplane_proto import XPlaneHeader, XSpaceWhole

    space = XSpaceWhole(hostnames=["host0"])
    gpu = space.planes.add(id=1, name="/device:GPU:0")
    gpu.event_metadata[1].id, gpu.event_metadata[1].name = 1, "gemm"
    gpu.stat_metadata[1].id, gpu.stat_metadata[1].name = 1, "correlation_id"
    kernel = gpu.lines.add(id=7, name="Stream #7", timestamp_ns=START_NS).events.add(metadata_id=1, offset_ps=0,
                                                                                    duration_ps=5_000)
    kernel.stats.add(metadata_id=1, int64_value=1)
    env = space.planes.add(id=2, name="Task Environment")
    env.stat_metadata[1].id, env.stat_metadata[1].name = 1, "profile_start_time"
    env.stats.add(metadata_id=1, int64_value=START_NS)
    host = XPlaneHeader(id=3, name="/host:CPU")
    for sid, name in HOST_STATS.items():
        host.stat_metadata[sid].id, host.stat_metadata[sid].name = sid, name
    for mid, name in ((1, "cuLaunchKernel"), (2, "train"), (3, "fusion.1"), (4, "outer")):
        host.event_metadata[mid].id, host.event_metadata[mid].name = mid, name
    host.event_metadata[4].display_name = "outer_display"
    plane = host.SerializeToString() + b"".join(len_field(3, line) for line in lines)
    plane += b"".join(len_field(3, line.SerializeToString()) for line in extra_host_lines or [])
    return space.SerializeToString() + len_field(1, plane)


def _line(tid: int, events: list[tuple[int, int]], timestamp_ns: int = 0, name: str = "") -> Any:
    from tracelake.ingest.xplane_proto import XLine

    line = XLine(id=tid, name=name or f"Host Threads/{tid}", timestamp_ns=timestamp_ns)
    for i, (offset_ps, duration_ps) in enumerate(events):
        line.events.add(metadata_id=1 + i % 4, offset_ps=offset_ps, duration_ps=duration_ps)
    return line


def _host_rows(tmp_path: Path, data: bytes, monkeypatch: pytest.MonkeyPatch) -> pl.DataFrame:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "host0.xplane.pb"
    path.write_bytes(data)
    return _parse_both(path, tmp_path, monkeypatch)["host_ops"]


def test_nesting_of_touching_identical_zero_and_unordered_events(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # (offset ps, duration ps) in file order; ns: [10,20) [0,10) [0,20) [10,10) [5,10) [15,25) [25,26) [16,17)
    events = [(10_000, 10_000), (0, 10_000), (0, 20_000), (10_000, 0), (5_000, 5_000), (15_000, 10_000),
              (25_000, 1_000), (16_000, 1_000)]
    # a second thread: [0,30), then [5,40) overlapping it without nesting, then [35,36) inside the second only
    overlapping = [(0, 30_000), (5_000, 35_000), (35_000, 1_000)]
    rows = _host_rows(tmp_path, _space([_line(1, events).SerializeToString(),
                                        _line(2, overlapping).SerializeToString()]), monkeypatch)
    first = rows.filter(pl.col("tid") == 1).sort("event_id")
    base = first["event_id"][0]
    assert first["ts_ns"].to_list() == [START_NS + t for t in (0, 0, 5, 10, 10, 15, 16, 25)]
    assert first["dur_ns"].to_list() == [20, 10, 5, 10, 0, 10, 1, 1]
    assert first["depth"].to_list() == [0, 1, 2, 1, 2, 2, 3, 0]
    assert first["parent_id"].to_list() == [None if p is None else base + p for p in (None, 0, 1, 0, 3, 3, 5, None)]
    assert first["name"].to_list()[:2] == ["fusion.1", "train"]
    second = rows.filter(pl.col("tid") == 2).sort("event_id")
    base = second["event_id"][0]
    assert second["depth"].to_list() == [0, 1, 2]  # the first has ended, but is still under the second
    assert second["parent_id"].to_list() == [None, base, base + 1]
    assert set(rows["cat"].to_list()) == {"Host Threads"}


@pytest.mark.parametrize("in_order", [True, False])
@settings(max_examples=2, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1))
def test_a_line_split_across_windows(monkeypatch: pytest.MonkeyPatch, in_order: bool, seed: int) -> None:
    """A line bigger than the window comes in several runs, each sorted on its own; what is still open at a run's
    end stays on the stack, so a line in time order nests exactly as when read whole."""
    rng = random.Random(seed)  # 400 events in 10 us, up to 4 us long: deeply nested
    events = [(rng.randrange(10**7), rng.choice([0, 1_000, 50_000, 10**6, 4 * 10**6])) for _ in range(400)]
    if in_order:
        events.sort(key=lambda e: (e[0], -e[1]))
    data = _space([_line(1, events).SerializeToString()])
    with tempfile.TemporaryDirectory() as tmp, monkeypatch.context() as m:
        whole = _host_rows(Path(tmp) / "whole", data, m).sort("event_id")
        m.setattr(xspace, "LINE_CHUNK_BYTES", 500)
        windows = _host_rows(Path(tmp) / "windows", data, m).sort("event_id")
    assert windows.height == 400 and windows["depth"].max() > 2
    assert windows["event_id"].to_list() == sorted(windows["event_id"].to_list())
    parents = windows.filter(pl.col("parent_id").is_not_null()).join(
        windows.select(pl.col("event_id").alias("parent_id"), pl.col("ts_ns").alias("parent_ts"),
                       (pl.col("ts_ns") + pl.col("dur_ns")).alias("parent_end"), pl.col("depth").alias("up")),
        on="parent_id")
    # every parent is still open when its child starts, one level up, across window edges too
    assert (parents["parent_end"] > parents["ts_ns"]).all() and (parents["up"] == parents["depth"] - 1).all()
    if in_order:
        assert windows.select("event_id", "ts_ns", "depth", "parent_id").equals(
            whole.select("event_id", "ts_ns", "depth", "parent_id"))


def test_header_fields_between_events_keep_the_line_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A small line whose events are split by a header field is still sorted and nested as one line."""
    head = varint(1 << 3) + varint(5) + len_field(2, b"Host Threads/5")
    late = len_field(4, varint(1 << 3) + varint(4) + varint(2 << 3) + varint(50_000) + varint(3 << 3)
                      + varint(1_000))
    early = len_field(4, varint(1 << 3) + varint(2) + varint(2 << 3) + varint(0) + varint(3 << 3)
                       + varint(100_000))
    line = head + late + varint(9 << 3) + varint(7) + early  # XLine.duration_ps (field 9) between the events
    rows = _host_rows(tmp_path, _space([line], [_line(6, [(0, 1_000)])]), monkeypatch).sort("event_id")
    five = rows.filter(pl.col("tid") == 5)
    assert five["name"].to_list() == ["train", "outer_display"]
    assert five["depth"].to_list() == [0, 1] and five["parent_id"][1] == five["event_id"][0]


def _random_host_line(rng: random.Random, tid: int, events: int, cpu_ops: bool) -> Any:
    from tracelake.ingest.xplane_proto import XLine

    line = XLine(id=tid, name=rng.choice([f"Host Threads/{tid}", "python", "/a/b/", ""]),
                 timestamp_ns=rng.choice([0, 123, START_NS + 7]))
    for _ in range(events):
        event = line.events.add(metadata_id=rng.choice([1, 2, 3, 4, 99]),
                                offset_ps=rng.choice([0, 999, 1_000, rng.randrange(-5_000, 10**8)]),
                                duration_ps=rng.choice([-7, 0, 1, 999, 1_000, rng.randrange(10**7), -(2**63)]))
        for _ in range(rng.choice([0, 0, 1, 2, 3])):
            stat = event.stats.add(metadata_id=rng.choice([1, 1, 2, 5, 6, 42] + ([3, 4] if cpu_ops else [])))
            kind = rng.randrange(7)
            if stat.metadata_id == 4:  # device_ordinal: a rank
                stat.int64_value = rng.randrange(4)
            elif kind == 0:
                stat.uint64_value = rng.choice([0, 7, 2**63 + 1, 2**64 - 1])
            elif kind == 1:
                stat.int64_value = rng.choice([-3, 0, 41, -(2**63), 2**63 - 1])
            elif kind == 2:
                stat.double_value = rng.choice([1.5, -2.7, float("nan"), float("inf"), 1e30])
            elif kind == 3:
                stat.str_value = rng.choice(["12", " -4 ", "x", "", "fusion.1"])
            elif kind == 4:
                stat.bytes_value = rng.choice([b"12", b"\xff"])
            elif kind == 5:
                stat.ref_value = rng.choice([5, 6, 200])  # 5 names "77"; 200 is undeclared
    return line


@settings(max_examples=6, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), window=st.sampled_from([1 << 20, 900]))
def test_random_host_lines_decode_in_bulk_as_one_by_one(seed: int, window: int,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Stats of every kind (correlation ids and step numbers as ``as_int`` reads them, undeclared ids counted),
    events in any order with negative, zero and equal times, empty lines, a line with CPU back-end ops."""
    rng = random.Random(seed)  # the lines are drawn from a seed: far more choices than hypothesis draws well
    lines = [_random_host_line(rng, tid, rng.choice([0, 1, 5, 200]), cpu_ops=tid == 3) for tid in range(1, 7)]
    with tempfile.TemporaryDirectory() as tmp, monkeypatch.context() as m:
        m.setattr(xspace, "LINE_CHUNK_BYTES", window)
        m.setattr(xla_host, "HOST_FLUSH_ROWS", 50)
        rows = _host_rows(Path(tmp), _space([], lines), m)
    assert rows["correlation"].null_count() < rows.height


def _nested_intervals(rng: np.random.Generator, start: int, stop: int, depth: int) -> list[tuple[int, int]]:
    """Intervals inside ``[start, stop)`` that nest properly (touching, zero-length and equal ones included)."""
    out = []
    at = start
    while at < stop and rng.random() < 0.8:
        end = int(rng.integers(at, stop + 1))
        out.append((at, end))
        if depth and end > at:
            out += _nested_intervals(rng, at, end, depth - 1)
        at = end if rng.random() < 0.5 else int(rng.integers(end, stop + 1))
    return out


#: Intervals (start, end) that overlap without nesting, touch, or have no length.
_OVERLAPPING = st.lists(st.tuples(st.integers(0, 49), st.sampled_from([0, 1, 3, 10, 40])), max_size=59).map(
    lambda pairs: [(t, t + d) for t, d in pairs])
#: Intervals that nest properly, drawn from a seed (a recursive layout).
_PROPERLY_NESTED = st.integers(0, 2**32 - 1).map(
    lambda seed: _nested_intervals(np.random.default_rng(seed), 0, 100, 4) or [(0, 0)])


@settings(max_examples=100)
@given(pairs=st.one_of(_OVERLAPPING, _PROPERLY_NESTED))
@example(pairs=[(0, 10), (2, 5), (5, 5), (6, 10)])  # nests properly: done on whole arrays
@example(pairs=[(0, 30), (5, 40), (35, 36)])  # overlaps without nesting: done with the stack
def test_nesting_matches_the_stack_on_random_intervals(pairs: list[tuple[int, int]]) -> None:
    """:func:`xla_host.nesting` against the stack itself: runs that nest properly (done on whole arrays), overlap
    without nesting (done with the stack) and touch. Both ways are taken: :func:`xla_host.proper_nesting` answers
    (with the stack's nesting) exactly where the stack's ends never grow from bottom to top."""
    starts = np.array([s for s, _ in pairs], dtype=np.int64)
    ends = np.array([e for _, e in pairs], dtype=np.int64)
    order = np.lexsort((starts - ends, starts))
    ts, end = starts[order], ends[order]
    depth, parent = xla_host.nesting(ts, end)
    stack: list[tuple[int, int]] = []
    expected = []
    ends_grow = False
    for i, (t, e) in enumerate(zip(ts.tolist(), end.tolist(), strict=True)):
        while stack and stack[-1][0] <= t:
            stack.pop()
        expected.append((len(stack), stack[-1][1] if stack else -1))
        ends_grow |= bool(stack) and e > stack[-1][0]
        stack.append((e, i))
    assert list(zip(depth.tolist(), parent.tolist(), strict=True)) == expected
    if len(ts) > 1:
        whole = xla_host.proper_nesting(ts, end)
        assert (whole is None) == ends_grow
        if whole is not None:
            assert list(zip(whole[0].tolist(), whole[1].tolist(), strict=True)) == expected


def test_both_ways_of_nesting_are_taken() -> None:
    """Properly nested events are done on whole arrays; events that overlap without nesting go through the stack."""
    nested, overlapping = np.array([0, 2, 5, 6]), np.array([0, 5, 35])
    assert xla_host.proper_nesting(nested, np.array([10, 5, 5, 10])) is not None
    assert xla_host.proper_nesting(overlapping, np.array([30, 40, 36])) is None


def test_a_cpu_op_with_an_impossible_device_ordinal_is_a_clear_error(tmp_path: Path) -> None:
    """An XLA op of the CPU back-end whose device_ordinal cannot be a rank: the file, plane and line named, nothing
    written (it used to fail in Arrow while writing the rank)."""
    from tracelake.ingest.xplane_proto import XLine

    line = XLine(id=3, name="tf_XLACpuThread/3", timestamp_ns=START_NS)
    event = line.events.add(metadata_id=1, offset_ps=0, duration_ps=1_000)
    event.stats.add(metadata_id=3, str_value="fusion.1")
    event.stats.add(metadata_id=4, int64_value=2**40)
    path = tmp_path / "host0.xplane.pb"
    path.write_bytes(_space([], [line]))
    staging = tmp_path / "staging"
    staging.mkdir()
    with pytest.raises(TraceFormatError) as caught:
        ingest.parse_into(path, staging, ingest.ParseOptions(source_name=path.name, trace_id="0" * 20))
    message = str(caught.value)
    assert message.startswith("host0.xplane.pb: ") and "device_ordinal 1099511627776" in message
    assert "line 'tf_XLACpuThread/3'" in message


def test_gpu_stream_events_without_any_stats_ingest(tmp_path: Path) -> None:
    """A GPU stream line none of whose events has stats (no correlation ids): its kernels still become device ops
    (the bulk decoder used to index an empty array)."""
    from tracelake.ingest.xplane_proto import XSpaceWhole
    from tracelake.sample_traces import generate_xla

    space = XSpaceWhole.FromString(generate_xla.build_gpu(2, 10, 1))
    stripped = 0
    for plane in space.planes:
        for line in plane.lines:
            if line.name.startswith("Stream #") and not stripped:
                for event in line.events:
                    del event.stats[:]
                stripped = len(line.events)
    assert stripped
    path = tmp_path / "host0.xplane.pb"
    path.write_bytes(space.SerializeToString())
    _, tables = _parse(path, tmp_path / "staging")
    ops = tables["device_ops"]
    assert ops.height >= stripped and ops["correlation"].null_count() >= stripped
