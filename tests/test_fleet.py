"""Fleet figures (analysis/fleet.py, Warehouse.fleet): checked against SQL over the stored breakdown, and by hand."""

from __future__ import annotations

import datetime as dt

import polars as pl
import pytest

from tracelake.analysis import collectives, fleet
from tracelake.warehouse import InvalidArgument, Warehouse
from tracelake.api.user_input import parse_when

H = 3.6e12  # ns per hour
UTC = dt.timezone.utc

#: The same figures computed another way: DuckDB over the catalog views, straight from the stored rows.
_PER_JOB_SQL = """
    SELECT t.job, count(DISTINCT b.trace_id) AS traces, count(*) AS devices,
           sum(b.span_ns) AS span, sum(b.busy_ns) AS busy, sum(b.compute_ns) AS compute,
           sum(b.communication_ns) AS communication, sum(b.exposed_communication_ns) AS exposed,
           sum(b.idle_ns) AS idle
    FROM breakdown b JOIN traces t USING (trace_id)
    WHERE b.step IS NULL
    GROUP BY ALL ORDER BY t.job
"""


def _sql(wh: Warehouse, sql: str) -> list[dict[str, object]]:
    result = wh.query(sql)
    return [dict(zip(result.columns, row)) for row in result.rows]


def test_per_job_figures_match_the_stored_breakdown(fleet_warehouse: Warehouse) -> None:
    result = fleet_warehouse.fleet()
    expected = _sql(fleet_warehouse, _PER_JOB_SQL)
    assert result.by_job["job"].to_list() == [r["job"] for r in expected] == ["ddp", "launch", "tpu"]
    for row, want in zip(result.by_job.to_dicts(), expected):
        assert row["traces"] == want["traces"] and row["devices"] == want["devices"]
        assert row["device_hours"] == pytest.approx(want["span"] / H)
        assert row["busy_hours"] == pytest.approx(want["busy"] / H)
        assert row["compute_hours"] == pytest.approx(want["compute"] / H)
        assert row["communication_hours"] == pytest.approx(want["communication"] / H)
        assert row["exposed_communication_hours"] == pytest.approx(want["exposed"] / H)
        assert row["idle_hours"] == pytest.approx(want["idle"] / H)
        assert row["wasted_hours"] == pytest.approx((want["idle"] + want["exposed"]) / H)
        assert row["utilisation_pct"] == pytest.approx(100 * want["compute"] / want["span"])
        assert row["wasted_pct"] == pytest.approx(100 * (want["idle"] + want["exposed"]) / want["span"])
    total = result.totals.row(0, named=True)
    assert total["device_hours"] == pytest.approx(sum(r["span"] for r in expected) / H)
    assert total["devices"] == sum(r["devices"] for r in expected) == 4 + 1 + 4  # 4 GPUs, 1 GPU, 4 TPU chips
    # NCCL Inspector records have no device timeline: no device-hours, and no row of their own.
    assert "inspector" not in result.by_job["job"].to_list()


def test_ranking_by_wasted_hours(fleet_warehouse: Warehouse) -> None:
    result = fleet_warehouse.fleet(top=2)
    expected = sorted(_sql(fleet_warehouse, _PER_JOB_SQL), key=lambda r: -(r["idle"] + r["exposed"]))  # type: ignore[operator]
    assert result.offenders["job"].to_list() == [r["job"] for r in expected][:2]
    assert result.offenders["wasted_hours"].is_sorted(descending=True)


def test_mfu_and_achieved_flops_where_known(fleet_warehouse: Warehouse) -> None:
    want = _sql(fleet_warehouse, """
        SELECT sum(b.flops) AS flops, sum(b.span_ns) AS span, sum(d.peak_tflops * 1e12 * b.span_ns / 1e9) AS possible
        FROM breakdown b JOIN traces t USING (trace_id) JOIN devices d ON d.trace_id = b.trace_id AND d.rank = b.rank
        WHERE b.step IS NULL AND t.job = 'tpu'
    """)[0]
    jobs = {r["job"]: r for r in fleet_warehouse.fleet().by_job.to_dicts()}
    tpu = jobs["tpu"]
    assert tpu["mfu_pct"] == pytest.approx(100 * want["flops"] / want["possible"])  # type: ignore[operator]
    assert tpu["achieved_tflops"] == pytest.approx(want["flops"] / (want["span"] / 1e9) / 1e12)  # type: ignore[operator]
    assert tpu["flops_coverage_pct"] == pytest.approx(100)
    # the stored per-rank utilisation agrees: MFU is their span-weighted mean here (one peak for every chip)
    stored = _sql(fleet_warehouse, """SELECT sum(flops_utilisation_pct * span_ns) / sum(span_ns) AS mfu
                                      FROM breakdown WHERE step IS NULL AND job = 'tpu'""")
    assert tpu["mfu_pct"] == pytest.approx(stored[0]["mfu"])
    # Kineto samples: FLOPs estimated at ingest from the operators' shapes (docs/analyses.md, "Operators"), against
    # the known device's peak; the same span-weighted mean of the stored per-rank figures
    stored = _sql(fleet_warehouse, """SELECT sum(flops_utilisation_pct * span_ns) / sum(span_ns) AS mfu
                                      FROM breakdown WHERE step IS NULL AND job = 'ddp'""")
    assert 0 < jobs["ddp"]["mfu_pct"] <= 100  # type: ignore[operator]
    assert jobs["ddp"]["mfu_pct"] == pytest.approx(stored[0]["mfu"])
    assert jobs["ddp"]["flops_coverage_pct"] == pytest.approx(100)


def test_figures_per_label(fleet_warehouse: Warehouse) -> None:
    result = fleet_warehouse.fleet()
    by_label = {(r["label_key"], r["label_value"]): r for r in result.by_label.to_dicts()}
    assert {k for k, _ in by_label} == {"cluster", "hardware", "team"}
    for key in ("team", "cluster", "hardware"):
        expected = _sql(fleet_warehouse, f"""
            SELECT labels['{key}'] AS value, sum(b.span_ns) AS span, sum(b.compute_ns) AS compute,
                   sum(b.idle_ns + b.exposed_communication_ns) AS wasted
            FROM breakdown b JOIN traces t USING (trace_id) WHERE b.step IS NULL GROUP BY ALL
        """)
        assert len(expected) == sum(1 for k, _ in by_label if k == key)
        for want in expected:
            row = by_label[(key, want["value"])]
            assert row["device_hours"] == pytest.approx(want["span"] / H)  # type: ignore[operator]
            assert row["utilisation_pct"] == pytest.approx(100 * want["compute"] / want["span"])  # type: ignore[operator]
            assert row["wasted_hours"] == pytest.approx(want["wasted"] / H)  # type: ignore[operator]
    # traces without the key form their own group (null value), so every key's groups add up to the fleet
    total = result.totals["device_hours"][0]
    for key in ("team", "cluster", "hardware"):
        assert sum(r["device_hours"] for (k, _), r in by_label.items() if k == key) == pytest.approx(total)
    assert by_label[("hardware", None)]["traces"] == 5  # the Kineto traces


def test_label_filter_selects_traces_with_every_label(fleet_warehouse: Warehouse) -> None:
    assert fleet_warehouse.fleet(labels={"team": "ml"}).by_job["job"].to_list() == ["launch", "tpu"]
    assert fleet_warehouse.fleet(labels={"team": "ml", "cluster": "b"}).by_job["job"].to_list() == ["launch"]
    assert fleet_warehouse.fleet(labels={"team": "nobody"}).totals["devices"][0] == 0


def test_time_window_and_week_over_week_on_real_ingests(fleet_warehouse: Warehouse) -> None:
    ingested = [r["ingested_at"] for r in fleet_warehouse.traces()]
    first, last = min(ingested), max(ingested)
    everything = fleet_warehouse.fleet().totals["device_hours"][0]
    assert fleet_warehouse.fleet(until=first).totals["devices"][0] == 0
    assert fleet_warehouse.fleet(since=last + dt.timedelta(seconds=1)).totals["devices"][0] == 0
    assert fleet_warehouse.fleet(since=first).totals["device_hours"][0] == pytest.approx(everything)
    # seen from a day later, every trace is this week's; from 8 days later, the week before's
    a_day_later = fleet_warehouse.fleet(now=last + dt.timedelta(days=1)).week_over_week.row(0, named=True)
    assert a_day_later["device_hours"] == pytest.approx(everything)
    assert a_day_later["previous_device_hours"] == 0 and a_day_later["device_hours_change_pct"] is None
    later = fleet_warehouse.fleet(now=last + dt.timedelta(days=8))
    wow = later.week_over_week.row(0, named=True)
    assert wow["device_hours"] == 0 and wow["previous_device_hours"] == pytest.approx(everything)
    assert wow["device_hours_change_pct"] == pytest.approx(-100)
    by_job = {r["job"]: r for r in later.week_over_week_by_job.to_dicts()}
    assert set(by_job) == {"ddp", "launch", "tpu"} and all(r["device_hours"] == 0 for r in by_job.values())
    # a `since` shorter than two weeks does not narrow the comparison
    narrow = fleet_warehouse.fleet(since=first, now=last + dt.timedelta(days=8)).week_over_week.row(0, named=True)
    assert narrow["previous_device_hours"] == pytest.approx(everything)


def _frames(days_ago: dict[str, list[int]], now: dt.datetime) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Hand-made traces and whole-trace breakdown rows: one trace per entry, ingested that many days before ``now``.

    Each trace is one device with a 1 h span: 0.5 h compute, 0.1 h exposed communication and 0.2 h idle.
    """
    traces, rows = [], []
    for job, ages in days_ago.items():
        for i, age in enumerate(ages):
            trace_id = f"{job}-{i}"
            traces.append({"trace_id": trace_id, "job": job, "labels": [{"key": "team", "value": job[0]}],
                           "ingested_at": now - dt.timedelta(days=age), "device_name": "H100"})
            rows.append({"trace_id": trace_id, "rank": 0, "step": None, "span_ns": int(H), "busy_ns": int(0.8 * H),
                         "idle_ns": int(0.2 * H), "compute_ns": int(0.5 * H), "communication_ns": int(0.3 * H),
                         "exposed_communication_ns": int(0.1 * H), "flops": None, "flops_utilisation_pct": None})
    schema = {"labels": pl.List(pl.Struct({"key": pl.String, "value": pl.String})),
              "ingested_at": pl.Datetime("us", "UTC")}
    breakdown_schema = {"step": pl.Int64, "flops": pl.Float64, "flops_utilisation_pct": pl.Float64}
    return (pl.DataFrame(traces, schema_overrides=schema),
            pl.DataFrame(rows, schema_overrides=breakdown_schema))


def test_week_over_week_by_hand() -> None:
    now = dt.datetime(2026, 12, 2, 12, tzinfo=UTC)
    traces, breakdown = _frames({"alpha": [1, 2, 3, 9], "beta": [10, 11], "gamma": [20]}, now)
    rows = fleet.device_rows(traces, breakdown)
    wow = fleet.week_over_week(rows, now).row(0, named=True)
    assert wow["device_hours"] == pytest.approx(3) and wow["previous_device_hours"] == pytest.approx(3)
    assert wow["device_hours_change_pct"] == pytest.approx(0)
    assert wow["utilisation_pct"] == pytest.approx(50) and wow["utilisation_change_points"] == pytest.approx(0)
    per_job = {r["job"]: r for r in fleet.week_over_week(rows, now, by=["job"]).to_dicts()}
    assert set(per_job) == {"alpha", "beta"}  # gamma is older than two weeks
    assert per_job["alpha"]["device_hours"] == pytest.approx(3)
    assert per_job["alpha"]["previous_device_hours"] == pytest.approx(1)
    assert per_job["alpha"]["device_hours_change_pct"] == pytest.approx(200)
    assert per_job["alpha"]["wasted_hours_change_pct"] == pytest.approx(200)
    assert per_job["beta"]["device_hours"] == 0 and per_job["beta"]["device_hours_change_pct"] == pytest.approx(-100)
    assert per_job["beta"]["utilisation_pct"] is None  # no device time this week: no share to compare


def test_trends_per_day_and_week_by_hand() -> None:
    now = dt.datetime(2026, 12, 2, 12, tzinfo=UTC)  # a Wednesday
    traces, breakdown = _frames({"alpha": [0, 0, 1, 7]}, now)
    rows = fleet.device_rows(traces, breakdown)
    days = fleet.by_day(rows)
    assert [d.isoformat() for d in days["day"].to_list()] == ["2026-11-25", "2026-12-01", "2026-12-02"]
    assert days["device_hours"].to_list() == pytest.approx([1, 1, 2])
    weeks = fleet.by_week(rows)
    assert [w.isoformat() for w in weeks["week"].to_list()] == ["2026-11-23", "2026-11-30"]  # Mondays
    assert weeks["device_hours"].to_list() == pytest.approx([1, 3])
    teams = fleet.by_label(rows)
    assert teams.select("label_key", "label_value").rows() == [("team", "a")]
    assert fleet.summarise(rows)["wasted_pct"][0] == pytest.approx(30)


def test_labels_stored_as_a_map_or_as_entries_give_the_same_figures(fleet_warehouse: Warehouse) -> None:
    traces = fleet_warehouse.registry.frame()
    pairs = list(zip(traces["job"], traces["trace_id"]))
    breakdown = fleet_warehouse.store.read_frame("breakdown", pairs)
    as_map = fleet.by_label(fleet.device_rows(traces, breakdown))
    entries = [[{"key": k, "value": v} for k, v in (m or {}).items()] for m in traces["labels"].to_list()]
    relabelled = traces.with_columns(pl.Series("labels", entries,
                                               dtype=pl.List(pl.Struct({"key": pl.String, "value": pl.String}))))
    assert fleet.by_label(fleet.device_rows(relabelled, breakdown)).equals(as_map)


def test_empty_selection_gives_zeros_not_errors() -> None:
    traces, breakdown = _frames({"alpha": [0]}, dt.datetime(2026, 1, 1, tzinfo=UTC))
    rows = fleet.device_rows(traces.head(0), breakdown.head(0))
    total = fleet.summarise(rows).row(0, named=True)
    assert total["devices"] == 0 and total["device_hours"] == 0 and total["utilisation_pct"] is None
    assert fleet.by_job(rows).is_empty() and fleet.by_label(rows).is_empty()
    assert fleet.week_over_week(rows, dt.datetime(2026, 1, 1, tzinfo=UTC)).height == 1


def test_stragglers_and_slowest_collectives_across_jobs(fleet_warehouse: Warehouse) -> None:
    result = fleet_warehouse.fleet()
    worst = result.stragglers.row(0, named=True)
    # the DDP sample's rank 2 arrives last at every collective, 1.3 ms late on average: the worst in the fleet
    assert (worst["job"], worst["rank"], worst["share_last_pct"]) == ("ddp", 2, 100)
    ddp = fleet_warehouse.connect().sql("SELECT * FROM collectives WHERE job = 'ddp'").pl()
    own = collectives.last_arrivals(ddp).row(0, named=True)
    assert worst["times_last"] == own["times_last"] and worst["mean_skew_us"] == own["mean_skew_us"]
    assert worst["waited_ns"] == pytest.approx(own["times_last"] * own["mean_skew_us"] * 1e3, rel=1e-6)
    assert result.stragglers["waited_ns"].is_sorted(descending=True)
    assert set(result.stragglers["job"].to_list()) >= {"ddp", "inspector"}  # NCCL records count too
    slowest = result.slowest_collectives
    assert slowest["transfer_ns"].is_sorted(descending=True)
    every = fleet_warehouse.connect().sql("SELECT * FROM collectives JOIN traces USING (trace_id)").pl()
    longest = max(collectives.instances(every.filter(pl.col("job") == job))["transfer_ns"].max() or 0  # type: ignore[type-var]
                  for job in every["job"].unique().to_list())
    assert slowest["transfer_ns"][0] == longest


def test_instances_and_arrivals_by_job_keep_jobs_apart() -> None:
    frame = pl.DataFrame({
        "job": ["a", "a", "b", "b"], "process_group": ["0"] * 4, "seq": [1, 1, 1, 1],
        "collective": ["allreduce"] * 4, "rank": [0, 1, 0, 1], "ts_ns": [0, 50_000, 1_000_000, 1_000_010],
        "dur_ns": [100, 90, 100, 80], "message_bytes": [1000] * 4,
    })
    assert collectives.instances(frame).height == 1  # one job's view: the same (group, seq)
    per_job = collectives.instances(frame, by=("job",))
    assert per_job.select("job", "skew_ns", "transfer_ns").rows() == [("a", 50_000, 90), ("b", 10, 80)]
    arrivals = collectives.last_arrivals(frame, by=("job",))
    assert arrivals.rows() == [("a", 1, 1, 1, 50.0), ("b", 1, 1, 1, 0.0)]
    assert fleet.stragglers(frame).select("job", "rank").rows() == [("a", 1)]  # b's 10 ns is noise


@pytest.mark.parametrize(("text", "expected"), [
    ("7d", dt.datetime(2026, 11, 25, 12, tzinfo=UTC)),
    ("12h", dt.datetime(2026, 12, 2, 0, tzinfo=UTC)),
    ("30m", dt.datetime(2026, 12, 2, 11, 30, tzinfo=UTC)),
    ("2w", dt.datetime(2026, 11, 18, 12, tzinfo=UTC)),
    ("2026-11-01", dt.datetime(2026, 11, 1, tzinfo=UTC)),
    ("2026-11-01T06:00:00Z", dt.datetime(2026, 11, 1, 6, tzinfo=UTC)),
    ("2026-11-01T06:00:00+02:00", dt.datetime(2026, 11, 1, 4, tzinfo=UTC)),
])
def test_parse_when(text: str, expected: dt.datetime) -> None:
    assert parse_when(text, dt.datetime(2026, 12, 2, 12, tzinfo=UTC)) == expected


@pytest.mark.parametrize("text", ["yesterday", "7 days", "-7d", "", "99999999999w"])
def test_parse_when_refuses_what_it_cannot_read(text: str) -> None:
    with pytest.raises(InvalidArgument, match="invalid time"):
        parse_when(text)


def _raw(wh: Warehouse, **window: dt.datetime) -> object:
    """The fleet computed straight from the selected traces' files (nothing kept between calls)."""
    from tracelake.warehouse import fleet_data

    return fleet_data.read(wh.store, wh.registry.frame(), rows=None, **window)


def test_kept_collective_summaries_give_what_the_rows_give(fleet_warehouse_home, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import shutil

    home = tmp_path / "warehouse"
    shutil.copytree(fleet_warehouse_home, home)
    shutil.rmtree(home / "cache", ignore_errors=True)
    wh = Warehouse(home)
    kept = wh.fleet()
    raw = _raw(wh)
    assert kept.stragglers.height > 1 and kept.slowest_collectives.height > 1
    assert kept.stragglers.equals(raw.stragglers)  # type: ignore[attr-defined]
    assert kept.slowest_collectives.equals(raw.slowest_collectives)  # type: ignore[attr-defined]
    # only summaries are kept on disk, and a fresh process gives the same from them
    snapshot = pl.read_parquet(home / "cache" / "fleet-collectives.parquet")
    assert set(snapshot.columns) == {"job", "trace_ids", "stragglers", "slowest"}
    assert snapshot["job"].n_unique() == snapshot.height
    again = Warehouse(home).fleet()
    assert again.stragglers.equals(kept.stragglers) and again.slowest_collectives.equals(kept.slowest_collectives)


def test_a_window_through_a_job_summarises_only_its_traces_in_the_window(fleet_warehouse_home, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import shutil

    home = tmp_path / "warehouse"
    shutil.copytree(fleet_warehouse_home, home)
    wh = Warehouse(home)
    wh.fleet()  # summaries of whole jobs are kept now
    ddp = wh.registry.frame().filter(pl.col("job") == "ddp").sort("ingested_at")
    assert ddp.height == 4
    # the window starts after the first two ranks of ddp were ingested: a summary of all four would be wrong
    since = ddp["ingested_at"][2]
    kept = wh.fleet(since=since)
    raw = _raw(wh, since=since)
    assert kept.stragglers.equals(raw.stragglers)  # type: ignore[attr-defined]
    assert kept.slowest_collectives.equals(raw.slowest_collectives)  # type: ignore[attr-defined]
    whole = wh.fleet().stragglers.filter(pl.col("job") == "ddp")
    part = kept.stragglers.filter(pl.col("job") == "ddp")
    assert whole.height and (part.height == 0 or part["ranks"][0] < whole["ranks"][0])


def test_summaries_keep_the_slowest_of_each_job_and_combine_in_order() -> None:
    frame = pl.DataFrame({
        "job": ["a"] * 4 + ["b"] * 4, "trace_id": ["t0", "t1"] * 4, "process_group": ["0"] * 8,
        "seq": [1, 1, 2, 2, 1, 1, 2, 2], "collective": ["allreduce"] * 8, "rank": [0, 1] * 4,
        "ts_ns": [0, 10, 100, 110, 0, 10, 100, 110], "dur_ns": [50, 40, 70, 60, 40, 45, 70, 90],
        "message_bytes": [1000] * 8,
    })
    summaries = fleet.collective_summaries(frame)
    assert summaries["job"].to_list() == ["a", "b"] and summaries["trace_ids"].to_list() == [["t0", "t1"]] * 2
    combined = fleet.slowest_of(summaries, 10)
    # transfer time is the shortest duration over ranks: a/1 40, a/2 60, b/1 40, b/2 70; ties go to the earliest
    assert combined.select("job", "seq", "transfer_ns").rows() == [("b", 2, 70), ("a", 2, 60), ("a", 1, 40),
                                                                   ("b", 1, 40)]
    assert fleet.slowest_of(summaries, 2).height == 2
    assert fleet.slowest_of(summaries.head(0), 5).height == 0 and fleet.stragglers_of(summaries.head(0)).height == 0
