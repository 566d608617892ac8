"""The 6·N·D cross-check: model FLOPs per step from the user's labels against the operators' count.

docs/analyses.md, "Operators", "6·N·D cross-check": where a trace carries the labels ``params`` (N, the parameters
the rank computes with) and ``tokens_per_step`` (D, the tokens it processes per step), a training step's model
FLOPs are 6·N·D (2 forward, 4 backward per parameter and token), plus 12·L·H·Q·T·D for attention's quadratic term
where ``layers``, ``heads``, ``head_dim`` and ``seq_len`` are labels too. The operators' count is the ``op_stats``
FLOPs of matmuls, convolutions and attention over the trace's profiled steps. Pure: frames in, a frame and findings
out.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from .findings import Finding
from .op_stats import MODEL_KINDS, NO_OPERATOR

#: A finding is made where the count and 6·N·D differ by more than this share.
TOLERANCE = 0.25
#: The labels of the attention term 12·L·H·Q·T, all needed.
ATTENTION_LABELS = ("layers", "heads", "head_dim", "seq_len")
#: How many operators without an estimate a finding names.
MISSING_NAMED = 3

#: Columns of :func:`cross_check`.
SCHEMA: dict[str, Any] = {
    "trace_id": pl.String, "rank": pl.Int64, "params": pl.Float64, "tokens_per_step": pl.Float64,
    "steps": pl.Int64, "model_flops_6nd": pl.Float64, "attention_flops": pl.Float64,
    "model_flops_counted": pl.Float64, "ratio": pl.Float64, "no_estimate": pl.String,
}


def _labels(value: object) -> dict[str, str]:
    """A ``traces`` row's labels (a dict, or a list of key/value entries) as a dict."""
    if isinstance(value, dict):
        return {str(k): str(v) for k, v in value.items()}
    if isinstance(value, list):
        return {str(e["key"]): str(e["value"]) for e in value if isinstance(e, dict) and "key" in e}
    return {}


def _number(text: str | None) -> float | None:
    """A positive label value (``1.3e9``, ``8192``), else None."""
    try:
        value = float(text) if text is not None else None
    except ValueError:
        return None
    return value if value is not None and value > 0 and value == value and value != float("inf") else None


def cross_check(traces: pl.DataFrame, op_stats: pl.DataFrame) -> pl.DataFrame:
    """One row per labelled trace and rank: 6·N·D (and attention) per step against the operators' count per step.

    Args:
        traces: ``traces`` rows (``trace_id``, ``rank``, ``labels``, ``step_count``).
        op_stats: the ``op_stats`` rows of the same traces.

    Returns:
        :data:`SCHEMA`: ``model_flops_6nd`` = 6·N·D; ``attention_flops`` = 12·L·H·Q·T·D where its labels exist
        (else null); ``model_flops_counted`` = model-kind FLOPs / ``steps`` (null without steps);
        ``ratio`` = counted / (6·N·D + attention); ``no_estimate``: the operators with most device time and no
        FLOPs estimate, comma-separated. Empty where no trace has both labels.
    """
    if traces.is_empty() or "labels" not in traces.columns:
        return pl.DataFrame(schema=SCHEMA)
    if "device_op_count" in traces.columns:  # a memory timeline or snapshot of the same run has no operators
        traces = traces.filter(pl.col("device_op_count").fill_null(0) > 0)
    rows = []
    for trace_id, rank, labels, steps in traces.select(
            pl.col("trace_id").cast(pl.String), pl.col("rank").cast(pl.Int64), "labels",
            (pl.col("step_count") if "step_count" in traces.columns else pl.lit(None)).cast(pl.Int64)).rows():
        named = _labels(labels)
        n, d = _number(named.get("params")), _number(named.get("tokens_per_step"))
        if n is None or d is None:
            continue
        attention_terms = [_number(named.get(k)) for k in ATTENTION_LABELS]
        attention = None
        if all(t is not None for t in attention_terms):
            layers, heads, head_dim, seq = (float(t or 0) for t in attention_terms)
            attention = 12.0 * layers * heads * head_dim * seq * d
        rows.append({"trace_id": trace_id, "rank": rank, "params": n, "tokens_per_step": d, "steps": steps,
                     "model_flops_6nd": 6.0 * n * d, "attention_flops": attention})
    if not rows:
        return pl.DataFrame(schema=SCHEMA)
    labelled = pl.DataFrame(rows, schema={k: SCHEMA[k] for k in rows[0]})
    ops = op_stats.with_columns(pl.col("trace_id").cast(pl.String), pl.col("rank").cast(pl.Int64)) \
        if op_stats.height else pl.DataFrame(schema={"trace_id": pl.String, "rank": pl.Int64, "op": pl.String,
                                                     "kind": pl.String, "flops": pl.Float64, "device_ns": pl.Int64})
    model = ops.group_by("trace_id", "rank").agg(
        pl.col("flops").filter(pl.col("kind").is_in(list(MODEL_KINDS))).sum().alias("_model"))
    missing = ops.filter(pl.col("flops").is_null() & (pl.col("op") != NO_OPERATOR)).group_by(
        "trace_id", "rank", "op").agg(pl.col("device_ns").sum()).sort(
        ["device_ns", "op"], descending=[True, False]).group_by("trace_id", "rank", maintain_order=True).agg(
        pl.col("op").head(MISSING_NAMED).alias("_missing"))
    counted = model.join(missing, on=["trace_id", "rank"], how="left")
    out = labelled.join(counted, on=["trace_id", "rank"], how="left").with_columns(
        pl.when(pl.col("steps") > 0).then(pl.col("_model").fill_null(0.0) / pl.col("steps"))
        .alias("model_flops_counted"),
        pl.col("_missing").list.join(", ").alias("no_estimate"),
    ).with_columns(
        (pl.col("model_flops_counted") / (pl.col("model_flops_6nd") + pl.col("attention_flops").fill_null(0.0)))
        .alias("ratio"))
    return out.select(pl.col(c).cast(t) for c, t in SCHEMA.items()).sort("trace_id", "rank")


def findings(checked: pl.DataFrame) -> list[Finding]:
    """A finding where the operators' count and 6·N·D (+ attention) differ by more than :data:`TOLERANCE`.

    One finding for the rank furthest off; no gain (it says what to trust, not what to fix for time).
    """
    off = checked.filter(pl.col("ratio").is_not_null() & ((pl.col("ratio") - 1.0).abs() > TOLERANCE))
    if off.is_empty():
        return []
    worst = off.sort((pl.col("ratio").log()).abs(), descending=True).row(0, named=True)
    expected = "6ND + attention" if worst["attention_flops"] is not None else "6ND"
    if worst["ratio"] < 1:
        why = ("shapes or estimates missing for " + worst["no_estimate"]) if worst["no_estimate"] else \
            "operators without shapes (record_shapes off) or without a cost rule"
    else:
        why = ("recomputed forward ops (activation checkpointing), attention's quadratic term" +
               ("" if worst["attention_flops"] is not None else " (not in 6ND: add the labels "
                + ", ".join(ATTENTION_LABELS) + ")") + ", or labels counting another N or D (the whole job's "
               "rather than this rank's)")
    return [Finding(
        "model_flops_mismatch",
        f"counted FLOPs are {worst['ratio']:.2f}x of {expected} on rank {worst['rank']}",
        f"the operators count {worst['model_flops_counted']:.3g} model FLOPs per step, {expected} from the labels "
        f"(params={worst['params']:.4g}, tokens_per_step={worst['tokens_per_step']:.4g}) gives "
        f"{worst['model_flops_6nd'] + (worst['attention_flops'] or 0.0):.3g}: {why}",
        0, traces=(str(worst["trace_id"]),), ranks=(int(worst["rank"]),),
    )]
