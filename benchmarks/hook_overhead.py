"""Benchmark: what ``on_trace_ready=tracelake.torch.upload(...)`` costs a CPU training loop.

Run it from the repository root with the dev virtualenv (torch installed)::

    python benchmarks/hook_overhead.py                      # 3 runs of each configuration
    python benchmarks/hook_overhead.py --runs 5 --steps 400 --json hook.json

What it measures: a small MLP trained on CPU (``--threads`` torch threads, default 1: the other
core is the uploader's, as a GPU job leaves its CPUs mostly free), with per-step wall times, in
three configurations that alternate ``--runs`` times:

* ``no profiler``: the plain loop, the baseline;
* ``profiler, export only``: ``torch.profiler`` with ``schedule(wait=W, warmup=1, active=2)``
  repeating, ``on_trace_ready`` writing the trace to a file on the training thread (what
  ``tensorboard_trace_handler`` does);
* ``profiler + tracelake hook``: the same schedule, ``on_trace_ready=tracelake.torch.upload(...)``
  sending to a real ``tracelake serve`` on 127.0.0.1 started here under ``nice -n 19``, standing
  in for a remote server whose ingests are not the hook's cost (``--no-server``: nothing listens,
  every trace goes to the spool instead).

The figure that matters is the step time outside the profiled steps: steps in the schedule's
``wait`` phase that neither start nor end a capture, which is when the hook's background thread
gzips, hashes and uploads the last cycle's trace. It is compared with the same steps of the
baseline, three ways: the 25th percentile of the wall times (other processes only ever add time,
so a low percentile is the steadiest figure on a shared machine), their median (with each run's
median, to see the noise), and the training thread's own CPU time a step (``time.thread_time``).
The uploader thread's CPU time per trace is shown as a share of the steps between two captures:
the most it could take from training, were it all on the training thread's core. The time
``on_trace_ready`` takes on the training thread (export plus hand-over) is shown apart, as is
where ``Client.upload`` ran: the hook's thread ids against the training thread's.

Runs minutes apart see different loads, so each run also makes one profiled run whose
``on_trace_ready`` alternates between the hook and export only, cycle by cycle: the steps after a
hook cycle are set against those of the cycles on either side, half a second away, which cancels
most of the machine's noise and isolates what the uploader thread costs. Nothing is asserted but
the thread check.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

TOKEN = "bench-hook-writer-01"


def start_server(home: Path, log: Path, cpus: set[int] | None = None) -> tuple[subprocess.Popen[bytes], str]:
    """A ``tracelake serve`` on a free loopback port, once ``/healthz`` answers; confined to ``cpus`` if given."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACELAKE_")}
    env |= {"TRACELAKE_HOME": str(home), "TRACELAKE_TOKENS": f"{TOKEN}:read,write", "TRACELAKE_INGEST_WORKERS": "1"}
    # niced: the server stands in for a remote one, its ingests are not the hook's cost
    process = subprocess.Popen(["nice", "-n", "19", sys.executable, "-m", "tracelake.api.cli", "serve", "--port",
                                str(port)], env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                               preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=1) as answer:
                if answer.status == 200:
                    return process, url
        except OSError:
            time.sleep(0.2)
    process.terminate()
    raise SystemExit(f"the server did not start:\n{log.read_text()}")


def train(steps: int, width: int, profiler: Any | None) -> list[tuple[float, float]]:
    """Per-step (wall, training-thread CPU) seconds of ``steps`` steps of an MLP (forward, backward, SGD, ``prof.step()``)."""
    import torch

    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(4):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(width, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    data = torch.randn(64, width)
    times = []
    for _ in range(steps):
        started, cpu = time.perf_counter(), time.thread_time()
        loss = model(data).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if profiler is not None:
            profiler.step()
        times.append((time.perf_counter() - started, time.thread_time() - cpu))
    return times


def outside_steps(steps: int, wait: int, cycles: int) -> list[int]:
    """The steps the schedule neither records nor starts or ends a capture in (``NONE`` now and next)."""
    import torch

    schedule = torch.profiler.schedule(wait=wait, warmup=1, active=2, repeat=cycles)
    none = torch.profiler.ProfilerAction.NONE
    return [i for i in range(steps - 1) if schedule(i) == none and schedule(i + 1) == none]


def timed(handler: Callable[[Any], None], spent: list[float]) -> Callable[[Any], None]:
    def wrapper(prof: Any) -> None:
        started = time.perf_counter()
        handler(prof)
        spent.append(time.perf_counter() - started)
    return wrapper


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="training steps per run (default 300)")
    parser.add_argument("--wait", type=int, default=25, help="the schedule's wait steps per cycle (default 25)")
    parser.add_argument("--width", type=int, default=1024, help="the MLP's width (default 1024: ~20 ms steps)")
    parser.add_argument("--runs", type=int, default=3, help="runs of each configuration, alternating (default 3)")
    parser.add_argument("--threads", type=int, default=1, help="torch's intra-op threads (default 1)")
    parser.add_argument("--no-server", action="store_true", help="no server: every trace goes to the spool")
    parser.add_argument("--pin", action="store_true",
                        help="the server on the last CPU, training and its uploader on the others (a training node "
                        "whose server is elsewhere: its ingests take no CPU from the job)")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON")
    args = parser.parse_args()
    server_cpus: set[int] | None = None
    if args.pin:
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) < 2:
            raise SystemExit("--pin needs two CPUs or more")
        server_cpus = {cpus[-1]}
        os.sched_setaffinity(0, set(cpus[:-1]))

    import torch

    import tracelake.torch
    from tracelake.client import Client

    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", ".*Profiler clears events at the end of each cycle")  # what a cycle wants
    cycles = args.steps // (args.wait + 3)
    outside = outside_steps(args.steps, args.wait, cycles)
    work = Path(tempfile.mkdtemp(prefix="tracelake-hook-bench-"))
    server, url = (None, "http://127.0.0.1:9") if args.no_server else start_server(work / "wh", work / "server.log", server_cpus)
    upload_threads: list[int] = []
    original = Client.upload

    def recording(self: Client, paths: Any, **kwargs: Any) -> Any:
        upload_threads.append(threading.get_ident())
        return original(self, paths, **kwargs)

    Client.upload = recording
    results: dict[str, dict[str, list[Any]]] = {
        name: {"wall": [], "cpu": [], "on_trace_ready": [], "run_medians": []}
        for name in ("no profiler", "profiler, export only", "profiler + tracelake hook")}
    background: list[float] = []
    paired: list[tuple[float, float]] = []
    try:
        train(30, args.width, None)  # warm up the allocator and the kernels
        for run in range(args.runs):
            names = ("no profiler", "profiler, export only", "profiler + tracelake hook")
            for name in names[run % 3:] + names[:run % 3]:  # a different order each run: no configuration always last
                entry = results.setdefault(name, {"wall": [], "cpu": [], "on_trace_ready": [], "run_medians": []})
                if name == "no profiler":
                    times = train(args.steps, args.width, None)
                else:
                    if name == "profiler, export only":
                        def export(prof: Any, run: int = run) -> None:
                            prof.export_chrome_trace(str(work / f"export-{run}-{prof.step_num}.json"))
                        handler: Callable[[Any], None] = export
                    else:
                        hook = tracelake.torch.upload(job="hook-bench", labels={"run": str(run)}, url=url,
                                                      token=TOKEN, spool=work / "spool", retries=0)
                        cpu_of(hook.uploader, background)
                        handler = hook
                    schedule = torch.profiler.schedule(wait=args.wait, warmup=1, active=2, repeat=cycles)
                    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], schedule=schedule,
                                                on_trace_ready=timed(handler, entry["on_trace_ready"])) as prof:
                        times = train(args.steps, args.width, prof)
                kept = [times[i] for i in outside]
                entry["wall"] += [w for w, _ in kept]
                entry["cpu"] += [c for _, c in kept]
                entry["run_medians"].append(statistics.median(w for w, _ in kept))
            paired += alternating(args, cycles, outside, run, url, work, background)
        flushed = tracelake.torch.flush(120)
    finally:
        Client.upload = original
        if server is not None:
            server.terminate()
            server.wait(30)
    report(args, cycles, len(outside), results, background, upload_threads, flushed, url, work)
    if paired:
        wall = [w for w, _ in paired]
        cpu = [c for _, c in paired]
        print(f"Paired, cycle by cycle in one profiled run (the handler alternating between the hook and export only): "
              f"the steps after a hook cycle against those of the cycles on either side: wall "
              f"{statistics.median(wall) * 100:+.2f}% (median of {len(wall)} cycles; mean {statistics.mean(wall) * 100:+.2f}%), "
              f"training-thread CPU {statistics.median(cpu) * 100:+.2f}% (mean {statistics.mean(cpu) * 100:+.2f}%)")


def alternating(args: argparse.Namespace, cycles: int, outside: list[int], run: int, url: str, work: Path,
                background: list[float]) -> list[tuple[float, float]]:
    """One profiled run whose ``on_trace_ready`` alternates hook, export only, hook, ...; the (wall, CPU) ratio of
    the mean outside step after each hook cycle to that of the cycles on either side of it, minus 1."""
    import torch

    import tracelake.torch

    hook = tracelake.torch.upload(job="hook-bench-paired", labels={"run": str(run)}, url=url, token=TOKEN,
                                  spool=work / "spool", retries=0)
    cpu_of(hook.uploader, background)
    calls = [0]

    def handler(prof: Any) -> None:
        if calls[0] % 2 == 0:
            hook(prof)
        else:
            prof.export_chrome_trace(str(work / f"paired-{run}-{prof.step_num}.json"))
        calls[0] += 1

    schedule = torch.profiler.schedule(wait=args.wait, warmup=1, active=2, repeat=cycles)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], schedule=schedule,
                                on_trace_ready=handler) as prof:
        times = train(args.steps, args.width, prof)
    by_cycle: dict[int, list[tuple[float, float]]] = {}
    for i in outside:
        by_cycle.setdefault(i // (args.wait + 3), []).append(times[i])
    pairs = []
    # cycle c's wait phase follows handler call c - 1, and even calls are the hook's: odd cycles follow the hook, and
    # each is set against its neighbours (cycle 0 follows no capture at all), so a drift in the load cancels out
    for cycle in range(1, cycles, 2):
        after_hook = by_cycle.get(cycle)
        others = [by_cycle[c] for c in (cycle - 1, cycle + 1) if c in by_cycle and c < cycles]
        if after_hook and others:
            wall = statistics.mean(statistics.mean(w for w, _ in o) for o in others)
            cpu = statistics.mean(statistics.mean(c for _, c in o) for o in others)
            pairs.append((statistics.mean(w for w, _ in after_hook) / wall - 1,
                          statistics.mean(c for _, c in after_hook) / cpu - 1))
    return pairs


def cpu_of(uploader: Any, spent: list[float]) -> None:
    """Count the CPU seconds the uploader's thread spends on each trace (gzip, trace id, upload) into ``spent``."""
    if getattr(uploader, "_bench_wrapped", False):
        return
    handle = uploader._handle

    def measured(item: Any) -> None:
        started = time.thread_time()
        handle(item)
        spent.append(time.thread_time() - started)

    uploader._handle, uploader._bench_wrapped = measured, True


def report(args: argparse.Namespace, cycles: int, outside: int, results: dict[str, dict[str, list[Any]]],
           background: list[float], upload_threads: list[int], flushed: bool, url: str, work: Path) -> None:
    """Print the table (and write the JSON); exit non-zero if an upload ran on the training thread."""
    import tracelake.torch

    def p25(values: list[float]) -> float:
        return sorted(values)[len(values) // 4]

    base = results["no profiler"]
    base_p25, base_cpu = p25(base["wall"]), statistics.median(base["cpu"])
    print(f"\n{args.runs} runs x {args.steps} steps, MLP width {args.width}, torch threads {args.threads}, schedule "
          f"wait={args.wait} warmup=1 active=2 x {cycles} cycles; {outside} steps a run outside the captures; "
          f"{'no server (spool)' if args.no_server else 'a real tracelake serve on 127.0.0.1 (niced)'}\n")
    print("| configuration | step wall p25 | vs no profiler | step wall median | medians of the runs | "
          "training-thread CPU a step (median) | vs no profiler | on_trace_ready on the training thread |")
    print("|---|---:|---:|---:|---|---:|---:|---:|")
    figures: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "configurations": {}}
    for name, entry in results.items():
        wall_p25, wall_median, cpu = p25(entry["wall"]), statistics.median(entry["wall"]), statistics.median(entry["cpu"])
        ready = f"{statistics.median(entry['on_trace_ready']) * 1e3:.1f} ms" if entry["on_trace_ready"] else "-"
        runs = ", ".join(f"{m * 1e3:.1f}" for m in entry["run_medians"])
        print(f"| {name} | {wall_p25 * 1e3:.2f} ms | {(wall_p25 / base_p25 - 1) * 100:+.2f}% | {wall_median * 1e3:.2f} ms "
              f"| {runs} ms | {cpu * 1e3:.2f} ms | {(cpu / base_cpu - 1) * 100:+.2f}% | {ready} |")
        figures["configurations"][name] = {
            "wall_p25_s": wall_p25, "wall_median_s": wall_median, "cpu_median_s": cpu,
            "wall_p25_overhead_pct": (wall_p25 / base_p25 - 1) * 100, "cpu_overhead_pct": (cpu / base_cpu - 1) * 100,
            "run_medians_s": entry["run_medians"], "on_trace_ready_s": entry["on_trace_ready"], "steps": len(entry["wall"])}
    if background:
        per_trace = statistics.median(background)
        share = per_trace / (args.wait * statistics.median(base["wall"]))
        print(f"\nThe uploader's thread: {per_trace * 1e3:.1f} ms CPU a trace (median of {len(background)}: gzip, "
              f"trace id, upload), {share * 100:.2f}% of the {args.wait} steps between two captures")
        figures["background_cpu_s"] = background
    main_thread = threading.get_ident()
    uploader = tracelake.torch.upload(url=url, token=TOKEN, spool=work / "spool", retries=0).uploader
    on_training = sum(t == main_thread for t in upload_threads)
    print(f"Client.upload calls: {len(upload_threads)}, on the training thread: {on_training}; threads that uploaded: "
          f"{len(set(upload_threads))}; traces {uploader.counts}, all done: {flushed}")
    figures["uploads"] = {"calls": len(upload_threads), "on_training_thread": on_training, "counts": uploader.counts}
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    if on_training:
        raise SystemExit("an upload ran on the training thread")


if __name__ == "__main__":
    main()
