"""Verify a warehouse: every registered trace whole, and nothing left over by a process that died.

A trace is registered by its ``traces`` file, which holds the row count of each
parsed table (:data:`COUNTED`); :func:`check` compares those counts with the row
counts in the footers of the trace's files, and looks for every other table's file.

What a process killed half way (SIGKILL, the out-of-memory killer, a stopped container)
can leave behind is invisible to queries but takes space and is listed as an
*orphan*:

* ``partial``: a data file of a trace that is not registered under that job (an
  ingest that died while publishing, a delete that died while removing);
* ``staging``: a staging folder (of a local ingest, or a Dask run's) in which
  nothing was written for ``stale_after`` seconds (an hour by default: a parse in
  progress keeps writing; a staged trace is published within moments);
* ``temp``: a hidden ``.*.tmp`` file whose writing process is gone (or, for the
  cache snapshots, which do not name their writer, older than ``stale_after``).

``repair=True`` removes the orphans. It never touches a registered trace: one
with missing files or wrong counts is reported, and the fix is to delete it and
ingest it again. The whole check holds the warehouse's write lock, so a
publication in progress is never mistaken for a dead one's leftovers (ingests
still parse meanwhile; only their last step waits), and readers are never blocked.
"""

from __future__ import annotations

import errno
import os
import shutil
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from . import schema
from .store import SCHEMA_JOB, TEMP_FILE, Store

#: The parsed tables whose row count a trace's ``traces`` row records, and the column recording it.
COUNTED: dict[str, str] = {
    "device_ops": "device_op_count",
    "host_ops": "host_op_count",
    "collectives": "collective_count",
    "steps": "step_count",
    "counters": "counter_count",
}

#: A snapshot under ``cache/`` being written: ``.<name>.parquet.<random>`` (tempfile.mkstemp).
_CACHE_TEMP_PREFIX = "."


@dataclass(frozen=True)
class Problem:
    """Something wrong with a registered trace.

    ``kind`` is ``missing`` (a table's file is absent), ``count`` (its row count is not the
    one registered), ``unreadable`` (its Parquet footer cannot be read) or ``duplicate``
    (the trace id is registered under more than one job).
    """

    trace_id: str
    job: str
    table: str
    kind: str
    detail: str


@dataclass
class Orphan:
    """A file or folder that belongs to no registered trace or live process; ``removed`` once repaired."""

    path: Path
    kind: str
    detail: str
    removed: bool = False


@dataclass
class CheckReport:
    """What :func:`check` found (and, with ``repair``, removed)."""

    home: Path
    traces: int = 0
    files: int = 0
    problems: list[Problem] = field(default_factory=list)
    orphans: list[Orphan] = field(default_factory=list)
    #: Staging folders and temporary files of live processes, left alone.
    in_use: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """True when no registered trace has a problem and no orphan is left."""
        return not self.problems and all(o.removed for o in self.orphans)

    @property
    def remaining(self) -> list[Orphan]:
        """The orphans still there."""
        return [o for o in self.orphans if not o.removed]

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data."""
        return {
            "home": str(self.home),
            "ok": self.ok,
            "traces": self.traces,
            "files": self.files,
            "in_use": self.in_use,
            "seconds": round(self.seconds, 3),
            "problems": [vars(p) for p in self.problems],
            "orphans": [{**vars(o), "path": str(o.path)} for o in self.orphans],
        }


#: Default age (seconds) past which an untouched staging folder or unnamed temporary file is left over.
STALE_AFTER = 3600.0


def check(store: Store, *, repair: bool = False, stale_after: float = STALE_AFTER) -> CheckReport:
    """Check every registered trace's files and counts, and list (``repair``: remove) orphans.

    Args:
        store: The warehouse's files.
        repair: Remove the orphans found.
        stale_after: Seconds without a write after which a staging folder, or a temporary file
            that does not name its process, counts as left over (0: every one; only when nothing
            else writes to the warehouse).

    Returns:
        The report; ``report.ok`` says whether the warehouse is healthy (after the repair).
    """
    started = time.perf_counter()
    report = CheckReport(store.home)
    with store.write_lock():
        registered = _registered(store, report)
        report.traces = len(registered)
        _check_traces(store, registered, report)
        _find_orphans(store, registered, report, stale_after)
        if repair:
            for orphan in report.orphans:
                orphan.removed = _remove(orphan)
    report.seconds = time.perf_counter() - started
    return report


# -- registered traces ---------------------------------------------------------------------
def _job_folders(store: Store, table: str) -> list[tuple[str, Path]]:
    folder = store.tables / table
    if not folder.is_dir():
        return []
    return sorted((p.name[4:], p) for p in folder.iterdir()
                  if p.is_dir() and p.name.startswith("job=") and p.name != f"job={SCHEMA_JOB}")


def _registered(store: Store, report: CheckReport) -> dict[tuple[str, str], dict[str, Any]]:
    """Every registration ``(job, trace_id) -> its counts``, read from the ``traces`` files."""
    registered: dict[tuple[str, str], dict[str, Any]] = {}
    jobs_of: dict[str, list[str]] = defaultdict(list)
    wanted = ["trace_id", *COUNTED.values()]
    for job, folder in _job_folders(store, "traces"):
        for path in sorted(folder.glob("*.parquet")):
            trace_id = path.stem
            report.files += 1
            try:
                table = pq.read_table(path)
                row = table.select([c for c in wanted if c in table.column_names]).to_pylist()
            except (OSError, pa.ArrowException) as exc:
                report.problems.append(Problem(trace_id, job, "traces", "unreadable", f"{path}: {exc}"))
                continue
            if len(row) != 1 or row[0].get("trace_id") != trace_id:
                report.problems.append(Problem(trace_id, job, "traces", "count",
                                               f"{path}: expected one row for trace {trace_id}, found {len(row)}"))
                continue
            registered[(job, trace_id)] = row[0]
            jobs_of[trace_id].append(job)
    for trace_id, jobs in jobs_of.items():
        if len(jobs) > 1:
            report.problems.append(Problem(trace_id, jobs[0], "traces", "duplicate",
                                           f"registered under {len(jobs)} jobs: {', '.join(jobs)}"))
    return registered


def _check_traces(store: Store, registered: dict[tuple[str, str], dict[str, Any]], report: CheckReport) -> None:
    for name in schema.DATA_TABLES:
        present: dict[str, set[str]] = {job: {p.stem for p in folder.glob("*.parquet")}
                                        for job, folder in _job_folders(store, name)}
        for (job, trace_id), counts in registered.items():
            if trace_id not in present.get(job, ()):
                hint = ("run `tracelake analyze --recompute`" if schema.TABLES[name].derived
                        else "delete the trace and ingest it again")
                report.problems.append(Problem(trace_id, job, name, "missing",
                                               f"{store.path(name, job, trace_id)} is missing ({hint})"))
                continue
            report.files += 1
            column = COUNTED.get(name)
            if column is None or counts.get(column) is None:
                continue
            path = store.path(name, job, trace_id)
            try:
                rows = pq.read_metadata(path).num_rows
            except (OSError, pa.ArrowException) as exc:
                report.problems.append(Problem(trace_id, job, name, "unreadable", f"{path}: {exc}"))
                continue
            if rows != counts[column]:
                report.problems.append(Problem(
                    trace_id, job, name, "count",
                    f"{path} holds {rows} rows, the registration says {counts[column]} "
                    "(delete the trace and ingest it again)"))


# -- orphans ----------------------------------------------------------------------------------
def _find_orphans(store: Store, registered: dict[tuple[str, str], dict[str, Any]], report: CheckReport,
                  stale_after: float) -> None:
    for name in schema.TABLES:
        table_folder = store.tables / name
        if not table_folder.is_dir():
            continue
        for folder in sorted(p for p in table_folder.iterdir() if p.is_dir() and p.name.startswith("job=")):
            job = folder.name[4:]
            for path in sorted(folder.iterdir()):
                if TEMP_FILE.match(path.name):
                    _temp(path, report)
                elif (job != SCHEMA_JOB and name != "traces" and path.suffix == ".parquet"
                      and (job, path.stem) not in registered):
                    report.orphans.append(Orphan(path, "partial",
                                                 f"{name} rows of trace {path.stem}, not registered in job {job}"))
    for path in sorted(store.home.iterdir()):
        if TEMP_FILE.match(path.name):
            _temp(path, report)
    now = time.time()
    cache = store.home / "cache"
    if cache.is_dir():
        for path in sorted(cache.iterdir()):
            if path.name.startswith(_CACHE_TEMP_PREFIX) and path.is_file():
                if now - path.stat().st_mtime >= stale_after:
                    report.orphans.append(Orphan(path, "temp", "a cache snapshot that was never finished"))
                else:
                    report.in_use += 1
    if store.staging_root.is_dir():
        for path in sorted(store.staging_root.iterdir()):
            if path.is_dir():
                age = now - _newest_mtime(path)
                if age >= stale_after:
                    report.orphans.append(Orphan(path, "staging",
                                                 f"staging folder untouched for {age:.0f} s (an ingest that died)"))
                else:
                    report.in_use += 1


def _temp(path: Path, report: CheckReport) -> None:
    match = TEMP_FILE.match(path.name)
    pid = int(match["pid"]) if match else 0
    if pid == os.getpid() or _alive(pid):
        report.in_use += 1
    else:
        report.orphans.append(Orphan(path, "temp", f"temporary file of process {pid}, which is gone"))


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def _newest_mtime(folder: Path) -> float:
    """The latest modification time of ``folder`` and everything in it (a file being written keeps it fresh)."""
    newest = 0.0
    for root, dirs, files in os.walk(folder):
        for name in [root, *(os.path.join(root, n) for n in (*dirs, *files))]:
            try:
                newest = max(newest, os.lstat(name).st_mtime)
            except FileNotFoundError:  # removed meanwhile
                continue
    return newest


def _remove(orphan: Orphan) -> bool:
    """Remove one orphan; True when it is gone."""
    try:
        if orphan.kind == "staging":
            shutil.rmtree(orphan.path)
        else:
            orphan.path.unlink(missing_ok=True)
    except FileNotFoundError:
        pass
    except OSError as exc:
        if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
        orphan.detail += f" (cannot remove: {exc.strerror})"
        return False
    return True
