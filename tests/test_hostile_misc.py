"""Hostile input, round 2 (issue #18): label floods, pickle expansion, out-of-range dates, odd boundaries, NaN.

One attack per section, each with the check that the attack now gets a clear 4xx (or a
clean CLI error) and that legitimate input like it still works:

- made-up HTTP methods and paths must not become ``/metrics`` labels (the page grew for good);
- a small Flight Recorder pickle whose entries share one large value must be refused before
  it expands (88 KB became 480 MB of rows and 1.5 GB of memory);
- a fleet report window outside the representable dates, and a multipart boundary past what
  the parser takes, must be 4xx answers (they were 500s);
- the CLI's JSON must be strict JSON (``NaN`` and ``Infinity`` are not).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import pickle
import random
import string
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from tracelake.api.app import create_app
from tracelake.api.cli import app as cli
from tracelake.api.output import jsonable, to_json
from tracelake.sample_traces import generate_nccl
from tracelake.warehouse import InvalidArgument, Settings, Warehouse
from tracelake.warehouse.results import QueryResult

from support.server import running_server

pytestmark = pytest.mark.slow  # hostile requests against in-process and real servers

MiB = 1 << 20
TOKEN = "reader-token-0001"


def _refused(answer: httpx.Response, status: int, *words: str) -> str:
    """Assert ``answer`` is the JSON error ``status`` whose message holds every one of ``words``; the message."""
    assert answer.status_code == status, answer.text[:1000]
    assert "Traceback" not in answer.text
    error: str = answer.json()["error"]
    for word in words:
        assert word in error, (word, error)
    return error


def _strict(text: str) -> Any:
    """``text`` parsed as strict JSON: ``NaN``, ``Infinity`` and ``-Infinity`` are errors, as in every other parser."""

    def refuse(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


# -- 1. made-up methods and paths are not metric labels -------------------------------------------

#: The seed of a list of made-up methods (thousands of characters: drawn from a seed, not one by one).
_SEEDS = st.integers(0, 2**32 - 1)


def _made_up_methods(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [f"X{''.join(rng.choices(string.ascii_uppercase + string.digits, k=12))}" for _ in range(n)]


def _label_values(text: str, label: str) -> set[str]:
    return {line.split(f'{label}="', 1)[1].split('"', 1)[0] for line in text.splitlines()
            if f'{label}="' in line and not line.startswith("#")}


@settings(max_examples=1, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=_SEEDS)
def test_made_up_methods_and_paths_are_not_metric_labels(client: TestClient, seed: int) -> None:
    """Thousands of requests with random methods and paths add a handful of lines to /metrics, not one per request."""
    client.get("/healthz")
    before = len(client.get("/metrics").content)
    methods = _made_up_methods(2000, seed)
    for i, method in enumerate(methods):
        path = ("/api/v1/traces", "/healthz", f"/no/such/path-{i}")[i % 3]
        assert client.request(method, path).status_code in (404, 405)
    client.get("/no/such/page-42")
    text = client.get("/metrics").text
    assert len(text) - before < 4096, len(text) - before
    assert _label_values(text, "method") <= {"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "other"}
    assert 'method="other"' in text
    assert not any(m in text for m in methods)
    routes = _label_values(text, "route")
    assert "unmatched" in routes and "/api/v1/traces" in routes
    assert not any("no/such" in r for r in routes), routes


@settings(max_examples=1, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=_SEEDS)
def test_made_up_methods_over_the_wire(tmp_path: Path, seed: int) -> None:
    """The same against a real server (h11 takes any method token), from clients without a token."""
    env = {**os.environ, "TRACELAKE_HOME": str(tmp_path / "warehouse"), "TRACELAKE_TOKENS": f"{TOKEN}:read"}
    with running_server(["--ingest-workers", "0"], env, tmp_path / "server.log") as url, \
            httpx.Client(base_url=url, timeout=30) as web:
        methods = _made_up_methods(300, seed)
        for i, method in enumerate(methods):
            assert web.request(method, "/api/v1/traces" if i % 2 else f"/x{i}").status_code in (401, 404, 405)
        text = web.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).text
    assert len(text) < 16 * 1024, len(text)
    assert not any(m in text for m in methods)
    assert _label_values(text, "method") <= {"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "other"}
    assert not any(r.startswith("/x") for r in _label_values(text, "route"))


# -- 2. a small Flight Recorder pickle that would expand quadratically ----------------------------

def _shared_dump(entries: int, ranks: int) -> bytes:
    """A dump whose ``entries`` are one dict (pickle memo references) naming one group of ``ranks`` ranks."""
    entry = {"record_id": 0, "pg_id": 0, "process_group": ["0", "default_pg"], "collective_seq_id": 1,
             "profiling_name": "nccl:all_reduce", "time_created_ns": 1_767_225_600_000_000_000,
             "input_sizes": [[4096, 1024]], "input_dtypes": ["Float"], "output_sizes": [[4096, 1024]],
             "output_dtypes": ["Float"], "state": "completed", "duration_ms": 1.25, "is_p2p": False, "frames": []}
    dump = {"version": "2.4", "comm_lib_version": "2.21.5", "rank": 0,
            "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": [0] * ranks}},
            "pg_status": {"0": {"last_enqueued_collective": 1, "last_started_collective": 1,
                                "last_completed_collective": 1}},
            "entries": [entry] * entries}
    return pickle.dumps(dump, protocol=4)


#: Ingests one file in a fresh process; prints the outcome, the seconds it took and the process's peak memory.
_INGEST_ONE = """
import json, resource, sys, time
from pathlib import Path
from tracelake.warehouse import Warehouse
warehouse = Warehouse(Path(sys.argv[2]))
started = time.perf_counter()
result = warehouse.ingest_file(Path(sys.argv[1]))
print(json.dumps({"ok": result.ok, "error": result.error, "seconds": time.perf_counter() - started,
                  "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def _ingest_one(path: Path, home: Path) -> dict[str, Any]:
    run = subprocess.run([sys.executable, "-c", _INGEST_ONE, str(path), str(home)],
                         capture_output=True, text=True, timeout=120, check=True)
    outcome: dict[str, Any] = json.loads(run.stdout)
    return outcome


def test_a_flight_recorder_pickle_that_expands_is_refused_early(tmp_path: Path, home: Path) -> None:
    """88 KB standing for 4,000 rows of 40,000 ranks each: refused at once, in little memory, nothing registered."""
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(_shared_dump(4000, 40_000))
    assert path.stat().st_size < 100_000
    sample = generate_nccl.FR_OUT / "nccl_trace_rank_3"  # a small pickled dump: the baseline
    baseline = _ingest_one(sample, tmp_path / "baseline")
    assert baseline["ok"], baseline
    outcome = _ingest_one(path, home)
    assert not outcome["ok"]
    for word in ("nccl_trace_rank_0", "entries[", "expansion limit", "TRACELAKE_MAX_EXPANSION_RATIO"):
        assert word in outcome["error"], (word, outcome["error"])
    assert outcome["peak_mib"] - baseline["peak_mib"] < 100, (outcome, baseline)  # it took 1.5 GB
    assert outcome["seconds"] < 10, outcome["seconds"]
    warehouse = Warehouse(home)
    assert warehouse.query("SELECT count(*) FROM traces").rows == [(0,)]
    assert warehouse.query("SELECT count(*) FROM collectives").rows == [(0,)]


def test_a_flight_recorder_pickle_that_expands_is_refused_over_the_api(client: TestClient) -> None:
    answer = client.post("/api/v1/traces", params={"wait": 60},
                         files=[("file", ("nccl_trace_rank_0", _shared_dump(4000, 40_000)))])
    _refused(answer, 422, "nccl_trace_rank_0", "expansion limit", "TRACELAKE_MAX_EXPANDED_BYTES")
    assert client.get("/api/v1/traces").json()["traces"] == []


def test_the_expansion_limit_follows_the_settings(tmp_path: Path, home: Path) -> None:
    """A tighter TRACELAKE_MAX_EXPANDED_BYTES refuses a dump the default lets through."""
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(_shared_dump(200, 400))  # about 0.7 MB of rows from a 2 KB pickle: under the 1 MiB floor
    assert Warehouse(home).ingest_file(path).ok
    tight = Warehouse(settings=Settings(home=tmp_path / "tight", max_expansion_ratio=1, max_expanded_bytes=4096))
    result = tight.ingest_file(path)
    assert not result.ok and "more than 4,096 bytes of rows" in (result.error or ""), result.error


def test_a_dump_with_shared_small_values_still_ingests(tmp_path: Path, warehouse: Warehouse) -> None:
    """Legitimate pickles share dicts too (pickle memoises every repeated object): within the limit, they ingest."""
    dump = generate_nccl.flight_recorder_dump(0)
    entries = dump["entries"]
    assert isinstance(entries, list)
    shapes = [[4096, 1024]]
    for entry in entries:
        entry["input_sizes"] = entry["output_sizes"] = shapes  # one list, referenced by every entry
    dump["entries"] = entries * 100  # 1,300 references to 13 dicts
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(pickle.dumps(dump, protocol=4))
    result = warehouse.ingest_file(path, job="fr")
    assert result.ok, result.error
    assert warehouse.query("SELECT count(*), max(group_size) FROM collectives").rows == [(1300, 4)]


# -- 3. 500s: fleet windows out of range, oversized multipart boundaries --------------------------

OUT_OF_RANGE = ["0001-01-01", "9999-12-31", "1969-12-31T23:59:59Z", "9999-12-31T23:59:59-14:00", "60000w"]


@pytest.mark.parametrize("when", OUT_OF_RANGE)
@pytest.mark.parametrize("bound", ["since", "until"])
def test_a_fleet_window_out_of_range_is_a_400(client: TestClient, bound: str, when: str) -> None:
    answer = client.get("/api/v1/reports/fleet", params={bound: when})
    _refused(answer, 400, "invalid time", repr(when), "out of range", "1970-01-01", "2262-04-11")


@pytest.mark.parametrize("when", ["0001-01-01", "9999-12-31"])
@pytest.mark.parametrize("bound", ["--since", "--until"])
def test_a_fleet_window_out_of_range_is_a_clean_cli_error(home: Path, warehouse: Warehouse, tmp_path: Path, bound: str, when: str) -> None:
    result = CliRunner().invoke(cli, ["report", "fleet", bound, when, "--home", str(home),
                                      "--out", str(tmp_path / "fleet.html")])
    assert result.exit_code in (1, 2), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    assert "out of range" in result.output and when in result.output
    assert not (tmp_path / "fleet.html").exists()


def test_a_fleet_window_at_the_edges_of_the_range(client: TestClient, warehouse: Warehouse) -> None:
    for params in ({"since": "1970-01-01"}, {"until": "1970-01-01"}, {"until": "2262-04-11"}):
        assert client.get("/api/v1/reports/fleet", params=params).status_code == 200, params
    with pytest.raises(InvalidArgument, match="out of range"):  # the library refuses them too
        warehouse.fleet(until=dt.datetime(1, 1, 1))


FILE_PART = b'Content-Disposition: form-data; name="file"; filename="a.json"\r\n\r\n{"traceEvents": []}'


def _multipart(boundary: bytes) -> bytes:
    return b"--" + boundary + b"\r\n" + FILE_PART + b"\r\n--" + boundary + b"--\r\n"


@pytest.mark.parametrize(("boundary", "words"), [
    (b"b" * 300, ("multipart", "boundary", "300 characters", "70")),
    (b"b" * 257, ("multipart", "boundary", "257 characters")),
    (b"b" * 71, ("multipart", "boundary", "71 characters")),
    (b"a\x01b", ("multipart", "boundary", "characters")),
])
def test_a_multipart_boundary_rfc_2046_does_not_allow_is_a_400(client: TestClient, home: Path, boundary: bytes,
                                                               words: tuple[str, ...]) -> None:
    headers = {"Content-Type": "multipart/form-data; boundary=" + boundary.decode("latin-1")}
    answer = client.post("/api/v1/traces", content=_multipart(boundary), headers=headers)
    _refused(answer, 400, *words)
    assert list((home / "uploads").iterdir()) == []


def test_the_longest_boundary_rfc_2046_allows_is_taken(client: TestClient) -> None:
    boundary = b"----=_Part:0123456789(abc)+_,-./=?" + b"x" * 36
    assert len(boundary) == 70
    headers = {"Content-Type": f'multipart/form-data; boundary="{boundary.decode()}"'}
    answer = client.post("/api/v1/traces", content=_multipart(boundary), headers=headers)
    assert answer.status_code == 202, answer.text


# -- 4. the CLI prints strict JSON -------------------------------------------------------------------

def test_to_json_is_strict_json() -> None:
    result = QueryResult(columns=["x", "y", "z", "b", "nested"], types=["DOUBLE", "DOUBLE", "DOUBLE", "BLOB", "MAP"],
                         rows=[(float("nan"), float("inf"), -float("inf"), b"\xf8\x00",
                                {b"\xf8": [float("nan"), 1.5], "k": {"v": float("-inf")}})])
    rows = _strict(to_json(result))
    # bytes as base64, as the API's SQL answers carry them
    assert rows == [{"x": None, "y": None, "z": None, "b": "+AA=", "nested": {"+A==": [None, 1.5], "k": {"v": None}}}]


def test_jsonable_leaves_only_json_types() -> None:
    import decimal
    import uuid

    value = {"u": uuid.UUID(int=1), "d": decimal.Decimal("NaN"), "i": dt.timedelta(days=1), "t": (1, "a"),
             None: memoryview(b"\x01"), 2.5: bytearray(b"\x02")}
    assert _strict(json.dumps(jsonable(value))) == {
        "u": "00000000-0000-0000-0000-000000000001", "d": None, "i": "1 day, 0:00:00", "t": [1, "a"],
        "null": "AQ==", "2.5": "Ag=="}


def test_cli_sql_json_is_strict(home: Path, warehouse: Warehouse) -> None:
    """``tracelake sql --format json`` end to end; BLOBs as base64, as the API sends them."""
    sql = ("select 'nan'::double as x, 'inf'::double as y, '-inf'::float as z, [1.5, 'nan'::double] as l, "
           "from_hex('f8') as b")
    result = CliRunner().invoke(cli, ["sql", sql, "--format", "json", "--home", str(home)])
    assert result.exit_code == 0, result.output
    assert _strict(result.stdout) == [{"x": None, "y": None, "z": None, "l": [1.5, None], "b": "+A=="}]


def test_cli_analyze_json_is_strict(monkeypatch: pytest.MonkeyPatch, home: Path, warehouse: Warehouse) -> None:
    """Analyses can hold NaN (a ratio over nothing): ``analyze --json`` prints them as null."""

    class Analysis:
        def as_dict(self) -> dict[str, Any]:
            return {"findings": [], "breakdown": [{"rank": 0, "busy_pct": float("nan"), "gain": float("inf")}]}

    monkeypatch.setattr(Warehouse, "analyze", lambda self, **_: Analysis())
    result = CliRunner().invoke(cli, ["analyze", "--job", "x", "--json", "--home", str(home)])
    assert result.exit_code == 0, result.output
    assert _strict(result.stdout)["breakdown"] == [{"rank": 0, "busy_pct": None, "gain": None}]
