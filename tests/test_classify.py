"""The classification rules, on made-up and on real kernel names."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from support import REAL_TRACES, real_kineto_files
from tracelake.contracts.classify import CATEGORIES, RULES, Category, category_sql, classify, op_kind
from tracelake.warehouse import Warehouse

#: The MTIA trace (Kineto JSON of Meta's accelerator), read once a parser reads it (../shared/real_traces/README.md).
REAL_MTIA = REAL_TRACES / "pytorch_other" / "hta_mtia_single_rank"


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
        ("kernel", "CopyDeviceToDevice", "memory"),  # roctracer's copy names (XLA called them compute)
        ("kernel", "__amd_rocclr_fillBufferAligned.kd", "memory"),
        ("kernel", "hcclAllReduce", "communication"),  # XLA's rules knew no hccl
        ("kernel", "void ncclKernel_AllGather(ncclWorkElem)", "communication"),  # nor ncclKernel inside a name
        ("memcpy", "dma_request", "memory"),  # MTIA's DMA
        ("kernel", "fc-dtype_Float", "compute"),  # an MTIA kernel
        ("xla_op", "fusion.3", "compute"),
        ("kernel", "index_copy-dtype_Double", "compute"),
    ],
)
def test_rules(kind: str, name: str, expected: str) -> None:
    assert classify(kind, name) == expected
    assert isinstance(classify(kind, name), Category)


@pytest.mark.parametrize(
    ("kind", "name", "hlo_category", "expected"),
    [
        ("xla_op", "x", "all-reduce fusion", "communication"),
        ("xla_op", "all-gather-start.2", " All-Gather-Start.2 ", "communication"),
        ("xla_op", "psum.7", "all-reduce", "communication"),
        ("xla_op", "ag", "async all-gather", "communication"),
        ("kernel", "loop_fusion.kd", "reduce-scatter-done", "communication"),
        ("xla_op", "copy-start", "copy-start", "memory"),
        ("xla_op", "copy.3", "copy", "memory"),
        ("memcpy", "__amd_rocclr_copyBuffer.kd", "copy", "memory"),
        ("kernel", "dus", "dynamic-update-slice", "memory"),
        ("xla_op", "fusion.3", "convolution fusion", "compute"),
        ("xla_op", "copy_fusion", "loop fusion", "compute"),
        ("xla_op", "all-reduce-scatter.1", "all-reduce-scatter", "compute"),  # not an opcode we know
        ("sync", "x", "all-reduce", "sync"),  # the kind comes first
    ],
)
def test_rules_with_xla_evidence(kind: str, name: str, hlo_category: str, expected: str) -> None:
    assert classify(kind, name, hlo_category) == expected


def test_category_is_an_enum_of_the_stored_strings() -> None:
    assert [str(c) for c in CATEGORIES] == ["compute", "communication", "memory", "sync"]
    assert {rule.category for rule in RULES} == set(Category)
    assert Category("memory") is Category.MEMORY and Category.MEMORY == "memory"


@pytest.mark.parametrize(("name", "kind"), [
    ("Memcpy DtoD", "memcpy"), ("__amd_rocclr_copyBuffer.kd", "memcpy"), ("CopyHostToDevice", "memcpy"),
    ("Memset (Device)", "memset"), ("__amd_rocclr_fillBufferAligned.kd", "memset"), ("gemm_fusion.kd", "kernel"),
])
def test_gpu_op_kinds_from_names(name: str, kind: str) -> None:
    assert op_kind(name) == kind


def sql_categories(rows: list[tuple[str | None, str | None, str | None]]) -> list[str]:
    """The categories DuckDB's SQL of the rules gives (kind, name, hlo_category) rows, in order."""
    con = duckdb.connect()
    con.execute("CREATE TABLE ops (i INTEGER, kind VARCHAR, name VARCHAR, hlo_category VARCHAR)")
    con.executemany("INSERT INTO ops VALUES (?, ?, ?, ?)", [(i, *row) for i, row in enumerate(rows)])
    sql = category_sql("kind", "name", "hlo_category")
    return [c for (c,) in con.execute(f"SELECT {sql} FROM ops ORDER BY i").fetchall()]


def test_sql_and_python_rules_agree() -> None:
    rows: list[tuple[str | None, str | None, str | None]] = [
        ("kernel", "ncclDevKernel_Generic(x)", None), ("kernel", "NCCLKERNEL_x", None), ("memcpy", "Memcpy DtoH", None),
        ("kernel", "Memset_kernel", None), ("sync", "Stream Sync", None), ("kernel", "gemm", None),
        ("kernel", "xncclKernel", None), ("xla_op", "a", "all-reduce-start"), ("xla_op", "a", " COPY "),
        ("xla_op", "a", "copy-starts"), ("xla_op", "a", "async collective-permute.2"), ("kernel", "o'brien", None),
        (None, None, None), ("kernel", "copydevicetohost", "fusion"), ("xla_op", "all-reduce", "send-done"),
    ]
    assert sql_categories(rows) == [classify(*row) for row in rows]
    # Kineto has no hlo_category: its SQL leaves the XLA rules out, as classify() does for None.
    con = duckdb.connect()
    kineto = con.execute(f"SELECT {category_sql()} FROM (VALUES ('kernel', 'all-reduce')) t(kind, name)").fetchall()
    assert kineto == [(classify("kernel", "all-reduce"),)] == [("compute",)]


def expected_family(kind: str | None, name: str, hlo_category: str | None) -> str | None:
    """What the known families say, written apart from the rules (plain string tests): None if no family claims it."""
    lowered = name.lower()
    hlo = (hlo_category or "").strip().lower()
    base = hlo.split(".")[0].removeprefix("async ").removesuffix(" fusion")
    for suffix in ("-start", "-done", "-update"):
        base = base.removesuffix(suffix)
    if kind == "sync":
        return "sync"
    if base in {"all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute", "send", "recv"}:
        return "communication"
    if lowered.startswith(("nccl", "rccl", "hccl")) or "ncclkernel" in lowered or "nccldevkernel" in lowered:
        return "communication"
    if kind in ("memcpy", "memset") or lowered.startswith(("memcpy", "memset")) or name == "dma_request":
        return "memory"
    if hlo in {"copy", "copy-start", "copy-done"} or "copybuffer" in lowered or "fillbuffer" in lowered:
        return "memory"
    if lowered.startswith(("copydevicetodevice", "copyhosttodevice", "copydevicetohost")):
        return "memory"
    if kind == "kernel" and (lowered.startswith(("void at::native::", "triton_", "cijk_", "sm90_", "ampere_"))
                             or lowered.endswith("fusion.kd")):
        return "compute"
    if kind == "xla_op" and ("fusion" in hlo or base in {"broadcast", "convolution", "dot", "add"}):
        return "compute"
    if kind == "kernel" and name.count("-dtype_") == 1:  # MTIA kernels: <op>-dtype_<type>[-extraKey_N]
        return "compute"
    return None


def real_files() -> list[Path]:
    """Every real trace a parser reads: Kineto (MTIA included) and XLA."""
    files = real_kineto_files()
    if REAL_MTIA.is_dir():
        files += sorted(REAL_MTIA.glob("*.json.gz"))
    xla = REAL_TRACES / "xla"
    if xla.is_dir():
        files += sorted(p for p in xla.rglob("*") if p.is_file() and p.name.endswith((".xplane.pb", ".json.gz")))
    return files


#: (format, kind, name, hlo_category, category) of one distinct device op.
RealOp = tuple[str, str, str, str | None, str]


@pytest.fixture(scope="module")
def real_ops(tmp_path_factory: pytest.TempPathFactory) -> list[RealOp]:
    """(format, kind, name, hlo_category, category) of every distinct device op of the real traces."""
    files = real_files()
    if not files:
        pytest.skip("../shared/real_traces is not present")
    wh = Warehouse(tmp_path_factory.mktemp("classify") / "wh")
    report = wh.ingest(files, job="real")
    assert report.ok, [r.error for r in report.failed]
    rows = wh.query("SELECT DISTINCT t.format, d.kind, d.name, d.hlo_category, d.category "
                    "FROM device_ops d JOIN traces t USING (trace_id)").rows
    return [tuple(row) for row in rows]  # type: ignore[misc]


@pytest.mark.slow  # ingests the real traces of ../shared/real_traces
def test_every_real_op_classifies_the_same_in_sql_and_python(real_ops: list[RealOp]) -> None:
    """The stored category (SQL for Kineto, Python for XLA) is what both paths give every real device-op name."""
    formats = {row[0] for row in real_ops}
    assert {"pytorch_profiler", "xla"} <= formats, formats
    evidence = [(kind, name, hlo) for _, kind, name, hlo, _ in real_ops]
    python = [classify(*row) for row in evidence]
    assert python == [row[4] for row in real_ops]
    assert sql_categories(evidence) == python


@pytest.mark.slow  # ingests the real traces of ../shared/real_traces
def test_real_ops_land_where_their_family_says(real_ops: list[RealOp]) -> None:
    claimed: dict[str, int] = {}
    for _, kind, name, hlo, category in real_ops:
        family = expected_family(kind, name, hlo)
        if family is not None:
            assert category == family, (kind, name, hlo)
            claimed[family] = claimed.get(family, 0) + 1
    assert set(claimed) == set(CATEGORIES), claimed  # every family is seen in the real traces
    names = {(kind, name) for _, kind, name, _, _ in real_ops}
    if REAL_MTIA.is_dir():
        assert ("memcpy", "dma_request") in names and ("kernel", "fc-dtype_Float") in names
    assert any(hlo and hlo.startswith("copy-start") for _, _, _, hlo, _ in real_ops)
