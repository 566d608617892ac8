"""The finding bound on made-up spans: ``findings.bound`` caps gains, ``findings.spans`` measures spans.

The unit tests under the invariant of ``test_invariants.py`` that a finding's gain never exceeds the
span of the traces and ranks it names (docs/analyses.md, "Findings").
"""

from __future__ import annotations

import polars as pl
from tracelake.analysis import findings


def _spans(*rows: tuple[str, int, int | None]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema={"trace_id": pl.String, "rank": pl.Int64, "span_ns": pl.Int64}, orient="row")


def test_bound_caps_a_gain_at_the_span_it_names() -> None:
    spans = _spans(("a" * 20, 0, 1_000), ("b" * 20, 1, 5_000))
    over, within = findings.bound([findings.Finding("x", "t", "on rank 0", 4_000, ranks=(0,)),
                                   findings.Finding("y", "t", "on rank 1", 4_000, ranks=(1,))], spans)
    assert (over.gain_ns, over.uncapped_gain_ns, over.traces) == (1_000, 4_000, ("a" * 20,))
    assert "capped" in over.detail and "a" * 12 in over.detail and "a" * 13 not in over.detail
    assert (within.gain_ns, within.uncapped_gain_ns, within.traces) == (4_000, None, ("b" * 20,))


def test_bound_fills_ranks_from_traces_and_zeroes_an_unmeasurable_gain() -> None:
    spans = _spans(("t1", 0, None), ("t1", 1, None), ("t2", 0, 10))
    (found,) = findings.bound([findings.Finding("x", "t", "d", 7, traces=("t1",))], spans)
    assert (found.ranks, found.gain_ns, found.uncapped_gain_ns) == ((0, 1), 0, 7)
    (unnamed,) = findings.bound([findings.Finding("x", "t", "d", 70)], spans)  # bounded by the longest span
    assert (unnamed.gain_ns, unnamed.traces, unnamed.ranks) == (10, (), ())


def test_spans_fall_back_from_breakdown_to_trace_bounds_to_collectives() -> None:
    whole = pl.DataFrame({"trace_id": ["d"], "rank": [0], "span_ns": [100]})
    traces = pl.DataFrame({"trace_id": ["d", "t", "c"], "rank": [0, 3, 0], "start_ns": [0, 50, None],
                           "end_ns": [999, 250, None]})
    colls = pl.DataFrame({"trace_id": ["c", "c", "c"], "rank": [0, 1, 1], "ts_ns": [10, 20, 100],
                          "dur_ns": [5, 5, 30]})
    got = findings.spans(whole, traces, colls).sort("trace_id", "rank").rows()
    assert got == [("c", 0, 5), ("c", 1, 110), ("d", 0, 100), ("t", 3, 200)]
