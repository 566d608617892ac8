"""Every real PyTorch profiler trace in ../shared/real_traces ingests, with counts that match."""

from __future__ import annotations

import gzip
from collections import Counter
from pathlib import Path

import orjson
import pytest

from support import real_kineto_files
from tracelake.warehouse import Warehouse

pytestmark = pytest.mark.slow  # ingests every real trace of ../shared/real_traces

DEVICE_KINDS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset", "cuda_sync": "sync"}
FILES = real_kineto_files()


@pytest.fixture(scope="module")
def real_warehouse(tmp_path_factory: pytest.TempPathFactory) -> Warehouse:
    if not FILES:
        pytest.skip("../shared/real_traces/pytorch_profiler is not present")
    wh = Warehouse(tmp_path_factory.mktemp("real") / "wh")
    report = wh.ingest(FILES, job="real")
    assert report.ok, [r.error for r in report.failed]
    assert report.count("ingested") == len(FILES)
    return wh


@pytest.mark.parametrize("path", FILES, ids=[p.parent.name for p in FILES])
def test_real_trace_counts_match(path: Path, real_warehouse: Warehouse) -> None:
    doc = orjson.loads(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes())
    events = doc["traceEvents"]
    expected = Counter(DEVICE_KINDS[e["cat"]] for e in events if e.get("cat") in DEVICE_KINDS)
    trace = real_warehouse.query(
        "SELECT trace_id, event_count, device_op_count FROM traces WHERE source_path = ?", [str(path.resolve())]
    ).as_dicts()
    assert len(trace) == 1
    assert trace[0]["event_count"] == len(events)
    rows = real_warehouse.query(
        "SELECT kind, count(*) FROM device_ops WHERE trace_id = ? GROUP BY kind", [trace[0]["trace_id"]]
    ).rows
    assert dict(rows) == dict(expected)
    assert trace[0]["device_op_count"] == sum(expected.values())
    host_expected = sum(
        1 for e in events
        if e.get("ph") == "X" and e.get("cat") not in DEVICE_KINDS
        and e.get("cat") not in ("gpu_user_annotation", "Trace", "ac2g", "fwdbwd")
    )
    host = real_warehouse.query("SELECT count(*) FROM host_ops WHERE trace_id = ?", [trace[0]["trace_id"]]).rows
    assert host[0][0] == host_expected


def test_real_traces_cover_the_hardware_we_claim(real_warehouse: Warehouse) -> None:
    rows = real_warehouse.query("SELECT device_type, device_name FROM traces").rows
    types = {t for t, _ in rows}
    names = " ".join(n or "" for _, n in rows)
    assert {"cuda", "rocm"} <= types
    for gpu in ("H100", "A100", "V100", "B200", "MI300"):
        assert gpu in names, gpu


def test_communication_in_real_traces(real_warehouse: Warehouse) -> None:
    comm = real_warehouse.query(
        "SELECT count(*) FROM device_ops WHERE category = 'communication' AND name ILIKE 'nccl%'"
    ).rows[0][0]
    linked = real_warehouse.query("SELECT count(*) FROM collectives WHERE kernel_event_id IS NOT NULL").rows[0][0]
    assert comm > 0 and linked > 0
