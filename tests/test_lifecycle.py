"""Job lifecycle files (ingest/lifecycle.py, docs/formats.md "Job lifecycle"): detection, rows, strict errors,
nothing written for a bad file, and the upload through the real API into the fleet's goodput."""

from __future__ import annotations

import copy
import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st

from support import ROOT
from tracelake import ingest
from tracelake.api.reports import fleet_report
from tracelake.contracts.errors import TraceFormatError
from tracelake.ingest import lifecycle
from tracelake.warehouse import Warehouse

SAMPLE = ROOT / "sample_traces" / "lifecycle" / "ddp.lifecycle.json"
DDP = ROOT / "sample_traces" / "kineto" / "ddp_straggler"


def _ns(text: str) -> int:
    """An ISO time as ns since the epoch, computed apart from the parser (via a POSIX timestamp)."""
    moment = dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)
    return int(moment.timestamp()) * 1_000_000_000


def _doc() -> dict[str, Any]:
    return json.loads(SAMPLE.read_text())


def _write(tmp_path: Path, doc: object, name: str = "bad.lifecycle.json") -> Path:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc), encoding="utf-8")
    return path


def test_the_sample_is_detected_and_read_event_by_event() -> None:
    assert ingest.detect(SAMPLE).name == "job_lifecycle"
    doc = _doc()
    parsed = ingest.parse(SAMPLE)
    rows = parsed.tables["job_lifecycle"].to_pylist()
    assert [r["event"] for r in rows] == (["submitted", "started", "first_step"] + ["checkpoint"] * len(doc["checkpoints"])
                                          + ["restart"] * len(doc["restarts"]) + ["ended"])
    by_event = {r["event"]: r for r in rows}
    for key in ("submitted", "started", "first_step", "ended"):
        assert by_event[key]["at_ns"] == _ns(doc[key]), key
    checkpoints = [r for r in rows if r["event"] == "checkpoint"]
    assert [(r["seq"], r["at_ns"], r["step"], r["dur_ns"]) for r in checkpoints] == [
        (i, _ns(c["at"]), c["step"], c["seconds"] * 1_000_000_000) for i, c in enumerate(doc["checkpoints"])]
    restart, wanted = by_event["restart"], doc["restarts"][0]
    assert (restart["at_ns"], restart["lost_since_ns"], restart["resumed_ns"]) == (
        _ns(wanted["at"]), _ns(wanted["lost_since"]), _ns(wanted["resumed"]))
    assert by_event["ended"]["steps"] == doc["steps"]
    assert by_event["ended"]["productive_ns"] == doc["productive_step_seconds"] * 1_000_000_000
    assert {r["declared_job"] for r in rows} == {doc["job"]}
    assert parsed.info.format == "job_lifecycle" and parsed.info.start_ns == _ns(doc["submitted"])
    assert all(t.num_rows == 0 for name, t in parsed.tables.items() if name != "job_lifecycle")


def test_offsets_are_honoured_and_optional_lists_may_be_absent(tmp_path: Path) -> None:
    doc = {"tracelake_lifecycle": 1, "job": "x", "submitted": "2026-12-01T10:00:00+02:00",
           "started": "2026-12-01T08:30:00Z", "first_step": "2026-12-01T08:31:00Z", "ended": "2026-12-01T09:00:00Z"}
    rows = ingest.parse(_write(tmp_path, doc, "x.json")).tables["job_lifecycle"].to_pylist()
    assert rows[0]["at_ns"] == _ns("2026-12-01T08:00:00Z")
    assert [r["event"] for r in rows] == ["submitted", "started", "first_step", "ended"]


def _broken(change: Any) -> dict[str, Any]:
    doc = copy.deepcopy(_doc())
    change(doc)
    return doc


#: (how the sample is broken, the JSON path the error names, words of the message)
BROKEN = [
    (lambda d: d.update(tracelake_lifecycle=2), "$.tracelake_lifecycle", "unsupported version 2"),
    (lambda d: d.update(job=""), "$.job", "non-empty string"),
    (lambda d: d.pop("started"), "$.started", "missing 'started'"),
    (lambda d: d.update(ended="2026-11-30T14:00:00"), "$.ended", "no UTC offset"),
    (lambda d: d.update(ended="yesterday"), "$.ended", "not an ISO 8601 time"),
    (lambda d: d.update(ended=5), "$.ended", "as a string"),
    (lambda d: d.update(started="2026-11-30T07:00:00Z"), "$.started", "before submitted"),
    (lambda d: d.update(colour="red"), "$.colour", "unknown key 'colour'"),
    (lambda d: d["checkpoints"][1].update(seconds=-1), "$.checkpoints[1].seconds", "from 0 to 1e9"),
    (lambda d: d["checkpoints"][2].pop("seconds"), "$.checkpoints[2].seconds", "missing 'seconds'"),
    (lambda d: d["checkpoints"][0].update(at="2026-11-30T08:00:00Z"), "$.checkpoints[0].at", "before first_step"),
    (lambda d: d["checkpoints"][4].update(seconds=3600), "$.checkpoints[4].seconds", "after the job ended"),
    (lambda d: d["checkpoints"][0].update(step=-3), "$.checkpoints[0].step", "whole number"),
    (lambda d: d.update(checkpoints={}), "$.checkpoints", "expected a list"),
    (lambda d: d["restarts"][0].update(lost_since="2026-11-30T12:00:00Z"), "$.restarts[0].at", "before lost_since"),
    (lambda d: d["restarts"][0].update(resumed="2026-11-30T15:00:00Z"), "$.restarts[0].resumed", "before resumed"),
    (lambda d: d["restarts"].append(3), "$.restarts[1]", "expected an object"),
    (lambda d: d.update(productive_step_seconds=99999), "$.productive_step_seconds", "more than the time"),
    (lambda d: d.update(steps=True), "$.steps", "whole number"),
]


@pytest.mark.parametrize(("change", "where", "words"), BROKEN)
def test_a_bad_file_names_the_file_and_the_json_path(tmp_path: Path, change: Any, where: str, words: str) -> None:
    path = _write(tmp_path, _broken(change))
    with pytest.raises(TraceFormatError) as raised:
        ingest.parse(path)
    assert raised.value.source == "bad.lifecycle.json" and raised.value.where == where
    assert words in str(raised.value) and str(raised.value).startswith("bad.lifecycle.json: ")


@pytest.mark.parametrize(("text", "where", "words"), [
    ('{"tracelake_lifecycle": 1, "job": "a", "job": "b"}', "$", "'job' given twice"),
    ('{"tracelake_lifecycle": 1, "job": ', "byte 34", "not valid JSON"),  # where the value should be
    ('{"tracelake_lifecycle": 1, "job": "\u00e9", ]', "byte 40", "not valid JSON"),  # after a 2-byte character
    ('{"tracelake_lifecycle": 1}', "$.job", "non-empty string"),
])
def test_json_that_is_not_a_lifecycle_is_refused(tmp_path: Path, text: str, where: str, words: str) -> None:
    with pytest.raises(TraceFormatError) as raised:
        ingest.parse(_write(tmp_path, text))
    assert raised.value.where == where and words in str(raised.value)


def test_a_bad_file_writes_nothing_and_a_good_one_lands_in_its_job(home: Path, tmp_path: Path) -> None:
    wh = Warehouse(home)
    bad = _write(tmp_path, _broken(lambda d: d["restarts"][0].update(resumed="2026-11-30T11:00:00Z")))
    report = wh.ingest([bad], job="ddp")
    assert not report.ok and "$.restarts[0].resumed" in (report.failed[0].error or "")
    assert wh.query("SELECT count(*) FROM traces").rows == [(0,)]
    assert wh.query("SELECT count(*) FROM job_lifecycle").rows == [(0,)]
    assert wh.ingest([SAMPLE], job="ddp").ok
    assert wh.query("SELECT format, job FROM traces").rows == [("job_lifecycle", "ddp")]
    assert wh.query("SELECT count(*) FROM job_lifecycle WHERE job = 'ddp'").rows == [(10,)]
    # without traces of the job, goodput has no program factor, and the report still shows the time split
    [row] = wh.fleet().goodput.to_dicts()
    assert row["program_goodput"] is None and row["goodput"] is None and row["dominant_badput"] == "restart_lost"
    page = fleet_report(wh.fleet(), lambda job: None)
    assert "No device time in this window" in page and "restarts lost 0.3 h (5%)" in page


def test_upload_through_the_api_gives_the_fleet_its_goodput(client: TestClient) -> None:
    files = [("file", (p.name, p.read_bytes(), "application/octet-stream"))
             for p in [SAMPLE, *sorted(DDP.glob("*.json.gz"))]]
    answer = client.post("/api/v1/traces", params={"wait": 60}, files=files, data={"job": "ddp", "labels": "team=infra"})
    assert answer.status_code in (200, 202), answer.text
    assert [t["status"] for t in answer.json()["traces"]] == ["done"] * 5, answer.text
    trace = client.get(answer.json()["traces"][0]["url"]).json()
    assert trace["trace"]["format"] == "job_lifecycle" and trace["job"] == "ddp"
    fleet = client.get("/api/v1/reports/fleet.json").json()
    [row] = fleet["goodput"]
    doc = _doc()
    wall = _ns(doc["ended"]) - _ns(doc["submitted"])
    assert row["job"] == "ddp" and row["wall_ns"] == wall
    assert row["queued_ns"] == _ns(doc["started"]) - _ns(doc["submitted"])
    assert row["checkpoint_ns"] == sum(c["seconds"] for c in doc["checkpoints"]) * 1_000_000_000
    # the split worked out by hand in sample_traces/README.md ("lifecycle")
    assert [row[f"{b}_ns"] // 1_000_000_000 for b in ("startup", "restart_lost", "restart_recovery", "other")] == [
        480, 1110, 900, 940]
    assert row["productive_ns"] == doc["productive_step_seconds"] * 1_000_000_000
    [job] = fleet["by_job"]
    assert row["program_goodput"] == pytest.approx(job["useful_pct"] / 100)
    assert 0 < row["goodput"] < row["scheduling_goodput"] * row["runtime_goodput"] <= 1
    buckets = ("queued", "startup", "restart_recovery", "restart_lost", "checkpoint", "other", "program_badput")
    assert sum(row[f"{b}_ns"] for b in buckets) + row["goodput_ns"] == wall
    page = client.get("/api/v1/reports/fleet").text
    assert 'id="goodput"' in page and "below peak FLOPs (1 - MFU)" in page and 'id="useful-work"' in page
    assert client.get("/api/v1/jobs/ddp/report").status_code == 200  # the job's own report copes with the file


_JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=30)
                     | st.sampled_from(["2026-11-30T09:00:00Z", "2026-11-30T09:00:00", "9999-12-31T23:59:59+14:00"]),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                     max_leaves=8)


@given(data=st.data())
def test_any_change_to_a_value_parses_or_is_refused_with_a_place(data: st.DataObject) -> None:
    doc = _doc()
    paths: list[tuple[Any, Any]] = [(doc, k) for k in doc]
    paths += [(item, k) for key in ("checkpoints", "restarts") for item in doc[key] for k in item]
    container, key = data.draw(st.sampled_from(paths))
    container[key] = data.draw(_JSON)
    try:
        rows = lifecycle.read(json.dumps(doc).encode(), "f.json")
    except TraceFormatError as e:
        assert e.where and str(e).startswith("f.json: ")
    else:
        assert rows["event"][0] == "submitted" and rows["event"][-1] == "ended"
