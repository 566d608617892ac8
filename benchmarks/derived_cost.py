"""Benchmark: the stored per-trace analyses (``write_derived``) alone, two trees side by side.

Ingest pays for parsing and for the analyses stored next to the tables (issue #26: XLA ingest must beat XProf's
fastest tool, and parsing alone already matches it). This times the second part only: each given staging folder
(``<table>.parquet`` of ``warehouse.derived.INPUTS``, e.g. from ``ingest.parse_into``) goes through
``write_derived`` in a fresh child process per run, CPU seconds (all threads) and the child's peak RSS over its
imports, alternating the trees round by round so that a busy neighbour weighs on both alike.

```bash
# a copy of the code before a change in /tmp/old (its analysis/ and warehouse/ folders), then:
python benchmarks/derived_cost.py --old /tmp/old --runs 3 /tmp/parsed/tpu30 /tmp/parsed/gpu100
```
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = """
import importlib, json, pkgutil, resource, sys, time
if sys.argv[1]:  # the other tree: its analysis and warehouse folders stand in for the editable install's
    finder = importlib.import_module(next(m.name for m in pkgutil.iter_modules()
                                          if m.name.startswith("__editable___tracelake_") and m.name.endswith("_finder")))
    finder.MAPPING["tracelake.analysis"] = sys.argv[1] + "/analysis"
    finder.MAPPING["tracelake.warehouse"] = sys.argv[1] + "/warehouse"
from pathlib import Path
from tracelake.warehouse.derived import write_derived
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
cpu = time.process_time()
write_derived(Path(sys.argv[2]), Path(sys.argv[3]))
cpu = time.process_time() - cpu
print(json.dumps({"cpu_s": cpu, "rss_mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024}))
"""


def run(tree: str, parsed: Path) -> dict[str, float]:
    """One ``write_derived`` of ``parsed`` in a child with ``tree``'s code ("" for this checkout's)."""
    with tempfile.TemporaryDirectory(prefix="tracelake-derived-") as out:
        done = subprocess.run([sys.executable, "-c", CHILD, tree, str(parsed), out], capture_output=True, text=True,
                              check=True, env={**os.environ, "PYTHONHASHSEED": "0"})
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("parsed", nargs="+", type=Path, help="staging folders holding the parsed tables")
    parser.add_argument("--old", default="", help="a folder holding the other tree's analysis/ and warehouse/")
    parser.add_argument("--runs", type=int, default=3, help="rounds; the fastest run and largest RSS are kept")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    trees = {"new": ""} | ({"old": str(Path(args.old).resolve())} if args.old else {})
    figures = []
    print(f"{'input':24s} " + " ".join(f"{t + ' CPU s':>10s} {t + ' +RSS MB':>10s}" for t in trees) +
          ("   CPU new/old" if args.old else ""))
    for parsed in args.parsed:
        runs: dict[str, list[dict[str, float]]] = {t: [] for t in trees}
        for _ in range(args.runs):
            for name, tree in trees.items():
                runs[name].append(run(tree, parsed))
        best = {t: {"cpu_s": min(r["cpu_s"] for r in rs), "rss_mb": max(r["rss_mb"] for r in rs)}
                for t, rs in runs.items()}
        figures.append({"input": str(parsed), **best})
        line = f"{parsed.name[-24:]:24s} " + " ".join(f"{b['cpu_s']:10.3f} {b['rss_mb']:10.0f}" for b in best.values())
        if args.old:
            line += f"   {best['new']['cpu_s'] / best['old']['cpu_s']:.2f}"
        print(line, flush=True)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
