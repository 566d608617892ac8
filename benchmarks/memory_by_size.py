"""Benchmark: the peak memory of whole Kineto ingests across trace sizes (issue #26: flat beyond 1 GB).

Run it from the repository root with the dev virtualenv::

    python benchmarks/memory_by_size.py --real <Qwen json.gz> --sizes 1000,2000,4000,8000,16000 --rounds 3
    python benchmarks/memory_by_size.py --traces q1g.json,q8g.json,q16g.json --rounds 3   # traces made already

Each size's trace is made once (``benchmarks/real_shaped.py``: the real capture repeated with shifted times and ids
to the size; 16 GB takes about 8 minutes and as much disk), then ``Warehouse.ingest`` runs on each in a child process
of its own (so each peak RSS belongs to one ingest), round after round, every size once a round: a slow spell of the
machine falls on all sizes alike. The anchor is the first size's own peak in the same run: printed per size are the
runs' peaks, their median, and the median's difference from the first size's; and the time and MB/s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from ingest_kineto import MB, Figures, make_real_shaped, measure_tracelake, warm_page_cache, work_folder

MIB = 1 << 20


def make_traces(sizes: list[float], source: Path, workdir: Path) -> list[Path]:
    """A real-shaped trace of each size (MB) in ``workdir``."""
    traces = []
    for size in sizes:
        trace = workdir / f"real-{size:g}mb.json"
        make_real_shaped(trace, size, source, workdir / f"real-{size:g}mb.facts.json")
        print(f"made {trace} ({trace.stat().st_size / MB:,.0f} MB)", flush=True)
        traces.append(trace)
    return traces


def measure(traces: list[Path], rounds: int, workdir: Path, timeout: float) -> list[Figures]:
    """``rounds`` ingests of each trace, every trace once a round."""
    figures = [Figures(trace.name) for trace in traces]
    for run in range(1, rounds + 1):
        for trace, fig in zip(traces, figures, strict=True):
            warm_page_cache(trace)
            measure_tracelake(fig, trace, workdir, timeout)
            print(f"round {run}: {trace.name} {fig.seconds[-1]:.2f} s, peak {fig.peak_rss_bytes[-1] / MIB:.0f} MiB",
                  flush=True)
    return figures


def report(traces: list[Path], figures: list[Figures]) -> list[dict[str, object]]:
    """Print the table; return its rows."""
    anchor = statistics.median(figures[0].peak_rss_bytes) / MIB
    rows = []
    print(f"\n{'trace':<24} {'GB':>6} {'peaks MiB':<20} {'median':>7} {'vs first':>9} {'seconds':>8} {'MB/s':>6}")
    for trace, fig in zip(traces, figures, strict=True):
        size = trace.stat().st_size
        peaks = sorted(round(rss / MIB) for rss in fig.peak_rss_bytes)
        median = statistics.median(fig.peak_rss_bytes) / MIB
        seconds = statistics.median(fig.seconds)
        row = {"trace": trace.name, "bytes": size, "peaks_mib": peaks, "median_mib": round(median, 1),
               "over_first_mib": round(median - anchor, 1), "over_first_pct": round(100 * (median / anchor - 1), 1),
               "seconds": fig.seconds, "mb_per_s": round(size / MB / seconds, 1)}
        rows.append(row)
        print(f"{trace.name:<24} {size / 1e9:>6.2f} {','.join(map(str, peaks)):<20} {median:>7.0f} "
              f"{row['over_first_pct']:>+8.1f}% {seconds:>8.2f} {row['mb_per_s']:>6}")
    largest = max(rows[1:], key=lambda row: float(row["median_mib"]), default=None)  # type: ignore[arg-type]
    if largest is not None:
        print(f"\nlargest median beyond the first size: {largest['trace']}, {largest['over_first_mib']:+} MiB "
              f"({largest['over_first_pct']:+}%) over {figures[0].tool}'s {anchor:.0f} MiB")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    given = parser.add_mutually_exclusive_group(required=True)
    given.add_argument("--real", type=Path, metavar="TRACE", help="the real capture the traces are made from")
    given.add_argument("--traces", help="traces made already, smallest first, comma-separated")
    parser.add_argument("--sizes", default="1000,8000,16000", help="sizes in MB with --real (default 1000,8000,16000)")
    parser.add_argument("--rounds", type=int, default=3, help="ingests of each trace, a round at a time (default 3)")
    parser.add_argument("--workdir", type=Path, help="where the traces and warehouses go (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the traces made")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per child run (default 3600)")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)

    with work_folder(args.workdir, "tracelake-sizes-", args.keep) as workdir:
        if args.real:
            traces = make_traces([float(size) for size in args.sizes.split(",")], args.real, workdir)
        else:
            traces = [Path(path) for path in args.traces.split(",")]
        rows = report(traces, measure(traces, args.rounds, workdir, args.timeout))
        if args.json:
            args.json.write_text(json.dumps({"rounds": args.rounds, "sizes": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
