"""MTIA traces (Kineto JSON of Meta's accelerator): device ops, copies, launches, device type.

docs/formats.md, section 1 describes what the parser reads; the real trace is
../shared/real_traces/pytorch_other/hta_mtia_single_rank (skipped where absent).
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from support import REAL_TRACES
from tracelake.api.cli import app
from tracelake.warehouse import Warehouse

MTIA = REAL_TRACES / "pytorch_other" / "hta_mtia_single_rank" / "mtia_rank_0.json.gz"

pytestmark = [
    pytest.mark.slow,  # ingests a large real trace
    pytest.mark.skipif(not MTIA.is_file(), reason="../shared/real_traces MTIA trace is not present"),
]


@pytest.fixture(scope="module")
def events() -> list[dict[str, object]]:
    """The trace's events, read with the standard library (the independent count)."""
    with gzip.open(MTIA, "rt") as f:
        found: list[dict[str, object]] = json.load(f)["traceEvents"]
    return found


@pytest.fixture(scope="module")
def mtia_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("mtia") / "wh"
    report = Warehouse(home).ingest([MTIA], job="mtia")
    assert report.ok, [r.error for r in report.failed]
    return home


def test_every_mtia_device_op_is_stored(events: list[dict[str, object]], mtia_home: Path) -> None:
    ops = [e for e in events if e.get("ph") == "X" and e.get("cat") == "mtia_ccp_events"]
    expected = Counter("memcpy" if e["name"] == "dma_request" else "kernel" for e in ops)
    wh = Warehouse(mtia_home)
    stored = dict(wh.query("SELECT kind, count(*) FROM device_ops GROUP BY kind").rows)
    assert stored == dict(expected) and sum(stored.values()) > 0
    # The pid is the device; DMA sizes are the copies' bytes.
    assert wh.query("SELECT DISTINCT device FROM device_ops").rows == [(int(str(ops[0]["pid"])),)]
    size = sum(int(e["args"]["size"]) for e in ops if e["name"] == "dma_request")  # type: ignore[index]
    assert wh.query("SELECT sum(bytes) FROM device_ops WHERE kind = 'memcpy'").rows == [(size,)]
    categories = dict(wh.query("SELECT category, count(*) FROM device_ops GROUP BY 1").rows)
    assert categories == {"memory": expected["memcpy"], "compute": expected["kernel"]}
    traces = wh.query("SELECT device_type, device_count, device_op_count FROM traces").rows
    assert traces == [("mtia", 1, len(ops))]


def test_kernels_link_to_their_runtime_calls(events: list[dict[str, object]], mtia_home: Path) -> None:
    """Kernels carry the ``correlation`` of the ``mtia_runtime`` call that submitted them."""
    runtime = {e["args"]["correlation"] for e in events  # type: ignore[index]
               if e.get("ph") == "X" and e.get("cat") == "mtia_runtime"}
    kernels = [e for e in events if e.get("cat") == "mtia_ccp_events" and e["name"] != "dma_request"]
    linked = sum(1 for e in kernels if e["args"].get("correlation") in runtime)  # type: ignore[union-attr]
    rows = Warehouse(mtia_home).query(
        "SELECT count(*) FROM device_ops d JOIN host_ops h USING (trace_id, correlation) "
        "WHERE h.cat = 'mtia_runtime' AND d.kind = 'kernel'").rows
    assert rows == [(linked,)] and linked > 0


def test_analyze_speaks_of_the_device_time(mtia_home: Path) -> None:
    result = CliRunner().invoke(app, ["analyze", "--job", "mtia", "--home", str(mtia_home)])
    assert result.exit_code == 0, result.output
    assert "no findings" not in result.output and "no device op" not in result.output
    assert "fc-dtype_Float" in result.output and "dma_request" in result.output
    analysis = Warehouse(mtia_home).analyze(job="mtia")
    whole = analysis.breakdown.row(0, named=True)
    assert whole["compute_ns"] > 0 and whole["memory_ns"] > 0
