"""The job report's roofline (api/reports/roofline.py; docs/analyses.md, "Roofline plot").

Truth: on the H200 GPT the plot holds one point per (op, shapes, dtype, kind) with a FLOPs and a bytes estimate, as
DuckDB counts them in the stored ``op_stats``, each at the TFLOP/s and FLOPs/byte DuckDB computes; the roof bends at
the ridge point 989.5 TFLOP/s / 4.8 TB/s of the H200 datasheet. An XLA job, and the CUDA-graph job whose few
operators have no estimate, say why in one line instead of plotting.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support import ROOT, TPU_SAMPLE
from tracelake.api.reports.job import render
from tracelake.api.reports.roofline import roofline_section
from tracelake.warehouse import Warehouse

H200 = ROOT / "sample_traces" / "gpu_h200"
PEAK_TFLOPS, HBM_TBS = 989.5, 4.8  # H200 SXM dense bf16 and HBM3e (NVIDIA datasheet)


def _figure(html: str, name: str) -> list[dict]:
    """The data (traces) of plotly figure ``plot-<name>`` in a page."""
    at = html.index("Plotly.newPlot(", html.index(f'id="plot-{name}"'))
    at = html.index("[", html.index(f'"plot-{name}"', at))
    data, _ = json.JSONDecoder().raw_decode(html, at)
    return data


def _warehouse(home: Path, source: Path, job: str) -> Warehouse:
    wh = Warehouse(home)
    assert all(r.ok for r in wh.ingest([source], job=job).results)
    return wh


def test_the_gpt_operators_sit_under_the_h200_roof(tmp_path: Path) -> None:
    wh = _warehouse(tmp_path, H200 / "train", "train")
    html = render(wh.job_report("train"))
    data = _figure(html, "roofline")
    points = [(x, y) for t in data if t["mode"] == "markers" and t["name"] != "ridge point"
              for x, y in zip(t["x"], t["y"])]
    expected = wh.query(
        "SELECT sum(flops) / sum(bytes), sum(flops) / sum(device_ns) / 1e3 FROM op_stats "
        "WHERE flops > 0 AND bytes > 0 AND device_ns > 0 GROUP BY op, input_shapes, dtype, kind").rows
    assert len(points) == len(expected) > 10
    for (x, y), (ex, ey) in zip(sorted(points), sorted(expected)):
        assert x == pytest.approx(ex, rel=1e-9) and y == pytest.approx(ey, rel=1e-9)
    (roof,) = [t for t in data if t["mode"] == "lines"]
    ridge = PEAK_TFLOPS / HBM_TBS
    assert roof["x"][1] == pytest.approx(ridge) and roof["y"][1] == pytest.approx(PEAK_TFLOPS)
    assert roof["y"][0] == pytest.approx(HBM_TBS * roof["x"][0]) and roof["y"][2] == pytest.approx(PEAK_TFLOPS)
    assert roof["x"][0] <= min(x for x, _ in points) and roof["x"][2] >= max(x for x, _ in points)
    (marked,) = [t for t in data if t["name"] == "ridge point"]
    assert marked["x"] == [pytest.approx(ridge)]
    hovers = {c[0] for t in data if t.get("customdata") for c in t["customdata"]}
    assert {"aten::mm", "aten::addmm"} <= hovers
    # compute-bound matmuls at or under the flat part of the roof
    assert all(y <= PEAK_TFLOPS for _, y in points)


def test_no_flops_says_why_in_one_line(tmp_path: Path) -> None:
    wh = _warehouse(tmp_path / "x", TPU_SAMPLE.parent, "tpu")
    section = roofline_section(wh.job_report("tpu"))
    assert "XLA profiles carry FLOPs per XLA op" in section and "plot-roofline" not in section
    wh = _warehouse(tmp_path / "g", H200 / "graphs", "graphs")
    section = roofline_section(wh.job_report("graphs"))
    assert "No operator has a FLOPs and bytes estimate" in section and "plot-roofline" not in section
