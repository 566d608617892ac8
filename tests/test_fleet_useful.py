"""Useful device-hours (device-hours x MFU) and useful work lost in the fleet (analysis/fleet.py): bounded by busy
and traced hours over generated rows, and checked against SQL over the stored breakdown of the sample jobs."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from tracelake.analysis import fleet
from tracelake.api.cli import app as cli
from tracelake.warehouse import Warehouse

H = 3.6e12  # ns per hour
NOW = dt.datetime(2026, 12, 2, 12, tzinfo=dt.timezone.utc)
_LABELS = pl.List(pl.Struct({"key": pl.String, "value": pl.String}))


@st.composite
def devices(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Whole-trace breakdown rows of a few jobs, teams and days: busy <= span, MFU null, in range or off (> busy)."""
    rows = []
    for i in range(draw(st.integers(0, 12))):
        span = draw(st.integers(0, 10 * int(H)))
        busy = draw(st.integers(0, span))
        rows.append({"trace_id": f"t{i}", "job": draw(st.sampled_from("abc")), "team": draw(st.sampled_from("xy")),
                     "age": draw(st.integers(0, 20)), "span_ns": span, "busy_ns": busy,
                     "mfu_pct": draw(st.none() | st.floats(0, 150))})
    return rows


def _frames(rows: list[dict[str, Any]]) -> tuple[pl.DataFrame, pl.DataFrame]:
    traces = pl.DataFrame([{"trace_id": r["trace_id"], "job": r["job"], "labels": [{"key": "team", "value": r["team"]}],
                            "ingested_at": NOW - dt.timedelta(days=r["age"]), "device_name": "H100"} for r in rows],
                          schema={"trace_id": pl.String, "job": pl.String, "labels": _LABELS,
                                  "ingested_at": pl.Datetime("us", "UTC"), "device_name": pl.String})
    breakdown = pl.DataFrame([{"trace_id": r["trace_id"], "rank": 0, "step": None, "span_ns": r["span_ns"],
                               "busy_ns": r["busy_ns"], "idle_ns": r["span_ns"] - r["busy_ns"], "compute_ns": 0,
                               "communication_ns": 0, "exposed_communication_ns": 0, "flops": None,
                               "flops_utilisation_pct": None, "mfu_pct": r["mfu_pct"]} for r in rows],
                             schema={"trace_id": pl.String, "rank": pl.Int64, "step": pl.Int64, "span_ns": pl.Int64,
                                     "busy_ns": pl.Int64, "idle_ns": pl.Int64, "compute_ns": pl.Int64,
                                     "communication_ns": pl.Int64, "exposed_communication_ns": pl.Int64,
                                     "flops": pl.Float64, "flops_utilisation_pct": pl.Float64, "mfu_pct": pl.Float64})
    return traces, breakdown


def _expected(rows: list[dict[str, Any]]) -> tuple[float | None, float | None]:
    """Useful and lost hours of ``rows`` counted one device at a time (None where no device has an MFU)."""
    known = [r for r in rows if r["mfu_pct"] is not None]
    if not known:
        return None, None
    useful = [min(r["span_ns"] * r["mfu_pct"] / 100, r["busy_ns"]) for r in known]
    return sum(useful) / H, sum(r["span_ns"] for r in known) / H - sum(useful) / H


@given(rows=devices())
def test_useful_is_at_most_busy_at_most_traced_in_every_group(rows: list[dict[str, Any]]) -> None:
    device_rows = fleet.device_rows(*_frames(rows))
    day = {r["trace_id"]: (NOW - dt.timedelta(days=r["age"])).date() for r in rows}
    groups = [(fleet.by_job(device_rows), "job", lambda r: r["job"]),
              (fleet.by_day(device_rows), "day", lambda r: day[r["trace_id"]]),
              (fleet.by_label(device_rows, ["team"]), "label_value", lambda r: r["team"])]
    for frame, key, of in groups:
        assert frame.height == len({of(r) for r in rows})
        for g in frame.to_dicts():
            mine = [r for r in rows if of(r) == g[key]]
            assert g["busy_hours"] <= g["device_hours"] + 1e-9
            useful, lost = _expected(mine)
            if useful is None:
                assert g["useful_hours"] is None and g["useful_lost_hours"] is None and g["useful_pct"] is None
                continue
            assert 0 <= g["useful_hours"] <= g["busy_hours"] + 1e-9
            assert g["useful_hours"] == pytest.approx(useful, abs=1e-9)
            assert g["useful_lost_hours"] == pytest.approx(lost, abs=1e-9)
            if any(r["span_ns"] for r in mine if r["mfu_pct"] is not None):
                assert 0 <= g["useful_pct"] <= 100 + 1e-9
            else:  # devices with an MFU but no time: no share to give
                assert g["useful_pct"] is None and g["useful_hours"] == 0
    total = fleet.summarise(device_rows).row(0, named=True)
    assert total["useful_hours"] == pytest.approx(_expected(rows)[0], abs=1e-9) if rows else True
    ranked = fleet.lost_ranking(fleet.by_job(device_rows))
    order = ranked["useful_lost_hours"].to_list()
    known = [x for x in order if x is not None]
    assert known == sorted(known, reverse=True) and order[:len(known)] == known  # jobs without an MFU last


def test_week_over_week_keeps_unknown_useful_hours_null_and_absent_weeks_zero() -> None:
    rows = [{"trace_id": "t0", "job": "a", "team": "x", "age": 1, "span_ns": int(H), "busy_ns": int(H), "mfu_pct": 40.0},
            {"trace_id": "t1", "job": "a", "team": "x", "age": 9, "span_ns": int(H), "busy_ns": int(H), "mfu_pct": 20.0},
            {"trace_id": "t2", "job": "b", "team": "y", "age": 2, "span_ns": int(H), "busy_ns": int(H), "mfu_pct": None}]
    per_job = {r["job"]: r for r in fleet.week_over_week(fleet.device_rows(*_frames(rows)), NOW, by=["job"]).to_dicts()}
    assert per_job["a"]["useful_hours"] == pytest.approx(0.4) and per_job["a"]["previous_useful_hours"] == pytest.approx(0.2)
    assert per_job["a"]["useful_lost_hours_change_pct"] == pytest.approx(100 * (0.6 - 0.8) / 0.8)
    assert per_job["b"]["useful_hours"] is None  # traced this week, without an MFU
    assert per_job["b"]["previous_useful_hours"] == 0  # not traced the week before


#: Useful and lost hours per group straight from the stored rows, by DuckDB (whose least/greatest skip nulls).
_USEFUL_SQL = """
    SELECT {group} AS key, sum(span_ns) AS span, sum(busy_ns) AS busy,
           sum(CASE WHEN mfu_pct IS NOT NULL THEN least(greatest(span_ns * mfu_pct / 100, 0), busy_ns) END) AS useful,
           sum(span_ns) FILTER (WHERE mfu_pct IS NOT NULL) AS known_span
    FROM breakdown b JOIN traces t USING (trace_id) WHERE b.step IS NULL GROUP BY ALL
"""


@pytest.mark.parametrize(("group", "frame", "key"), [
    ("t.job", "by_job", "job"), ("CAST(t.ingested_at AS DATE)", "by_day", "day"),
    ("t.labels['team']", "by_label", "label_value"),
])
def test_useful_hours_match_sql_over_the_sample_warehouse(fleet_warehouse: Warehouse, group: str, frame: str,
                                                          key: str) -> None:
    result = fleet_warehouse.fleet()
    rows = getattr(result, frame)
    if frame == "by_label":
        rows = rows.filter(pl.col("label_key") == "team")
    got = {r[key]: r for r in rows.to_dicts()}
    query = fleet_warehouse.query(_USEFUL_SQL.format(group=group))
    expected = [dict(zip(query.columns, row)) for row in query.rows]
    assert len(got) == len(expected)
    for want in expected:
        row = got[want["key"]]
        assert row["busy_hours"] == pytest.approx(want["busy"] / H)
        if want["useful"] is None:
            assert row["useful_hours"] is None and row["useful_lost_hours"] is None
            continue
        assert row["useful_hours"] == pytest.approx(want["useful"] / H)
        assert row["useful_lost_hours"] == pytest.approx((want["known_span"] - want["useful"]) / H)
        assert row["useful_hours"] <= row["busy_hours"] <= row["device_hours"]
    if frame == "by_job":
        assert got["launch"]["useful_hours"] is None  # launch-bound sample: no model FLOPs, no MFU
        assert got["ddp"]["useful_hours"] > 0 and got["tpu"]["useful_hours"] > 0
        assert result.lost_work["job"].to_list()[-1] == "launch"


def test_the_report_shows_useful_work(fleet_warehouse_home: Path, tmp_path: Path) -> None:
    out = tmp_path / "fleet.html"
    answer = CliRunner().invoke(cli, ["report", "fleet", "--no-job-reports", "--out", str(out),
                                      "--home", str(fleet_warehouse_home)])
    assert answer.exit_code == 0, answer.output
    text = out.read_text()
    section = text[text.index('id="useful-work"'):]
    section = section[:section.index("</section>")]
    assert "no MFU (no shapes / no peak)" in section and "useful work lost" in section and "By team" in section
    assert section.index(">ddp<") < section.index(">launch<")  # most work lost first, no MFU last
    assert 'id="goodput"' in text and "No job lifecycle file in this window" in text
