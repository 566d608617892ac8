"""The Kineto parser against its input: counts, times, steps, nesting and collectives."""

from __future__ import annotations

import gzip
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from support import REAL_KINETO, SAMPLES
from tracelake import ingest
from tracelake.contracts.errors import TraceFormatError
from tracelake.ingest import parse
from tracelake.ingest.kineto_sql_events import KIND_BY_CAT
from tracelake.ingest.pytorch_profiler import _Loader
from tracelake.ingest.source import read_ahead

DEVICE_KINDS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset", "cuda_sync": "sync"}


def _load(path: Path) -> dict:  # type: ignore[type-arg]
    opener = gzip.open if path.read_bytes()[:2] == b"\x1f\x8b" else open
    with opener(path, "rb") as f:
        return json.load(f)


def _device_events(doc: dict) -> list[dict]:  # type: ignore[type-arg]
    return [e for e in doc["traceEvents"] if e.get("cat") in DEVICE_KINDS]


@pytest.fixture(scope="module")
def straggler_rank0():  # type: ignore[no-untyped-def]
    path = SAMPLES / "ddp_straggler" / "rank-0.json.gz"
    return path, _load(path), parse(path)


def test_device_op_counts_per_kind_match_the_trace(straggler_rank0) -> None:  # type: ignore[no-untyped-def]
    _, doc, parsed = straggler_rank0
    expected = Counter(DEVICE_KINDS[e["cat"]] for e in _device_events(doc))
    got = Counter(parsed.tables["device_ops"].column("kind").to_pylist())
    assert got == expected
    assert parsed.info.event_count == len(doc["traceEvents"])


def test_timestamps_are_exact_integer_ns(straggler_rank0) -> None:  # type: ignore[no-untyped-def]
    _, doc, parsed = straggler_rank0
    base = doc.get("baseTimeNanoseconds", 0)
    by_id = {r["event_id"]: r for r in parsed.tables["device_ops"].to_pylist()}
    for index, event in enumerate(doc["traceEvents"]):
        if index in by_id:
            ts = base + int(Decimal(str(event["ts"])) * 1000)
            assert by_id[index]["ts_ns"] == ts
            assert by_id[index]["dur_ns"] == int(Decimal(str(event["dur"])) * 1000)


def test_nanosecond_resolution_real_trace() -> None:
    path = REAL_KINETO / "ns_resolution_trace" / "rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"
    if not path.exists():
        pytest.skip("real traces not present")
    raw = gzip.decompress(path.read_bytes())
    # Decimal parsing keeps the ns digits a float would lose at epoch-microsecond scale.
    doc = json.loads(raw, parse_float=Decimal)
    parsed = parse(path)
    host = {r["event_id"]: r for r in parsed.tables["host_ops"].to_pylist()}
    checked = 0
    for index, event in enumerate(doc["traceEvents"]):
        if index in host:
            assert host[index]["ts_ns"] == int(event["ts"] * 1000)
            checked += 1
    assert checked > 1000
    assert any(r["ts_ns"] % 1000 for r in host.values()), "no sub-microsecond digits survived"


def test_rank_and_distributed_info(straggler_rank0) -> None:  # type: ignore[no-untyped-def]
    _, doc, parsed = straggler_rank0
    assert parsed.info.rank == doc["distributedInfo"]["rank"] == 0
    assert parsed.info.rank_source == "distributedInfo"
    assert parsed.info.world_size == 4
    assert parsed.info.device_type == "cuda"
    assert set(parsed.tables["device_ops"].column("rank").to_pylist()) == {0}


def test_rank_from_file_name_when_distributed_info_is_missing(tmp_path: Path) -> None:
    doc = _load(SAMPLES / "ddp_straggler" / "rank-2.json.gz")
    del doc["distributedInfo"]
    for name, rank, source in [("trainer_rank3.json", 3, "file name"), ("host_rank_5.json", 5, "file name"),
                               ("worker-rank-7.json", 7, "file name"), ("profile.json", 0, "default")]:
        path = tmp_path / name
        path.write_text(json.dumps(doc))
        parsed = parse(path)
        assert (parsed.info.rank, parsed.info.rank_source) == (rank, source), name
        assert bool(parsed.info.warnings) == (source == "default")


def test_steps_come_from_profiler_step_annotations(straggler_rank0) -> None:  # type: ignore[no-untyped-def]
    _, doc, parsed = straggler_rank0
    names = sorted(
        int(e["name"].split("#")[1]) for e in doc["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")
        and e.get("cat") == "user_annotation"
    )
    steps = parsed.tables["steps"].to_pylist()
    assert [s["step"] for s in steps] == names
    assert all(s["device_op_count"] > 0 and s["device_end_ns"] > s["device_start_ns"] for s in steps)
    # Every kernel launched inside a step is attributed to it.
    assert parsed.tables["device_ops"].column("step").null_count == 0


def test_host_nesting_matches_a_brute_force_check(straggler_rank0) -> None:  # type: ignore[no-untyped-def]
    _, _, parsed = straggler_rank0
    rows = parsed.tables["host_ops"].to_pylist()
    by_thread: dict[tuple[int, int], list[dict]] = {}  # type: ignore[type-arg]
    for r in rows:
        by_thread.setdefault((r["pid"], r["tid"]), []).append(r)
    checked = 0
    for events in by_thread.values():
        for e in events[:400]:
            end = e["ts_ns"] + e["dur_ns"]
            enclosing = [
                o for o in events
                if o is not e and o["ts_ns"] <= e["ts_ns"] and o["ts_ns"] + o["dur_ns"] >= end
                and (o["dur_ns"] > e["dur_ns"] or (o["dur_ns"] == e["dur_ns"] and o["event_id"] < e["event_id"]))
            ]
            assert e["depth"] == len(enclosing), e
            if enclosing:
                parent = max(enclosing, key=lambda o: (o["ts_ns"], -o["dur_ns"], o["event_id"]))
                assert e["parent_id"] == parent["event_id"], e
            else:
                assert e["parent_id"] is None
            checked += 1
    assert checked > 100


def test_collectives_are_linked_to_their_nccl_kernels(straggler_rank0) -> None:  # type: ignore[no-untyped-def]
    _, doc, parsed = straggler_rank0
    calls = [e for e in doc["traceEvents"] if e.get("name") == "record_param_comms"]
    coll = parsed.tables["collectives"].to_pylist()
    assert len(coll) == len(calls) > 0
    kernels = {r["event_id"]: r for r in parsed.tables["device_ops"].to_pylist()}
    for c in coll:
        kernel = kernels[c["kernel_event_id"]]
        assert kernel["category"] == "communication"
        assert c["ts_ns"] == kernel["ts_ns"] and c["kernel_name"] == kernel["name"]
        assert c["cpu_ts_ns"] <= kernel["ts_ns"]
        assert c["seq"] is not None and c["process_group"] == "0"
        assert c["message_bytes"] == max(c["in_nelems"], c["out_nelems"]) * 2  # BFloat16
    assert sorted(c["seq"] for c in coll) == sorted(e["args"]["Seq"] for e in calls)


def test_no_negative_durations_and_known_kinds(straggler_rank0) -> None:  # type: ignore[no-untyped-def]
    _, _, parsed = straggler_rank0
    for name in ("device_ops", "host_ops"):
        assert min(parsed.tables[name].column("dur_ns").to_pylist()) >= 0
    assert set(parsed.tables["device_ops"].column("kind").to_pylist()) <= set(KIND_BY_CAT.values())


def test_negative_durations_are_clamped(tmp_path: Path) -> None:
    doc = {"traceEvents": [
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 10.5, "dur": -0.001,
         "args": {"correlation": 1, "stream": 7, "device": 0}},
    ]}
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(doc))
    ops = parse(path).tables["device_ops"].to_pylist()
    assert ops[0]["dur_ns"] == 0 and ops[0]["ts_ns"] == 10500


def _parse_tables(path: Path, staging: Path, batch_bytes: int) -> dict[str, list[dict]]:  # type: ignore[type-arg]
    staging.mkdir()
    ingest.parse_into(path, staging, ingest.ParseOptions(source_name=path.name, trace_id="t", batch_bytes=batch_bytes))
    tables = {}
    for name in ("device_ops", "host_ops", "collectives", "steps", "counters"):
        rows = pq.read_table(staging / f"{name}.parquet").to_pylist()
        key = "event_id" if rows and "event_id" in rows[0] else next(iter(rows[0])) if rows else None
        tables[name] = sorted(rows, key=lambda r: repr(r[key]) if key else "") if key else rows
    return tables


def test_many_small_batches_loaded_side_by_side_give_the_same_tables(tmp_path: Path) -> None:
    """Groups of batches load two at a time on separate connections; event ids and every row stay the same."""
    path = SAMPLES / "ddp_straggler" / "rank-1.json.gz"
    whole = _parse_tables(path, tmp_path / "whole", 8 << 20)
    cut = _parse_tables(path, tmp_path / "cut", 2048)  # hundreds of batches, dozens of groups
    assert whole["device_ops"] and whole["host_ops"] and whole["collectives"]
    assert cut == whole


def test_the_earliest_bad_event_is_reported_when_groups_load_at_once(tmp_path: Path) -> None:
    """Two groups loading at once may both fail; the message always names the first bad event."""
    doc = _load(SAMPLES / "ddp_straggler" / "rank-0.json.gz")
    events = doc["traceEvents"]
    complete = [i for i, e in enumerate(events) if e.get("ph") == "X"]
    first = complete[len(complete) // 3]
    second = next(i for i in complete if i > first + 40)  # a few batches on: the next group, loading beside it
    for index in (first, second):
        del events[index]["ts"]
    path = tmp_path / "rank-0.json"
    path.write_text(json.dumps(doc))
    for attempt in range(5):
        staging = tmp_path / f"staging-{attempt}"
        staging.mkdir()
        with pytest.raises(TraceFormatError) as err:
            ingest.parse_into(path, staging, ingest.ParseOptions(source_name=path.name, batch_bytes=1024))
        assert f"traceEvents[{first}]" in str(err.value)
        assert "has no 'ts'" in str(err.value)


def test_the_loader_raises_the_earliest_items_error_whichever_fails_first(tmp_path: Path) -> None:
    """Item 1 fails at once while item 0 is still loading; item 0's error is the one raised."""
    loaded: list[int] = []
    done: list[Path] = []

    def load(number: int, batch: Path) -> None:
        if number == 0:
            time.sleep(0.3)
        loaded.append(number)
        raise ValueError(f"item {number}")

    loader: _Loader[Path] = _Loader(load, done.append)
    for n in range(2):
        loader.put(tmp_path / f"b-{n}.json")
    with pytest.raises(ValueError, match="item 0"):
        loader.close()
    assert loaded == [1, 0]
    assert sorted(done) == [tmp_path / "b-0.json", tmp_path / "b-1.json"]  # cleaned up, failed or not


def test_read_ahead_hands_over_chunks_errors_and_stops_cleanly() -> None:
    """The cutter's reader thread: same chunks in order, the source's error where it happened, closed on stop."""
    closed: list[bool] = []

    def source(fail_at: int | None = None) -> Iterator[bytes]:
        try:
            for n in range(20):
                if n == fail_at:
                    raise TraceFormatError("t.json", "gzip stream ends early", where="compressed byte 9")
                yield bytes([n]) * 3
        finally:
            closed.append(True)

    assert list(read_ahead(source())) == [bytes([n]) * 3 for n in range(20)]
    got = []
    with pytest.raises(TraceFormatError, match="ends early"):
        for chunk in read_ahead(source(fail_at=5)):
            got.append(chunk)
    assert len(got) == 5
    reader = read_ahead(source(), depth=1)
    assert next(reader) == b"\x00" * 3
    reader.close()  # the consumer stops early: the thread ends and the source is closed
    assert closed == [True, True, True]
    assert not [t for t in threading.enumerate() if t.name == "tracelake-read-ahead"]


def test_the_ingests_connection_keeps_no_cache_of_the_files_it_opens(tmp_path: Path) -> None:
    """DuckDB's cache of opened files kept about 1.5 KiB for each Parquet part to the end of the ingest."""
    from tracelake.ingest import pytorch_profiler_sql

    normaliser = pytorch_profiler_sql.Normaliser(tmp_path, memory_limit="1GB", threads=1, source="t", native=False)
    try:
        assert normaliser.con.execute("SELECT current_setting('enable_external_file_cache')").fetchall() == [(False,)]
    finally:
        normaliser.close()


def test_the_step_marks_kept_from_many_batches_are_compacted_and_make_every_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scanner's step marks, kept a piece per batch until the end, are copied into one table every few pieces
    (they held the scan's buffers, growing with the trace); every step comes out as the trace's events make it."""
    from tracelake.ingest import pytorch_profiler_sql

    monkeypatch.setattr(pytorch_profiler_sql, "KEPT_PIECES", 3)
    held: list[int] = []
    insert = pytorch_profiler_sql.Normaliser._insert_scanned

    def counted(self: pytorch_profiler_sql.Normaliser, con: object) -> None:
        held.append(len(self._scanned["step_marks"]))
        insert(self, con)  # type: ignore[arg-type]
        held.append(len(self._scanned["step_marks"]))

    monkeypatch.setattr(pytorch_profiler_sql.Normaliser, "_insert_scanned", counted)
    events = []
    for step in range(2000):  # 6 MB: the first 4 MiB read is one batch, the rest 40 batches of 64 KiB
        start = 1_000 + step * 100
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step + 7}", "pid": 1, "tid": 1,
                       "ts": start, "dur": 90, "args": {"note": "x" * 3000}})
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": start + 5,
                       "dur": 20 + step})
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({"traceEvents": events}))
    steps = _parse_tables(path, tmp_path / "staging", 64 << 10)["steps"]
    assert 1 <= held[0] <= 3 and held[1] == 0
    expected = {int(e["name"].split("#")[1]): (e["ts"] * 1000, e["dur"] * 1000) for e in events
                if e["name"].startswith("ProfilerStep#")}
    assert {row["step"]: (row["ts_ns"], row["dur_ns"]) for row in steps} == expected
