"""``tracelake demo``: the bundled sample traces in a fresh warehouse, and what they reveal."""

from __future__ import annotations

import shutil
import time
from importlib import resources
from pathlib import Path
from typing import Annotated

import typer

from tracelake.contracts.lazy import polars as pl
from tracelake.warehouse import IngestResult, InvalidArgument, Settings, Warehouse

from ..output import to_table
from . import render
from .analyze import print_findings
from .ingest import ingest_summary
from .progress import progress_bar
from .root import app, console, err_console, exit_on_error


@app.command()
@exit_on_error
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
        with progress_bar(err_console.is_terminal) as bar:
            for scenario in scenarios:
                report = warehouse.ingest([scenario], job=f"demo-{scenario.name}", progress=bar)
                results.extend(report.results)
    ingest_summary(results, time.perf_counter() - started)
    for scenario in scenarios:
        job = f"demo-{scenario.name}"
        summary = warehouse.rank_summary(job)
        console.print()
        console.print(to_table(render.frame_result(summary), title=f"job {job}: device time per rank"))
        analysis = warehouse.analyze(job=job)
        if (mfu := mfu_line(analysis.breakdown)) is not None:
            console.print(mfu, highlight=False, markup=False)
        print_findings(analysis.findings)
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


def mfu_line(breakdown: pl.DataFrame) -> str | None:
    """The ranks' model FLOPs utilisation as one line (docs/analyses.md, "Operators"); None where it is unknown."""
    values: list[float] = breakdown["mfu_pct"].drop_nulls().to_list() if "mfu_pct" in breakdown.columns else []
    if not values:
        return None
    low, high = f"{min(values):.1f}", f"{max(values):.1f}"
    ranks = "the rank" if breakdown.height == 1 else "per rank"
    return f"MFU (model FLOPs / (peak x device span)), {ranks}: {low}%" + ("" if low == high else f" to {high}%")


def _fresh_demo_home(home: Path) -> None:
    """Empty ``home`` if it holds an earlier demo; refuse to touch anything else."""
    if not home.exists():
        return
    if not any(home.iterdir()):
        return
    if (home / "tracelake.duckdb").exists() and (home / "tables").is_dir():
        shutil.rmtree(home)
        return
    raise InvalidArgument(f"{home} exists and is not a tracelake demo warehouse; choose another --home")
