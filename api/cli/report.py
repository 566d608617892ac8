"""``tracelake report``: job and fleet reports as self-contained HTML pages, and the scheduled history."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from tracelake.contracts.lazy import polars as pl
from tracelake.warehouse import InvalidArgument, Warehouse

from ..output import OutputFormat
from ..settings import ServerSettings
from ..user_input import parse_labels, parse_when
from . import render
from .root import HomeOption, app, err_console, exit_on_error, open_warehouse, print_result
from .words import WordsGroup


report_app = typer.Typer(
    name="report",
    cls=WordsGroup,
    help="Write reports as self-contained HTML pages (plotly.js inline: they open offline, nothing is fetched).",
    no_args_is_help=True,
)
app.add_typer(report_app)


@report_app.command("job")
@exit_on_error
def report_job(
    job: Annotated[str, typer.Argument(help="The job (see `tracelake traces`).", show_default=False)],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="HTML file to write (default: <job>.html).",
                                             show_default=False)] = None,
    top: Annotated[int, typer.Option("--top", "-n", min=1, max=100, help="Kernels to list.")] = 15,
    home: HomeOption = None,
) -> None:
    """Write a job's report: findings, per-rank breakdown, steps, idle time, stragglers, kernels, bandwidth."""
    from ..reports import job_report
    from ..reports.archive import write_page

    target = out or Path(f"{job}.html")
    write_page(target, job_report(open_warehouse(home, existing=True).job_report(job, top=top)))
    err_console.print(f"wrote {escape(str(target))} ({target.stat().st_size / 1e6:.1f} MB)", highlight=False)


@report_app.command("fleet")
@exit_on_error
def report_fleet(
    since: Annotated[str | None, typer.Option(
        "--since", help="Traces ingested since: 30m, 12h, 7d, 2w back from now, or an ISO date (default: all).",
        show_default=False)] = None,
    until: Annotated[str | None, typer.Option(
        "--until", help="Traces ingested before: the same forms (default: now).", show_default=False)] = None,
    label: Annotated[list[str] | None, typer.Option("--label", "-l", help="Only traces with this key=value label; "
                                                    "repeatable.", show_default=False)] = None,
    top: Annotated[int, typer.Option("--top", "-n", min=1, max=100, help="Offenders, stragglers and collectives "
                                     "to list.")] = 10,
    out: Annotated[Path, typer.Option("--out", "-o", help="HTML file to write.")] = Path("fleet.html"),
    job_reports: Annotated[bool, typer.Option(
        "--job-reports/--no-job-reports",
        help="Also write the top offenders' job reports into <out>_jobs/ and link them.")] = True,
    home: HomeOption = None,
) -> None:
    """Write the fleet report: device-hours and utilisation over time, waste by job and label, top offenders."""
    from ..reports.archive import write_fleet_pages

    now = dt.datetime.now(dt.timezone.utc)
    warehouse = open_warehouse(home, existing=True)
    fleet = warehouse.fleet(since=parse_when(since, now) if since else None,
                            until=parse_when(until, now) if until else None,
                            labels=parse_labels(label), top=top, now=now)
    folder = out.with_name(f"{out.stem}_jobs")
    written = write_fleet_pages(warehouse, fleet, out, folder, job_reports=job_reports)
    extra = f" and {written} job report{'s' if written != 1 else ''} in {folder}/" if written else ""
    err_console.print(f"wrote {escape(str(out))} ({out.stat().st_size / 1e6:.1f} MB){escape(extra)}",
                      highlight=False, soft_wrap=True)


@report_app.command("scheduled")
@exit_on_error
def report_scheduled(
    if_due: Annotated[bool, typer.Option(
        "--if-due", help="Only when the schedule (TRACELAKE_REPORT_SCHEDULE) has a run with no report yet: "
        "for a timer that fires more often than the schedule, or at boot.")] = False,
    window: Annotated[str | None, typer.Option(
        "--window", help="Traces ingested this long before now: 7d, 12h... (default: TRACELAKE_REPORT_WINDOW, "
        "7d); '' for all.", show_default=False)] = None,
    home: HomeOption = None,
) -> None:
    """Write the fleet report into the history in $TRACELAKE_HOME/reports/, as `tracelake serve` does on its
    schedule: for cron or a systemd timer (see README, "Scheduled fleet reports")."""
    from ..scheduler import archive_of, schedule_of

    settings = ServerSettings.from_env(home=home, report_window=window)
    archive = archive_of(settings)
    due = None
    if if_due:
        cron = schedule_of(settings)
        if cron is None:
            raise InvalidArgument("--if-due needs a schedule: set TRACELAKE_REPORT_SCHEDULE (e.g. '0 6 * * MON')")
        due = cron.previous(dt.datetime.now(dt.timezone.utc))
        if due is None or archive.covers(due):
            err_console.print("no report due: the latest run of the schedule has its report", highlight=False)
            return
    report = archive.generate(Warehouse(settings=settings), scheduled_for=due, window=settings.report_window,
                              trigger="schedule" if if_due else "manual", keep=settings.report_keep)
    err_console.print(f"wrote {escape(str(archive.root / report.name / 'index.html'))} ({report.traces:,} traces, "
                      f"{report.job_reports} job reports, {report.seconds:.1f} s)", highlight=False, soft_wrap=True)


@report_app.command("list")
@exit_on_error
def report_list(home: HomeOption = None) -> None:
    """List the fleet reports kept in $TRACELAKE_HOME/reports/, newest first."""
    from ..scheduler import archive_of

    settings = open_warehouse(home, existing=True).settings
    reports = archive_of(settings).list()
    if not reports:
        err_console.print("no fleet reports yet: set TRACELAKE_REPORT_SCHEDULE for `tracelake serve`, or run "
                          "`tracelake report scheduled`", highlight=False)
        return
    frame = pl.DataFrame([{"name": r.name, "due (UTC)": f"{r.scheduled_for:%Y-%m-%d %H:%M}", "trigger": r.trigger,
                           "traces": r.traces, "jobs": r.jobs, "MB": round(r.bytes / 1e6, 1)} for r in reports])
    print_result(render.frame_result(frame), OutputFormat.table,
                  title=f"fleet reports in {archive_of(settings).root} (<name>/index.html)")
