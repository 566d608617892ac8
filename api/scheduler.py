"""Scheduled fleet reports inside ``tracelake serve``: ``TRACELAKE_REPORT_SCHEDULE="0 6 * * MON"``.

At start-up, a run the server was down for (the schedule's latest run time has no
report yet) is made once; then each run is made on time, on a worker thread so the
server keeps answering. The reports go into the history under
``$TRACELAKE_HOME/reports/`` (:class:`~tracelake.api.reports.archive.ReportArchive`),
which ``tracelake report scheduled`` also writes to (from cron or a systemd timer).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Callable

from tracelake.warehouse import Settings, TracelakeError, Warehouse

from .cron import Cron
from .reports.archive import ArchivedReport, ReportArchive, Trigger
from .settings import ServerSettings

log = logging.getLogger(__name__)

#: The longest single sleep: the wall clock is read again after it (a suspended machine, a clock change).
_NAP_SECONDS = 60.0
Clock = Callable[[], dt.datetime]


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def schedule_of(settings: ServerSettings) -> Cron | None:
    """The report schedule the settings give, or None when there is none.

    Raises:
        InvalidArgument: the schedule or its time zone is not valid.
    """
    if not settings.report_schedule.strip():
        return None
    return Cron.parse(settings.report_schedule, settings.report_timezone)


def archive_of(settings: Settings) -> ReportArchive:
    """The history of fleet reports of the warehouse in ``settings``."""
    return ReportArchive(settings.home_path / "reports")


class ReportScheduler:
    """Makes the scheduled fleet reports of one server; :meth:`run` is its task."""

    def __init__(self, warehouse: Warehouse, cron: Cron, *, clock: Clock = _utc_now) -> None:
        self.warehouse = warehouse
        self.cron = cron
        #: The report window and how many reports to keep (the server's warehouse has server settings).
        self.settings = ServerSettings.of(warehouse.settings)
        self.archive = archive_of(warehouse.settings)
        self.clock = clock
        #: When the next run is due (UTC); None before the task starts.
        self.next_run: dt.datetime | None = None
        #: The last error, if the last run failed.
        self.last_error: str | None = None

    async def run(self) -> None:
        """Make a missed run, then every run on time, until cancelled."""
        missed = self.cron.previous(self.clock())
        if missed is not None and not self.archive.covers(missed):
            await self._generate(missed, "missed")
        while True:
            due = self.cron.next_after(self.clock())
            self.next_run = due
            if due is None:
                return
            while (left := (due - self.clock()).total_seconds()) > 0:
                await asyncio.sleep(min(left, _NAP_SECONDS))
            await self._generate(due, "schedule")

    async def _generate(self, due: dt.datetime, trigger: Trigger) -> ArchivedReport | None:
        settings = self.settings
        try:
            report = await asyncio.to_thread(self.archive.generate, self.warehouse, scheduled_for=due,
                                             window=settings.report_window, trigger=trigger,
                                             keep=settings.report_keep)
        except Exception as exc:  # whatever went wrong, the next run tries again and the server keeps serving
            self.last_error = f"the fleet report due {due:%Y-%m-%d %H:%M} UTC failed: {exc}"
            log.error("%s", self.last_error, exc_info=not isinstance(exc, (TracelakeError, OSError)))
            return None
        self.last_error = None
        return report
