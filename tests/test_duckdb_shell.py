"""The catalog opens in the stock DuckDB shell (PyPI duckdb-cli) from any working directory."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tracelake.warehouse import Warehouse


def _duckdb_binary() -> str:
    found = shutil.which("duckdb") or str(Path(sys.executable).parent / "duckdb")
    if not Path(found).exists():
        pytest.fail("the duckdb shell is not installed: pip install -e '.[test]' installs duckdb-cli")
    return found


def _shell(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_duckdb_binary(), *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def test_shell_reads_the_catalog_from_another_directory(sample_warehouse: Warehouse, tmp_path: Path) -> None:
    catalog = str(sample_warehouse.store.catalog_path)
    expected = sample_warehouse.query("SELECT count(*) FROM device_ops").rows[0][0]
    assert expected > 0
    for cwd in (Path("/"), tmp_path):
        out = _shell(["-readonly", "-csv", "-noheader", catalog, "-c", "select count(*) from device_ops"], cwd)
        assert out.returncode == 0, out.stderr
        assert int(out.stdout.strip()) == expected


def test_shell_sees_every_table_and_job(sample_warehouse: Warehouse) -> None:
    catalog = str(sample_warehouse.store.catalog_path)
    out = _shell(["-readonly", "-csv", "-noheader", catalog, "-c",
                  "select job, count(*) from traces group by job order by job"], Path("/"))
    assert out.returncode == 0, out.stderr
    rows = dict(line.split(",") for line in out.stdout.split())
    assert rows == {"ddp_straggler": "4", "launch_bound": "1"}
    for table in ("host_ops", "collectives", "steps", "counters", "breakdown"):
        out = _shell(["-readonly", "-csv", "-noheader", catalog, "-c", f"select count(*) from {table}"], Path("/"))
        assert out.returncode == 0, (table, out.stderr)


def test_shell_version_is_the_one_the_storage_targets(sample_warehouse: Warehouse) -> None:
    out = _shell(["-csv", "-noheader", ":memory:", "-c", "select library_version from pragma_version()"], Path("/"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith("v1."), out.stdout
