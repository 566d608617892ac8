"""Benchmark: ingest of one large PyTorch profiler (Kineto) trace, tracelake vs HTA.

Run it from the repository root with the dev virtualenv::

    python benchmarks/ingest_kineto.py                   # 500 MB trace, one run each
    python benchmarks/ingest_kineto.py --size-mb 50 --gzip --runs 3 --json out.json

What it measures: the project's generator writes one rank of the ``ddp_straggler``
scenario (about ``--size-mb`` MB of uncompressed JSON) once. Then, in separate child
processes, so that each peak RSS belongs to one tool only:

* tracelake: ``Warehouse(home=<fresh dir>).ingest([trace], job="bench")``, checked
  (status "ingested", device_ops rows > 0);
* HTA 0.5.0: ``TraceAnalysis(trace_dir=<dir holding only the trace>)``, run with the
  Python of a separate virtualenv, made once and cached in ``benchmarks/.venv-hta``.

Seconds are timed inside the child around that one call (no interpreter start or
imports; what tracelake loads on first use, polars and the analyses, is in the call); a
line after the table gives each tool's whole child process as well; peak RSS comes from
``os.wait4`` on the child (its ``ru_maxrss``). The trace
is generated in a child process as well: on Linux a child's ``ru_maxrss`` starts from
its parent's at the fork, and the generator's memory grows with the trace (the parent
held 700 MB after writing 4 GB), so generating in the parent put a floor under every
figure.
Throughput is in MB (10**6 bytes) of uncompressed JSON per second, and in trace
events per second (tracelake's ``traces.event_count``, used for both tools). The
machines are shared and noisy: compare the ratios, not the absolute times. With
``--runs N`` the tools alternate, and the table shows each tool's fastest run and
largest peak RSS; against ``--old``, the ratio of the fastest runs, of the medians and of each
pair of runs (made at about the same time) is printed. If HTA cannot be installed or fails, its error is printed and the
benchmark still exits 0 with tracelake's figures.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
HTA_VENV = HERE / ".venv-hta"
HTA_REQUIREMENTS = ["HolisticTraceAnalysis==0.5.0", "pandas<3"]  # HTA 0.5.0 breaks on pandas 3
MB = 1e6
DEFAULT_REAL_SOURCE = HERE.parent / "sample_traces" / "gpu_h200" / "train" / "train.pt.trace.json.gz"

# Child programs: argv = [inputs..., result.json]; each writes its figures there as JSON.
TRACELAKE_CHILD = """
import json, resource, sys, time
from tracelake.warehouse import Warehouse
trace, home, out = sys.argv[1:4]
wh = Warehouse(home=home)
base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
started = time.perf_counter()
report = wh.ingest([trace], job="bench")
seconds = time.perf_counter() - started
res = report.results[0]
if res.status != "ingested" or res.rows.get("device_ops", 0) <= 0:
    sys.exit(f"tracelake ingest went wrong: status={res.status!r} rows={res.rows} error={res.error!r}")
events = wh.query("select sum(event_count) from traces").rows[0][0]
json.dump({"seconds": seconds, "events": int(events), "base_rss_bytes": base_rss, "rows": res.rows,
           "warnings": res.warnings,
           "settings": {k: str(v) for k, v in vars(wh.settings).items()}}, open(out, "w"))
"""
#: The same child with the CPU time of the call (all threads; on a shared machine it moves less with the load than
#: the wall time does) and the ingest's warnings: for benchmarks/ingest_xla.py and benchmarks/ingest_memory.py.
CPU_TRACELAKE_CHILD = """
import json, resource, sys, time
from tracelake.warehouse import Warehouse
trace, home, out = sys.argv[1:4]
wh = Warehouse(home=home)
base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
started, cpu_started = time.perf_counter(), time.process_time()
report = wh.ingest([trace], job="bench")
seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
res = report.results[0]
if res.status != "ingested" or res.rows.get("device_ops", 0) <= 0:
    sys.exit(f"tracelake ingest went wrong: status={res.status!r} rows={res.rows} error={res.error!r}")
json.dump({"seconds": seconds, "cpu_seconds": cpu_seconds, "base_rss_bytes": base_rss, "rows": res.rows,
           "warnings": res.warnings}, open(out, "w"))
"""
HTA_CHILD = """
import json, resource, sys, time
from hta.trace_analysis import TraceAnalysis
trace_dir, out = sys.argv[1:3]
base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
started = time.perf_counter()
analysis = TraceAnalysis(trace_dir=trace_dir)
seconds = time.perf_counter() - started
rows = {str(rank): len(df) for rank, df in analysis.t.traces.items()}
json.dump({"seconds": seconds, "base_rss_bytes": base_rss, "rows": rows}, open(out, "w"))
"""

GENERATE_CHILD = """
import dataclasses, json, sys
sys.path.insert(0, sys.argv[1])
from ingest_kineto import layers_for_steps
from tracelake.sample_traces.generate import SCENARIOS, write_trace
trace, target_bytes, steps, layers, out = sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
scenario = SCENARIOS["ddp_straggler"]
scenario = dataclasses.replace(scenario, layers=layers or layers_for_steps(scenario, target_bytes, steps))
written = write_trace(trace, scenario, 0, target_bytes=int(target_bytes))
json.dump({"written": written, "layers": scenario.layers}, open(out, "w"))
"""
REAL_SHAPED_CHILD = """
import gzip, json, os, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from real_shaped import write_real_shaped
trace, target_bytes, source, out = Path(sys.argv[2]), float(sys.argv[3]), Path(sys.argv[4]), sys.argv[5]
trace.parent.mkdir(parents=True, exist_ok=True)
plain = trace.with_suffix("") if trace.suffix == ".gz" else trace
facts = write_real_shaped(plain, int(target_bytes), source)
if plain != trace:
    with open(plain, "rb") as src, gzip.open(trace, "wb", compresslevel=6) as dst:
        while block := src.read(8 << 20):
            dst.write(block)
    plain.unlink()
facts["file_bytes"] = os.path.getsize(trace)
json.dump({"written": facts, "layers": None}, open(out, "w"))
"""


@dataclass
class Figures:
    """One tool's result, either measured or failed (``error`` set)."""

    tool: str
    seconds: list[float] = field(default_factory=list)  # one per run
    peak_rss_bytes: list[int] = field(default_factory=list)
    events: int = 0
    #: Each run's whole child process (interpreter, imports, the call): what loads lazily counts in the call's time.
    process_seconds: list[float] = field(default_factory=list)
    detail: dict[str, Any] = field(default_factory=dict)  # what the child reported last
    error: str | None = None

    @property
    def best_seconds(self) -> float:
        return min(self.seconds)

    @property
    def median_seconds(self) -> float:
        return statistics.median(self.seconds)

    @property
    def peak_rss(self) -> int:
        return max(self.peak_rss_bytes)


def run_child(python: str, code: str, inputs: list[Path], workdir: Path, timeout: float,
              env: dict[str, str] | None = None) -> tuple[dict[str, Any], int]:
    """Run ``code`` in a new process (with ``env``, else this one's); return its JSON result and its peak RSS in
    bytes.

    The child may write bytecode (``PYTHONDONTWRITEBYTECODE`` is dropped from its environment): an installed package
    has its modules compiled at install, and a checkout has them compiled by its first import, except where that
    variable forbids it (as some sandboxes set it). There every child compiled the checkout's modules again, 0.2 s
    of its imports, which a build installed with pip (``--old``) and a user's install do not pay. With ``--runs``
    above 1, the fastest run is one that found them compiled."""
    child_env = dict(os.environ if env is None else env)
    child_env.pop("PYTHONDONTWRITEBYTECODE", None)
    result, log = workdir / "result.json", workdir / "child.log"
    result.unlink(missing_ok=True)
    with open(log, "wb") as log_fh:
        proc = subprocess.Popen([python, "-c", code, *map(str, inputs), str(result)],
                                stdout=log_fh, stderr=subprocess.STDOUT, env=child_env)
        deadline = time.monotonic() + timeout
        while True:  # os.wait4 gives this child's own rusage (Popen.wait would not)
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
                os.wait4(proc.pid, 0)
                raise RuntimeError(f"no result after {timeout:.0f} s (killed); log: {log}")
            time.sleep(0.05)
    proc.returncode = os.waitstatus_to_exitcode(status)  # keep Popen from waiting again
    if proc.returncode != 0 or not result.exists():
        tail = log.read_text(errors="replace")[-3000:]
        how = f"was killed by {signal.Signals(-proc.returncode).name}" if proc.returncode < 0 else \
            f"exited with {proc.returncode}"
        raise RuntimeError(f"child {how}:\n{tail}")
    return json.loads(result.read_text()), usage.ru_maxrss * 1024  # ru_maxrss is KiB on Linux


def cached_venv(venv: Path, requirements: list[str], check_code: str) -> str:
    """The Python of the virtualenv ``venv``, made on first use (``pip install`` of ``requirements``) and kept while
    ``check_code`` runs in it."""
    python = venv / "bin" / "python"
    check = [str(python), "-c", check_code]
    if python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return str(python)
    print(f"creating {venv} and installing {' '.join(requirements)} (once) ...", flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    pip = subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                          *requirements], capture_output=True, text=True)
    if pip.returncode != 0:
        raise RuntimeError(f"pip install failed:\n{pip.stdout[-2000:]}{pip.stderr[-3000:]}")
    subprocess.run(check, check=True)
    return str(python)


def hta_python() -> str:
    """The cached HTA virtualenv's Python, made on first use."""
    return cached_venv(HTA_VENV, list(HTA_REQUIREMENTS),
                       "import hta.trace_analysis, pandas; assert int(pandas.__version__[0]) < 3")


def make_real_shaped(trace: Path, size_mb: float, source: Path, facts: Path) -> None:
    """``trace``: the real capture ``source`` repeated to ``size_mb`` MB (``real_shaped.py``, in a child process);
    what was written goes to ``facts`` as JSON."""
    subprocess.run([sys.executable, "-c", REAL_SHAPED_CHILD, str(HERE), str(trace), str(size_mb * MB), str(source),
                    str(facts)], check=True)


@contextmanager
def work_folder(parent: Path | None, prefix: str, keep: bool) -> Iterator[Path]:
    """A fresh folder under ``parent`` (made if missing; None: the system's temporary folder), removed after unless
    ``keep``."""
    if parent:
        parent.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    try:
        yield folder
    finally:
        if keep:
            print(f"kept {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)


def warm_page_cache(path: Path) -> None:
    """Read the trace once before a run, so that each tool reads it from memory.

    Some machines reclaim cold page cache in the background (DAMON's kdamond here), so
    "just written" is no guarantee: a run that finds the file evicted reads the disk.
    """
    with open(path, "rb", buffering=0) as f:
        block = bytearray(8 << 20)
        while f.readinto(block):
            pass


def build_env(tree: Path | None) -> dict[str, str] | None:
    """A child's environment that imports the build installed in ``tree`` (``--old``); None: this checkout's."""
    return {**os.environ, "PYTHONPATH": str(tree.resolve())} if tree else None


def measure_tracelake(fig: Figures, trace: Path, workdir: Path, timeout: float, tree: Path | None = None) -> None:
    """One tracelake ingest of ``trace``: of this checkout, or of the build installed in ``tree`` (``--old``)."""
    home = workdir / "warehouse"
    home.mkdir()
    env = build_env(tree)
    started = time.perf_counter()
    try:
        out, rss = run_child(sys.executable, TRACELAKE_CHILD, [trace, home], workdir, timeout, env)
    except RuntimeError as exc:
        raise SystemExit(f"tracelake FAILED: {exc}") from None
    finally:
        shutil.rmtree(home, ignore_errors=True)
    fig.process_seconds.append(time.perf_counter() - started)
    fig.seconds.append(out.pop("seconds"))
    fig.peak_rss_bytes.append(rss)
    fig.events = out.pop("events")
    fig.detail = out


def measure_hta(fig: Figures, trace_dir: Path, workdir: Path, timeout: float) -> None:
    if fig.error:
        return
    try:
        python = hta_python()
        out, rss = run_child(python, HTA_CHILD, [trace_dir], workdir, timeout)
    except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
        fig.error = str(exc)
        print(f"HTA FAILED, continuing with tracelake only: {exc}", flush=True)
        return
    fig.seconds.append(out.pop("seconds"))
    fig.peak_rss_bytes.append(rss)
    fig.detail = out


def report(figs: list[Figures], trace_bytes: int, events: int) -> dict[str, Any]:
    """Print the table and the ratio line; return the figures for ``--json``."""
    rows: dict[str, Any] = {}
    print(f"\n{'tool':<10} {'seconds':>9} {'MB/s':>8} {'events/s':>11} {'peak RSS MB':>12} {'RSS/trace':>10}")
    for fig in figs:
        if fig.error or not fig.seconds:
            last = [line for line in (fig.error or "skipped").splitlines() if line.strip()][-1]
            print(f"{fig.tool:<10} did not run: {last}")
            rows[fig.tool] = {"error": fig.error or "skipped"}
            continue
        s, rss = fig.best_seconds, fig.peak_rss
        row = {"seconds": s, "mb_per_s": trace_bytes / MB / s, "events_per_s": events / s,
               "peak_rss_mb": rss / MB, "rss_over_trace": rss / trace_bytes,
               "runs_seconds": fig.seconds, "runs_process_seconds": fig.process_seconds,
               "runs_peak_rss_bytes": fig.peak_rss_bytes, "child": fig.detail}
        rows[fig.tool] = row
        print(f"{fig.tool:<10} {s:>9.2f} {row['mb_per_s']:>8.1f} {row['events_per_s']:>11,.0f} "
              f"{row['peak_rss_mb']:>12,.0f} {row['rss_over_trace']:>10.2f}")
    tl = figs[0]
    hta = next((f for f in figs if f.tool == "HTA"), None)
    before = next((f for f in figs if f.tool == "before"), None)
    if before is not None and before.seconds:
        # Runs alternate, so each pair ran at about the same time: its ratio is the one a drifting machine moves least.
        pairs = [a / b for a, b in zip(tl.seconds, before.seconds, strict=False)]
        print(f"\nthis checkout takes {tl.best_seconds / before.best_seconds:.2f}x the time of the build before "
              f"(--old), fastest runs; {tl.median_seconds / before.median_seconds:.2f}x the median; run by run "
              f"{', '.join(f'{r:.2f}x' for r in pairs)}; peak RSS {tl.peak_rss / MB:,.0f} MB vs "
              f"{before.peak_rss / MB:,.0f} MB")
        rows["against_before"] = {"time": tl.best_seconds / before.best_seconds,
                                  "median_time": tl.median_seconds / before.median_seconds, "pairs": pairs,
                                  "peak_rss": tl.peak_rss / before.peak_rss}
    if hta is not None and hta.seconds and not hta.error:
        ratio = hta.best_seconds / tl.best_seconds
        print(f"\ntracelake is {ratio:.1f}x HTA's throughput, "
              f"peak RSS {tl.peak_rss / MB:,.0f} MB vs {hta.peak_rss / MB:,.0f} MB")
        rows["ratio"] = {"throughput": ratio, "peak_rss": tl.peak_rss / hta.peak_rss}
    else:
        print("\nHTA did not run: no ratio (tracelake figures only)")
    base = [f"{f.tool} {int(f.detail['base_rss_bytes']) / MB:,.0f} MB" for f in figs if "base_rss_bytes" in f.detail]
    print(f"(RSS before the timed call, i.e. interpreter + imports: {', '.join(base)})")
    whole = [f"{f.tool} {min(f.process_seconds):.2f} s" for f in figs if f.process_seconds]
    print(f"(whole child process, the fastest run, interpreter and imports included: {', '.join(whole)})")
    return rows


def tracelake_source_id(*packages: str) -> str:
    """A hash of the tracelake sources measured (the tree has no fixed commit to quote).

    ``packages`` are subpackages of ``tracelake`` (default: ``ingest`` and ``warehouse``).
    """
    import importlib

    digest = hashlib.sha256()
    for name in packages or ("ingest", "warehouse"):
        package = importlib.import_module(f"tracelake.{name}")
        for path in sorted(Path(package.__path__[0]).glob("*.py")):
            digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()[:12]


def layers_for_steps(scenario: Any, target_bytes: float, steps: int) -> int:
    """The layer count giving about ``steps`` steps in ``target_bytes``, from a small calibration trace."""
    from tracelake.sample_traces.generate import write_trace

    with tempfile.TemporaryDirectory() as tmp:
        probe = write_trace(Path(tmp) / "probe.json", scenario, 0)
    bytes_per_layer_step = probe["bytes"] / probe["steps"] / scenario.layers
    return max(scenario.layers, round(target_bytes / steps / bytes_per_layer_step))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=500, help="uncompressed trace size (default 500)")
    parser.add_argument("--gzip", action="store_true", help="write the trace as .json.gz")
    parser.add_argument("--workdir", type=Path, help="where the trace and warehouses go (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the trace and work files")
    parser.add_argument("--skip-hta", action="store_true", help="measure tracelake only")
    parser.add_argument("--runs", type=int, default=1, help="runs per tool, alternating (default 1)")
    parser.add_argument("--steps", type=int, default=20,
                        help="about how many training steps the trace holds (default 20, like a real capture "
                        "of a few steps); sets --layers. HTA's parse time grows with steps x events")
    parser.add_argument("--layers", type=int, help="compute kernels per step, instead of --steps "
                        "(the scenario's own 16 gives ~10 steps per MB)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per child run (default 3600)")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    parser.add_argument("--real", nargs="?", type=Path, const=DEFAULT_REAL_SOURCE, metavar="TRACE",
                        help="a real-shaped trace instead: this real capture (default: the H200 GPT of "
                        "sample_traces/gpu_h200/train) repeated with shifted times and ids to --size-mb "
                        "(benchmarks/real_shaped.py); --steps and --layers do not apply")
    parser.add_argument("--old", type=Path, metavar="TREE",
                        help="also ingest with another build of tracelake, alternating with this checkout's: a "
                        "folder it was installed into (pip install --no-deps --target TREE <its checkout>)")
    args = parser.parse_args(argv)

    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="tracelake-bench-", dir=args.workdir))
    try:
        trace_dir = workdir / "trace"  # HTA takes a directory: this one holds only the trace
        stem = f"real-{args.real.name.split('.')[0]}" if args.real else "ddp_straggler"
        trace = trace_dir / f"{stem}-rank0.json{'.gz' if args.gzip else ''}"
        started, source_id = time.perf_counter(), tracelake_source_id()
        generated = workdir / "generated.json"
        if args.real:
            make_real_shaped(trace, args.size_mb, args.real, generated)
        else:
            subprocess.run([sys.executable, "-c", GENERATE_CHILD, str(HERE), str(trace), str(args.size_mb * MB),
                            str(args.steps), str(args.layers or 0), str(generated)], check=True)
        made = json.loads(generated.read_text())
        written, layers = made["written"], made["layers"]
        trace_bytes = int(written["bytes"])
        print(f"trace: {trace} ({trace_bytes / MB:,.1f} MB JSON, {written['file_bytes'] / MB:,.1f} MB on disk, "
              f"{written['events']:,} events, {written['steps']} steps; written in "
              f"{time.perf_counter() - started:.1f} s); tracelake sources {source_id}", flush=True)
        figs = [Figures("tracelake"), Figures("HTA", error="skipped (--skip-hta)" if args.skip_hta else None)]
        before = Figures("before") if args.old else None
        for run in range(1, args.runs + 1):
            warm_page_cache(trace)
            measure_tracelake(figs[0], trace, workdir, args.timeout)
            print(f"run {run}: tracelake {figs[0].seconds[-1]:.2f} s", flush=True)
            if before is not None:
                warm_page_cache(trace)
                measure_tracelake(before, trace, workdir, args.timeout, args.old)
                print(f"run {run}: before (--old) {before.seconds[-1]:.2f} s", flush=True)
            if not figs[1].error:
                warm_page_cache(trace)
            measure_hta(figs[1], trace_dir, workdir, args.timeout)
            if not figs[1].error:
                print(f"run {run}: HTA {figs[1].seconds[-1]:.2f} s", flush=True)
        shown = (figs if not args.skip_hta else figs[:1]) + ([before] if before is not None else [])
        rows = report(shown, trace_bytes, figs[0].events)
        if args.json:
            meta = {"size_mb": args.size_mb, "gzip": args.gzip, "runs": args.runs, "layers": layers, "real": str(args.real) if args.real else None,
                    "trace_bytes": trace_bytes, "file_bytes": written["file_bytes"], "generator": written,
                    "tracelake_sources": source_id, "python": sys.version, "cpus": os.cpu_count(),
                    "hta_requirements": HTA_REQUIREMENTS}
            args.json.write_text(json.dumps({"meta": meta, "tools": rows}, indent=2, default=str) + "\n")
    finally:
        if args.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
