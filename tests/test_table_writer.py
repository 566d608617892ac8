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
from tracelake.ingest.tables import TableWriter
from tracelake.ingest.xla_rows import writer_options

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
    meta = pq.ParquetFile(written[True]).metadata
    for group in range(meta.num_row_groups):
        for column in range(meta.num_columns):
            chunk = meta.row_group(group).column(column)
            if chunk.path_in_schema in ("name", "category") and chunk.statistics is not None \
                    and chunk.statistics.has_min_max:  # some text in it
                assert "RLE_DICTIONARY" in chunk.encodings, (chunk.path_in_schema, chunk.encodings)
    query = "SELECT trace_id, event_id, name, category FROM read_parquet(?)"
    assert duckdb.execute(query, [str(written[True])]).fetchall() == \
        duckdb.execute(query, [str(written[False])]).fetchall()
