"""nccl-tests bandwidth against the link the hardware really has (docs/analyses.md, "Link peaks").

The expected figures are the vendors' (GB/s per GPU, one direction), worked out here from
the spec sheets, never read back from tracelake.analysis.hardware; busbw follows the
nccl-tests formula for all_reduce, busbw = algbw * 2(n-1)/n.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tracelake.analysis import nccl, nccl_findings
from tracelake.warehouse import Warehouse
from tracelake.warehouse.settings import Settings

A100_NVLINK3 = 600 / 2          # A100 SXM datasheet: NVLink 600 GB/s, both directions
K80_PCIE3 = 8 * 16 * 128 / 130 / 8  # PCIe 3.0 x16: 8 GT/s per lane, 128b/130b, bits -> bytes (15.75)
NDR_NIC = 400 / 8               # InfiniBand NDR: 400 Gb/s per port
SIZES = [1 << 20, 1 << 24, 1 << 28, 1 << 30]


def _busbw(size: int, time_us: float, ranks: int) -> tuple[float, float]:
    algbw = size / time_us / 1e3
    return algbw, algbw * 2 * (ranks - 1) / ranks


def _nccl_tests_text(gpu: str, hosts: list[str], gpus_per_host: int, peak_busbw: float) -> str:
    """An all_reduce_perf stdout whose largest size reaches ``peak_busbw`` (smaller sizes less)."""
    ranks = len(hosts) * gpus_per_host
    lines = [("# nThread 1 nGpus 1 minBytes 1048576 maxBytes 1073741824 step: 16(factor) warmup iters: 5 iters: 20 "
              "agg iters: 1 validation: 1 graph: 0"), "#", "# Using devices"]
    for rank in range(ranks):
        host, device = hosts[rank // gpus_per_host], rank % gpus_per_host
        lines.append(f"#  Rank {rank:2d} Group  0 Pid {4100 + rank:6d} on {host:>9} device {device:2d} "
                     f"[0x{16 * device + 7:02x}] {gpu}")
    lines += ["#", ("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   "
                    "algbw   busbw #wrong"), ("#        (B)    (elements)                               (us)  (GB/s)  "
                                             "(GB/s)            (us)  (GB/s)  (GB/s)")]
    for i, size in enumerate(SIZES):
        target = peak_busbw * (i + 1) / len(SIZES)
        time_us = size * 2 * (ranks - 1) / ranks / target / 1e3
        algbw, busbw = _busbw(size, time_us, ranks)
        lines.append(f"{size:12d} {size // 4:13d}     float     sum      -1 {time_us:8.2f} {algbw:7.2f} {busbw:7.2f}"
                     f"      0 {time_us:8.2f} {algbw:7.2f} {busbw:7.2f}      0")
    return "\n".join([*lines, "# Out of bounds values : 0 OK", "#", ""])


def _summary(tmp_path: Path, text: str, environ: dict[str, str] | None = None) -> tuple[dict, list]:
    path = tmp_path / "all_reduce_perf.txt"
    path.write_text(text)
    wh = Warehouse(settings=Settings.from_env(environ=environ or {}, home=tmp_path / "home"))
    assert wh.ingest_file(path, job="bench").ok
    analysis = wh.analyze(job="bench")
    row = analysis.nccl_benchmarks.filter(~pl.col("in_place")).row(0, named=True)
    return row, [f for f in analysis.findings if f.kind in ("low_bus_bandwidth", "nccl_link_unknown")]


def test_two_a100_sxm_on_one_node_are_held_to_nvlink3(tmp_path: Path) -> None:
    row, found = _summary(tmp_path, _nccl_tests_text("NVIDIA A100-SXM4-80GB", ["host1"], 2, 130.0))
    assert row["link"] == "nvlink3" and row["link_peak_gbs"] == pytest.approx(A100_NVLINK3)
    assert row["peak_share_pct"] == pytest.approx(100 * 130 / A100_NVLINK3, abs=0.1)  # 43%, of A100's own NVLink
    assert [f.title for f in found] == ["all_reduce peaks at 130.0 GB/s bus bandwidth, 43% of nvlink3"]


def test_k80_is_held_to_pcie3_not_nvlink(tmp_path: Path) -> None:
    row, found = _summary(tmp_path, _nccl_tests_text("Tesla K80", ["host1"], 4, 9.0))
    assert row["link"] == "pcie3" and row["link_peak_gbs"] == pytest.approx(K80_PCIE3, rel=1e-3)
    assert row["peak_share_pct"] == pytest.approx(100 * 9 / K80_PCIE3, abs=0.1)
    assert found and "of pcie3" in found[0].title


def test_two_nodes_without_a_log_of_the_network_give_no_share(tmp_path: Path) -> None:
    row, found = _summary(tmp_path, _nccl_tests_text("NVIDIA H100 80GB HBM3", ["node-a", "node-b"], 8, 339.0))
    assert row["nodes"] == 2 and row["link"] == "unknown"
    assert row["link_peak_gbs"] is None and row["peak_share_pct"] is None  # not 678% of one NIC
    assert len(found) == 1 and "link unknown" in found[0].title and "%" not in found[0].title


def _bench(gpu: str, nodes: int, busbw: float, ranks: int = 16) -> tuple[pl.DataFrame, pl.DataFrame]:
    rows = pl.DataFrame({"trace_id": ["t"] * len(SIZES), "collective": ["all_reduce"] * len(SIZES),
                         "in_place": [False] * len(SIZES), "size_bytes": SIZES, "ranks": [ranks] * len(SIZES),
                         "nodes": [nodes] * len(SIZES), "busbw_gbs": [busbw * (i + 1) / len(SIZES)
                                                                      for i in range(len(SIZES))],
                         "time_us": [10.0] * len(SIZES)})
    devices = pl.DataFrame({"trace_id": ["t"] * ranks, "rank": list(range(ranks)), "device": list(range(ranks)),
                            "kind": ["gpu"] * ranks, "name": [gpu] * ranks})
    return rows, devices


def _channels(transports: list[str]) -> pl.DataFrame:
    return pl.DataFrame({"trace_id": ["t"] * len(transports), "transport": transports})


def test_sixteen_ranks_on_two_nodes_over_ib_get_the_per_rank_network_figure() -> None:
    rows, devices = _bench("NVIDIA H100 80GB HBM3", 2, 339.0)
    nics = _channels([f"NET/IB/{i}/GDRDMA" for i in range(8)] + ["P2P/CUMEM/read"])
    row = nccl.benchmark_summary(rows, {}, devices=devices, channels=nics).row(0, named=True)
    assert row["link"] == "ib_ndr" and row["link_peak_gbs"] == pytest.approx(8 * NDR_NIC)  # 8 NDR NICs per node
    assert row["peak_share_pct"] == pytest.approx(100 * 339 / (8 * NDR_NIC))  # 85%, not 678%
    one = nccl.benchmark_summary(rows, {}, devices=devices, channels=_channels(["NET/IB/0/GDRDMA"])).row(0, named=True)
    assert one["peak_share_pct"] is None and "not the bottleneck" in one["link_note"]  # 339 > 1.1 x one NIC


def test_unknown_gpu_gives_no_percentage() -> None:
    rows, devices = _bench("Acme Tensor Slab 9000", 1, 100.0, ranks=4)
    summary = nccl.benchmark_summary(rows, {}, devices=devices)
    row = summary.row(0, named=True)
    assert row["link"] == "unknown" and row["link_peak_gbs"] is None and row["peak_share_pct"] is None
    (finding,) = nccl_findings.from_nccl_benchmarks(summary)
    assert "link unknown" in finding.title and "Acme" in finding.title and "%" not in finding.title


def test_overrides_by_name_and_by_family(tmp_path: Path) -> None:
    text = _nccl_tests_text("NVIDIA A100-SXM4-80GB", ["host1"], 2, 130.0)
    row, _ = _summary(tmp_path, text, {"TRACELAKE_LINK_PEAKS": "nvlink3=260"})
    assert row["link_peak_gbs"] == 260 and row["peak_share_pct"] == pytest.approx(50, abs=0.1)
    rows, devices = _bench("NVIDIA H100 80GB HBM3", 2, 339.0)
    said = nccl.benchmark_summary(rows, nccl.link_peaks("ib=380"), devices=devices, channels=_channels(["NET/IB"]))
    assert said.row(0, named=True)["link_peak_gbs"] == 380


_MODELS = ["NVIDIA A100-SXM4-80GB", "Tesla K80", "NVIDIA H100 80GB HBM3", "NVIDIA L4", "AMD Instinct MI300X",
           "Tesla V100-SXM2-32GB", "NVIDIA B200", "Mystery GPU"]
_TRANSPORTS = ["NET/IB/0/GDRDMA", "NET/IB/1", "NET/Socket/0", "NET/AWS Libfabric/0/GDRDMA", "P2P/IPC", "SHM/direct/direct"]


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(_MODELS), st.integers(1, 4), st.floats(0.1, 5000.0),
       st.lists(st.sampled_from(_TRANSPORTS), max_size=4))
def test_a_reported_share_never_passes_110_percent(model: str, nodes: int, busbw: float, transports: list[str]) -> None:
    rows, devices = _bench(model, nodes, busbw)
    row = nccl.benchmark_summary(rows, {}, devices=devices, channels=_channels(transports)).row(0, named=True)
    if row["peak_share_pct"] is not None:
        assert 0 < row["peak_share_pct"] <= 100 * nccl.OVER_PEAK
    else:
        assert row["link_note"] and row["link_note"].startswith("link unknown")


def test_job_report_link_follows_the_hardware_and_says_when_it_is_unknown() -> None:
    from tracelake.analysis.job_view import link_choice

    no_topology = pl.DataFrame()
    one_host = pl.DataFrame({"device_type": ["cuda"] * 2, "device_name": ["NVIDIA A100-SXM4-80GB"] * 2,
                             "host": ["a", "a"]})
    assert link_choice(one_host, no_topology, {}) == ("nvlink3", 300.0, None)  # A100 SXM: 600 GB/s both ways
    two_hosts = one_host.with_columns(pl.Series("host", ["a", "b"]))
    link, peak, why = link_choice(two_hosts, no_topology, {})
    assert peak is None and why and "unknown" in why  # no log says which network: no figure, a reason
    tpu = pl.DataFrame({"device_type": ["tpu"], "device_name": ["TPU v6 Lite"], "host": ["a"]})
    assert link_choice(tpu, no_topology, {})[0] == "ici"
