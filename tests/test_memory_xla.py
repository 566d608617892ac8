"""XLA allocator events (``MemoryAllocation`` / ``MemoryDeallocation``) into ``memory_events``, and device capacity.

Expected figures are counted here from the xplanes themselves, decoded whole by protobuf (``XSpaceWhole``,
not the parser's bulk decoder), and compared with what SQL over the warehouse returns: the real H200 JAX
sample, the real TPU and MI300 xplanes of ../shared/real_traces (skipped where absent), and a generated
xplane with every case (a GPU BFC allocator, a host allocator, a TPU-style free without its size).
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import pytest

from support import REAL_XLA, ROOT
from tracelake.ingest.xplane_proto import XSpaceWhole
from tracelake.warehouse import Warehouse

JAX_H200 = ROOT / "sample_traces" / "gpu_h200" / "jax" / "jax.xplane.pb"
TPU_REAL = REAL_XLA / "tpu_inference_2.xplane.pb"
MI300_REAL = REAL_XLA / "mi300_jax08_gemm" / "tw003.xplane.pb"
T0 = 1_700_000_000_000_000_000


def allocator_events(path: Path) -> list[dict[str, Any]]:
    """Every MemoryAllocation/MemoryDeallocation event of the host planes, its stats by name, in time order."""
    space = XSpaceWhole.FromString(path.read_bytes())
    out = []
    for plane in space.planes:
        if not plane.name.startswith("/host:"):
            continue
        names = {k: v.name for k, v in plane.stat_metadata.items()}
        for line in plane.lines:
            for event in line.events:
                md = plane.event_metadata[event.metadata_id]
                if md.name not in ("MemoryAllocation", "MemoryDeallocation"):
                    continue
                stats = {}
                for stat in event.stats:
                    kind = stat.WhichOneof("value")
                    value = getattr(stat, kind)
                    stats[names[stat.metadata_id]] = names[value] if kind == "ref_value" else value
                out.append({"kind": "alloc" if md.name == "MemoryAllocation" else "free",
                            "ts": line.timestamp_ns + event.offset_ps // 1000, **stats})
    return sorted(out, key=lambda e: e["ts"])


def device_of(event: dict[str, Any]) -> int | None:
    name = event.get("allocator_name")
    if name is not None:
        return int(name.split("_")[1]) if name.startswith("GPU_") and name.endswith("_bfc") else None
    return event.get("index_on_host", event.get("device_ordinal"))


def ingest(path: Path, warehouse: Warehouse) -> str:
    report = warehouse.ingest([path])
    assert report.results[0].error is None, report.results[0].error
    return str(report.results[0].trace_id)


def per_device(warehouse: Warehouse, trace_id: str) -> dict[tuple[int, str], tuple[int, int, int]]:
    rows = warehouse.query("SELECT device, kind, count(*), sum(bytes), max(total_allocated) FROM memory_events "
                           f"WHERE trace_id = '{trace_id}' GROUP BY ALL").rows
    return {(d, k): (n, b, m) for d, k, n, b, m in rows}


def expected(events: list[dict[str, Any]]) -> dict[tuple[int, str], tuple[int, int, int]]:
    """Counts, byte sums (a free's size from its allocation at the same address where it gives none) and the
    largest in-use figure (bytes_allocated + bytes_reserved), per device and kind."""
    out: dict[tuple[int, str], list[int]] = collections.defaultdict(lambda: [0, 0, 0])
    sizes: dict[tuple[int, int], Any] = {}
    for e in events:
        device = device_of(e)
        if device is None:
            continue
        size: Any = e.get("allocation_bytes")
        if e["kind"] == "alloc":
            sizes[(device, e["addr"])] = size
        else:
            known = sizes.pop((device, e["addr"]), None)
            size = known if size is None else size
        figures = out[(device, e["kind"])]
        figures[0] += 1
        figures[1] += size if e["kind"] == "alloc" else -size
        figures[2] = max(figures[2], e["bytes_allocated"] + e.get("bytes_reserved", 0))
    return {k: (v[0], v[1], v[2]) for k, v in out.items()}


def test_jax_h200_sample_allocator_events(warehouse: Warehouse) -> None:
    events = allocator_events(JAX_H200)
    assert len(events) == 112 and {e["allocator_name"] for e in events} == {"GPU_0_bfc"}
    trace = ingest(JAX_H200, warehouse)
    assert per_device(warehouse, trace) == expected(events)
    # every row: the device's type, and the allocator's figure at that event as the total
    rows = warehouse.query("SELECT device_type, kind, addr, bytes, total_allocated, total_reserved, ts_ns "
                           f"FROM memory_events WHERE trace_id = '{trace}' ORDER BY ts_ns, event_id").rows
    assert {r[0] for r in rows} == {"cuda"}
    assert [(r[1], r[2], abs(r[3]), r[4]) for r in rows] == [
        (e["kind"], e["addr"], e["allocation_bytes"], e["bytes_allocated"]) for e in events]
    assert all(r[4] == r[5] for r in rows)
    # capacity: the device plane's memory_size
    assert warehouse.query(f"SELECT memory_bytes FROM devices WHERE trace_id = '{trace}'").rows == [(150109880320,)]
    analysis = warehouse.analyze(trace_id=trace)
    peak = analysis.memory.row(0, named=True)
    assert peak["peak_allocated_bytes"] == max(e["bytes_allocated"] for e in events)
    assert peak["capacity_bytes"] == 150109880320 and 0 <= peak["headroom_pct"] <= 100


@pytest.mark.skipif(not TPU_REAL.exists(), reason="../shared/real_traces absent")
def test_real_tpu_allocator_events_and_capacity(warehouse: Warehouse) -> None:
    events = allocator_events(TPU_REAL)
    trace = ingest(TPU_REAL, warehouse)
    assert per_device(warehouse, trace) == expected(events)
    assert sum(n for n, _, _ in per_device(warehouse, trace).values()) == len(events) == 906
    # frees carry no size on TPU: every one is paired with its allocation, so the bytes balance
    assert warehouse.query(f"SELECT count(*) FROM memory_events WHERE trace_id = '{trace}' AND bytes IS NULL"
                           ).rows == [(0,)]
    capacity: dict[int, int] = {}
    for e in events:
        total = e["bytes_allocated"] + e.get("bytes_reserved", 0) + e["bytes_available"]
        capacity[e["index_on_host"]] = max(capacity.get(e["index_on_host"], 0), total)
    stored = dict(warehouse.query(f"SELECT device, memory_bytes FROM devices WHERE trace_id = '{trace}'").rows)
    assert stored == capacity
    ops = {r[0] for r in warehouse.query(f"SELECT op FROM memory_events WHERE trace_id = '{trace}' AND op IS NOT NULL"
                                         ).rows}
    assert ops == {e["tf_op"] for e in events if "tf_op" in e}


@pytest.mark.skipif(not MI300_REAL.exists(), reason="../shared/real_traces absent")
def test_real_mi300_host_allocator_left_out(warehouse: Warehouse) -> None:
    events = allocator_events(MI300_REAL)
    report = warehouse.ingest([MI300_REAL])
    trace = str(report.results[0].trace_id)
    assert per_device(warehouse, trace) == expected(events)
    host = sum(1 for e in events if e["allocator_name"] == "xla_gpu_host_bfc")
    assert host and any(f"xla_gpu_host_bfc ({host})" in w for w in report.results[0].warnings)
    assert {r[0] for r in warehouse.query(f"SELECT DISTINCT device_type FROM memory_events WHERE trace_id = '{trace}'"
                                          ).rows} == {"hip"}


def generated(path: Path) -> Path:
    """A GPU plane with memory_size, a TPU plane without, and a host plane with allocator events of each."""
    space = XSpaceWhole(hostnames=["host0"])
    gpu = space.planes.add(id=1, name="/device:GPU:0")
    tpu = space.planes.add(id=2, name="/device:TPU:1")
    host = space.planes.add(id=3, name="/host:CPU")
    names = ("memory_size", "device_vendor", "allocator_name", "bytes_allocated", "bytes_reserved",
             "bytes_available", "allocation_bytes", "requested_bytes", "addr", "tf_op", "index_on_host")
    for plane in (gpu, tpu, host):
        for number, name in enumerate(names, 1):
            plane.stat_metadata[number].id = number
            plane.stat_metadata[number].name = name
    sid = {name: i for i, name in enumerate(names, 1)}
    gpu.stats.add(metadata_id=sid["memory_size"], int64_value=80 << 30)
    gpu.stats.add(metadata_id=sid["device_vendor"], str_value="Nvidia")
    tpu.stats.add(metadata_id=sid["device_vendor"], str_value="Google")
    tpu.event_metadata[1].name = "fusion.1"
    tpu.lines.add(id=1, name="XLA Ops", timestamp_ns=T0).events.add(metadata_id=1, offset_ps=0, duration_ps=1_000_000)
    gpu.event_metadata[1].name = "gemm"
    stream = gpu.lines.add(id=7, name="Stream #7(Compute)", timestamp_ns=T0)
    stream.events.add(metadata_id=1, offset_ps=0, duration_ps=1_000_000)
    host.event_metadata[1].name = "MemoryAllocation"
    host.event_metadata[2].name = "MemoryDeallocation"
    host.event_metadata[3].name = "PjitFunction(f)"
    line = host.lines.add(id=42, name="python", timestamp_ns=T0)
    line.events.add(metadata_id=3, offset_ps=0, duration_ps=50_000_000)

    def event(kind: int, at_ns: int, **stats: object) -> None:
        e = line.events.add(metadata_id=kind, offset_ps=at_ns * 1000, duration_ps=0)
        for name, value in stats.items():
            if isinstance(value, str):
                e.stats.add(metadata_id=sid[name], str_value=value)
            else:
                e.stats.add(metadata_id=sid[name], int64_value=int(value))  # type: ignore[call-overload]

    gib = 1 << 30
    event(1, 100, allocator_name="GPU_0_bfc", bytes_allocated=gib, bytes_reserved=0, bytes_available=59 * gib,
          allocation_bytes=gib, requested_bytes=gib, addr=0x1000, tf_op="dot")
    event(1, 200, allocator_name="GPU_0_bfc", bytes_allocated=3 * gib, bytes_reserved=0, bytes_available=57 * gib,
          allocation_bytes=2 * gib, addr=0x2000)
    event(1, 250, allocator_name="xla_gpu_host_bfc", bytes_allocated=256, bytes_available=1 << 36,
          allocation_bytes=256, addr=0x9000)
    event(2, 300, allocator_name="GPU_0_bfc", bytes_allocated=gib, bytes_reserved=0, bytes_available=59 * gib,
          allocation_bytes=2 * gib, addr=0x2000)
    event(1, 400, index_on_host=1, bytes_allocated=5 * gib, bytes_reserved=gib, bytes_available=10 * gib,
          allocation_bytes=5 * gib, addr=0x5000, tf_op="fusion.1")
    event(2, 500, index_on_host=1, bytes_allocated=0, bytes_reserved=gib, bytes_available=15 * gib, addr=0x5000)
    path.write_bytes(space.SerializeToString())
    return path


def test_generated_xplane_every_case(tmp_path: Path, warehouse: Warehouse) -> None:
    path = generated(tmp_path / "gen.xplane.pb")
    report = warehouse.ingest([path])
    trace = str(report.results[0].trace_id)
    gib = 1 << 30
    rows = warehouse.query("SELECT rank, device, device_type, kind, addr, bytes, total_allocated, op, tid "
                           f"FROM memory_events WHERE trace_id = '{trace}' ORDER BY ts_ns").rows
    assert rows == [
        (0, 0, "cuda", "alloc", 0x1000, gib, gib, "dot", 42),
        (0, 0, "cuda", "alloc", 0x2000, 2 * gib, 3 * gib, None, 42),
        (0, 0, "cuda", "free", 0x2000, -2 * gib, gib, None, 42),
        (1, 1, "tpu", "alloc", 0x5000, 5 * gib, 6 * gib, "fusion.1", 42),
        (1, 1, "tpu", "free", 0x5000, -5 * gib, gib, None, 42),  # its size from the allocation at its address
    ]
    assert any("xla_gpu_host_bfc (1)" in w for w in report.results[0].warnings)
    # capacity: the GPU plane's memory_size; the TPU plane has none: the allocator's in use + available
    assert dict(warehouse.query(f"SELECT device, memory_bytes FROM devices WHERE trace_id = '{trace}'").rows) == {
        0: 80 * gib, 1: 16 * gib}
    peaks = warehouse.analyze(trace_id=trace).memory.sort("device")
    assert peaks["peak_allocated_bytes"].to_list() == [3 * gib, 6 * gib]
    assert peaks["headroom_pct"].to_list() == [pytest.approx(100 * 77 / 80), pytest.approx(100 * 10 / 16)]


def test_bulk_and_one_by_one_give_the_same_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tracelake.ingest import xla_host

    def read(home: Path) -> list[tuple[Any, ...]]:
        warehouse = Warehouse(home)
        warehouse.ingest([JAX_H200])
        return warehouse.query("SELECT * EXCLUDE (trace_id) FROM memory_events ORDER BY event_id").rows

    bulk = read(tmp_path / "bulk")
    monkeypatch.setattr(xla_host.HostLines, "host_columns", lambda *args, **kwargs: None)  # every unit one by one
    assert read(tmp_path / "one") == bulk and len(bulk) == 112
