"""Our breakdown against HTA's on the real traces (runs where HTA is installed: pip install -e '.[compare]').

HTA 0.5.0 rounds every GPU event to whole microseconds (start up, end down), so
our figures are computed here on events rounded the same way and classified with
HTA's name rules; then idle %, compute % and the comm/compute overlap must agree
within 0.1 percentage points. Traces where HTA's own defects change the result
are skipped with the reason (docs/analyses.md, "Comparison with HTA"): rounding
that makes a duration negative, and CPU events that carry a stream.
"""

from __future__ import annotations

import logging
import shutil
import warnings
from pathlib import Path

import pytest

from conftest import real_kineto_files
from tracelake.analysis.breakdown import breakdown_sql
from tracelake.warehouse import Warehouse

hta_trace_analysis = pytest.importorskip("hta.trace_analysis", reason="HTA is not installed (extra 'compare')")

FILES = real_kineto_files()
#: Traces where our HTA-rounded figures still differ by more than 0.1 points
#: (0.12 and 0.57): HTA's rounding runs on float microseconds, so some starts land
#: one microsecond later than the exact ceiling we emulate. Left for the analyses issue.
UNEXPLAINED = {"nccl_parser_config", "tracelens_mi300_gaunernst_bert-small-uncased__1016001"}


def _params() -> list[object]:
    return [
        pytest.param(p, id=p.parent.name, marks=[pytest.mark.xfail(
            strict=True, reason="HTA's float rounding differs from the exact emulation (see UNEXPLAINED)")]
        ) if p.parent.name in UNEXPLAINED else pytest.param(p, id=p.parent.name)
        for p in FILES
    ]

# HTA's classification (hta.utils.utils) and rounding (hta.common.trace_parser.round_down_time_stamps).
HTA_ROUNDED = """(
    SELECT trace_id, rank, NULL::BIGINT AS step,
           CASE WHEN regexp_matches(name, '^nccl.*Kernel') THEN 'communication'
                WHEN regexp_matches(name, '^(Memcpy|Memset|dma)') THEN 'memory'
                WHEN regexp_matches(name, '.*(Memcpy|Memset|Sync)') THEN 'other'
                ELSE 'compute' END AS category,
           CAST(ceil(ts_ns / 1000.0) * 1000 AS BIGINT) AS ts_ns,
           CAST(floor((ts_ns + dur_ns) / 1000.0) * 1000 AS BIGINT)
             - CAST(ceil(ts_ns / 1000.0) * 1000 AS BIGINT) AS dur_ns
    FROM device_ops WHERE trace_id = '{trace_id}')"""


@pytest.mark.parametrize("path", _params())
def test_breakdown_agrees_with_hta(path: Path, tmp_path: Path) -> None:
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    try:
        trace_dir = tmp_path / "trace"
        trace_dir.mkdir()
        shutil.copy(path, trace_dir / path.name)
        try:
            hta = hta_trace_analysis.TraceAnalysis(trace_dir=str(trace_dir), include_last_profiler_step=True)
        except AssertionError:
            pytest.skip("HTA 0.5.0 cannot parse this trace")
        frame = hta.t.traces[next(iter(hta.t.traces))]
        symbols = hta.t.symbol_table.get_sym_table()
        gpu = frame[frame["stream"].ne(-1)]
        if (gpu["dur"] < 0).any():
            pytest.skip("HTA's rounding makes some durations negative here")
        if not gpu["cat"].map(lambda i: symbols[i]).isin(["kernel", "gpu_memcpy", "gpu_memset"]).all():
            pytest.skip("HTA counts CPU events that carry a stream as GPU work here")
        temporal = hta.get_temporal_breakdown(visualize=False).iloc[0]
        overlap = hta.get_comm_comp_overlap(visualize=False).iloc[0]
    finally:
        logging.disable(logging.NOTSET)

    wh = Warehouse(tmp_path / "wh")
    assert wh.ingest([path], job="x").ok
    trace_id = wh.traces()[0]["trace_id"]
    con = wh.connect()
    ours = con.sql(breakdown_sql(HTA_ROUNDED.format(trace_id=trace_id))).pl().row(0, named=True)
    span = ours["span_ns"]
    assert 100 * ours["idle_ns"] / span == pytest.approx(temporal["idle_time_pctg"], abs=0.1)
    assert 100 * ours["compute_ns"] / span == pytest.approx(temporal["compute_time_pctg"], abs=0.1)
    if ours["overlap_pct"] is not None and overlap["comp_comm_overlap_pctg"] == overlap["comp_comm_overlap_pctg"]:
        assert ours["overlap_pct"] == pytest.approx(overlap["comp_comm_overlap_pctg"], abs=0.1)
