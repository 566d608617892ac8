"""The CLI in process (typer's CliRunner): commands, formats, exit codes, help."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from support import SAMPLES
from tracelake.api.cli import app
from tracelake.warehouse import Warehouse

runner = CliRunner()


def _run(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.output


def test_ingest_then_traces_and_sql(home: Path) -> None:
    code, out = _run("ingest", str(SAMPLES / "ddp_straggler"), "--job", "ddp", "--label", "team=ml", "--home", str(home))
    assert code == 0, out
    assert "4 ingested" in out
    code, out = _run("traces", "--home", str(home), "--format", "json")
    assert code == 0
    rows = json.loads(out)
    assert sorted(r["rank"] for r in rows) == [0, 1, 2, 3]
    code, out = _run("sql", "select category, count(*) n from device_ops group by 1 order by 1",
                     "--home", str(home), "-f", "csv")
    assert code == 0
    parsed = list(csv.reader(io.StringIO(out)))
    assert parsed[0] == ["category", "n"]
    assert {r[0] for r in parsed[1:]} == {"communication", "compute", "memory"}
    code, out = _run("sql", "select count(*) as n from traces", "--home", str(home))
    assert code == 0 and "4" in out


def test_ingest_twice_says_already_there(home: Path) -> None:
    path = str(SAMPLES / "launch_bound" / "rank-0.json.gz")
    assert _run("ingest", path, "--home", str(home))[0] == 0
    code, out = _run("ingest", path, "--home", str(home))
    assert code == 0
    assert "already ingested" in out and "0 ingested" in out


def test_ingest_reports_failures_and_keeps_going(home: Path, tmp_path: Path) -> None:
    bad = tmp_path / "broken.json"
    bad.write_text('{"traceEvents": [ {"ph": "X", ')
    code, out = _run("ingest", str(bad), str(SAMPLES / "launch_bound"), "--home", str(home), "--quiet")
    assert code == 1
    assert "broken.json:" in out and "Traceback" not in out
    assert "1 ingested" in out and "1 failed" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["ingest", "x.json", "--job", "a/b"], "invalid job name"),
        (["ingest", "x.json", "--label", "nolabel"], "key=value"),
        (["sql", "select * from nope"], "nope"),
        (["sql", "   "], "empty SQL"),
    ],
)
def test_usage_errors_are_one_line_messages(home: Path, args: list[str], message: str) -> None:
    Warehouse(home)  # an empty warehouse: read commands refuse a home that holds none
    code, out = _run(*args, "--home", str(home))
    assert code == 1
    assert message in out and "Traceback" not in out


def test_missing_file_fails_cleanly(home: Path) -> None:
    code, out = _run("ingest", "/nonexistent/rank-0.json", "--home", str(home), "--quiet")
    assert code == 1 and "no such file" in out


def test_demo_builds_a_fresh_warehouse(tmp_path: Path) -> None:
    home = tmp_path / "demo"
    code, out = _run("demo", "--home", str(home))
    assert code == 0, out
    assert "6 ingested" in out
    assert "rank 2 arrives last" in out  # the sample's straggler
    assert "job demo-tpu_allreduce" in out  # the XLA sample
    # Running it again replaces the earlier demo rather than piling up.
    code, out = _run("demo", "--home", str(home))
    assert code == 0 and "6 ingested" in out


def test_demo_refuses_to_wipe_other_folders(tmp_path: Path) -> None:
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    code, out = _run("demo", "--home", str(precious))
    assert code == 1 and "not a tracelake demo" in out
    assert (precious / "notes.txt").exists()


def test_every_command_has_help() -> None:
    code, out = _run("--help")
    assert code == 0
    for command in ("ingest", "traces", "sql", "analyze", "diff", "report", "demo", "version"):
        assert command in out
        code, sub = _run(command, "--help")
        assert code == 0 and len(sub.strip().splitlines()) > 3, command
