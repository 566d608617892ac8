"""The XLA parsers' shared helpers (ingest/xla_rows.py): the distinct metadata ids of a line, held to numpy's own."""

from __future__ import annotations

from unittest import mock

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tracelake.ingest import xla_rows
from tracelake.ingest.xla_rows import DENSE_SLOTS_PER_ID, distinct_inverse

#: Ids as a plane numbers its metadata (1 up, a few hundred), and ids no table suits (negative, huge, sparse).
SMALL_IDS = hnp.arrays(np.int64, st.integers(0, 400), elements=st.integers(0, 300))
ANY_IDS = hnp.arrays(np.int64, st.integers(0, 200), elements=st.integers(-(1 << 62), 1 << 62))


def _unique(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    distinct, inverse = np.unique(ids, return_inverse=True)
    return distinct, inverse.reshape(-1)


@settings(max_examples=200, deadline=None)
@given(ids=st.one_of(SMALL_IDS, ANY_IDS))
def test_distinct_inverse_is_numpys_unique(ids: np.ndarray) -> None:
    distinct, inverse = distinct_inverse(ids)
    expected_distinct, expected_inverse = _unique(ids)
    assert np.array_equal(distinct, expected_distinct) and distinct.dtype == ids.dtype
    assert np.array_equal(inverse, expected_inverse) and inverse.shape == ids.shape
    assert np.array_equal(distinct[inverse], ids)  # each event finds its own id back


@settings(max_examples=50, deadline=None)
@given(ids=hnp.arrays(np.int64, st.integers(1, 300), elements=st.integers(0, 1000)))
def test_small_ids_are_counted_not_sorted(ids: np.ndarray) -> None:
    # the table applies: numpy's sort is never called, and the result is still numpy's
    expected = _unique(ids)
    with mock.patch.object(xla_rows.np, "unique", side_effect=AssertionError("sorted ids a table could count")):
        distinct, inverse = distinct_inverse(ids)
    assert np.array_equal(distinct, expected[0]) and np.array_equal(inverse, expected[1])


def test_ids_too_sparse_for_a_table_are_sorted() -> None:
    ids = np.array([3, DENSE_SLOTS_PER_ID * 10 + 5000, 3], dtype=np.int64)
    distinct, inverse = distinct_inverse(ids)
    assert distinct.tolist() == [3, DENSE_SLOTS_PER_ID * 10 + 5000] and inverse.tolist() == [0, 1, 0]
