"""Scheduled fleet reports: the history in ``reports/``, the server's schedule, the API and the CLI."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from tracelake.api.app import create_app
from tracelake.api.cli import app as cli
from tracelake.api.cron import Cron
from tracelake.api.reports.archive import ReportArchive, report_name
from tracelake.api.scheduler import ReportScheduler
from tracelake.api.settings import ServerSettings
from tracelake.contracts.errors import NotFound
from tracelake.warehouse import Settings, Warehouse

from support.server import running_server

UTC = dt.timezone.utc


@pytest.fixture
def fleet_copy(fleet_warehouse_home: Path, tmp_path: Path) -> Path:
    """A private copy of the fleet warehouse (reports get written into it)."""
    home = tmp_path / "warehouse"
    shutil.copytree(fleet_warehouse_home, home)
    return home


def _ingest_window() -> tuple[dt.datetime, dt.datetime]:
    """A due time just after the fleet warehouse was ingested (so a 7-day window holds every trace)."""
    now = dt.datetime.now(UTC).replace(microsecond=0)
    return now + dt.timedelta(minutes=1), now


def test_a_report_goes_into_the_history_with_its_job_reports(fleet_copy: Path) -> None:
    warehouse = Warehouse(fleet_copy)
    archive = ReportArchive(fleet_copy / "reports")
    due, _ = _ingest_window()
    report = archive.generate(warehouse, scheduled_for=due, trigger="schedule")
    folder = fleet_copy / "reports" / report.name
    assert report.name == "fleet-" + due.strftime("%Y%m%dT%H%M%SZ")
    fleet = warehouse.fleet(since=due - dt.timedelta(days=7), until=due, now=due)
    assert report.traces == fleet.totals["traces"][0] > 0 and report.jobs == fleet.by_job.height > 1
    assert report.since == due - dt.timedelta(days=7)
    index = (folder / "index.html").read_text()
    assert "<title>Fleet report</title>" in index
    # every link to a job report points at a page kept beside it
    links = re.findall(r'href="(jobs/[^"]+\.html)"', index)
    assert len(set(links)) == report.job_reports > 0
    for link in links:
        page = (folder / link).read_text()
        assert "<title>Job report: " in page
    assert json.loads((folder / "report.json").read_text())["trigger"] == "schedule"
    assert report.bytes == sum(p.stat().st_size for p in folder.rglob("*.html"))
    # the same run again is the same report, not a second one
    assert archive.generate(warehouse, scheduled_for=due).generated_at == report.generated_at
    assert [r.name for r in archive.list()] == [report.name]
    assert not [p for p in (fleet_copy / "reports").iterdir() if p.name.startswith(".fleet-")]


def test_the_history_keeps_the_newest(fleet_copy: Path) -> None:
    warehouse = Warehouse(fleet_copy)
    archive = ReportArchive(fleet_copy / "reports")
    due, _ = _ingest_window()
    for days in (3, 0, 2, 1):  # out of order: the oldest go, whatever order they were made in
        archive.generate(warehouse, scheduled_for=due - dt.timedelta(days=days), keep=3)
    names = [r.name for r in archive.list()]
    assert names == [report_name(due - dt.timedelta(days=d)) for d in (0, 1, 2)]
    assert archive.latest() is not None and archive.latest().name == names[0]  # type: ignore[union-attr]
    assert archive.covers(due - dt.timedelta(days=1)) and not archive.covers(due + dt.timedelta(seconds=1))
    assert sorted(p.name for p in (fleet_copy / "reports").iterdir() if not p.name.startswith(".")) == sorted(names)


def test_a_window_that_holds_no_traces_still_makes_a_report(fleet_copy: Path) -> None:
    archive = ReportArchive(fleet_copy / "reports")
    report = archive.generate(Warehouse(fleet_copy), scheduled_for=dt.datetime(2020, 1, 6, 6, tzinfo=UTC))
    assert report.traces == 0 and report.job_reports == 0
    assert "No device time in this window" in archive.page(report.name).read_text()


def test_pages_outside_the_history_are_not_found(fleet_copy: Path) -> None:
    archive = ReportArchive(fleet_copy / "reports")
    report = archive.generate(Warehouse(fleet_copy), scheduled_for=_ingest_window()[0])
    for name, job in [("fleet-20990101T000000Z", None), ("../tables", None), ("fleet", None),
                      (report.name, "no-such-job"), (report.name, "../index"), (report.name, "../../tracelake")]:
        with pytest.raises(NotFound):
            archive.page(name, job)
    assert archive.page(report.name).name == "index.html"


def test_a_half_written_report_is_not_listed(fleet_copy: Path) -> None:
    archive = ReportArchive(fleet_copy / "reports")
    (fleet_copy / "reports" / ".fleet-20261207T060000Z.abc").mkdir(parents=True)
    broken = fleet_copy / "reports" / "fleet-20261130T060000Z"
    broken.mkdir()
    (broken / "index.html").write_text("<html>")  # no report.json: a copy interrupted half way
    assert archive.list() == []


class _Clock:
    """A wall clock the test moves: each reading is the next of ``times`` (the last one repeats)."""

    def __init__(self, *times: dt.datetime) -> None:
        self.times = list(times)

    def __call__(self) -> dt.datetime:
        return self.times.pop(0) if len(self.times) > 1 else self.times[0]


def test_the_schedule_makes_a_missed_run_then_each_run_on_time(fleet_copy: Path) -> None:
    settings = ServerSettings(home=fleet_copy, report_window="")
    warehouse = Warehouse(settings=settings)
    cron = Cron.parse("0 6 * * MON")
    # The dates follow the copy's ingest, not the calendar: the clock starts just after the traces were ingested,
    # so the last Monday's run before then was missed (and predates every trace), then it passes the next two.
    ingested = [t["ingested_at"] for t in warehouse.traces()]
    start = max(ingested).replace(microsecond=0) + dt.timedelta(seconds=1)
    missed = cron.previous(start)
    assert missed is not None
    if missed >= min(ingested):
        pytest.skip("the fleet warehouse was ingested across a Monday 06:00 UTC")
    second = cron.next_after(start)
    assert second is not None
    third = cron.next_after(second)
    assert third is not None
    third_done = cron.next_after(third)  # next_run moves on to it once the third report is made
    clock = _Clock(start, start, second + dt.timedelta(seconds=1), second + dt.timedelta(seconds=2),
                   third + dt.timedelta(seconds=5))
    scheduler = ReportScheduler(warehouse, cron, clock=clock)

    async def run_until_three_reports() -> None:
        task = asyncio.create_task(scheduler.run())
        for _ in range(600):
            if (len(scheduler.archive.list()) >= 3 and scheduler.next_run == third_done) or task.done():
                break
            await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run_until_three_reports())
    made = sorted((r.scheduled_for, r.trigger) for r in scheduler.archive.list())
    assert made == [(missed, "missed"), (second, "schedule"), (third, "schedule")]
    assert missed.weekday() == second.weekday() == third.weekday() == 0 and third - second == dt.timedelta(days=7)
    # window "" = every trace ingested before the report was due (the missed run predates the ingest)
    everything = warehouse.fleet().totals["traces"][0]
    assert 0 < everything <= len(ingested)
    assert [r.traces for r in sorted(scheduler.archive.list(), key=lambda r: r.name)] == [0, everything, everything]
    assert scheduler.next_run == third_done and scheduler.last_error is None


def test_no_missed_run_when_the_last_one_was_made(fleet_copy: Path) -> None:
    warehouse = Warehouse(settings=Settings(home=fleet_copy))
    cron = Cron.parse("0 6 * * MON")
    now = dt.datetime.now(UTC)
    last = cron.previous(now)
    assert last is not None
    ReportArchive(fleet_copy / "reports").generate(warehouse, scheduled_for=last, trigger="schedule")
    scheduler = ReportScheduler(warehouse, cron)

    async def start_and_stop() -> None:
        task = asyncio.create_task(scheduler.run())
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(start_and_stop())
    assert [r.trigger for r in scheduler.archive.list()] == ["schedule"]
    assert scheduler.next_run == cron.next_after(now)


def test_a_failed_run_is_reported_and_the_schedule_goes_on(fleet_copy: Path) -> None:
    settings = ServerSettings(home=fleet_copy, report_window="not a window")
    scheduler = ReportScheduler(Warehouse(settings=settings), Cron.parse("@daily"),
                                clock=_Clock(dt.datetime(2026, 12, 3, 1, tzinfo=UTC)))

    async def start_and_stop() -> None:
        task = asyncio.create_task(scheduler.run())
        for _ in range(100):
            if scheduler.next_run is not None:
                break
            await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(start_and_stop())
    assert scheduler.last_error is not None and "invalid time 'not a window'" in scheduler.last_error
    assert scheduler.next_run == dt.datetime(2026, 12, 4, tzinfo=UTC)


# -- API ----------------------------------------------------------------------------------
@pytest.fixture
def client(fleet_copy: Path) -> Iterator[TestClient]:
    """A server with a weekly schedule whose latest run was made (by hand, after the traces were ingested)."""
    settings = ServerSettings(home=fleet_copy, ingest_workers=0, report_schedule="0 6 * * MON",
                        report_timezone="Europe/Berlin", report_window="")
    ReportArchive(fleet_copy / "reports").generate(Warehouse(settings=settings), scheduled_for=_ingest_window()[0],
                                                   window="")
    with TestClient(create_app(settings)) as c:
        yield c


def _wait_for_reports(client: TestClient, count: int) -> dict[str, object]:
    for _ in range(600):
        answer = client.get("/api/v1/reports").json()
        if len(answer["reports"]) >= count:
            return answer  # type: ignore[no-any-return]
        time.sleep(0.1)
    raise AssertionError(f"no {count} reports in time: {answer}")


def test_the_api_lists_and_serves_the_history(client: TestClient, fleet_copy: Path) -> None:
    answer = _wait_for_reports(client, 1)
    (listed,) = answer["reports"]  # type: ignore[misc]  # no missed run: the latest one has its report
    cron = Cron.parse("0 6 * * MON", "Europe/Berlin")
    assert answer["schedule"] == "0 6 * * MON" and answer["timezone"] == "Europe/Berlin"
    assert listed["trigger"] == "manual"
    assert dt.datetime.fromisoformat(answer["next_run"]) == cron.next_after(dt.datetime.now(UTC))  # type: ignore[arg-type]
    assert listed["traces"] == Warehouse(fleet_copy).fleet().totals["traces"][0]
    page = client.get(listed["url"])
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.headers["content-encoding"] == "gzip"  # httpx asks for gzip and unpacks it
    assert page.text == (fleet_copy / "reports" / listed["name"] / "index.html").read_text()
    job = re.search(r'href="jobs/([^"]+)\.html"', page.text)
    assert job is not None
    job_page = client.get(f"/api/v1/reports/{listed['name']}/jobs/{job.group(1)}.html")
    assert job_page.status_code == 200 and "Job report: " in job_page.text
    latest = client.get("/api/v1/reports/latest", follow_redirects=False)
    assert latest.status_code == 307 and latest.headers["location"] == listed["url"]


def test_report_pages_are_compressed_only_for_clients_that_ask(client: TestClient) -> None:
    url = _wait_for_reports(client, 1)["reports"][0]["url"]  # type: ignore[index]
    plain = client.get(url, headers={"Accept-Encoding": "identity"})
    assert "content-encoding" not in plain.headers and plain.text.startswith("<!DOCTYPE html>")
    raw = client.get(url, headers={"Accept-Encoding": "gzip"})
    assert raw.headers["content-encoding"] == "gzip" and raw.headers["vary"] == "Accept-Encoding"
    compressed = int(raw.headers["content-length"])
    assert compressed < len(plain.content) / 2
    refused = client.get(url, headers={"Accept-Encoding": "gzip;q=0"})
    assert "content-encoding" not in refused.headers
    live = client.get("/api/v1/jobs/ddp/report", headers={"Accept-Encoding": "gzip, br"})
    assert live.headers["content-encoding"] == "gzip" and "Job report: ddp" in live.text


@pytest.mark.parametrize("path", [
    "/api/v1/reports/fleet-20990101T000000Z/index.html",
    "/api/v1/reports/fleet-20990101T000000Z/jobs/ddp.html",
])
def test_missing_reports_are_404(client: TestClient, path: str) -> None:
    answer = client.get(path)
    assert answer.status_code == 404 and answer.json()["kind"] == "NotFound"


@pytest.mark.parametrize("path", [
    "/api/v1/reports/..%2Ftables/index.html",
    "/api/v1/reports/fleet-x/index.html",
    "/api/v1/reports/fleet-20990101T000000Z/jobs/..%2F..%2Ftracelake.html",
])
def test_report_names_are_checked(client: TestClient, path: str) -> None:
    assert client.get(path).status_code in (404, 422)


def test_without_a_schedule_the_history_is_empty(fleet_copy: Path) -> None:
    with TestClient(create_app(ServerSettings(home=fleet_copy, ingest_workers=0))) as c:
        answer = c.get("/api/v1/reports").json()
        assert answer == {"reports": [], "schedule": None, "timezone": "UTC", "next_run": None, "last_error": None}
        missing = c.get("/api/v1/reports/latest")
        assert missing.status_code == 404 and "tracelake report scheduled" in missing.json()["error"]


def test_a_bad_schedule_stops_the_server_with_a_message(fleet_copy: Path) -> None:
    result = CliRunner().invoke(cli, ["serve", "--home", str(fleet_copy)],
                                env={"TRACELAKE_REPORT_SCHEDULE": "0 6 * * FOO"})
    assert result.exit_code == 1
    assert "invalid cron schedule '0 6 * * FOO': day of week 'FOO'" in result.output
    assert "Traceback" not in result.output


# -- CLI -----------------------------------------------------------------------------------
def test_cli_writes_and_lists_the_history(fleet_copy: Path) -> None:
    runner = CliRunner()
    made = runner.invoke(cli, ["report", "scheduled", "--home", str(fleet_copy), "--window", ""])
    assert made.exit_code == 0, made.output
    (report,) = ReportArchive(fleet_copy / "reports").list()
    assert report.trigger == "manual" and report.since is None and report.traces > 0
    assert str(fleet_copy / "reports" / report.name / "index.html") in made.output.replace("\n", "")
    listed = runner.invoke(cli, ["report", "list", "--home", str(fleet_copy)])
    assert listed.exit_code == 0 and report.name in listed.output


def test_cli_if_due_runs_only_when_a_run_is_missing(fleet_copy: Path) -> None:
    runner = CliRunner()
    env = {"TRACELAKE_REPORT_SCHEDULE": "@daily"}
    first = runner.invoke(cli, ["report", "scheduled", "--if-due", "--home", str(fleet_copy)], env=env)
    assert first.exit_code == 0, first.output
    (report,) = ReportArchive(fleet_copy / "reports").list()
    assert report.scheduled_for == Cron.parse("@daily").previous(dt.datetime.now(UTC))
    assert report.trigger == "schedule"
    again = runner.invoke(cli, ["report", "scheduled", "--if-due", "--home", str(fleet_copy)], env=env)
    assert again.exit_code == 0 and "no report due" in again.output
    assert len(ReportArchive(fleet_copy / "reports").list()) == 1
    unset = runner.invoke(cli, ["report", "scheduled", "--if-due", "--home", str(fleet_copy)],
                          env={"TRACELAKE_REPORT_SCHEDULE": ""})
    assert unset.exit_code == 1 and "--if-due needs a schedule" in unset.output


def test_cli_list_says_when_there_is_nothing(fleet_copy: Path) -> None:
    result = CliRunner().invoke(cli, ["report", "list", "--home", str(fleet_copy)])
    assert result.exit_code == 0 and "no fleet reports yet" in result.output


# -- a real server --------------------------------------------------------------------------
@pytest.mark.slow
def test_a_real_server_makes_the_missed_run_at_start_up(fleet_copy: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACELAKE_")}
    env["TRACELAKE_REPORT_SCHEDULE"] = "30 5 * * *"
    with running_server(["--home", str(fleet_copy), "--ingest-workers", "0"], env, tmp_path / "server.log") as url:
        with httpx.Client(base_url=url, timeout=60) as http:
            for _ in range(600):
                listed = http.get("/api/v1/reports").json()
                if listed["reports"]:
                    break
                time.sleep(0.1)
            (report,) = listed["reports"]
            assert report["trigger"] == "missed"
            assert dt.datetime.fromisoformat(report["scheduled_for"]) == \
                Cron.parse("30 5 * * *").previous(dt.datetime.now(UTC))
            page = http.get(report["url"])
            assert page.status_code == 200 and page.headers["content-encoding"] == "gzip"
            assert "<title>Fleet report</title>" in page.text
    # written where the docs say, and kept after the server stops
    assert (fleet_copy / "reports" / report["name"] / "index.html").is_file()
