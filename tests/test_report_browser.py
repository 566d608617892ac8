"""End to end in a real browser: headless Chromium opens the reports served by a real ``tracelake serve``.

Checks that every plotly chart is drawn (its div holds SVG with marks in it), that the
console has no errors, that the pages fetch nothing but themselves, and saves full-page
screenshots under ``test-artifacts/`` (``$TRACELAKE_TEST_ARTIFACTS`` moves it). Skips
when Chromium is not installed (Debian: ``apt-get install chromium``).
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tracelake.api.reports.archive import ReportArchive
from tracelake.warehouse import Warehouse

from support import ROOT
from support.chromium import Chromium, Tab, find_chromium
from support.server import running_server

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(find_chromium() is None, reason="Chromium is not installed (Debian: apt-get install "
                       "chromium; or set TRACELAKE_CHROMIUM to its path)"),
]

ARTIFACTS = Path(os.environ.get("TRACELAKE_TEST_ARTIFACTS") or ROOT / "test-artifacts")

#: For each plotly div: drawn (SVG inside, plotly's layout built) and with marks (bars, points, heat map image).
PLOTS = """
Array.from(document.querySelectorAll('.plotly-graph-div')).map(d => ({
  id: d.id,
  svg: d.querySelectorAll('svg.main-svg').length,
  canvas: d.querySelectorAll('canvas').length,
  drawn: d._fullLayout !== undefined,
  marks: d.querySelectorAll('.point, .js-line, .hm image, .heatmaplayer image').length,
}))
"""


@pytest.fixture(scope="module")
def server(fleet_warehouse_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``tracelake serve`` (uvicorn) over a copy of the fleet warehouse on a free loopback port; yields its URL.

    The copy holds one fleet report in its history (``reports/``), made as the schedule makes them.
    """
    folder = tmp_path_factory.mktemp("server")
    home = folder / "warehouse"
    shutil.copytree(fleet_warehouse_home, home)
    due = dt.datetime.now(dt.timezone.utc) + dt.timedelta(minutes=1)
    ReportArchive(home / "reports").generate(Warehouse(home), scheduled_for=due, trigger="schedule")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACELAKE_")}
    with running_server(["--home", str(home), "--ingest-workers", "0"], env, folder / "server.log") as url:
        yield url


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chromium]:
    """One headless Chromium for the module's tests (each opens its own tabs)."""
    folder = tmp_path_factory.mktemp("chromium")
    executable = find_chromium()
    assert executable is not None  # the module is skipped otherwise
    with Chromium.start(executable, folder) as b:
        yield b


def _wait_for_plots(tab: Tab, timeout: float = 30) -> list[dict[str, object]]:
    """The plot divs once every one is drawn with marks in it (or as they are when ``timeout`` runs out)."""
    deadline = time.monotonic() + timeout
    while True:
        plots: list[dict[str, object]] = tab.evaluate(PLOTS)
        if plots and all(p["drawn"] and p["marks"] for p in plots) or time.monotonic() > deadline:
            return plots
        time.sleep(0.2)


def _check_page(tab: Tab, url: str, expected_plots: set[str], screenshot: str) -> None:
    plots = _wait_for_plots(tab)
    assert {str(p["id"]) for p in plots} == expected_plots
    for plot in plots:
        assert plot["drawn"] and plot["svg"], f"{plot['id']} was not drawn: {plot}"  # type: ignore[operator]
        assert plot["marks"], f"{plot['id']} has no bars, points or heat map: {plot}"
    time.sleep(0.5)  # anything that fails late (a resize, a hover layer) reports by now
    shot = tab.screenshot(ARTIFACTS / screenshot)
    assert shot.stat().st_size > 10_000
    assert tab.errors() == [], f"console errors on {url} (screenshot: {shot})"
    fetched = [u for u in tab.requests() if not u.startswith(("data:", "blob:"))]  # plotly's heat map image
    assert fetched == [url], "the page fetched something besides itself"


def test_job_report_renders_in_chromium(server: str, browser: Chromium) -> None:
    url = f"{server}/api/v1/jobs/ddp/report"
    tab = browser.open(url)
    assert tab.evaluate("document.title") == "Job report: ddp"
    _check_page(tab, url, {"plot-breakdown", "plot-steps", "plot-step-timeline", "plot-critical-path",
                           "plot-what-if", "plot-idle", "plot-stragglers", "plot-bandwidth", "plot-roofline"},
                "job-report-ddp.png")
    # the straggler heat map has a row per rank and a column per collective
    shape = tab.evaluate("(() => { const d = document.getElementById('plot-stragglers').data[0];"
                         " return [d.z.length, d.z[0].length]; })()")
    assert shape == [4, 18]


def test_fleet_report_renders_in_chromium_and_links_to_job_reports(server: str, browser: Chromium) -> None:
    url = f"{server}/api/v1/reports/fleet?since=30d"
    tab = browser.open(url)
    assert tab.evaluate("document.title") == "Fleet report"
    _check_page(tab, url, {"plot-over-time", "plot-wasted-by-job", "plot-wasted-by-team", "plot-wasted-by-cluster",
                           "plot-wasted-by-hardware"}, "fleet-report.png")
    first = tab.evaluate("document.querySelector('#offenders tbody a').href")
    assert first == f"{server}/api/v1/jobs/ddp/report"  # the most wasteful job first, linked to its report
    linked = browser.open(first)
    plots = _wait_for_plots(linked)
    assert plots and all(p["drawn"] and p["marks"] for p in plots)
    assert linked.errors() == []


def test_a_report_of_the_history_renders_and_links_to_the_job_reports_beside_it(server: str,
                                                                             browser: Chromium) -> None:
    (report,) = httpx.get(f"{server}/api/v1/reports").json()["reports"]
    url = f"{server}{report['url']}"
    tab = browser.open(url)
    _check_page(tab, url, {"plot-over-time", "plot-wasted-by-job", "plot-wasted-by-team", "plot-wasted-by-cluster",
                           "plot-wasted-by-hardware"}, "fleet-report-history.png")
    first = tab.evaluate("document.querySelector('#offenders tbody a').href")
    assert first == url.replace("/index.html", "/jobs/ddp.html")  # the job report kept beside it
    linked = browser.open(first)
    assert linked.evaluate("document.title") == "Job report: ddp"
    plots = _wait_for_plots(linked)
    assert plots and all(p["drawn"] and p["marks"] for p in plots)
    assert linked.errors() == []


def test_tpu_job_report_renders_in_chromium(server: str, browser: Chromium) -> None:
    url = f"{server}/api/v1/jobs/tpu/report"
    tab = browser.open(url)
    _check_page(tab, url, {"plot-breakdown", "plot-steps", "plot-step-timeline", "plot-critical-path",
                           "plot-what-if", "plot-idle", "plot-stragglers", "plot-bandwidth"}, "job-report-tpu.png")


def test_the_browser_check_sees_console_errors(browser: Chromium) -> None:
    """The checks above would catch a failing page: console errors, exceptions and blocked loads are reported."""
    page = ("data:text/html,<meta http-equiv='Content-Security-Policy' content=\"default-src 'none'; "
            "script-src 'unsafe-inline'\"><script>console.error('boom'); missing_function();</script>"
            "<img src='http://127.0.0.1:9/x.png'>")
    tab = browser.open(page)
    time.sleep(0.5)
    errors = "\n".join(tab.errors())
    assert "boom" in errors and "missing_function" in errors and "Content Security Policy" in errors
