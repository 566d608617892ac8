"""Findings that name the operators whose fix would move MFU most (docs/analyses.md, "Operators", "Operator findings").

For each (trace, rank), every ``op_stats`` row of a model kind (matmul, convolution, attention) with a place on the
roofline could run at its roof: its device time would shrink to ``device_ns x pct_of_roofline / 100``. The time it
would give back, ``device_ns x (1 - pct_of_roofline / 100)``, is what the findings rank. Every figure is bounded:
a saving never exceeds the rank's span, the step shortens by at most 100%, and MFU after the fix
(MFU x span / (span - saving)) never exceeds 100. Pure: frames in, findings out.
"""

from __future__ import annotations

import json
from typing import Any

import polars as pl

from .findings import MIN_GAIN_SHARE, Finding
from .op_stats import MODEL_KINDS

#: How many operators the findings name (the largest savings of the selection, each on its worst rank).
TOP = 3
#: Input shapes longer than this are cut in a finding's title.
SHAPES_CHARS = 60

#: Columns of :func:`savings`.
COLUMNS = ("trace_id", "rank", "op", "input_shapes", "dtype", "kind", "device_ns", "pct_of_roofline", "bound",
           "achieved_tflops", "share_pct", "span_ns", "saving_ns", "step_shorter_pct", "mfu_pct", "mfu_after_pct",
           "attainable_pct", "attainable_saving_ns")
#: The rows of a kind that set what is attainable on a rank hold at least this share of its device time (%).
ATTAINABLE_SHARE = 1.0


def savings(op_stats: pl.DataFrame, whole: pl.DataFrame) -> pl.DataFrame:
    """Per operator (op, shapes, dtype) of a model kind with a roofline, per rank: what running at its roof gives back.

    Args:
        op_stats: rows of the ``op_stats`` table (any traces and ranks).
        whole: the whole-trace breakdown rows (``trace_id``, ``rank``, ``span_ns``, ``mfu_pct``) of the same ranks.

    Returns:
        :data:`COLUMNS`, largest ``saving_ns`` first: ``share_pct`` of the rank's attributed device time,
        ``saving_ns`` = min(sum over its rows of device time x (1 - min(% of roofline, 100) / 100), span),
        ``pct_of_roofline`` and ``achieved_tflops`` weighted by device time, ``step_shorter_pct`` =
        100 x saving / span, ``mfu_after_pct`` = min(100, MFU x span / (span - saving)) (null without MFU);
        ``attainable_pct`` the highest % of roofline (at most 100) an operator of the same kind reaches on the rank
        (of those holding :data:`ATTAINABLE_SHARE` % of its device time or more, itself included), and
        ``attainable_saving_ns`` = device time x (1 - % of roofline / attainable), at most ``saving_ns``: what
        running as well as the best of its kind here would give back. Rows of ranks without a breakdown row (no
        span) are left out.
    """
    if op_stats.is_empty() or whole.is_empty() or "pct_of_roofline" not in op_stats.columns:
        return pl.DataFrame(schema=_SCHEMA)
    key = [pl.col("trace_id").cast(pl.String), pl.col("rank").cast(pl.Int64)]
    rows = op_stats.with_columns(*key)
    totals = rows.group_by("trace_id", "rank").agg(pl.col("device_ns").sum().alias("_rank_device_ns"))
    spans = whole.select(*key, pl.col("span_ns").cast(pl.Int64),
                         (pl.col("mfu_pct") if "mfu_pct" in whole.columns else pl.lit(None)).cast(pl.Float64)
                         .alias("mfu_pct")).unique(["trace_id", "rank"], keep="first")
    model = rows.filter(pl.col("kind").is_in(list(MODEL_KINDS)) & pl.col("pct_of_roofline").is_not_null()
                        & (pl.col("device_ns") > 0))
    # one operator (op, shapes, dtype) of a rank may have several rows (one per module that called it): its saving
    # is theirs added up, its % of roofline and TFLOP/s their device-time-weighted means
    time = pl.col("device_ns").cast(pl.Float64)
    model = model.group_by("trace_id", "rank", "op", "input_shapes", "dtype", "kind").agg(
        pl.col("device_ns").sum(),
        ((pl.col("pct_of_roofline") * time).sum() / time.sum()).alias("pct_of_roofline"),
        ((pl.col("achieved_tflops") * time).sum() / time.sum()).alias("achieved_tflops"),
        pl.col("bound").sort_by("device_ns", descending=True).drop_nulls().first(),
        (time * (1.0 - pl.col("pct_of_roofline").clip(0.0, 100.0) / 100.0)).sum().alias("_saving"))
    span = pl.col("span_ns").cast(pl.Float64)
    saving = pl.col("saving_ns").cast(pl.Float64)
    out = model.join(totals, on=["trace_id", "rank"]).join(spans, on=["trace_id", "rank"]).filter(
        pl.col("span_ns") > 0).with_columns(
        (100.0 * pl.col("device_ns") / pl.col("_rank_device_ns")).alias("share_pct"),
        pl.min_horizontal(pl.col("_saving").floor(), span).cast(pl.Int64).alias("saving_ns"),
    )
    reached = pl.col("pct_of_roofline").clip(0.0, 100.0)
    out = out.with_columns(
        pl.max_horizontal(reached, reached.filter(pl.col("share_pct") >= ATTAINABLE_SHARE).max()
                          .over("trace_id", "rank", "kind")).alias("attainable_pct"),
    ).with_columns(
        pl.when(pl.col("attainable_pct") > 0).then(
            pl.min_horizontal(
                (pl.col("device_ns").cast(pl.Float64) * (1.0 - reached / pl.col("attainable_pct"))).floor(),
                saving)).otherwise(0.0).cast(pl.Int64).alias("attainable_saving_ns"),
    ).with_columns(
        (100.0 * saving / span).alias("step_shorter_pct"),
        pl.when(pl.col("mfu_pct").is_null()).then(None)
        .when(saving >= span).then(100.0)
        .otherwise(pl.min_horizontal(pl.col("mfu_pct") * span / (span - saving), pl.lit(100.0)))
        .alias("mfu_after_pct"),
    )
    return out.select(pl.col(c).cast(t) for c, t in _SCHEMA.items()).sort(
        ["saving_ns", "trace_id", "rank", "op"], descending=[True, False, False, False], nulls_last=True)


_SCHEMA: dict[str, Any] = {
    "trace_id": pl.String, "rank": pl.Int64, "op": pl.String, "input_shapes": pl.String, "dtype": pl.String,
    "kind": pl.String, "device_ns": pl.Int64, "pct_of_roofline": pl.Float64, "bound": pl.String,
    "achieved_tflops": pl.Float64, "share_pct": pl.Float64, "span_ns": pl.Int64, "saving_ns": pl.Int64,
    "step_shorter_pct": pl.Float64, "mfu_pct": pl.Float64, "mfu_after_pct": pl.Float64,
    "attainable_pct": pl.Float64, "attainable_saving_ns": pl.Int64,
}


def shapes_text(text: str | None, width: int = SHAPES_CHARS) -> str:
    """``Input Dims`` JSON text as ``4096x4096, 4096x4096`` (tensors only), cut to ``width`` with an ellipsis."""
    try:
        dims = json.loads(text) if text else []
    except ValueError:
        dims = text
    if isinstance(dims, list):
        parts = ["x".join(str(v) for v in d) for d in dims
                 if isinstance(d, list) and d and all(isinstance(v, int) for v in d)]
        short = ", ".join(parts)
    else:
        short = str(dims)
    return short if len(short) <= width else short[:width - 1] + "…"


def _attainable(r: dict[str, Any]) -> str:
    """What running as close to its roof as the best operator of its kind here would give back (the ranked gain)."""
    if r["attainable_saving_ns"] > 0:
        return (f"as close to its roof as the best {r['kind']} here ({r['attainable_pct']:.0f}%), "
                f"{r['attainable_saving_ns'] / 1e6:.1f} ms shorter")
    return f"no {r['kind']} here runs closer to its roof"


def from_op_stats(op_stats: pl.DataFrame, whole: pl.DataFrame, top: int = TOP) -> list[Finding]:
    """The ``top`` operators (op, shapes, dtype) whose run at their roofline would shorten a rank's timeline most.

    Each is stated on its worst rank: ``aten::mm [4096x4096, 4096x4096 bf16] takes 31% of device time at 42% of
    its roofline``, with how much shorter the span and how much higher MFU would be at the roofline (reported only
    from :data:`tracelake.analysis.findings.MIN_GAIN_SHARE` of the span on). The gain, which ranks it among the
    other findings, is the attainable saving (``attainable_saving_ns``): the roofline is a bound no kernel
    reaches, the best operator of the same kind on the same device is one that was reached.
    """
    found = savings(op_stats, whole)
    if found.is_empty():
        return []
    worst = found.unique(["op", "input_shapes", "dtype"], keep="first", maintain_order=True).filter(
        (pl.col("saving_ns") > 0) & (pl.col("saving_ns") >= MIN_GAIN_SHARE * pl.col("span_ns"))).head(top)
    out = []
    for r in worst.to_dicts():
        shapes = shapes_text(r["input_shapes"])
        label = f"{r['op']} [{shapes + ' ' if shapes else ''}{r['dtype'] or '?'}]"
        mfu = (f" and MFU {r['mfu_pct']:.1f}% -> {r['mfu_after_pct']:.1f}%"
               if r["mfu_pct"] is not None and r["mfu_after_pct"] is not None else "")
        rate = f", {r['achieved_tflops']:,.1f} TFLOP/s" if r["achieved_tflops"] is not None else ""
        out.append(Finding(
            "operator_roofline",
            f"{label} takes {r['share_pct']:.0f}% of device time at {r['pct_of_roofline']:.0f}% of its roofline",
            f"on rank {r['rank']} ({r['bound'] or 'unknown'}-bound{rate}): at the roofline the step would be "
            f"{r['step_shorter_pct']:.0f}% shorter{mfu} (an upper bound: it assumes all of the op's time is on "
            f"the rank's critical path); {_attainable(r)}",
            int(r["attainable_saving_ns"]),
            traces=(str(r["trace_id"]),), ranks=(int(r["rank"]),),
        ))
    return out
