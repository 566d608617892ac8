"""nccl-tests output as users save it: mixed with NCCL_DEBUG=INFO lines, without the collective's name,
older rank lines, pasted tables, ``-J`` JSON with string fields (docs/formats.md, "nccl-tests output")."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from conftest import ROOT
from tracelake.analysis import nccl
from tracelake.ingest import detect
from tracelake.ingest.nccl_tests_facts import infer_collective
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
    assert "0.750 with 4 ranks" in warning and "all_gather" in warning and "reduce_scatter" in warning
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
    assert names == [("NVIDIA A100-SXM4-80GB",)] and _count(warehouse, "devices") == gen.MIXED_RANKS


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
    trace = _ingest(warehouse, "alltoall_j.json")
    assert _count(warehouse, "nccl_benchmarks") == 2 * len(gen.SIZES)
    assert warehouse.query("select distinct root, wrong, ranks, nodes from nccl_benchmarks").rows == [(-1, 0, 8, 2)]
    assert _count(warehouse, "devices") == 8 and trace["world_size"] == 8
    assert any("all_gather, alltoall" in w for w in trace["warnings"])  # both (n-1)/n, redop none: ambiguous


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
