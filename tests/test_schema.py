"""Schemas are data: every table round-trips through Parquet and the docs match the declaration."""

from __future__ import annotations

import dataclasses

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from support import ROOT
from tracelake.api import settings as server_settings
from tracelake.api.settings import ServerSettings
from tracelake.contracts import schema
from tracelake.warehouse import Settings, Warehouse, schema_doc
from tracelake.warehouse.settings import SETTINGS_DOC


def test_docs_schema_md_is_generated_from_the_declaration() -> None:
    expected = schema_doc.render()
    actual = (ROOT / "docs" / "schema.md").read_text()
    assert actual == expected, "docs/schema.md is stale: python -m tracelake.warehouse.schema_doc > docs/schema.md"


def test_every_setting_is_documented_and_docs_api_md_lists_the_server_settings() -> None:
    warehouse_fields = {f.name for f in dataclasses.fields(Settings)}
    server_fields = {f.name for f in dataclasses.fields(ServerSettings)} - warehouse_fields
    assert set(SETTINGS_DOC) == warehouse_fields
    assert set(server_settings.SERVER_SETTINGS_DOC) == server_fields
    assert server_settings.render_doc() in (ROOT / "docs" / "api.md").read_text(), (
        "docs/api.md is stale: put the output of python -m tracelake.api.settings under \"Server settings\"")


def test_every_column_is_documented_and_unit_named() -> None:
    for tbl in schema.TABLES.values():
        assert tbl.doc
        names = [c.name for c in tbl.columns]
        assert len(names) == len(set(names)), tbl.name
        for col in tbl.columns:
            assert col.doc.strip(), f"{tbl.name}.{col.name} has no doc"
            if col.name.endswith(("_ns",)):
                assert col.type == "BIGINT", f"{tbl.name}.{col.name}: times are integer ns"
        if tbl.name != "traces":
            assert "trace_id" in names, f"{tbl.name} lacks trace_id"
    assert "job" in [c.name for c in schema.TRACES.partition_columns]


@pytest.mark.parametrize("name", list(schema.TABLES))
def test_table_round_trips_through_parquet(name: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    tbl = schema.table(name)
    row = {c.name: _value(c.arrow_type) for c in tbl.columns}
    table = pa.Table.from_pylist([row], schema=tbl.arrow_schema)
    path = tmp_path / f"{name}.parquet"
    pq.write_table(table, path)
    back = pq.read_table(path)
    assert back.schema.equals(tbl.arrow_schema, check_metadata=False)
    assert back.to_pylist() == table.to_pylist()


def _value(t: pa.DataType) -> object:
    if pa.types.is_string(t):
        return "x"
    if pa.types.is_integer(t):
        return 7
    if pa.types.is_floating(t):
        return 1.5
    if pa.types.is_boolean(t):
        return True
    if pa.types.is_timestamp(t):
        import datetime as dt

        return dt.datetime(2026, 1, 2, tzinfo=dt.timezone.utc)
    if pa.types.is_map(t):
        return [("k", "v")]
    if pa.types.is_list(t):
        return [_value(t.value_type)]
    raise AssertionError(f"no sample value for {t}")


def test_parsed_tables_match_the_declared_schema(sample_warehouse: Warehouse) -> None:
    for name, tbl in schema.TABLES.items():
        files = [p for p in (sample_warehouse.home / "tables" / name).glob("job=*/*.parquet")]
        assert len(files) > 1, name
        for path in files:
            stored = pq.read_schema(path)
            assert stored.names == tbl.column_names, (name, path)
            for field, col in zip(stored, tbl.columns):
                assert _same_type(field.type, col.arrow_type), (name, col.name, field.type, col.arrow_type)


def _same_type(a: pa.DataType, b: pa.DataType) -> bool:
    if pa.types.is_list(a) and pa.types.is_list(b):
        return _same_type(a.value_type, b.value_type)
    if pa.types.is_map(a) and pa.types.is_map(b):
        return a.key_type == b.key_type and a.item_type == b.item_type
    return a == b


def test_views_expose_every_table_with_its_columns(sample_warehouse: Warehouse) -> None:
    for name, tbl in schema.TABLES.items():
        result = sample_warehouse.query(f"SELECT * FROM {name} LIMIT 0")
        assert set(result.columns) == set(tbl.column_names) | {"job"}, name
