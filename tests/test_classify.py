"""The classification rules, on made-up and on real kernel names."""

from __future__ import annotations

import duckdb
import pytest

from conftest import real_kineto_files
from tracelake.analysis.classify import CATEGORIES, category_sql, classify
from tracelake.warehouse import Warehouse


@pytest.mark.parametrize(
    ("kind", "name", "expected"),
    [
        ("kernel", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "communication"),
        ("kernel", "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "communication"),
        ("kernel", "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "communication"),
        ("kernel", "rcclGenericKernel", "communication"),
        ("kernel", "HCCL_AllReduce", "communication"),
        ("memcpy", "Memcpy HtoD (Pinned -> Device)", "memory"),
        ("memset", "Memset (Device)", "memory"),
        ("kernel", "Memcpy DtoD (Device -> Device)", "memory"),
        ("sync", "Event Sync", "sync"),
        ("kernel", "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", "compute"),
        ("kernel", "triton_poi_fused_relu_0", "compute"),
        ("kernel", "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "compute"),
        ("kernel", "my_nccl_like_kernel", "compute"),  # 'nccl' not at the start
    ],
)
def test_rules(kind: str, name: str, expected: str) -> None:
    assert classify(kind, name) == expected


def test_sql_and_python_rules_agree() -> None:
    names = [
        ("kernel", "ncclDevKernel_Generic(x)"), ("kernel", "NCCLKERNEL_x"), ("memcpy", "Memcpy DtoH"),
        ("kernel", "Memset_kernel"), ("sync", "Stream Sync"), ("kernel", "gemm"), ("kernel", "xncclKernel"),
    ]
    con = duckdb.connect()
    rows = con.execute(
        f"SELECT kind, name, {category_sql()} FROM (VALUES {', '.join(f'({k!r}, {n!r})' for k, n in names)}) t(kind, name)"
    ).fetchall()
    for kind, name, category in rows:
        assert category == classify(kind, name), (kind, name)
        assert category in CATEGORIES


def test_rules_on_real_kernel_names(tmp_path) -> None:  # type: ignore[no-untyped-def]
    files = real_kineto_files()
    if not files:
        pytest.skip("../shared/real_traces is not present")
    wh = Warehouse(tmp_path / "wh")
    report = wh.ingest(files, job="real")
    assert report.ok, [r.error for r in report.failed]
    rows = wh.query("SELECT DISTINCT kind, name, category FROM device_ops").rows
    assert rows
    seen = {category for _, _, category in rows}
    assert {"compute", "communication", "memory"} <= seen
    for kind, name, category in rows:
        assert category == classify(kind, name)
        lowered = name.lower()
        if lowered.startswith(("nccl", "rccl")) or "nccldevkernel" in lowered:
            assert category == "communication", name
        elif kind in ("memcpy", "memset"):
            assert category == "memory", name
