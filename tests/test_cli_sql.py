"""``tracelake sql``: the user's own files are readable, the warehouse and its catalog never change (issue 18, 8).

Run as the real console script (a subprocess), as a user would, and checked with the
stock DuckDB shell afterwards.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from tracelake.warehouse import Warehouse

from support import SAMPLES

pytestmark = pytest.mark.slow  # the console script as a subprocess, over and over


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("clisql") / "wh"
    assert Warehouse(home).ingest([SAMPLES / "ddp_straggler"], job="ddp").ok
    return home


def tracelake(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tracelake.api.cli", *args, "--home", str(home)],
                          capture_output=True, text=True, timeout=120)


def digest(home: Path) -> dict[str, str]:
    return {str(p.relative_to(home)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(home.rglob("*")) if p.is_file() and p.name != ".write.lock"}


@pytest.mark.parametrize("sql", [
    "attach '{home}/tracelake.duckdb' as c; drop view c.traces",
    "attach '{home}/tracelake.duckdb' as c",
    "drop view traces",
    "create or replace view traces as select 1",
    "copy (select * from device_ops limit 0) to '{victim}'",
    "with x as (copy (select 1) to '{home}/tables/traces/job=x/y.parquet') select 1",
    "select * from query('copy (select 1) to ''{home}/x.csv''')",
    "install httpfs",
    "set threads = 1",
])
def test_the_cli_never_changes_the_warehouse_or_its_catalog(home: Path, sql: str) -> None:
    before = digest(home)
    victim = next((home / "tables" / "device_ops" / "job=ddp").glob("*.parquet"))
    done = tracelake(home, "sql", sql.format(home=home, victim=victim))
    assert done.returncode == 1, done
    assert done.stderr.startswith("error: ") and "Traceback" not in done.stderr, done.stderr
    assert digest(home) == before
    check = tracelake(home, "check")
    assert check.returncode == 0, check.stdout + check.stderr


def test_the_duckdb_shell_still_finds_every_view(home: Path) -> None:
    tracelake(home, "sql", f"attach '{home}/tracelake.duckdb' as c; drop view c.traces")
    shell = shutil.which("duckdb", path=str(Path(sys.executable).parent))
    if shell is None:
        pytest.skip("the DuckDB shell (duckdb-cli) is not installed")
    done = subprocess.run([shell, "-readonly", "-json", str(home / "tracelake.duckdb"), "-c",
                           "select count(*) as n from traces"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [{"n": 4}]


def test_the_users_own_files_are_readable(home: Path, tmp_path: Path) -> None:
    own = tmp_path / "mine.csv"
    own.write_text("a,b\n1,2\n3,4\n")
    done = tracelake(home, "sql", f"select sum(a) as a, sum(b) as b from read_csv('{own}')", "--format", "json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [{"a": 4, "b": 6}]
    joined = tracelake(home, "sql", f"select count(*) as n from traces, '{own}'", "--format", "csv")
    assert joined.stdout.splitlines() == ["n", "8"]


@pytest.mark.parametrize("suffix", [".parquet", ".csv", ".json"])
def test_out_exports_a_result_and_never_into_the_warehouse(home: Path, tmp_path: Path, suffix: str) -> None:
    out = tmp_path / "export" / f"ranks{suffix}"
    done = tracelake(home, "sql", "select rank, device_op_count from traces order by rank", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "wrote 4 rows" in done.stderr
    expected = duckdb.connect().execute("select rank, device_op_count from read_parquet(?) order by rank",
                                        [sorted((home / "tables" / "traces").glob("job=ddp/*.parquet"))[0].parent.as_posix() + "/*.parquet"]).fetchall()
    got = duckdb.connect().execute(f"select * from '{out}' order by rank").fetchall()
    assert got == expected
    before = digest(home)
    refused = tracelake(home, "sql", "select 1", "--out", str(home / "tables" / f"x{suffix}"))
    assert refused.returncode == 1 and "never written" in refused.stderr
    unknown = tracelake(home, "sql", "select 1", "--out", str(tmp_path / "x.xlsx"))
    assert unknown.returncode == 1 and ".parquet" in unknown.stderr
    assert digest(home) == before


def test_copy_is_refused_with_a_pointer_to_out(home: Path, tmp_path: Path) -> None:
    done = tracelake(home, "sql", f"copy (select 1) to '{tmp_path / 'x.csv'}'")
    assert done.returncode == 1 and "--out" in done.stderr
    assert not (tmp_path / "x.csv").exists()
