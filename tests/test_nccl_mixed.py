"""nccl-tests output as users save it: mixed with NCCL_DEBUG=INFO lines, without the collective's name,
older rank lines, pasted tables, ``-J`` JSON with string fields (docs/formats.md, "nccl-tests output")."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from support import ROOT
from tracelake.analysis import nccl
from tracelake.ingest import detect
from tracelake.ingest.nccl_tests_facts import infer_collective, version_text
from tracelake.sample_traces import generate_nccl_tests as gen
from tracelake.warehouse import Warehouse

SAVED = ROOT / "sample_traces" / "nccl" / "nccl_tests_saved"


def _ingest(warehouse: Warehouse, name: str) -> dict[str, Any]:
    path = SAVED / name
    assert detect(path).name == "nccl_tests"
    result = warehouse.ingest_file(path, job="saved")
    assert result.ok, result.error
    return warehouse.traces()[0]


def _count(warehouse: Warehouse, table: str) -> int:
    return warehouse.query(f"select count(*) from {table}").rows[0][0]


def _result_rows(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines() if re.match(r"^\s+\d+\s+\d+\s", line)]


def test_committed_samples_match_the_generator() -> None:
    for name, make in gen.FILES.items():
        assert (SAVED / name).read_text() == make(), name


def test_debug_info_stdout_fills_benchmarks_and_the_nccl_log_tables(warehouse: Warehouse) -> None:
    text = (SAVED / "debug_mixed.log").read_text()
    trace = _ingest(warehouse, "debug_mixed.log")
    # independent counts from the text: each result row is two rows (out-of-place, in-place)
    assert _count(warehouse, "nccl_benchmarks") == 2 * len(_result_rows(text)) == 2 * len(gen.SIZES)
    assert _count(warehouse, "communicators") == text.count("Init COMPLETE") == gen.MIXED_RANKS
    assert _count(warehouse, "comm_channels") == len(re.findall(r"NCCL INFO Channel \d+/", text))
    assert _count(warehouse, "collectives") == text.count("AllReduce: opCount")
    version = re.search(r"NCCL version (\S+)", text)
    assert version and trace["nccl_version"] == version.group(1) == "2.18.3+cuda12.2"
    assert trace["warnings"] == []  # no line counted as "not nccl-tests output"
    bench = warehouse.query("select distinct collective, ranks, nodes from nccl_benchmarks").rows
    assert bench == [("all_reduce", gen.MIXED_RANKS, len(gen.MIXED_HOSTS))]  # inferred: no name, no start line


@pytest.mark.parametrize(("collective", "n", "redop", "root"), [
    ("all_reduce", 8, "sum", -1), ("reduce_scatter", 8, "sum", -1), ("broadcast", 8, "none", 0),
    ("reduce", 8, "sum", 0), ("all_reduce", 3, "sum", -1), ("reduce_scatter", 16, "max", -1)])
def test_collective_from_the_bus_bandwidth_factor(collective: str, n: int, redop: str, root: int) -> None:
    factor = {"all_reduce": 2 * (n - 1) / n, "reduce_scatter": (n - 1) / n, "broadcast": 1.0, "reduce": 1.0}[collective]
    algbw = [0.0, 0.5, 3.7, 40.25, 120.0]
    data = {"algbw_gbs": algbw, "busbw_gbs": [round(a * factor, 2) for a in algbw],
            "redop": [redop] * 5, "root": [root] * 5}
    assert infer_collective(data, n) == (collective, None)


def test_ambiguous_factors_warn_and_stay_unknown(warehouse: Warehouse) -> None:
    trace = _ingest(warehouse, "t4_old_ranks.txt")  # (n-1)/n with no redop/root columns
    assert warehouse.query("select distinct collective from nccl_benchmarks").rows == [("unknown",)]
    (warning,) = trace["warnings"]
    # (n-1)/n = 0.75 for 4 ranks, up to the rounding of the printed bandwidths
    assert re.search(r"= 0\.7[45]\d with 4 ranks", warning) and "all_gather" in warning and "reduce_scatter" in warning
    data = {"algbw_gbs": [10.0], "busbw_gbs": [10.0], "redop": [None], "root": [None]}
    collective, warning = infer_collective(data, 8)  # factor 1: broadcast, reduce or sendrecv
    assert collective is None and "broadcast, reduce, sendrecv" in warning
    assert infer_collective(data, None)[0] is None


def test_old_rank_lines_give_ranks_nodes_and_gpu_rows(warehouse: Warehouse) -> None:
    text = (SAVED / "t4_old_ranks.txt").read_text()
    lines = [line.split() for line in text.splitlines() if line.startswith("#   Rank")]
    assert lines and not any("Group" in line for line in lines)
    trace = _ingest(warehouse, "t4_old_ranks.txt")
    hosts = {line[6] for line in lines}  # '#', 'Rank', r, 'Pid', p, 'on', host
    assert warehouse.query("select distinct ranks, nodes from nccl_benchmarks").rows == [(len(lines), len(hosts))]
    assert trace["world_size"] == len(lines) and trace["host"] == "gpu01"
    devices = warehouse.query("select rank, device, kind, name from devices order by rank").rows
    assert devices == [(int(line[2]), int(line[8]), "gpu", "Tesla T4") for line in lines]


def test_new_rank_lines_also_give_gpu_rows(warehouse: Warehouse) -> None:
    _ingest(warehouse, "debug_mixed.log")
    names = warehouse.query("select distinct name from devices where kind = 'gpu'").rows
    gpus = warehouse.query("select count(*) from devices where kind = 'gpu'").rows[0][0]
    assert names == [("NVIDIA A100-SXM4-80GB",)] and gpus == gen.MIXED_RANKS


def test_latency_comes_from_the_smallest_non_zero_size(warehouse: Warehouse) -> None:
    _ingest(warehouse, "debug_mixed.log")
    result = warehouse.query("select * from nccl_benchmarks")
    rows = pl.DataFrame([dict(zip(result.columns, r, strict=True)) for r in result.rows])
    assert rows["size_bytes"].min() == 0
    summary = nccl.benchmark_summary(rows)
    smallest = min(s for s in gen.SIZES if s > 0)
    for row in summary.iter_rows(named=True):
        expected = gen.timing("all_reduce", gen.MIXED_RANKS, smallest, row["in_place"])[0]
        assert row["small_time_us"] == pytest.approx(expected)


def test_table_pasted_without_the_header(warehouse: Warehouse) -> None:
    text = (SAVED / "pasted_table.txt").read_text()
    assert "nThread" not in text
    trace = _ingest(warehouse, "pasted_table.txt")
    got = warehouse.query("select size_bytes, time_us, algbw_gbs, busbw_gbs, root, redop from nccl_benchmarks "
                          "where not in_place order by size_bytes").rows
    assert got == [(int(r[0]), float(r[5]), float(r[6]), float(r[7]), int(r[4]), r[3]) for r in _result_rows(text)]
    assert any("no rank count" in w for w in trace["warnings"])  # no rank lines: nothing to infer from


def test_json_with_string_fields_and_config_devices(warehouse: Warehouse) -> None:
    doc = json.loads((SAVED / "alltoall_j.json").read_text())
    trace = _ingest(warehouse, "alltoall_j.json")
    assert _count(warehouse, "nccl_benchmarks") == 2 * len(doc["results"]) == 2 * len(gen.SIZES)
    assert warehouse.query("select distinct root, wrong, ranks, nodes from nccl_benchmarks").rows == [(-1, 0, 8, 2)]
    # the GPU model is the writer's device_info; the collective its program (args[0]); the version NCCL's code
    names = warehouse.query("select distinct name from devices where kind = 'gpu'").rows
    assert names == [(doc["config"]["devices"][0]["device_info"],)] and _count(warehouse, "devices") == 8
    assert warehouse.query("select distinct collective from nccl_benchmarks").rows == [("alltoall",)]
    assert trace["world_size"] == 8 and trace["nccl_version"] == "2.27.3" and trace["warnings"] == []


def test_json_without_the_program_infers_and_says_when_ambiguous(warehouse: Warehouse, tmp_path: Path) -> None:
    doc = json.loads((SAVED / "alltoall_j.json").read_text())
    doc["args"] = []
    for row in doc["results"]:  # -C prints cpu_time in place of time
        for half in ("out_of_place", "in_place"):
            row[half]["cpu_time"] = row[half].pop("time")
    path = tmp_path / "results.json"
    path.write_text(json.dumps(doc))
    assert warehouse.ingest_file(path, job="saved").ok
    trace = warehouse.traces()[0]
    assert any("all_gather, alltoall" in w for w in trace["warnings"])  # both (n-1)/n, redop none: ambiguous
    times = warehouse.query("select time_us from nccl_benchmarks where not in_place order by size_bytes").rows
    assert [t for (t,) in times] == [r["out_of_place"]["cpu_time"] for r in doc["results"]]


@pytest.mark.parametrize(("code", "text"), [(22703, "2.27.3"), (21903, "2.19.3"), (2804, "2.8.4"), (2406, "2.4.6")])
def test_nccl_version_codes(code: int, text: str) -> None:
    # NCCL_VERSION(X,Y,Z): X*10000 + Y*100 + Z since 2.9, X*1000 + Y*100 + Z before
    assert version_text(code) == text


def test_several_runs_in_one_file_are_told_apart(warehouse: Warehouse) -> None:
    text = (SAVED / "several_runs.txt").read_text()
    _ingest(warehouse, "several_runs.txt")
    got = warehouse.query("select collective, ranks, count(*) from nccl_benchmarks group by all order by all").rows
    expected: dict[tuple[str, int], int] = {}
    for collective, ranks, _, _ in gen.SEVERAL:
        expected[(collective, ranks)] = expected.get((collective, ranks), 0) + 2 * len(gen.SIZES)
    assert got == sorted((c, r, n) for (c, r), n in expected.items())
    assert _count(warehouse, "nccl_benchmarks") == 2 * len(_result_rows(text))
    # the per-iteration run: time, algbw and busbw are the first three of each eight-column half
    rs = warehouse.query("select size_bytes, time_us, busbw_gbs from nccl_benchmarks "
                         "where collective = 'reduce_scatter' and in_place order by size_bytes").rows
    assert rs == [(s, *gen.timing("reduce_scatter", 8, s, True)[::2]) for s in gen.SIZES]


def test_mixed_log_names_its_nics_and_reads_against_one_hdr_nic(warehouse: Warehouse) -> None:
    text = (SAVED / "debug_mixed.log").read_text()
    _ingest(warehouse, "debug_mixed.log")
    nics = warehouse.query("select name from devices where kind = 'nic' order by name").rows
    assert [n for (n,) in nics] == sorted(set(re.findall(r"\[\d+\](mlx5_\d+:\d+/IB)", text)))
    result = warehouse.analyze(job="saved")
    rows = result.nccl_benchmarks
    assert set(rows["link"].to_list()) == {"ib_hdr"}  # A100 on 2 nodes, NET/IB/0 only: one HDR NIC per rank
    peak = max(float(t.split()[-6]) for t in text.splitlines() if re.match(r"^\s+\d+\s+\d+\s", t))
    for row in rows.iter_rows(named=True):
        assert row["peak_share_pct"] == pytest.approx(100 * row["peak_busbw_gbs"] / 25.0)
        assert row["peak_share_pct"] <= 100 and row["peak_busbw_gbs"] <= peak + 0.5


def test_roce_nics_choose_the_roce_link() -> None:
    transports = ["NET/IB/0/GDRDMA", "NET/IB/1/GDRDMA"]
    ib = nccl.choose_link(2, "NVIDIA H100 80GB HBM3", transports, {}, ["mlx5_0:1/IB", "mlx5_1:1/IB"])
    roce = nccl.choose_link(2, "NVIDIA H100 80GB HBM3", transports, {}, ["mlx5_0:1/RoCE", "mlx5_1:1/RoCE"])
    assert ib == ("ib_ndr", 100.0, None)  # two 400 Gb/s NICs: 2 x 50 GB/s
    assert roce == ("roce_400", 100.0, None)
    said = nccl.choose_link(2, "NVIDIA H100 80GB HBM3", transports, nccl.link_peaks("roce=20"), ["mlx5_0:1/RoCE"])
    assert said == ("roce_400", 20.0, None)


def test_nic_lines_are_read_from_every_shape(tmp_path: Path, warehouse: Warehouse) -> None:
    lines = ["h1:10:10 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_3:1/RoCE [RO]; OOB eth0:10.1.1.1<0>",
             "h1:10:10 [0] NCCL INFO NET/Socket : Using [0]eth0:10.1.1.1<0> [1]eth1:10.1.2.1<0>",
             "h2:11:11 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE ; OOB eth0:10.1.1.2<0>",
             "h1:10:12 [0] NCCL INFO comm 0x1 rank 0 nranks 2 cudaDev 0 busId 1000 - Init COMPLETE"]
    path = tmp_path / "nccl.log"
    path.write_text("\n".join(lines) + "\n")
    assert warehouse.ingest_file(path, job="nics").ok
    got = warehouse.query("select name, device from devices where kind = 'nic' order by name").rows
    assert got == [("eth0", 0), ("eth1", 1), ("mlx5_0:1/RoCE", 0), ("mlx5_3:1/RoCE", 1)]
    assert warehouse.traces()[0]["warnings"] == []  # every line read


def test_transports_are_taken_from_the_same_job_only() -> None:
    rows = pl.DataFrame({"trace_id": ["bench", "bench"], "collective": ["all_reduce"] * 2, "in_place": [False] * 2,
                         "ranks": [16, 16], "nodes": [2, 2], "size_bytes": [1 << 20, 1 << 27],
                         "busbw_gbs": [10.0, 40.0], "time_us": [100.0, 3000.0]})
    devices = pl.DataFrame({"trace_id": ["bench"], "kind": ["gpu"], "name": ["NVIDIA H100 80GB HBM3"]})
    channels = pl.DataFrame({"trace_id": ["log"], "transport": ["NET/IB/0/GDRDMA"]})
    for job, link in (("same", "ib_ndr"), ("other", "unknown")):
        traces = pl.DataFrame({"trace_id": ["bench", "log"], "job": ["same", job]})
        got = nccl.benchmark_summary(rows, {}, devices=devices, traces=traces, channels=channels)
        assert got["link"].to_list() == [link], job


def test_a_bad_row_in_a_mixed_file_writes_nothing(warehouse: Warehouse, tmp_path: Path) -> None:
    lines = gen.debug_mixed_text().splitlines()
    row = next(i for i, line in enumerate(lines) if line.lstrip().startswith("2048 "))
    tokens = lines[row].split()
    lines[row] = " ".join([*tokens[:5], "fast", *tokens[6:]])  # a time that is not a number
    path = tmp_path / "broken.log"
    path.write_text("\n".join(lines) + "\n")
    result = warehouse.ingest_file(path, job="saved")
    assert not result.ok and "broken.log" in str(result.error) and f"line {row + 1}" in str(result.error)
    assert _count(warehouse, "communicators") == 0 and _count(warehouse, "nccl_benchmarks") == 0
