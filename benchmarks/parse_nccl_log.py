"""Benchmark: parsing a large NCCL debug log, tracelake vs scanning it with grep.

Run it from the repository root with the dev virtualenv::

    python benchmarks/parse_nccl_log.py                # ~200 MB log
    python benchmarks/parse_nccl_log.py --size-mb 1000

What it measures: the sample log of ``sample_traces/generate_nccl.py`` (4 ranks on 2
nodes, inits, transports, COLL lines, a WARN) is grown to about ``--size-mb`` MB by
repeating its COLL lines with increasing opCounts, with a line of application noise
between them, as long jobs write. Then, each in its own child process:

* tracelake ingests it end to end (``Warehouse.ingest``: parse, tables, register);
* the anchor is ``grep -c "NCCL INFO"`` over the same file: the speed of just reading
  and scanning the text once, a floor no parser can beat.

Read the ratio: the machines are shared and noisy. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ingest_kineto import MB, TRACELAKE_CHILD, run_child  # noqa: E402  (benchmarks/ is not a package)

from tracelake.sample_traces import generate_nccl  # noqa: E402


def write_log(path: Path, size_mb: float) -> int:
    """Write the grown log; return the number of COLL lines."""
    base = generate_nccl.debug_log().splitlines()
    head = [line for line in base if "opCount" not in line]
    colls = [line for line in base if "opCount" in line]
    written = 0
    lines = 0
    with open(path, "w", encoding="utf-8") as out:
        out.write("\n".join(head) + "\n")
        op = 0
        while written < size_mb * MB:
            block = []
            for line in colls[:4]:  # one opCount on 4 ranks
                block.append(line.replace("opCount 0 ", f"opCount {op:x} "))
                block.append(f"step {op} loss {2.0 + (op % 7) / 10:.2f} lr 3.0e-4")
            text = "\n".join(block) + "\n"
            out.write(text)
            written += len(text)
            lines += 4
            op += 1
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=200, help="log size (default 200)")
    parser.add_argument("--workdir", type=Path, help="where the log and warehouse go (default: a temp dir)")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tracelake-bench-nccl-"))
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "train.log"
    colls = write_log(log, args.size_mb)
    size = log.stat().st_size
    print(f"log: {log} ({size / MB:,.1f} MB, {colls:,} COLL lines)", flush=True)

    child = TRACELAKE_CHILD.replace('res.rows.get("device_ops", 0)', 'res.rows.get("collectives", 0)')
    out, rss = run_child(sys.executable, child, [log, workdir / "warehouse"], workdir, 3600)
    started = time.perf_counter()
    subprocess.run(["grep", "-c", "NCCL INFO", str(log)], check=True, capture_output=True)
    grep_seconds = time.perf_counter() - started
    figures = {
        "tracelake": {"seconds": out["seconds"], "mb_per_s": size / MB / out["seconds"], "peak_rss_bytes": rss},
        "grep -c": {"seconds": grep_seconds, "mb_per_s": size / MB / grep_seconds},
    }
    print(f"\n{'':<12} {'seconds':>8} {'MB/s':>8} {'peak RSS MB':>12}")
    for name, fig in figures.items():
        rss_text = f"{fig['peak_rss_bytes'] / MB:>12,.0f}" if "peak_rss_bytes" in fig else f"{'':>12}"
        print(f"{name:<12} {fig['seconds']:>8.2f} {fig['mb_per_s']:>8.1f} {rss_text}")
    print(f"\ntracelake parses the log at {figures['tracelake']['mb_per_s']:.0f} MB/s, "
          f"{grep_seconds / out['seconds']:.2f}x grep's single scan")
    if args.json:
        args.json.write_text(json.dumps({"log_bytes": size, "coll_lines": colls, "figures": figures}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
