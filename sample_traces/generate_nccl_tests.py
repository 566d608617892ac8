"""nccl-tests output as users save it (docs/formats.md section 3, "nccl-tests output"), for
``sample_traces/nccl/nccl_tests_saved/`` (written by ``generate_nccl.py``):

- ``debug_mixed.log``: an all_reduce_perf run with ``NCCL_DEBUG=INFO`` (stdout and NCCL lines in one stream,
  no ``# Collective test starting`` line, a file name that does not say the collective), 4 ranks on 2 nodes;
- ``t4_old_ranks.txt``: an older build's rank lines (no ``Group``; Tesla T4, 2 nodes), an all_gather
  without redop/root columns (ambiguous: the factor (n-1)/n fits several collectives), a 0-byte row;
- ``pasted_table.txt``: a broadcast table pasted without the ``# nThread`` header or rank lines;
- ``alltoall_j.json``: ``-J`` JSON with ``root`` as a padded string, ``nwrong`` a decimal and ``config.devices``.

Figures follow latency + bytes x factor / peak busbw, so busbw = algbw x factor (section "Bus bandwidth").
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
          "alltoall": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0}
COLUMNS = ("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw"
           " #wrong")


def timing(collective: str, ranks: int, size: int, in_place: bool) -> tuple[float, float, float]:
    """(time us, algbw GB/s, busbw GB/s) of one row; a 0-byte row takes only the launch time."""
    factor = FACTOR[collective](ranks)
    time_us = (4.0 if size == 0 else 20.0) + (0.3 if in_place else 0.0) + size * factor / 90e3
    algbw = size / (time_us * 1e-6) / 1e9
    return round(time_us, 2), round(algbw, 2), round(algbw * factor, 2)


def _row(collective: str, ranks: int, size: int, middle: str, wrong: str) -> str:
    out, inp = timing(collective, ranks, size, False), timing(collective, ranks, size, True)
    return (f"{size:12d} {size // 4:13d}     float {middle}{out[0]:8.2f} {out[1]:7.2f} {out[2]:7.2f} {wrong:>6s} "
            f"{inp[0]:8.2f} {inp[1]:7.2f} {inp[2]:7.2f} {wrong:>6s}")


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
        lines.append(_row("all_reduce", MIXED_RANKS, size, "    sum      -1 ", "0"))
    lines += ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 12.5", "#"]
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
    lines += [_row("all_gather", OLD_RANKS, size, "", "0e+00") for size in SIZES]
    return "\n".join(lines) + "\n"


def pasted_table_text() -> str:
    """A broadcast table pasted alone (column header and rows): no ``# nThread``, no rank lines."""
    return "\n".join([COLUMNS, *(_row("broadcast", 8, size, "    none       0 ", "0") for size in SIZES)]) + "\n"


def alltoall_json() -> str:
    """``-J`` output with string-typed fields: ``root`` padded, ``nwrong`` a decimal, devices under ``config``."""
    results = []
    for size in SIZES:
        row: dict[str, object] = {"size": size, "count": size // 4 // 8, "type": "float", "redop": "none",
                                  "root": "    -1"}
        for key, in_place in (("out_of_place", False), ("in_place", True)):
            time_us, algbw, busbw = timing("alltoall", 8, size, in_place)
            row[key] = {"time": time_us, "alg_bw": algbw, "bus_bw": busbw, "nwrong": 0.0}
        results.append(row)
    devices = [{"rank": r, "hostname": f"h{r // 4}", "pid": 900 + r, "device": r % 4, "name": "NVIDIA H200"}
               for r in range(8)]
    doc = {"config": {"nthreads": 1, "ngpus": 1, "devices": devices}, "results": results}
    return json.dumps(doc, indent=1) + "\n"


FILES = {"debug_mixed.log": debug_mixed_text, "t4_old_ranks.txt": old_ranks_text,
         "pasted_table.txt": pasted_table_text, "alltoall_j.json": alltoall_json}
