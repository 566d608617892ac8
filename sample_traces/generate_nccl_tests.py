"""nccl-tests output as users save it (docs/formats.md section 3, "nccl-tests output"), for
``sample_traces/nccl/nccl_tests_saved/`` (written by ``generate_nccl.py``):

- ``debug_mixed.log``: an all_reduce_perf run with ``NCCL_DEBUG=INFO`` (stdout and NCCL lines in one stream,
  no ``# Collective test starting`` line, a file name that does not say the collective), 4 ranks on 2 nodes;
- ``t4_old_ranks.txt``: an older build's rank lines (no ``Group``; Tesla T4, 2 nodes), an all_gather
  without redop/root columns (ambiguous: the factor (n-1)/n fits several collectives), a 0-byte row;
- ``pasted_table.txt``: a broadcast table pasted without the ``# nThread`` header or rank lines;
- ``alltoall_j.json``: ``-J`` JSON as nccl-tests' writer lays it out (``args``, ``nccl_version``, ``config.devices``
  with ``hostname`` and ``device_info``), ``root`` as a padded string and ``nwrong`` a decimal;
- ``several_runs.txt``: three runs appended to one file: a current build's all_reduce (version and
  ``# Collective test starting`` lines), a reduce_scatter with per-iteration columns and timestamps, and an
  older build's run that names no collective (all_reduce, told from busbw/algbw).

Figures follow latency + bytes x factor / peak busbw, so busbw = algbw x factor (section "Bus bandwidth"). The
mixed run's peak is what one HDR NIC per GPU carries at most (25 GB/s): 22 GB/s, 88% of it; the T4 run's is
what TCP over a 25 Gb/s host NIC gives.
"""

from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).resolve().parent / "nccl" / "nccl_tests_saved"

MIXED_RANKS = 4
MIXED_HOSTS = ("node-a", "node-b")
OLD_RANKS = 4
SIZES = [0, *(1 << k for k in range(3, 28, 4))]  # 0 B, 8 B .. 128 MiB
FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
          "reduce_scatter": lambda n: (n - 1) / n,
          "alltoall": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0}
COLUMNS = ("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw"
           " #wrong")


#: Peak bus bandwidth, GB/s: within a node of NVLink-connected GPUs, and across two nodes over one HDR NIC per GPU.
PEAK_GBS = 90.0
MIXED_PEAK_GBS = 22.0
#: Two nodes of T4s over TCP (NET/Socket on a 25 Gb/s host NIC: at most about 3 GB/s).
OLD_PEAK_GBS = 2.6


def timing(collective: str, ranks: int, size: int, in_place: bool,
           peak_gbs: float = PEAK_GBS) -> tuple[float, float, float]:
    """(time us, algbw GB/s, busbw GB/s) of one row; a 0-byte row takes only the launch time."""
    factor = FACTOR[collective](ranks)
    time_us = (4.0 if size == 0 else 20.0) + (0.3 if in_place else 0.0) + size * factor / (peak_gbs * 1e3)
    algbw = size / (time_us * 1e-6) / 1e9
    return round(time_us, 2), round(algbw, 2), round(algbw * factor, 2)


def _row(collective: str, ranks: int, size: int, middle: str, wrong: str, peak_gbs: float = PEAK_GBS,
         extra: str = "", after: str = "") -> str:
    """One result row; ``extra`` follows each half (per-iteration columns), ``after`` ends the row (timestamp)."""
    out, inp = (timing(collective, ranks, size, in_place, peak_gbs) for in_place in (False, True))
    return (f"{size:12d} {size // 4:13d}     float {middle}{out[0]:8.2f} {out[1]:7.2f} {out[2]:7.2f} {wrong:>6s}{extra} "
            f"{inp[0]:8.2f} {inp[1]:7.2f} {inp[2]:7.2f} {wrong:>6s}{extra}{after}")


def debug_mixed_text() -> str:
    """all_reduce_perf -g 1 under mpirun, 4 ranks on 2 nodes, with NCCL_DEBUG=INFO (NCCL_DEBUG_SUBSYS=INIT,COLL)."""
    lines = [("# nThread 1 nGpus 1 minBytes 0 maxBytes 134217728 step: 16(factor) warmup iters: 5 iters: 20 "
              "agg iters: 1 validation: 1 graph: 0"), "#", "# Using devices"]
    ranks = [(r, MIXED_HOSTS[r // 2], 7200 + r, r % 2) for r in range(MIXED_RANKS)]
    for rank, host, pid, dev in ranks:
        lines.append(f"#  Rank {rank:2d} Group  0 Pid {pid:6d} on {host:>10s} device {dev:2d} [0x{0x18 + dev:02x}] "
                     "NVIDIA A100-SXM4-80GB")
    lines.append("node-a:7200:7200 [0] NCCL INFO NCCL version 2.18.3+cuda12.2")
    for rank, host, pid, dev in ranks:
        lines.append(f"{host}:{pid}:{pid} [{dev}] NCCL INFO NET/IB : Using [0]mlx5_{dev}:1/IB ; OOB ib0:10.0.0.{rank}<0>")
    for rank, host, pid, dev in ranks:
        origin = f"{host}:{pid}:{pid + 9} [{dev}] NCCL INFO "
        peer = (rank + 1) % MIXED_RANKS
        via = "via P2P/IPC" if dev == 0 else "[send] via NET/IB/0/GDRDMA"
        lines += [
            origin + f"comm 0x5600a{rank}00 rank {rank} nRanks 4 nNodes 2 localRanks 2 localRank {dev} MNNVL 0",
            origin + f"Channel 00/0 : {rank}[{dev}] -> {peer}[{peer % 2}] {via}",
            origin + f"Channel 01/0 : {rank}[{dev}] -> {peer}[{peer % 2}] {via}",
            origin + f"ncclCommInitRank comm 0x5600a{rank}00 rank {rank} nranks 4 cudaDev {dev} nvmlDev {dev} "
                     f"busId {dev + 1}8000 commId 0x51c0ffee00000001 - Init COMPLETE",
        ]
    lines += ["#", ("#                                                              out-of-place                       "
                    "in-place"), COLUMNS]
    for op_count, size in enumerate(SIZES):
        for rank, host, pid, dev in ranks:
            lines.append(f"{host}:{pid}:{pid} [{dev}] NCCL INFO AllReduce: opCount {op_count:x} sendbuff 0x7f10{rank}000 "
                         f"recvbuff 0x7f10{rank}800 count {size // 4} datatype 7 op 0 root 0 comm 0x5600a{rank}00 "
                         f"[nranks=4] stream 0x5600b{rank}00")
        lines.append(_row("all_reduce", MIXED_RANKS, size, "    sum      -1 ", "0", MIXED_PEAK_GBS))
    lines += ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 4.2", "#"]
    return "\n".join(lines) + "\n"


def old_ranks_text() -> str:
    """An older nccl-tests build: rank lines without ``Group``, no redop/root columns, ``error`` column."""
    lines = [("# nThread 1 nGpus 1 minBytes 0 maxBytes 134217728 step: 16(factor) warmup iters: 5 iters: 20 "
              "validation: 1"), "#", "# Using devices"]
    for rank in range(OLD_RANKS):
        host = "gpu01" if rank < 2 else "gpu02"
        lines.append(f"#   Rank {rank:2d} Pid {30938 + rank:6d} on {host:>7s} device {rank % 2:2d} [0x{rank % 2:02x}] "
                     "Tesla T4")
    lines += ["#", "#       size         count    type     time   algbw   busbw  error     time   algbw   busbw  error"]
    lines += [_row("all_gather", OLD_RANKS, size, "", "0e+00", OLD_PEAK_GBS) for size in SIZES]
    return "\n".join(lines) + "\n"


def pasted_table_text() -> str:
    """A broadcast table pasted alone (column header and rows): no ``# nThread``, no rank lines."""
    return "\n".join([COLUMNS, *(_row("broadcast", 8, size, "    none       0 ", "0") for size in SIZES)]) + "\n"


def alltoall_json() -> str:
    """``-J`` output laid out as nccl-tests' JSON writer does (version 2): ``args`` (the program first),
    ``nccl_version`` as NCCL's version code, ``config.devices`` entries with ``hostname`` and ``device_info``,
    ``root`` a padded string, ``nwrong`` a decimal, ``actual_iterations`` and ``experiment_name`` per row."""
    results = []
    for size in SIZES:
        row: dict[str, object] = {"size": size, "count": size // 4 // 8, "type": "float", "redop": "none",
                                  "root": "    -1"}
        for key, in_place in (("out_of_place", False), ("in_place", True)):
            time_us, algbw, busbw = timing("alltoall", 8, size, in_place)
            row[key] = {"time": time_us, "alg_bw": algbw, "bus_bw": busbw, "nwrong": 0.0}
        row.update({"actual_iterations": 20, "experiment_name": ""})
        results.append(row)
    devices = [{"rank": r, "group": 0, "pid": 900 + r, "hostname": f"h{r // 4}", "device": r % 4,
                "device_hex": f"0000:{0x18 + r % 4:02x}:00", "device_info": "NVIDIA H200"} for r in range(8)]
    doc = {"version": 2, "start_time": "2026-11-30 10:00:00",
           "args": ["/opt/nccl-tests/build/alltoall_perf", "-b", "8", "-e", "128M", "-f", "16", "-J", "out.json"],
           "env": [], "nccl_version": 22703,
           "config": {"nthreads": 1, "ngpus": 1, "minimum_bytes": 0, "maximum_bytes": 134217728, "step_factor": 16,
                      "warmup_iters": 5, "iterations": 20, "aggregated_iterations": 1, "validation": 1, "graph": 0,
                      "blocking_collectives": "false", "per_iter_timing": "false", "parallel_init": "false",
                      "devices": devices},
           "results": results, "out_of_bounds": {"count": 0, "okay": "true"},
           "average_bus_bandwidth": {"bandwidth": 30.1, "okay": "unchecked"}, "errors": [],
           "end_time": "2026-11-30 10:00:09"}
    return json.dumps(doc, indent=1) + "\n"


#: The three runs of ``several_runs.txt``: (collective, ranks, names itself, per-iteration columns).
SEVERAL = (("all_reduce", 8, True, False), ("reduce_scatter", 8, True, True), ("all_reduce", 4, False, False))


def several_runs_text() -> str:
    """Three ``*_perf`` runs appended to one file (a script's loop ``>> results.txt``), one node of H100s."""
    lines: list[str] = []
    for collective, ranks, named, per_iter in SEVERAL:
        if named:
            lines += ["# nccl-tests version 2.17.6 nccl-headers=22703 nccl-library=22703",
                      f"# Collective test starting: {collective}_perf"]
        lines += [("# nThread 1 nGpus 1 minBytes 0 maxBytes 134217728 step: 16(factor) warmup iters: 5 iters: 20 "
                   "agg iters: 1 validation: 1 graph: 0"), "#", "# Using devices"]
        lines += [f"#  Rank {r:2d} Group  0 Pid {3000 + r:6d} on      dgx-1 device {r:2d} [0000:{0x18 + r:02x}:00] "
                  "NVIDIA H100 80GB HBM3" for r in range(ranks)]
        middle = "    sum      -1 "
        if per_iter:
            lines += ["#", "#                                     out-of-place (+ per-iteration)     in-place (+ per-iteration)",
                      "#       size         count      type   redop    root     time   algbw   busbw #wrong   i_min   i_max"
                      "   i_p99   i_cv%     time   algbw   busbw #wrong   i_min   i_max   i_p99   i_cv%           timestamp"]
            lines += [_row(collective, ranks, size, middle, "0", extra="   19.10   23.00   22.70    4.20",
                           after="  2026-11-30 10:01:02") for size in SIZES]
        else:
            lines += ["#", "#                                                              out-of-place"
                      "                       in-place", COLUMNS]
            lines += [_row(collective, ranks, size, middle, "0") for size in SIZES]
        lines += ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 40.1", "#"]
        if named:
            lines.append(f"# Collective test concluded: {collective}_perf")
    return "\n".join(lines) + "\n"


FILES = {"debug_mixed.log": debug_mixed_text, "t4_old_ranks.txt": old_ranks_text,
         "pasted_table.txt": pasted_table_text, "alltoall_j.json": alltoall_json, "several_runs.txt": several_runs_text}
