"""Goodput of a job from its lifecycle and its MFU (docs/analyses.md, "Goodput").

Pure functions over ``job_lifecycle`` rows (with the trace's ``job``) and a per-job MFU.
The job's wall time (submitted to ended) is cut into disjoint buckets, in integer
nanoseconds so that they add up to it exactly:

- ``queued``: submitted to started (waiting for resources; scheduling badput);
- ``startup``: started to first step;
- ``restart_recovery``: a failure to the job's progress resuming (``resumed``);
- ``restart_lost``: the work a failure lost (``lost_since`` to the failure), done again later;
- ``checkpoint``: checkpoints blocking the job (``at`` to ``at + seconds``);
- ``other``: the rest of the time outside measured training steps, when the file gives them;
- ``productive``: the rest, training steps; split by MFU into ``program_badput`` (1 - MFU)
  and ``goodput``.

Where intervals overlap an instant belongs to the first bucket of that list that covers it
(work lost to a restart is lost even when a checkpoint was being written in it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import polars as pl

#: The time buckets in order of precedence (an instant two of them cover is the first's).
TIME_BADPUT = ("queued", "startup", "restart_recovery", "restart_lost", "checkpoint", "other")
#: Every badput bucket, in the order the report lists them.
BADPUT = (*TIME_BADPUT, "program_badput")
#: Each bucket in words (the report's "which badput dominates").
WORDS = {
    "queued": "queued for resources", "startup": "startup before the first step",
    "restart_recovery": "restart recovery", "restart_lost": "restarts lost", "checkpoint": "checkpoints took",
    "other": "time outside training steps", "program_badput": "below peak FLOPs (1 - MFU)",
}
COLUMNS = (
    "job", "trace_id", "submitted_ns", "ended_ns", "wall_ns", "available_ns", *(f"{b}_ns" for b in TIME_BADPUT),
    "productive_ns", "program_badput_ns", "goodput_ns", "checkpoints", "restarts", "steps",
    "scheduling_goodput", "runtime_goodput", "program_goodput", "goodput", "dominant_badput", "dominant_badput_ns",
)
_SCHEMA: dict[str, Any] = {
    **{c: pl.Int64 for c in COLUMNS}, "job": pl.String, "trace_id": pl.String, "dominant_badput": pl.String,
    **{c: pl.Float64 for c in ("scheduling_goodput", "runtime_goodput", "program_goodput", "goodput")},
}


def split(rows: Sequence[dict[str, Any]]) -> dict[str, int]:
    """The wall time of one lifecycle (its ``job_lifecycle`` rows) in the time buckets, ns.

    Returns:
        ``wall``, ``available`` and each of :data:`TIME_BADPUT` and ``productive``; the buckets
        sum to ``wall`` exactly. Rows that are missing (a file can only lack optional events)
        count as no time.
    """
    at = {r["event"]: r["at_ns"] for r in rows if r["event"] in ("submitted", "started", "first_step", "ended")}
    submitted, ended = at["submitted"], at["ended"]
    started = at.get("started", submitted)
    first = at.get("first_step", started)
    spans: list[tuple[int, int, int]] = [(submitted, started, 0), (started, first, 1)]
    for r in rows:
        if r["event"] == "restart":
            spans.append((r["at_ns"], r["resumed_ns"] if r["resumed_ns"] is not None else r["at_ns"], 2))
            spans.append((r["lost_since_ns"], r["at_ns"], 3))
        elif r["event"] == "checkpoint":
            spans.append((r["at_ns"], r["at_ns"] + (r["dur_ns"] or 0), 4))
    painted = _paint(submitted, ended, spans, len(TIME_BADPUT) - 1)
    out = dict(zip(TIME_BADPUT, painted))
    rest = painted[-1]
    measured = next((r["productive_ns"] for r in rows if r["event"] == "ended"), None)
    out["productive"] = rest if measured is None else min(measured, rest)
    out["other"] = rest - out["productive"]
    out["wall"] = ended - submitted
    out["available"] = out["wall"] - out["queued"]
    return out


def _paint(start: int, end: int, spans: list[tuple[int, int, int]], kinds: int) -> list[int]:
    """Time in ``[start, end)`` covered by each kind of ``spans`` ``(from, to, kind)``, the lowest kind winning;
    the last entry is the time no span covers."""
    events: list[tuple[int, int, int]] = []
    for lo, hi, kind in spans:
        lo, hi = max(lo, start), min(hi, end)
        if lo < hi:
            events += [(lo, 1, kind), (hi, -1, kind)]
    events.sort()
    totals = [0] * (kinds + 1)
    active = [0] * kinds
    now = start
    for moment, change, kind in events:
        if moment > now:
            totals[next((k for k in range(kinds) if active[k]), kinds)] += moment - now
            now = moment
        active[kind] += change
    totals[kinds] += end - now
    return totals


def per_job(lifecycle: pl.DataFrame, mfu: pl.DataFrame | None = None) -> pl.DataFrame:
    """Goodput per job: the buckets of :func:`split`, the three factors and their product.

    Args:
        lifecycle: ``job_lifecycle`` rows with ``job`` (and ``ingested_at``: a job with several
            lifecycle traces is taken from its latest; else the last by ``trace_id``).
        mfu: ``job`` and ``mfu_pct`` (program goodput = MFU / 100, clamped to [0, 1]); a job
            without it has null program goodput, goodput and program split.

    Returns:
        :data:`COLUMNS`, by job: ``*_ns`` buckets (``queued`` .. ``other``, ``productive``)
        adding up to ``wall_ns``; ``program_badput_ns + goodput_ns = productive_ns``;
        ``dominant_badput`` the largest bucket of :data:`BADPUT`.
    """
    if lifecycle.is_empty():
        return pl.DataFrame(schema=_SCHEMA)
    order = "ingested_at" if "ingested_at" in lifecycle.columns else "trace_id"
    latest = lifecycle.group_by("job").agg(pl.col("trace_id").sort_by(order).last())
    chosen = lifecycle.join(latest, on=["job", "trace_id"], how="semi")
    mfus = {} if mfu is None else {r["job"]: r["mfu_pct"] for r in mfu.select("job", "mfu_pct").to_dicts()}
    out = []
    for (job, trace_id), group in sorted(chosen.group_by("job", "trace_id"), key=lambda g: str(g[0][0])):
        rows = group.to_dicts()
        parts = split(rows)
        out.append(_row(str(job), str(trace_id), rows, parts, mfus.get(job)))
    return pl.DataFrame(out, schema=_SCHEMA)


def _row(job: str, trace_id: str, rows: list[dict[str, Any]], parts: dict[str, int],
         mfu_pct: float | None) -> dict[str, Any]:
    wall, available, productive = parts["wall"], parts["available"], parts["productive"]
    program = None if mfu_pct is None else min(max(mfu_pct / 100, 0.0), 1.0)
    good = None if program is None else round(productive * program)
    scheduling = available / wall if wall else None
    runtime = productive / available if available else None
    badput = {b: parts[b] for b in TIME_BADPUT}
    if good is not None:
        badput["program_badput"] = productive - good
    dominant = max(badput, key=lambda b: (badput[b], -BADPUT.index(b)))
    ended = next(r for r in rows if r["event"] == "ended")
    return {
        "job": job, "trace_id": trace_id, "submitted_ns": next(r["at_ns"] for r in rows if r["event"] == "submitted"),
        "ended_ns": ended["at_ns"], "wall_ns": wall, "available_ns": available,
        **{f"{b}_ns": parts[b] for b in TIME_BADPUT}, "productive_ns": productive,
        "program_badput_ns": badput.get("program_badput"), "goodput_ns": good,
        "checkpoints": sum(r["event"] == "checkpoint" for r in rows),
        "restarts": sum(r["event"] == "restart" for r in rows), "steps": ended["steps"],
        "scheduling_goodput": scheduling, "runtime_goodput": runtime, "program_goodput": program,
        "goodput": None if program is None or scheduling is None or runtime is None
        else scheduling * runtime * program,
        "dominant_badput": dominant if badput[dominant] > 0 else None,
        "dominant_badput_ns": badput[dominant] if badput[dominant] > 0 else None,
    }


def dominant_text(row: dict[str, Any]) -> str:
    """The largest badput of a :func:`per_job` row in words: ``"restarts lost 3.1 h (12%)"``; "" for none."""
    kind, ns, wall = row.get("dominant_badput"), row.get("dominant_badput_ns"), row.get("wall_ns")
    if not kind or not ns or not wall:
        return ""
    return f"{WORDS[kind]} {ns / 3.6e12:.1f} h ({100 * ns / wall:.0f}%)"
