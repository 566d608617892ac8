"""Job lifecycle files (docs/formats.md, "Job lifecycle") into ``job_lifecycle``: one row per event.

A lifecycle file is a small JSON object, written by a launcher or scheduler hook, that says
when a job was submitted, got its resources, made its first step, checkpointed, restarted and
ended. It is recognised by its ``"tracelake_lifecycle"`` key. Validation is strict: an unknown
key, a missing time, a time without a UTC offset or events out of order stop the ingest with the
JSON path of the value (``$.restarts[1].lost_since``), and nothing of the file is written.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from pathlib import Path
from typing import Any

from tracelake.contracts.errors import TraceFormatError

from .model import ParseOptions, TraceInfo
from .source import read_whole
from .tables import write_table

FORMAT = "job_lifecycle"
#: The key that marks a lifecycle file, and the only version of it this tracelake reads.
MARKER = "tracelake_lifecycle"
VERSION = 1
#: A lifecycle file is a few kilobytes; this bounds what a mislabelled file can make us read.
MAX_BYTES = 16 << 20
_MARKER = re.compile(rb'^\s*\{[^\0]*"' + MARKER.encode() + rb'"\s*:')
_TOP = {MARKER, "job", "submitted", "started", "first_step", "ended", "checkpoints", "restarts", "steps",
        "productive_step_seconds"}
_CHECKPOINT = {"at", "step", "seconds"}
_RESTART = {"at", "lost_since", "resumed"}
_COLUMNS = ("declared_job", "event", "seq", "at_ns", "step", "dur_ns", "lost_since_ns", "resumed_ns", "steps",
            "productive_ns")


def sniff(head: bytes, filename: str) -> bool:
    """A JSON object with a ``"tracelake_lifecycle"`` key (in the first 64 KiB)."""
    return _MARKER.match(head) is not None


class _Reader:
    """Reads values of the document, raising :class:`TraceFormatError` with the JSON path of a bad one."""

    def __init__(self, name: str) -> None:
        self.name = name

    def fail(self, path: str, message: str) -> TraceFormatError:
        return TraceFormatError(self.name, message, where=path)

    def obj(self, value: object, path: str, allowed: set[str]) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(path, f"expected an object, got {_kind(value)}")
        unknown = sorted(set(value) - allowed)
        if unknown:
            raise self.fail(f"{path}.{unknown[0]}",
                            f"unknown key {unknown[0]!r}; allowed: {', '.join(sorted(allowed))}")
        return value

    def time(self, doc: dict[str, Any], key: str, path: str) -> int:
        """The ISO 8601 time (with a UTC offset) at ``doc[key]``, as ns since the epoch; it must be there."""
        moment = self.maybe_time(doc, key, path)
        if moment is None:
            raise self.fail(f"{path}.{key}", f"missing {key!r} (an ISO 8601 time such as 2026-12-01T08:00:00Z)")
        return moment

    def maybe_time(self, doc: dict[str, Any], key: str, path: str) -> int | None:
        """As :meth:`time`, None where ``key`` is absent."""
        where = f"{path}.{key}"
        if key not in doc:
            return None
        value = doc[key]
        if not isinstance(value, str):
            raise self.fail(where, f"expected an ISO 8601 time as a string, got {_kind(value)}")
        try:
            moment = dt.datetime.fromisoformat(value)
        except ValueError:
            raise self.fail(where, f"{value!r} is not an ISO 8601 time (e.g. 2026-12-01T08:00:00Z)") from None
        if moment.tzinfo is None:
            raise self.fail(where, f"{value!r} has no UTC offset: end it with Z or +HH:MM")
        delta = moment - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
        ns = (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1000
        if not -(1 << 63) <= ns < 1 << 63:
            raise self.fail(where, f"{value!r} is out of range (years 1678 to 2262)")
        return ns

    def count(self, doc: dict[str, Any], key: str, path: str) -> int | None:
        value = doc.get(key)
        if key in doc and (not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 1 << 63):
            raise self.fail(f"{path}.{key}", f"expected a whole number >= 0, got {value!r}")
        return value

    def seconds(self, doc: dict[str, Any], key: str, path: str) -> int | None:
        """``doc[key]`` seconds (a number from 0 to 1e9) as ns; None where ``key`` is absent."""
        if key not in doc:
            return None
        value = doc[key]
        if (not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value) or value < 0
                or value > 1e9):
            raise self.fail(f"{path}.{key}", f"expected seconds, a number from 0 to 1e9, got {value!r}")
        return round(value * 1e9)

    def order(self, earlier: tuple[str, int | None], later: tuple[str, int | None], where: str) -> None:
        """Refuse ``later`` (name, ns) before ``earlier``; either may be absent (None)."""
        if earlier[1] is not None and later[1] is not None and later[1] < earlier[1]:
            raise self.fail(where, f"{later[0]} ({_iso(later[1])}) is before {earlier[0]} ({_iso(earlier[1])})")


def _iso(ns: int) -> str:
    return (dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=ns // 1000)).isoformat()


def _kind(value: object) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "true/false", type(None): "null"}.get(
        type(value), "a number")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    repeated = sorted({k for k in keys if keys.count(k) > 1})
    if repeated:
        raise ValueError(f"key {repeated[0]!r} given twice")
    return dict(pairs)


def read(data: bytes, name: str) -> dict[str, list[object]]:
    """The ``job_lifecycle`` columns of a lifecycle document (``declared_job`` .. ``productive_ns``).

    Raises:
        TraceFormatError: not valid JSON, or a value that breaks docs/formats.md, "Job lifecycle"
            (the message names the file and the JSON path).
    """
    r = _Reader(name)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TraceFormatError(name, "not UTF-8 text", where=f"byte {e.start}") from None
    try:
        doc = json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as e:
        raise TraceFormatError(name, f"not valid JSON: {e.msg}", where=f"byte {len(text[:e.pos].encode())}") from None
    except (ValueError, RecursionError) as e:  # a repeated key (_no_duplicates), or nesting too deep
        raise TraceFormatError(name, str(e) if isinstance(e, ValueError) else "nested too deep", where="$") from None
    doc = r.obj(doc, "$", _TOP)
    version = doc.get(MARKER)
    if version != VERSION or isinstance(version, bool):
        raise r.fail(f"$.{MARKER}", f"unsupported version {version!r}; this tracelake reads version {VERSION}")
    job = doc.get("job")
    if not isinstance(job, str) or not job.strip():
        raise r.fail("$.job", "expected the job's name, a non-empty string")
    moments = {key: r.time(doc, key, "$") for key in ("submitted", "started", "first_step", "ended")}
    marks = [(k, moments[k]) for k in ("submitted", "started", "first_step", "ended")]
    for earlier, later in zip(marks, marks[1:]):
        r.order(earlier, later, f"$.{later[0]}")
    first, ended = moments["first_step"], moments["ended"]
    if ended <= moments["started"]:
        raise r.fail("$.ended", "ended must be after started (the job held its resources for no time)")
    rows: dict[str, list[object]] = {c: [] for c in _COLUMNS}

    def add(**values: object) -> None:
        for c in _COLUMNS:
            rows[c].append(values.get(c))

    for key in ("submitted", "started", "first_step"):
        add(event=key, seq=0, at_ns=moments[key])
    for i, item in enumerate(_list(r, doc, "checkpoints")):
        path = f"$.checkpoints[{i}]"
        c = r.obj(item, path, _CHECKPOINT)
        at = r.time(c, "at", path)
        dur = r.seconds(c, "seconds", path)
        if dur is None:
            raise r.fail(f"{path}.seconds", "missing 'seconds' (how long the checkpoint blocked the job)")
        r.order(("first_step", first), ("at", at), f"{path}.at")
        if at + dur > ended:
            raise r.fail(f"{path}.seconds", "the checkpoint ends after the job ended")
        add(event="checkpoint", seq=i, at_ns=at, step=r.count(c, "step", path), dur_ns=dur)
    for i, item in enumerate(_list(r, doc, "restarts")):
        path = f"$.restarts[{i}]"
        c = r.obj(item, path, _RESTART)
        at, lost, resumed = r.time(c, "at", path), r.time(c, "lost_since", path), r.maybe_time(c, "resumed", path)
        r.order(("first_step", first), ("lost_since", lost), f"{path}.lost_since")
        r.order(("lost_since", lost), ("at", at), f"{path}.at")
        r.order(("at", at), ("ended", ended), f"{path}.at")
        r.order(("at", at), ("resumed", resumed), f"{path}.resumed")
        r.order(("resumed", resumed), ("ended", ended), f"{path}.resumed")
        add(event="restart", seq=i, at_ns=at, lost_since_ns=lost, resumed_ns=resumed)
    productive = r.seconds(doc, "productive_step_seconds", "$")
    if productive is not None and productive > ended - first:
        raise r.fail("$.productive_step_seconds", "more than the time from first_step to ended")
    add(event="ended", seq=0, at_ns=ended, steps=r.count(doc, "steps", "$"), productive_ns=productive)
    rows["declared_job"] = [job] * len(rows["event"])
    return rows


def _list(r: _Reader, doc: dict[str, Any], key: str) -> list[object]:
    value = doc.get(key, [])
    if not isinstance(value, list):
        raise r.fail(f"$.{key}", f"expected a list, got {_kind(value)}")
    return value


def parse(source: Path, staging: Path, options: ParseOptions) -> TraceInfo:
    """Parse one job lifecycle file into ``job_lifecycle``.

    Raises:
        TraceFormatError: as :func:`read`; nothing is written then.
    """
    data = read_whole(source, on_bytes=options.on_bytes, name=options.source_name, limit=MAX_BYTES)
    rows = read(data, options.source_name)
    write_table(staging, "job_lifecycle", rows, trace_id=options.trace_id)
    times = [t for t in rows["at_ns"] if isinstance(t, int)]
    info = TraceInfo(format=FORMAT, event_count=len(rows["event"]), uncompressed_bytes=len(data),
                     start_ns=min(times), end_ns=max(times), rank_source="job lifecycle (one file per job)")
    return info
