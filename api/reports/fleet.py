"""The fleet report: device-hours, utilisation over time, waste by job and label, the worst offenders, useful
work and goodput (:mod:`.fleet_goodput`) and each job's memory headroom."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from tracelake.analysis import fleet as fleet_analysis
from tracelake.warehouse import Fleet

from . import fleet_goodput
from .page import (
    COLOURS,
    Column,
    HoursUnit,
    Html,
    figure,
    link,
    ms,
    note,
    number,
    page,
    pct,
    plot_text,
    section,
    signed,
    table,
    tag,
)

#: Jobs drawn in the wasted-hours chart.
CHART_JOBS = 15
#: Bytes per GiB (memory is shown in binary units, as in docs/analyses.md, "Memory").
GIB = 1024 ** 3
#: Verdicts of :func:`tracelake.analysis.fleet.memory_headroom` in words, and their bar colours.
VERDICTS = {"edge": ("at the edge", COLOURS["exposed"]), "room": ("could take a larger batch", COLOURS["compute"])}
#: Label keys shown first, when the fleet uses them; any other key follows.
PREFERRED_KEYS = ("team", "cluster", "model", "hardware")
#: Label keys drawn as charts (the rest are in the table).
CHART_KEYS = 4

JobLink = Callable[[str], str | None]


def render(fleet: Fleet, job_link: JobLink) -> str:
    """The fleet report as one self-contained HTML page; ``job_link(job)`` is the URL of a job's report, or None."""
    totals = fleet.totals.row(0, named=True)
    unit = HoursUnit.for_hours(totals["device_hours"])
    window = _window(fleet)
    meta = f"{window}; {totals['traces']:,} traces, {fleet.by_job.height:,} jobs, {totals['devices']:,} device timelines"
    if not totals["devices"]:
        body: list[object] = [section("No device time in this window",
                                      note("No trace with device operations was ingested in it: widen --since "
                                           "or drop a --label filter."))]
        if not fleet.goodput.is_empty():  # lifecycle files alone still have their scheduling and runtime goodput
            body.append(fleet_goodput.goodput(fleet, job_link))
        return page("Fleet report", meta, body)
    body = [
        _headline(fleet, unit),
        _over_time(fleet, unit),
        _wasted_by_job(fleet, unit),
        _wasted_by_label(fleet, unit),
        _offenders(fleet, unit, job_link),
        fleet_goodput.useful_work(fleet, unit, job_link),
        fleet_goodput.goodput(fleet, job_link),
        _stragglers(fleet, job_link),
        _slowest(fleet, job_link),
        _memory(fleet, job_link),
        _by_device(fleet, unit),
        _labels_table(fleet, unit),
    ]
    return page("Fleet report", meta, body)


def _window(fleet: Fleet) -> str:
    since = fleet.since.strftime("%Y-%m-%d %H:%M UTC") if fleet.since else "the first trace"
    until = fleet.until.strftime("%Y-%m-%d %H:%M UTC") if fleet.until else "now"
    labels = ", ".join(f"{k}={v}" for k, v in sorted(fleet.labels.items()))
    return f"Traces ingested from {since} to {until}" + (f", labelled {labels}" if labels else "")


def _labels_text(entries: Any) -> str:
    if not entries:
        return ""
    return ", ".join(f"{e['key']}={e['value']}" for e in entries)


def _headline(fleet: Fleet, unit: HoursUnit) -> Html:
    t = fleet.totals.row(0, named=True)
    wow = fleet.week_over_week.row(0, named=True)

    def card(value: object, label: str, change: Html | None = None) -> Html:
        return tag("div", tag("div", value, class_="value"), tag("div", label, class_="label"),
                   tag("div", "vs previous week: ", change, class_="label") if change is not None else "",
                   class_="card")

    cards = [
        card(unit.format(t["device_hours"]), f"{unit.name} traced", signed(wow["device_hours_change_pct"])),
        card(pct(t["utilisation_pct"]), "utilisation (compute / span)",
             signed(wow["utilisation_change_points"], " pts")),
        card(unit.format(t["wasted_hours"]), f"wasted {unit.name} (idle + exposed communication)",
             signed(wow["wasted_hours_change_pct"])),
        card(pct(t["wasted_pct"]), "wasted share", signed(wow["wasted_change_points"], " pts")),
        card(unit.format(t["busy_hours"]), f"busy {unit.name}"),
        card(fleet_goodput.NO_MFU if t["useful_hours"] is None else unit.format(t["useful_hours"]),
             f"useful {unit.name} (x MFU, {pct(t['useful_coverage_pct'], 0)} of device time has one)",
             signed(wow["useful_hours_change_pct"])),
    ]
    if t["mfu_pct"] is not None:
        cards.append(card(pct(t["mfu_pct"]), f"MFU where FLOPs and peak are known "
                                             f"({pct(t['flops_coverage_pct'], 0)} of device time)"))
    if t["achieved_tflops"] is not None:
        cards.append(card(number(t["achieved_tflops"]), "achieved TFLOP/s per device"))
    week_note = note(f"Week over week: the 7 days up to {fleet.now:%Y-%m-%d %H:%M UTC} against the 7 days before "
                     "(by ingest time).")
    return section("The fleet at a glance", tag("div", *cards, class_="cards"), week_note, id_="headline")


def _over_time(fleet: Fleet, unit: HoursUnit) -> Html:
    days = fleet.by_day.filter(pl.col("devices") > 0)
    x = [d.isoformat() for d in days["day"].to_list()]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    other = days["busy_hours"] - days["compute_hours"] - days["exposed_communication_hours"]
    for values, name, colour in (
        (days["compute_hours"], "compute", COLOURS["compute"]),
        (days["exposed_communication_hours"], "exposed communication", COLOURS["exposed"]),
        (other.clip(lower_bound=0), "memory only", COLOURS["memory"]),  # busy, neither compute nor communication
        (days["idle_hours"], "idle", COLOURS["idle"]),
    ):
        fig.add_trace(go.Bar(name=name, x=x, y=[unit.convert(v) for v in values.to_list()], marker_color=colour,
                             hovertemplate="%{x}: %{y:,.2f} " + unit.name + " " + name + "<extra></extra>"),
                      secondary_y=False)
    fig.add_trace(go.Scatter(name="utilisation %", x=x, y=days["utilisation_pct"].to_list(), mode="lines+markers",
                             line={"color": "#1d2733"}, hovertemplate="%{x}: %{y:.1f}% utilisation<extra></extra>"),
                  secondary_y=True)
    fig.update_layout(barmode="stack", legend={"orientation": "h", "y": -0.2}, xaxis={"type": "category"})
    fig.update_yaxes(title_text=unit.name, secondary_y=False)
    fig.update_yaxes(title_text="utilisation %", range=[0, 100], dtick=20, showgrid=False, secondary_y=True)
    weeks = fleet.by_week.filter(pl.col("devices") > 0)
    weekly: object = Html("")
    if weeks.height > 1:
        rows = [[w["week"].isoformat(), w["traces"], unit.format(w["device_hours"]), pct(w["utilisation_pct"]),
                 unit.format(w["wasted_hours"]), pct(w["wasted_pct"])] for w in weeks.to_dicts()]
        weekly = table([Column("week of"), Column("traces", "num"), Column(unit.name, "num"),
                        Column("utilisation", "num"), Column(f"wasted {unit.name}", "num"), Column("wasted", "num")],
                       rows)
    return section("Utilisation over time", note("Device time per day of ingest (UTC), split into compute, "
                                                 "exposed communication (not overlapped by compute), memory only "
                                                 "and idle, which add up to it; the line is compute / span."),
                   figure(fig, "over-time", 400), weekly, id_="over-time")


def _hbar(frame: pl.DataFrame, labels: list[str], unit: HoursUnit, div_id: str) -> Html:
    fig = go.Figure([
        go.Bar(name=name, y=[plot_text(label) for label in labels],
               x=[unit.convert(v) for v in frame[column].to_list()], orientation="h", marker_color=COLOURS[key],
               hovertemplate="%{y}: %{x:,.2f} " + unit.name + " " + name + "<extra></extra>")
        for column, name, key in (("idle_hours", "idle", "idle"),
                                  ("exposed_communication_hours", "exposed communication", "exposed"))
    ])
    fig.update_layout(barmode="stack", xaxis_title=f"wasted {unit.name}", yaxis={"autorange": "reversed"},
                      legend={"orientation": "h", "y": -0.25})
    return figure(fig, div_id, max(220, 80 + 26 * len(labels)))


def _wasted_by_job(fleet: Fleet, unit: HoursUnit) -> Html:
    ranked = fleet.by_job.filter(pl.col("devices") > 0).sort(["wasted_hours", "job"], descending=[True, False]).head(
        CHART_JOBS)
    return section("Wasted device time by job", note(f"The {ranked.height} jobs with the most idle and exposed "
                                                     "communication time."),
                   _hbar(ranked, ranked["job"].to_list(), unit, "wasted-by-job"), id_="wasted-by-job")


def _ordered_keys(fleet: Fleet) -> list[str]:
    keys = sorted(set(fleet.by_label["label_key"].drop_nulls().to_list()))
    return [k for k in PREFERRED_KEYS if k in keys] + [k for k in keys if k not in PREFERRED_KEYS]


def _wasted_by_label(fleet: Fleet, unit: HoursUnit) -> Html:
    keys = _ordered_keys(fleet)
    if not keys:
        return section("Wasted device time by label", note("No trace in this window has labels (ingest with "
                                                           "--label team=... to group by team, cluster, model)."))
    charts = []
    for key in keys[:CHART_KEYS]:
        rows = fleet.by_label.filter(pl.col("label_key") == key).head(CHART_JOBS)
        labels = [f"{key}={v}" if v is not None else f"no {key} label" for v in rows["label_value"].to_list()]
        charts += [tag("h3", f"by {key}"), _hbar(rows, labels, unit, f"wasted-by-{_slug(key)}")]
    return section("Wasted device time by label", *charts, id_="wasted-by-label")


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower())


def _offenders(fleet: Fleet, unit: HoursUnit, job_link: JobLink) -> Html:
    wow = {r["job"]: r for r in fleet.week_over_week_by_job.to_dicts()}
    late: dict[str, dict[str, Any]] = {}
    for r in fleet.stragglers.to_dicts():
        late.setdefault(r["job"], r)
    rows = []
    for i, r in enumerate(fleet.offenders.to_dicts(), start=1):
        straggler = late.get(r["job"])
        rows.append([
            i, link(r["job"], job_link(r["job"])), _labels_text(r.get("labels")), r["devices"],
            unit.format(r["device_hours"]), unit.format(r["wasted_hours"]), pct(r["wasted_pct"]),
            unit.format(r["idle_hours"]), unit.format(r["exposed_communication_hours"]), pct(r["utilisation_pct"]),
            pct(r["mfu_pct"]), signed(wow.get(r["job"], {}).get("wasted_hours_change_pct")),
            f"rank {straggler['rank']} (last at {straggler['share_last_pct']:.0f}%)" if straggler else "",
        ])
    columns = [Column("#", "num"), Column("job"), Column("labels"), Column("device timelines", "num"),
               Column(unit.name, "num"), Column("wasted", "num"), Column("wasted share", "num"),
               Column("idle", "num"), Column("exposed comm.", "num"), Column("utilisation", "num"),
               Column("MFU", "num"), Column("wasted w/w", "num"), Column("straggler")]
    return section("Top offenders", note("Jobs ranked by wasted device time (idle + exposed communication); each "
                                         "links to its job report: findings, per-rank breakdown, stragglers."),
                   table(columns, rows), id_="offenders")


def _stragglers(fleet: Fleet, job_link: JobLink) -> Html:
    if fleet.stragglers.is_empty():
        return section("Worst stragglers", note("No rank arrives last at collectives more often than chance."))
    rows = [[link(r["job"], job_link(r["job"])), f"rank {r['rank']}", f"{r['ranks']}",
             f"{r['times_last']:,} of {r['collectives']:,}", pct(r["share_last_pct"], 0), number(r["mean_skew_us"]),
             ms(r["waited_ns"])] for r in fleet.stragglers.to_dicts()]
    columns = [Column("job"), Column("rank"), Column("ranks", "num"), Column("last at", "num"),
               Column("share", "num"), Column("mean lateness, us", "num"), Column("others waited", "num")]
    return section("Worst stragglers", note("Ranks that start collectives last more often than 1/n of the time, "
                                            "ranked by how long the other ranks waited for them."),
                   table(columns, rows), id_="stragglers")


def _slowest(fleet: Fleet, job_link: JobLink) -> Html:
    if fleet.slowest_collectives.is_empty():
        return section("Slowest collectives", note("No collective with a transfer time in this window."))
    rows = [[link(r["job"], job_link(r["job"])), r["collective"], f"{r['process_group']}:{r['seq']}", r["ranks"],
             f"{r['message_bytes']:,}" if r["message_bytes"] is not None else "", ms(r["transfer_ns"], 2),
             number(r["busbw_gbs"]), ms(r["skew_ns"], 2), f"rank {r['last_rank']}"]
            for r in fleet.slowest_collectives.to_dicts()]
    columns = [Column("job"), Column("collective", "name"), Column("group:seq", "name"), Column("ranks", "num"),
               Column("bytes", "num"), Column("transfer", "num"), Column("busbw, GB/s", "num"),
               Column("arrival skew", "num"), Column("last")]
    return section("Slowest collectives", note("Transfer time = the shortest duration across ranks (the others "
                                               "include waiting)."), table(columns, rows), id_="slowest")


def _gib(value: float | None) -> str:
    return f"{value / GIB:,.2f}" if value is not None else ""


def _memory(fleet: Fleet, job_link: JobLink) -> Html:
    """Jobs at the edge of their device memory first, then those that could take a larger batch, then the rest."""
    without = len(set(fleet.by_job.filter(pl.col("devices") > 0)["job"].to_list()) - set(fleet.memory["job"].to_list()))
    left_out = note(f"{without:,} job{'s' if without != 1 else ''} without memory data (traces profiled without "
                    "profile_memory=True) left out.") if without else Html("")
    if fleet.memory.is_empty():
        return section("Memory headroom", note("No trace in this window has memory events: profile with "
                                               "profile_memory=True to see how close jobs run to their device "
                                               "memory."), left_out, id_="memory")
    rank = pl.when(pl.col("verdict") == "edge").then(0).when(pl.col("verdict") == "room").then(1).otherwise(2)
    ordered = (fleet.memory.with_columns(rank.alias("_group"))
               .sort(["_group", "headroom_pct", "job"], nulls_last=True).drop("_group"))
    rows = [[link(r["job"], job_link(r["job"])), r["ranks"], r["devices"], _gib(r["peak_allocated_bytes"]),
             _gib(r["peak_reserved_bytes"]), _gib(r["capacity_bytes"]), _gib(r["headroom_bytes"]),
             pct(r["headroom_pct"]), VERDICTS[r["verdict"]][0] if r["verdict"] in VERDICTS else ""]
            for r in ordered.to_dicts()]
    columns = [Column("job"), Column("ranks", "num"), Column("devices", "num"), Column("peak allocated, GiB", "num"),
               Column("peak reserved, GiB", "num"), Column("capacity, GiB", "num"), Column("headroom, GiB", "num"),
               Column("headroom", "num"), Column("verdict")]
    charted = ordered.filter(pl.col("headroom_pct").is_not_null()).head(CHART_JOBS)
    fig = go.Figure(go.Bar(
        y=[plot_text(job) for job in charted["job"].to_list()], x=charted["headroom_pct"].to_list(), orientation="h",
        marker_color=[VERDICTS.get(v or "", ("", COLOURS["idle"]))[1] for v in charted["verdict"].to_list()],
        hovertemplate="%{y}: %{x:.1f}% headroom<extra></extra>"))
    for at in (fleet_analysis.EDGE_HEADROOM_PCT, fleet_analysis.ROOM_HEADROOM_PCT):
        fig.add_vline(x=at, line_dash="dot", line_color="#1d2733")
    fig.update_layout(xaxis={"title": "headroom, % of device memory", "range": [0, 100]},
                      yaxis={"autorange": "reversed"})
    edge = ordered.filter(pl.col("verdict") == "edge").height
    room = ordered.filter(pl.col("verdict") == "room").height
    return section("Memory headroom", note(
        f"{edge:,} job{'s' if edge != 1 else ''} at the edge (headroom under "
        f"{fleet_analysis.EDGE_HEADROOM_PCT:.0f}% on some device), {room:,} that could take a larger batch (over "
        f"{fleet_analysis.ROOM_HEADROOM_PCT:.0f}% on every device). Headroom = (capacity - peak reserved) / "
        "capacity on the tightest device; an upper bound, as the CUDA context and NCCL buffers are not in the "
        "allocator's totals."), left_out, figure(fig, "memory-headroom", max(220, 80 + 26 * charted.height)),
        table(columns, rows), id_="memory")


def _by_device(fleet: Fleet, unit: HoursUnit) -> Html:
    rows = [[r["device_name"] or "unknown", r["traces"], r["devices"], unit.format(r["device_hours"]),
             pct(r["utilisation_pct"]), pct(r["wasted_pct"]), number(r["achieved_tflops"]), pct(r["mfu_pct"])]
            for r in fleet.by_device.to_dicts()]
    columns = [Column("accelerator"), Column("traces", "num"), Column("device timelines", "num"),
               Column(unit.name, "num"), Column("utilisation", "num"), Column("wasted", "num"),
               Column("TFLOP/s per device", "num"), Column("MFU", "num")]
    return section("By accelerator", table(columns, rows), id_="by-device")


def _labels_table(fleet: Fleet, unit: HoursUnit) -> Html:
    if fleet.by_label.is_empty():
        return Html("")
    order = {k: i for i, k in enumerate(_ordered_keys(fleet))}
    ordered = sorted(fleet.by_label.to_dicts(), key=lambda r: (order.get(r["label_key"], 99),
                                                               -(r["wasted_hours"] or 0)))
    rows = [[r["label_key"], r["label_value"] if r["label_value"] is not None else "(none)", r["traces"],
             unit.format(r["device_hours"]), pct(r["utilisation_pct"]), unit.format(r["wasted_hours"]),
             pct(r["wasted_pct"]), pct(r["mfu_pct"])] for r in ordered]
    columns = [Column("label"), Column("value"), Column("traces", "num"), Column(unit.name, "num"),
               Column("utilisation", "num"), Column(f"wasted {unit.name}", "num"), Column("wasted", "num"),
               Column("MFU", "num")]
    return section("By label", table(columns, rows), id_="by-label")
