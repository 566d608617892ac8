"""The job report's critical-path timeline and what-if chart (docs/analyses.md, "Critical path").

Drawn from the facade's frames as they are: ``critical_path`` (one row per step),
``critical_path_stretches`` (each step's path, stretch by stretch) and ``what_if``
(each step under each scenario, summed per scenario by
:func:`tracelake.analysis.critical_path.totals`).
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
import polars as pl

from tracelake.analysis.critical_path import WORDS, totals
from tracelake.contracts.critical import PATH_KINDS, PathKind, Scenario
from tracelake.warehouse import JobReport

from .page import Column, Html, figure, ms, note, pct, plot_text, section, table

#: One colour per kind of time on the critical path, the same in every chart.
PATH_COLOURS: dict[PathKind, str] = {
    PathKind.COMPUTE: "#4c78a8", PathKind.COMMUNICATION: "#e45756", PathKind.MEMORY: "#b279a2",
    PathKind.HOST: "#f58518", PathKind.LAUNCH: "#eeca3b", PathKind.SYNC: "#54a24b", PathKind.IDLE: "#bab0ac",
}
#: The predicted bars of each run, in turn; the measured line in grey.
RUN_COLOURS = ["#4c78a8", "#f58518", "#54a24b", "#b279a2", "#72b7b2", "#9d755d"]
MEASURED_COLOUR = "#5b6673"
#: Past this many stretches, neighbouring stretches of one rank and kind are drawn as one bar (their time kept).
MAX_BARS = 20_000
#: Up to this many steps, the table lists every step; past it, the :data:`SLOWEST_LISTED` slowest.
MAX_TABLE_STEPS = 30
SLOWEST_LISTED = 10
#: The row of stretches that belong to no one rank.
NO_RANK = "across ranks"


def _slowest(report: JobReport) -> dict[str, Any] | None:
    """The step with the longest measured time (of any run), as a ``critical_path`` row."""
    steps = report.analysis.critical_path
    if steps.is_empty():
        return None
    return steps.sort("measured_ns", descending=True, nulls_last=True).row(0, named=True)


def _mine(frame: pl.DataFrame, step: dict[str, Any]) -> pl.DataFrame:
    """The rows of ``frame`` that belong to ``step``'s run and step (a null step: the selection had no steps)."""
    chosen = pl.col("step").is_null() if step["step"] is None else pl.col("step") == step["step"]
    if "run" in frame.columns and "run" in step:
        chosen = chosen & (pl.col("run") == step["run"])
    return frame.filter(chosen)


def _rank_rows(report: JobReport, step: dict[str, Any], stretches: pl.DataFrame) -> list[str]:
    """The timeline's rows, top to bottom: every rank of the step's run (from the breakdown), and any other rank
    the path visits."""
    whole = report.analysis.breakdown
    if "run" in whole.columns and "run" in step:
        whole = whole.filter(pl.col("run") == step["run"])
    ranks = set(whole["rank"].drop_nulls().to_list()) if "rank" in whole.columns else set()
    ranks |= set(stretches["rank"].drop_nulls().to_list())
    rows = [f"rank {r}" for r in sorted(ranks)]
    return rows + [NO_RANK] if stretches["rank"].is_null().any() else rows


def _bars(stretches: pl.DataFrame) -> pl.DataFrame:
    """The stretches as drawn: as they are, or past :data:`MAX_BARS` neighbours of one rank and kind joined."""
    if stretches.height <= MAX_BARS:
        return stretches.with_columns(pl.col("name").fill_null(""))
    run = (pl.col("rank").ne_missing(pl.col("rank").shift()) | (pl.col("kind") != pl.col("kind").shift())
           ).fill_null(True).cum_sum()
    return stretches.sort("position").with_columns(run.alias("_bar")).group_by("_bar", maintain_order=True).agg(
        pl.col("rank").first(), pl.col("kind").first(), pl.col("start_ns").first(), pl.col("dur_ns").sum(),
        pl.when(pl.len() == 1).then(pl.col("name").first().fill_null(""))
        .otherwise(pl.format("{} stretches", pl.len())).alias("name"))


def timeline_figure(report: JobReport) -> tuple[go.Figure, dict[str, Any]] | None:
    """The slowest step's critical path: a row per rank, a bar per stretch coloured by kind (a trace per kind)."""
    step = _slowest(report)
    if step is None:
        return None
    stretches = _mine(report.analysis.critical_path_stretches, step).sort("position")
    if stretches.is_empty():
        return None
    rows = _rank_rows(report, step, stretches)
    bars = _bars(stretches)
    origin = int(stretches["start_ns"].min())  # type: ignore[arg-type]
    row_of = {label: i for i, label in enumerate(rows)}
    fig = go.Figure()
    for kind in PATH_KINDS:
        mine = bars.filter(pl.col("kind") == str(kind))
        if mine.is_empty():
            continue
        fig.add_trace(go.Bar(
            name=str(kind), orientation="h", marker_color=PATH_COLOURS[kind], width=0.6,
            y=[row_of[f"rank {r}" if r is not None else NO_RANK] for r in mine["rank"].to_list()],
            text=[plot_text(f"rank {r}" if r is not None else NO_RANK) for r in mine["rank"].to_list()],
            textposition="none",
            x=(mine["dur_ns"] / 1e6).to_list(), base=((mine["start_ns"] - origin) / 1e6).to_list(),
            customdata=[[plot_text(n), d / 1e3] for n, d in mine.select("name", "dur_ns").rows()],
            hovertemplate="%{text}, " + str(kind) + ": %{customdata[0]}<br>%{customdata[1]:,.1f} us, from "
                          "%{base:,.3f} ms<extra></extra>"))
    # a numeric axis with a tick per rank: every rank of the run gets its row, also one the path never visits
    fig.update_layout(barmode="overlay", xaxis_title="ms since the step's start",
                      yaxis={"tickmode": "array", "tickvals": list(range(len(rows))),
                             "ticktext": [plot_text(r) for r in rows], "range": [len(rows) - 0.5, -0.5],
                             "zeroline": False, "showgrid": False},
                      legend={"orientation": "h", "y": -0.25, "title": {"text": "time spent on"}})
    return fig, step


def critical_path_section(report: JobReport) -> Html:
    """What bounds the steps: the slowest step's path across the ranks, and a table per step; empty without steps."""
    drawn = timeline_figure(report)
    if drawn is None:
        return Html("")
    fig, step = drawn
    steps = report.analysis.critical_path
    run = "run" in steps.columns
    where = f" of {step['run']}" if run else ""
    what = (f"the traces{where} (no steps marked: one step, {ms(step['measured_ns'], 2)})" if step["step"] is None
            else f"the slowest step (step {step['step']}{where}, {ms(step['measured_ns'], 2)})")
    listed = steps.sort(*(["run"] if run else []), "step", nulls_last=True)
    cut = Html("")
    if steps.height > MAX_TABLE_STEPS:
        listed = steps.sort("measured_ns", descending=True, nulls_last=True).head(SLOWEST_LISTED)
        cut = note(f"The {SLOWEST_LISTED} slowest of {steps.height} steps, slowest first (every step: "
                   "`tracelake analyze --json`, or the API).")
    rows = [[*([r["run"]] if run else []), "all" if r["step"] is None else r["step"], r["ranks"],
             ms(r["measured_ns"], 2), "" if r["bounding_rank"] is None else f"rank {r['bounding_rank']}",
             *(pct(100 * (r[f"{k}_ns"] or 0) / r["length_ns"] if r["length_ns"] else None) for k in PATH_KINDS)]
            for r in listed.to_dicts()]
    columns = [*([Column("run")] if run else []), Column("step", "num"), Column("ranks", "num"),
               Column("measured", "num"), Column("bounding rank"), *(Column(str(k), "num") for k in PATH_KINDS)]
    return section(
        "What bounds each step: the critical path",
        note(f"The chain of work that set the length of {what} across the ranks: each bar is a stretch of it on that rank's row, "
             "coloured by what the time went to; shortening anything off the path does not shorten the step "
             "(docs/analyses.md, \"Critical path\")."),
        figure(fig, "critical-path", max(300, 140 + 34 * len(fig.layout.yaxis.tickvals or ()))),
        note("Every step: the time on its path by kind, % of the step's length (they add up to 100%), and the rank "
             "with the most of it."),
        table(columns, rows), cut, id_="critical-path")


def _ordered_totals(what_if: pl.DataFrame) -> pl.DataFrame:
    """Per scenario (and run), over every step; the measured baseline first, then the largest saving first."""
    summed = totals(what_if)
    run = ["run"] if "run" in summed.columns else []
    return summed.with_columns((pl.col("scenario") == str(Scenario.AS_MEASURED)).alias("_base")).sort(
        *run, "_base", "saving_ns", descending=[*(False for _ in run), True, True], maintain_order=True)


def what_if_figure(what_if: pl.DataFrame) -> go.Figure | None:
    """Predicted ms per step under each scenario, a bar each (grouped by run), against the measured ms per step."""
    if what_if.is_empty():
        return None
    summed = _ordered_totals(what_if)
    runs = summed["run"].unique(maintain_order=True).to_list() if "run" in summed.columns else [None]
    fig = go.Figure()
    for run, colour in zip(runs, RUN_COLOURS * len(runs)):
        mine = summed.filter(pl.col("run") == run) if run is not None else summed
        per_step = mine["steps"].cast(pl.Float64)
        label = f"{run}: " if run is not None else ""
        x = [plot_text(s) for s in mine["scenario"].to_list()]
        fig.add_trace(go.Bar(
            name=plot_text(f"{label}predicted"), x=x, y=(mine["predicted_ns"] / per_step / 1e6).to_list(),
            marker_color=colour,
            customdata=[[plot_text(WORDS.get(s, s)), save / n / 1e6, share]
                        for s, save, n, share in mine.select("scenario", "saving_ns", "steps", "saving_pct").rows()],
            hovertemplate=plot_text(label) + "%{customdata[0]}: %{y:,.3f} ms per step, saving %{customdata[1]:,.3f} "
                                             "ms (%{customdata[2]:.1f}%)<extra></extra>"))
        fig.add_trace(go.Scatter(
            name=plot_text(f"{label}measured"), x=x, y=(mine["measured_ns"] / per_step / 1e6).to_list(),
            mode="lines", line={"dash": "dash", "color": MEASURED_COLOUR},
            hovertemplate=plot_text(label) + "measured: %{y:,.3f} ms per step<extra></extra>"))
    fig.update_layout(barmode="group", yaxis_title="ms per step", legend={"orientation": "h", "y": -0.25})
    return fig


def what_if_section(report: JobReport) -> Html:
    """What the steps would take with one thing changed: a chart and a table; empty without steps."""
    fig = what_if_figure(report.analysis.what_if)
    if fig is None:
        return Html("")
    summed = _ordered_totals(report.analysis.what_if)
    run = "run" in summed.columns
    rows = [[*([r["run"]] if run else []), r["scenario"],
             WORDS.get(r["scenario"], ""), r["steps"],
             ms(r["predicted_ns"] / r["steps"], 3), ms(r["saving_ns"] / r["steps"], 3), pct(r["saving_pct"])]
            for r in summed.to_dicts()]
    columns = [*([Column("run")] if run else []), Column("scenario"), Column("what changes"), Column("steps", "num"),
               Column("predicted per step", "num"), Column("saving per step", "num"), Column("saving", "num")]
    return section(
        "What if: the steps replayed with one change",
        note("Each step's dependency graph across the ranks replayed with one thing changed, summed over the steps; "
             "the dashed line is the measured time per step, which as_measured (the graph replayed unchanged) "
             "gives back. The largest saving first."),
        figure(fig, "what-if", 380), table(columns, rows), id_="what-if")
