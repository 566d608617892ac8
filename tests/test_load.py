"""A short run of the load test (benchmarks/load.py): a real server, concurrent uploads and queries, no errors."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from load import load_test  # noqa: E402

pytestmark = pytest.mark.slow  # a real server under load for seconds


def test_a_short_load_run_has_no_errors_and_registers_every_upload(tmp_path: Path) -> None:
    report = load_test(seconds=5, uploaders=2, readers=4, ingest_workers=1, workdir=tmp_path)
    print(report.table())
    assert report.errors == 0, report.table()
    for name, figures in report.endpoints.items():
        assert figures.requests > 0, name
    assert report.uploads > 0 and report.registered == report.uploads, report.table()
    # Memory: only a generous bound (figures on a shared machine are noisy); the benchmark reports the trend.
    assert report.server_rss_mb["end"] < report.server_rss_mb["start"] + 500, report.table()
