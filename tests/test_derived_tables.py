"""Analyses stored at ingest equal the same analyses computed at query time."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from oracles.derived import write_derived_sql
from oracles.idle import idle_breakdown
from oracles.launches import launch_stats, queue_lengths
from tracelake.warehouse import Warehouse


def _rows(frame: pl.DataFrame, columns: list[str]) -> list[tuple[object, ...]]:
    return sorted(frame.select(columns).rows())


def test_stored_idle_and_launches_match_query_time(sample_warehouse: Warehouse) -> None:
    con = sample_warehouse.connect()
    stored_idle = con.sql("SELECT * EXCLUDE (job) FROM stream_idle").pl()
    live_idle = idle_breakdown(con)
    columns = ["trace_id", "rank", "stream", "gaps", "idle_ns", "host_wait_ns", "kernel_wait_ns", "other_ns"]
    assert stored_idle.height == live_idle.height > 0
    assert _rows(stored_idle, columns) == _rows(live_idle, columns)
    stored = con.sql("SELECT * EXCLUDE (job) FROM launch_stats").pl()
    live = launch_stats(con)
    columns = ["trace_id", "rank", "launches", "shorter_than_launch", "max_delay_ns"]
    assert _rows(stored, columns) == _rows(live, columns)
    stored = con.sql("SELECT * EXCLUDE (job) FROM stream_queues").pl()
    live = queue_lengths(con, where="d.trace_id IS NOT NULL")
    columns = ["trace_id", "rank", "stream", "launches", "max_queue"]
    assert stored.height == live.height > 0
    assert _rows(stored, columns) == _rows(live, columns)


def test_kernel_stats_add_up_to_device_time(sample_warehouse: Warehouse) -> None:
    stored = dict(sample_warehouse.query(
        "SELECT trace_id, sum(total_ns) FROM kernel_stats GROUP BY 1").rows)
    direct = dict(sample_warehouse.query(
        "SELECT trace_id, sum(dur_ns) FROM device_ops WHERE category <> 'sync' GROUP BY 1").rows)
    assert stored == direct and len(stored) == 5
    counts = sample_warehouse.query(
        "SELECT count(*) FROM kernel_stats WHERE mean_ns > max_ns OR p50_ns > max_ns").rows[0][0]
    assert counts == 0


#: The derived tables compared with their SQL oracles.
_COMPARED = ("breakdown", "kernel_stats", "stream_idle", "launch_stats", "stream_queues", "op_stats")

#: Derived tables that are empty where no host call launched the device ops (TPU profiles, NCCL records).
_LAUNCHED = ("launch_stats", "stream_queues")


def _parsed_inputs(wh: Warehouse, job: str, folder: Path) -> Path:
    """A folder of links to the parsed tables of ``job``'s first trace, as :func:`derived.write_derived` reads."""
    from tracelake.warehouse import derived

    store = wh.store
    trace_id = store.job_traces(job)[0]
    folder.mkdir()
    for name in derived.INPUTS:
        (folder / f"{name}.parquet").symlink_to(store.path(name, job, trace_id))
    return folder


def _derive(parsed: Path, out: Path, *, sql: bool) -> dict[str, pl.DataFrame]:
    """The derived tables as ingest writes them, or (``sql``) as the SQL oracle computes them."""
    from tracelake.warehouse import derived

    out.mkdir()
    (write_derived_sql if sql else derived.write_derived)(parsed, out)
    return {name: pl.read_parquet(out / f"{name}.parquet") for name in _COMPARED}


def _assert_same(expected: dict[str, pl.DataFrame], got: dict[str, pl.DataFrame], *, launched: bool = True) -> None:
    for name, frame in expected.items():
        keys = [c for c in ("trace_id", "rank", "step", "name", "stream", "op", "input_shapes", "dtype", "module")
                if c in frame.columns]
        other = got[name]
        assert frame.height == other.height, name
        assert frame.height > 0 or (name in _LAUNCHED and not launched), name
        assert_frame_equal(frame.sort(keys, nulls_last=False), other.sort(keys, nulls_last=False), check_exact=True)


def _xplane_warehouse(folder: Path, xplane: bytes, job: str) -> Warehouse:
    trace = folder / "host0.xplane.pb"
    trace.write_bytes(xplane)
    wh = Warehouse(folder / "warehouse")
    report = wh.ingest([trace], job=job)
    assert report.ok, [r.error for r in report.failed]
    return wh


@pytest.fixture(scope="module")
def xla_warehouse(tmp_path_factory: pytest.TempPathFactory) -> Warehouse:
    """A generated TPU profile (4 chips, steps, async collective windows, FLOPs) ingested as job ``xla``."""
    from tracelake.sample_traces import generate_xla

    return _xplane_warehouse(tmp_path_factory.mktemp("xla"), generate_xla.build(5, 60), "xla")


@pytest.fixture(scope="module")
def xla_gpu_warehouse(tmp_path_factory: pytest.TempPathFactory) -> Warehouse:
    """A generated JAX-on-GPU profile (kernels on streams, each launched by a host call) ingested as ``xla_gpu``."""
    from tracelake.sample_traces import generate_xla

    return _xplane_warehouse(tmp_path_factory.mktemp("xla_gpu"), generate_xla.build_gpu(4, 40), "xla_gpu")


@pytest.mark.parametrize("job", ["ddp_straggler", "launch_bound"])
def test_sql_and_vectorised_derived_tables_are_equal(sample_warehouse: Warehouse, tmp_path: Path, job: str) -> None:
    """Ingest stores the derived tables from numpy/polars; their SQL oracle gives the same rows."""
    parsed = _parsed_inputs(sample_warehouse, job, tmp_path / "parsed")
    sql = _derive(parsed, tmp_path / "sql", sql=True)
    _assert_same(sql, _derive(parsed, tmp_path / "vectorised", sql=False))


def _rewrite(parsed: Path, folder: Path, layout: str) -> Path:
    """``parsed`` with ``device_ops`` rewritten in row groups of 50 rows, in the order ``layout`` names."""
    import shutil

    import pyarrow.parquet as pq

    folder.mkdir()
    for table in parsed.iterdir():
        shutil.copy(table, folder / table.name)
    ops = pl.read_parquet(parsed / "device_ops.parquet")
    if layout == "time order, ranks mixed, row groups backwards":
        ops = ops.sort("ts_ns")
        ops = pl.concat([ops[i:i + 50] for i in range(0, ops.height, 50)][::-1])
    elif layout == "shuffled":
        ops = ops.sample(fraction=1.0, shuffle=True, seed=7)
    (folder / "device_ops.parquet").unlink()
    pq.write_table(ops.to_arrow(), folder / "device_ops.parquet", row_group_size=50)
    return folder


@pytest.mark.parametrize("layout", [  # the reordered layouts: the same sweep again, for the full run
    "as parsed",
    pytest.param("time order, ranks mixed, row groups backwards", marks=pytest.mark.slow),
    pytest.param("shuffled", marks=pytest.mark.slow),
])
@pytest.mark.parametrize("job", ["ddp_straggler", "launch_bound", "xla", "xla_gpu"])
def test_derived_tables_in_tiny_windows_equal_sql(sample_warehouse: Warehouse, xla_warehouse: Warehouse,
                                                  xla_gpu_warehouse: Warehouse, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch, job: str, layout: str) -> None:
    """Cut into windows of a few ops, whatever the row order, the windowed analyses still equal SQL exactly."""
    from tracelake.warehouse import derived

    wh = {"xla": xla_warehouse, "xla_gpu": xla_gpu_warehouse}.get(job, sample_warehouse)
    parsed = _rewrite(_parsed_inputs(wh, job, tmp_path / "parsed"), tmp_path / "rewritten", layout)
    sql = _derive(parsed, tmp_path / "sql", sql=True)
    monkeypatch.setattr(derived, "CHUNK_ROWS", 7)
    _assert_same(sql, _derive(parsed, tmp_path / "windows", sql=False), launched=job != "xla")


_SAMPLE_FILES = sorted(
    p for p in (Path(__file__).resolve().parents[1] / "sample_traces").rglob("*")
    if p.is_file() and p.suffix not in (".py", ".md") and p.parent.name != "__pycache__"
    and p.name != "manifest.json"  # what capture_gpu.py ran with: not a trace
)


@pytest.mark.parametrize("sample", _SAMPLE_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_sample_format_gets_the_same_derived_tables_both_ways(sample: Path, tmp_path: Path) -> None:
    """Every format, those without device ops (NCCL records) included: windowed rows equal the SQL oracle."""
    from tracelake import ingest

    parsed = tmp_path / "parsed"
    parsed.mkdir()
    ingest.parse_into(sample, parsed, ingest.ParseOptions(source_name=sample.name, trace_id="0" * 20))
    sql = _derive(parsed, tmp_path / "sql", sql=True)
    windowed = _derive(parsed, tmp_path / "windowed", sql=False)
    for name, frame in sql.items():
        keys = [c for c in ("trace_id", "rank", "step", "name", "stream", "op", "input_shapes", "dtype", "module")
                if c in frame.columns]
        assert frame.schema == windowed[name].schema, name
        assert frame.sort(keys, nulls_last=False).equals(windowed[name].sort(keys, nulls_last=False)), name
