"""Runs within a job: which of a job's traces were recorded together (docs/analyses.md, "Runs within a job").

A job name is whatever the user ingested under; it may hold several runs of a
program (yesterday's and today's, or two experiments side by side). Analyses that
line ranks up (stragglers, collectives, the breakdown per rank) must not put rank 1
of one run next to rank 1 of another, so a job's traces are grouped into runs:

1. A trace with a ``run`` label (``--label run=NAME``) is in the run of that name.
2. Other traces with a time span join, in start order, a run they overlap in time
   whose world size is the same (an unknown world size matches any); one that
   overlaps none starts a new run.
3. Traces without a time span (nccl-tests output, some NCCL logs) join the job's one
   run from rule 2 of a matching world size when there is exactly one; otherwise they
   form a run per world size.

Runs from rules 2 and 3 are named ``run-1``, ``run-2``, ... in order of their first
start (those without times last), skipping names a ``run`` label took. A rank that
appears in two traces of one format in a run is reported: the run probably mixes two
recordings (label them apart with ``run``). nccl-tests output has no per-rank timeline,
so it never counts as a repeat.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import polars as pl

#: The label that names a trace's run outright.
RUN_LABEL = "run"
#: Formats whose traces are not one rank's timeline (a benchmark summary): a repeated rank means nothing.
NO_RANK_TIMELINE = frozenset({"nccl_tests"})
#: The columns :func:`group_runs` reads (``job`` is optional: without it, one job).
COLUMNS = ("trace_id", "rank", "format", "world_size", "start_ns", "end_ns", "labels")

#: How a run was formed.
LABEL, TIME, UNTIMED = "label", "time", "untimed"


@dataclass(frozen=True)
class RankRepeat:
    """A rank that appears in more than one trace of one format within a run."""

    job: str
    run: str
    rank: int
    format: str
    trace_ids: tuple[str, ...]

    def message(self) -> str:
        """The warning in words, with what to do about it."""
        return (f"job {self.job!r}, run {self.run}: rank {self.rank} appears in {len(self.trace_ids)} "
                f"{self.format} traces ({', '.join(self.trace_ids)}); they are analysed together. If they come "
                f"from different runs, ingest each with --label {RUN_LABEL}=NAME")


@dataclass
class Runs:
    """The runs of some jobs' traces: each trace's run, a summary per run, and the repeated ranks."""

    #: One row per trace: ``job``, ``trace_id``, ``run``.
    assignment: pl.DataFrame
    #: One row per run: ``job``, ``run``, ``rule`` (label/time/untimed), ``traces``, ``ranks``, ``world_size``,
    #: ``start_ns``, ``end_ns``, ``repeated_ranks``, ``trace_ids``.
    summary: pl.DataFrame
    repeats: list[RankRepeat] = field(default_factory=list)

    @property
    def warnings(self) -> list[str]:
        """One message per repeated rank."""
        return [r.message() for r in self.repeats]


def run_label(labels: Any) -> str | None:
    """The ``run`` label of a ``traces`` row's labels (a dict, or key/value entries), if any."""
    if isinstance(labels, dict):
        value = labels.get(RUN_LABEL)
        return None if value is None else str(value)
    if isinstance(labels, list):
        for entry in labels:
            if isinstance(entry, dict) and entry.get("key") == RUN_LABEL:
                value = entry.get("value")
                return None if value is None else str(value)
            if isinstance(entry, (tuple, list)) and len(entry) == 2 and entry[0] == RUN_LABEL:
                return str(entry[1])
    return None


@dataclass
class _Run:
    name: str | None
    rule: str
    world_size: int | None
    start: int | None
    reach: int | None
    members: list[int] = field(default_factory=list)


def _fits(run_size: int | None, size: int | None) -> bool:
    return run_size is None or size is None or run_size == size


def _job_runs(rows: list[dict[str, Any]]) -> dict[int, _Run]:
    """Group one job's rows (indexes into ``rows``) into runs; names of automatic runs are set later."""
    run_of: dict[int, _Run] = {}
    labelled: dict[str, _Run] = {}
    timed: list[int] = []
    untimed: list[int] = []
    for i, row in enumerate(rows):
        label = run_label(row["labels"])
        if label is not None:
            run = labelled.setdefault(label, _Run(label, LABEL, None, None, None))
            run.members.append(i)
            run_of[i] = run
        elif row["start_ns"] is not None and row["end_ns"] is not None:
            timed.append(i)
        else:
            untimed.append(i)
    timed.sort(key=lambda i: (rows[i]["start_ns"], rows[i]["end_ns"], rows[i]["trace_id"]))
    auto: list[_Run] = []
    active: list[_Run] = []  # runs a later trace may still overlap (traces come in start order)
    for i in timed:
        start, size = rows[i]["start_ns"], rows[i]["world_size"]
        end = max(start, rows[i]["end_ns"])
        active = [r for r in active if r.reach is not None and r.reach >= start]
        open_runs = [r for r in active if _fits(r.world_size, size)]
        if open_runs:  # an exact world size first, then the earliest run
            run = min(open_runs, key=lambda r: (r.world_size != size, r.start or 0))
        else:
            run = _Run(None, TIME, size, start, end)
            auto.append(run)
            active.append(run)
        run.members.append(i)
        run.reach = max(run.reach or end, end)
        if run.world_size is None:
            run.world_size = size
        run_of[i] = run
    leftover: dict[int | None, _Run] = {}
    timed_runs = list(auto)
    for i in sorted(untimed, key=lambda i: rows[i]["trace_id"]):
        size = rows[i]["world_size"]
        matching = [r for r in timed_runs if _fits(r.world_size, size)][:2]
        if len(matching) == 1:
            run = matching[0]
        elif size in leftover:
            run = leftover[size]
        else:
            run = leftover[size] = _Run(None, UNTIMED, size, None, None)
            auto.append(run)
        run.members.append(i)
        run_of[i] = run
    taken = set(labelled)
    number = 0
    for run in auto:  # timed runs in start order, then the untimed ones
        number += 1
        while f"run-{number}" in taken:
            number += 1
        run.name = f"run-{number}"
    return run_of


def group_runs(traces: pl.DataFrame) -> Runs:
    """Group traces into runs, job by job, by the rules of this module's docstring.

    Args:
        traces: ``traces`` rows with the :data:`COLUMNS` (``labels`` as a dict or key/value entries)
            and, for several jobs, ``job``.

    Returns:
        Each trace's run, one summary row per run, and the ranks repeated within a run.
    """
    missing = [c for c in COLUMNS if c not in traces.columns]
    if missing:
        raise ValueError(f"group_runs needs the traces columns {', '.join(missing)}")
    frame = traces if "job" in traces.columns else traces.with_columns(pl.lit("").alias("job"))
    by_job: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in frame.select("job", *COLUMNS).to_dicts():
        by_job[row["job"]].append(row)
    assigned: list[dict[str, Any]] = []
    summary: list[dict[str, Any]] = []
    repeats: list[RankRepeat] = []
    for job in sorted(by_job):
        rows = by_job[job]
        run_of = _job_runs(rows)
        seen: dict[int, _Run] = {}
        for i, run in run_of.items():
            seen.setdefault(id(run), run)
            assigned.append({"job": job, "trace_id": rows[i]["trace_id"], "run": run.name})
        for run in sorted(seen.values(), key=lambda r: str(r.name)):
            members = [rows[i] for i in run.members]
            repeated = _repeats(job, str(run.name), members)
            repeats += repeated
            starts = [m["start_ns"] for m in members if m["start_ns"] is not None]
            ends = [m["end_ns"] for m in members if m["end_ns"] is not None]
            sizes = sorted({m["world_size"] for m in members if m["world_size"] is not None})
            summary.append({
                "job": job, "run": run.name, "rule": run.rule, "traces": len(members),
                "ranks": len({m["rank"] for m in members if m["rank"] is not None}),
                "world_size": sizes[0] if len(sizes) == 1 else None,
                "start_ns": min(starts) if starts else None, "end_ns": max(ends) if ends else None,
                "repeated_ranks": sorted({r.rank for r in repeated}),
                "trace_ids": sorted(m["trace_id"] for m in members),
            })
    return Runs(
        pl.DataFrame(assigned, schema={"job": pl.String, "trace_id": pl.String, "run": pl.String}),
        pl.DataFrame(summary, schema=SUMMARY_SCHEMA).sort("job", "start_ns", "run", nulls_last=True),
        repeats,
    )


#: The columns of :attr:`Runs.summary`.
SUMMARY_SCHEMA: dict[str, Any] = {
    "job": pl.String, "run": pl.String, "rule": pl.String, "traces": pl.Int64, "ranks": pl.Int64,
    "world_size": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64, "repeated_ranks": pl.List(pl.Int64),
    "trace_ids": pl.List(pl.String),
}


def _repeats(job: str, run: str, members: list[dict[str, Any]]) -> list[RankRepeat]:
    by_rank: dict[tuple[int, str], list[str]] = defaultdict(list)
    for m in members:
        if m["rank"] is not None and m["format"] not in NO_RANK_TIMELINE:
            by_rank[(m["rank"], m["format"])].append(m["trace_id"])
    return [RankRepeat(job, run, rank, fmt, tuple(sorted(ids)))
            for (rank, fmt), ids in sorted(by_rank.items()) if len(ids) > 1]
