"""The job report's memory section: allocated and reserved over time per rank, by category where known, and the
peaks (docs/analyses.md, "Memory").

Drawn from the facade's frames as they are: ``memory`` (one row per trace, rank and device), ``memory_series``
(the trace's running totals, at most :data:`tracelake.analysis.assemble.SERIES_POINTS` points per device),
``memory_category_series`` (PyTorch's memory timeline, live bytes per category) and ``memory_live_at_peak``.
Nothing is drawn for a job without memory data.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
import polars as pl

from tracelake.analysis.memory_findings import size
from tracelake.warehouse import JobReport

from .page import Column, Html, figure, note, number, pct, plot_text, section, table

GIB = float(1 << 30)
#: Most devices drawn (those with the least headroom, then the largest peak); the table lists every one.
MAX_FIGURES = 8
#: Ops named per device in the table's "live at the peak" cell.
HOLDERS = 3
#: One colour per category of PyTorch's memory timeline (``TIMELINE_CATEGORIES``), the same in every chart.
CATEGORY_COLOURS = {
    "parameter": "#4c78a8", "optimizer_state": "#f58518", "input": "#54a24b", "temporary": "#eeca3b",
    "activation": "#e45756", "gradient": "#72b7b2", "autograd_detail": "#b279a2", "unknown": "#bab0ac",
}
ALLOCATED_COLOUR, RESERVED_COLOUR, CAPACITY_COLOUR = "#1d2733", "#9d755d", "#b42318"


def _run(frame: pl.DataFrame) -> list[str]:
    return ["run"] if "run" in frame.columns else []


def _label(row: dict[str, Any]) -> str:
    run = f"{row['run']} " if row.get("run") else ""
    return f"{run}rank {row['rank']}, device {row['device']}"


def _mine(frame: pl.DataFrame, row: dict[str, Any], columns: tuple[str, ...]) -> pl.DataFrame:
    """The rows of ``frame`` that match ``row`` on those of ``columns`` both have."""
    for column in columns:
        if column in frame.columns and column in row:
            frame = frame.filter(pl.col(column) == row[column])
    return frame


def _categories(report: JobReport, row: dict[str, Any]) -> pl.DataFrame:
    """The memory timeline of ``row``'s rank (and run; its device where the export names one), wide: a column per
    category."""
    series = report.analysis.memory_category_series
    if series.is_empty():
        return series
    mine = _mine(series, row, ("run", "rank"))
    if "device" in mine.columns:
        mine = mine.filter(pl.col("device").is_null() | (pl.col("device") == row["device"]))
    if mine.is_empty():
        return mine
    trace = mine["trace_id"].min()  # one timeline per rank (a second would be another recording)
    return mine.filter(pl.col("trace_id") == trace).pivot(on="category", index="ts_ns", values="bytes",
                                                          aggregate_function="sum").sort("ts_ns")


def _device_figure(report: JobReport, row: dict[str, Any], name: str) -> list[Html]:
    """Allocated and reserved over time for one device, over the categories' stacked areas when the timeline's
    time overlaps; the timeline in its own chart when it does not."""
    series = _mine(report.analysis.memory_series, row, ("run", "trace_id", "rank", "device")).sort("ts_ns")
    wide = _categories(report, row)
    label = plot_text(_label(row))
    spans = [(int(f["ts_ns"].min()), int(f["ts_ns"].max())) for f in (series, wide) if f.height]  # type: ignore[arg-type]
    overlap = len(spans) == 2 and spans[1][0] <= spans[0][1] and spans[0][0] <= spans[1][1]
    t0 = min(s for s, _ in spans) if overlap else (spans[0][0] if series.height else 0)
    fig = go.Figure()
    out: list[Html] = []
    stacked = fig if overlap else go.Figure()
    if wide.height:
        base = t0 if overlap else spans[-1][0]
        x = ((wide["ts_ns"] - base) / 1e6).to_list()
        for category in [c for c in CATEGORY_COLOURS if c in wide.columns] + \
                [c for c in wide.columns if c not in CATEGORY_COLOURS and c != "ts_ns"]:
            stacked.add_trace(go.Scatter(
                name=plot_text(category), x=x, y=(wide[category].fill_null(0) / GIB).to_list(), mode="lines",
                stackgroup="categories", line={"width": 0.5, "shape": "hv"},
                fillcolor=CATEGORY_COLOURS.get(category), line_color=CATEGORY_COLOURS.get(category),
                hovertemplate=plot_text(category) + ": %{y:,.3f} GiB at %{x:,.2f} ms<extra></extra>"))
    if series.height:
        x = ((series["ts_ns"] - t0) / 1e6).to_list()
        for column, title, colour in (("reserved_bytes", "reserved", RESERVED_COLOUR),
                                      ("allocated_bytes", "allocated", ALLOCATED_COLOUR)):
            fig.add_trace(go.Scatter(
                name=title, x=x, y=(series[column] / GIB).to_list(), mode="lines",
                line={"color": colour, "width": 1.5, "shape": "hv"},
                hovertemplate=title + ": %{y:,.3f} GiB at %{x:,.2f} ms<extra></extra>"))
    if row.get("capacity_bytes") and row.get("headroom_pct") is not None and row["headroom_pct"] < 50:
        fig.add_hline(y=row["capacity_bytes"] / GIB, line_dash="dash", line_color=CAPACITY_COLOUR,
                      annotation_text=plot_text(f"capacity {row['capacity_bytes'] / GIB:,.1f} GiB"))
    fig.update_layout(title=label, xaxis_title="ms since the first memory event", yaxis_title="GiB",
                      legend={"orientation": "h", "y": -0.2})
    out.append(figure(fig, name, 360))
    if wide.height and not overlap:
        stacked.update_layout(title=f"{label}: memory timeline by category", xaxis_title="ms since its start",
                              yaxis_title="GiB", legend={"orientation": "h", "y": -0.2})
        out.append(figure(stacked, f"{name}-categories", 360))
    return out


def _holders(report: JobReport, row: dict[str, Any]) -> str:
    live = _mine(report.analysis.memory_live_at_peak, row, ("run", "trace_id", "rank", "device"))
    if live.is_empty():
        return ""
    return ", ".join(f"{r['op']} {size(r['bytes'])} ({r['share_pct']:.0f}%)"
                     for r in live.sort("bytes", descending=True).head(HOLDERS).to_dicts())


def memory_section(report: JobReport) -> Html:
    """Memory over time per rank and the peaks table; nothing without memory data (docs/analyses.md, "Memory")."""
    peaks = report.analysis.memory
    if peaks.is_empty():
        return Html("")
    rows = peaks.sort(*_run(peaks), "rank", "device", "trace_id").to_dicts()
    drawn = sorted((r for r in rows if r["device"] >= 0),
                   key=lambda r: (r["headroom_pct"] if r["headroom_pct"] is not None else 101.0,
                                  -(r["peak_allocated_bytes"] or 0)))[:MAX_FIGURES]
    drawn.sort(key=lambda r: (r.get("run") or "", r["rank"], r["device"], r["trace_id"]))
    figures: list[Html] = []
    for i, row in enumerate(drawn):
        figures += _device_figure(report, row, f"memory-{i}")
    devices = sum(r["device"] >= 0 for r in rows)
    shown = note(f"Drawn: the {len(drawn)} of {devices} devices with the least headroom.") \
        if devices > len(drawn) else Html("")
    columns = [Column("rank"), Column("device"), Column("peak allocated, GiB", "num"),
               Column("peak reserved, GiB", "num"), Column("capacity, GiB", "num"), Column("headroom", "num"),
               Column("fragmentation, GiB", "num"), Column("growth, MiB/step", "num"), Column("peak step", "num"),
               Column("OOMs", "num"), Column("live at the peak", "name")]
    cells = [[_label(r).rsplit(", device", 1)[0], "cpu" if r["device"] < 0 else f"{r['device_type'] or ''}:{r['device']}",
              number(_gib(r["peak_allocated_bytes"]), 2), number(_gib(r["peak_reserved_bytes"]), 2),
              number(_gib(r["capacity_bytes"]), 1), pct(r["headroom_pct"]),
              number(_gib(r["fragmentation_bytes"]), 2),
              number(None if r.get("slope_bytes_per_step") is None else r["slope_bytes_per_step"] / (1 << 20)),
              "" if r["peak_step"] is None else r["peak_step"], r["ooms"], _holders(report, r)] for r in rows]
    return section("Device memory",
                   note("The allocator's own running totals from the profile's memory events (profile_memory=True): "
                        "allocated (held by tensors) and reserved (taken from the device), with PyTorch's memory "
                        "timeline stacked by category where the job has one. Headroom is capacity minus peak reserved "
                        "(the CUDA context and NCCL buffers are not counted); fragmentation is reserved minus allocated "
                        "at the allocated peak."),
                   *figures, shown, table(columns, cells), id_="memory")


def _gib(value: float | None) -> float | None:
    return None if value is None else value / GIB
