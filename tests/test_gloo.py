"""Gloo collectives of the real CPU traces in sample_traces/pytorch_gloo.

The rule is in docs/formats.md, "Distributed CPU traces (gloo)".

Expected values come from the trace JSON read here with plain gzip/json: the ``c10d::`` ops on the
calling thread (their ``Concrete Inputs[2]`` the peer or root, their ``Input Dims`` the sizes) and the
``gloo:`` annotations (their span the work), never from the parser's own output.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from decimal import Decimal
from functools import cache
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.parquet as pq
import pytest

from tracelake.analysis import collectives
from tracelake.ingest import kineto_scan, parse, parse_into
from tracelake.ingest.model import ParseOptions

GLOO = Path(__file__).resolve().parent.parent / "sample_traces" / "pytorch_gloo"
SCENARIOS = ("ddp", "pipeline", "fsdp", "hybrid")
#: c10d:: op -> the collective its row is named.
C10D = {"c10d::allreduce_": "allreduce", "c10d::broadcast_": "broadcast", "c10d::_allgather_base_": "allgather",
        "c10d::_reduce_scatter_base_": "reduce_scatter", "c10d::send": "send", "c10d::recv_": "recv"}
P2P = ("send", "recv")


def _doc(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt") as fh:
        doc: dict[str, Any] = json.load(fh, parse_float=Decimal)
    return doc


def _ops(doc: dict[str, Any], prefix: str) -> list[dict[str, Any]]:
    return sorted((e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("name", "").startswith(prefix)),
                  key=lambda e: e["ts"])


def _ns(doc: dict[str, Any], ts: Decimal) -> int:
    return int(doc["baseTimeNanoseconds"]) + int(ts * 1000)


def _elements(dims: list[int]) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


@cache
def _parsed(scenario: str) -> pl.DataFrame:
    frames = []
    for path in sorted((GLOO / scenario).glob("*.json.gz")):
        parsed = parse(path)
        frame = pl.from_arrow(parsed.tables["collectives"])
        assert isinstance(frame, pl.DataFrame)
        frames.append(frame.with_columns(pl.lit(parsed.info.rank, dtype=pl.Int32).alias("rank")))
    return pl.concat(frames)


def _raw(scenario: str) -> dict[int, dict[str, Any]]:
    docs = [_doc(p) for p in sorted((GLOO / scenario).glob("*.json.gz"))]
    return {d["distributedInfo"]["rank"]: d for d in docs}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_one_row_per_gloo_call_named_by_its_c10d_op(scenario: str) -> None:
    rows = _parsed(scenario)
    for rank, doc in _raw(scenario).items():
        mine = rows.filter(pl.col("rank") == rank)
        assert mine.height == len(_ops(doc, "gloo:"))
        want = Counter(C10D[e["name"]] for e in _ops(doc, "c10d::"))
        assert Counter(mine["collective"].to_list()) == want
        assert set(mine["source"]) == {"cpu_op"}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_times_are_the_work_and_the_cpu_call(scenario: str) -> None:
    """``ts_ns``/``dur_ns``: the gloo: annotation (the work); ``cpu_ts_ns``/``cpu_dur_ns``: the c10d:: call."""
    rows = _parsed(scenario)
    for rank, doc in _raw(scenario).items():
        mine = rows.filter(pl.col("rank") == rank)
        work = Counter((_ns(doc, e["ts"]), int(e["dur"] * 1000)) for e in _ops(doc, "gloo:"))
        calls = Counter((_ns(doc, e["ts"]), int(e["dur"] * 1000)) for e in _ops(doc, "c10d::"))
        assert Counter(zip(mine["ts_ns"], mine["dur_ns"], strict=True)) == work
        assert Counter(zip(mine["cpu_ts_ns"], mine["cpu_dur_ns"], strict=True)) == calls
        assert (mine["cpu_ts_ns"] <= mine["ts_ns"]).all()  # the work starts after its call did


@pytest.mark.parametrize("scenario", ["ddp", "fsdp"])
def test_collective_seq_is_the_same_on_every_rank(scenario: str) -> None:
    rows = _parsed(scenario)
    raw = _raw(scenario)
    calls = {rank: len(_ops(doc, "c10d::")) for rank, doc in raw.items()}
    assert len(set(calls.values())) == 1
    assert rows["seq"].null_count() == 0 and set(rows["process_group"]) == {"0"}
    assert set(rows["group_ranks"]) == {str(sorted(raw))}
    # Each (process group, seq) on every rank of the group exactly once, the same operation and size.
    per = rows.group_by("process_group", "seq").agg(
        pl.col("rank").sort().alias("ranks"), pl.col("collective").n_unique().alias("ops"),
        pl.col("in_nelems").n_unique().alias("sizes"), pl.col("out_nelems").n_unique().alias("outs"))
    assert per.height == next(iter(calls.values()))
    assert set(per["seq"]) == set(range(1, per.height + 1))
    assert all(r == sorted(raw) for r in per["ranks"].to_list())
    assert set(per["ops"]) == {1} and set(per["sizes"]) == {1} and set(per["outs"]) == {1}
    # The n-th seq is the n-th c10d:: call on the rank.
    for rank, doc in raw.items():
        mine = rows.filter(pl.col("rank") == rank).sort("seq")
        assert mine["collective"].to_list() == [C10D[e["name"]] for e in _ops(doc, "c10d::")]
    inst = collectives.instances(rows)
    assert inst.height == per.height and set(inst["ranks"]) == {len(raw)}


def test_broadcast_root_is_src_rank() -> None:
    rows = _parsed("ddp")
    for rank, doc in _raw("ddp").items():
        roots = [int(e["args"]["Concrete Inputs"][2]) for e in _ops(doc, "c10d::broadcast_")]
        mine = rows.filter((pl.col("rank") == rank) & (pl.col("collective") == "broadcast")).sort("seq")
        assert mine["src_rank"].to_list() == roots and mine["dst_rank"].null_count() == mine.height
    assert rows.filter(pl.col("collective") != "broadcast")["src_rank"].null_count() == 12


def test_fsdp_sizes_come_from_the_c10d_op() -> None:
    """_reduce_scatter_base_ runs as gloo:all_reduce of its whole input; all-gathers take their output size."""
    rows = _parsed("fsdp")
    for rank, doc in _raw("fsdp").items():
        mine = rows.filter(pl.col("rank") == rank)
        for name, op in (("c10d::_allgather_base_", "allgather"), ("c10d::_reduce_scatter_base_", "reduce_scatter")):
            want: Counter[tuple[int, int, int]] = Counter()
            for e in _ops(doc, name):
                out_n, in_n = (_elements(d) for d in e["args"]["Input Dims"][:2])  # output first
                assert e["args"]["Input type"][:2] == ["float", "float"]
                want[(in_n, out_n, 4 * (in_n if op == "reduce_scatter" else max(in_n, out_n)))] += 1
            got = mine.filter(pl.col("collective") == op)
            assert Counter(zip(got["in_nelems"], got["out_nelems"], got["message_bytes"], strict=True)) == want
            assert set(got["dtype"]) == {"Float"}


def _peer(event: dict[str, Any]) -> int:
    return int(event["args"]["Concrete Inputs"][2])


@pytest.mark.parametrize("scenario", ["pipeline", "hybrid"])
def test_send_and_recv_carry_their_peers(scenario: str) -> None:
    rows = _parsed(scenario)
    raw = _raw(scenario)
    for rank, doc in raw.items():
        default = next(g for g in doc["distributedInfo"]["pg_config"] if g["pg_name"] == "0")
        assert default["ranks"] == sorted(raw)  # group ranks are global ranks in the default group
        mine = rows.filter(pl.col("rank") == rank)
        sends = Counter(_peer(e) for e in _ops(doc, "c10d::send"))
        recvs = Counter(_peer(e) for e in _ops(doc, "c10d::recv_"))
        got_sends = mine.filter(pl.col("collective") == "send")
        got_recvs = mine.filter(pl.col("collective") == "recv")
        assert set(got_sends["src_rank"]) == {rank} and Counter(got_sends["dst_rank"].to_list()) == sends
        assert set(got_recvs["dst_rank"]) == {rank} and Counter(got_recvs["src_rank"].to_list()) == recvs
        # seq counts per (group, source, destination): 1..n for each peer
        for frame, peers, column in ((got_sends, sends, "dst_rank"), (got_recvs, recvs, "src_rank")):
            for peer, n in peers.items():
                assert sorted(frame.filter(pl.col(column) == peer)["seq"].to_list()) == list(range(1, n + 1))
    p2p = rows.filter(pl.col("collective").is_in(P2P))
    assert set(p2p["process_group"]) == {"0"} and set(p2p["group_ranks"]) == {str(sorted(raw))}


@pytest.mark.parametrize("scenario", ["pipeline", "hybrid"])
def test_sends_and_recvs_pair_one_to_one(scenario: str) -> None:
    rows = _parsed(scenario)
    key = ["process_group", "src_rank", "dst_rank", "seq"]
    sends = rows.filter(pl.col("collective") == "send")
    recvs = rows.filter(pl.col("collective") == "recv")
    assert sends.height == recvs.height > 0
    assert sends.select(key).is_unique().all() and recvs.select(key).is_unique().all()
    pairs = sends.join(recvs, on=key, how="inner", suffix="_recv")
    assert pairs.height == sends.height
    assert (pairs["rank"] == pairs["src_rank"]).all() and (pairs["rank_recv"] == pairs["dst_rank"]).all()
    assert (pairs["in_nelems"] == pairs["in_nelems_recv"]).all()
    # A receive cannot end before its send started.
    assert (pairs["ts_ns_recv"] + pairs["dur_ns_recv"] >= pairs["ts_ns"]).all()


def test_hybrid_subgroup_collectives_are_not_guessed() -> None:
    """Two Gloo groups per rank and nothing in the all-reduce that says which: no group, no seq."""
    rows = _parsed("hybrid")
    for rank, doc in _raw("hybrid").items():
        assert len(doc["distributedInfo"]["pg_config"]) == 2
        mine = rows.filter((pl.col("rank") == rank) & (pl.col("collective") == "allreduce"))
        assert mine.height == len(_ops(doc, "c10d::allreduce_"))
        assert mine["process_group"].null_count() == mine.height and mine["seq"].null_count() == mine.height
        assert mine["group_ranks"].null_count() == mine.height
    assert collectives.instances(rows.filter(pl.col("collective") == "allreduce")).height == 0


@pytest.mark.skipif(not kineto_scan.AVAILABLE, reason="the native Kineto scanner is not built")
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_both_engines_give_the_same_rows(scenario: str, tmp_path: Path) -> None:
    path = next((GLOO / scenario).glob("rank1.*"))
    tables = []
    for engine in ("duckdb", "native"):
        staging = tmp_path / engine
        staging.mkdir()
        parse_into(path, staging, ParseOptions(source_name=path.name, trace_id="t", kineto_engine=engine))
        tables.append(pq.read_table(staging / "collectives.parquet").sort_by("event_id").to_pylist())
    assert tables[0] == tables[1] and tables[0]


ODD_CONCRETE = [["", "", "1", "0"], ["a\nb", "é", "\\u00e9", "2"], [1, 2, 3], "text", None, {"a": [1, {"b": None}]},
                [["x"]], [], ["", "", " 3", "0"], [1.5e3, True, False]]


@pytest.mark.skipif(not kineto_scan.AVAILABLE, reason="the native Kineto scanner is not built")
def test_both_engines_keep_the_same_concrete_inputs(tmp_path: Path) -> None:
    """``Concrete Inputs`` of c10d:: ops only (and as the same JSON text) in the host parts of either engine."""
    from tracelake.ingest.pytorch_profiler_sql import Normaliser

    events = []
    for i, value in enumerate(ODD_CONCRETE):
        for name in ("c10d::send", "aten::add"):
            args: dict[str, Any] = {"Input Dims": [[[4]], [], [], []]}
            if value is not None:
                args["Concrete Inputs"] = value
            events.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": 10 * i, "dur": 1,
                           "args": args})
    batch = json.dumps(events).encode()
    (tmp_path / "staging").mkdir()
    normaliser = Normaliser(tmp_path / "staging", memory_limit="1GB", threads=1, source="t", native=False)
    try:
        normaliser.load(0, [(normaliser.batch_file(0, batch, counters=False), 0)])
        normaliser.scan(1, 0, batch)
    finally:
        normaliser.close()
    parts = [pq.read_table(tmp_path / "staging" / "parts" / f"host-{g:06d}.parquet").sort_by("event_id")
             for g in (0, 1)]
    reference, native = ([str(v) if v is not None else None for v in p.column("concrete_inputs").to_pylist()]
                         for p in parts)
    assert native == reference
    assert native[1::2] == [None] * len(ODD_CONCRETE)  # aten:: ops keep none
    assert native[0] is not None and json.loads(native[0]) == ["", "", "1", "0"] and native[8] is None


def test_groups_told_by_sizes_roots_and_worker_threads(tmp_path: Path) -> None:
    """Rank 0 of groups "0" ([0, 1, 2, 3]) and "1" ([0, 1]): what can tell them apart, and what cannot."""
    calls = [  # (c10d op, its Input Dims, its Concrete Inputs, gloo annotation, its tensor, worker thread)
        ("c10d::_allgather_base_", [[8], [4]], ["", "", "", "False", "-1"], "gloo:all_gather", [4], 5),  # x2: "1"
        ("c10d::allreduce_", [[[16]]], ["", "", "", "", "False", "-1"], "gloo:all_reduce", [16], 5),  # as thread 5
        ("c10d::allreduce_", [[[16]]], ["", "", "", "", "False", "-1"], "gloo:all_reduce", [16], 7),  # unknown
        ("c10d::broadcast_", [[[2]]], ["", "", "3", "0", "False", "-1"], "gloo:broadcast", [2], 9),  # root 3: "0"
        ("c10d::send", [[[4]], [], [], []], ["", "", "1", "0"], "gloo:send", [4], 1),  # peer 1: either group
    ]
    events: list[dict[str, Any]] = []
    for i, (op, dims, concrete, ann, shape, tid) in enumerate(calls):
        t = 100 * (i + 1)
        events.append({"ph": "X", "cat": "cpu_op", "name": op, "pid": 1, "tid": 1, "ts": t, "dur": 10,
                       "args": {"Input Dims": dims, "Input type": ["float"] * len(dims), "Concrete Inputs": concrete}})
        events.append({"ph": "X", "cat": "user_annotation", "name": ann, "pid": 1, "tid": tid, "ts": t + 5,
                       "dur": 50, "args": {"Input Dims": [shape], "Input type": ["float"]}})
    pg = [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cpu:gloo,cuda:gloo", "ranks": [0, 1, 2, 3],
           "pg_size": 4},
          {"pg_name": "1", "pg_desc": "undefined", "backend_config": "cpu:gloo,cuda:gloo", "ranks": [0, 1],
           "pg_size": 2}]
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({"distributedInfo": {"backend": "gloo", "rank": 0, "world_size": 4, "pg_config": pg},
                                "traceEvents": events}))
    frame = pl.from_arrow(parse(path).tables["collectives"])
    assert isinstance(frame, pl.DataFrame)
    rows = frame.sort("ts_ns").select("collective", "process_group", "seq", "src_rank", "dst_rank").rows()
    assert rows == [("allgather", "1", 1, None, None), ("allreduce", "1", 2, None, None),
                    ("allreduce", None, None, None, None), ("broadcast", "0", 1, 3, None),
                    ("send", None, None, 0, 1)]
