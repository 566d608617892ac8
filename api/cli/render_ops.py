"""How ``tracelake analyze`` prints the top operators (docs/analyses.md, "Operators"): presentation only.

``--json`` keeps every name and shape whole; the table shortens input shapes to fit a terminal.
"""

from __future__ import annotations

import json
from typing import Any

from tracelake.contracts.lazy import polars as pl

#: The table's title.
TITLE = ("top operators, all ranks: device time of the kernels each launched (shapes whole: --json; "
         "% of roofline: of the compute or memory bound)")
#: Input shapes are cut to about this many characters.
SHAPES_WIDTH = 36


def _shape(value: Any) -> str:
    """One input: ``8x1024x64`` for a tensor, ``[n tensors]`` for a list of them, ``-`` for none or a scalar."""
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        return "x".join(str(v) for v in value)
    if isinstance(value, list) and value and all(isinstance(v, list) for v in value):
        return f"[{len(value)} tensors]"
    return "-"


def short_shapes(text: str | None, width: int = SHAPES_WIDTH) -> str:
    """``Input Dims`` JSON text as ``8192x1024, 1024x4096``, cut to about ``width`` characters with ``…``."""
    if not text:
        return ""
    try:
        dims = json.loads(text)
    except ValueError:
        short = text
    else:
        short = ", ".join(_shape(d) for d in dims) if isinstance(dims, list) else text
    return short if len(short) <= width else short[:width - 1] + "…"


def operators_view(top: pl.DataFrame) -> pl.DataFrame:
    """The top operators as the terminal shows them: op, shortened shapes, calls, ms, share, TFLOP/s, roofline."""
    shapes = [short_shapes(s) for s in top["input_shapes"].to_list()]
    return top.select(
        *(["run"] if "run" in top.columns else []), "op", pl.Series("shapes", shapes, dtype=pl.String),
        pl.col("dtype"), pl.col("count").alias("calls"), (pl.col("device_ns") / 1e6).round(2).alias("device ms"),
        pl.col("share_pct").round(1).alias("share %"), pl.col("achieved_tflops").round(1).alias("TFLOP/s"),
        pl.col("pct_of_roofline").round(1).alias("% of roofline"), "bound",
    )


#: The module table's title.
MODULES_TITLE = "top modules, all ranks: device time of the kernels their operators launched (innermost module path)"


def modules_view(top: pl.DataFrame) -> pl.DataFrame:
    """The top module paths as the terminal shows them: module, calls, ms, share, TFLOP/s."""
    return top.select(
        *(["run"] if "run" in top.columns else []), "module", pl.col("count").alias("calls"),
        (pl.col("device_ns") / 1e6).round(2).alias("device ms"), pl.col("share_pct").round(1).alias("share %"),
        pl.col("achieved_tflops").round(1).alias("TFLOP/s"))


def model_flops_lines(checked: pl.DataFrame) -> list[str]:
    """The 6·N·D cross-check (``Analysis.model_flops``) as one line per labelled rank; none without labels.

    docs/analyses.md, "6·N·D cross-check": ``model FLOPs per step: counted 4.84e+12, 6ND 4.12e+12 (1.18x), rank 0``.
    """
    lines = []
    for r in checked.to_dicts():
        expected = r["model_flops_6nd"] + (r["attention_flops"] or 0.0)
        name = "6ND + attention" if r["attention_flops"] is not None else "6ND"
        counted = f"{r['model_flops_counted']:.3g}" if r["model_flops_counted"] is not None else "unknown (no steps)"
        ratio = f" ({r['ratio']:.2f}x)" if r["ratio"] is not None else ""
        lines.append(f"model FLOPs per step, rank {r['rank']}: counted {counted}, {name} {expected:.3g}{ratio}")
    return lines
