"""``tracelake diff``: two traces or jobs compared, by category and kernel by kernel."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from tracelake.contracts.lazy import polars as pl

from ..output import jsonable, to_table
from . import render
from .root import HomeOption, app, console, exit_on_error, open_warehouse


@app.command()
@exit_on_error
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
    kernels_frame, categories = open_warehouse(home, existing=True).diff(a, b)
    if as_json:
        sys.stdout.write(json.dumps(jsonable({
            "categories": categories.to_dicts(), "kernels": kernels_frame.head(top).to_dicts(),
        }), indent=2) + "\n")
        return
    ms = [(pl.col(c) / 1e6).round(3).alias(c.replace("_ns", "_ms")) for c in ("a_ns", "b_ns", "delta_ns")]
    console.print(to_table(render.frame_result(categories.select(
        pl.col("metric").str.replace("_ns$", ""), *ms, pl.col("ratio").round(3))),
        title=f"per rank: {a} (a) vs {b} (b)"))
    shown = kernels_frame.head(top)
    labels = render.kernel_labels(shown["name"].to_list(), render.kernel_width(console.width))
    console.print(to_table(render.frame_result(shown.select(
        pl.Series("kernel", labels, dtype=pl.String), "change", *ms, pl.col("ratio").round(3))),
        title="kernels, biggest change first (whole names: --json)"))
