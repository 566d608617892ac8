"""XLA profiles: the real files in ../shared/real_traces/xla, the project's TPU sample, and the JSON renderings.

The vectorised event decoder against protobuf's own decoding is in ``test_xspace_events.py``.
"""

from __future__ import annotations

import random
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from support import REAL_XLA, TPU_SAMPLE, len_field, real_xplanes
from tracelake.contracts.classify import classify
from tracelake.ingest import detect, xla_ops
from tracelake.ingest.xspace import Space, stat_value
from tracelake.warehouse import Warehouse
from tracelake.warehouse.inputs import expand_inputs


def primary_op_counts(path: Path) -> dict[int, int]:
    """Per device: events on the primary op lines, counted straight from the file.

    TPU: the ``XLA Ops`` line; GPU: the ``Stream #`` lines; CPU back-end: host events
    that carry ``hlo_op`` and ``device_ordinal``.
    """
    counts: dict[int, int] = {}
    with Space(path, path.name) as space:
        for plane in space.planes:
            device = re.match(r"^/device:(TPU|GPU):(\d+)$", plane.name)
            for line in space.lines(plane):
                if device and ((device.group(1) == "TPU" and line.name == "XLA Ops")
                               or (device.group(1) == "GPU" and line.name.startswith("Stream #"))):
                    index = int(device.group(2))
                    counts[index] = counts.get(index, 0) + len(line.events)
                elif plane.name == "/host:CPU":
                    for event in line.events:
                        stats = {plane.stat_names.get(s.metadata_id): stat_value(s, plane.stat_names)
                                 for s in event.stats}
                        if "hlo_op" in stats and "device_ordinal" in stats:
                            index = int(str(stats["device_ordinal"]))
                            counts[index] = counts.get(index, 0) + 1
    return counts


@pytest.mark.slow  # ingests real XLA profiles
@pytest.mark.parametrize("path", real_xplanes(), ids=lambda p: p.parent.name if p.parent != REAL_XLA else p.name)
def test_real_xplane_ingests_with_every_primary_op(path: Path, warehouse: Warehouse) -> None:
    result = warehouse.ingest_file(path, job="xla")
    assert result.ok, result.error
    assert detect(path).name == "xla"
    ours = dict(warehouse.query("SELECT device, count(*) FROM device_ops GROUP BY 1").rows)
    expected = {d: n for d, n in primary_op_counts(path).items() if n}
    assert ours == expected and sum(expected.values()) > 0
    row = warehouse.traces()[0]
    assert row["format"] == "xla" and row["device_op_count"] == sum(expected.values())
    breakdown = warehouse.breakdown(job="xla")
    assert breakdown.height == len(expected)
    assert (breakdown["busy_ns"] + breakdown["idle_ns"] == breakdown["span_ns"]).all()


def test_no_real_xla_files_skips() -> None:
    if not REAL_XLA.is_dir():
        pytest.skip("../shared/real_traces/xla is not present")
    assert real_xplanes(), "the shared XLA folder holds .xplane.pb files"


@pytest.mark.slow  # ingests real XLA profiles
def test_tpu_real_trace_keeps_flops_and_peaks(warehouse: Warehouse) -> None:
    path = REAL_XLA / "tpu_inference_2.xplane.pb"
    if not path.exists():
        pytest.skip("../shared/real_traces/xla is not present")
    assert warehouse.ingest_file(path, job="tpu").ok
    devices = warehouse.query("SELECT device, name, peak_tflops, peak_hbm_gbps FROM devices ORDER BY device").rows
    assert [d[0] for d in devices] == [0, 1, 2, 3]
    assert all(d[1] == "TPU v6 Lite" and d[2] == 918.0 and d[3] > 1600 for d in devices)
    # all-reduces are communication, with the module they ran in and their FLOPs/bytes from the metadata
    rows = warehouse.query(
        "SELECT category, hlo_category, count(*), sum(flops) > 0, sum(bytes_accessed) > 0 FROM device_ops "
        "WHERE name = 'all-reduce' GROUP BY ALL").rows
    assert rows == [("communication", "all-reduce", 12, True, True)]
    assert warehouse.query("SELECT count(*) FROM collectives WHERE collective = 'all_reduce'").rows == [(12,)]
    flops = warehouse.query("SELECT min(flops_utilisation_pct) FROM breakdown WHERE step IS NULL").rows[0][0]
    assert flops is not None and flops >= 0


def test_xplane_and_its_json_renderings_agree(tmp_path: Path) -> None:
    """The trace-viewer and perfetto JSON of a run give the same device ops, collectives and steps."""
    run = REAL_XLA / "jax_cpu_4dev"
    if not run.is_dir():
        pytest.skip("../shared/real_traces/xla is not present")
    figures = {}
    for name in ("vm.xplane.pb", "vm.trace.json.gz", "perfetto_trace.json.gz"):
        wh = Warehouse(tmp_path / name)
        result = wh.ingest_file(run / name, job="cpu")
        assert result.ok, result.error
        figures[name] = wh.query(
            "SELECT (SELECT count(*) FROM device_ops), (SELECT count(*) FROM collectives), "
            "(SELECT count(*) FROM steps), (SELECT count(DISTINCT rank) FROM device_ops), "
            "(SELECT list(DISTINCT collective ORDER BY collective) FROM collectives)").rows[0]
    assert figures["vm.xplane.pb"][:4] == (240, 72, 12, 4)
    assert figures["vm.trace.json.gz"] == figures["vm.xplane.pb"] == figures["perfetto_trace.json.gz"]
    assert detect(run / "vm.trace.json.gz").name == "xla_json"


def test_directory_ingest_prefers_the_xplane(tmp_path: Path) -> None:
    run = REAL_XLA / "jax_cpu_4dev"
    if not run.is_dir():
        pytest.skip("../shared/real_traces/xla is not present")
    folder = tmp_path / "plugins" / "profile" / "2026_12_02_10_00_00"
    shutil.copytree(run, folder)
    assert [p.name for p in expand_inputs([tmp_path])] == ["vm.xplane.pb"]
    # named explicitly, the JSON is ingested
    assert [p.name for p in expand_inputs([folder / "vm.trace.json.gz"])] == ["vm.trace.json.gz"]


def test_tpu_sample_breakdown_per_chip(warehouse: Warehouse) -> None:
    """The generated sample: 4 chips, chip 2 late; async all-reduce windows partly exposed; FLOPs vs peak."""
    assert warehouse.ingest_file(TPU_SAMPLE, job="tpu").ok
    whole = {r["rank"]: r for r in warehouse.breakdown(job="tpu").to_dicts()}
    assert sorted(whole) == [0, 1, 2, 3]
    # per step: async window 6500-8000 us, compute to 7200, sync all-reduce from 7400 (7700 on chip 2)
    assert [whole[r]["exposed_async_collective_ns"] for r in range(4)] == [800_000, 800_000, 2_000_000, 800_000]
    assert all(whole[r]["communication_ns"] == 4 * 1_500_000 for r in range(4))
    assert whole[0]["flops_utilisation_pct"] == pytest.approx(
        100 * 4 * 6 * 0.55 * 918e12 * 1.2e-3 / (918e12 * whole[0]["span_ns"] / 1e9))
    steps = warehouse.query("SELECT rank, count(*), min(device_op_count) FROM steps GROUP BY 1 ORDER BY 1").rows
    assert steps == [(r, 4, 8) for r in range(4)]
    analysis = warehouse.analyze(job="tpu")
    straggler = [f for f in analysis.findings if f.kind == "straggler"]
    assert straggler and "rank 2" in straggler[0].title
    assert set(analysis.collectives["ranks"].to_list()) == {4}


def test_op_classification() -> None:
    """XLA ops go through the one rule table of every format (tests/test_classify.py tests the table)."""
    assert classify("xla_op", "x", "all-reduce fusion") == "communication"
    assert classify("kernel", "ncclDevKernel_AllReduce", None) == "communication"
    assert classify("xla_op", "copy-start", "copy-start") == "memory"
    assert classify("xla_op", "fusion.3", "convolution fusion") == "compute"
    assert xla_ops.collective_name(" All-Gather-Start.2 ") == "all_gather" and xla_ops.collective_name("copy") is None
    assert xla_ops.opcode_of("psum.7") == "all-reduce" and xla_ops.opcode_of("add.1") is None
    assert xla_ops.message_bytes(100, 300) == 200 and xla_ops.message_bytes(100, 200) == 100


def test_hosts_of_one_run_get_distinct_ranks(tmp_path: Path, warehouse: Warehouse) -> None:
    """One xplane per host in a run folder: the second host's chips are ranks 4-7, devices still 0-3."""
    run = tmp_path / "plugins" / "profile" / "2026_12_02_10_00_00"
    run.mkdir(parents=True)
    data = TPU_SAMPLE.read_bytes()
    (run / "host-a.xplane.pb").write_bytes(data)
    (run / "host-b.xplane.pb").write_bytes(data + b"\x22\x06host-b")  # same profile, another hostname
    report = warehouse.ingest([run], job="pod")
    assert report.ok, [r.error for r in report.failed]
    rows = warehouse.query("SELECT t.host, d.rank, d.device FROM devices d JOIN traces t USING (trace_id) "
                           "ORDER BY d.rank").rows
    assert [r[1] for r in rows] == list(range(8))
    assert [r[2] for r in rows] == [0, 1, 2, 3] * 2
    assert warehouse.query("SELECT count(DISTINCT rank) FROM device_ops").rows == [(8,)]
    assert warehouse.analyze(job="pod").collectives["ranks"].max() == 8


def test_big_lines_decode_in_slices_with_the_same_events(monkeypatch: pytest.MonkeyPatch) -> None:
    from tracelake.ingest import xspace
    from tracelake.sample_traces import generate_xla

    path_events: dict[int, list[tuple[str, int, list[int]]]] = {}
    for chunk in (1 << 30, 2_000):  # whole lines, then slices of ~2 kB of events
        monkeypatch.setattr(xspace, "LINE_CHUNK_BYTES", chunk)
        seen: dict[tuple[str, str], list[int]] = {}
        with Space(TPU_SAMPLE, "x") as space:
            for plane in space.planes:
                for line in space.lines(plane):
                    seen.setdefault((plane.name, line.name), []).extend(e.offset_ps for e in line.events)
        path_events[chunk] = sorted((k[0] + "/" + k[1], len(v), v) for k, v in seen.items())
    assert path_events[1 << 30] == path_events[2_000]
    assert generate_xla.STEPS * len(generate_xla.OPS) in [n for _, n, _ in path_events[2_000]]


def test_committed_xla_sample_matches_its_generator() -> None:
    from tracelake.sample_traces import generate_xla

    assert TPU_SAMPLE.read_bytes() == generate_xla.build()


def test_generated_gpu_xplane_counts_stream_kernels_once(tmp_path: Path, warehouse: Warehouse) -> None:
    """GPU planes: the kernels on the ``Stream #`` lines are the device ops; the derived ``XLA Ops`` and
    ``XLA Modules`` lines repeat them and are not counted again."""
    from tracelake.sample_traces import generate_xla

    steps, kernels, gpus = 3, 10, 2
    path = tmp_path / "host0.xplane.pb"
    path.write_bytes(generate_xla.build_gpu(steps, kernels, gpus))
    per_line: dict[tuple[int, str], int] = {}
    with Space(path, path.name) as space:
        for plane in space.planes:
            device = re.match(r"^/device:GPU:(\d+)$", plane.name)
            for line in space.lines(plane):
                if device:
                    key = (int(device.group(1)), "stream" if line.name.startswith("Stream #") else line.name)
                    per_line[key] = per_line.get(key, 0) + len(line.events)
    per_step = kernels + generate_xla.GEMMS + len(generate_xla.GPU_FIXED)
    for gpu in range(gpus):
        assert per_line[(gpu, "stream")] == per_line[(gpu, "XLA Ops")] == steps * per_step
        assert per_line[(gpu, "XLA Modules")] == steps

    result = warehouse.ingest_file(path, job="gpu")
    assert result.ok, result.error
    ours = dict(warehouse.query("SELECT device, count(*) FROM device_ops GROUP BY 1").rows)
    assert ours == primary_op_counts(path) == {gpu: per_line[(gpu, "stream")] for gpu in range(gpus)}
    kinds = warehouse.query("SELECT kind, category, count(*) FROM device_ops GROUP BY ALL ORDER BY ALL").rows
    assert kinds == [("kernel", "communication", gpus * steps), ("kernel", "compute", gpus * steps * (per_step - 2)),
                     ("memcpy", "memory", gpus * steps)]
    # per-event stats reach the rows: hlo_op (as long_name), module, program, correlation; steps from the host
    row = warehouse.query("SELECT long_name, hlo_module, program_id, correlation, step FROM device_ops "
                          "WHERE device = 1 ORDER BY ts_ns LIMIT 1").rows
    first_launch = generate_xla.correlation_id(1, gpus, 0)
    assert row == [("cublas-gemm.0", generate_xla.GPU_MODULE, generate_xla.GPU_PROGRAM, first_launch, 0)]
    # each kernel's launch call on the host carries the same correlation id, unique across GPUs
    launches = warehouse.query("SELECT count(*), count(DISTINCT correlation) FROM host_ops "
                               "WHERE name LIKE 'cu%'").rows
    assert launches == [(sum(ours.values()),) * 2]
    steps_rows = warehouse.query("SELECT rank, count(*), sum(device_op_count) FROM steps GROUP BY 1 ORDER BY 1").rows
    assert steps_rows == [(gpu, steps, steps * per_step) for gpu in range(gpus)]
    assert warehouse.query("SELECT count(*) FROM collectives").rows == [(gpus * steps,)]


def _gpu_stream_with_every_kind_of_stat(path: Path, rng: random.Random) -> Path:
    """A GPU plane whose events carry stats of every value kind, repeated, undeclared, and references to undeclared
    ids, on a stream line with a relative and one with an absolute timestamp (drawn from ``rng``)."""
    from tracelake.ingest.xplane_proto import XSpaceWhole

    space = XSpaceWhole(hostnames=["host0"])
    plane = space.planes.add(id=1, name="/device:GPU:0")
    names = ["correlation_id", "hlo_op", "hlo_module", "program_id", "hlo_category", "kernel_details",
             "all-reduce.3", "jit_f", "fusion.2", "77", "hlo_op"]
    for i, name in enumerate(names, 1):
        plane.stat_metadata[i].id, plane.stat_metadata[i].name = i, name
    for i, name in enumerate(["gemm", "ncclKernel_AllReduce", "Memcpy HtoD", "memset32", "fusion_kernel"], 1):
        plane.event_metadata[i].id, plane.event_metadata[i].name = i, name
    plane.event_metadata[5].display_name = "fusion_display"
    for line_id, name, ts in ((3, "Stream #3(Compute)", 5), (4, "Stream #5", 1_700_000_000_000_000_000)):
        line = plane.lines.add(id=line_id, name=name, timestamp_ns=ts)
        for _ in range(300):
            event = line.events.add(metadata_id=rng.choice([1, 2, 3, 4, 5, 9]), offset_ps=rng.randrange(10**12),
                                    duration_ps=rng.choice([-5, 0, 10**6, rng.randrange(10**9)]))
            for _ in range(rng.randrange(9)):
                stat = event.stats.add(metadata_id=rng.choice([1, 2, 3, 4, 5, 11, 99, 6]))
                kind = rng.randrange(7)
                if kind == 0:
                    stat.uint64_value = rng.choice([0, 5, 2**63 + 5, 2**64 - 1])
                elif kind == 1:
                    stat.int64_value = rng.choice([-3, 0, 42, -(2**63)])
                elif kind == 2:
                    stat.double_value = rng.choice([1.5, float("nan"), 3.0, 1e30])
                elif kind == 3:
                    stat.str_value = rng.choice(["all-reduce.1", "fusion.2", "", "123", " 7 ", "psum.3", "copy"])
                elif kind == 4:
                    stat.bytes_value = rng.choice([b"fusion.9", b"\xff\xfe", b"", b"55"])
                elif kind == 5:
                    stat.ref_value = rng.choice([7, 8, 9, 10, 200, 1])  # 200: undeclared
                # kind 6: a stat without a value
    path.write_bytes(space.SerializeToString())
    return path


def _assert_gpu_streams_decode_in_bulk_as_one_by_one(path: Path, window: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tables (and warnings) of ``path`` with the bulk GPU stream decoder and without it are the same."""
    from tracelake import ingest
    from tracelake.contracts.errors import TraceFormatError
    from tracelake.ingest import xla, xla_gpu, xspace

    def refuse(*_: object) -> None:
        raise TraceFormatError("test", "the bulk path is off")

    with monkeypatch.context() as m:
        m.setattr(xspace, "LINE_CHUNK_BYTES", window)
        m.setattr(xla, "FLUSH_ROWS", 500)
        bulk = ingest.parse(path)
        m.setattr(xla_gpu.GpuStreams, "gpu_columns", refuse)
        one_by_one = ingest.parse(path)
    assert bulk.info.warnings == one_by_one.info.warnings and bulk.info.event_count == one_by_one.info.event_count
    for name, table in one_by_one.tables.items():
        assert table.equals(bulk.tables[name]), (path, name)
    assert bulk.tables["device_ops"].num_rows > 0


@pytest.mark.parametrize("window", [1 << 20, pytest.param(300, marks=pytest.mark.slow)])  # 300: thousands of windows
def test_gpu_streams_decode_in_bulk_as_one_by_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  window: int) -> None:
    """The bulk decoding of GPU stream lines gives the tables (and warnings) the protobuf path gives."""
    from tracelake.sample_traces import generate_xla

    generated = tmp_path / "gen" / "host0.xplane.pb"
    generated.parent.mkdir()
    generated.write_bytes(generate_xla.build_gpu(4, 60, 2))
    for path in [generated, *[p for p in real_xplanes() if "mi300" in str(p)]]:
        _assert_gpu_streams_decode_in_bulk_as_one_by_one(path, window, monkeypatch)


@pytest.mark.parametrize("window", [1 << 20, pytest.param(300, marks=pytest.mark.slow)])  # 300: thousands of windows
@settings(max_examples=2, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1))
def test_gpu_stats_of_every_kind_decode_in_bulk_as_one_by_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              window: int, seed: int) -> None:
    """The same on GPU stream events with stats of every kind (drawn from a seed: a few thousand choices)."""
    odd = _gpu_stream_with_every_kind_of_stat(tmp_path / "host0.xplane.pb", random.Random(seed))
    _assert_gpu_streams_decode_in_bulk_as_one_by_one(odd, window, monkeypatch)


def test_gpu_stats_decode_in_bulk_without_the_table_of_stat_names(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Stat metadata ids too large for a table of names (xspace_stats.STAT_TABLE_LIMIT) are searched instead: the same
    tables as one by one."""
    from tracelake.ingest import xspace_stats

    monkeypatch.setattr(xspace_stats, "STAT_TABLE_LIMIT", 0)
    odd = _gpu_stream_with_every_kind_of_stat(tmp_path / "host0.xplane.pb", random.Random(7))
    _assert_gpu_streams_decode_in_bulk_as_one_by_one(odd, 1 << 20, monkeypatch)


def _space_with_unknown_stat_ids(path: Path) -> Path:
    """A TPU and a GPU plane whose stats refer to stat metadata ids they do not declare (as newer profilers write)."""
    from tracelake.ingest.xplane_proto import XSpaceWhole

    space = XSpaceWhole(hostnames=["host0"])
    tpu, gpu = space.planes.add(id=1, name="/device:TPU:0"), space.planes.add(id=2, name="/device:GPU:1")
    for plane in (tpu, gpu):
        for sid, name in ((1, "hlo_category"), (2, "hlo_op"), (3, "correlation_id"), (4, "device_vendor")):
            plane.stat_metadata[sid].id = sid
            plane.stat_metadata[sid].name = name
        plane.stats.add(metadata_id=4, str_value="Nvidia")
        plane.stats.add(metadata_id=55, int64_value=7)  # undeclared
    op = tpu.event_metadata[1]
    op.name, op.display_name = "%fusion.1 = f32[8]{0} fusion(...)", "fusion.1"
    op.stats.add(metadata_id=1, str_value="convolution")
    op.stats.add(metadata_id=99, int64_value=1)  # undeclared
    op.stats.add(metadata_id=2, ref_value=98)  # a reference to an undeclared id
    line = tpu.lines.add(id=1, name="XLA Ops", timestamp_ns=1_700_000_000_000_000_000)
    for i in range(3):
        line.events.add(metadata_id=1, offset_ps=i * 2_000_000, duration_ps=1_000_000)
    gpu.event_metadata[1].name = "gemm_kernel"
    stream = gpu.lines.add(id=7, name="Stream #7(Compute)", timestamp_ns=1_700_000_000_000_000_000)
    for i in range(2):
        event = stream.events.add(metadata_id=1, offset_ps=i * 3_000_000, duration_ps=2_000_000)
        event.stats.add(metadata_id=2, str_value="dot.3")
        event.stats.add(metadata_id=3, uint64_value=40 + i)
        event.stats.add(metadata_id=77, str_value="a stat type from a newer profiler")  # undeclared
        event.stats.add(metadata_id=3, ref_value=66)  # undeclared reference: the stat reads None
    path.write_bytes(space.SerializeToString())
    return path


@pytest.mark.parametrize("table", [True, False], ids=["table of names", "ids searched"])
def test_stats_of_undeclared_metadata_ids_are_ignored_and_counted(tmp_path: Path, warehouse: Warehouse, table: bool,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from tracelake.ingest import xspace_stats

    if not table:  # ids too large for a table of names (xspace_stats.STAT_TABLE_LIMIT): searched, the same counts
        monkeypatch.setattr(xspace_stats, "STAT_TABLE_LIMIT", 0)
    path = _space_with_unknown_stat_ids(tmp_path / "host0.xplane.pb")
    report = warehouse.ingest([path], job="unknown-stats")
    result = report.results[0]
    assert result.status == "ingested", result.error
    assert result.rows["device_ops"] == 5
    [warning] = [w for w in result.warnings if "stat metadata ids" in w]
    # plane stats 2 x id 55; op metadata id 99 and ref 98 once (per kind of op); per GPU event 77 and ref 66
    assert warning.startswith("8 stats refer to stat metadata ids that their plane does not declare (ids 55, 66, 77, "
                              "98, 99; planes '/device:TPU:0', '/device:GPU:1')"), warning
    rows = warehouse.query("SELECT kind, name, hlo_category, long_name, correlation FROM device_ops "
                           "ORDER BY kind DESC, ts_ns").rows
    assert rows[:3] == [("xla_op", "fusion.1", "convolution", "%fusion.1 = f32[8]{0} fusion(...)", None)] * 3
    # the last correlation_id stat (a reference to an undeclared id) wins and reads None, as before
    assert rows[3:] == [("kernel", "gemm_kernel", None, "dot.3", None)] * 2
    devices = warehouse.query("SELECT kind, vendor FROM devices ORDER BY rank").rows
    assert devices == [("tpu", "Nvidia"), ("gpu", "Nvidia")]


def test_tables_do_not_depend_on_the_read_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """Event ids included: a line's collectives are numbered after all of the line's ops, whatever the windows."""
    from tracelake import ingest
    from tracelake.ingest import xspace

    tables = {}
    for chunk in (1 << 30, 300):
        monkeypatch.setattr(xspace, "LINE_CHUNK_BYTES", chunk)
        tables[chunk] = ingest.parse(TPU_SAMPLE).tables
    for name in ("device_ops", "collectives", "steps"):
        assert tables[1 << 30][name].num_rows > 0
        assert tables[1 << 30][name].equals(tables[300][name]), name


def test_gzipped_xplane_parses_like_the_plain_one(tmp_path: Path, warehouse: Warehouse) -> None:
    import gzip

    plain = tmp_path / "plain" / "host0.xplane.pb"
    packed = tmp_path / "packed" / "host0.xplane.pb.gz"
    for path in (plain, packed):
        path.parent.mkdir()
    shutil.copy(TPU_SAMPLE, plain)
    packed.write_bytes(gzip.compress(TPU_SAMPLE.read_bytes()))
    counts = {}
    for path, job in ((plain, "plain"), (packed, "packed")):  # one content, one trace id: a warehouse each
        wh = Warehouse(tmp_path / f"wh-{job}")
        report = wh.ingest([path], job=job)
        assert report.ok, [r.error for r in report.failed]
        counts[job] = wh.query("SELECT count(*) FROM device_ops").rows[0][0]
    assert counts["plain"] == counts["packed"] > 0
    again = warehouse.ingest([plain, packed], job="both").results  # docs/formats.md, "Trace ids"
    assert [r.status for r in again] == ["ingested", "duplicate"] and again[0].trace_id == again[1].trace_id


def test_gzip_bomb_stops_at_the_cap_and_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A small .gz that expands far past its size fails before it fills the disk, and leaves nothing behind."""
    import gzip

    from tracelake.ingest import ParseOptions, xla
    from tracelake.contracts.errors import TraceFormatError

    monkeypatch.setattr(xla, "GZIP_MIN_LIMIT", 1 << 20)
    bomb = tmp_path / "host0.xplane.pb.gz"
    # a plane header, then 32 MB of zeros: some 32 kB compressed, past 64x that once expanded
    bomb.write_bytes(gzip.compress(len_field(1, len_field(2, b"/device:TPU:0")) + bytes(32 << 20), 9))
    assert xla.GZIP_MAX_RATIO * bomb.stat().st_size < 32 << 20
    staging = tmp_path / "staging"
    staging.mkdir()
    with pytest.raises(TraceFormatError) as caught:
        xla.parse(bomb, staging, ParseOptions(source_name=bomb.name))
    assert caught.value.source == "host0.xplane.pb.gz"
    assert "gzip bomb" in str(caught.value), str(caught.value)
    limit = max(1 << 20, xla.GZIP_MAX_RATIO * bomb.stat().st_size)
    assert caught.value.where == f"decompressed byte {limit:,}"
    assert list(staging.iterdir()) == []


def test_truncated_gzip_xplane_is_a_format_error(tmp_path: Path) -> None:
    import gzip

    from tracelake.ingest import ParseOptions, xla
    from tracelake.contracts.errors import TraceFormatError

    cut = tmp_path / "host0.xplane.pb.gz"
    cut.write_bytes(gzip.compress(TPU_SAMPLE.read_bytes())[:-100])
    staging = tmp_path / "staging"
    staging.mkdir()
    with pytest.raises(TraceFormatError, match="damaged gzip data") as caught:
        xla.parse(cut, staging, ParseOptions(source_name=cut.name))
    assert caught.value.source == "host0.xplane.pb.gz"
    assert list(staging.iterdir()) == []


@st.composite
def _code_rows(draw: st.DrawFn) -> np.ndarray:
    """Five rows of codes from -1 up (the first from 0), as GPU stream rows have them: few, or too many to pack."""
    n = draw(st.integers(1, 200))
    high = draw(st.one_of(st.integers(1, 11), st.just(2**14)))
    keys = draw(hnp.arrays(np.int64, (5, n), elements=st.integers(-1, high - 1)))
    keys[0] = np.maximum(keys[0], 0)
    return keys


@settings(max_examples=100)
@given(keys=_code_rows())
@example(keys=np.array([[0, 2**14 - 1, 0]] + [[-1, 2**14 - 1, 2**14 - 1]] * 4))  # too many to pack
def test_distinct_columns_equal_numpy_unique_by_column(keys: np.ndarray) -> None:
    """The packed distinct-combination search of GPU stream rows gives np.unique(axis=1)'s answer, also past int64."""
    from tracelake.ingest.xla_gpu import distinct_columns

    combos, which = distinct_columns(keys)
    expected, inverse = np.unique(keys, axis=1, return_inverse=True)
    assert np.array_equal(combos, expected) and np.array_equal(which, inverse.reshape(-1))
