"""XLA profiles: the real files in ../shared/real_traces/xla, the project's TPU sample, and the JSON renderings."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from conftest import REAL_TRACES, ROOT
from tracelake.ingest import detect, xla_ops
from tracelake.ingest.xspace import Space, stat_value
from tracelake.warehouse import Warehouse
from tracelake.warehouse.inputs import expand_inputs

REAL_XLA = REAL_TRACES / "xla"
TPU_SAMPLE = ROOT / "sample_traces" / "xla" / "tpu_allreduce" / "host0.xplane.pb"


def real_xplanes() -> list[Path]:
    return sorted(REAL_XLA.rglob("*.xplane.pb")) if REAL_XLA.is_dir() else []


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
    assert xla_ops.category("all-reduce fusion", "x") == "communication"
    assert xla_ops.category(None, "ncclDevKernel_AllReduce", gpu_kernel=True) == "communication"
    assert xla_ops.category("copy-start", "copy-start") == "memory"
    assert xla_ops.category("convolution fusion", "fusion.3") == "compute"
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
        path_events[chunk] = sorted((k[0] + "/" + k[1], len(v), v) for k, v in seen.items())  # type: ignore[misc]
    assert path_events[1 << 30] == path_events[2_000]
    assert generate_xla.STEPS * len(generate_xla.OPS) in [n for _, n, _ in path_events[2_000]]


def test_committed_xla_sample_matches_its_generator() -> None:
    from tracelake.sample_traces import generate_xla

    assert TPU_SAMPLE.read_bytes() == generate_xla.build()
