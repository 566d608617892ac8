"""The real-shaped benchmark trace (benchmarks/real_shaped.py) is the source trace again and again.

Counted from the raw JSON of the source, independently of the parsers: each copy must add exactly the
source's events, kernels, memory instants and steps, with its ids moved past the previous copy's, so
that the benchmark measures a longer run of the same job and not a trace with duplicate ids.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tracelake.warehouse import Warehouse

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from real_shaped import DEFAULT_SOURCE, write_real_shaped  # noqa: E402  (benchmarks/ is not a package)


@pytest.fixture(scope="module")
def source() -> dict:
    with gzip.open(DEFAULT_SOURCE) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def shaped(tmp_path_factory: pytest.TempPathFactory, source: dict) -> tuple[Path, dict]:
    path = tmp_path_factory.mktemp("shaped") / "real.json"
    facts = write_real_shaped(path, 3 * 7_000_000, DEFAULT_SOURCE)  # three copies of the 7 MB source
    return path, facts


def test_each_copy_adds_the_sources_events(source: dict, shaped: tuple[Path, dict]) -> None:
    path, facts = shaped
    written = json.loads(path.read_text())
    events = source["traceEvents"]
    body = [e for e in events if e.get("ph") != "M"]
    copies = facts["copies"]
    assert copies >= 3
    assert len(written["traceEvents"]) == len(events) + (copies - 1) * len(body) == facts["events"]
    for key in ("deviceProperties", "schemaVersion", "baseTimeNanoseconds"):
        assert written[key] == source[key]
    kernels = [e for e in written["traceEvents"] if e.get("cat") == "kernel"]
    assert len(kernels) == copies * sum(e.get("cat") == "kernel" for e in events)
    correlations = [e["args"]["correlation"] for e in kernels]
    assert len(set(correlations)) == len(correlations)  # moved past the previous copy's
    steps = {e["name"] for e in written["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")}
    assert len(steps) == copies * len({e["name"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#")})
    flows = [(e["ph"], e["id"]) for e in written["traceEvents"] if e.get("ph") in ("s", "f")]
    assert len(set(flows)) == len(flows)


def test_the_copies_ingest_as_one_longer_run(source: dict, shaped: tuple[Path, dict], tmp_path: Path) -> None:
    """Kernels, memory instants and steps of the ingested trace: the source's times the copies."""
    path, facts = shaped
    copies = facts["copies"]
    events = source["traceEvents"]
    wh = Warehouse(home=tmp_path / "wh")
    result = wh.ingest([path], job="shaped").results[0]
    assert result.ok, result.error
    count = lambda sql: wh.query(sql).rows[0][0]  # noqa: E731
    assert count("SELECT count(*) FROM device_ops WHERE kind = 'kernel'") == copies * sum(
        e.get("cat") == "kernel" for e in events)
    assert count("SELECT count(*) FROM memory_events") == copies * sum(e.get("name") == "[memory]" for e in events)
    assert count("SELECT count(DISTINCT step) FROM steps") == copies * len(
        {e["name"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#")})
    # each copy's kernels find their own launches: as many fall in steps as in the source ingested alone
    alone = Warehouse(home=tmp_path / "alone")
    assert alone.ingest([DEFAULT_SOURCE], job="source").results[0].ok
    in_steps = "SELECT count(*) FROM device_ops WHERE kind = 'kernel' AND step IS NOT NULL"
    assert count(in_steps) == copies * alone.query(in_steps).rows[0][0] > 0


@pytest.mark.slow
def test_a_large_real_shaped_trace_ingests_within_a_tight_memory_limit(tmp_path: Path) -> None:
    """250 MB of the real capture under a 40 MB DuckDB limit (the default gives 200 MB to 1 GB and more): every
    statement must stream or spill. A plan that held a join in memory failed here, and on 1 GB at the default."""
    from tracelake.warehouse.settings import Settings

    path = tmp_path / "big.json"
    facts = write_real_shaped(path, 250_000_000, DEFAULT_SOURCE)
    wh = Warehouse(settings=Settings.from_env({}, home=tmp_path / "wh", ingest_memory_limit="40MB"))
    result = wh.ingest([path], job="big").results[0]
    assert result.ok, result.error
    assert wh.query("SELECT count(*) FROM steps").rows[0][0] == facts["steps"]


def test_the_duckdb_readers_parts_come_in_event_id_order_so_the_final_tables_are_merged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DuckDB's reader (the fallback engine) reads a group of batch files at once on its threads; its parts must still
    hold their events in event-id order, or the final tables fall back to the hash join (on this shape, before the
    parts were written in order, the device ops did every time)."""
    from tracelake import ingest
    from tracelake.ingest import kineto_sql_tables
    from tracelake.ingest.model import ParseOptions

    path = tmp_path / "shaped.json"
    facts = write_real_shaped(path, 64_000_000, DEFAULT_SOURCE)
    merges: list[tuple[str, bool]] = []
    merge = kineto_sql_tables._write_merged

    def spied(*args: object) -> bool:
        merges.append((args[2].name, merge(*args)))  # type: ignore[arg-type,attr-defined]
        return merges[-1][1]

    monkeypatch.setattr(kineto_sql_tables, "_write_merged", spied)
    staging = tmp_path / "staged"
    staging.mkdir()
    ingest.parse_into(path, staging, ParseOptions(source_name=path.name, trace_id="t", kineto_engine="duckdb"))
    assert sorted(merges) == [("device_ops", True), ("host_ops", True)]
    for table in ("host_ops", "device_ops"):
        ids = pq.read_table(staging / f"{table}.parquet", columns=["event_id"]).column("event_id").to_numpy()
        assert len(ids) and (ids[1:] > ids[:-1]).all(), table
    assert facts["copies"] > 1


def test_a_memory_limit_too_low_for_a_trace_is_named_not_blamed_on_the_trace(tmp_path: Path) -> None:
    """Under a DuckDB limit far too low (4 MB) the ingest fails with an error that names the setting and its value
    (not "could not normalise the trace" with DuckDB's own advice on SQL settings), leaves nothing behind, and the
    same file then ingests under the default limit; the command says the same, without a traceback."""
    import os
    import subprocess

    from tracelake.contracts.status import IngestStatus
    from tracelake.warehouse import IngestMemoryLimit, Settings, Unavailable

    trace = ROOT / "sample_traces" / "gpu_h200" / "train" / "train.pt.trace.json.gz"
    home = tmp_path / "wh"
    wh = Warehouse(settings=Settings.from_env({}, home=home, ingest_memory_limit="4MB"))
    result = wh.ingest([trace], job="low").results[0]
    assert result.status == IngestStatus.FAILED
    assert "TRACELAKE_INGEST_MEMORY_LIMIT=4MB" in (result.error or "") and "raise the limit" in (result.error or "")
    assert "could not normalise" not in (result.error or "") and "SET threads" not in (result.error or "")
    assert not any((home / "staging").iterdir()) and wh.registry.frame().is_empty()
    assert issubclass(IngestMemoryLimit, Unavailable)
    run = subprocess.run([sys.executable, "-m", "tracelake.api.cli", "ingest", "-q", str(trace), "--job", "low"],
                         env={**os.environ, "TRACELAKE_HOME": str(home), "TRACELAKE_INGEST_MEMORY_LIMIT": "4MB"},
                         capture_output=True, text=True, timeout=300)
    assert run.returncode != 0 and "TRACELAKE_INGEST_MEMORY_LIMIT=4MB" in run.stdout + run.stderr
    assert "Traceback" not in run.stdout + run.stderr
    fine = Warehouse(settings=Settings.from_env({}, home=home)).ingest([trace], job="low").results[0]
    assert fine.status == IngestStatus.INGESTED


def test_the_memory_by_size_benchmark_measures_each_size_against_the_first(tmp_path: Path) -> None:
    """``benchmarks/memory_by_size.py`` at two small sizes, one round: a row per size, its peak the child's own, and
    its difference from the first size's median recomputed here."""
    import statistics
    import subprocess

    out = tmp_path / "sizes.json"
    script = ROOT / "benchmarks" / "memory_by_size.py"
    done = subprocess.run([sys.executable, str(script), "--real", str(DEFAULT_SOURCE), "--sizes", "8,16", "--rounds",
                           "2", "--workdir", str(tmp_path), "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    rows = json.loads(out.read_text())["sizes"]
    assert [row["trace"] for row in rows] == ["real-8mb.json", "real-16mb.json"]
    assert rows[0]["bytes"] < rows[1]["bytes"]
    for row in rows:
        assert len(row["peaks_mib"]) == len(row["seconds"]) == 2
        assert 20 < min(row["peaks_mib"]) <= max(row["peaks_mib"]) < 4096
        assert row["median_mib"] == pytest.approx(statistics.median(row["peaks_mib"]), abs=1)
    first = rows[0]["median_mib"]
    assert rows[0]["over_first_mib"] == 0
    assert rows[1]["over_first_mib"] == pytest.approx(rows[1]["median_mib"] - first, abs=0.1)
    assert "largest median beyond the first size: real-16mb.json" in done.stdout
    assert not list(tmp_path.glob("tracelake-sizes-*"))  # the traces made are removed without --keep
