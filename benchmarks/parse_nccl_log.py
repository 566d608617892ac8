"""Benchmark: parsing a large NCCL debug log, tracelake vs scanning it with grep.

Run it from the repository root with the dev virtualenv::

    python benchmarks/parse_nccl_log.py                # ~200 MB log, best of 3 runs
    python benchmarks/parse_nccl_log.py --size-mb 600 --runs 1   # peak RSS should match 200 MB's
    python benchmarks/parse_nccl_log.py --engines auto,polars    # the native scanner beside the polars path

What it measures: the sample log of ``sample_traces/generate_nccl.py`` (4 ranks on 2
nodes, inits, transports, COLL lines, a WARN) is grown to about ``--size-mb`` MB by
repeating its COLL lines with increasing opCounts, with a line of application noise
between them, as long jobs write. Then, each in its own child process:

* tracelake ingests it end to end (``Warehouse.ingest``: parse, tables, register);
* the anchor is ``grep -c "NCCL INFO"`` over the same file: the speed of just reading
  and scanning the text once, a floor no parser can beat.

With ``--engines auto,polars``, tracelake runs once per engine in each round
(``TRACELAKE_NCCL_LOG_ENGINE``: ``auto`` takes the native COLL line scanner where it is
built, ``polars`` forces the fallback path), so the two are measured side by side under
the same load.

They alternate ``--runs`` times and the fastest run of each is kept; tracelake's
CPU seconds (user + system, all threads) are shown too, which a busy machine inflates
less than the wall time. The parser scans chunks of the log on the ingest's threads
(``TRACELAKE_THREADS``, default 2), so its CPU seconds exceed its wall time where the
cores are free. Read the ratio: the machines are shared and noisy. Nothing is asserted.

Peak RSS is the child's whole process (the libraries it imports included). The parser
writes COLL rows out in parts as it reads (lz4-compressed Arrow files in the staging
directory, a few bytes a row) and holds only the small facts they are joined with, so
peak RSS should stay about the same as ``--size-mb`` grows.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ingest_kineto import MB, run_child  # noqa: E402  (benchmarks/ is not a package)

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


CHILD = """
import json, resource, sys, time
from tracelake.warehouse import Warehouse
trace, home, out = sys.argv[1:4]
wh = Warehouse(home=home)
def cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
started, started_cpu = time.perf_counter(), cpu()
report = wh.ingest([trace], job="bench")
seconds, cpu_seconds = time.perf_counter() - started, cpu() - started_cpu
res = report.results[0]
if res.status != "ingested" or res.rows.get("collectives", 0) <= 0:
    sys.exit(f"tracelake ingest went wrong: status={res.status!r} rows={res.rows} error={res.error!r}")
json.dump({"seconds": seconds, "cpu_seconds": cpu_seconds, "rows": res.rows}, open(out, "w"))
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=200, help="log size (default 200)")
    parser.add_argument("--workdir", type=Path, help="where the log and warehouse go (default: a temp dir)")
    parser.add_argument("--runs", type=int, default=3, help="runs of each, the fastest kept (default 3)")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    parser.add_argument("--engines", default="auto",
                        help="TRACELAKE_NCCL_LOG_ENGINE values to run in turn, comma-separated (default: auto)")
    args = parser.parse_args(argv)
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tracelake-bench-nccl-"))
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "train.log"
    colls = write_log(log, args.size_mb)
    size = log.stat().st_size
    print(f"log: {log} ({size / MB:,.1f} MB, {colls:,} COLL lines)", flush=True)

    best: dict[str, dict[str, Any]] = {}
    grep_seconds = float("inf")
    for run in range(args.runs):
        for engine in engines:
            home = workdir / f"warehouse-{run}"
            shutil.rmtree(home, ignore_errors=True)  # each run ingests into an empty warehouse
            os.environ["TRACELAKE_NCCL_LOG_ENGINE"] = engine  # the child inherits it
            out, rss = run_child(sys.executable, CHILD, [log, home], workdir, 3600)
            shutil.rmtree(home, ignore_errors=True)
            if engine not in best or out["seconds"] < best[engine]["seconds"]:
                best[engine] = {**out, "peak_rss_bytes": rss}
        started = time.perf_counter()
        subprocess.run(["grep", "-c", "NCCL INFO", str(log)], check=True, capture_output=True)
        grep_seconds = min(grep_seconds, time.perf_counter() - started)
    figures: dict[str, dict[str, Any]] = {}
    for engine, fig in best.items():
        name = "tracelake" if engines == ["auto"] else f"tracelake {engine}"
        figures[name] = {"seconds": fig["seconds"], "mb_per_s": size / MB / fig["seconds"],
                         "cpu_seconds": fig["cpu_seconds"], "peak_rss_bytes": fig["peak_rss_bytes"]}
    figures["grep -c"] = {"seconds": grep_seconds, "mb_per_s": size / MB / grep_seconds}
    print(f"\n{'':<18} {'seconds':>8} {'MB/s':>8} {'CPU s':>8} {'peak RSS MB':>12}  (best of {args.runs})")
    for name, fig in figures.items():
        cpu_text = f"{fig['cpu_seconds']:>8.2f}" if "cpu_seconds" in fig else f"{'':>8}"
        rss_text = f"{fig['peak_rss_bytes'] / MB:>12,.0f}" if "peak_rss_bytes" in fig else f"{'':>12}"
        print(f"{name:<18} {fig['seconds']:>8.2f} {fig['mb_per_s']:>8.1f} {cpu_text} {rss_text}")
    for engine, fig in best.items():
        print(f"\ntracelake ({engine}) ingests the log at {size / MB / fig['seconds']:.0f} MB/s "
              f"({size / MB / fig['cpu_seconds']:.0f} MB per CPU second), "
              f"{grep_seconds / fig['seconds']:.2f}x grep's single scan")
    first, *others = best
    for other in others:
        print(f"{first} against {other}: {best[other]['seconds'] / best[first]['seconds']:.2f}x the speed, "
              f"{best[other]['cpu_seconds'] / best[first]['cpu_seconds']:.2f}x less CPU")
    if args.json:
        args.json.write_text(json.dumps({"log_bytes": size, "coll_lines": colls, "figures": figures}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
