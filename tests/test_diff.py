"""Trace and job diff: kernel by kernel and category by category."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from oracles.diff import kernel_totals
from tracelake.api.cli import app
from tracelake.warehouse import NotFound, Warehouse


def test_job_against_itself_changes_nothing(sample_warehouse: Warehouse) -> None:
    kernels, categories = sample_warehouse.diff("ddp_straggler", "ddp_straggler")
    assert set(kernels["change"].to_list()) == {"same"}
    assert (kernels["delta_ns"] == 0).all() and (categories["delta_ns"] == 0).all()


def test_rank_against_straggler(sample_warehouse: Warehouse) -> None:
    ranks = {t["rank"]: t["trace_id"] for t in sample_warehouse.traces(job="ddp_straggler")}
    kernels, categories = sample_warehouse.diff(ranks[0], ranks[2])
    comm = categories.filter(pl.col("metric") == "communication_ns").row(0, named=True)
    compute = categories.filter(pl.col("metric") == "compute_ns").row(0, named=True)
    # The straggler computes ~25% longer and waits far less inside its collectives.
    assert compute["ratio"] == pytest.approx(1.25, abs=0.1)
    assert comm["delta_ns"] < 0
    assert kernels.row(0, named=True)["change"] in ("slower", "faster")
    deltas = kernels["delta_ns"].abs().to_list()
    assert deltas == sorted(deltas, reverse=True)


@pytest.mark.parametrize(("a", "b"), [("ddp_straggler", "launch_bound"), ("ddp_straggler", "ddp_straggler")])
def test_kernel_times_equal_the_sql_over_the_device_ops(sample_warehouse: Warehouse, a: str, b: str) -> None:
    """The per-rank kernel times, from the stored kernel_stats, equal the SQL oracle's over the device ops."""
    kernels, _ = sample_warehouse.diff(a, b)
    con = sample_warehouse.connect()
    expected = {side: {name: ns for name, _, ns in kernel_totals(con, "job = ?", [job]).iter_rows()}
                for side, job in (("a_ns", a), ("b_ns", b))}
    assert kernels.height == len(expected["a_ns"].keys() | expected["b_ns"].keys()) > 0
    for row in kernels.iter_rows(named=True):
        for side in ("a_ns", "b_ns"):
            assert row[side] == pytest.approx(expected[side].get(row["name"], 0.0), rel=1e-12), (row["name"], side)


def test_appeared_and_vanished(sample_warehouse: Warehouse) -> None:
    kernels, _ = sample_warehouse.diff("ddp_straggler", "launch_bound")
    changes = set(kernels["change"].to_list())
    assert {"vanished", "appeared"} <= changes
    vanished = kernels.filter(pl.col("change") == "vanished")
    assert (vanished["b_ns"] == 0).all() and vanished["ratio"].to_list()[0] == 0


def test_unknown_side(sample_warehouse: Warehouse) -> None:
    with pytest.raises(NotFound, match="neither a trace id nor a job"):
        sample_warehouse.diff("ddp_straggler", "nope")


def test_cli(sample_warehouse_home: Path, tmp_path: Path) -> None:
    home = tmp_path / "copy"
    shutil.copytree(sample_warehouse_home, home)
    result = CliRunner().invoke(app, ["diff", "ddp_straggler", "launch_bound", "--json", "--home", str(home)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert {r["metric"] for r in data["categories"]} >= {"compute_ns", "idle_ns"} and data["kernels"]
    result = CliRunner().invoke(app, ["diff", "ddp_straggler", "nope", "--home", str(home)])
    assert result.exit_code == 1 and "neither a trace id nor a job" in result.output
