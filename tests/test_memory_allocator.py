"""Allocator snapshot analyses (analysis/allocator.py): the cache's figures, what is live, OOMs, findings.

The real H200 snapshots are counted here straight from their pickles (plain ``pickle``: our own sample files)
and compared with what ``Warehouse.analyze`` returns; the causes and thresholds are checked on built rows.
"""

from __future__ import annotations

import collections
import gzip
import json
import pickle
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from typer.testing import CliRunner

from support import ROOT
from tracelake.analysis import allocator
from tracelake.analysis.memory_findings import size
from tracelake.api.cli import app
from tracelake.warehouse import Warehouse

GPU = ROOT / "sample_traces" / "gpu_h200"
TRAIN_SNAPSHOT = GPU / "train" / "memory_snapshot.pickle.gz"
LEAK_SNAPSHOT = GPU / "leak" / "leak_snapshot.pickle.gz"
MIB, GIB = 1 << 20, 1 << 30


def load(path: Path) -> dict[str, Any]:
    return pickle.loads(gzip.decompress(path.read_bytes()))


def first_user_frame(frames: list[dict[str, Any]]) -> str | None:
    for frame in frames or []:
        name = frame.get("filename", "")
        if name.endswith(".py") and "/torch/" not in name and not name.startswith("torch/"):
            return f"{name.rsplit('/', 1)[-1]}:{frame['line']} {frame['name']}"
    return None


def counted(doc: dict[str, Any]) -> dict[str, Any]:
    """The figures of :func:`allocator.snapshot_summary`, counted from the snapshot's dicts."""
    blocks = [(s, b) for s in doc["segments"] for b in s["blocks"]]
    free = [b["size"] for _, b in blocks if b["state"] == "inactive"]
    holding = {id(s) for s, b in blocks if b["state"] != "inactive"}
    return {
        "segments": len(doc["segments"]),
        "reserved_bytes": sum(s["total_size"] for s in doc["segments"]),
        "allocated_bytes": sum(b["size"] for _, b in blocks if b["state"] == "active_allocated"),
        "requested_bytes": sum(b["requested_size"] for _, b in blocks if b["state"] == "active_allocated"),
        "awaiting_free_bytes": sum(b["size"] for _, b in blocks if b["state"] == "active_awaiting_free"),
        "free_bytes": sum(free), "free_blocks": len(free), "largest_free_bytes": max(free, default=None),
        "small_free_bytes": sum(f for f in free if f < 2 * MIB),
        "stranded_free_bytes": sum(b["size"] for s, b in blocks if b["state"] == "inactive" and id(s) in holding),
    }


@pytest.fixture(scope="module")
def analysed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    warehouse = Warehouse(tmp_path_factory.mktemp("allocator") / "wh")
    warehouse.ingest([TRAIN_SNAPSHOT], job="train")
    warehouse.ingest([LEAK_SNAPSHOT], job="leak")
    return {"train": warehouse.analyze(job="train"), "leak": warehouse.analyze(job="leak")}


@pytest.mark.parametrize(("job", "path"), [("train", TRAIN_SNAPSHOT), ("leak", LEAK_SNAPSHOT)])
def test_snapshot_summary_matches_the_pickle(analysed: dict[str, Any], job: str, path: Path) -> None:
    summary = analysed[job].allocator_snapshots
    assert summary.height == 1
    row = summary.row(0, named=True)
    expected = counted(load(path))
    assert {k: row[k] for k in expected} == expected
    free, largest = expected["free_bytes"], expected["largest_free_bytes"]
    assert row["fragmentation_pct"] == pytest.approx(100 * (1 - largest / free))


def test_train_snapshot_is_fragmented_and_says_so(analysed: dict[str, Any]) -> None:
    expected = counted(load(TRAIN_SNAPSHOT))
    found = {f.kind: f for f in analysed["train"].findings}
    fragmented = found["allocator_fragmentation"]
    assert fragmented.title == (f"segments hold {size(expected['reserved_bytes'])}, {size(expected['free_bytes'])} "
                                f"of it free in {expected['free_blocks']} blocks, the largest "
                                f"{size(expected['largest_free_bytes'])}: fragmentation")
    assert "expandable_segments:True" in fragmented.detail and fragmented.gain_ns == 0
    assert "allocator_oom" not in found


def test_live_by_frame_matches_the_pickle(analysed: dict[str, Any]) -> None:
    doc = load(TRAIN_SNAPSHOT)
    by_frame: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for segment in doc["segments"]:
        for block in segment["blocks"]:
            if block["state"] != "inactive":
                key = first_user_frame(block.get("frames", [])) or allocator.NO_FRAME
                by_frame[key][0] += 1
                by_frame[key][1] += block["size"]
    live = analysed["train"].allocator_live
    assert {r["frame"]: [r["blocks"], r["bytes"]] for r in live.to_dicts()} == dict(by_frame)
    assert live["share_pct"].sum() == pytest.approx(100.0)
    assert live["bytes"].to_list() == sorted(live["bytes"].to_list(), reverse=True)


def test_leak_oom_against_the_cache(analysed: dict[str, Any]) -> None:
    doc = load(LEAK_SNAPSHOT)
    ooms = [e for trace in doc["device_traces"] for e in trace if e["action"] == "oom"]
    rows = analysed["leak"].allocator_ooms
    assert [(r["requested_bytes"], r["device_free_bytes"], r["cause"]) for r in rows.to_dicts()] == [
        (e["size"], e["device_free"], "too_large") for e in ooms]
    finding = {f.kind: f for f in analysed["leak"].findings}["allocator_oom"]
    assert finding.title == "rank 0 failed to allocate 256.0 TiB"
    assert "larger than all free memory" in finding.detail and "capture_gpu.py:269 part_leak" in finding.detail


def _segments(blocks: list[tuple[int, int, str]], expandable: bool = False) -> pl.DataFrame:
    """Rows of ``allocator_segments`` for (segment index, block bytes, state) triples on rank 0, device 0."""
    sizes: dict[int, int] = collections.Counter()
    for seg, nbytes, _ in blocks:
        sizes[seg] += nbytes
    return pl.DataFrame([{"trace_id": "t", "rank": 0, "device": 0, "segment_index": seg, "segment_bytes": sizes[seg],
                          "is_expandable": expandable, "block_index": i, "block_bytes": nbytes,
                          "block_requested_bytes": nbytes, "block_state": state, "block_frame": None}
                         for i, (seg, nbytes, state) in enumerate(blocks)])


def _oom(ask: int, device_free: int) -> pl.DataFrame:
    return pl.DataFrame([{"trace_id": "t", "rank": 0, "device": 0, "action": "oom", "bytes": ask, "ts_ns": 1,
                          "device_free_bytes": device_free, "frame": "train.py:10 step"}])


def test_oom_causes() -> None:
    # 3 GiB free in 1 GiB pieces, 512 MiB free on the device
    summary = allocator.snapshot_summary(_segments([(0, GIB, "inactive"), (0, GIB, "active_allocated"),
                                                    (1, GIB, "inactive"), (2, GIB, "inactive")]))
    assert summary.row(0, named=True)["stranded_free_bytes"] == GIB
    causes = [allocator.out_of_memory(_oom(ask, 512 * MIB), summary)["cause"][0]
              for ask in (4 * GIB, 2 * GIB, GIB, 256 * MIB)]
    assert causes == ["too_large", "fragmentation", "fits_now", "fits_now"]
    without = allocator.out_of_memory(_oom(GIB, 0), summary.clear())
    assert without["cause"][0] is None and without["free_bytes"][0] is None


def test_fragmentation_thresholds() -> None:
    pieces = [(i, GIB // 4, "inactive") for i in range(8)] + [(8, GIB, "active_allocated")]
    assert [f.kind for f in allocator.from_snapshot(allocator.snapshot_summary(_segments(pieces)))] == [
        "allocator_fragmentation"]
    one_block = [(0, 2 * GIB, "inactive"), (1, GIB, "active_allocated")]  # all free memory in one piece
    assert allocator.from_snapshot(allocator.snapshot_summary(_segments(one_block))) == []
    little = [(i, 64 * MIB, "inactive") for i in range(8)] + [(8, GIB, "active_allocated")]  # 512 MiB: under 1 GiB
    assert allocator.from_snapshot(allocator.snapshot_summary(_segments(little))) == []
    expandable = allocator.from_snapshot(allocator.snapshot_summary(_segments(pieces, expandable=True)))
    assert "max_split_size_mb" in expandable[0].detail and "expandable_segments:True" not in expandable[0].detail


def test_analyze_json_has_the_snapshot(tmp_path: Path) -> None:
    home = tmp_path / "home"
    Warehouse(home).ingest([TRAIN_SNAPSHOT], job="train")
    result = CliRunner().invoke(app, ["analyze", "--job", "train", "--json", "--home", str(home)])
    assert result.exit_code == 0, result.output
    body = json.loads(result.output)
    assert body["allocator_snapshots"][0]["free_bytes"] == counted(load(TRAIN_SNAPSHOT))["free_bytes"]
    assert "allocator_fragmentation" in {f["kind"] for f in body["findings"]}
    text = CliRunner().invoke(app, ["analyze", "--job", "train", "--home", str(home)])
    assert text.exit_code == 0 and "fragmentation" in text.output
