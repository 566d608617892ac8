"""The breakdown on hand-built timelines whose answers are known."""

from __future__ import annotations

import random

import duckdb
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oracles.breakdown import breakdown_sql
from tracelake.analysis.breakdown import COLUMNS, breakdown_frame


def ops(*rows: tuple[str, int, int], step: int | None = None, rank: int = 0) -> pl.DataFrame:
    """Device ops from (category, start, end) triples."""
    return pl.DataFrame(
        {
            "trace_id": ["t"] * len(rows),
            "rank": [rank] * len(rows),
            "step": [step] * len(rows),
            "category": [r[0] for r in rows],
            "ts_ns": [r[1] for r in rows],
            "dur_ns": [r[2] - r[1] for r in rows],
        },
        schema={"trace_id": pl.String, "rank": pl.Int32, "step": pl.Int64, "category": pl.String,
                "ts_ns": pl.Int64, "dur_ns": pl.Int64},
    )


def whole(frame: pl.DataFrame) -> dict:  # type: ignore[type-arg]
    result = breakdown_frame(frame)
    assert tuple(result.columns) == COLUMNS
    rows = result.filter(pl.col("step").is_null()).to_dicts()
    assert len(rows) == 1
    row = rows[0]
    # The exclusive buckets always add up to the span.
    assert (row["compute_only_ns"] + row["communication_only_ns"] + row["memory_only_ns"]
            + row["compute_communication_ns"] + row["other_overlap_ns"] + row["idle_ns"]) == row["span_ns"]
    assert row["busy_ns"] + row["idle_ns"] == row["span_ns"]
    return row


def test_single_op() -> None:
    row = whole(ops(("compute", 10, 30)))
    assert row["span_ns"] == 20 and row["busy_ns"] == 20 and row["idle_ns"] == 0
    assert row["compute_ns"] == 20 and row["communication_ns"] == 0 and row["overlap_pct"] is None


def test_back_to_back_and_gap() -> None:
    row = whole(ops(("compute", 0, 10), ("compute", 10, 20), ("compute", 30, 40)))
    assert row == row | {"span_ns": 40, "busy_ns": 30, "idle_ns": 10, "compute_ns": 30}


def test_nested_and_overlapping_same_category_count_once() -> None:
    row = whole(ops(("compute", 0, 100), ("compute", 10, 20), ("compute", 50, 150)))
    assert row["compute_ns"] == 150 and row["busy_ns"] == 150 and row["idle_ns"] == 0


def test_overlap_and_exposed_communication() -> None:
    # compute on one stream 0-100; communication on another 60-160: 40 overlapped, 60 exposed.
    row = whole(ops(("compute", 0, 100), ("communication", 60, 160)))
    assert row["communication_ns"] == 100
    assert row["overlapped_communication_ns"] == 40
    assert row["exposed_communication_ns"] == 60
    assert row["overlap_pct"] == pytest.approx(40.0)
    assert row["compute_only_ns"] == 60 and row["communication_only_ns"] == 60
    assert row["compute_communication_ns"] == 40


def test_memory_and_three_way_mixes() -> None:
    row = whole(ops(("compute", 0, 100), ("communication", 50, 100), ("memory", 75, 125)))
    assert row["memory_ns"] == 50 and row["memory_only_ns"] == 25
    assert row["compute_communication_ns"] == 25  # 50-75: compute and comm, no memory
    assert row["other_overlap_ns"] == 25  # 75-100: all three
    assert row["overlapped_communication_ns"] == 50


def test_sync_is_never_busy() -> None:
    row = whole(ops(("compute", 0, 10), ("sync", 10, 90), ("compute", 90, 100)))
    assert row["busy_ns"] == 20 and row["idle_ns"] == 80 and row["span_ns"] == 100


def test_zero_duration_ops() -> None:
    row = whole(ops(("compute", 5, 5), ("compute", 10, 20)))
    assert row["span_ns"] == 15 and row["busy_ns"] == 10 and row["idle_ns"] == 5


def test_empty_input() -> None:
    result = breakdown_frame(ops())
    assert result.height == 0


def test_per_step_rows_and_ranks() -> None:
    frame = pl.concat([
        ops(("compute", 0, 10), ("communication", 5, 20), step=1),
        ops(("compute", 100, 130), step=2),
        ops(("compute", 0, 50), step=1, rank=1),
    ])
    result = breakdown_frame(frame)
    per_step = {(r["rank"], r["step"]): r for r in result.to_dicts()}
    assert set(per_step) == {(0, None), (0, 1), (0, 2), (1, None), (1, 1)}
    assert per_step[(0, 1)]["span_ns"] == 20 and per_step[(0, 1)]["exposed_communication_ns"] == 10
    assert per_step[(0, 2)]["span_ns"] == 30 and per_step[(0, 2)]["communication_ns"] == 0
    assert per_step[(0, None)]["span_ns"] == 130 and per_step[(0, None)]["idle_ns"] == 130 - 50
    assert per_step[(1, None)]["compute_ns"] == 50


# -- materialised at ingest, checked against a plain Python union ----------------------

def _union(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[list[int]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def _length(intervals: list[tuple[int, int]]) -> int:
    return sum(b - a for a, b in intervals)


def _intersection(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    total, i, j = 0, 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def test_stored_breakdown_matches_a_python_union(sample_warehouse) -> None:  # type: ignore[no-untyped-def]
    stored = sample_warehouse.breakdown(job="ddp_straggler", steps=True).to_dicts()
    assert len(stored) == 4 * (1 + 6)  # 4 ranks, whole trace + 6 steps
    ops = sample_warehouse.query(
        "SELECT trace_id, step, category, ts_ns, ts_ns + dur_ns FROM device_ops WHERE job = 'ddp_straggler'"
    ).rows
    for row in stored:
        mine = [o for o in ops if o[0] == row["trace_id"] and (row["step"] is None or o[1] == row["step"])]
        by_cat = {c: _union([(o[3], o[4]) for o in mine if o[2] == c]) for c in ("compute", "communication", "memory")}
        busy = _union([(o[3], o[4]) for o in mine if o[2] != "sync"])
        assert row["span_ns"] == max(o[4] for o in mine) - min(o[3] for o in mine)
        assert row["busy_ns"] == _length(busy)
        assert row["compute_ns"] == _length(by_cat["compute"])
        assert row["communication_ns"] == _length(by_cat["communication"])
        assert row["overlapped_communication_ns"] == _intersection(by_cat["compute"], by_cat["communication"])


def test_straggler_shows_least_exposed_communication(sample_warehouse) -> None:  # type: ignore[no-untyped-def]
    whole = sample_warehouse.breakdown(job="ddp_straggler").to_dicts()
    by_rank = {r["rank"]: r for r in whole}
    # Rank 2 arrives last, so it waits least inside its collectives (see sample_traces/README.md).
    assert min(by_rank, key=lambda r: by_rank[r]["communication_ns"]) == 2


def test_analyze_cli_prints_breakdown_and_findings(sample_warehouse_home, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json
    import shutil

    from typer.testing import CliRunner

    from tracelake.api.cli import app

    home = tmp_path / "copy"
    shutil.copytree(sample_warehouse_home, home)
    runner = CliRunner()
    result = runner.invoke(app, ["analyze", "--job", "ddp_straggler", "--home", str(home)])
    assert result.exit_code == 0, result.output
    assert "rank 2 arrives last" in result.output and "exposed" in result.output
    result = runner.invoke(app, ["analyze", "--job", "ddp_straggler", "--json", "--home", str(home)])
    data = json.loads(result.output)
    assert {f["kind"] for f in data["findings"]} >= {"straggler", "exposed_communication"}
    gains = [f["gain_ns"] for f in data["findings"]]
    assert gains == sorted(gains, reverse=True)
    # Recompute rewrites the stored results without changing them.
    before = runner.invoke(app, ["sql", "select * from breakdown order by all", "-f", "csv", "--home", str(home)]).output
    result = runner.invoke(app, ["analyze", "--recompute", "--home", str(home)])
    assert result.exit_code == 0 and "recomputed the analyses of 5 traces" in result.output
    after = runner.invoke(app, ["sql", "select * from breakdown order by all", "-f", "csv", "--home", str(home)]).output
    assert before == after and before.count("\n") > 20
    result = runner.invoke(app, ["analyze", "nope", "--home", str(home)])
    assert result.exit_code == 1 and "no trace with id" in result.output


def test_vectorised_breakdown_equals_the_sql(sample_warehouse) -> None:  # type: ignore[no-untyped-def]
    """breakdown_frame (numpy, what ingest stores) and breakdown_sql (the oracle) give the same rows."""
    con = sample_warehouse.connect()
    ops = con.sql("SELECT trace_id, rank, step, category, ts_ns, dur_ns, flops FROM device_ops").pl()
    assert breakdown_frame(ops).equals(con.sql(breakdown_sql("device_ops")).pl())


@settings(max_examples=30, suppress_health_check=[HealthCheck.too_slow])
@given(rng=st.randoms())
def test_vectorised_breakdown_equals_the_sql_on_random_timelines(rng: random.Random) -> None:
    """The same on random timelines: overlaps, nesting, zero lengths, steps, async windows."""
    n = rng.randint(1, 40)
    starts = [rng.randint(0, 200) for _ in range(n)]
    frame = pl.DataFrame({
        "trace_id": ["t"] * n, "rank": [rng.randint(0, 1) for _ in range(n)],
        "step": [rng.choice([None, 1, 2]) for _ in range(n)],
        "category": [rng.choice(["compute", "communication", "memory", "sync"]) for _ in range(n)],
        "ts_ns": starts, "dur_ns": [rng.choice([0, rng.randint(1, 80)]) for _ in range(n)],
        "flops": [rng.choice([None, 10.0]) for _ in range(n)],
    }, schema={"trace_id": pl.String, "rank": pl.Int32, "step": pl.Int64, "category": pl.String,
               "ts_ns": pl.Int64, "dur_ns": pl.Int64, "flops": pl.Float64})
    windows = pl.DataFrame({"trace_id": ["t"] * 3, "rank": [0, 1, 0], "step": [1, None, 2],
                            "ts_ns": [rng.randint(0, 200) for _ in range(3)], "dur_ns": [30, 50, 10]},
                           schema={"trace_id": pl.String, "rank": pl.Int32, "step": pl.Int64,
                                   "ts_ns": pl.Int64, "dur_ns": pl.Int64})
    duck = duckdb.connect()
    duck.register("o", frame.to_arrow())
    duck.register("w", windows.to_arrow())
    expected = duck.sql(breakdown_sql("o", "w")).pl()
    got = breakdown_frame(frame, windows)
    assert got.drop("flops_utilisation_pct").equals(expected.drop("flops_utilisation_pct"))


@settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow])
@given(rng=st.randoms(), ordered=st.booleans(), two_traces=st.booleans(), two_ranks=st.booleans())
def test_vectorised_breakdown_equals_the_sql_for_any_steps(
    rng: random.Random, ordered: bool, two_traces: bool, two_ranks: bool,
) -> None:
    """The vectorised sweep's shortcuts (steps in time order, all ops in steps, sparse or huge step numbers,
    steps interleaved in time, several traces and ranks) give the SQL's rows."""
    n = rng.randint(1, 60)
    step_choices = rng.choice([[1, 2, 3], [5, 40_000, 10**9], [0, 7], [None, 3, 10**12]])
    # ordered: steps follow time (the common case), or are drawn at random
    starts = sorted(rng.randint(0, 300) for _ in range(n)) if ordered else [rng.randint(0, 300) for _ in range(n)]
    steps = [step_choices[min(len(step_choices) - 1, s * len(step_choices) // 301)] for s in starts] \
        if ordered else [rng.choice(step_choices) for _ in range(n)]
    frame = pl.DataFrame({
        "trace_id": [rng.choice(["t", "u"]) if two_traces else "t" for _ in range(n)],
        "rank": [rng.randint(0, 1) if two_ranks else 0 for _ in range(n)],
        "step": steps,
        "category": [rng.choice(["compute", "communication", "memory", "sync", "other"]) for _ in range(n)],
        "ts_ns": starts, "dur_ns": [rng.choice([0, rng.randint(1, 60), -1]) for _ in range(n)],
        "flops": [rng.choice([None, 4.0]) for _ in range(n)],
    }, schema={"trace_id": pl.String, "rank": pl.Int32, "step": pl.Int64, "category": pl.String,
               "ts_ns": pl.Int64, "dur_ns": pl.Int64, "flops": pl.Float64})
    windows = pl.DataFrame({"trace_id": ["t", "t"], "rank": [0, 0], "step": [step_choices[0], step_choices[-1]],
                            "ts_ns": [rng.randint(0, 300) for _ in range(2)], "dur_ns": [25, 70]},
                           schema={"trace_id": pl.String, "rank": pl.Int32, "step": pl.Int64,
                                   "ts_ns": pl.Int64, "dur_ns": pl.Int64})
    duck = duckdb.connect()
    duck.register("o", frame.to_arrow())
    duck.register("w", windows.to_arrow())
    expected = duck.sql(breakdown_sql("o", "w")).pl()
    got = breakdown_frame(frame, windows)
    assert got.drop("flops_utilisation_pct").equals(expected.drop("flops_utilisation_pct"))
