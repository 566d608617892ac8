"""The job report: one job's findings, breakdown, steps, critical path and what-if answers, device memory, idle
time, stragglers, kernels and bandwidth as a page."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
import polars as pl

from tracelake.warehouse import JobReport

from .critical import critical_path_section, what_if_section
from .memory import memory_section
from .roofline import roofline_section
from .page import (
    COLOURS,
    Column,
    HoursUnit,
    Html,
    concat,
    esc,
    figure,
    ms,
    note,
    number,
    page,
    pct,
    plot_text,
    section,
    table,
    tag,
)

#: Most collective instances the straggler heat map shows (the first ones, in time order).
HEATMAP_INSTANCES = 1500
#: Most instances drawn as points in the bandwidth chart.
BANDWIDTH_POINTS = 5000
#: Up to this many ranks, the step chart draws a line per rank; past it, the min, median and max.
LINES_PER_RANK = 32

#: The exclusive buckets of the breakdown (they add up to the span), as drawn.
BUCKETS = (
    ("compute_only_ns", "compute only", COLOURS["compute"]),
    ("compute_communication_ns", "communication hidden by compute", COLOURS["overlapped"]),
    ("communication_only_ns", "communication only (exposed)", COLOURS["exposed"]),
    ("memory_only_ns", "memory only", COLOURS["memory"]),
    ("other_overlap_ns", "other overlaps", COLOURS["other"]),
    ("idle_ns", "idle", COLOURS["idle"]),
)


def render(report: JobReport) -> str:
    """The job report as one self-contained HTML page."""
    analysis = report.analysis
    traces = report.traces
    formats = ", ".join(sorted(set(traces["format"].drop_nulls().to_list())))
    devices = ", ".join(sorted(set(traces["device_name"].drop_nulls().to_list())))
    meta = (f"{traces.height} trace{'s' if traces.height != 1 else ''} ({formats})"
            + (f" on {devices}" if devices else "") + f"; {analysis.breakdown.height} device timelines")
    body = [
        _findings(report),
        _runs(report),
        _summary(report),
        _breakdown(report),
        _steps(report),
        critical_path_section(report),
        what_if_section(report),
        memory_section(report),
        _idle(report),
        _stragglers(report),
        _kernels(report),
        _operators(report),
        roofline_section(report),
        _bandwidth(report),
        _nccl_benchmarks(report),
        _traces(report),
    ]
    return page(f"Job report: {report.job}", meta, body)


def _rank_labels(frame: pl.DataFrame) -> list[str]:
    """``rank N`` per row (``run-2 rank N`` when the rows span runs); with the trace id when a rank still repeats."""
    if "run" in frame.columns and frame["run"].n_unique() > 1:
        keys = list(zip(frame["run"].to_list(), frame["rank"].to_list()))
        if len(set(keys)) == len(keys) or "trace_id" not in frame.columns:
            return [f"{run} rank {r}" for run, r in keys]
        return [f"{run} rank {r} ({t[:8]})" for (run, r), t in zip(keys, frame["trace_id"].to_list())]
    ranks = frame["rank"].to_list()
    if len(set(ranks)) == len(ranks) or "trace_id" not in frame.columns:
        return [f"rank {r}" for r in ranks]
    return [f"rank {r} ({t[:8]})" for r, t in zip(ranks, frame["trace_id"].to_list())]


def _findings(report: JobReport) -> Html:
    found = report.analysis.findings
    if not found:
        return section("Findings", note("No findings: nothing exposed, idle or late stands out."), id_="findings")
    items = []
    for f in found:
        gain = tag("span", f" (fixing it saves up to {ms(f.gain_ns)})", class_="gain") if f.gain_ns > 0 else ""
        items.append(tag("li", tag("strong", f.title[:1].upper() + f.title[1:]), ": ", f.detail, gain))
    return section("Findings", note("Largest estimated gain first; each gain is an upper bound on the worst rank's "
                                    "timeline."), tag("ol", *items, class_="findings"), id_="findings")


def _runs(report: JobReport) -> Html:
    """The job's runs, when it holds more than one or a rank repeats in one (docs/analyses.md, "Runs within a job")."""
    runs = report.analysis.runs
    if runs.is_empty() or (runs.height == 1 and not runs["warning"].drop_nulls().len()):
        return Html("")
    rows = [[r["run"], r["rule"], r["traces"], r["ranks"], r["world_size"] or "",
             ms(r["end_ns"] - r["start_ns"], 2) if r["start_ns"] is not None and r["end_ns"] is not None else "",
             r["warning"] or ""] for r in runs.to_dicts()]
    columns = [Column("run"), Column("grouped by"), Column("traces", "num"), Column("ranks", "num"),
               Column("world size", "num"), Column("span", "num"), Column("warning", "name")]
    return section("Runs", note("The job's traces grouped into runs (a run label, else the same world size and "
                                "overlapping time); every analysis below is made run by run."),
                   table(columns, rows), id_="runs")


def _summary(report: JobReport) -> Html:
    if report.summary.is_empty() or not report.summary["devices"][0]:
        return Html("")
    row = report.summary.row(0, named=True)
    unit = HoursUnit.for_hours(row["device_hours"])
    cards = [
        (unit.format(row["device_hours"]), f"{unit.name} traced"),
        (pct(row["utilisation_pct"]), "utilisation (compute / span)"),
        (pct(100 * row["exposed_communication_hours"] / row["device_hours"]) if row["device_hours"] else "",
         "exposed communication"),
        (pct(100 * row["idle_hours"] / row["device_hours"]) if row["device_hours"] else "", "idle"),
        (pct(row["wasted_pct"]), "wasted (idle + exposed communication)"),
    ]
    if row["mfu_pct"] is not None:
        cards.append((pct(row["mfu_pct"]), "MFU (FLOPs / peak)"))
    return tag("div", *(tag("div", tag("div", value, class_="value"), tag("div", label, class_="label"),
                                class_="card") for value, label in cards), class_="cards")


def _breakdown(report: JobReport) -> Html:
    whole = report.analysis.breakdown
    title = "Where the device time went, per rank"
    if whole.is_empty():
        return section(title, note("This job's traces have no device operations (NCCL logs, nccl-tests)."))
    labels = [plot_text(label) for label in _rank_labels(whole)]
    fig = go.Figure([
        go.Bar(name=name, x=labels, y=(whole[column].fill_null(0) / 1e6).to_list(), marker_color=colour,
               hovertemplate="%{x}: %{y:,.2f} ms " + name + "<extra></extra>")
        for column, name, colour in BUCKETS
    ])
    fig.update_layout(barmode="stack", yaxis_title="ms", legend={"orientation": "h", "y": -0.15})
    span = pl.col("span_ns")

    def share(column: str) -> pl.Expr:
        return pl.when(span > 0).then(100 * pl.col(column) / span).alias(column)

    labels_text = _rank_labels(whole)
    # docs/analyses.md, "Breakdown": the exclusive buckets add up to the span; the inclusive unions overlap
    total = pl.sum_horizontal(pl.col(c).fill_null(0) for c, _, _ in BUCKETS)
    exclusive = whole.select(span, *(share(c) for c, _, _ in BUCKETS),
                             pl.when(span > 0).then(100 * total / span).alias("total"))
    rows = [[label, ms(r[0], 2), *(pct(v) for v in r[1:])] for label, r in zip(labels_text, exclusive.rows())]
    columns = [Column("rank"), Column("span", "num"), *(Column(name, "num") for _, name, _ in BUCKETS),
               Column("total", "num")]
    inclusive = whole.select(share("compute_ns"), share("communication_ns"), share("exposed_communication_ns"),
                             "overlap_pct", share("memory_ns"), "flops_utilisation_pct")
    inclusive_rows = [[label, *(pct(v) for v in r)] for label, r in zip(labels_text, inclusive.rows())]
    inclusive_columns = [Column("rank"), Column("compute", "num"), Column("communication", "num"),
                         Column("exposed comm.", "num"), Column("share of comm. hidden", "num"),
                         Column("memory", "num"), Column("FLOPs util.", "num")]
    return section(title, note("Exclusive buckets of each rank's span, as the chart stacks them: each instant "
                               "counts in one bucket, so they add up to 100% of the span."),
                   figure(fig, "breakdown", 420), tag("div", table(columns, rows), id="breakdown-exclusive"),
                   note("Inclusive, per class of op (% of the span): time when two classes overlap counts in "
                        "both, so these do not add up. Exposed communication is communication that no compute "
                        "overlaps; the share hidden is of the communication time."),
                   tag("div", table(inclusive_columns, inclusive_rows), id="breakdown-inclusive"), id_="breakdown")


def _steps(report: JobReport) -> Html:
    steps = report.steps
    title = "Steps"
    if steps.is_empty():
        return section(title, note("No steps in this job's traces (no ProfilerStep annotations or XLA step line)."))
    mean = steps.group_by("step").agg(pl.col(c).mean() for c, _, _ in BUCKETS).sort("step")
    per_step = go.Figure([
        go.Bar(name=name, x=mean["step"].to_list(), y=(mean[column].fill_null(0) / 1e6).to_list(),
               marker_color=colour, hovertemplate="step %{x}: %{y:,.2f} ms " + name + "<extra></extra>")
        for column, name, colour in BUCKETS
    ])
    per_step.update_layout(barmode="stack", xaxis_title="step", yaxis_title="ms (mean over ranks)",
                           legend={"orientation": "h", "y": -0.2}, title="Each step's time, mean over ranks")
    lines = go.Figure()
    by = ["run"] if "run" in steps.columns else []
    timelines = steps.select(*by, "trace_id", "rank").unique().sort(*by, "rank", "trace_id")
    if timelines.height <= LINES_PER_RANK:
        for label, (trace_id, rank) in zip(_rank_labels(timelines), timelines.select("trace_id", "rank").rows()):
            mine = steps.filter((pl.col("trace_id") == trace_id) & (pl.col("rank") == rank)).sort("step")
            lines.add_trace(go.Scatter(name=plot_text(label), x=mine["step"].to_list(),
                                       y=(mine["span_ns"] / 1e6).to_list(), mode="lines+markers",
                                       hovertemplate=plot_text(label) + ", step %{x}: %{y:,.2f} ms<extra></extra>"))
    else:
        spread = steps.group_by("step").agg(
            pl.col("span_ns").min().alias("fastest rank"), pl.col("span_ns").median().alias("median rank"),
            pl.col("span_ns").max().alias("slowest rank")).sort("step")
        for name in ("fastest rank", "median rank", "slowest rank"):
            lines.add_trace(go.Scatter(name=name, x=spread["step"].to_list(), y=(spread[name] / 1e6).to_list(),
                                       mode="lines+markers"))
    lines.update_layout(xaxis_title="step", yaxis_title="step time on the device, ms",
                        title="Step time per rank")
    if mean.height <= 30:  # whole steps only on the axis
        for chart in (per_step, lines):
            chart.update_xaxes(dtick=1)
    flagged = report.analysis.step_outliers
    outliers, warm = flagged.filter(~pl.col("warmup")), flagged.filter(pl.col("warmup"))
    remark = note(f"{outliers.height} step(s) run far slower than their rank's median; the worst is step "
                  f"{outliers['step'][0]} on rank {outliers['rank'][0]} ({ms(outliers['dur_ns'][0])}).") \
        if outliers.height else note("No step runs far slower than its rank's median.")
    warmup = note(f"Warm-up: the first profiled step runs far slower than the later ones on {warm.height} "
                  f"rank(s) (step {warm['step'][0]} on rank {warm['rank'][0]}: {ms(warm['dur_ns'][0])}); it is "
                  "not counted as an outlier (docs/analyses.md, \"Steps\").") if warm.height else Html("")
    return section(title, figure(per_step, "steps", 380), figure(lines, "step-timeline", 360), remark, warmup,
                   id_="steps")


def _idle(report: JobReport) -> Html:
    idle = report.analysis.idle_by_stream
    title = "Idle time by cause"
    if idle.is_empty():
        return section(title, note("No idle gaps recorded (no streams with more than one op)."))
    main = idle.sort("op_ns", descending=True).group_by("trace_id", "rank", maintain_order=True).first().sort(
        "rank", "trace_id")
    labels = [plot_text(f"{label}, stream {s}") for label, s in zip(_rank_labels(main), main["stream"].to_list())]
    fig = go.Figure([
        go.Bar(name=name, x=labels, y=(main[column].fill_null(0) / 1e6).to_list(), marker_color=COLOURS[key],
               hovertemplate="%{x}: %{y:,.2f} ms " + name + "<extra></extra>")
        for column, name, key in (("host_wait_ns", "waiting for the host to launch", "host_wait"),
                                  ("kernel_wait_ns", "short launch gaps", "kernel_wait"),
                                  ("other_ns", "other (synchronisation, dependencies)", "other"))
    ])
    fig.update_layout(barmode="stack", yaxis_title="idle ms", legend={"orientation": "h", "y": -0.2})
    return section(title, note("Gaps between ops on each rank's busiest stream, by cause (docs/analyses.md); "
                               "other streams, such as a communication stream between collectives, are idle by "
                               "design."), figure(fig, "idle", 380), id_="idle")


def _stragglers(report: JobReport) -> Html:
    late = report.lateness
    title = "Stragglers: who arrives late at collectives"
    if late.is_empty():
        return section(title, note("No collective seen on more than one rank."))
    if "run" not in late.columns:
        late = late.with_columns(pl.lit(None, dtype=pl.String).alias("run"))
    instances = late.select("run", "process_group", "seq", "collective", "first_ns").unique().sort(
        "first_ns", "run", "process_group", "seq")
    total = instances.height
    instances = instances.head(HEATMAP_INSTANCES).with_row_index("column")
    groups = instances["process_group"].n_unique()
    names = [plot_text(f"{c} {pg}:{s}" if groups > 1 else f"{c} #{s}")
             for pg, s, c in instances.select("process_group", "seq", "collective").rows()]
    cells = late.join(instances.select("run", "process_group", "seq", "column"), on=["run", "process_group", "seq"],
                      nulls_equal=True)
    ranks = sorted(set(cells.select("run", "rank").rows()), key=lambda k: (k[0] or "", k[1]))
    row_of = {r: i for i, r in enumerate(ranks)}
    z: list[list[float | None]] = [[None] * instances.height for _ in ranks]
    for run, rank, column, lateness in cells.select("run", "rank", "column", "lateness_ns").rows():
        z[row_of[(run, rank)]][column] = lateness / 1e3
    fig = go.Figure(go.Heatmap(
        z=z, x=names, y=[f"{run} rank {r}" if run else f"rank {r}" for run, r in ranks], colorscale="Reds", colorbar={"title": {"text": "late by, us"}},
        hovertemplate="%{y}, %{x}: %{z:,.1f} us after the first rank<extra></extra>", hoverongaps=False))
    fig.update_layout(xaxis={"title": "collective (in time order)", "showticklabels": total <= 60},
                      yaxis={"autorange": "reversed"})
    shown = note(f"Showing the first {HEATMAP_INSTANCES:,} of {total:,} collectives.") if total > HEATMAP_INSTANCES \
        else Html("")
    arrivals = report.analysis.last_arrivals
    rows = [[f"{r['run']} rank {r['rank']}" if r.get("run") else f"rank {r['rank']}", r["times_last"], r["collectives"],
             pct(100 * r["times_last"] / r["collectives"] if r["collectives"] else None), number(r["mean_skew_us"])]
            for r in arrivals.to_dicts()]
    columns = [Column("rank"), Column("times last", "num"), Column("of collectives", "num"),
               Column("share", "num"), Column("mean lateness of the others, us", "num")]
    return section(title, note("How long after the first rank each rank starts each collective; a row that stays "
                               "dark is a straggler every other rank waits for."),
                   figure(fig, "stragglers", max(260, 60 + 22 * len(ranks))), shown,
                   table(columns, rows) if rows else note("No rank arrives last."), id_="stragglers")


def _kernels(report: JobReport) -> Html:
    top = report.analysis.top_kernels
    title = "Top kernels"
    if top.is_empty():
        return section(title, note("No kernels in this job's traces."))
    rows = [[_kernel_name(r["name"]), r["category"], f"{r['count']:,}", ms(r["total_ns"], 2), number((r["mean_ns"] or 0) / 1e3),
             number((r["p95_ns"] or 0) / 1e3), pct(r["share_pct"])] for r in top.to_dicts()]
    columns = [Column("kernel", "name"), Column("category"), Column("count", "num"), Column("total", "num"),
               Column("mean, us", "num"), Column("p95, us", "num"), Column("share", "num")]
    return section(title, note("Device time per kernel over every rank (syncs excluded); the last row holds "
                               "the rest."), table(columns, rows), id_="kernels")


def _kernel_name(name: str | None) -> Html:
    """A kernel name whole (the cell wraps it): two kernels that differ only near the end must read differently."""
    return esc(name or "")


#: Input shapes longer than this (an optimizer's tensor lists) are cut in the operators table.
SHAPES_CHARS = 160


def _operators(report: JobReport) -> Html:
    """The top operators over every rank (docs/analyses.md, "Operators"); nothing without ``op_stats`` rows."""
    top = report.analysis.top_operators
    if top.is_empty():
        return Html("")
    rows = [[esc(r["op"]), _cut(r["input_shapes"]), r["dtype"] or "", f"{r['count']:,}", ms(r["device_ns"], 2),
             pct(r["share_pct"]), number(r["achieved_tflops"]), pct(r["pct_of_roofline"]), r["bound"] or ""]
            for r in top.to_dicts()]
    columns = [Column("operator", "name"), Column("input shapes", "name"), Column("dtype"), Column("calls", "num"),
               Column("device time", "num"), Column("share", "num"), Column("TFLOP/s", "num"),
               Column("of roofline", "num"), Column("bound")]
    return section("Top operators", note("Device time of the kernels each PyTorch operator launched, summed over "
                                         "every rank (\"(no operator)\": kernels no operator launched); TFLOP/s from "
                                         "estimated FLOPs, empty where there is no estimate; % of the compute or "
                                         "memory roofline of the device. The last row holds the rest."),
                   table(columns, rows), id_="operators")


def _cut(text: str | None) -> str:
    """Input shapes text, cut to :data:`SHAPES_CHARS` with an ellipsis."""
    return "" if text is None else text if len(text) <= SHAPES_CHARS else text[:SHAPES_CHARS - 1] + "…"


def _bandwidth(report: JobReport) -> Html:
    inst = report.analysis.collectives.filter(pl.col("busbw_gbs").is_not_null() & (pl.col("message_bytes") > 0))
    title = "Collective bandwidth against the link's peak"
    if inst.is_empty():
        return section(title, note("No collective with a transfer time and a size."))
    if inst.height > BANDWIDTH_POINTS:
        inst = inst.sample(BANDWIDTH_POINTS, seed=0)
    fig = go.Figure()
    for (name,), rows in inst.sort("collective").group_by("collective", maintain_order=True):
        fig.add_trace(go.Scatter(
            name=plot_text(name), x=rows["message_bytes"].to_list(), y=rows["busbw_gbs"].to_list(), mode="markers",
            customdata=[[plot_text(pg), s, t / 1e3] for pg, s, t in rows.select("process_group", "seq", "transfer_ns")
                        .rows()],
            hovertemplate=(plot_text(str(name)) + " %{customdata[0]}:%{customdata[1]}: %{x:,} bytes, "
                           "%{y:,.1f} GB/s in %{customdata[2]:,.1f} us<extra></extra>")))
    if report.link_peak_gbs:
        fig.add_hline(y=report.link_peak_gbs, line_dash="dash", line_color="#5b6673",
                      annotation_text=plot_text(f"{report.link} peak {report.link_peak_gbs:,.0f} GB/s"))
    fig.update_layout(xaxis={"type": "log", "title": "message size, bytes"}, yaxis_title="bus bandwidth, GB/s")
    peak = report.link_peak_gbs
    buckets = report.analysis.bandwidth_by_size
    rows_out: list[list[Any]] = [
        [r["collective"], r["bucket"], r["instances"], number(r["median_busbw_gbs"]), number(r["min_busbw_gbs"]),
         pct(100 * r["median_busbw_gbs"] / peak) if peak else "", ms(r["total_transfer_ns"], 2)]
        for r in buckets.to_dicts()
    ]
    columns = [Column("collective", "name"), Column("size from"), Column("instances", "num"),
               Column("median busbw, GB/s", "num"), Column("min busbw, GB/s", "num"), Column("of peak", "num"),
               Column("transfer time", "num")]
    link_note = (f"Peak: {report.link} at {peak:,.0f} GB/s (TRACELAKE_LINK_PEAKS)." if peak else
                 f"{report.link_note or 'No peak known for this link'}: no share of a peak is shown "
                 "(set it with TRACELAKE_LINK_PEAKS, e.g. nvlink4=450, ib=400, ici=...).")
    return section(title, note("Bus bandwidth of each collective instance: its size over the shortest duration "
                               "across ranks (the others include waiting). " + link_note),
                   figure(fig, "bandwidth", 400), table(columns, rows_out), id_="bandwidth")


def _nccl_benchmarks(report: JobReport) -> Html:
    bench = report.analysis.nccl_benchmarks
    if bench.is_empty():
        return Html("")
    rows = [[r["collective"], "in-place" if r["in_place"] else "out-of-place", r["ranks"], r["nodes"],
             number(r["peak_busbw_gbs"]), r["peak_at_bytes"], r["link"], pct(r["peak_share_pct"], 0)]
            for r in bench.to_dicts()]
    columns = [Column("collective", "name"), Column("placement"), Column("ranks", "num"), Column("nodes", "num"),
               Column("peak busbw, GB/s", "num"), Column("at bytes", "num"), Column("link"),
               Column("of link", "num")]
    return section("nccl-tests", table(columns, rows), id_="nccl-tests")


def _traces(report: JobReport) -> Html:
    traces = report.traces.sort(*(["run"] if "run" in report.traces.columns else []), "rank", "source_name",
                                nulls_last=True)
    rows = [[tag("code", r["trace_id"]), r.get("run") or "", r["rank"], r["format"], r["source_name"], r["host"],
             r["device_name"], r["ingested_at"].strftime("%Y-%m-%d %H:%M") if r["ingested_at"] else ""]
            for r in traces.to_dicts()]
    columns = [Column("trace"), Column("run"), Column("rank", "num"), Column("format"), Column("file", "name"),
               Column("host"), Column("device"), Column("ingested (UTC)")]
    labels = {k: v for r in traces["labels"].to_list() for k, v in _label_items(r)}
    label_line = note(concat(["Labels: ", ", ".join(f"{k}={v}" for k, v in sorted(labels.items()))])) if labels \
        else Html("")
    return section("Traces", label_line, table(columns, rows), id_="traces")


def _label_items(labels: object) -> list[tuple[str, str]]:
    """A traces row's labels (a dict, or key/value entries) as pairs."""
    if isinstance(labels, dict):
        return [(str(k), str(v)) for k, v in labels.items()]
    if isinstance(labels, list):
        return [(str(e["key"]), str(e["value"])) for e in labels if isinstance(e, dict)]
    return []

