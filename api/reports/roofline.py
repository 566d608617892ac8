"""The job report's roofline: each operator's achieved TFLOP/s against its arithmetic intensity, under the device's
roof (docs/analyses.md, "Operators", "Roofline plot")."""

from __future__ import annotations

import math

import plotly.graph_objects as go
import polars as pl

from tracelake.analysis.op_stats import MODEL_KINDS, NO_OPERATOR, peak_for
from tracelake.analysis.operator_findings import shapes_text
from tracelake.analysis.peaks import Peaks, lookup
from tracelake.warehouse import JobReport

from .page import Html, figure, note, plot_text, section

#: Most operators drawn (those with most device time).
POINTS = 400
#: Marker sizes, px: the smallest and the largest (the operator with most device time).
SIZE_MIN, SIZE_MAX = 5.0, 40.0
#: Colour per cost kind (docs/analyses.md, "Operator FLOPs and bytes").
KIND_COLOURS = {"matmul": "#4c78a8", "attention": "#e45756", "conv": "#72b7b2", "norm": "#b279a2",
                "elementwise": "#f58518", "reduction": "#9d755d"}
TITLE = "Operators on the roofline"


def _points(op_stats: pl.DataFrame) -> pl.DataFrame:
    """Operators (op, shapes, dtype, kind) summed over ranks, with FLOPs, bytes and device time to place them."""
    rows = op_stats.filter(pl.col("flops").is_not_null() & (pl.col("flops") > 0) & (pl.col("bytes") > 0)
                           & (pl.col("device_ns") > 0))
    if rows.is_empty():
        return rows
    weighted = pl.col("pct_of_roofline").is_not_null()
    return rows.group_by("op", "input_shapes", "dtype", "kind").agg(
        pl.col("flops").sum(), pl.col("bytes").sum(), pl.col("device_ns").sum(), pl.col("count").sum(),
        pl.when(weighted.any()).then((pl.col("pct_of_roofline") * pl.col("device_ns")).filter(weighted).sum()
                                     / pl.col("device_ns").filter(weighted).sum()).alias("pct_of_roofline"),
        pl.col("bound").sort_by("device_ns", descending=True).drop_nulls().first(),
    ).with_columns(
        (pl.col("flops") / pl.col("device_ns") / 1e3).alias("tflops"),
        (pl.col("flops") / pl.col("bytes")).alias("intensity"),
    ).sort(["device_ns", "op"], descending=[True, False]).head(POINTS)


def _device(report: JobReport) -> tuple[str | None, Peaks | None]:
    """The first device name of the job that the table of peaks knows, and its peaks."""
    names = report.traces["device_name"].drop_nulls().unique().sort().to_list() \
        if "device_name" in report.traces.columns else []
    for name in names:
        if (found := lookup(name)) is not None:
            return name, found
    return (names[0] if names else None), None


def _dominant_dtype(points: pl.DataFrame) -> str | None:
    """The dtype holding most model FLOPs (else most FLOPs): the roof drawn is that dtype's."""
    model = points.filter(pl.col("kind").is_in(list(MODEL_KINDS)) & pl.col("dtype").is_not_null())
    source = model if model.height else points.filter(pl.col("dtype").is_not_null())
    if source.is_empty():
        return None
    return str(source.group_by("dtype").agg(pl.col("flops").sum()).sort(["flops", "dtype"],
                                                                          descending=[True, False])["dtype"][0])


def _why_empty(report: JobReport) -> str:
    """One line saying why no operator can be placed on the roofline."""
    formats = set(report.traces["format"].drop_nulls().to_list()) if "format" in report.traces.columns else set()
    rows = report.analysis.op_stats
    if any(f.startswith("xla") for f in formats) and "pytorch_profiler" not in formats:
        return ("No PyTorch operators in this job (XLA profiles carry FLOPs per XLA op, not per operator with "
                "its shapes): nothing to place on the roofline.")
    if rows.is_empty() or rows.filter(pl.col("op") != NO_OPERATOR).is_empty():
        return ("No operator launched device work in this job's traces (kernels no operator encloses, such as "
                "CUDA graph replays, have no shapes): nothing to place on the roofline.")
    return ("No operator has a FLOPs and bytes estimate (the profiler ran without record_shapes, or no operator "
            "has a cost rule): nothing to place on the roofline.")


def roofline_section(report: JobReport) -> Html:
    """A log-log scatter of the operators (x: FLOPs per byte, y: achieved TFLOP/s, size: device time) under the
    roof min(peak, bandwidth x intensity) of the job's device for its dominant dtype, the ridge point marked."""
    op_stats = report.analysis.op_stats
    points = _points(op_stats) if op_stats.height else op_stats
    if points.is_empty():
        return section(TITLE, note(_why_empty(report)), id_="roofline")
    name, peaks = _device(report)
    dtype = _dominant_dtype(points)
    peak = peak_for(peaks, dtype, "matmul") if peaks is not None else None
    hbm = peaks.hbm if peaks is not None else None
    fig = go.Figure()
    largest = float(points["device_ns"].max())  # type: ignore[arg-type]
    for kind, colour in [*KIND_COLOURS.items(), (None, "#5b6673")]:
        mine = points.filter(pl.col("kind") == kind) if kind else points.filter(
            ~pl.col("kind").is_in(list(KIND_COLOURS)) | pl.col("kind").is_null())
        if mine.is_empty():
            continue
        sizes = [SIZE_MIN + (SIZE_MAX - SIZE_MIN) * math.sqrt(v / largest) for v in mine["device_ns"].to_list()]
        custom = [[plot_text(op), plot_text(shapes_text(shapes, 80) or "-"), plot_text(dt or "?"), ns / 1e6,
                   "" if pct is None else f"{pct:,.0f}% of its {bound or ''} roof"]
                  for op, shapes, dt, ns, pct, bound in mine.select(
                      "op", "input_shapes", "dtype", "device_ns", "pct_of_roofline", "bound").rows()]
        fig.add_trace(go.Scatter(
            name=plot_text(kind or "other"), x=mine["intensity"].to_list(), y=mine["tflops"].to_list(),
            mode="markers", marker={"size": sizes, "color": colour, "opacity": 0.75, "line": {"width": 0}},
            customdata=custom,
            hovertemplate=("%{customdata[0]} [%{customdata[1]}] %{customdata[2]}<br>%{x:,.1f} FLOPs/byte, "
                           "%{y:,.1f} TFLOP/s, %{customdata[3]:,.2f} ms on the device<br>%{customdata[4]}"
                           "<extra></extra>")))
    remark = []
    if peak and hbm:
        ridge = peak / hbm
        low = min(float(points["intensity"].min()), ridge) / 2  # type: ignore[arg-type]
        high = max(float(points["intensity"].max()), ridge) * 2  # type: ignore[arg-type]
        xs = [low, ridge, high]  # a straight line on each side of the ridge in log-log
        fig.add_trace(go.Scatter(name=plot_text(f"roof ({dtype})"), x=xs, y=[min(peak, hbm * x) / 1e12 for x in xs],
                                 mode="lines", line={"color": "#1d2733", "width": 2}, hoverinfo="skip"))
        fig.add_trace(go.Scatter(
            name="ridge point", x=[ridge], y=[peak / 1e12], mode="markers+text", marker={"symbol": "diamond",
                                                                                      "size": 10, "color": "#1d2733"},
            text=[plot_text(f"ridge {ridge:,.0f} FLOPs/byte")], textposition="top left",
            hovertemplate=f"ridge point: {ridge:,.1f} FLOPs/byte, {peak / 1e12:,.1f} TFLOP/s<extra></extra>"))
        remark.append(f"The roof: {name} ({peaks.model if peaks else ''}), {dtype} peak {peak / 1e12:,.1f} TFLOP/s "
                      f"and {hbm / 1e12:,.2f} TB/s of HBM (docs/analyses.md, \"Hardware peaks\"); an operator of "
                      "another dtype has its own roof, which its % of roofline uses.")
    else:
        remark.append(f"No roof drawn: the peaks of {name or 'this device'} are not known"
                      + (f" for {dtype}" if peaks is not None else "") + " (docs/analyses.md, \"Hardware peaks\").")
    fig.update_layout(xaxis={"type": "log", "title": "arithmetic intensity, FLOPs per byte"},
                      yaxis={"type": "log", "title": "achieved TFLOP/s"}, legend={"orientation": "h", "y": -0.2})
    shown = f"the {POINTS} with most device time of " if points.height >= POINTS else ""
    return section(TITLE, note(f"Each point is an operator ({shown}its op, input shapes and dtype, summed over "
                               "every rank): estimated FLOPs per byte moved against the FLOP/s it achieved, sized "
                               "by device time. Points under the slanted part are memory-bound, under the flat "
                               "part compute-bound; the distance below the roof is what is left to gain."),
                   figure(fig, "roofline", 460), note(" ".join(remark)), id_="roofline")
