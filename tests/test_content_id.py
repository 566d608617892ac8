"""Content identity: a trace's id is the SHA-256 of its decoded content (docs/formats.md, "Trace ids").

The expected ids are computed here with hashlib over ``gzip.decompress`` (an oracle
independent of the streaming readers under test).
"""

from __future__ import annotations

import gzip
import hashlib
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from tracelake import ingest
from tracelake.api.app import create_app
from tracelake.api.archives import UnpackLimits
from tracelake.api.content_hash import ContentHasher
from tracelake.warehouse import Settings, TooLarge, TraceFormatError, Warehouse


def _oracle(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()[:20]


@pytest.fixture
def copies(samples: Path, tmp_path: Path) -> dict[str, Path]:
    """One rank's trace as .json, as .json.gz at levels 1 and 9, in two gzip members, and a different rank."""
    content = gzip.decompress((samples / "ddp_straggler" / "rank-0.json.gz").read_bytes())
    out = tmp_path / "copies"
    out.mkdir()
    files = {
        "json": (out / "rank-0.json", content),
        "gz1": (out / "fast" / "rank-0.json.gz", gzip.compress(content, compresslevel=1, mtime=0)),
        "gz9": (out / "best" / "rank-0.json.gz", gzip.compress(content, compresslevel=9, mtime=12345)),
        "members": (out / "two" / "rank-0.json.gz",
                    gzip.compress(content[:1000]) + gzip.compress(content[1000:]) + b"\0" * 64),
        "other": (out / "rank-1.json.gz", (samples / "ddp_straggler" / "rank-1.json.gz").read_bytes()),
    }
    for path, data in files.values():
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(data)
    return {name: path for name, (path, _) in files.items()}


def test_copies_of_one_content_have_one_id(copies: dict[str, Path]) -> None:
    expected = _oracle(copies["json"].read_bytes())
    assert {name: ingest.content_id(copies[name]) for name in ("json", "gz1", "gz9", "members")} == dict.fromkeys(
        ("json", "gz1", "gz9", "members"), expected)
    assert len(expected) == 20
    assert copies["gz1"].read_bytes() != copies["gz9"].read_bytes()  # the bytes do differ
    other = ingest.content_id(copies["other"])
    assert other == _oracle(gzip.decompress(copies["other"].read_bytes())) and other != expected


def test_ingesting_copies_keeps_one_trace(warehouse: Warehouse, copies: dict[str, Path]) -> None:
    first = warehouse.ingest([copies["json"]], job="a").results[0]
    assert first.status == "ingested", first.error
    for name in ("gz1", "gz9", "members"):
        again = warehouse.ingest([copies[name]], job="b").results[0]
        assert (again.status, again.trace_id, again.job) == ("duplicate", first.trace_id, "a")
    assert warehouse.ingest([copies["other"]], job="a").results[0].status == "ingested"
    assert warehouse.query("SELECT count(*) FROM traces").rows[0][0] == 2
    fleet = warehouse.fleet()
    alone = Warehouse(warehouse.home.parent / "alone")
    assert alone.ingest([copies["json"], copies["other"]], job="a").ok
    assert fleet.totals["device_hours"].to_list() == alone.fleet().totals["device_hours"].to_list()


def test_hasher_matches_for_any_chunking(copies: dict[str, Path]) -> None:
    limits = UnpackLimits.from_settings(Settings())
    for name in ("json", "gz1", "gz9", "members"):
        data = copies[name].read_bytes()
        for size in (1, 2, 3, 1000, 65536, len(data)):
            hasher = ContentHasher(name, limits, 1 << 30)
            for at in range(0, len(data), size if size > 3 else 4099):  # tiny sizes: a few odd chunks, then big
                hasher.update(data[at:at + (size if size > 3 else 4099)])
            assert hasher.finish() == _oracle(copies["json"].read_bytes()), (name, size)


def test_hasher_refuses_bad_gzip_and_bombs(copies: dict[str, Path]) -> None:
    limits = UnpackLimits.from_settings(Settings())
    data = copies["gz9"].read_bytes()
    for bad, words in ((data[:-40], "ends early"), (data + b"garbage", "not gzip"),
                       (data[:30] + bytes(200) + data[230:], "corrupt")):
        hasher = ContentHasher("rank-0.json.gz", limits, 1 << 30)
        with pytest.raises(TraceFormatError, match="rank-0.json.gz") as err:
            hasher.update(bad)
            hasher.finish()
        assert words in str(err.value) and "byte" in str(err.value)
    bomb = gzip.compress(bytes(64 << 20))
    hasher = ContentHasher("bomb.gz", limits, len(bomb))
    with pytest.raises(TooLarge, match="bomb.gz"):
        hasher.update(bomb)
        hasher.finish()


def test_bad_gzip_on_ingest_names_the_file(warehouse: Warehouse, copies: dict[str, Path], tmp_path: Path) -> None:
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(copies["gz9"].read_bytes()[:-40])
    result = warehouse.ingest([cut], job="a").results[0]
    assert result.status == "failed" and "cut.json.gz" in (result.error or "") and "byte" in (result.error or "")


def test_upload_of_a_recompressed_copy_is_already_there(client: TestClient, copies: dict[str, Path]) -> None:
    def upload(path: Path, job: str) -> dict:  # type: ignore[type-arg]
        answer = client.post("/api/v1/traces", params={"wait": 60}, data={"job": job},
                             files=[("file", (path.name, path.read_bytes(), "application/octet-stream"))])
        assert answer.status_code == 202, answer.text
        return answer.json()["traces"][0]  # type: ignore[no-any-return]

    first = upload(copies["json"], "a")
    assert first["trace_id"] == _oracle(copies["json"].read_bytes())
    for name in ("gz1", "gz9"):
        again = upload(copies[name], "b")
        assert again["trace_id"] == first["trace_id"] and again["already_present"] is True
    raw = client.put("/api/v1/traces/rank-0.json.gz", params={"job": "c", "wait": 60},
                     content=copies["members"].read_bytes())
    assert raw.status_code == 202 and raw.json()["traces"][0]["trace_id"] == first["trace_id"]
    assert upload(copies["other"], "a")["trace_id"] != first["trace_id"]
    assert client.get("/api/v1/traces").json()["total"] == 2


def test_upload_of_bad_gzip_is_refused_naming_it(client: TestClient, copies: dict[str, Path]) -> None:
    data = copies["gz9"].read_bytes()[:-40]
    answer = client.post("/api/v1/traces", data={"job": "a"},
                         files=[("file", ("cut.json.gz", data, "application/octet-stream"))])
    assert 400 <= answer.status_code < 500
    assert "cut.json.gz" in answer.json()["error"] and "ends early" in answer.json()["error"]
