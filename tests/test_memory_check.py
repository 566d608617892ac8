"""``tracelake check`` on traces registered before the memory tables existed (warehouse/check.py ``TABLE_SINCE``).

A trace's ``traces`` row records the schema version it was written under. One registered under a version older than
a table has no file of it, and that is not a problem; under a version that had the table, the same absence is.
The old registration is forged here with pyarrow, as an old tracelake wrote it: the same row, an older version.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from support import SAMPLES
from tracelake.contracts import schema
from tracelake.warehouse import Warehouse
from tracelake.warehouse.check import TABLE_SINCE

MEMORY_TABLES = ("memory_events", "memory_timeline", "allocator_segments", "allocator_events")


def _forge(warehouse: Warehouse, trace_id: str, version: int, drop: tuple[str, ...]) -> None:
    """Register ``trace_id`` under schema ``version`` and remove its files of ``drop``, as an older writer left it."""
    store = warehouse.store
    registration = store.path("traces", "old", trace_id)
    table = pq.read_table(registration)
    at = table.schema.get_field_index("schema_version")
    table = table.set_column(at, table.schema.field(at), pa.array([version], table.schema.field(at).type))
    pq.write_table(table, registration)
    for name in drop:
        store.path(name, "old", trace_id).unlink()


@pytest.mark.parametrize(("version", "problems"), [(7, 0), (8, 4)])
def test_tables_newer_than_the_trace_are_not_missing(tmp_path: Path, version: int, problems: int) -> None:
    warehouse = Warehouse(tmp_path / "wh")
    report = warehouse.ingest([SAMPLES / "ddp_straggler" / "rank-0.json.gz"], job="old")
    trace_id = str(report.results[0].trace_id)
    assert all(warehouse.store.path(name, "old", trace_id).exists() for name in MEMORY_TABLES)
    assert warehouse.check().ok
    _forge(warehouse, trace_id, version, MEMORY_TABLES)
    checked = warehouse.check()
    missing = [p for p in checked.problems if p.kind == "missing"]
    assert sorted(p.table for p in missing) == (sorted(MEMORY_TABLES) if problems else [])
    assert checked.ok is (problems == 0)
    assert checked.not_in_version == (len(MEMORY_TABLES) if not problems else 0)
    assert checked.as_dict()["not_in_version"] == checked.not_in_version


def test_an_old_trace_still_needs_its_old_tables(tmp_path: Path) -> None:
    warehouse = Warehouse(tmp_path / "wh")
    trace_id = str(warehouse.ingest([SAMPLES / "ddp_straggler" / "rank-0.json.gz"], job="old").results[0].trace_id)
    _forge(warehouse, trace_id, 1, ("device_ops",))
    checked = warehouse.check()
    assert [(p.table, p.kind) for p in checked.problems] == [("device_ops", "missing")]
    assert set(TABLE_SINCE) <= set(schema.PARSED_TABLES)  # derived tables are recomputed, never excused
