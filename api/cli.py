"""The ``tracelake`` command: a thin adapter over :class:`tracelake.warehouse.Warehouse`.

Every command maps :class:`TracelakeError` to a one-line message and an exit code
in one place (:func:`_errors`); no traceback reaches the user for bad input.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, ParamSpec, TypeVar

import polars as pl
import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from tracelake.analysis import findings, overview
from tracelake.analysis.graphs import graph_summary
from tracelake.warehouse import IngestResult, InvalidArgument, NotFound, Settings, TracelakeError, Warehouse
from tracelake.warehouse.distributed import (
    SCHEDULER_ENV,
    ClusterTarget,
    dask_available,
    dask_client,
    resolve_target,
    warehouse_path,
)
from tracelake.warehouse.results import QueryResult
from tracelake.warehouse.schema import TABLES
from tracelake.warehouse.store import is_warehouse, parse_labels
from tracelake.warehouse.trace_ids import short_ids

from . import cli_render
from .cli_help import WordsGroup
from .output import OutputFormat, jsonable, to_csv, to_json, to_table

P = ParamSpec("P")
R = TypeVar("R")

app = typer.Typer(
    name="tracelake",
    cls=WordsGroup,
    help="Ingest ML training and inference traces (PyTorch profiler, ...) into a Parquet + DuckDB "
    "warehouse and find where the time goes.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
console = Console()
err_console = Console(stderr=True)

HomeOption = Annotated[
    Path | None,
    typer.Option("--home", envvar="TRACELAKE_HOME", help="Warehouse directory (default: ~/.tracelake).",
                 show_default=False),
]
FormatOption = Annotated[OutputFormat, typer.Option("--format", "-f", help="Output format.")]


def _errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn tracelake errors into a message on stderr and the error's exit code."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except TracelakeError as exc:
            err_console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
            raise typer.Exit(exc.exit_code) from None

    return wrapper


def _warehouse(home: Path | None, *, existing: bool = False) -> Warehouse:
    """The warehouse at ``home``; with ``existing`` (read commands) one that is there already, never a new one."""
    settings = Settings.from_env(home=home)
    if existing and not is_warehouse(settings.home_path):
        raise NotFound(f"no warehouse at {settings.home_path}: check --home (or TRACELAKE_HOME), or ingest into it "
                       "first")
    return Warehouse(settings=settings)


def _print_result(result: QueryResult, fmt: OutputFormat, title: str | None = None) -> None:
    if fmt is OutputFormat.json:
        sys.stdout.write(to_json(result) + "\n")
    elif fmt is OutputFormat.csv:
        sys.stdout.write(to_csv(result))
    else:
        console.print(to_table(result, title=title))


class _BarProgress:
    """Draws one rich progress bar over bytes and files for a multi-file ingest."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.task: TaskID | None = None
        self.total_files = 0
        self.done_files = 0

    def start(self, files: list[tuple[Path, int]]) -> None:
        self.total_files = len(files)
        self.task = self.progress.add_task("ingest", total=sum(size for _, size in files) or None,
                                           files=f"0/{self.total_files} files")

    def file_started(self, path: Path) -> None:
        if self.task is not None:
            name = path.name if len(path.name) <= 32 else path.name[:29] + "..."
            self.progress.update(self.task, description=escape(name))

    def advance(self, nbytes: int) -> None:
        if self.task is not None:
            self.progress.advance(self.task, nbytes)

    def file_done(self, result: IngestResult) -> None:
        self.done_files += 1
        if self.task is not None:
            self.progress.update(self.task, files=f"{self.done_files}/{self.total_files} files")
        if result.status == "failed":
            self.progress.console.print(f"[red]failed[/] {escape(cli_render.failure_line(result.path, result.error))}",
                                        highlight=False, soft_wrap=True)
        for warning in result.warnings:
            self.progress.console.print(f"[yellow]warning[/] {escape(f'{result.path}: {warning}')}", highlight=False)


@contextmanager
def _progress_bar(enabled: bool) -> Iterator[_BarProgress | None]:
    if not enabled:
        yield None
        return
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TextColumn("{task.fields[files]}"),
        TimeRemainingColumn(),
        console=err_console,
        transient=True,
    )
    with progress:
        yield _BarProgress(progress)


@contextmanager
def _count_bar(description: str, total: int, enabled: bool) -> Iterator[Callable[[str], None]]:
    """A progress bar over ``total`` items; yields the callback that counts one done."""
    if not enabled:
        yield lambda _: None
        return
    progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeRemainingColumn(), console=err_console, transient=True)
    with progress:
        task = progress.add_task(description, total=total)
        yield lambda _: progress.advance(task)


def _ingest_summary(results: list[IngestResult], seconds: float) -> None:
    ingested = [r for r in results if r.status == "ingested"]
    duplicates = [r for r in results if r.status == "duplicate"]
    failed = [r for r in results if r.status == "failed"]
    for r in duplicates:
        console.print(f"[dim]skipped[/] {escape(str(r.path))}: already ingested as {r.trace_id} (job {r.job})",
                      highlight=False, soft_wrap=True)
    mb = sum(r.uncompressed_bytes for r in ingested) / 1e6
    rows = sum(sum(r.rows.values()) for r in ingested)
    rate = f", {mb / seconds:.1f} MB/s" if seconds > 0 and mb else ""
    console.print(
        f"[green]{len(ingested)} ingested[/], {len(duplicates)} already there, "
        f"[{'red' if failed else 'green'}]{len(failed)} failed[/] "
        f"({mb:.1f} MB of trace data, {rows:,} rows in {seconds:.2f}s{rate})",
        highlight=False,
        soft_wrap=True,
    )


WorkersOption = Annotated[int | None, typer.Option(
    "--workers", "-w", min=1, show_default=False,
    help="Start a local Dask cluster of this many worker processes (without Dask installed: a process pool).")]
SchedulerOption = Annotated[str | None, typer.Option(
    "--scheduler", show_default=False,
    help=f"Run on the Dask cluster at this address, e.g. tcp://host:8786 (default: ${SCHEDULER_ENV}, "
    "else this process).")]


def _cluster_target(scheduler: str | None, workers: int | None) -> tuple[ClusterTarget, int]:
    """Where ingest or recompute runs, and the local process-pool size for ``--workers`` without Dask."""
    target = resolve_target(scheduler, workers, os.environ)
    if target.workers is not None and not dask_available():
        return ClusterTarget(), target.workers
    return target, 1


@app.command()
@_errors
def ingest(
    paths: Annotated[list[Path], typer.Argument(help=(
        "Trace files or directories of them: Kineto .json(.gz), XLA .xplane.pb/.trace.json.gz, NCCL logs, "
        "nccl-tests output, Inspector/profiler-plugin dumps, Flight Recorder dumps."),
                                                show_default=False)],
    job: Annotated[str, typer.Option("--job", "-j", help="Job name to file the traces under.")] = "default",
    label: Annotated[list[str] | None, typer.Option("--label", "-l", help="A key=value label; repeatable.",
                                                    show_default=False)] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
    workers: WorkersOption = None,
    scheduler: SchedulerOption = None,
    home: HomeOption = None,
) -> None:
    """Ingest trace files into the warehouse.

    Exit code 0 when every input ingested (or was already there), 1 when any failed;
    the others are ingested either way, and each failure is printed as `path: what went wrong`.
    With --scheduler (or DASK_SCHEDULER_ADDRESS) or --workers, each file is a Dask task
    (docs/scale-out.md); workers must see the inputs and the warehouse at the same paths.
    """
    labels = parse_labels(label)
    target, pool = _cluster_target(scheduler, workers)
    warehouse = _warehouse(warehouse_path(home) if home is not None else None)
    started = time.perf_counter()
    with dask_client(target) as client, _progress_bar(not quiet and err_console.is_terminal) as bar:
        if client is not None and not quiet:
            err_console.print(f"ingesting on {escape(target.describe())}", highlight=False, soft_wrap=True)
        report = warehouse.ingest(paths, job=job, labels=labels, progress=bar, workers=pool, client=client)
    if bar is None:
        for r in report.failed:
            err_console.print(f"[red]failed[/] {escape(cli_render.failure_line(r.path, r.error))}", highlight=False,
                              soft_wrap=True)
        for r in report.results:
            for warning in r.warnings:
                err_console.print(f"[yellow]warning[/] {escape(f'{r.path}: {warning}')}", highlight=False,
                                  soft_wrap=True)
    if not report.results:
        err_console.print("[red]error:[/] no trace files found in the given paths")
        raise typer.Exit(1)
    _ingest_summary(report.results, time.perf_counter() - started)
    if not report.ok:
        raise typer.Exit(1)


@app.command()
@_errors
def traces(
    job: Annotated[str | None, typer.Option("--job", "-j", help="Only this job's traces.")] = None,
    fmt: FormatOption = OutputFormat.table,
    home: HomeOption = None,
) -> None:
    """List ingested traces.

    `ranks` are the ranks a trace holds: one for a PyTorch rank file, one per device of an XLA
    profile (as `analyze` shows them); `rank` is the lowest. In a narrow terminal the table shows
    unique id prefixes, which every command takes.
    """
    warehouse = _warehouse(home, existing=True)
    sql = (  # ranks from the stored breakdown: an XLA profile holds a rank per device (docs/formats.md)
        "SELECT trace_id, job, rank, coalesce(r.ranks, [rank]) AS ranks, format, source_name, device_name, "
        "device_op_count, round((end_ns - start_ns) / 1e6, 3) AS span_ms, ingested_at FROM traces LEFT JOIN ("
        "SELECT trace_id, list(DISTINCT rank ORDER BY rank) AS ranks FROM breakdown WHERE step IS NULL "
        "GROUP BY trace_id) r USING (trace_id)"
    )
    params: list[Any] = []
    if job:
        sql += " WHERE job = ?"
        params.append(job)
    result = warehouse.query(sql + " ORDER BY job, rank, source_name", params)
    run_of = {t["trace_id"]: t["run"] for t in warehouse.traces(job)}  # docs/analyses.md, "Runs within a job"
    result = QueryResult([*result.columns[:2], "run", *result.columns[2:]], [*result.types[:2], "VARCHAR",
                         *result.types[2:]], [(*row[:2], run_of.get(row[0]), *row[2:]) for row in result.rows])
    title = f"{len(result.rows)} traces in {warehouse.home}"
    if fmt is not OutputFormat.table:
        _print_result(result, fmt, title=title)
        return
    rows = [dict(zip(result.columns, row)) for row in result.rows]
    for row in rows:
        row["ranks"] = cli_render.rank_ranges(row["ranks"] or [])
    width = short_ids([r["trace_id"] for r in rows], [t["trace_id"] for t in warehouse.traces()])
    console.print(cli_render.traces_table(rows, title, console, width))


@app.command()
@_errors
def sql(
    query: Annotated[str, typer.Argument(help=f"One SELECT over the tables: {', '.join(TABLES)} (docs/schema.md; "
                                              "your own files too: read_parquet('x.parquet')).", show_default=False)],
    fmt: FormatOption = OutputFormat.table,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write the result to this .parquet, .csv or "
                                             ".json file (DuckDB's COPY) instead of printing it.",
                                             show_default=False)] = None,
    home: HomeOption = None,
) -> None:
    """Run one SQL query over the warehouse (DuckDB dialect); it can read, never change, the warehouse.

    Queries run with the API's checks in a process that may write nothing: COPY, ATTACH,
    CREATE and the like are refused (export with --out).
    """
    result = _warehouse(home, existing=True).query_local(query, out=out)
    if out is not None:
        err_console.print(f"wrote {result.rows[0][0]} rows to {result.rows[0][1]}", highlight=False, markup=False)
        return
    _print_result(result, fmt)


@app.command()
@_errors
def analyze(
    trace_id: Annotated[str | None, typer.Argument(help="A trace id or a unique prefix of it, 4 characters at least "
                                                        "(see `tracelake traces`).",
                                                   show_default=False)] = None,
    job: Annotated[str | None, typer.Option("--job", "-j", help="Analyse every trace of this job.")] = None,
    recompute: Annotated[bool, typer.Option("--recompute", help="Recompute the stored analyses of every "
                                            "trace (of --job, if given) first.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
    workers: WorkersOption = None,
    scheduler: SchedulerOption = None,
    home: HomeOption = None,
) -> None:
    """Show where the time went: the breakdown per rank and the findings, largest gain first.

    With --recompute, --scheduler (or DASK_SCHEDULER_ADDRESS) or --workers recompute one
    trace per Dask task (docs/scale-out.md).
    """
    if not recompute and (scheduler or workers is not None):
        raise InvalidArgument("--scheduler and --workers apply to --recompute only")
    warehouse = _warehouse(warehouse_path(home) if home is not None else None, existing=True)
    if recompute:
        target, _ = _cluster_target(scheduler, workers)  # without Dask, --workers recomputes in process
        total = warehouse.count_traces(job=job)
        with dask_client(target) as client, _count_bar("recompute", total, err_console.is_terminal) as tick:
            count = warehouse.recompute(job=job, client=client, on_trace=tick)
        err_console.print(f"recomputed the analyses of {count} traces", highlight=False)
        if trace_id is None and job is None:
            return
    result = warehouse.analyze(trace_id=trace_id, job=job)
    if as_json:
        sys.stdout.write(json.dumps(jsonable(result.as_dict()), indent=2) + "\n")
        return
    whole, colls = result.breakdown, result.collectives
    if result.runs.height > 1:  # docs/analyses.md, "Runs within a job": every table below is per run
        console.print(to_table(_frame_result(result.runs.select("run", "rule", "traces", "ranks", "world_size", (
            (pl.col("end_ns") - pl.col("start_ns")) / 1e6).round(2).alias("span ms"))), title="runs in this job"))
    for warning in result.runs["warning"].drop_nulls().to_list() if "warning" in result.runs.columns else []:
        err_console.print(f"warning: {warning}", highlight=False, markup=False, soft_wrap=True)
    if whole.height:  # docs/analyses.md, "Breakdown": exclusive buckets add up to the span, inclusive ones overlap
        console.print(to_table(_frame_result(cli_render.exclusive_view(whole)),
                               title="where the device time went, per rank: % of span, exclusive buckets (they add "
                               "up to 100; compute+comm: communication hidden by compute; other mix: with memory ops)"))
        console.print(to_table(_frame_result(cli_render.inclusive_view(whole)),
                               title="per op class, % of span, inclusive (overlapping time counts in each class)"))
    _print_findings(result.findings)
    if result.bandwidth_by_size.height:
        console.print(to_table(_frame_result(result.bandwidth_by_size.select(
            "collective", pl.col("bucket").alias("size from"), "instances",
            pl.col("median_busbw_gbs").round(1).alias("median busbw GB/s"),
            pl.col("min_busbw_gbs").round(1).alias("min busbw GB/s"),
            (pl.col("total_transfer_ns") / 1e6).round(2).alias("total ms"),
        )), title="collective bus bandwidth by message size"))
    for row in result.topology.to_dicts():
        console.print(f"NCCL topology: {row['ranks']} ranks on {row['nodes']} node(s), {row['gpus_per_node']} GPUs per "
                      f"node, {row['channels']} channels, transports {row['transports']}", highlight=False,
                      markup=False, soft_wrap=True)
    if result.nccl_tuning.height:
        choices = result.nccl_tuning.group_by("algorithm", "protocol").len().sort("len", descending=True)
        mix = ", ".join(f"{r['algorithm'] or '?'}/{r['protocol'] or '?'} x{r['len']}" for r in choices.to_dicts())
        console.print(f"NCCL records joined to {result.nccl_tuning.height} profiled collectives: {mix}",
                      highlight=False, markup=False, soft_wrap=True)
    if result.nccl_benchmarks.height:
        console.print()
        console.print(to_table(_frame_result(_nccl_view(result.nccl_benchmarks)), title="nccl-tests bus bandwidth"))
    if colls.height:
        busbw = colls.select(pl.col("busbw_gbs").median()).item()
        skew_us = float(colls.select(pl.col("skew_ns").median()).item() or 0) / 1e3
        bandwidth = f", median busbw {busbw:,.1f} GB/s" if busbw is not None else ""
        console.print(
            f"collectives: {colls.height} instances across ranks{bandwidth}, median arrival skew {skew_us:,.1f} us",
            highlight=False, soft_wrap=True,
        )
    if result.graphs.height:  # docs/analyses.md, "Launches", "CUDA/HIP graphs"
        console.print(to_table(_frame_result(graph_summary(result.graphs).select(
            "rank", "launches", pl.col("kernels_per_launch").round(1).alias("kernels/launch"),
            (pl.col("device_ns_per_launch") / 1e6).round(3).alias("device ms/launch"),
            (pl.col("span_ns_per_launch") / 1e6).round(3).alias("span ms/launch"),
            pl.col("gaps_pct").round(1).alias("gaps % of span"),
            (pl.col("call_ns_per_launch") / 1e3).round(1).alias("launch call us"),
            (pl.col("mean_delay_ns") / 1e3).round(1).alias("delay us"))),
            title="CUDA/HIP graph launches, per rank (one row each: --json)"))
    if result.top_kernels.height:
        console.print()
        console.print(to_table(_frame_result(_kernels_view(result.top_kernels)),
                               title="top kernels, all ranks (whole names: --json)"))


def _nccl_view(summary: Any) -> Any:
    return summary.select(
        "collective", pl.when(pl.col("in_place")).then(pl.lit("in-place")).otherwise(pl.lit("out-of-place"))
        .alias("placement"), "ranks", "nodes",
        pl.col("peak_busbw_gbs").round(1).alias("peak busbw GB/s"),
        (pl.col("peak_at_bytes") / 2**20).round(1).alias("at MiB"),
        (pl.col("half_peak_bytes") / 2**20).round(2).alias("half peak from MiB"),
        pl.col("small_time_us").round(1).alias("latency us"),
        pl.col("link"), pl.col("peak_share_pct").round(0).alias("% of link"),
    )


@app.command()
@_errors
def diff(
    a: Annotated[str, typer.Argument(help="Baseline: a trace id (or a unique prefix) or a job name.",
                                     show_default=False)],
    b: Annotated[str, typer.Argument(help="Compared: a trace id (or a unique prefix) or a job name.",
                                     show_default=False)],
    top: Annotated[int, typer.Option("--top", "-n", help="Kernels to list.")] = 15,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
    home: HomeOption = None,
) -> None:
    """Compare two traces or jobs: time per rank by category, then kernel by kernel (biggest change first)."""
    kernels_frame, categories = _warehouse(home, existing=True).diff(a, b)
    if as_json:
        sys.stdout.write(json.dumps(jsonable({
            "categories": categories.to_dicts(), "kernels": kernels_frame.head(top).to_dicts(),
        }), indent=2) + "\n")
        return
    ms = [(pl.col(c) / 1e6).round(3).alias(c.replace("_ns", "_ms")) for c in ("a_ns", "b_ns", "delta_ns")]
    console.print(to_table(_frame_result(categories.select(
        pl.col("metric").str.replace("_ns$", ""), *ms, pl.col("ratio").round(3))),
        title=f"per rank: {a} (a) vs {b} (b)"))
    shown = kernels_frame.head(top)
    labels = cli_render.kernel_labels(shown["name"].to_list(), cli_render.kernel_width(console.width))
    console.print(to_table(_frame_result(shown.select(
        pl.Series("kernel", labels, dtype=pl.String), "change", *ms, pl.col("ratio").round(3))),
        title="kernels, biggest change first (whole names: --json)"))


def _print_findings(found: list[findings.Finding]) -> None:
    if not found:
        console.print("no findings: nothing exposed, idle or late stands out", highlight=False)
    for f in found:
        gain = f" (fixing it saves up to {f.gain_ns / 1e6:,.1f} ms)" if f.gain_ns > 0 else ""
        console.print(f"- [bold]{escape(f.title)}[/]: {escape(f.detail)}{gain}", highlight=False, soft_wrap=True)


def _kernels_view(top: Any) -> Any:
    labels = cli_render.kernel_labels(top["name"].to_list(), cli_render.kernel_width(console.width))
    return top.select(
        pl.Series("kernel", labels, dtype=pl.String), pl.col("category").str.slice(0, 7).alias("kind"), "count",
        (pl.col("total_ns") / 1e6).round(2).alias("total ms"),
        (pl.col("mean_ns") / 1e3).round(1).alias("mean us"),
        pl.col("share_pct").round(1).alias("share %"),
    )


@app.command()
@_errors
def demo(
    home: Annotated[Path, typer.Option("--home", help="Fresh warehouse directory for the demo (replaced if "
                                       "it holds an earlier demo).")] = Path("tracelake-demo"),
) -> None:
    """Ingest the bundled sample traces into a fresh warehouse and show what they reveal."""
    _fresh_demo_home(home)
    warehouse = Warehouse(settings=Settings.from_env(home=home))
    samples = resources.files("tracelake.sample_traces")
    started = time.perf_counter()
    results: list[IngestResult] = []
    with resources.as_file(samples) as folder:
        # PyTorch profiler (Kineto) scenarios, then the XLA (TPU) one
        scenarios = [p for kind in ("kineto", "xla") for p in sorted((Path(folder) / kind).iterdir()) if p.is_dir()]
        with _progress_bar(err_console.is_terminal) as bar:
            for scenario in scenarios:
                report = warehouse.ingest([scenario], job=f"demo-{scenario.name}", progress=bar)
                results.extend(report.results)
    _ingest_summary(results, time.perf_counter() - started)
    for scenario in scenarios:
        job = f"demo-{scenario.name}"
        con = warehouse.connect()
        try:
            summary = overview.rank_summary(con, job)
        finally:
            con.close()
        console.print()
        console.print(to_table(_frame_result(summary), title=f"job {job}: device time per rank"))
        _print_findings(warehouse.analyze(job=job).findings)
    console.print()
    console.print(f"Warehouse: {warehouse.home}", highlight=False, markup=False)
    console.print(f"Explore it:  tracelake analyze --home {home} --job demo-ddp_straggler", highlight=False,
                  markup=False)
    console.print(f'        or:  tracelake sql --home {home} "SELECT * FROM breakdown"', highlight=False, markup=False)
    console.print(f"        or:  duckdb -readonly {warehouse.store.catalog_path}", highlight=False, markup=False)
    console.print(f"        or:  tracelake report job demo-ddp_straggler --home {home}   (HTML with plots)",
                  highlight=False, markup=False)
    console.print(f"        or:  tracelake serve --home {home}   (REST API, docs at http://127.0.0.1:8000/docs)",
                  highlight=False, markup=False)
    if any(not r.ok for r in results):
        raise typer.Exit(1)


def _frame_result(frame: Any) -> QueryResult:
    return QueryResult(list(frame.columns), [str(t) for t in frame.dtypes], [tuple(r) for r in frame.iter_rows()])


def _fresh_demo_home(home: Path) -> None:
    """Empty ``home`` if it holds an earlier demo; refuse to touch anything else."""
    if not home.exists():
        return
    if not any(home.iterdir()):
        return
    if (home / "tracelake.duckdb").exists() and (home / "tables").is_dir():
        shutil.rmtree(home)
        return
    from tracelake.warehouse import InvalidArgument

    raise InvalidArgument(f"{home} exists and is not a tracelake demo warehouse; choose another --home")


@app.command()
@_errors
def serve(
    home: HomeOption = None,
    host: Annotated[str, typer.Option(help="Address to listen on. Anything but loopback needs API tokens.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.", min=1, max=65535)] = 8000,
    tokens_file: Annotated[Path | None, typer.Option(
        "--tokens-file", envvar="TRACELAKE_TOKENS_FILE", show_default=False,
        help="File of API tokens, one `token:read,write` per line (also: TRACELAKE_TOKENS).")] = None,
    ingest_workers: Annotated[int | None, typer.Option(
        "--ingest-workers", min=0, show_default=False,
        help="Processes that ingest uploads (default 1; 0 ingests on a thread of the server).")] = None,
) -> None:
    """Serve the REST API (uploads, ingest status, analyses, SQL) with uvicorn; docs at /docs."""
    import uvicorn

    from .app import create_app
    from .auth import Tokens
    from .connections import fit_open_files, guarded_h11_protocol
    from .network import is_loopback

    settings = Settings.from_env(home=home, tokens_file=str(tokens_file) if tokens_file else None,
                                 ingest_workers=ingest_workers)
    if not Tokens.from_settings(settings).configured:
        if not is_loopback(host):
            raise InvalidArgument(
                f"refusing to serve on {host} without API tokens: anyone who can reach it could read and "
                "write the warehouse. Set TRACELAKE_TOKENS=\"<token>:read,write\" (or --tokens-file), "
                "or serve on 127.0.0.1"
            )
        err_console.print("[yellow]no API tokens configured:[/] serving on loopback only; "
                          "every local user can read and write the warehouse", highlight=False)
    budget = fit_open_files(settings.max_connections)
    application = create_app(settings)
    err_console.print(f"tracelake {escape(str(settings.home_path))} on http://{escape(host)}:{port} "
                      f"(API docs: http://{escape(host)}:{port}/docs)", highlight=False)
    err_console.print(escape(budget.describe()), highlight=False)
    # h11 with deadlines for request heads and silent bodies, no reading of abandoned bodies and at most
    # max_connections open, the idle longest closed first (see api/connections.py); headers larger than 16 KiB
    # are refused with a 400 by h11 itself. No WebSocket route exists: upgrades are not offered.
    uvicorn.run(application, host=host, port=port, log_level="info", timeout_graceful_shutdown=10,
                http=guarded_h11_protocol(settings.header_timeout_seconds, settings.upload_idle_timeout_seconds,
                                          budget.max_connections),
                limit_concurrency=budget.limit_concurrency, ws="none", timeout_keep_alive=5,
                h11_max_incomplete_event_size=16 << 10)


report_app = typer.Typer(
    name="report",
    cls=WordsGroup,
    help="Write reports as self-contained HTML pages (plotly.js inline: they open offline, nothing is fetched).",
    no_args_is_help=True,
)
app.add_typer(report_app)


@report_app.command("job")
@_errors
def report_job(
    job: Annotated[str, typer.Argument(help="The job (see `tracelake traces`).", show_default=False)],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="HTML file to write (default: <job>.html).",
                                             show_default=False)] = None,
    top: Annotated[int, typer.Option("--top", "-n", min=1, max=100, help="Kernels to list.")] = 15,
    home: HomeOption = None,
) -> None:
    """Write a job's report: findings, per-rank breakdown, steps, idle time, stragglers, kernels, bandwidth."""
    from .reports import job_report
    from .reports.archive import write_page

    target = out or Path(f"{job}.html")
    write_page(target, job_report(_warehouse(home, existing=True).job_report(job, top=top)))
    err_console.print(f"wrote {escape(str(target))} ({target.stat().st_size / 1e6:.1f} MB)", highlight=False)


@report_app.command("fleet")
@_errors
def report_fleet(
    since: Annotated[str | None, typer.Option(
        "--since", help="Traces ingested since: 30m, 12h, 7d, 2w back from now, or an ISO date (default: all).",
        show_default=False)] = None,
    until: Annotated[str | None, typer.Option(
        "--until", help="Traces ingested before: the same forms (default: now).", show_default=False)] = None,
    label: Annotated[list[str] | None, typer.Option("--label", "-l", help="Only traces with this key=value label; "
                                                    "repeatable.", show_default=False)] = None,
    top: Annotated[int, typer.Option("--top", "-n", min=1, max=100, help="Offenders, stragglers and collectives "
                                     "to list.")] = 10,
    out: Annotated[Path, typer.Option("--out", "-o", help="HTML file to write.")] = Path("fleet.html"),
    job_reports: Annotated[bool, typer.Option(
        "--job-reports/--no-job-reports",
        help="Also write the top offenders' job reports into <out>_jobs/ and link them.")] = True,
    home: HomeOption = None,
) -> None:
    """Write the fleet report: device-hours and utilisation over time, waste by job and label, top offenders."""
    from tracelake.warehouse.fleet_report import parse_when

    from .reports.archive import write_fleet_pages

    now = dt.datetime.now(dt.timezone.utc)
    warehouse = _warehouse(home, existing=True)
    fleet = warehouse.fleet(since=parse_when(since, now) if since else None,
                            until=parse_when(until, now) if until else None,
                            labels=parse_labels(label), top=top, now=now)
    folder = out.with_name(f"{out.stem}_jobs")
    written = write_fleet_pages(warehouse, fleet, out, folder, job_reports=job_reports)
    extra = f" and {written} job report{'s' if written != 1 else ''} in {folder}/" if written else ""
    err_console.print(f"wrote {escape(str(out))} ({out.stat().st_size / 1e6:.1f} MB){escape(extra)}",
                      highlight=False, soft_wrap=True)


@report_app.command("scheduled")
@_errors
def report_scheduled(
    if_due: Annotated[bool, typer.Option(
        "--if-due", help="Only when the schedule (TRACELAKE_REPORT_SCHEDULE) has a run with no report yet: "
        "for a timer that fires more often than the schedule, or at boot.")] = False,
    window: Annotated[str | None, typer.Option(
        "--window", help="Traces ingested this long before now: 7d, 12h... (default: TRACELAKE_REPORT_WINDOW, "
        "7d); '' for all.", show_default=False)] = None,
    home: HomeOption = None,
) -> None:
    """Write the fleet report into the history in $TRACELAKE_HOME/reports/, as `tracelake serve` does on its
    schedule: for cron or a systemd timer (see README, "Scheduled fleet reports")."""
    from .scheduler import archive_of, schedule_of

    settings = Settings.from_env(home=home, report_window=window)
    archive = archive_of(settings)
    due = None
    if if_due:
        cron = schedule_of(settings)
        if cron is None:
            raise InvalidArgument("--if-due needs a schedule: set TRACELAKE_REPORT_SCHEDULE (e.g. '0 6 * * MON')")
        due = cron.previous(dt.datetime.now(dt.timezone.utc))
        if due is None or archive.covers(due):
            err_console.print("no report due: the latest run of the schedule has its report", highlight=False)
            return
    report = archive.generate(Warehouse(settings=settings), scheduled_for=due, window=settings.report_window,
                              trigger="schedule" if if_due else "manual", keep=settings.report_keep)
    err_console.print(f"wrote {escape(str(archive.root / report.name / 'index.html'))} ({report.traces:,} traces, "
                      f"{report.job_reports} job reports, {report.seconds:.1f} s)", highlight=False, soft_wrap=True)


@report_app.command("list")
@_errors
def report_list(home: HomeOption = None) -> None:
    """List the fleet reports kept in $TRACELAKE_HOME/reports/, newest first."""
    from .scheduler import archive_of

    settings = _warehouse(home, existing=True).settings
    reports = archive_of(settings).list()
    if not reports:
        err_console.print("no fleet reports yet: set TRACELAKE_REPORT_SCHEDULE for `tracelake serve`, or run "
                          "`tracelake report scheduled`", highlight=False)
        return
    frame = pl.DataFrame([{"name": r.name, "due (UTC)": f"{r.scheduled_for:%Y-%m-%d %H:%M}", "trigger": r.trigger,
                           "traces": r.traces, "jobs": r.jobs, "MB": round(r.bytes / 1e6, 1)} for r in reports])
    _print_result(_frame_result(frame), OutputFormat.table,
                  title=f"fleet reports in {archive_of(settings).root} (<name>/index.html)")


@app.command()
@_errors
def check(
    repair: Annotated[bool, typer.Option("--repair", help=(
        "Put right what can be: remove what dead processes left (data files of unregistered traces, stale "
        "staging folders, temp files), move stray and faulty files aside into <home>/quarantine/<time>/, "
        "write missing or faulty schema files and the catalog again."))] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    stale_after: Annotated[float, typer.Option("--stale-after", min=0, help=(
        "Seconds without a write after which a staging folder counts as left over (0 only when "
        "nothing else writes to the warehouse)."))] = 3600.0,
    home: HomeOption = None,
) -> None:
    """Verify the warehouse: registered traces whole, every file under tables/ in its place and schema, the catalog.

    Every registered trace must have all its files and row counts; every file under tables/ must fit
    the layout and its table's declared schema; the catalog must hold exactly tracelake's views.
    Each finding says what --repair did or would do. Exit code 0 when healthy (after --repair, if
    given), 1 when a problem or leftover remains. Registered traces are never rewritten: delete a
    damaged one and ingest it again.
    """
    from rich.table import Table

    report = _warehouse(home, existing=True).check(repair=repair, stale_after=stale_after)
    if as_json:
        sys.stdout.write(json.dumps(report.as_dict(), indent=2) + "\n")
    else:
        if report.problems:
            table = Table(title=f"{len(report.problems)} problems")
            for column in ("trace", "job", "table", "problem", "detail", "repair"):
                table.add_column(column, overflow="fold")
            for p in report.problems:
                table.add_row(p.trace_id[:12], p.job, p.table, p.kind, escape(p.detail), escape(p.repair))
            console.print(table)
        if report.orphans:
            table = Table(title=f"{len(report.orphans)} leftovers and strays (invisible to queries)")
            for column in ("kind", "path", "detail", "repair"):
                table.add_column(column, overflow="fold")
            for o in report.orphans:
                table.add_row(o.kind, escape(str(o.path)), escape(o.detail), escape(o.repair))
            console.print(table)
        verdict = "[green]healthy[/]" if report.ok else "[red]problems found[/]"
        repairable = report.orphans or any(p.repair.startswith("--repair") for p in report.problems)
        hint = "" if report.ok or repair or not repairable else " (`tracelake check --repair` puts right what it can)"
        console.print(f"{verdict}: {report.traces} traces, {report.files} files checked in {report.seconds:.2f}s; "
                      f"{len(report.problems)} problems"
                      f"{f' ({sum(p.fixed for p in report.problems)} put right)' if repair else ''}, "
                      f"{len(report.orphans)} leftovers"
                      f"{f' ({sum(o.removed for o in report.orphans)} removed or moved aside)' if repair else ''}, "
                      f"{report.in_use} in use{hint}", highlight=False, soft_wrap=True)
    if not report.ok:
        raise typer.Exit(1)


@app.command()
def version() -> None:
    """Print the tracelake version."""
    from tracelake.warehouse.core import tracelake_version

    console.print(tracelake_version())


def main() -> None:
    """Entry point of the ``tracelake`` console script."""
    app()


if __name__ == "__main__":
    main()
