"""The fast paths of the stored analyses (issue #26) give what the general code gives.

Each fast path skips work where the input already says the answer: module paths built once per module
(:func:`op_scope.chains`), the running counts of the breakdown's sweep packed two to an integer, ids counted in a
table (:func:`launches.shared_correlations`), windows already in start order. Here each is checked against a
plain reference on random inputs, cycles and over-deep chains included; and the statistics that let a row
group be read whole, with fewer columns or not at all: the tables come out the same however the files are cut.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from polars.testing import assert_frame_equal

from tracelake import ingest
from tracelake.analysis import breakdown, idle, op_scope
from tracelake.analysis.launches import shared_correlations
from tracelake.contracts import schema
from tracelake.warehouse.derived import INPUTS, write_derived


def _walked_chains(positions: np.ndarray, parent: np.ndarray, kind: np.ndarray) -> dict[int, tuple[int, ...]]:
    """The rule of :func:`op_scope.chains`, one event at a time."""
    found: dict[int, tuple[int, ...]] = {}
    for start in positions.tolist():
        found[start] = (start,) if kind[start] != op_scope.MODULE else \
            op_scope._walk(start, parent, kind == op_scope.MODULE)
    return found


@pytest.mark.parametrize("seed", range(20))
def test_chains_equal_the_walk_event_by_event(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for trial in range(100):
        n = int(rng.integers(1, 60))
        if trial % 3:  # a forest: each event's parent comes before it
            parent = np.array([int(rng.integers(-1, i)) if i else -1 for i in range(n)], dtype=np.int64)
        else:  # any parent at all, cycles included
            parent = rng.integers(-1, n, n).astype(np.int64)
        kind = rng.integers(0, 3, n).astype(np.int8)
        positions = np.unique(rng.integers(0, n, int(rng.integers(0, n + 1))))
        positions = positions[kind[positions] != op_scope.NONE]
        assert op_scope.chains(positions, parent, kind == op_scope.MODULE).as_dict() == \
            _walked_chains(positions, parent, kind)


def test_chains_deeper_than_the_walk_stop_where_the_walk_stops() -> None:
    n = 3 * op_scope._MAX_DEPTH
    parent = np.arange(-1, n - 1, dtype=np.int64)
    kind = np.where(np.arange(n) % 7 == 0, op_scope.MODULE, op_scope.NONE).astype(np.int8)
    positions = np.flatnonzero(kind)[::13]
    assert op_scope.chains(positions, parent, kind == op_scope.MODULE).as_dict() == \
        _walked_chains(positions, parent, kind)


def _states_by_category(code: np.ndarray, is_start: np.ndarray) -> np.ndarray:
    state = np.zeros(len(code), dtype=np.int8)
    delta = np.where(is_start, 1, -1)
    for bit, which in ((1, 0), (2, 1), (4, 2), (8, 3)):
        state |= (np.cumsum(np.where(code == which, delta, 0)) > 0).astype(np.int8) * np.int8(bit)
    return state


@pytest.mark.parametrize("seed", range(10))
def test_packed_sweep_states_equal_one_count_per_category(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 3000))
    start = rng.integers(0, 1000, n)
    end = start + rng.integers(1, 300, n)
    code = rng.integers(0, 5, n)
    t = np.concatenate([start, end])
    order = np.argsort(t, kind="stable")
    point = np.concatenate([np.arange(n), np.arange(n) + n])[order]
    is_start = point < n
    c = code[np.where(is_start, point, point - n)]
    assert np.array_equal(breakdown._states(c, is_start), _states_by_category(c, is_start))


def test_shared_correlations_dense_and_sparse_equal_a_count() -> None:
    rng = np.random.default_rng(0)
    for size, spread in ((0, 10), (50, 10), (500, 100), (300, 10**12)):
        ids = rng.integers(-5, spread, size).astype(np.int64)
        values, counts = np.unique(ids, return_counts=True)
        assert np.array_equal(shared_correlations(ids), values[counts > 1])


def test_idle_of_ops_in_start_order_with_ties_equals_shuffled() -> None:
    rng = np.random.default_rng(3)
    n = 2000
    ts = np.sort(rng.integers(0, 50_000, n))
    ops = pl.DataFrame({"trace_id": ["t"] * n, "rank": pl.Series([0] * n, dtype=pl.Int32),
                        "stream": rng.integers(0, 3, n), "ts_ns": ts, "end_ns": ts + rng.integers(0, 400, n),
                        "launch_ns": pl.Series([None] * n, dtype=pl.Int64)})
    shuffled = ops.sample(fraction=1.0, shuffle=True, seed=1)
    assert idle.idle_window(ops, {}).sort("stream").equals(idle.idle_window(shuffled, {}).sort("stream"))


@pytest.mark.parametrize("seed", range(10))
def test_start_end_order_equals_two_stable_sorts(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 500))
    ts = rng.integers(0, 40, n)
    if seed % 2:
        ts = np.sort(ts)
    end = ts + rng.integers(0, 10 if seed % 3 else 2**40, n)
    order = np.argsort(end, kind="stable")
    assert np.array_equal(idle._by_start_end(ts, end), order[np.argsort(ts[order], kind="stable")])


def _parsed(path: Path, folder: Path) -> Path:
    """``path`` parsed into ``folder`` (a staging folder, as ingest makes it)."""
    folder.mkdir()
    ingest.parse_into(path, folder, ingest.ParseOptions(source_name=path.name, trace_id=path.parent.name + path.name))
    return folder


def _derived(parsed: Path, out: Path, threads: int = 1) -> dict[str, pl.DataFrame]:
    out.mkdir()
    write_derived(parsed, out, threads=threads)
    return {name: pl.read_parquet(out / f"{name}.parquet") for name in schema.DERIVED_TABLES}


def test_derived_tables_do_not_depend_on_the_row_groups(samples: Path, tmp_path: Path) -> None:
    """Row groups that the statistics pin to one trace and rank are read whole (or not at all); groups holding
    several traces, cut anywhere, are filtered: the tables come out the same either way, row for row."""
    traces = [_parsed(samples / "ddp_straggler" / f"rank-{r}.json.gz", tmp_path / f"k{r}") for r in (0, 1)]
    traces.append(_parsed(samples.parent / "xla" / "tpu_allreduce" / "host0.xplane.pb", tmp_path / "xla"))
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    for folder, rows in ((whole, None), (cut, 97)):
        folder.mkdir()
        for name in INPUTS:
            table = pa.concat_tables([pq.read_table(t / f"{name}.parquet") for t in traces],
                                     promote_options="permissive")
            pq.write_table(table, folder / f"{name}.parquet", row_group_size=rows)
    expected, got = _derived(whole, tmp_path / "out-whole"), _derived(cut, tmp_path / "out-cut")
    alone = [_derived(t, tmp_path / f"out-{t.name}") for t in traces]
    # ranks side by side on threads (6 (trace, rank)s here: the 4 chips of the XLA profile, 2 Kineto ranks) give
    # the same tables, in the same order, as one rank after another
    threaded = {n: _derived(cut, tmp_path / f"out-threads-{n}", threads=n) for n in (2, 3)}
    assert len(pl.read_parquet(whole / "device_ops.parquet").select("trace_id", "rank").unique()) == 6
    for name in schema.DERIVED_TABLES:
        assert_frame_equal(got[name], expected[name], check_exact=True)
        for tables in threaded.values():
            assert_frame_equal(tables[name], expected[name], check_exact=True)
        each = pl.concat([a[name] for a in alone], how="vertical_relaxed")
        assert_frame_equal(got[name].sort(pl.all()), each.sort(pl.all()), check_exact=True)
