"""nccl-tests output (stdout layouts and -J JSON) into nccl_benchmarks, and its bandwidth summary."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
import pytest

from support import ROOT
from tracelake.analysis import nccl, nccl_join
from tracelake.ingest import detect
from tracelake.sample_traces import generate_nccl
from tracelake.warehouse import Warehouse
from tracelake.warehouse.inputs import expand_inputs
from tracelake.warehouse.settings import Settings

NCCL = ROOT / "sample_traces" / "nccl"
NCCL_TESTS = NCCL / "nccl_tests"
FACTOR = {"all_reduce": 2 * 7 / 8, "all_gather": 7 / 8, "reduce_scatter": 7 / 8}


@pytest.mark.parametrize("name", ["all_reduce_perf.txt", "all_gather_perf_old.txt", "reduce_scatter_perf.json"])
def test_every_layout_ingests_every_row(name: str, warehouse: Warehouse) -> None:
    path = NCCL_TESTS / name
    assert detect(path).name == "nccl_tests"
    result = warehouse.ingest_file(path, job="nccl")
    assert result.ok, result.error
    rows = warehouse.query(
        "SELECT collective, size_bytes, in_place, time_us, algbw_gbs, busbw_gbs, wrong, redop, root, ranks "
        "FROM nccl_benchmarks ORDER BY size_bytes, in_place").as_dicts()
    assert len(rows) == 2 * len(generate_nccl.SIZES)
    collective = rows[0]["collective"]
    assert collective == name.split("_perf")[0] and all(r["collective"] == collective for r in rows)
    assert [r["size_bytes"] for r in rows[::2]] == generate_nccl.SIZES
    assert [r["in_place"] for r in rows[:2]] == [False, True]
    assert all(r["ranks"] == 8 for r in rows)
    for row in rows:  # the numbers are the generator's, to the printed precision
        expected = generate_nccl.timing(collective, row["size_bytes"], row["in_place"])
        assert (row["time_us"], row["algbw_gbs"], row["busbw_gbs"]) == pytest.approx(expected, abs=0.006)
        if row["algbw_gbs"] > 1:
            assert row["busbw_gbs"] == pytest.approx(row["algbw_gbs"] * FACTOR[collective], rel=0.01)
    if name.endswith("_old.txt"):  # no root column, validation off
        assert all(r["root"] is None and r["redop"] is None and r["wrong"] is None for r in rows)
    else:
        assert all(r["root"] == -1 and r["redop"] == "sum" and r["wrong"] == 0 for r in rows)


def test_launcher_prefixes_and_devices(warehouse: Warehouse) -> None:
    assert (NCCL_TESTS / "all_reduce_perf.txt").read_text().startswith("[1,0]<stdout>:")
    assert warehouse.ingest_file(NCCL_TESTS / "all_reduce_perf.txt", job="nccl").ok
    row = warehouse.traces()[0]
    assert row["format"] == "nccl_tests" and row["world_size"] == 8
    assert row["host"] == "node-a" and row["device_name"] == "NVIDIA H100 80GB HBM3" and row["warnings"] == []


def test_summary_and_finding_against_the_link_peak(tmp_path: Path) -> None:
    wh = Warehouse(settings=Settings.from_env(environ={}, home=tmp_path / "a"))
    assert wh.ingest([NCCL_TESTS], job="nccl").ok
    summary = wh.analyze(job="nccl").nccl_benchmarks
    # H100 SXM: NVLink 4 (docs/analyses.md, "Link peaks"); the -J JSON names no GPU, so its link is unknown
    assert summary.height == 6 and set(summary["link"].to_list()) - {"unknown"} == {"nvlink4"}
    peak = summary.filter((summary["collective"] == "all_reduce") & ~summary["in_place"]).row(0, named=True)
    assert peak["peak_at_bytes"] == generate_nccl.SIZES[-1]
    assert peak["peak_busbw_gbs"] == pytest.approx(generate_nccl.timing("all_reduce", 1 << 30, False)[2])
    assert not [f for f in wh.analyze(job="nccl").findings if f.kind == "low_bus_bandwidth"]  # ~80% of 450
    fast = Warehouse(settings=Settings.from_env(environ={"TRACELAKE_LINK_PEAKS": "nvlink=900"}, home=wh.home))
    low = [f for f in fast.analyze(job="nccl").findings if f.kind == "low_bus_bandwidth"]
    assert {f.title.split()[0] for f in low} >= {"all_reduce", "all_gather"}


def test_directories_take_text_files_only_when_recognised(tmp_path: Path) -> None:
    (tmp_path / "all_reduce_perf.txt").write_bytes((NCCL_TESTS / "all_reduce_perf.txt").read_bytes())
    (tmp_path / "notes.txt").write_text("hello\n")
    (tmp_path / "train.log").write_text("epoch 1 loss 2.3\n")
    assert [p.name for p in expand_inputs([tmp_path])] == ["all_reduce_perf.txt"]


def test_committed_samples_match_the_generator() -> None:
    assert (NCCL_TESTS / "all_reduce_perf.txt").read_text() == generate_nccl.all_reduce_text()
    assert (NCCL_TESTS / "all_gather_perf_old.txt").read_text() == generate_nccl.all_gather_old_text()
    assert (NCCL_TESTS / "reduce_scatter_perf.json").read_text() == generate_nccl.reduce_scatter_json()


INSPECTOR = ROOT / "sample_traces" / "nccl" / "inspector"


def test_inspector_records_become_collectives(warehouse: Warehouse) -> None:
    report = warehouse.ingest([INSPECTOR], job="insp")
    assert report.ok and len(report.results) == 4
    assert all(any("1 of 18 lines" in w for w in r.warnings) for r in report.results)  # the launcher noise line
    counts = warehouse.query(
        "SELECT rank, collective, count(*), max(message_bytes), max(group_size) FROM collectives "
        "GROUP BY ALL ORDER BY rank, collective").rows
    assert [c for c in counts if c[0] == 0] == [
        (0, "all_gather", 4, 4 * (16 << 20), 4), (0, "all_reduce", 12, 64 << 20, 4), (0, "send", 1, 1 << 20, 4)]
    analysis = warehouse.analyze(job="insp")
    inst = analysis.collectives.filter(analysis.collectives["collective"] == "all_reduce")
    assert inst.height == 12 and set(inst["last_rank"].to_list()) == {generate_nccl.LATE_RANK}
    assert inst["skew_ns"].min() == 400_000
    straggler = [f for f in analysis.findings if f.kind == "straggler"]
    assert straggler and f"rank {generate_nccl.LATE_RANK}" in straggler[0].title


def test_inspector_without_records_is_an_error(tmp_path: Path, warehouse: Warehouse) -> None:
    path = tmp_path / "node-pid1.log"
    path.write_text('{"header": {"id": "0x1"}, "metadata": {"inspector_output_format_version": "v4.0"}}\n'
                    "not json at all\n")
    result = warehouse.ingest_file(path)
    assert not result.ok and "no NCCL Inspector records" in (result.error or "")


def test_committed_inspector_samples_match_the_generator() -> None:
    for rank in range(generate_nccl.INSPECTOR_RANKS):
        assert (INSPECTOR / f"node-a-pid{4100 + rank}.log").read_text() == generate_nccl.inspector_lines(rank)


DEBUG_LOG = ROOT / "sample_traces" / "nccl" / "debug_log" / "train-4ranks.log"


def test_debug_log_communicators_channels_and_collectives(warehouse: Warehouse) -> None:
    assert detect(DEBUG_LOG).name == "nccl_log"
    result = warehouse.ingest_file(DEBUG_LOG, job="log")
    assert result.ok, result.error
    comms = warehouse.query("SELECT rank, host, nodes, local_rank, cuda_dev, comm_id FROM communicators "
                            "ORDER BY rank").rows
    assert comms == [(r, ("node-a", "node-b")[r // 2], 2, r % 2, r % 2, "0x9e2f4c1d5a7b3e01") for r in range(4)]
    transports = dict(warehouse.query("SELECT transport, count(*) FROM comm_channels GROUP BY 1").rows)
    assert transports == {"P2P/IPC": 4, "NET/IB/0/GDRDMA": 2, "NET/IB/1/GDRDMA": 2}
    colls = warehouse.query("SELECT collective, count(*), min(seq), max(seq), max(message_bytes), "
                            "count(DISTINCT rank) FROM collectives GROUP BY 1 ORDER BY 1").rows
    assert colls == [("all_gather", 8, 10, 11, 64 << 20, 4), ("all_reduce", 40, 0, 9, 64 << 20, 4)]
    row = warehouse.traces()[0]
    assert row["nccl_version"] == "2.21.5+cuda12.4" and row["world_size"] == 4
    assert any("NCCL WARN on node-b:5103" in w for w in row["warnings"])
    assert any(w.startswith("recognised 71 of 73 lines") for w in row["warnings"])
    # the TUNING line (printed by rank 0) names the algorithm of rank 0's all-reduces of that size
    tuned = warehouse.query("SELECT DISTINCT rank, algorithm, protocol, channels FROM collectives "
                            "WHERE algorithm IS NOT NULL").rows
    assert tuned == [(0, "RING", "SIMPLE", 2)]
    # opCount is the same on every rank: the instances line up, rank 3 is the last to log each
    inst = warehouse.analyze(job="log").collectives
    assert inst.height == 12 and set(inst["ranks"].to_list()) == {4} and set(inst["last_rank"].to_list()) == {3}


def test_debug_log_timestamps_in_every_form(tmp_path: Path) -> None:
    """ts_ns reads NCCL's default ``%F %T`` stamps and ISO ones with a ``T``, alone or mixed; null without."""
    from tracelake import ingest

    line = ("{}node-a:5100:5107 [0] NCCL INFO AllReduce: opCount {} sendbuff 0x1 recvbuff 0x2 count 4 datatype 7 "
            "op 0 root 0 comm 0x1 stream 0x1")
    second = 1_767_225_601_000_000_000  # 2026-01-01 00:00:01 UTC
    cases = {
        "space": (["[2026-01-01 00:00:01.5] ", "[2026-01-01 00:00:01] "], [second + 500_000_000, second]),
        "iso": (["[2026-01-01T00:00:01.5] ", "[2026-01-01T00:00:01] "], [second + 500_000_000, second]),
        "mixed": (["[2026-01-01T00:00:01.5] ", "[2026-01-01 00:00:01] "], [second + 500_000_000, second]),
        "none": (["", ""], [None, None]),
        "some": (["", "[2026-01-01 00:00:01.25] "], [None, second + 250_000_000]),
    }
    for name, (stamps, expected) in cases.items():
        path = tmp_path / f"{name}.log"
        path.write_text("".join(line.format(stamp, op) + "\n" for op, stamp in enumerate(stamps)))
        colls = pl.from_arrow(ingest.parse(path).tables["collectives"])
        assert isinstance(colls, pl.DataFrame)
        assert colls.sort("seq")["ts_ns"].to_list() == expected, name


def test_text_without_nccl_lines_is_not_a_log(tmp_path: Path, warehouse: Warehouse) -> None:
    path = tmp_path / "train.log"
    path.write_text("epoch 1\n" * 100)
    result = warehouse.ingest_file(path)
    assert not result.ok and "not a trace format" in (result.error or "")


def test_committed_debug_log_matches_the_generator() -> None:
    assert DEBUG_LOG.read_text() == generate_nccl.debug_log()


FLIGHT = ROOT / "sample_traces" / "nccl" / "flight_recorder"


def test_flight_recorder_json_and_pickle_find_the_hung_rank(warehouse: Warehouse) -> None:
    report = warehouse.ingest([FLIGHT], job="fr")
    assert report.ok and len(report.results) == 4, [r.error for r in report.failed]
    assert {r.format for r in report.results} == {"flight_recorder"}
    status = warehouse.query("SELECT rank, last_enqueued, last_completed FROM flight_recorder_status "
                             "ORDER BY rank").rows
    assert status == [(0, 12, 12), (1, 12, 12), (2, 12, 12), (3, 12, 9)]
    colls = warehouse.query("SELECT rank, count(*), max(message_bytes) FROM collectives "
                            "WHERE collective = 'all_reduce' GROUP BY 1 ORDER BY 1").rows
    assert colls == [(r, 12, 4096 * 1024 * 4) for r in range(4)]  # the pickle (rank 3) reads like the JSON
    analysis = warehouse.analyze(job="fr")
    assert analysis.lagging_ranks.rows() == [("0", 3, 9, 12, 3)]
    assert analysis.findings[0].kind == "hang" and "rank 3" in analysis.findings[0].title


def test_a_pickle_that_would_run_code_is_refused(tmp_path: Path, warehouse: Warehouse) -> None:
    """The untrusted pickle must be rejected before anything in it runs."""
    import os
    import pickle

    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (os.system, (f"touch {marker}",))

    dump = generate_nccl.flight_recorder_dump(0)
    dump["entries"][0]["frames"] = [Exploit()]  # type: ignore[index]
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(pickle.dumps(dump, protocol=4))
    result = warehouse.ingest_file(path)
    assert not result.ok
    assert "refused without running anything" in (result.error or "") and "system" in (result.error or "")
    assert not marker.exists()
    assert warehouse.query("SELECT count(*) FROM traces").rows == [(0,)]


def test_committed_flight_recorder_samples_match_the_generator() -> None:
    import json
    import pickle

    for rank in range(generate_nccl.FR_RANKS - 1):
        assert json.loads((FLIGHT / f"nccl_trace_rank_{rank}.json").read_text()) == \
            generate_nccl.flight_recorder_dump(rank)
    last = generate_nccl.FR_RANKS - 1
    assert (FLIGHT / f"nccl_trace_rank_{last}").read_bytes() == pickle.dumps(
        generate_nccl.flight_recorder_dump(last), protocol=4)


def test_topology_and_transport_surprises(tmp_path: Path, warehouse: Warehouse) -> None:
    assert warehouse.ingest_file(DEBUG_LOG, job="ib").ok
    topo = warehouse.analyze(job="ib").topology.row(0, named=True)
    assert (topo["nodes"], topo["gpus_per_node"], topo["ranks"], topo["channels"]) == (2, 2, 4, 2)
    assert topo["transports"] == "NET/IB, P2P" and topo["surprises"] is None
    socket_log = tmp_path / "socket.log"
    socket_log.write_text(generate_nccl.debug_log().replace("NET/IB/1/GDRDMA", "NET/Socket/0"))
    assert warehouse.ingest_file(socket_log, job="socket").ok
    found = [f for f in warehouse.analyze(job="socket").findings if f.kind == "transport"]
    assert found and "NET/Socket connections beside NET/IB" in found[0].title


PROFILER = ROOT / "sample_traces" / "nccl" / "profiler_plugin"


def test_profiler_plugin_dumps_carry_algorithm_protocol_channels(warehouse: Warehouse) -> None:
    report = warehouse.ingest([PROFILER], job="prof")
    assert report.ok and {r.format for r in report.results} == {"nccl_profiler"}
    rows = warehouse.query("SELECT rank, seq, message_bytes, algorithm, protocol, channels, dur_ns, cpu_dur_ns "
                           "FROM collectives WHERE rank = 0 ORDER BY seq").rows
    assert len(rows) == 8
    assert rows[0] == (0, 0, 4096, "RING", "LL128", 2, None, 12_500)
    assert rows[-1][2:6] == ((1024 << 14) * 4, "RING", "SIMPLE", 8)
    inst = warehouse.analyze(job="prof").collectives
    assert inst.height == 8 and set(inst["ranks"].to_list()) == {2} and inst["busbw_gbs"].null_count() == 8


def test_committed_profiler_plugin_samples_match_the_generator() -> None:
    for rank in range(2):
        assert (PROFILER / f"nccl_profile_4242424242_{rank}.json").read_text() == \
            generate_nccl.profiler_plugin_dump(rank)


def test_debug_log_variants(tmp_path: Path, warehouse: Warehouse) -> None:
    """Older init and COLL lines (no nvmlDev/commId, no [nranks=]), a `host: ` prefix, no timestamps."""
    path = tmp_path / "old.log"
    path.write_text(
        "gpu7: gpu7:900:900 [0] NCCL INFO NCCL version 2.10.3+cuda11.4\n"
        "gpu7: gpu7:900:950 [0] NCCL INFO comm 0x1a rank 0 nranks 2 cudaDev 0 busId 1000 - Init COMPLETE\n"
        "gpu7: gpu7:901:951 [1] NCCL INFO comm 0x2b rank 1 nranks 2 cudaDev 1 busId 2000 - Init COMPLETE\n"
        "gpu7: gpu7:900:950 [0] NCCL INFO Broadcast: opCount 0 sendbuff 0x1 recvbuff 0x2 count 10 datatype 0 "
        "op 0 root 1 comm 0x1a stream 0x5\n"
        "gpu7: gpu7:901:951 [1] NCCL INFO Broadcast: opCount 0 sendbuff 0x1 recvbuff 0x2 count 10 datatype 0 "
        "op 0 root 1 comm 0x2b stream 0x6\n"
        "some unrelated line\n")
    result = warehouse.ingest_file(path, job="old")
    assert result.ok, result.error
    rows = warehouse.query("SELECT rank, collective, seq, group_size, message_bytes, src_rank, process_group "
                           "FROM collectives ORDER BY rank").rows
    assert rows == [(0, "broadcast", 0, 2, 10, 1, "0x1a"), (1, "broadcast", 0, 2, 10, 1, "0x2b")]
    assert warehouse.traces()[0]["nccl_version"] == "2.10.3+cuda11.4"


def test_a_rank_whose_records_stop_early_never_reached_the_last_collective(tmp_path: Path, warehouse: Warehouse) -> None:
    """Inspector records of rank 1 cut before the last collectives: a hang finding names it and the seq."""
    folder = tmp_path / "inspector"
    shutil.copytree(NCCL / "inspector", folder)
    cut = folder / "node-a-pid4101.log"
    lines = cut.read_text().splitlines(keepends=True)
    colls = [i for i, line in enumerate(lines) if '"coll_perf"' in line]
    cut.write_text("".join(line for i, line in enumerate(lines) if i not in colls[-2:]))
    assert warehouse.ingest([folder], job="cut").ok
    analysis = warehouse.analyze(job="cut")
    row = analysis.unreached.row(0, named=True)
    expected_last = max(json.loads(lines[i])["coll_perf"]["coll_sn"] for i in colls)
    assert (row["rank"], row["group_last_seq"], row["behind"]) == (1, expected_last, 2)
    assert analysis.unreached.height == 1
    hang = analysis.findings[0]
    assert hang.kind == "hang" and f"never reached collective {expected_last}" in hang.title and "rank 1" in hang.title


def test_complete_nccl_records_have_no_unreached_collectives(warehouse: Warehouse) -> None:
    assert warehouse.ingest([NCCL / "inspector", NCCL / "debug_log"], job="whole").ok
    analysis = warehouse.analyze(job="whole")
    assert analysis.unreached.is_empty()
    assert not [f for f in analysis.findings if "never reached" in f.title]


def test_unreached_ignores_profiler_windows_and_point_to_point() -> None:
    traces = pl.DataFrame({"trace_id": ["k0", "k1", "n0", "n1"],
                           "format": ["pytorch_profiler", "pytorch_profiler", "nccl_log", "nccl_log"]})
    rows = [("k0", 0, "allreduce", "pg", 5), ("k1", 1, "allreduce", "pg", 3),  # profiler windows differ: fine
            ("n0", 0, "allreduce", "c", 9), ("n1", 1, "allreduce", "c", 9),
            ("n0", 0, "send", "c", 12), ("n1", 1, "recv", "c", 4)]
    collectives = pl.DataFrame(rows, schema=["trace_id", "rank", "collective", "process_group", "seq"], orient="row")
    collectives = collectives.with_columns(pl.lit(2).alias("group_size"))
    assert nccl.unreached(collectives, traces).is_empty()
    behind = collectives.vstack(pl.DataFrame([("n0", 0, "allreduce", "c", 10, 2)], schema=collectives.schema,
                                             orient="row"))
    result = nccl.unreached(behind, traces)
    assert result.select("process_group", "rank", "last_seq", "group_last_seq", "behind").rows() == [("c", 1, 9, 10, 1)]


def _plugin_dumps_for(warehouse: Warehouse, job: str, folder: Path) -> dict[tuple[int, int], tuple[str, str, int]]:
    """NCCL profiler-plugin dumps of the same operations as a profiled job's collectives (NCCL counts from 0)."""
    rows = warehouse.query(
        "SELECT rank, seq, collective, in_nelems FROM collectives WHERE job = ? ORDER BY rank, seq", [job]).rows
    folder.mkdir()
    tuning: dict[tuple[int, int], tuple[str, str, int]] = {}
    events: dict[int, list[dict[str, object]]] = {}
    for rank, seq, collective, count in rows:
        algo, proto, channels = ("TREE", "LL", 4) if seq % 3 == 0 else ("RING", "LL128", 16)
        tuning[(rank, seq)] = (algo, proto, channels)
        name = "AllGather" if "allgather" in collective else "AllReduce"
        args = {"SeqNum": seq - 1, "CommHash": 777, "Rank": rank, "Count": count, "Datatype": "ncclBfloat16",
                "Algorithm": algo, "Protocol": proto, "nChannels": channels}
        ts = 1000.0 + 100.0 * seq
        events.setdefault(rank, []).extend([
            {"name": name, "cat": "COLL", "ph": "b", "id": seq, "pid": rank, "tid": 1, "ts": ts, "args": args},
            {"name": name, "cat": "COLL", "ph": "e", "id": seq, "pid": rank, "tid": 1, "ts": ts + 5.0},
        ])
    for rank, dump in events.items():
        (folder / f"nccl_profile_777_{rank}.json").write_text(
            "[\n" + ",\n".join(json.dumps(e) for e in dump) + ",\n{}]\n")
    return tuning


def test_nccl_records_join_the_profiled_kernels(tmp_path: Path, warehouse: Warehouse) -> None:
    """Profiler-plugin records of the same job give each profiled NCCL kernel its algorithm, protocol, channels."""
    assert warehouse.ingest([ROOT / "sample_traces" / "kineto" / "ddp_straggler"], job="ddp").ok
    tuning = _plugin_dumps_for(warehouse, "ddp", tmp_path / "plugin")
    assert warehouse.ingest([tmp_path / "plugin"], job="ddp").ok
    joined = warehouse.analyze(job="ddp").nccl_tuning
    assert joined.height == len(tuning) > 0
    got = {(r["rank"], r["seq"]): (r["algorithm"], r["protocol"], r["channels"]) for r in joined.to_dicts()}
    assert got == tuning
    assert joined["kernel_name"].str.starts_with("ncclDevKernel_").all()
    assert (joined["nccl_seq"] == joined["seq"] - 1).all() and set(joined["communicator"]) == {"777"}


def test_nccl_records_of_other_operations_do_not_join(tmp_path: Path, warehouse: Warehouse) -> None:
    assert warehouse.ingest([ROOT / "sample_traces" / "kineto" / "ddp_straggler"], job="ddp").ok
    assert warehouse.ingest([NCCL / "profiler_plugin"], job="ddp").ok  # 8 AllReduces of another run
    assert warehouse.analyze(job="ddp").nccl_tuning.is_empty()


def test_join_needs_the_same_sizes_and_finds_the_offset() -> None:
    traces = pl.DataFrame({"trace_id": ["k", "n"], "format": ["pytorch_profiler", "nccl_profiler"]})

    def rows(trace: str, group: str, first_seq: int, sizes: list[int], algorithm: str | None) -> pl.DataFrame:
        return pl.DataFrame({
            "trace_id": trace, "rank": 0, "process_group": group, "process_group_desc": None,
            "seq": [first_seq + i for i in range(len(sizes))], "collective": "allreduce", "in_nelems": sizes,
            "kernel_event_id": list(range(len(sizes))), "kernel_name": "ncclDevKernel_AllReduce", "message_bytes": 4,
            "dur_ns": 10, "algorithm": algorithm, "protocol": "LL", "channels": 2,
        }).with_columns(pl.col("algorithm", "process_group_desc").cast(pl.String))

    sizes = [10, 20, 30, 10, 20, 30, 40]
    profiled = rows("k", "0", 1, sizes, None)
    later = rows("n", "c1", 105, sizes, "RING")  # a communicator whose numbering starts elsewhere
    joined = nccl_join.tuned_collectives(pl.concat([profiled, later]), traces)
    assert joined["seq"].to_list() == list(range(1, 8)) and set(joined["nccl_seq"]) == set(range(105, 112))
    other_sizes = rows("n", "c2", 0, [11, 21, 31, 11, 21, 31, 41], "TREE")
    assert nccl_join.tuned_collectives(pl.concat([profiled, other_sizes]), traces).is_empty()


def test_coll_lines_split_like_the_pattern_extracts_them() -> None:
    """The fast COLL reader gives exactly the pattern's fields, and drops the lines the pattern does not match."""
    from tracelake.ingest import nccl_log

    base = "node-a:5100:5107 [0] NCCL INFO AllReduce: opCount 1f sendbuff 0x7f00 recvbuff 0x7f08 count 1024 " \
           "datatype 7 op 0 root 0 comm 0x55d0c0a0"
    lines = (NCCL / "debug_log" / "train-4ranks.log").read_text().splitlines() + [
        base + " [nranks=4] stream 0x55d0d000",
        base + " stream 0x55d0d000",  # older NCCL: no [nranks=N]
        "[1,3]<stderr>:" + base + " [nranks=8] stream 0x1 trailing words",
        "gpu-node-7: [2026-01-01T00:00:00] " + base + " stream 0xab",
        "[2026-01-01 00:00:00.5]" + base + " stream 0xab",
        base.replace("count 1024", "count 1x24") + " stream 0x1",  # not a number
        base.replace("opCount 1f", "opCount zz") + " stream 0x1",
        base.replace("root 0", "root") + " stream 0x1",  # a field missing
        base + " [nranks=x] stream 0x1",
        base + " stream 55d0",  # not a pointer
        base.replace(" [0] ", " [a] ") + " stream 0x1",
        "node-a:5100:5107 [0] NCCL INFO AllReduce: opCount",
        # the pattern takes what it can: the hex run of a damaged pointer, numbers too big for a column
        base + " stream 0x55d0d000xyz",
        base.replace("count 1024", "count 99999999999999999999999") + " stream 0x1",
        base.replace("opCount 1f", "opCount ffffffffffffffffffffff") + " stream 0x1",
        base.replace("node-a:5100", "node-a:99999999999999999999999") + " stream 0x1",
        base.replace("datatype 7", "datatype 12") + " stream 0x1",
        base + " stream 0x1 NCCL INFO and more",
        base + " stream 0x1\r",  # a CRLF log
        base.replace("sendbuff 0x7f00", "sendbuff count") + " stream 0x1",  # " count " twice
        base.replace("recvbuff 0x7f08", "recvbuff count") + " stream 0x1",
        # not well-formed: the pattern drops them
        base.replace("AllReduce", "All-Reduce") + " stream 0x1",
        base.replace("opCount 1f", "opCount -f") + " stream 0x1",
        base.replace("opCount 1f", "opCount +1") + " stream 0x1",
        base.replace("count 1024", "count -1") + " stream 0x1",
        base.replace(" NCCL INFO ", " NCCL  INFO ") + " stream 0x1",
    ]
    unicode = [  # \w and \d take Unicode; cutting the line must count characters, not bytes
        "[2026-01-01 00:00:00.5] node-é:5100:5107 [0] NCCL INFO Ąll: opCount 1 sendbuff 0 recvbuff 0 count ١٢ "
        "datatype 7 op 0 root 0 comm 0x1 stream 0x1",
        "gpu-é: " + base + " stream 0x1",
    ]
    for sample in (lines, lines + unicode):
        series = pl.Series("line", sample, dtype=pl.String)
        picked = series.filter(series.str.contains(nccl_log.COLL_MARKER, literal=True))
        expected = picked.str.extract_groups(nccl_log.KINDS["coll"][1]).struct.unnest().filter(pl.col("host").is_not_null())
        got = nccl_log.coll_fields(picked)
        assert got.equals(expected)
        assert got.height == 48 + 5 + 9 + (len(sample) - len(lines))
    # unlike the pattern, any launcher prefix before host:pid:tid is accepted (the first timestamp is kept)
    lenient = nccl_log.coll_fields(pl.Series([
        "2026-01-01 12:00:00 rank3> " + base + " stream 0x1",
        "[2026-01-01 00:00:00.5] [2026-01-02 00:00:00] " + base + " stream 0x2",
        "a:1:2:3 [0] NCCL INFO AllReduce: opCount 1 sendbuff 0 recvbuff 0 count 1 datatype 7 op 0 root 0 "
        "comm 0x1 stream 0x3",
    ]))
    assert lenient.select("ts", "host", "pid", "tid", "opcount", "stream").rows() == [
        (None, "node-a", "5100", "5107", "1f", "0x1"),
        ("2026-01-01 00:00:00.5", "node-a", "5100", "5107", "1f", "0x2"),
        (None, "1", "2", "3", "1", "0x3"),
    ]
