"""The fleet report's useful work (device-hours x MFU) and goodput sections (docs/analyses.md, "Fleet", "Goodput")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import plotly.graph_objects as go
import polars as pl

from tracelake.analysis import goodput as goodput_analysis
from tracelake.warehouse import Fleet

from .page import COLOURS, Column, HoursUnit, Html, figure, link, note, pct, plot_text, section, signed, table

JobLink = Callable[[str], str | None]
#: Said where a job's useful hours are unknown: no device of it has an MFU.
NO_MFU = "no MFU (no shapes / no peak)"
#: Jobs drawn in the goodput chart.
CHART_JOBS = 15
#: The wall-time buckets drawn, in order, and their colours.
_BARS = (("goodput", "goodput", COLOURS["compute"]), ("program_badput", "below peak FLOPs", COLOURS["overlapped"]),
         ("productive", "training steps (MFU unknown)", COLOURS["overlapped"]),
         ("other", "outside steps", COLOURS["other"]), ("checkpoint", "checkpoints", COLOURS["memory"]),
         ("restart_lost", "lost to restarts", COLOURS["exposed"]),
         ("restart_recovery", "restart recovery", COLOURS["host_wait"]), ("startup", "startup", COLOURS["kernel_wait"]),
         ("queued", "queued", COLOURS["idle"]))


def _labels_text(entries: Any) -> str:
    return ", ".join(f"{e['key']}={e['value']}" for e in entries) if entries else ""


def _useful(value: float | None, unit: HoursUnit) -> str:
    return NO_MFU if value is None else unit.format(value)


def useful_work(fleet: Fleet, unit: HoursUnit, job_link: JobLink) -> Html:
    """Jobs ranked by useful work lost, then useful device-hours per day and per team, beside busy ones."""
    wow = {r["job"]: r for r in fleet.week_over_week_by_job.to_dicts()}
    rows = []
    for i, r in enumerate(fleet.lost_work.to_dicts(), start=1):
        change = wow.get(r["job"], {})
        rows.append([
            i, link(r["job"], job_link(r["job"])), _labels_text(r.get("labels")), unit.format(r["device_hours"]),
            unit.format(r["busy_hours"]), _useful(r["useful_hours"], unit), pct(r["useful_pct"]),
            _useful(r["useful_lost_hours"], unit), signed(change.get("useful_lost_hours_change_pct")),
            pct(r["useful_coverage_pct"], 0),
        ])
    columns = [Column("#", "num"), Column("job"), Column("labels"), Column(unit.name, "num"),
               Column(f"busy {unit.name}", "num"), Column(f"useful {unit.name}", "num"), Column("MFU", "num"),
               Column("useful work lost", "num"), Column("lost w/w", "num"), Column("MFU known for", "num")]
    days = fleet.by_day.filter(pl.col("devices") > 0)
    per_day = table([Column("day"), Column(unit.name, "num"), Column(f"busy {unit.name}", "num"),
                     Column(f"useful {unit.name}", "num"), Column("MFU", "num")],
                    [[d["day"].isoformat(), unit.format(d["device_hours"]), unit.format(d["busy_hours"]),
                      _useful(d["useful_hours"], unit), pct(d["useful_pct"])] for d in days.to_dicts()])
    teams = fleet.by_label.filter(pl.col("label_key") == "team")
    per_team = table([Column("team"), Column(unit.name, "num"), Column(f"busy {unit.name}", "num"),
                      Column(f"useful {unit.name}", "num"), Column("MFU", "num"),
                      Column("useful work lost", "num")],
                     [[t["label_value"] if t["label_value"] is not None else "(no team label)",
                       unit.format(t["device_hours"]), unit.format(t["busy_hours"]), _useful(t["useful_hours"], unit),
                       pct(t["useful_pct"]), _useful(t["useful_lost_hours"], unit)] for t in teams.to_dicts()])
    return section(
        "Useful work", note("Useful device time = device time x MFU (model FLOPs / (peak x span)) per device, at "
                            "most its busy time, so useful <= busy <= traced; useful work lost = device time x "
                            f"(1 - MFU). Jobs ranked by useful work lost; \"{NO_MFU}\" where no device of the job "
                            "has model FLOPs estimated from operator shapes or a known peak."),
        table(columns, rows), Html("<h3>By day</h3>"), per_day,
        *((Html("<h3>By team</h3>"), per_team) if teams.height else ()), id_="useful-work")


def _factor(value: float | None) -> str:
    return "" if value is None else f"{100 * value:.1f}%"


def goodput(fleet: Fleet, job_link: JobLink) -> Html:
    """Per job with a lifecycle file: goodput, its three factors and the badput that dominates."""
    if fleet.goodput.is_empty():
        return section("Goodput", note("No job lifecycle file in this window: upload one per job "
                                       "(docs/formats.md, \"Job lifecycle\") to see scheduling, runtime and "
                                       "program goodput."), id_="goodput")
    ordered = fleet.goodput.sort(["goodput", "job"], nulls_last=True)
    rows = []
    for r in ordered.to_dicts():
        rows.append([
            link(r["job"], job_link(r["job"])), f"{r['wall_ns'] / 3.6e12:,.1f} h", _factor(r["goodput"]) or NO_MFU,
            _factor(r["scheduling_goodput"]), _factor(r["runtime_goodput"]),
            _factor(r["program_goodput"]) or NO_MFU, goodput_analysis.dominant_text(r), r["restarts"],
            r["checkpoints"],
        ])
    charted = ordered.head(CHART_JOBS)
    jobs = [plot_text(job) for job in charted["job"].to_list()]
    fig = go.Figure()
    for key, name, colour in _BARS:
        values = [(r["productive_ns"] if r["goodput_ns"] is None else 0) if key == "productive"
                  else r[f"{key}_ns"] or 0 for r in charted.to_dicts()]
        if any(values):
            fig.add_trace(go.Bar(name=name, y=jobs, x=[v / 3.6e12 for v in values], orientation="h",
                                 marker_color=colour, hovertemplate="%{y}: %{x:,.2f} h " + name + "<extra></extra>"))
    fig.update_layout(barmode="stack", xaxis_title="hours of wall time", yaxis={"autorange": "reversed"},
                      legend={"orientation": "h", "y": -0.25})
    columns = [Column("job"), Column("wall time", "num"), Column("goodput", "num"), Column("scheduling", "num"),
               Column("runtime", "num"), Column("program (MFU)", "num"), Column("largest badput"),
               Column("restarts", "num"), Column("checkpoints", "num")]
    return section("Goodput", note(
        "Goodput = scheduling x runtime x program: the share of the wall time (submitted to ended) the job held "
        "its resources, the share of that spent in training steps (not starting up, checkpointing, recovering "
        "from restarts or redoing the work they lost), and MFU. Lowest goodput first."),
        figure(fig, "goodput", max(220, 80 + 26 * charted.height)), table(columns, rows), id_="goodput")
