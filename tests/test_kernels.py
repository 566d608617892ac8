"""Kernel breakdown on a hand-built table and on the samples."""

from __future__ import annotations

import duckdb
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oracles.kernels import top_kernels
from tracelake.analysis.kernels import COLUMNS, top_from_counts, top_from_ops
from tracelake.warehouse import Warehouse


def _con(rows: list[tuple[int, str, str, int]]) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    frame = pl.DataFrame(rows, schema={"rank": pl.Int32, "name": pl.String, "category": pl.String,
                                       "dur_ns": pl.Int64}, orient="row")
    con.register("device_ops", frame.to_arrow())
    return con


def test_top_and_others_add_up() -> None:
    rows = [(0, "gemm", "compute", 100), (0, "gemm", "compute", 300), (0, "relu", "compute", 50),
            (0, "nccl", "communication", 400), (0, "tiny", "compute", 10), (0, "sync", "sync", 9999),
            (1, "gemm", "compute", 200)]
    ops = pl.DataFrame(rows, schema=["rank", "name", "category", "dur_ns"], orient="row")
    for result in (top_from_ops(ops, top=2), top_kernels(_con(rows), top=2)):
        assert tuple(result.columns) == COLUMNS
        data = {r["name"]: r for r in result.to_dicts()}
        assert list(data) == ["gemm", "nccl", "others"]
        assert data["gemm"]["count"] == 3 and data["gemm"]["total_ns"] == 600 and data["gemm"]["max_ns"] == 300
        assert data["gemm"]["p50_ns"] == 200
        assert data["others"]["count"] == 2 and data["others"]["total_ns"] == 60
        assert abs(sum(r["share_pct"] for r in data.values()) - 100) < 1e-9
        assert "sync" not in data


def test_per_rank_rankings() -> None:
    rows = [(0, "a", "compute", 10), (0, "b", "compute", 20), (1, "a", "compute", 30), (1, "b", "compute", 5)]
    ops = pl.DataFrame(rows, schema=["rank", "name", "category", "dur_ns"], orient="row")
    result = pl.concat([top_from_ops(mine, top=1).with_columns(pl.lit(rank).alias("rank"))
                        for (rank,), mine in ops.partition_by("rank", as_dict=True).items()])
    firsts = {r["rank"]: r["name"] for r in result.to_dicts() if r["name"] != "others"}
    assert firsts == {0: "b", 1: "a"}


def test_samples_top_kernel_is_the_nccl_wait_on_early_ranks(sample_warehouse) -> None:  # type: ignore[no-untyped-def]
    traces = [("ddp_straggler", t) for t in sample_warehouse.store.job_traces("ddp_straggler")]
    ops = sample_warehouse.store.read_frame("device_ops", traces, columns=["rank", "name", "category", "dur_ns"])
    result = pl.concat([top_from_ops(mine, top=3).with_columns(pl.lit(rank).alias("rank"))
                        for (rank,), mine in ops.partition_by("rank", as_dict=True).items()])
    firsts = {r["rank"]: r for r in result.to_dicts() if r["name"] != "others"}
    totals = sample_warehouse.query(
        "SELECT rank, sum(dur_ns) FROM device_ops WHERE job = 'ddp_straggler' AND category <> 'sync' GROUP BY rank"
    ).rows
    for rank, total in totals:
        shares = sum(r["total_ns"] for r in result.to_dicts() if r["rank"] == rank)
        assert shares == total
    assert firsts


def test_top_from_ops_matches_the_sql(sample_warehouse: Warehouse) -> None:
    """The ranking across ranks, from the ops or from their counted durations, gives the SQL's figures exactly."""
    for job in ("ddp_straggler", "launch_bound"):
        traces = [(job, t) for t in sample_warehouse.store.job_traces(job)]
        ops = sample_warehouse.store.read_frame("device_ops", traces, columns=["name", "category", "dur_ns"])
        con = sample_warehouse.connect()
        for top in (1, 3, 8, 1000):
            expected = top_kernels(con, where="job = ?", params=[job], top=top)
            _same(top_from_ops(ops, top=top), expected)
            counts = ops.group_by("name", "category", "dur_ns").agg(pl.len().alias("n"))
            _same(top_from_counts(counts, top=top), expected)


_OP = st.tuples(st.integers(0, 3), st.integers(0, 11), st.integers(1, 9_999))  # (rank, kernel k0..k11, duration)


@settings(max_examples=10)
@given(first=_OP, ops=st.lists(_OP, max_size=3000),
       categories=st.lists(st.sampled_from(["compute", "communication", "sync"]), min_size=11, max_size=11))
def test_top_from_ops_random(first: tuple[int, int, int], ops: list[tuple[int, int, int]],
                             categories: list[str]) -> None:
    # one category per kernel name, as in real traces; k0 computes and runs at least once: something is ranked
    category = ["compute", *categories]
    rows = [(rank, f"k{kernel}", category[kernel], dur) for rank, kernel, dur in [(first[0], 0, first[2]), *ops]]
    ops = pl.DataFrame(rows, schema=["rank", "name", "category", "dur_ns"], orient="row")
    con = _con(rows)
    for top in (2, 5, 20):
        _same(top_from_ops(ops, top=top), top_kernels(con, top=top))


def _same(got: pl.DataFrame, expected: pl.DataFrame) -> None:
    """Equal rankings: every figure exactly, the shares to the last bits of a float."""
    assert got.height == expected.height > 0
    assert got.drop("share_pct").rows() == expected.drop("share_pct").rows()
    assert got["share_pct"].to_list() == pytest.approx(expected["share_pct"].to_list(), rel=1e-12)
