"""How ``tracelake analyze`` prints what bounds each step and the what-if answers (docs/analyses.md, "Critical path").

Presentation only, over the facade's ``critical_path`` and ``what_if`` frames: ``--json``
keeps every step, every scenario and every value whole; these helpers choose the rows a
terminal shows and put the time on the path into words.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracelake.contracts.critical import PATH_KINDS, Scenario
from tracelake.contracts.lazy import lazy_module, polars as pl

if TYPE_CHECKING:
    from tracelake.analysis import critical_path
else:  # loaded by the commands that show analyses, not by every command (contracts/lazy.py)
    critical_path = lazy_module("tracelake.analysis.critical_path")

#: Up to this many steps (per run), every step is a row; past it, the slowest, the median and the fastest.
MAX_STEP_ROWS = 12
#: The kinds of time named per step, largest first.
TOP_KINDS = 3
#: A kind under this share of the step (%) is not named (unless it is the only one).
MIN_KIND_PCT = 0.5
#: From this many columns, the what-if table says in words what each scenario changes.
WORDS_WIDTH = 120


def _runs(frame: pl.DataFrame) -> list[tuple[str | None, pl.DataFrame]]:
    """The frame's rows per run (one ``None`` run when it has no ``run`` column), runs in their order."""
    if "run" not in frame.columns:
        return [(None, frame)]
    return [(str(run), part) for (run,), part in frame.group_by("run", maintain_order=True)]


def path_kinds(row: dict[str, object], top: int = TOP_KINDS) -> str:
    """The kinds of time on a step's critical path as shares of the step, largest first:
    ``compute 92%, host 4%, communication 2%``."""
    length = row.get("length_ns")
    parts = [(str(kind), int(row.get(f"{kind}_ns") or 0)) for kind in PATH_KINDS]  # type: ignore[call-overload]
    whole = int(length) if isinstance(length, int) and length > 0 else sum(ns for _, ns in parts)
    if whole <= 0:
        return ""
    shares = sorted(((100 * ns / whole, kind) for kind, ns in parts if ns > 0), key=lambda p: -p[0])
    named = [p for p in shares if p[0] >= MIN_KIND_PCT][:top] or shares[:1]
    return ", ".join(f"{kind} {share:.0f}%" if share >= 1 else f"{kind} <1%" for share, kind in named)


def shown_steps(steps: pl.DataFrame) -> tuple[pl.DataFrame, bool]:
    """The steps a terminal shows, per run: all of them up to :data:`MAX_STEP_ROWS`, in step order; past it,
    the slowest, the median and the fastest by measured time (column ``which``). True when steps were left out."""
    parts: list[pl.DataFrame] = []
    cut = False
    for _, mine in _runs(steps):
        if mine.height <= MAX_STEP_ROWS:
            parts.append(mine.sort("step", nulls_last=True).with_columns(pl.lit("").alias("which")))
            continue
        cut = True
        ordered = mine.sort("measured_ns", "step", descending=[True, False])
        picks = ((0, "slowest"), ((ordered.height - 1) // 2, "median"), (ordered.height - 1, "fastest"))
        parts.append(pl.concat([ordered.slice(i, 1).with_columns(pl.lit(which).alias("which")) for i, which in picks]))
    return pl.concat(parts), cut


def bounds_view(steps: pl.DataFrame) -> tuple[pl.DataFrame, str]:
    """"What bounds each step": per step shown, its measured time, its bounding rank and the top kinds of time on
    its critical path as % of the step; and the table's title, saying which steps it shows."""
    shown, cut = shown_steps(steps)
    run = ["run"] if "run" in shown.columns else []
    ranks = steps["ranks"].unique().to_list()
    view = shown.select(
        *run, (pl.col("step").cast(pl.String).fill_null("all")
               + pl.when(pl.col("which") != "").then(pl.format(" ({})", "which")).otherwise(pl.lit(""))),
        *(["ranks"] if len(ranks) > 1 else []),
        (pl.col("measured_ns") / 1e6).round(2).alias("measured ms"),
        pl.col("bounding_rank").alias("bounding rank"),
        pl.Series("on the critical path, % of the step", [path_kinds(r) for r in shown.iter_rows(named=True)],
                  dtype=pl.String),
    )
    counts = [mine.height for _, mine in _runs(steps)]
    if not cut:
        which = ""
    elif len(counts) == 1:
        which = f"; the slowest, median and fastest of {counts[0]} steps (every step: --json)"
    else:
        which = f"; of a run with over {MAX_STEP_ROWS} steps, its slowest, median and fastest (every step: --json)"
    across = f"its {ranks[0]} rank{'s' if ranks[0] != 1 else ''}" if len(ranks) == 1 else "the ranks"
    return view, f"what bounds each step across {across}: the time on its critical path{which}"


def what_if_view(what_if: pl.DataFrame, words: bool = True) -> pl.DataFrame:
    """"What if": per scenario (and run), summed over the steps: predicted time per step, the saving per step and
    its share; ``as_measured`` first (the baseline: the measured time), then the largest saving first.

    ``words`` adds what each scenario changes (:data:`~tracelake.analysis.critical_path.WORDS`), for wide terminals.
    """
    summed, words_of = critical_path.totals(what_if), critical_path.WORDS
    run = ["run"] if "run" in summed.columns else []
    baseline = pl.col("scenario") == str(Scenario.AS_MEASURED)
    order = summed.with_columns(baseline.alias("_base")).sort(
        *run, "_base", "saving_ns", "scenario", descending=[*(False for _ in run), True, True, False],
        maintain_order=True)
    per_step = pl.col("steps").cast(pl.Float64)
    return order.select(
        *run, "scenario",
        *([pl.col("scenario").replace_strict({str(s): w for s, w in words_of.items()}, default=pl.col("scenario"))
           .alias("what changes")] if words else []),
        (pl.col("predicted_ns") / per_step / 1e6).round(3).alias("predicted ms/step"),
        (pl.col("saving_ns") / per_step / 1e6).round(3).alias("saving ms/step"),
        pl.col("saving_pct").round(1).alias("saving %"),
    )


def parallelism_view(groups: pl.DataFrame) -> pl.DataFrame:
    """One row per process group: its dimension, how it was told, its time, exposed time and critical share."""
    keys = [c for c in ("run",) if c in groups.columns]
    return groups.select(
        *keys, pl.col("process_group").alias("group"), pl.col("dimension").fill_null("?").alias("dim"),
        pl.col("basis").alias("by"), pl.col("group_size").alias("ranks"), pl.col("operations").alias("ops"),
        (pl.col("time_ns") / 1e6).round(2).alias("ms"), (pl.col("exposed_ns") / 1e6).round(2).alias("exposed"),
        pl.col("critical_pct").round(1).alias("crit %"),
    )


def bubbles_view(bubbles: pl.DataFrame) -> pl.DataFrame:
    """Per stage: steps, micro-batches, mean bubble % against the schedule's."""
    keys = [c for c in ("run",) if c in bubbles.columns]
    return bubbles.group_by(*keys, "rank", maintain_order=True).agg(
        pl.len().alias("steps"), pl.col("microbatches").max().alias("micro-batches"),
        pl.col("bubble_pct").mean().round(1).alias("bubble %"),
        pl.col("schedule_bubble_pct").max().round(1).alias("schedule %"),
    ).sort(*keys, "rank")
