"""How ``tracelake analyze`` prints the top operators (docs/analyses.md, "Operators"): presentation only.

``--json`` keeps every name and shape whole; the table shortens input shapes to fit a terminal.
"""

from __future__ import annotations

import json
from typing import Any

import polars as pl

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
