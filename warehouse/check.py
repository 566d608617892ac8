"""Verify a warehouse: registered traces whole, files in place, the catalog as written, no leftovers.

A trace is registered by its ``traces`` file, which holds the row count of each
parsed table (:data:`COUNTED`); :func:`check` compares those counts with the row
counts in the footers of the trace's files, and looks for every other table's file,
except those of tables newer than the schema version the trace was written under
(``traces.schema_version``; :data:`TABLE_SINCE`), which it counts apart.

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

What no tracelake process writes is looked for too, since whoever can write to
the warehouse's folder (a bug, or a hole in a sandbox) can change what every reader
sees (:mod:`.check_layout`):

* ``stray`` (an orphan): anything under ``tables/`` that does not fit the layout;
* problems ``unreadable``, ``schema``, ``foreign`` and ``rows``: a file in its place
  that is not Parquet, has another schema than the declared one, holds rows of other
  traces, or a row count its kind never has (a ``traces`` file holds one, a ``_schema`` file none);
* ``catalog``: ``tracelake.duckdb`` does not hold exactly the views tracelake writes.

``repair=True`` removes the orphans of dead processes, moves strays and faulty files
aside into ``quarantine/<UTC time>/`` (never deleting them), rewrites missing or faulty
``_schema`` files and the catalog. A registered trace is never changed otherwise: one
with missing files or wrong counts is reported, and the fix is to delete it and
ingest it again (a faulty file moved aside leaves its trace with that file missing; a
faulty ``traces`` file moved aside unregisters its trace, whose files are moved aside
with it). The whole check holds the warehouse's write lock, so a
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
from typing import Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq

from tracelake.contracts import schema
from tracelake.contracts.lazy import duckdb

from . import catalog
from .check_layout import QUARANTINE, Footer, Layout, Quarantine, inspect, walk
from .store import SCHEMA_JOB, TEMP_FILE, Store

#: The parsed tables whose row count a trace's ``traces`` row records, and the column recording it.
COUNTED: dict[str, str] = {
    "device_ops": "device_op_count",
    "host_ops": "host_op_count",
    "collectives": "collective_count",
    "steps": "step_count",
    "counters": "counter_count",
}

#: Each registered ``(job, trace_id)`` and its ``traces`` row (the counts).
Registrations = dict[tuple[str, str], dict[str, Any]]

#: A snapshot under ``cache/`` being written: ``.<name>.parquet.<random>`` (tempfile.mkstemp).
_CACHE_TEMP_PREFIX = "."


ProblemKind = Literal["missing", "count", "unreadable", "duplicate", "schema", "foreign", "rows", "catalog"]
OrphanKind = Literal["partial", "staging", "temp", "stray"]

_REINGEST = "delete the trace and ingest it again"

#: The schema version each parsed table first appeared in, for those newer than the first warehouses: a trace
#: registered under an older version (its ``traces.schema_version``) has no file of them, and that is not a problem
#: (counted in :attr:`CheckReport.not_in_version`). Derived tables are left out: ``--recompute`` writes them for any
#: trace, so their absence stays a problem with that fix. Versions as found in warehouses of versions 7 and 8.
TABLE_SINCE: dict[str, int] = {"memory_events": 8, "memory_timeline": 8, "allocator_segments": 8,
                               "allocator_events": 8, "et_nodes": 8}
_RECOMPUTE = "run `tracelake analyze --recompute`"


@dataclass(frozen=True)
class Problem:
    """Something wrong with a registered trace, a file in its place, or the catalog.

    ``kind`` is ``missing`` (a table's file is absent), ``count`` (its row count is not the
    one registered), ``unreadable`` (its Parquet footer cannot be read), ``duplicate`` (the
    trace id is registered under more than one job), ``schema`` / ``foreign`` / ``rows`` (a
    file whose schema is not the declared one, that holds rows of other traces, or more rows
    than a file of its kind), or ``catalog`` (``table`` names the catalog object that is
    missing, extra or different). ``repair`` says what ``--repair`` did or would do;
    ``fixed`` whether it put the problem right.
    """

    trace_id: str
    job: str
    table: str
    kind: ProblemKind
    detail: str
    repair: str = ""
    fixed: bool = False


@dataclass
class Orphan:
    """A file or folder that belongs to no registered trace or live process; ``removed`` once repaired.

    ``quarantine``: ``--repair`` moves it aside (to ``moved_to``) rather than deleting it.
    """

    path: Path
    kind: OrphanKind
    detail: str
    removed: bool = False
    quarantine: bool = False
    moved_to: Path | None = None

    @property
    def repair(self) -> str:
        """What ``--repair`` did or would do with it."""
        if self.moved_to is not None:
            return f"moved to {self.moved_to}"
        if self.removed:
            return "removed"
        return f"--repair moves it to {QUARANTINE}/" if self.quarantine else "--repair removes it"


@dataclass
class CheckReport:
    """What :func:`check` found (and, with ``repair``, put right)."""

    home: Path
    traces: int = 0
    files: int = 0
    problems: list[Problem] = field(default_factory=list)
    orphans: list[Orphan] = field(default_factory=list)
    #: Staging folders and temporary files of live processes, left alone.
    in_use: int = 0
    #: Files a registered trace lacks because its schema version predates their table (:data:`TABLE_SINCE`).
    not_in_version: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """True when every problem was put right and no orphan is left."""
        return all(p.fixed for p in self.problems) and all(o.removed for o in self.orphans)

    @property
    def remaining(self) -> list[Orphan]:
        """The orphans still there."""
        return [o for o in self.orphans if not o.removed]

    @property
    def unresolved(self) -> list[Problem]:
        """The problems not put right."""
        return [p for p in self.problems if not p.fixed]

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data."""
        return {
            "home": str(self.home),
            "ok": self.ok,
            "traces": self.traces,
            "files": self.files,
            "in_use": self.in_use,
            "not_in_version": self.not_in_version,
            "seconds": round(self.seconds, 3),
            "problems": [vars(p) for p in self.problems],
            "orphans": [{**vars(o), "path": str(o.path), "moved_to": o.moved_to and str(o.moved_to),
                         "repair": o.repair} for o in self.orphans],
        }


#: Default age (seconds) past which an untouched staging folder or unnamed temporary file is left over.
STALE_AFTER = 3600.0


def check(store: Store, *, repair: bool = False, stale_after: float = STALE_AFTER) -> CheckReport:
    """Check every registered trace, every file under ``tables/`` and the catalog; list (``repair``: clear) orphans.

    Args:
        store: The warehouse's files.
        repair: Remove the orphans of dead processes, move strays and faulty files aside into
            ``quarantine/``, write missing or faulty ``_schema`` files and the catalog again.
        stale_after: Seconds without a write after which a staging folder, or a temporary file
            that does not name its process, counts as left over (0: every one; only when nothing
            else writes to the warehouse).

    Returns:
        The report; ``report.ok`` says whether the warehouse is healthy (after the repair).
    """
    started = time.perf_counter()
    report = CheckReport(store.home)
    quarantine = Quarantine(store.home) if repair else None
    with store.write_lock():
        layout = walk(store)
        report.orphans += [Orphan(path, "stray", why, quarantine=True) for path, why in layout.strays]
        if quarantine is not None:  # first: a table folder that is a file must go before its schema file is written
            for orphan in report.orphans:
                _remove(orphan, quarantine)
        footers = {f.path: inspect(f.path, f.table, f.trace_id) for f in layout.files}
        report.files = len(footers)
        registered = _registered(layout, footers, report)
        report.traces = len(registered)
        moved = _file_problems(layout, footers, registered, report, quarantine)
        _check_schema_files(store, layout, report, quarantine)
        _check_traces(store, footers, moved, registered, report)
        _find_orphans(store, layout, footers, registered, report, stale_after)
        if quarantine is not None:
            for orphan in report.orphans:
                _remove(orphan, quarantine)
        _check_catalog(store, report, quarantine)
    report.seconds = time.perf_counter() - started
    return report


# -- registered traces and the files in their places -----------------------------------------
def _registered(layout: Layout, footers: dict[Path, Footer], report: CheckReport) -> Registrations:
    """Every registration ``(job, trace_id) -> its counts``, read from the sound ``traces`` files."""
    registered: Registrations = {}
    jobs_of: dict[str, list[str]] = defaultdict(list)
    wanted = ["trace_id", "schema_version", *COUNTED.values()]
    for f in layout.files:
        if f.table != "traces" or footers[f.path].fault is not None:
            continue
        try:
            table = pq.read_table(f.path)
            row = table.select([c for c in wanted if c in table.column_names]).to_pylist()
        except (OSError, pa.ArrowException) as exc:
            report.problems.append(Problem(f.trace_id, f.job, "traces", "unreadable", f"{f.path}: {exc}",
                                           "none: look at the file"))
            continue
        registered[(f.job, f.trace_id)] = row[0]
        jobs_of[f.trace_id].append(f.job)
    for trace_id, jobs in jobs_of.items():
        if len(jobs) > 1:
            report.problems.append(Problem(trace_id, jobs[0], "traces", "duplicate",
                                           f"registered under {len(jobs)} jobs: {', '.join(jobs)}",
                                           "none: delete it from all but one job"))
    return registered


def _file_problems(layout: Layout, footers: dict[Path, Footer], registered: Registrations,
                   report: CheckReport, quarantine: Quarantine | None) -> set[Path]:
    """Report each file whose footer is at fault (and move it aside); returns the files moved."""
    moved: set[Path] = set()
    for f in layout.files:
        footer = footers[f.path]
        if footer.fault is None:
            continue
        if f.table == "traces":
            after = "which unregisters the trace (its files go aside too; ingest it again if it is genuine)"
        elif (f.job, f.trace_id) in registered:
            after = f"then {_RECOMPUTE if schema.TABLES[f.table].derived else _REINGEST}"
        else:
            after = ""
        fixed = False
        if not footer.movable:
            repair = "none: look at the file"
        elif quarantine is None:
            repair = f"--repair moves it to {QUARANTINE}/"
        else:
            repair = f"moved to {quarantine.move(f.path)}"
            moved.add(f.path)
            fixed = True
        repair += f", {after}" if after and footer.movable else ""
        report.problems.append(Problem(f.trace_id, f.job, f.table, footer.fault, f"{f.path}: {footer.detail}",
                                       repair, fixed))
    return moved


def _check_schema_files(store: Store, layout: Layout, report: CheckReport, quarantine: Quarantine | None) -> None:
    """Each table's ``_schema`` file: there, with the declared schema and no rows (else moved aside, written again)."""
    faulty: list[tuple[str, ProblemKind, str, bool, Path | None]] = []
    for name in schema.TABLES:
        path = layout.schema_files.get(name)
        if path is None:
            faulty.append((name, "missing", f"{store.schema_file(name)} is missing", True, None))
            continue
        report.files += 1
        footer = inspect(path, name, None)
        if footer.fault is not None:
            moved = quarantine.move(path) if quarantine is not None and footer.movable else None
            faulty.append((name, footer.fault, f"{path}: {footer.detail}", footer.movable, moved))
    if not faulty:
        return
    if quarantine is not None:
        store.initialise()  # writes the schema files that are not there
    for name, kind, detail, movable, moved in faulty:
        fixed = quarantine is not None and inspect(store.schema_file(name), name, None).fault is None
        if not movable or (quarantine is not None and not fixed):
            repair = "none: look at the file"
        elif kind == "missing":
            repair = "written" if fixed else "--repair writes it"
        elif moved is not None:
            repair = f"moved to {moved} and written again"
        else:
            repair = f"--repair moves it to {QUARANTINE}/ and writes it again"
        report.problems.append(Problem("", SCHEMA_JOB, name, kind, detail, repair, fixed))


def _check_traces(store: Store, footers: dict[Path, Footer], moved: set[Path],
                  registered: Registrations, report: CheckReport) -> None:
    for (job, trace_id), counts in registered.items():
        for name in schema.DATA_TABLES:
            path = store.path(name, job, trace_id)
            hint = _RECOMPUTE if schema.TABLES[name].derived else _REINGEST
            footer = footers.get(path)
            version = counts.get("schema_version")
            if footer is None and isinstance(version, int) and version < TABLE_SINCE.get(name, 0):
                report.not_in_version += 1  # registered before the table existed: nothing is missing
                continue
            if footer is None or path in moved:
                why = "was moved aside" if path in moved else "is missing"
                report.problems.append(Problem(trace_id, job, name, "missing", f"{path} {why}", f"none: {hint}"))
                continue
            column = COUNTED.get(name)
            if footer.fault is not None or column is None or counts.get(column) is None:
                continue  # a faulty file is reported as such
            if footer.rows != counts[column]:
                report.problems.append(Problem(
                    trace_id, job, name, "count",
                    f"{path} holds {footer.rows} rows, the registration says {counts[column]}", f"none: {_REINGEST}"))


def _check_catalog(store: Store, report: CheckReport, quarantine: Quarantine | None) -> None:
    """The catalog must hold exactly the views tracelake writes; ``repair`` writes it again."""
    found = catalog.catalog_differences(store)
    if not found:
        return
    fixed = False
    repair = "--repair writes the catalog again"
    if quarantine is not None:
        wal = store.catalog_path.with_name(store.catalog_path.name + ".wal")
        try:
            if wal.exists() or wal.is_symlink():
                quarantine.move(wal)  # DuckDB would replay it over the new catalog
            catalog.write_catalog(store)
        except duckdb.Error as exc:
            repair = f"cannot write the catalog again: {str(exc).strip()}"
        else:
            fixed = not catalog.catalog_differences(store)
            repair = "catalog written again" if fixed else "written again, still different"
    for name, what in found:
        report.problems.append(Problem("", "", name, "catalog", f"{store.catalog_path}: {what}", repair, fixed))


# -- orphans ----------------------------------------------------------------------------------
def _find_orphans(store: Store, layout: Layout, footers: dict[Path, Footer],
                  registered: Registrations, report: CheckReport, stale_after: float) -> None:
    unregistered = {(f.job, f.trace_id) for f in layout.files if f.table == "traces" and footers[f.path].fault}
    for f in layout.files:
        if f.table == "traces" or footers[f.path].fault is not None or (f.job, f.trace_id) in registered:
            continue
        if (f.job, f.trace_id) in unregistered:
            report.orphans.append(Orphan(f.path, "partial", f"{f.table} rows of trace {f.trace_id}, whose "
                                         f"registration in job {f.job} is faulty", quarantine=True))
        else:
            report.orphans.append(Orphan(f.path, "partial",
                                         f"{f.table} rows of trace {f.trace_id}, not registered in job {f.job}"))
    for path in layout.temps:
        _temp(path, report)
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


def _remove(orphan: Orphan, quarantine: Quarantine) -> None:
    """Remove one orphan (or move it aside); marks it ``removed`` when it is gone."""
    if orphan.removed:
        return
    try:
        if orphan.quarantine:
            orphan.moved_to = quarantine.move(orphan.path)
        elif orphan.kind == "staging":
            shutil.rmtree(orphan.path)
        else:
            orphan.path.unlink(missing_ok=True)
    except FileNotFoundError:
        pass
    except OSError as exc:
        if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
        orphan.detail += f" (cannot {'move' if orphan.quarantine else 'remove'}: {exc.strerror})"
        return
    orphan.removed = True
