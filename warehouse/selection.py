"""What an analysis of the warehouse reads: a selection of registered traces, and how a name resolves to one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tracelake.contracts.errors import InvalidArgument, NotFound

from . import trace_ids
from .store import Store


@dataclass(frozen=True)
class Selection:
    """What an analysis reads: its registered ``(job, trace_id)`` pairs, and the SQL filter with its parameters."""

    traces: tuple[tuple[str, str], ...]
    where: str
    params: list[Any]


def of(store: Store, trace_id: str | None, job: str | None) -> Selection:
    """The SQL filter for one trace or one job, checked to match something (on the file system)."""
    if trace_id is not None:  # a whole id or a unique prefix (warehouse/trace_ids.py)
        return Selection(((hit := trace(store, trace_id)),), "trace_id = ?", [hit[1]])
    if job is not None:
        if not (ids := store.job_traces(job)):
            raise NotFound(f"no traces in job {job!r}")
        return Selection(tuple((job, i) for i in ids), "job = ?", [job])
    raise InvalidArgument("give a trace id or a job")


def resolve(store: Store, name: str) -> Selection:
    """The selection ``name`` stands for: a trace id, else a job name, else a unique trace id prefix."""
    if (found := store.registered_job(name)) is not None:
        return Selection(((found, name),), "trace_id = ?", [name])
    if ids := store.job_traces(name):
        return Selection(tuple((name, i) for i in ids), "job = ?", [name])
    if (hit := trace_ids.resolve(store, name)) is not None:
        return Selection((hit,), "trace_id = ?", [hit[1]])
    hint = trace_ids.not_found_hint(name)
    raise NotFound(f"{name!r} is neither a trace id nor a job (see `tracelake traces`){hint}")


def trace(store: Store, text: str) -> tuple[str, str]:
    """``(job, trace_id)`` of the trace ``text`` names (an id or a unique prefix); NotFound, AmbiguousTraceId."""
    if (hit := trace_ids.resolve(store, text)) is None:
        raise NotFound(f"no trace with id {text!r}{trace_ids.not_found_hint(text)}")
    return hit
