"""The PyTorch memory timeline export and CUDA allocator snapshots, end to end.

Every figure is counted here from the files themselves (json/gzip for the exports, ``pickle`` for
the snapshots: our own, trusted files) and compared with what SQL over the warehouse returns.
Bad and hostile inputs must fail naming the file and the place, and leave the warehouse as it was.
"""

from __future__ import annotations

import collections
import functools
import gzip
import json
import pickle
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from support import REAL_TRACES, ROOT
from tracelake import ingest
from tracelake.api.cli import app
from tracelake.contracts.errors import TraceFormatError
from tracelake.ingest import allocator_snapshot, memory_timeline
from tracelake.ingest.model import ParseOptions
from tracelake.sample_traces import generate_nccl
from tracelake.warehouse import Warehouse

GPU = ROOT / "sample_traces" / "gpu_h200"
TRAIN_TIMELINE = GPU / "train" / "memory_timeline.raw.json.gz"
HTA_TIMELINE = REAL_TRACES / "pytorch_other" / "hta_memory_analysis" / "memory_timeline.raw.gz"
TRAIN_SNAPSHOT = GPU / "train" / "memory_snapshot.pickle.gz"
LEAK_SNAPSHOT = GPU / "leak" / "leak_snapshot.pickle.gz"

#: PyTorch's ``_CATEGORY_TO_COLORS`` order (torch/profiler/_memory_profiler.py): the export's category index.
CATEGORY = ["parameter", "optimizer_state", "input", "temporary", "activation", "gradient", "autograd_detail", None]
#: ``Action`` values, from 1.
ACTION = {1: "preexisting", 2: "create", 3: "increment_version", 4: "destroy"}
TIB = 1 << 40


def _timelines() -> list[Any]:
    out = [pytest.param(TRAIN_TIMELINE, id="h200-train")]
    marks = [] if HTA_TIMELINE.is_file() else [pytest.mark.skip(reason="../shared/real_traces is not present")]
    return [*out, pytest.param(HTA_TIMELINE, id="hta", marks=marks)]


def _rows(path: Path) -> list[list[int]]:
    rows: list[list[int]] = json.loads(gzip.decompress(path.read_bytes()))
    return rows


def _count(warehouse: Warehouse, table: str) -> int:
    value = warehouse.query(f"SELECT count(*) FROM {table}").rows[0][0]
    assert isinstance(value, int)
    return value


def _tables(warehouse: Warehouse) -> dict[str, int]:
    return {t: _count(warehouse, t) for t in ("traces", "memory_timeline", "allocator_segments", "allocator_events")}


# -- the memory timeline export ------------------------------------------------------------

@pytest.mark.parametrize("path", _timelines())
def test_a_real_memory_timeline_ingests_with_the_files_counts(path: Path, warehouse: Warehouse) -> None:
    rows = _rows(path)
    result = warehouse.ingest_file(path, job="mem")
    assert result.ok, result.error
    assert result.format == "memory_timeline" and result.rank == 0
    assert result.rows["memory_timeline"] == len(rows)
    # bytes per category, and the peak of each category's running total in the file's order
    sums: dict[str | None, int] = collections.Counter()
    peaks: dict[str | None, int] = {}
    for _, _, nbytes, category in rows:
        sums[CATEGORY[category]] += nbytes
        peaks[CATEGORY[category]] = max(peaks.get(CATEGORY[category], 0), sums[CATEGORY[category]])
    got = warehouse.query("SELECT category, sum(bytes), max(running) FROM (SELECT category, bytes, sum(bytes) OVER "
                          "(PARTITION BY category ORDER BY event_id) AS running FROM memory_timeline) GROUP BY ALL")
    assert {r[0]: (r[1], r[2]) for r in got.rows} == {c: (sums[c], peaks[c]) for c in sums}
    actions = collections.Counter(ACTION[r[1]] for r in rows)
    got = warehouse.query("SELECT action, count(*) FROM memory_timeline GROUP BY ALL")
    assert dict(got.rows) == actions
    times = [r[0] for r in rows if r[0] != -1]
    got = warehouse.query("SELECT count(*) FILTER (ts_ns IS NULL), min(ts_ns), max(ts_ns), count(DISTINCT rank), "
                          "count(device) FROM memory_timeline")
    assert got.rows == [(len(rows) - len(times), min(times), max(times), 1, 0)]
    # every pre-existing row has time -1 in both files; the times are ns since the epoch (after 2020)
    assert all(r[0] == -1 for r in rows if r[1] == 1) and min(times) > 1_577_836_800 * 10**9
    trace = warehouse.query("SELECT format, start_ns, end_ns, event_count FROM traces").rows
    assert trace == [("memory_timeline", min(times), max(times), len(rows))]


def test_the_h200_timeline_holds_every_category(warehouse: Warehouse) -> None:
    """A 6-layer GPT trained with AdamW: parameters, optimizer state, activations and gradients all appear."""
    assert warehouse.ingest_file(TRAIN_TIMELINE).ok
    got = {r[0] for r in warehouse.query("SELECT DISTINCT category FROM memory_timeline").rows}
    assert {"parameter", "optimizer_state", "activation", "gradient", "input", "autograd_detail"} <= got


def test_the_timeline_reads_the_same_in_small_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows that straddle the reader's chunks, and the array's last bracket alone in a chunk, change nothing."""
    whole = ingest.parse(TRAIN_TIMELINE).tables["memory_timeline"].drop(["trace_id"])
    monkeypatch.setattr(memory_timeline, "iter_chunks",
                        functools.partial(memory_timeline.iter_chunks, chunk_bytes=1009))
    chunked = ingest.parse(TRAIN_TIMELINE).tables["memory_timeline"].drop(["trace_id"])
    assert chunked.equals(whole)
    data = gzip.decompress(TRAIN_TIMELINE.read_bytes())
    assert data.endswith(b"]]")
    monkeypatch.setattr(memory_timeline, "iter_chunks", lambda *a, **k: iter([data[:-1], data[-1:]]))
    assert ingest.parse(TRAIN_TIMELINE).tables["memory_timeline"].num_rows == whole.num_rows


def test_the_rank_comes_from_the_file_name(tmp_path: Path, warehouse: Warehouse) -> None:
    path = tmp_path / "rank-5.memory_timeline.raw.json.gz"
    path.write_bytes(TRAIN_TIMELINE.read_bytes())
    result = warehouse.ingest_file(path)
    assert result.ok and result.rank == 5
    assert warehouse.query("SELECT DISTINCT rank FROM memory_timeline").rows == [(5,)]
    assert warehouse.query("SELECT rank_source FROM traces").rows == [("file name",)]


# -- allocator snapshots -------------------------------------------------------------------

@pytest.mark.parametrize("path", [TRAIN_SNAPSHOT, LEAK_SNAPSHOT], ids=["train", "leak"])
def test_a_real_snapshot_ingests_with_the_files_counts(path: Path, warehouse: Warehouse) -> None:
    snap = pickle.loads(gzip.decompress(path.read_bytes()))
    segments, traces = snap["segments"], snap["device_traces"]
    blocks = [b for s in segments for b in s["blocks"]]
    entries = [e for trace in traces for e in trace]
    result = warehouse.ingest_file(path, job="snap")
    assert result.ok, result.error
    assert result.format == "allocator_snapshot"
    assert result.rows["allocator_segments"] == len(blocks) and result.rows["allocator_events"] == len(entries)
    got = warehouse.query("SELECT count(*), sum(segment_bytes), sum(segment_allocated_bytes), "
                          "sum(segment_active_bytes) FROM allocator_segments WHERE block_index = 0")
    assert got.rows == [(len(segments), sum(s["total_size"] for s in segments),
                         sum(s["allocated_size"] for s in segments), sum(s["active_size"] for s in segments))]
    by_state: dict[str, int] = collections.Counter()
    for b in blocks:
        by_state[b["state"]] += b["size"]
    got = warehouse.query("SELECT block_state, sum(block_bytes) FROM allocator_segments GROUP BY ALL")
    assert dict(got.rows) == by_state
    # a segment's blocks tile it exactly
    got = warehouse.query("SELECT count(*) FROM (SELECT segment_index, any_value(segment_bytes) AS total, "
                          "sum(block_bytes) AS tiled FROM allocator_segments GROUP BY ALL) WHERE total <> tiled")
    assert got.rows == [(0,)]
    actions = collections.Counter(e["action"] for e in entries)
    assert dict(warehouse.query("SELECT action, count(*) FROM allocator_events GROUP BY ALL").rows) == actions
    net = sum(e["size"] for e in entries if e["action"] == "alloc") - sum(
        e["size"] for e in entries if e["action"] == "free_completed")
    got = warehouse.query("SELECT sum(bytes) FILTER (action = 'alloc') - sum(bytes) FILTER "
                          "(action = 'free_completed'), min(ts_ns), max(ts_ns) FROM allocator_events")
    times = [e["time_us"] * 1000 for e in entries]
    assert got.rows == [(net, min(times), max(times))]
    ooms = [e for e in entries if e["action"] == "oom"]
    got = warehouse.query("SELECT bytes, device_free_bytes, addr, frame FROM allocator_events WHERE action = 'oom'")
    assert [r[:3] for r in got.rows] == [(e["size"], e["device_free"], None) for e in ooms]
    assert len(ooms) == (1 if path == LEAK_SNAPSHOT else 0)


def test_the_leak_snapshot_shows_the_leak_and_the_failed_allocation(warehouse: Warehouse) -> None:
    """The leak run keeps 32 MB a step, empties the cache every step and asks for 256 TiB at the end."""
    snap = pickle.loads(gzip.decompress(LEAK_SNAPSHOT.read_bytes()))
    kept = [b for s in snap["segments"] for b in s["blocks"]
            if b["state"] == "active_allocated" and b["size"] == 32 << 20]
    frees = sum(1 for e in snap["device_traces"][0] if e["action"] == "segment_free")
    assert warehouse.ingest_file(LEAK_SNAPSHOT).ok
    got = warehouse.query("SELECT count(*) FROM allocator_segments WHERE block_state = 'active_allocated' "
                          "AND block_bytes = 32 * 1024 * 1024")
    assert got.rows == [(len(kept),)] and len(kept) >= 8
    assert warehouse.query("SELECT count(*) FROM allocator_events WHERE action = 'segment_free'").rows == [(frees,)]
    assert frees > 0
    (oom,) = warehouse.query("SELECT bytes, frame FROM allocator_events WHERE action = 'oom'").rows
    assert oom[0] == 256 * TIB
    assert isinstance(oom[1], str) and oom[1].startswith("capture_gpu.py:")  # the user's line, not torch's


def test_the_user_frame_skips_cpp_and_torch_frames() -> None:
    frames = [{"filename": "CUDACachingAllocator.cpp", "line": 0, "name": "malloc"},
              {"filename": "??", "line": 0, "name": "_PyEval_EvalFrameDefault"},
              {"filename": "/usr/lib/python3/site-packages/torch/nn/modules/linear.py", "line": 125, "name": "forward"},
              {"filename": "/home/me/train.py", "line": 42, "name": "step"},
              {"filename": "/home/me/main.py", "line": 7, "name": "<module>"}]
    assert allocator_snapshot.user_frame(frames) == "train.py:42 step"
    assert allocator_snapshot.user_frame(frames[:3]) is None
    assert allocator_snapshot.user_frame([]) is None and allocator_snapshot.user_frame("x") is None


def test_the_cli_ingests_both_formats_and_sql_reads_them(home: Path) -> None:
    result = CliRunner().invoke(app, ["ingest", str(TRAIN_TIMELINE), str(TRAIN_SNAPSHOT), str(LEAK_SNAPSHOT),
                                      "--home", str(home), "--job", "gpt", "--quiet"])
    assert result.exit_code == 0, result.output
    warehouse = Warehouse(home)
    got = warehouse.query("SELECT format, count(*) FROM traces WHERE job = 'gpt' GROUP BY ALL ORDER BY 1")
    assert got.rows == [("allocator_snapshot", 2), ("memory_timeline", 1)]
    joined = warehouse.query("SELECT t.source_name, count(*) FROM allocator_events e JOIN traces t USING (trace_id) "
                             "GROUP BY ALL ORDER BY 1").rows
    expected = [(p.name, sum(len(t) for t in pickle.loads(gzip.decompress(p.read_bytes()))["device_traces"]))
                for p in (LEAK_SNAPSHOT, TRAIN_SNAPSHOT)]
    assert joined == expected


def test_detection_tells_snapshots_timelines_and_flight_recorder_apart(tmp_path: Path) -> None:
    for path, name in ((TRAIN_TIMELINE, "memory_timeline"), (TRAIN_SNAPSHOT, "allocator_snapshot"),
                       (LEAK_SNAPSHOT, "allocator_snapshot"), (generate_nccl.FR_OUT / "nccl_trace_rank_3",
                                                               "flight_recorder")):
        assert ingest.detect(path).name == name, path
    plain = tmp_path / "snapshot.pickle"  # not gzipped, under any name
    plain.write_bytes(gzip.decompress(LEAK_SNAPSHOT.read_bytes()))
    assert ingest.detect(plain).name == "allocator_snapshot"
    empty = tmp_path / "empty.pickle"  # no segments cached, no history: still a snapshot
    empty.write_bytes(pickle.dumps({"segments": [], "device_traces": [[]]}, protocol=4))
    assert ingest.detect(empty).name == "allocator_snapshot"
    coalesced = tmp_path / "memory_timeline.json"  # the export without "raw": [times, sizes]
    coalesced.write_text(json.dumps([[10, 20, 30, 40], [[0] * 9] * 4]))
    assert not memory_timeline.sniff(coalesced.read_bytes(), coalesced.name)


# -- bad and hostile inputs ----------------------------------------------------------------

def _snapshot(**changes: Any) -> dict[str, Any]:
    frame = {"filename": "/home/me/train.py", "line": 3, "name": "step"}
    doc: dict[str, Any] = {
        "segments": [{"device": 0, "address": 4096, "total_size": 2 << 20, "allocated_size": 1 << 20,
                      "active_size": 1 << 20, "stream": 0, "segment_type": "large",
                      "blocks": [{"address": 4096, "size": 1 << 20, "requested_size": 1000, "state": "active_allocated",
                                  "frames": [frame]},
                                 {"address": 4096 + (1 << 20), "size": 1 << 20, "state": "inactive", "frames": []}]}],
        "device_traces": [[{"action": "alloc", "addr": 4096, "size": 1 << 20, "stream": 0, "time_us": 1,
                            "frames": [frame]}]],
    }
    doc.update(changes)
    return doc


class _Evil:
    def __reduce__(self) -> tuple[Any, ...]:
        return (print, ("ran",))


def _bad_timeline(rows: str) -> bytes:
    return gzip.compress(b"[[-1, 1, 512, 7], [100, 2, 1024, 0], " + rows.encode() + b"]")


#: (file name, content, what the error must say). Each runs after a good file is in the warehouse.
BAD = {
    "truncated-timeline": ("memory_timeline.raw.json.gz", TRAIN_TIMELINE.read_bytes()[:-200],
                           ["gzip stream ends early", "compressed byte"]),
    "cut-timeline": ("memory_timeline.raw.json.gz", gzip.compress(gzip.decompress(TRAIN_TIMELINE.read_bytes())[:-9]),
                     ["after the last row", "byte"]),
    "unknown-action": ("memory_timeline.raw.json.gz", _bad_timeline("[200, 9, 64, 3]"),
                       ["unknown action code 9", "row 2[1]"]),
    "unknown-category": ("memory_timeline.raw.json.gz", _bad_timeline("[200, 2, 64, 8]"),
                         ["unknown category code 8", "row 2[3]"]),
    "short-row": ("memory_timeline.raw.json.gz", _bad_timeline("[200, 2, 64], [300, 4, -64, 0]"),
                  ["four integers", "row 2"]),
    "text-in-row": ("memory_timeline.raw.json.gz", _bad_timeline('[200, 2, "64", 3]'), ["four integers", "row 2[2]"]),
    "truncated-snapshot": ("rank_1_snapshot.pickle.gz", LEAK_SNAPSHOT.read_bytes()[:-500],
                           ["gzip stream ends early", "compressed byte"]),
    "cut-snapshot": ("snapshot.pickle", pickle.dumps(_snapshot(), protocol=4)[:-40], ["damaged pickle", "byte"]),
    "class-reference": ("snapshot.pickle",
                        pickle.dumps(_snapshot(device_traces=[[{"action": "alloc", "size": 1, "x": _Evil()}]]),
                                     protocol=4), ["refers to builtins.print", "refused", "byte"]),
    "ordered-dict": ("snapshot.pickle", pickle.dumps(_snapshot(allocator_settings=collections.OrderedDict(a=1)),
                                                     protocol=4), ["refers to collections.OrderedDict", "byte"]),
    "size-is-text": ("snapshot.pickle", pickle.dumps(_snapshot(segments=[{**_snapshot()["segments"][0],
                                                                           "total_size": "2MB"}]), protocol=4),
                     ["'total_size' is not a 64-bit integer", "segments[0].total_size"]),
    "block-not-a-dict": ("snapshot.pickle", pickle.dumps(_snapshot(segments=[{**_snapshot()["segments"][0],
                                                                               "blocks": [1]}]), protocol=4),
                         ["expected a record", "segments[0].blocks[0]"]),
    "action-not-text": ("snapshot.pickle", pickle.dumps(_snapshot(device_traces=[[{"action": 3, "size": 1}]]),
                                                        protocol=4), ["action that is not a string",
                                                                      "device_traces[0][0].action"]),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_names_the_file_and_place_and_writes_nothing(case: str, tmp_path: Path,
                                                               warehouse: Warehouse) -> None:
    name, content, says = BAD[case]
    assert warehouse.ingest_file(LEAK_SNAPSHOT).ok
    before = _tables(warehouse)
    path = tmp_path / name
    path.write_bytes(content)
    result = warehouse.ingest_file(path)
    assert not result.ok
    for part in (name, *says):
        assert part in (result.error or ""), (part, result.error)
    assert _tables(warehouse) == before
    with pytest.raises(TraceFormatError) as caught:  # the parser's own error, with its place
        ingest.parse(path)
    assert caught.value.where


def _shared_stack_snapshot(entries: int, depth: int) -> bytes:
    """``entries`` history entries that all share one stack of ``depth`` frames: small as a pickle, huge as rows."""
    frames = [{"filename": f"/site-packages/torch/module_{i}.py", "line": i, "name": "f" * 40} for i in range(depth)]
    entry = {"action": "alloc", "addr": 4096, "size": 512, "stream": 0, "time_us": 1, "frames": frames}
    return pickle.dumps({"segments": [], "device_traces": [[entry] * entries]}, protocol=4)


def test_a_snapshot_that_expands_is_refused_before_rows_are_built(tmp_path: Path, warehouse: Warehouse) -> None:
    path = tmp_path / "rank_0_snapshot.pickle"
    path.write_bytes(_shared_stack_snapshot(50_000, 2_000))
    assert path.stat().st_size < 1_000_000
    result = warehouse.ingest_file(path)
    assert not result.ok
    for part in ("rank_0_snapshot.pickle", "expansion limit", "TRACELAKE_MAX_EXPANSION_RATIO", "device_traces[0]["):
        assert part in (result.error or ""), (part, result.error)
    assert _tables(warehouse) == {"traces": 0, "memory_timeline": 0, "allocator_segments": 0, "allocator_events": 0}


def test_a_snapshot_with_shared_stacks_within_the_limit_ingests(tmp_path: Path, warehouse: Warehouse) -> None:
    """Real snapshots share frames too (pickle memoises them): within the limit they ingest."""
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(_shared_stack_snapshot(200, 20))
    result = warehouse.ingest_file(path)
    assert result.ok, result.error
    assert warehouse.query("SELECT count(*), count(frame) FROM allocator_events").rows == [(200, 0)]


def test_the_expansion_limit_follows_the_options(tmp_path: Path) -> None:
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps(_snapshot(), protocol=4))
    staging = tmp_path / "staging"
    staging.mkdir()
    allocator_snapshot.parse(path, staging, ParseOptions(source_name=path.name))
    tight = ParseOptions(source_name=path.name, max_expansion_ratio=1, max_expanded_bytes=64)
    with pytest.raises(TraceFormatError, match="more than 64 bytes of rows"):
        allocator_snapshot.parse(path, staging, tight)


def test_unknown_snapshot_actions_are_kept_with_a_warning(tmp_path: Path, warehouse: Warehouse) -> None:
    path = tmp_path / "snapshot.pickle"
    future = [{"action": "segment_defrag", "addr": 1, "size": 2, "stream": 0, "time_us": 5, "frames": []}]
    path.write_bytes(pickle.dumps(_snapshot(device_traces=[[], future]), protocol=4))
    result = warehouse.ingest_file(path)
    assert result.ok, result.error
    assert any("segment_defrag (1)" in w for w in result.warnings), result.warnings
    assert warehouse.query("SELECT device, action, ts_ns FROM allocator_events").rows == [(1, "segment_defrag", 5000)]
    got = warehouse.query("SELECT block_frame, block_requested_bytes FROM allocator_segments ORDER BY block_index")
    assert got.rows == [("train.py:3 step", 1000), (None, None)]
