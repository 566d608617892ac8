"""The table writer's dictionaries (ingest/tables.py, ``TableWriter(dictionaries=True)``): text columns handed over
as Arrow dictionaries are written as Parquet dictionary pages as they are. A reader must not see a difference: the
same schema (the declared one) and the same rows as the plain writer's file, which casts every text to one string
per row, whatever form each column comes in (lists with None, strings, dictionaries with or without a null among
their values or their codes, chunked, chunks of different dictionaries) and in pyarrow, polars and DuckDB alike.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tracelake.contracts import schema
from tracelake.ingest.encoding import UNPRUNED_TEXTS
from tracelake.ingest.tables import TableWriter
from tracelake.ingest.xla_rows import writer_options

#: The columns whose row-group statistics the readers prune by (warehouse/derived.py, warehouse/derived_inputs.py,
#: ingest/kineto_nesting.py): a file written without them would be read whole, or wrongly taken for one rank's.
PRUNED_BY = ("trace_id", "rank", "ts_ns", "kind", "correlation", "event_id")

WORDS = st.one_of(st.none(), st.sampled_from(["", "fusion.1", "all-reduce.3", "μ-op", "x" * 300]))


def _as(form: str, values: list[str | None], draw_codes: list[int]) -> object:
    """``values`` in one of the forms a parser hands over."""
    if form == "list":
        return values
    if form == "strings":
        return pa.array(values, type=pa.string())
    if form == "chunked":
        half = len(values) // 2
        return pa.chunked_array([pa.array(values[:half], type=pa.string()), pa.array(values[half:], type=pa.string())])
    if form == "chunked dicts":  # each chunk its own dictionary, a null among its values
        half = len(values) // 2
        return pa.chunked_array([pa.array(part + [None], type=pa.string()).dictionary_encode(null_encoding="encode")[
            :len(part)] for part in (values[:half], values[half:])])
    if form == "dict per row":  # a word per row, repeats and all (as a parser's per-op lists make them)
        codes = [None if c < 0 else i for i, c in enumerate(draw_codes)]
        return pa.DictionaryArray.from_arrays(pa.array(codes, type=pa.int32()), pa.array(values, type=pa.string()))
    # a dictionary whose values may hold a null (a per-op text that is None) and whose codes may be null too
    words = list(dict.fromkeys(values)) or [None]
    codes = [None if c < 0 else words.index(values[i]) for i, c in enumerate(draw_codes)]
    return pa.DictionaryArray.from_arrays(pa.array(codes, type=pa.int8() if form == "dict8" else pa.int32()),
                                          pa.array(words, type=pa.string()))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), parts=st.integers(1, 3))
def test_dictionaries_read_back_as_the_plain_writer_s_file(data: st.DataObject, parts: int, tmp_path: Path) -> None:
    written: dict[bool, Path] = {}
    batches = []
    for _ in range(parts):
        rows = data.draw(st.integers(0, 40))
        names = data.draw(st.lists(WORDS, min_size=rows, max_size=rows))
        categories = data.draw(st.lists(WORDS, min_size=rows, max_size=rows))
        codes = data.draw(st.lists(st.integers(-1, 3), min_size=rows, max_size=rows))
        forms = data.draw(st.tuples(*[st.sampled_from(["list", "strings", "chunked", "chunked dicts", "dict", "dict8",
                                                       "dict per row"])] * 2))
        expected_names = [None if (forms[0].startswith("dict") and c < 0) else n for n, c in zip(names, codes,
                                                                                             strict=True)]
        batches.append(({"event_id": list(range(rows)), "name": _as(forms[0], names, codes),
                         "category": _as(forms[1], categories, [0] * rows)}, expected_names, categories))
    for dictionaries in (False, True):
        folder = tmp_path / f"d{dictionaries}"
        folder.mkdir(exist_ok=True)
        with TableWriter(folder, "device_ops", trace_id="t1", dictionaries=dictionaries,
                         **writer_options("device_ops")) as writer:
            for columns, _, _ in batches:
                writer.write(columns)
        written[dictionaries] = folder / "device_ops.parquet"
    plain, coded = pq.read_table(written[False]), pq.read_table(written[True])
    assert coded.schema.equals(schema.table("device_ops").arrow_schema)
    assert coded.equals(plain)
    # the rows are the ones handed over (an independent count: the inputs themselves)
    assert coded["name"].to_pylist() == [n for _, names, _ in batches for n in names]
    assert coded["category"].to_pylist() == [c for _, _, categories in batches for c in categories]
    assert set(coded["trace_id"].to_pylist()) <= {"t1"}
    assert pl.read_parquet(written[True]).equals(pl.read_parquet(written[False]))
    # and the texts are stored as dictionary pages, never fallen back to one plain text per row
    file = pq.ParquetFile(written[True])
    meta = file.metadata
    for group in range(meta.num_row_groups):
        for column in range(meta.num_columns):
            chunk = meta.row_group(group).column(column)
            if chunk.path_in_schema in ("name", "category") and \
                    file.read_row_group(group, columns=[chunk.path_in_schema]).column(0).null_count < chunk.num_values:
                assert "RLE_DICTIONARY" in chunk.encodings, (chunk.path_in_schema, chunk.encodings)
    query = "SELECT trace_id, event_id, name, category FROM read_parquet(?)"
    assert duckdb.execute(query, [str(written[True])]).fetchall() == \
        duckdb.execute(query, [str(written[False])]).fetchall()


def test_the_big_tables_keep_the_statistics_readers_prune_by(tmp_path: Path) -> None:
    """The XLA writers leave out the op names' and descriptions' statistics (slow to make on dictionaries, never
    pruned by) and keep every other column's, those the readers prune by above all."""
    assert not UNPRUNED_TEXTS & set(PRUNED_BY)
    rows = 50
    with TableWriter(tmp_path, "device_ops", trace_id="t1", dictionaries=True,
                     **writer_options("device_ops")) as writer:
        writer.write({"event_id": list(range(rows)), "rank": [3] * rows, "ts_ns": list(range(0, 10 * rows, 10)),
                      "kind": ["kernel"] * rows, "correlation": list(range(rows)), "name": ["fusion.1"] * rows,
                      "category": ["compute"] * rows, "long_name": ["%fusion.1 = f32[8] fusion(...)"] * rows})
    group = pq.ParquetFile(tmp_path / "device_ops.parquet").metadata.row_group(0)
    kept = {group.column(i).path_in_schema.split(".")[0]: group.column(i).statistics  # grid.list.element: grid
            for i in range(group.num_columns)}
    assert set(kept) == set(schema.table("device_ops").column_names)
    for name, stats in kept.items():
        if name in UNPRUNED_TEXTS:
            assert stats is None or not stats.has_min_max, name
        else:
            assert stats is not None and stats.has_null_count, name
    assert (kept["rank"].min, kept["rank"].max, kept["trace_id"].min, kept["kind"].max) == (3, 3, "t1", "kernel")
    assert (kept["ts_ns"].min, kept["ts_ns"].max) == (0, 10 * (rows - 1))


def test_parts_share_one_array_of_nulls_per_type(tmp_path: Path) -> None:
    """The columns a parser leaves empty are slices of one array per type (not 8 bytes a row for every part
    waiting beside the writer), and still read back as nulls of the declared type."""
    with TableWriter(tmp_path, "device_ops", trace_id="t1", dictionaries=True,
                     **writer_options("device_ops")) as writer:
        parts = [writer.part({"event_id": list(range(n)), "name": ["k"] * n}) for n in (40, 40, 25, 60)]
        for part in parts:
            writer.write_part(part)
    first = parts[0]["correlation"].chunk(0).buffers()[1].address
    assert [p["correlation"].chunk(0).buffers()[1].address for p in parts[:3]] == [first] * 3
    assert parts[3]["correlation"].chunk(0).buffers()[1].address != first  # a longer part: a longer array, once
    table = pq.read_table(tmp_path / "device_ops.parquet")
    assert table.num_rows == 165 and table["correlation"].null_count == 165 and table["grid"].null_count == 165
    assert table.schema.equals(schema.table("device_ops").arrow_schema)
