"""Benchmark: ingesting XLA profiles (``.xplane.pb``), tracelake vs XProf's converter and a whole decode.

Run it from the repository root with the dev virtualenv::

    python benchmarks/ingest_xla.py                                  # ~200 MB TPU XSpace
    python benchmarks/ingest_xla.py --device tpu,gpu --size-mb 30,100,300 --json out.json
    python benchmarks/ingest_xla.py --size-mb 0 --xplane ../shared/real_traces/xla/tpu_inference_2.xplane.pb \
        --xplane sample_traces/gpu_h200/jax/            # real files only (a folder: its *.xplane.pb)
    python benchmarks/ingest_xla.py --skip-xprof --size-mb 100       # tracelake and the decode anchor only
    python benchmarks/ingest_xla.py --device tpu,gpu --size-mb 30 --runs 6 --skip-xprof --old /tmp/oldtree
                                     # this checkout against another build (pip install --no-deps --target TREE)

What it measures, on each file: the project's XLA generator (``sample_traces/generate_xla.py``)
writes a TPU profile of 4 chips and 40 training steps, with as many short ops per
step as make about ``--size-mb`` MB (each size in the list in turn, for each ``--device``), one after another
after the step's fixed ops, in time order as a real ``XLA Ops`` line is;
``gpu`` is a JAX-on-GPU profile of 4 GPUs instead (``generate_xla.build_gpu``: kernels on
``Stream #`` lines with their details as per-event stats, the derived ``XLA Ops`` and
``XLA Modules`` lines, a launch call per kernel on the host), as many short kernels
per step as make the size. ``--xplane`` adds real files. Then, each in its own child
process (so each peak RSS belongs to one tool):

* tracelake ingests it end to end (decode, map, write Parquet, per-trace analyses,
  register) into an empty warehouse made beforehand by a child of its own, as every
  ingest but a warehouse's first finds it; and (``--warehouse both``, the default, or
  ``new``) into a warehouse the same child makes first. Making one writes its DuckDB
  catalog; a process without DuckDB loaded has a short-lived child of its own write it
  (``warehouse/catalog_child.py``: parsing an XLA profile needs no DuckDB), so the
  first ingest no longer holds some 40 MB of DuckDB's library at its peak, as it did in
  the builds before 2026-12-07. The ratios to XProf are the first's, the second's are
  printed beside them;
* tracelake only parses it into its Parquet tables (``ingest.parse_into``: the
  streaming XSpace reader, without the per-trace analyses), to tell the two apart;
* the anchor decodes the same file the way tools without a streaming reader do:
  the whole XSpace as one protobuf message (protobuf's C decoder, upb), then walks
  every event once: the floor of that approach (no conversion to tables at all);
* XProf (``pip install xprof``, its C++ converter, in a virtualenv of its own made
  once in ``benchmarks/.venv-xprof``): ``xprof.convert.raw_to_tool_data.xspace_to_tool_data``
  makes one tool's data from the file, each tool in its own child and on its own copy
  (a hard link) of the file in a fresh folder, with ``use_saved_result`` off: XProf
  caches what it derives (``ALL_HOSTS.op_stats_v2.pb``) next to the xplane, and a
  second tool would reuse it. The tools are those XProf lists for the file
  (``xspace_to_tool_names``) less the trace viewer (slowest by far, ~100x the file in
  memory: 3 GB for 30 MB; ``--xprof-tools all`` adds it) and the two that show one HLO
  module named in their options (``memory_viewer``, ``graph_viewer``). Reported: every
  tool, the fastest, and the fastest of the tools that convert every op (all but
  ``memory_profile``, which reads the file but builds its view from the host's allocator
  events only: on a file without them it has next to nothing to do), each beside
  tracelake's full ingest, as ratios of time, CPU time and peak RSS (below 1: tracelake
  takes less). If XProf cannot be installed or fails, its error is printed and the rest
  still runs (exit code 0).

Each child times its one call (imports and interpreter start excluded) in seconds and in
CPU seconds of the process (all threads): on a shared machine the CPU seconds move less.
What tracelake loads on first use (polars and the stored analyses' modules, 0.13-0.17 s) is
inside its call; the ratio lines also give each whole child process, interpreter and
imports included (XProf's import of its converter takes 0.08 s, tracelake's facade 0.4 s).
With ``--runs N`` each of tracelake's ingest and XProf's tools runs N times, one after
the other, the fastest run kept (CPU seconds: the least; peak RSS: the largest).

Beside each peak RSS, ``above start``: the peak less the RSS the child had just before its
call (interpreter, imports, and for tracelake the warehouse made), the memory the file
itself cost. The fixed part differs: tracelake's process holds some 85-95 MB before reading a
byte (Python, numpy, Arrow; before 2026-12-07, 140 MB where it had just made a new warehouse), XProf's
some 40 MB, and polars' library and runtime add some 40 MB more once the stored analyses start;
at 30 MB that difference is much of tracelake's figure, at 300 MB little of it.

The trace is generated in a child process as well, and the parent never imports
tracelake: on Linux a child's peak RSS (``ru_maxrss``) starts from its parent's (it is
carried over the fork and the exec), so a parent holding the generated trace, or only
tracelake's imports (~90 MB), would raise every figure to its own (it did, before this
was so: XProf's small figures and tracelake's alike).

Read the ratios: the machines are shared and noisy. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ingest_kineto import CPU_TRACELAKE_CHILD as TRACELAKE_CHILD  # noqa: E402
from ingest_kineto import cached_venv  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ingest_kineto import MB, build_env, run_child, warm_page_cache  # noqa: E402  (benchmarks/ is not a package)

HERE = Path(__file__).resolve().parent
XPROF_VENV = HERE / ".venv-xprof"
XPROF_REQUIREMENTS = ["xprof==2.24.2"]
#: Tools left out unless ``--xprof-tools all``: the trace viewer (JSON and its streaming form) holds ~100x the file.
XPROF_SLOW = ("trace_viewer", "trace_viewer@")
#: Tools that show one HLO module, named in their options: left out unless asked for by name.
XPROF_NEEDS_MODULE = ("memory_viewer", "graph_viewer")
#: The one XProf tool that does not convert every op (it reads the host's allocator events only).
XPROF_PARTIAL = ("memory_profile",)

# Child programs: argv = [inputs..., result.json]; each writes its figures there as JSON, with the seconds and the
# CPU seconds (all threads) of the timed call: on a shared machine the CPU seconds vary less.
WHOLE_CHILD = """
import json, resource, sys, time
from tracelake.ingest.xplane_proto import XSpaceWhole
trace, out = sys.argv[1:3]
base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
started, cpu_started = time.perf_counter(), time.process_time()
space = XSpaceWhole.FromString(open(trace, "rb").read())
events = 0
for plane in space.planes:
    for line in plane.lines:
        for event in line.events:
            events += event.duration_ps > 0
seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
json.dump({"seconds": seconds, "cpu_seconds": cpu_seconds, "events": events, "base_rss_bytes": base_rss},
          open(out, "w"))
"""


#: Makes the (empty) warehouse an "existing warehouse" run ingests into, as ``tracelake`` does on its first use.
MAKE_WAREHOUSE_CHILD = """
import sys
from tracelake.warehouse import Warehouse
Warehouse(home=sys.argv[1])
"""
#: The result keys of tracelake's ingest into an existing warehouse (the ratios' own) and into a new one.
INGEST, INGEST_NEW = "tracelake ingest", "tracelake ingest, new warehouse"


GENERATE_CHILD = """
import json, sys
from pathlib import Path
from tracelake.sample_traces import generate_xla
trace, size_mb, device, steps, out = sys.argv[1], float(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5]
build = generate_xla.build_gpu if device == "gpu" else generate_xla.build
per_op = (len(build(steps, 200)) - len(build(steps, 100))) / 100  # file bytes one more short op per step adds
small_ops = max(1, int(size_mb * 1e6 / per_op))
Path(trace).write_bytes(build(steps, small_ops))
fixed = len(generate_xla.OPS) if device == "tpu" else generate_xla.GEMMS + len(generate_xla.GPU_FIXED)
chips = f"{generate_xla.CHIPS} TPU chips" if device == "tpu" else f"{generate_xla.GPUS} GPUs"
json.dump({"what": f"generated {device}, {steps} steps of {small_ops + fixed:,} ops on {chips}"}, open(out, "w"))
"""
PARSE_CHILD = """
import json, resource, sys, tempfile, time
from pathlib import Path
from tracelake import ingest
trace, out = sys.argv[1:3]
base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
started, cpu_started = time.perf_counter(), time.process_time()
with tempfile.TemporaryDirectory(prefix="tracelake-bench-parse-") as staging:
    _, info = ingest.parse_into(Path(trace), Path(staging), ingest.ParseOptions(source_name=Path(trace).name))
seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
json.dump({"seconds": seconds, "cpu_seconds": cpu_seconds, "events": info.event_count, "base_rss_bytes": base_rss},
          open(out, "w"))
"""


XPROF_NAMES_CHILD = """
import json, sys
from xprof.convert import raw_to_tool_data
trace, out = sys.argv[1:3]
json.dump({"tools": raw_to_tool_data.xspace_to_tool_names([trace])}, open(out, "w"))
"""
XPROF_CHILD = """
import json, resource, sys, time
from xprof.convert import raw_to_tool_data
trace, tool, out = sys.argv[1:4]
base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
started, cpu_started = time.perf_counter(), time.process_time()
data, content_type = raw_to_tool_data.xspace_to_tool_data([trace], tool, {"use_saved_result": False})
seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
if data is None:
    sys.exit(f"xprof made no {tool} data")
json.dump({"seconds": seconds, "cpu_seconds": cpu_seconds, "output_bytes": len(data), "base_rss_bytes": base_rss},
          open(out, "w"))
"""


#: Training steps in the generated profile (XProf captures a few seconds: tens of steps, many ops each).
STEPS = 40
#: Generated layouts: TPU (XLA Ops lines) and GPU (Stream lines, per-event stats).
DEVICES = ("tpu", "gpu")


def generate(size_mb: float, workdir: Path, device: str, timeout: float) -> tuple[Path, str]:
    """Write a ``device`` profile of about ``size_mb`` MB into ``workdir``; its path and a line saying what it holds.

    In a child, as everything that imports tracelake: a child's peak RSS starts from its parent's (``ru_maxrss``
    is carried over the fork and exec), so the parent stays small (~20 MB; importing tracelake alone takes ~90 MB)
    and holds no trace.
    """
    trace = workdir / "generated" / "host0.xplane.pb"
    trace.parent.mkdir(parents=True, exist_ok=True)
    out, _ = run_child(sys.executable, GENERATE_CHILD, [trace, Path(str(size_mb)), Path(device), Path(str(STEPS))],
                       workdir, timeout)
    return trace, str(out["what"])


def xprof_python() -> str:
    """The cached XProf virtualenv's Python, made on first use (``pip install xprof``)."""
    return cached_venv(XPROF_VENV, list(XPROF_REQUIREMENTS), "import xprof.convert.raw_to_tool_data")


def _fresh_copy(trace: Path, folder: Path) -> Path:
    """``trace`` alone in an empty ``folder`` (a hard link where it can be): XProf writes its caches beside it."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    copy = folder / (trace.name if trace.name.endswith(".xplane.pb") else "host0.xplane.pb")
    try:
        os.link(trace, copy)
    except OSError:
        shutil.copyfile(trace, copy)
    return copy


def xprof_tools(trace: Path, workdir: Path, timeout: float, wanted: str) -> list[str]:
    """The tools XProf offers for ``trace`` that ``wanted`` (``--xprof-tools``) asks for."""
    python = xprof_python()
    try:
        out, _ = run_child(python, XPROF_NAMES_CHILD, [_fresh_copy(trace, workdir / "xprof")], workdir, timeout)
    finally:
        shutil.rmtree(workdir / "xprof", ignore_errors=True)
    offered = [str(t) for t in out["tools"]]
    if wanted == "all":
        return [t for t in offered if t not in XPROF_NEEDS_MODULE]
    if wanted == "default":
        return [t for t in offered if t not in XPROF_SLOW + XPROF_NEEDS_MODULE]
    asked = [t.strip() for t in wanted.split(",") if t.strip()]
    return [t for t in asked if t in offered] or asked


def _best(figures: list[dict[str, Any]]) -> dict[str, Any]:
    """Runs of one child merged: the fastest run's figures, the largest peak RSS, or the first error."""
    done = [f for f in figures if "error" not in f]
    if not done:
        return figures[0]
    best = dict(min(done, key=lambda f: f["seconds"]))
    best["peak_rss_bytes"] = max(f["peak_rss_bytes"] for f in done)
    best["above_start_bytes"] = max(f["above_start_bytes"] for f in done)
    best["cpu_seconds"] = min(f["cpu_seconds"] for f in done)
    best["process_seconds"] = min(f["process_seconds"] for f in done)
    best["runs_seconds"] = [f["seconds"] for f in done]
    return best


def measure(trace: Path, what: str, workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Every child on one file, ``args.runs`` times for the timed tools; the figures of each and the ratios."""
    size = trace.stat().st_size
    print(f"\ntrace: {trace} ({size / MB:,.1f} MB, {what})", flush=True)
    timeout = args.timeout
    runs: dict[str, list[dict[str, Any]]] = {}
    tools: list[str] = []
    xprof_error = "skipped (--skip-xprof)" if args.skip_xprof else None
    if not args.skip_xprof:
        try:
            tools = xprof_tools(trace, workdir, timeout, args.xprof_tools)
        except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
            xprof_error = str(exc)
            print(f"XProf FAILED, continuing without it: {exc}", flush=True)
    home = workdir / "warehouse"
    kinds = {"existing": [INGEST], "new": [INGEST_NEW], "both": [INGEST, INGEST_NEW]}[args.warehouse]
    builds = [("", None)] + ([(" (--old)", build_env(args.old))] if args.old else [])
    for turn in range(args.runs):
        warm_page_cache(trace)
        for label, env in builds if turn % 2 == 0 else builds[::-1]:  # alternating: a busy neighbour weighs on both
            for key in kinds:
                shutil.rmtree(home, ignore_errors=True)
                try:
                    made = _make_warehouse(home, env, timeout) if key == INGEST else None
                    runs.setdefault(f"{key}{label}", []).append(
                        made or _run(sys.executable, TRACELAKE_CHILD, [trace, home], workdir, timeout, env))
                finally:
                    shutil.rmtree(home, ignore_errors=True)
            if args.old:  # the parse alone too, build against build
                runs.setdefault(f"tracelake parse only{label}", []).append(
                    _run(sys.executable, PARSE_CHILD, [trace], workdir, timeout, env))
        for tool in tools:
            folder = workdir / "xprof"
            try:
                runs.setdefault(f"xprof {tool}", []).append(
                    _run(xprof_python(), XPROF_CHILD, [_fresh_copy(trace, folder), tool], workdir, timeout))
            finally:
                shutil.rmtree(folder, ignore_errors=True)
    results = {name: _best(figs) for name, figs in runs.items()}
    if not args.old:
        results["tracelake parse only"] = _run(sys.executable, PARSE_CHILD, [trace], workdir, timeout)
    results["whole-message decode"] = _run(sys.executable, WHOLE_CHILD, [trace], workdir, timeout)

    print(f"\n{'':<46} {'seconds':>8} {'CPU s':>8} {'MB/s':>8} {'peak RSS MB':>12} {'RSS/trace':>10} "
          f"{'above start MB':>15}")
    for name, fig in results.items():
        if "error" in fig:
            print(f"{name:<46} FAILED: {fig['error'].strip().splitlines()[-1][:160]}")
            continue
        print(f"{name:<46} {fig['seconds']:>8.2f} {fig['cpu_seconds']:>8.2f} {size / MB / fig['seconds']:>8.1f} "
              f"{fig['peak_rss_bytes'] / MB:>12,.0f} {fig['peak_rss_bytes'] / size:>10.2f} "
              f"{fig['above_start_bytes'] / MB:>15,.0f}")
    ratios = _ratios(results)
    if args.old:
        ratios["against_old"] = _against_old(results)
    return {"file": str(trace), "what": what, "trace_bytes": size, "results": results, "ratios": ratios,
            **({"xprof_error": xprof_error} if xprof_error else {})}


def _make_warehouse(home: Path, env: dict[str, str] | None, timeout: float) -> dict[str, Any] | None:
    """Make the empty warehouse at ``home`` that an "existing warehouse" run ingests into; None once made, else the
    run's ``{"error": ...}`` (the others still run)."""
    try:
        subprocess.run([sys.executable, "-c", MAKE_WAREHOUSE_CHILD, str(home)], check=True, env=env, timeout=timeout,
                       capture_output=True, text=True)
    except (subprocess.SubprocessError, OSError) as exc:
        detail = getattr(exc, "stderr", None) or str(exc)
        print(f"making the warehouse failed, continuing: {detail.strip().splitlines()[-1][:300]}", flush=True)
        return {"error": f"making the warehouse failed: {detail}"}
    return None


def _ratios(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """tracelake's full ingest against XProf's fastest tool (and fastest whole-trace tool) and the whole decode."""
    ours = results.get(INGEST) or results[INGEST_NEW]
    ratios: dict[str, Any] = {"warehouse": "existing" if INGEST in results else "new"}
    if "error" in ours:
        return ratios
    xprof = {name[len("xprof "):]: fig for name, fig in results.items()
             if name.startswith("xprof ") and "error" not in fig}
    for key, pool in (("xprof_fastest", xprof),
                      ("xprof_fastest_whole", {t: f for t, f in xprof.items() if t not in XPROF_PARTIAL})):
        if not pool:
            continue
        tool = min(pool, key=lambda t: pool[t]["seconds"])
        fig = pool[tool]
        ratios[key] = {"tool": tool, "seconds": fig["seconds"], "peak_rss_bytes": fig["peak_rss_bytes"],
                       "time_ratio": ours["seconds"] / fig["seconds"],
                       "cpu_ratio": ours["cpu_seconds"] / fig["cpu_seconds"],
                       "rss_ratio": ours["peak_rss_bytes"] / fig["peak_rss_bytes"],
                       "process_ratio": ours["process_seconds"] / fig["process_seconds"],
                       "above_start_ratio": ours["above_start_bytes"] / max(fig["above_start_bytes"], 1)}
        print(f"tracelake's full ingest vs XProf's fastest{' whole-trace' if key.endswith('whole') else ''} tool "
              f"({tool}): {ratios[key]['time_ratio']:.2f}x its time ({ratios[key]['cpu_ratio']:.2f}x its CPU time), "
              f"{ratios[key]['rss_ratio']:.2f}x its peak RSS ({ratios[key]['above_start_ratio']:.2f}x above each "
              f"one's start); whole child processes (interpreter and imports included): {ours['process_seconds']:.2f} "
              f"s against {fig['process_seconds']:.2f} s, {ratios[key]['process_ratio']:.2f}x")
        first = results.get(INGEST_NEW)
        if INGEST in results and first and "error" not in first:
            ratios[key]["new_warehouse"] = {"seconds": first["seconds"], "peak_rss_bytes": first["peak_rss_bytes"],
                                            "time_ratio": first["seconds"] / fig["seconds"],
                                            "rss_ratio": first["peak_rss_bytes"] / fig["peak_rss_bytes"]}
            print(f"  the same, into a new warehouse (its DuckDB catalog made first): "
                  f"{ratios[key]['new_warehouse']['time_ratio']:.2f}x its time, "
                  f"{ratios[key]['new_warehouse']['rss_ratio']:.2f}x its peak RSS")
    whole = results["whole-message decode"]
    if "error" not in whole:
        ratios["time_vs_whole_decode"] = ours["seconds"] / whole["seconds"]
        ratios["rss_vs_whole_decode"] = ours["peak_rss_bytes"] / whole["peak_rss_bytes"]
    return ratios


def _against_old(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """This checkout's ingest and parse over ``--old``'s: fastest run, least CPU, median run, largest peak RSS."""
    found: dict[str, Any] = {}
    for what in (INGEST, INGEST_NEW, "tracelake parse only"):
        new, old = results.get(what, {}), results.get(f"{what} (--old)", {})
        if "error" in new or "error" in old or not new or not old:
            continue
        found[what] = {
            "time_ratio": new["seconds"] / old["seconds"], "cpu_ratio": new["cpu_seconds"] / old["cpu_seconds"],
            "median_ratio": statistics.median(new["runs_seconds"]) / statistics.median(old["runs_seconds"]),
            "rss_ratio": new["peak_rss_bytes"] / old["peak_rss_bytes"]}
        print(f"{what}, this checkout against --old: {found[what]['time_ratio']:.2f}x the fastest run, "
              f"{found[what]['median_ratio']:.2f}x the median, {found[what]['cpu_ratio']:.2f}x the least CPU time, "
              f"{found[what]['rss_ratio']:.2f}x the peak RSS")
    return found


def _run(python: str, code: str, inputs: list[Path | str], workdir: Path, timeout: float,
         env: dict[str, str] | None = None) -> dict[str, Any]:
    """One child's figures with its peak RSS, or ``{"error": ...}`` if it failed (the others still run); ``env``:
    the child's environment (``--old``: the other build first on its path)."""
    started = time.perf_counter()
    try:
        out, rss = run_child(python, code, [Path(i) for i in inputs], workdir, timeout, env)
    except (RuntimeError, OSError) as exc:
        print(f"child failed, continuing: {str(exc).strip().splitlines()[-1][:300]}", flush=True)
        return {"error": str(exc)}
    return {**out, "peak_rss_bytes": rss, "above_start_bytes": max(rss - int(out.get("base_rss_bytes", 0)), 0),
            "process_seconds": time.perf_counter() - started}


def summary(figures: list[dict[str, Any]]) -> None:
    """One line per file: tracelake's full ingest beside XProf's fastest tool and fastest whole-trace tool."""
    print(f"\n{'file':<34} {'MB':>6} | {'tracelake s':>11} {'RSS MB':>7} | "
          f"{'XProf fastest':<22} {'s':>6} {'RSS MB':>7} {'time x':>6} {'RSS x':>6} | "
          f"{'fastest whole-trace':<22} {'s':>6} {'RSS MB':>7} {'time x':>6} {'CPU x':>6} {'RSS x':>6} {'above x':>7}")
    for fig in figures:
        ours = fig["results"].get(INGEST) or fig["results"][INGEST_NEW]
        name = Path(fig["file"]).name if not fig["what"].startswith("generated") else fig["what"].split(",")[0]
        line = f"{name[:34]:<34} {fig['trace_bytes'] / MB:>6.1f} | "
        line += (f"{ours['seconds']:>11.2f} {ours['peak_rss_bytes'] / MB:>7,.0f} | " if "error" not in ours
                 else f"{'failed':>11} {'':>7} | ")
        for key in ("xprof_fastest", "xprof_fastest_whole"):
            r = fig["ratios"].get(key)
            whole = r is not None and key == "xprof_fastest_whole"
            cpu = f" {r['cpu_ratio']:>6.2f}" if whole else ""
            above = f" {r['above_start_ratio']:>7.2f}" if whole else ""
            line += (f"{r['tool']:<22} {r['seconds']:>6.2f} {r['peak_rss_bytes'] / MB:>7,.0f} "
                     f"{r['time_ratio']:>6.2f}{cpu} {r['rss_ratio']:>6.2f}{above}"
                     if r else f"{'(no XProf figure)':<51}")
            line += " | " if key == "xprof_fastest" else ""
        print(line)
    print("(tracelake: its ingest into an existing warehouse, or with --warehouse new into a new one; "
          "time x, CPU x, RSS x: tracelake's full ingest over the XProf tool's seconds, CPU seconds and peak RSS; "
          "above x: the same of the peaks less each child's RSS before its call; below 1: tracelake less)")


def _xplanes(paths: list[Path]) -> list[Path]:
    """``--xplane`` arguments as files: a folder stands for the ``*.xplane.pb`` in it."""
    found: list[Path] = []
    for path in paths:
        found.extend(sorted(path.glob("*.xplane.pb")) if path.is_dir() else [path])
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", default="200",
                        help="size of the generated .xplane.pb; several, comma-separated, run in turn (default 200; "
                        "0: none, only --xplane files)")
    parser.add_argument("--device", default="tpu",
                        help="generated profile layout(s), comma-separated: tpu (XLA Ops lines), gpu (Stream lines, "
                        "per-event stats); default tpu")
    parser.add_argument("--xplane", type=Path, action="append", default=[],
                        help="also measure this .xplane.pb (a folder: each *.xplane.pb in it); repeatable")
    parser.add_argument("--skip-xprof", action="store_true", help="measure tracelake and the decode anchor only")
    parser.add_argument("--xprof-tools", default="default",
                        help="XProf tools to time: default (all it offers but the trace viewer), all, or a "
                        "comma-separated list")
    parser.add_argument("--runs", type=int, default=1, help="runs of tracelake's ingest and each XProf tool; the "
                        "fastest is kept (default 1)")
    parser.add_argument("--warehouse", choices=("existing", "new", "both"), default="both",
                        help="ingest into an existing (empty) warehouse, as every ingest but a warehouse's first "
                        "does, into a new one (made first, with its DuckDB catalog), or both, each run (default both; "
                        "the ratios are the existing one's)")
    parser.add_argument("--workdir", type=Path, help="where the trace and warehouse go (default: a temp dir)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per child run (default 3600)")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    parser.add_argument("--old", type=Path, metavar="TREE",
                        help="also ingest and parse with another build of tracelake, alternating with this "
                        "checkout's, every run: a folder it was installed into (pip install --no-deps --target TREE "
                        "<its checkout>)")
    args = parser.parse_args(argv)
    try:
        sizes = [float(s) for s in str(args.size_mb).split(",") if s.strip()]
    except ValueError:
        parser.error(f"--size-mb: not a number or a comma-separated list of numbers: {args.size_mb!r}")
    if min(sizes, default=0) < 0:
        parser.error("--size-mb: sizes must be positive (or 0: none)")
    sizes = [s for s in sizes if s > 0]
    devices = [d.strip() for d in args.device.split(",") if d.strip()]
    if not devices or set(devices) - set(DEVICES):
        parser.error(f"--device: {args.device!r}: each one of {', '.join(DEVICES)}")
    xplanes = _xplanes(args.xplane)
    missing = [str(p) for p in xplanes if not p.is_file()]
    if missing:
        parser.error(f"--xplane: no such file: {', '.join(missing)}")
    if not sizes and not xplanes:
        parser.error("nothing to measure: --size-mb 0 and no --xplane")
    if args.runs < 1:
        parser.error("--runs: at least 1")
    if args.old is not None and not (args.old / "tracelake").is_dir():
        parser.error(f"--old: {args.old} holds no installed tracelake (pip install --no-deps --target TREE <checkout>)")

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tracelake-bench-xla-"))
    workdir.mkdir(parents=True, exist_ok=True)
    figures: list[dict[str, Any]] = []
    for device in devices:
        for size in sizes:
            trace, what = generate(size, workdir, device, args.timeout)
            try:
                figures.append({"device": device, "size_mb": size, **measure(trace, what, workdir, args)})
            finally:
                trace.unlink(missing_ok=True)
    for trace in xplanes:
        figures.append(measure(trace, "given", workdir, args))
    summary(figures)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
