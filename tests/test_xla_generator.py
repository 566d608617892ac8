"""The XLA generator's TPU files (sample_traces/generate_xla.py) against what real profiles show."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from support import real_xplanes
from tracelake.ingest.xspace import Space


def op_line_disorder(path: Path) -> dict[str, tuple[int, int, int]]:
    """Per TPU ``XLA Ops`` line: its events, how many start before the one before them in the file, and how many
    start before the one before them ends."""
    found: dict[str, tuple[int, int, int]] = {}
    with Space(path, path.name) as space:
        for plane in space.planes:
            if not re.match(r"^/device:TPU:\d+$", plane.name):
                continue
            for line in space.lines(plane):
                if line.name == "XLA Ops":
                    starts = np.array([e.offset_ps for e in line.events], dtype=np.int64)
                    ends = starts + np.array([e.duration_ps for e in line.events], dtype=np.int64)
                    found[plane.name] = (len(starts), int((starts[1:] < starts[:-1]).sum()),
                                         int((starts[1:] < ends[:-1]).sum()))
    return found


def test_generated_tpu_op_lines_are_in_time_order_as_real_ones_are(tmp_path: Path) -> None:
    """The benchmarks' TPU files run a step's short ops one after another: in time order, as the real ``XLA Ops``
    lines at hand are (where present), and never overlapping (a real line's overlaps are ops of no length at
    another's start)."""
    from tracelake.sample_traces import generate_xla

    path = tmp_path / "big.xplane.pb"
    path.write_bytes(generate_xla.build(3, 2_000))
    lines = op_line_disorder(path)
    assert len(lines) == generate_xla.CHIPS
    assert set(lines.values()) == {(3 * (2_000 + len(generate_xla.OPS)), 0, 0)}
    for real in real_xplanes():
        assert all(backwards == 0 for _, backwards, _ in op_line_disorder(real).values()), real.name
