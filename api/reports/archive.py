"""Fleet reports kept on disk with their history: ``$TRACELAKE_HOME/reports/``.

Each generated report is one folder, named after the time it was due (UTC)::

    reports/fleet-20261207T060000Z/index.html        the fleet report
    reports/fleet-20261207T060000Z/jobs/<job>.html   the top offenders' job reports (linked from it)
    reports/fleet-20261207T060000Z/report.json       when, why, over what window

A folder is written under a hidden name and renamed into place, so a listing never
shows half a report; a lock file keeps the server's schedule and a cron job from
writing at the same time. The newest ``keep`` reports stay, older ones are removed.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import quote

from tracelake.contracts.errors import InvalidArgument, NotFound
from tracelake.warehouse import Fleet, Warehouse

from ..user_input import parse_when
from .fleet import render as render_fleet
from .job import render as render_job

log = logging.getLogger(__name__)

#: A report folder's name: ``fleet-`` and the UTC time it was due, to the second.
NAME = re.compile(r"^fleet-\d{8}T\d{6}Z$")
_STAMP = "%Y%m%dT%H%M%SZ"
Trigger = Literal["schedule", "missed", "manual"]


@dataclass(frozen=True)
class ArchivedReport:
    """One fleet report of the history (what ``report.json`` holds, plus its size)."""

    name: str
    #: The time the report was due (the schedule's run time, or when it was asked for).
    scheduled_for: dt.datetime
    generated_at: dt.datetime
    #: ``schedule`` (on time), ``missed`` (at start-up, for a run the server was down for), ``manual``.
    trigger: str
    #: The window: traces ingested in ``[since, scheduled_for)``; None means every trace.
    since: dt.datetime | None
    traces: int
    jobs: int
    job_reports: int
    seconds: float
    bytes: int

    def as_json(self) -> dict[str, object]:
        """A JSON-ready dict (times in ISO 8601)."""
        return {k: v.isoformat() if isinstance(v, dt.datetime) else v for k, v in asdict(self).items()}


def report_name(scheduled_for: dt.datetime) -> str:
    """The folder name of the report due at ``scheduled_for``."""
    return "fleet-" + scheduled_for.astimezone(dt.timezone.utc).strftime(_STAMP)


def write_fleet_pages(warehouse: Warehouse, fleet: Fleet, out: Path, jobs_folder: Path, *,
                      job_reports: bool = True) -> int:
    """Write the fleet report to ``out`` and, with ``job_reports``, its top offenders' reports into ``jobs_folder``.

    Links from the fleet page to the job pages are relative, so the pages open from disk
    and from wherever they are served. Returns the number of job reports written.
    """
    written: set[str] = set()
    if job_reports:
        for job in fleet.offenders["job"].to_list():
            write_page(jobs_folder / f"{job}.html", render_job(warehouse.job_report(job)))
            written.add(job)
    prefix = os.path.relpath(jobs_folder, out.parent).replace(os.sep, "/")
    write_page(out, render_fleet(fleet, lambda job: f"{prefix}/{quote(job)}.html" if job in written else None))
    return len(written)


def write_page(target: Path, html: str) -> None:
    """Write a page atomically (a reader never sees half a report).

    Raises:
        InvalidArgument: the file cannot be written.
    """
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.partial")
        partial.write_text(html, encoding="utf-8")
        partial.replace(target)
    except OSError as exc:
        raise InvalidArgument(f"cannot write {target}: {exc.strerror or exc}") from None


class ReportArchive:
    """The history of fleet reports under ``root`` (``$TRACELAKE_HOME/reports``)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def list(self) -> list[ArchivedReport]:
        """Every complete report, newest first."""
        if not self.root.is_dir():
            return []
        found = []
        for entry in self.root.iterdir():
            if NAME.match(entry.name) and entry.is_dir():
                report = self._read(entry)
                if report is not None:
                    found.append(report)
        return sorted(found, key=lambda r: r.name, reverse=True)

    def latest(self) -> ArchivedReport | None:
        """The newest report, if any."""
        reports = self.list()
        return reports[0] if reports else None

    def covers(self, slot: dt.datetime) -> bool:
        """Whether a report due at or after ``slot`` exists (the run due then was made)."""
        latest = self.latest()
        return latest is not None and latest.scheduled_for >= slot

    def page(self, name: str, job: str | None = None) -> Path:
        """The file of report ``name``'s fleet page, or of ``job``'s report in it.

        Raises:
            NotFound: no such report, or no report of that job in it.
        """
        if not NAME.match(name):
            raise NotFound(f"no report {name!r}: names look like fleet-20261207T060000Z (see GET /api/v1/reports)")
        folder = self.root / name
        path = folder / "index.html" if job is None else folder / "jobs" / f"{job}.html"
        if job is not None and (path.parent.resolve() != (folder / "jobs").resolve()):
            raise NotFound(f"no report of job {job!r} in {name}")
        if not path.is_file():
            what = f"no report of job {job!r} in {name} (only the top offenders' are kept)" if job else \
                f"no report {name!r} (see GET /api/v1/reports)"
            raise NotFound(what)
        return path

    def generate(
        self,
        warehouse: Warehouse,
        *,
        scheduled_for: dt.datetime | None = None,
        window: str = "7d",
        trigger: Trigger = "manual",
        keep: int = 52,
        top: int = 10,
    ) -> ArchivedReport:
        """Write the fleet report due at ``scheduled_for`` (default: now) into the history.

        Covers the traces ingested in ``window`` (``7d``, ``12h``..., empty: all) before
        ``scheduled_for``; the top offenders' job reports go beside it. When a report due
        at that time exists already, it is returned instead. Keeps the ``keep`` newest.

        Raises:
            InvalidArgument: a bad window, or the folder cannot be written.
        """
        started = time.perf_counter()
        due = (scheduled_for or dt.datetime.now(dt.timezone.utc)).astimezone(dt.timezone.utc).replace(microsecond=0)
        since = parse_when(window, due) if window.strip() else None
        name = report_name(due)
        with self._locked():
            existing = self._read(self.root / name)
            if existing is not None:
                return existing
            fleet = warehouse.fleet(since=since, until=due, top=top, now=due)
            staging = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=self.root))
            try:
                staging.chmod(0o755)  # mkdtemp's folder is private; the reports are meant to be read
                job_reports = write_fleet_pages(warehouse, fleet, staging / "index.html", staging / "jobs")
                report = ArchivedReport(
                    name=name, scheduled_for=due, generated_at=dt.datetime.now(dt.timezone.utc), trigger=trigger,
                    since=since, traces=int(fleet.totals["traces"][0] or 0), jobs=fleet.by_job.height,
                    job_reports=job_reports, seconds=round(time.perf_counter() - started, 3),
                    bytes=sum(p.stat().st_size for p in staging.rglob("*.html")))
                (staging / "report.json").write_text(json.dumps(report.as_json(), indent=1), encoding="utf-8")
                os.replace(staging, self.root / name)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
            self._prune(keep)
        log.info("fleet report %s written (%s, %d traces) in %.1f s", name, trigger, report.traces, report.seconds)
        return report

    # -- internals ------------------------------------------------------------------------
    @contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            handle = (self.root / ".lock").open("a")
        except OSError as exc:
            raise InvalidArgument(f"cannot write reports into {self.root}: {exc.strerror or exc}") from None
        with handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _read(self, folder: Path) -> ArchivedReport | None:
        try:
            meta = json.loads((folder / "report.json").read_text(encoding="utf-8"))
            return ArchivedReport(
                name=folder.name,
                scheduled_for=dt.datetime.fromisoformat(meta["scheduled_for"]),
                generated_at=dt.datetime.fromisoformat(meta["generated_at"]),
                trigger=str(meta["trigger"]),
                since=dt.datetime.fromisoformat(meta["since"]) if meta.get("since") else None,
                traces=int(meta["traces"]), jobs=int(meta["jobs"]), job_reports=int(meta["job_reports"]),
                seconds=float(meta["seconds"]), bytes=int(meta["bytes"]),
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _prune(self, keep: int) -> None:
        for old in self.list()[max(keep, 1):]:
            shutil.rmtree(self.root / old.name, ignore_errors=True)
            log.info("removed the old fleet report %s (keeping %d)", old.name, keep)
        for stale in self.root.glob(".fleet-*"):  # a run killed half way
            if stale.is_dir() and time.time() - stale.stat().st_mtime > 3600:
                shutil.rmtree(stale, ignore_errors=True)
