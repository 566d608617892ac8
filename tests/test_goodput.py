"""Goodput (analysis/goodput.py): by hand, and against a second-by-second count over generated lifecycles."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tracelake.analysis import goodput

S = 1_000_000_000  # ns per second


def _rows(submitted: int, started: int, first: int, ended: int, checkpoints: Sequence[tuple[int, int]] = (),
          restarts: Sequence[tuple[int, int, int | None]] = (), productive: int | None = None,
          job: str = "j", trace_id: str = "t") -> list[dict[str, Any]]:
    """``job_lifecycle`` rows of one file, times in seconds (converted to ns)."""
    base = {"job": job, "trace_id": trace_id, "seq": 0, "at_ns": None, "dur_ns": None, "lost_since_ns": None,
            "resumed_ns": None, "steps": None, "productive_ns": None}
    rows = [{**base, "event": e, "at_ns": t * S} for e, t in
            (("submitted", submitted), ("started", started), ("first_step", first))]
    rows += [{**base, "event": "checkpoint", "seq": i, "at_ns": at * S, "dur_ns": dur * S}
             for i, (at, dur) in enumerate(checkpoints)]
    rows += [{**base, "event": "restart", "seq": i, "at_ns": at * S, "lost_since_ns": lost * S,
              "resumed_ns": None if resumed is None else resumed * S} for i, (at, lost, resumed) in enumerate(restarts)]
    rows.append({**base, "event": "ended", "at_ns": ended * S, "steps": 10,
                 "productive_ns": None if productive is None else productive * S})
    return rows


def _frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema={"job": pl.String, "trace_id": pl.String, "event": pl.String, "seq": pl.Int32,
                                      "at_ns": pl.Int64, "dur_ns": pl.Int64, "lost_since_ns": pl.Int64,
                                      "resumed_ns": pl.Int64, "steps": pl.Int64, "productive_ns": pl.Int64})


def test_a_lifecycle_by_hand() -> None:
    # 100 s wall: 10 queued, 5 startup, a checkpoint of 3 s, a failure at 60 that lost 50..60 and came back at 70
    rows = _rows(0, 10, 15, 100, checkpoints=[(40, 3)], restarts=[(60, 50, 70)])
    result = goodput.per_job(_frame(rows), pl.DataFrame({"job": ["j"], "mfu_pct": [40.0]})).row(0, named=True)
    assert (result["wall_ns"], result["available_ns"]) == (100 * S, 90 * S)
    assert [result[f"{b}_ns"] for b in goodput.TIME_BADPUT] == [10 * S, 5 * S, 10 * S, 10 * S, 3 * S, 0]
    assert result["productive_ns"] == 62 * S
    assert result["scheduling_goodput"] == pytest.approx(0.9)
    assert result["runtime_goodput"] == pytest.approx(62 / 90)
    assert result["program_goodput"] == pytest.approx(0.4)
    assert result["goodput"] == pytest.approx(0.62 * 0.4)
    assert result["goodput_ns"] == round(62 * S * 0.4) and result["program_badput_ns"] == 62 * S - result["goodput_ns"]
    assert (result["dominant_badput"], result["dominant_badput_ns"]) == ("program_badput", 62 * S - result["goodput_ns"])
    assert (result["checkpoints"], result["restarts"], result["steps"]) == (1, 1, 10)


def test_without_mfu_program_goodput_is_null_and_time_buckets_still_add_up() -> None:
    rows = _rows(0, 0, 20, 100, restarts=[(90, 30, None)], productive=40)
    result = goodput.per_job(_frame(rows)).row(0, named=True)
    assert result["program_goodput"] is None and result["goodput"] is None and result["goodput_ns"] is None
    assert result["restart_lost_ns"] == 60 * S and result["restart_recovery_ns"] == 0
    assert result["productive_ns"] == 20 * S and result["other_ns"] == 0  # 20 s left, fewer than the 40 claimed
    assert result["dominant_badput"] == "restart_lost"
    assert goodput.dominant_text(result) == "restarts lost 0.0 h (60%)"
    assert sum(result[f"{b}_ns"] for b in goodput.TIME_BADPUT) + result["productive_ns"] == result["wall_ns"]


def test_measured_step_time_leaves_the_rest_as_other() -> None:
    result = goodput.per_job(_frame(_rows(0, 0, 0, 100, productive=70))).row(0, named=True)
    assert (result["productive_ns"], result["other_ns"], result["runtime_goodput"]) == (70 * S, 30 * S, 0.7)
    assert goodput.dominant_text({**result, "dominant_badput_ns": 3 * 3600 * S + 360 * S, "wall_ns": 31 * 3600 * S}) \
        == "time outside training steps 3.1 h (10%)"


def test_the_latest_lifecycle_of_a_job_is_used() -> None:
    old = _rows(0, 50, 60, 100, trace_id="a")
    new = _rows(0, 10, 20, 100, trace_id="b")
    frame = _frame(old + new).with_columns(
        pl.when(pl.col("trace_id") == "a").then(pl.lit(2)).otherwise(pl.lit(1)).cast(pl.Int64).alias("ingested_at"))
    assert goodput.per_job(frame)["trace_id"].to_list() == ["a"]  # ingested later, though "b" sorts after it
    assert goodput.per_job(_frame(old + new))["trace_id"].to_list() == ["b"]


def test_no_lifecycle_gives_no_rows() -> None:
    empty = goodput.per_job(pl.DataFrame())
    assert empty.is_empty() and tuple(empty.columns) == goodput.COLUMNS


# -- properties -----------------------------------------------------------------------------------
def _by_second(rows: list[dict[str, Any]]) -> dict[str, int]:
    """The oracle: every second of the wall time classified on its own, by the precedence of docs/analyses.md."""
    at = {r["event"]: r["at_ns"] // S for r in rows if r["event"] in ("submitted", "started", "first_step", "ended")}
    counts = dict.fromkeys((*goodput.TIME_BADPUT, "productive"), 0)
    spare = 0
    for second in range(at["submitted"], at["ended"]):
        def inside(lo: int | None, hi: int | None) -> bool:
            return lo is not None and hi is not None and lo <= second < hi
        if inside(at["submitted"], at["started"]):
            counts["queued"] += 1
        elif inside(at["started"], at["first_step"]):
            counts["startup"] += 1
        elif any(inside(r["at_ns"] // S, (r["resumed_ns"] or r["at_ns"]) // S) for r in rows if r["event"] == "restart"):
            counts["restart_recovery"] += 1
        elif any(inside(r["lost_since_ns"] // S, r["at_ns"] // S) for r in rows if r["event"] == "restart"):
            counts["restart_lost"] += 1
        elif any(inside(r["at_ns"] // S, (r["at_ns"] + r["dur_ns"]) // S) for r in rows if r["event"] == "checkpoint"):
            counts["checkpoint"] += 1
        else:
            spare += 1
    measured = rows[-1]["productive_ns"]
    counts["productive"] = spare if measured is None else min(measured // S, spare)
    counts["other"] = spare - counts["productive"]
    return counts


@st.composite
def lifecycles(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Lifecycles on a whole-second grid, valid as the parser requires (times in order, events inside)."""
    submitted = draw(st.integers(0, 50))
    started = submitted + draw(st.integers(0, 30))
    first = started + draw(st.integers(0, 30))
    ended = max(first, started + 1) + draw(st.integers(0, 200))
    checkpoints = []
    for _ in range(draw(st.integers(0, 4))):
        at = draw(st.integers(first, ended))
        checkpoints.append((at, draw(st.integers(0, ended - at))))
    restarts = []
    for _ in range(draw(st.integers(0, 3))):
        lost = draw(st.integers(first, ended))
        at = draw(st.integers(lost, ended))
        restarts.append((at, lost, draw(st.none() | st.integers(at, ended))))
    productive = draw(st.none() | st.integers(0, ended - first))
    return _rows(submitted, started, first, ended, checkpoints, restarts, productive)


@given(rows=lifecycles(), mfu=st.none() | st.floats(0, 130))
def test_buckets_add_up_to_the_wall_time_and_match_a_count_by_second(rows: list[dict[str, Any]],
                                                                      mfu: float | None) -> None:
    result = goodput.per_job(_frame(rows), pl.DataFrame({"job": ["j"], "mfu_pct": [mfu]},
                                                         schema={"job": pl.String, "mfu_pct": pl.Float64}))
    r = result.row(0, named=True)
    oracle = _by_second(rows)
    for bucket, seconds in oracle.items():
        assert r[f"{bucket}_ns"] == seconds * S, bucket
    buckets = sum(r[f"{b}_ns"] for b in goodput.TIME_BADPUT)
    assert buckets + r["productive_ns"] == r["wall_ns"]  # exactly, in ns
    assert r["available_ns"] == r["wall_ns"] - r["queued_ns"]
    for factor in ("scheduling_goodput", "runtime_goodput", "program_goodput", "goodput"):
        assert r[factor] is None or 0 <= r[factor] <= 1, factor
    if mfu is None:
        assert r["goodput"] is None and r["program_badput_ns"] is None
    else:
        assert buckets + r["program_badput_ns"] + r["goodput_ns"] == r["wall_ns"]
        assert r["program_badput_ns"] >= 0 and r["goodput_ns"] >= 0
        assert r["goodput"] == pytest.approx(r["goodput_ns"] / r["wall_ns"], abs=1e-9)
        assert r["goodput"] == pytest.approx(r["scheduling_goodput"] * r["runtime_goodput"] * r["program_goodput"])
    known = {b: r[f"{b}_ns"] for b in goodput.BADPUT if r[f"{b}_ns"] is not None}
    if r["dominant_badput"] is not None:
        assert r["dominant_badput_ns"] == max(known.values()) > 0
    else:
        assert not any(known.values())
