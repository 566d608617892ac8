"""Runs within a job, for the facade: each trace's run, and an analysis made run by run.

The grouping rule is :func:`tracelake.analysis.runs.group_runs` (docs/analyses.md, "Runs
within a job"). A job of several runs is analysed once per run and the frames put
together with a ``run`` column, so that rank 1 of one run is never lined up with rank 1
of another; a job of one run is analysed as before, without the column.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

import polars as pl
from tracelake.analysis.runs import Runs, group_runs
from tracelake.contracts.lazy import lazy_module
from tracelake.contracts.status import IngestStatus

from .results import IngestResult

if TYPE_CHECKING:
    from tracelake.analysis import assemble, findings
    from tracelake.analysis.assemble import Analysis
else:  # an ingest only warns of repeated ranks (warn_repeats): the analyses load when a run is analysed
    assemble, findings = (lazy_module(f"tracelake.analysis.{name}") for name in ("assemble", "findings"))

#: A selection's ``(job, trace_id)`` pairs.
Pairs = Sequence[tuple[str, str]]


class _Selected(Protocol):
    """The facade's selection: ``traces`` (pairs), ``where`` (SQL) and ``params``, a dataclass."""

    @property
    def traces(self) -> tuple[tuple[str, str], ...]: ...


S = TypeVar("S", bound=_Selected)


class RunCache:
    """The runs of every job of a registry frame, computed again only when the frame changes; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._frame: pl.DataFrame | None = None
        self._runs: Runs | None = None

    def runs(self, registry: pl.DataFrame) -> Runs:
        """The runs of ``registry`` (every ``traces`` row, with ``job``)."""
        with self._lock:
            if self._runs is None or registry is not self._frame:
                self._runs = group_runs(registry)
                self._frame = registry
            return self._runs

    def with_run(self, traces: pl.DataFrame, registry: pl.DataFrame) -> pl.DataFrame:
        """``traces`` (rows of ``registry``) with each trace's ``run`` after its ``job``, in the same order."""
        assignment = self.runs(registry).assignment
        joined = traces.join(assignment, on=["job", "trace_id"], how="left", maintain_order="left")
        order = [c for c in traces.columns if c != "run"]
        at = order.index("job") + 1 if "job" in order else 0
        return joined.select(*order[:at], "run", *order[at:])

    def run_of(self, registry: pl.DataFrame, trace_id: str) -> str | None:
        """The run of one trace, or None when the registry does not hold it (yet)."""
        found = self.runs(registry).assignment.filter(pl.col("trace_id") == trace_id)
        return found["run"][0] if found.height else None


def narrow(selection: S, pairs: Pairs) -> S:
    """``selection`` (traces, SQL filter, parameters) cut down to ``pairs``, a part of its traces."""
    if len(pairs) == len(selection.traces):
        return selection
    ids = [trace_id for _, trace_id in pairs]
    return cast(S, dataclasses.replace(cast(Any, selection), traces=tuple(pairs),
                                       where=f"trace_id IN ({', '.join('?' * len(ids))})", params=ids))


def selection_runs(runs: Runs, pairs: Pairs) -> tuple[dict[str, list[tuple[str, str]]], pl.DataFrame]:
    """The selection's traces by run (in run order), and those runs' summary rows.

    A trace the runs do not know (registered a moment ago) goes with the first run.
    """
    wanted = {trace_id for _, trace_id in pairs}
    jobs = {job for job, _ in pairs}
    assignment = runs.assignment.filter(pl.col("trace_id").is_in(list(wanted)) & pl.col("job").is_in(list(jobs)))
    run_of = dict(zip(assignment["trace_id"].to_list(), assignment["run"].to_list()))
    summary = runs.summary.filter(pl.col("job").is_in(list(jobs)) & pl.col("run").is_in(list(set(run_of.values()))))
    groups: dict[str, list[tuple[str, str]]] = {run: [] for run in summary["run"].to_list()}
    first = next(iter(groups), "")
    for pair in pairs:
        groups.setdefault(run_of.get(pair[1], first), []).append(pair)
    return {run: members for run, members in groups.items() if members}, summary


def analyze_by_run(runs: Runs, pairs: Pairs, analyze: Callable[[list[tuple[str, str]]], Analysis]) -> Analysis:
    """The analysis of a selection, made once per run when it spans several (see the module docstring).

    ``analyze`` analyses a list of ``(job, trace_id)`` pairs. The result's ``runs`` frame holds the
    summary of the selection's runs, with a ``warning`` per run whose ranks repeat; each repeated rank
    is also a finding.
    """
    groups, summary = selection_runs(runs, pairs)
    if len(groups) <= 1:
        result = analyze(list(pairs))
    else:
        result = merge({run: analyze(members) for run, members in groups.items()})
    repeats = [r for r in runs.repeats if r.run in groups and r.job in {job for job, _ in pairs}]
    warnings: dict[tuple[str, str], list[str]] = {(r.job, r.run): [] for r in repeats}
    for r in repeats:
        warnings[(r.job, r.run)].append(r.message())
    result.runs = summary.with_columns(pl.Series("warning", [
        "; ".join(warnings.get((job, run), [])) or None for job, run in summary.select("job", "run").rows()
    ], dtype=pl.String))
    result.findings = _ordered(result.findings + [
        findings.Finding("repeated_rank", f"rank {r.rank} appears in {len(r.trace_ids)} traces of {r.run}",
                         r.message(), 0)
        for r in repeats
    ])
    return result


def merge(parts: dict[str, Analysis]) -> Analysis:
    """Analyses of several runs as one: every frame with a leading ``run`` column, every finding naming its run."""
    frames: dict[str, object] = {}
    first = next(iter(parts.values()))
    for spec in dataclasses.fields(assemble.Analysis):
        if spec.name in ("findings", "runs"):
            continue
        if not isinstance(getattr(first, spec.name), pl.DataFrame):  # not a frame: the first run's
            frames[spec.name] = getattr(first, spec.name)
            continue
        pieces = [
            frame.select(pl.lit(run, dtype=pl.String).alias("run"), pl.all())
            for run, part in parts.items()
            if isinstance(frame := getattr(part, spec.name), pl.DataFrame) and frame.width and frame.height
        ]
        frames[spec.name] = pl.concat(pieces, how="diagonal_relaxed") if pieces else _with_run(getattr(first, spec.name))
    merged = assemble.Analysis(**frames)  # type: ignore[arg-type]
    merged.findings = _ordered([
        dataclasses.replace(f, title=f"in {run}, {f.title}") for run, part in parts.items() for f in part.findings
    ])
    return merged


def _ordered(found: list[findings.Finding]) -> list[findings.Finding]:
    """Findings already bounded per run, in the order :func:`tracelake.analysis.findings.rank` gives: gain first."""
    return sorted(found, key=lambda f: (f.kind != "hang", -f.gain_ns))


def _with_run(frame: pl.DataFrame) -> pl.DataFrame:
    """An empty frame with a ``run`` column first, keeping its other columns."""
    if not isinstance(frame, pl.DataFrame) or not frame.width:
        return pl.DataFrame(schema={"run": pl.String})
    return frame.clear().select(pl.lit(None, dtype=pl.String).alias("run"), pl.all())


def warn_repeats(runs: Runs, results: Sequence[IngestResult]) -> None:
    """Add to each just-ingested trace's warnings the ranks it repeats within its run (a run mixing recordings?)."""
    for result in results:
        if result.status != IngestStatus.INGESTED:
            continue
        for repeat in runs.repeats:
            if result.trace_id in repeat.trace_ids and repeat.message() not in result.warnings:
                result.warnings.append(repeat.message())
