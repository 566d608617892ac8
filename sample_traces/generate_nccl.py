"""Generate the NCCL sample files in ``sample_traces/nccl/`` (nccl-tests and Inspector output).

Written from the layouts in docs/formats.md section 3, with figures from a simple
bandwidth model (latency + bytes / peak bus bandwidth) so that algbw and busbw
are consistent with the formulas:

- ``nccl_tests/all_reduce_perf.txt``: current stdout layout (redop and root columns,
  ``#wrong``), 8 GPUs on one node, each line behind an mpirun ``[1,0]<stdout>:`` prefix;
- ``nccl_tests/all_gather_perf_old.txt``: an older build (no root column, ``error``
  instead of ``#wrong``, ``N/A`` with validation off);
- ``nccl_tests/reduce_scatter_perf.json``: the ``-J`` JSON output;
- ``debug_log/train-4ranks.log``: an NCCL_DEBUG=INFO log of 4 ranks on 2 nodes, interleaved;
- ``profiler_plugin/nccl_profile_<commHash>_<rank>.json``: the NCCL profiler plugin's dumps of a
  2-rank communicator (COLL begin/end pairs with algorithm, protocol, channels);
- ``flight_recorder/nccl_trace_rank_<r>[.json]``: PyTorch Flight Recorder dumps of 4 ranks (JSON,
  and the default pickle for rank 3), rank 3 hung in an all_reduce;
- ``inspector/node-a-pid<pid>.log``: NCCL Inspector JSON lines of a 4-rank communicator
  (AllReduce, AllGather, Send/Recv), rank 2 finishing late, one line of launcher noise each.

Deterministic: run ``python sample_traces/generate_nccl.py`` to rewrite them.
"""

from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path

try:
    from . import generate_nccl_tests
except ImportError:  # run as a script
    import generate_nccl_tests  # type: ignore[no-redef]

OUT = Path(__file__).resolve().parent / "nccl" / "nccl_tests"
INSPECTOR_OUT = Path(__file__).resolve().parent / "nccl" / "inspector"
INSPECTOR_RANKS = 4
LATE_RANK = 2
RANKS = 8
SIZES = [1 << k for k in range(3, 31, 3)]  # 8 B .. 1 GiB
FACTORS = {"all_reduce": 2 * (RANKS - 1) / RANKS, "all_gather": (RANKS - 1) / RANKS,
           "reduce_scatter": (RANKS - 1) / RANKS}
PEAK_BUSBW = {"all_reduce": 360.0, "all_gather": 370.0, "reduce_scatter": 355.0}  # GB/s


def timing(collective: str, size: int, in_place: bool) -> tuple[float, float, float]:
    """(time us, algbw GB/s, busbw GB/s) of one row under the model."""
    latency_us = 12.0 + (0.4 if in_place else 0.0)
    factor = FACTORS[collective]
    time_us = latency_us + size * factor / (PEAK_BUSBW[collective] * 1e3)
    algbw = size / (time_us * 1e-6) / 1e9
    return round(time_us, 2), round(algbw, 2), round(algbw * factor, 2)


def _header(binary: str, old: bool) -> list[str]:
    lines = [] if old else [f"# Collective test starting: {binary}", "# nccl-tests version 2.13.9 nccl-headers=22105 "
                                                                    "nccl-library=22105"]
    lines += [
        f"# nThread 1 nGpus 1 minBytes 8 maxBytes 1073741824 step: 8(factor) warmup iters: 5 iters: 20 "
        f"agg iters: 1 validation: {0 if old else 1} graph: 0",
        "#",
        "# Using devices",
    ]
    for rank in range(RANKS):
        lines.append(f"#  Rank {rank:2d} Group  0 Pid {4100 + rank:6d} on    node-a device {rank:2d} "
                     f"[0x{0x18 + rank * 0x10:02x}] NVIDIA H100 80GB HBM3")
    return lines


def all_reduce_text() -> str:
    lines = _header("all_reduce_perf", old=False)
    lines += [
        "#",
        "#                                                              out-of-place                       in-place",
        "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong",
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)",
    ]
    for size in SIZES:
        out = timing("all_reduce", size, False)
        inp = timing("all_reduce", size, True)
        lines.append(f"{size:12d} {size // 4:13d}     float     sum      -1 {out[0]:8.2f} {out[1]:7.2f} {out[2]:7.2f}"
                     f"      0 {inp[0]:8.2f} {inp[1]:7.2f} {inp[2]:7.2f}      0")
    avg = sum(timing("all_reduce", s, False)[2] for s in SIZES) / len(SIZES)
    lines += ["# Out of bounds values : 0 OK", f"# Avg bus bandwidth    : {avg:.4f}", "#"]
    return "".join(f"[1,0]<stdout>:{line}\n" for line in lines)


def all_gather_old_text() -> str:
    lines = _header("all_gather_perf", old=True)
    lines += [
        "#",
        "#                                             out-of-place                       in-place",
        "#       size         count      type     time   algbw   busbw  error     time   algbw   busbw  error",
        "#        (B)    (elements)               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)",
    ]
    for size in SIZES:
        out = timing("all_gather", size, False)
        inp = timing("all_gather", size, True)
        lines.append(f"{size:12d} {size // 4 // RANKS:13d}     float {out[0]:8.2f} {out[1]:7.2f} {out[2]:7.2f}"
                     f"    N/A {inp[0]:8.2f} {inp[1]:7.2f} {inp[2]:7.2f}    N/A")
    avg = sum(timing("all_gather", s, False)[2] for s in SIZES) / len(SIZES)
    lines += [f"# Avg bus bandwidth    : {avg:.4f}", "#"]
    return "\n".join(lines) + "\n"


def reduce_scatter_json() -> str:
    results = []
    for size in SIZES:
        row: dict[str, object] = {"size": size, "count": size // 4 // RANKS, "type": "float", "redop": "sum",
                                  "root": -1}
        for key, in_place in (("out_of_place", False), ("in_place", True)):
            time_us, algbw, busbw = timing("reduce_scatter", size, in_place)
            row[key] = {"time": time_us, "alg_bw": algbw, "bus_bw": busbw, "nwrong": 0}
        results.append(row)
    doc = {"nccl_tests_version": "2.13.9", "collective": "reduce_scatter", "nranks": RANKS, "results": results}
    return json.dumps(doc, indent=1) + "\n"


def inspector_lines(rank: int) -> str:
    """One rank's Inspector output: 12 AllReduces and 4 AllGathers of a 4-rank communicator, a send/recv
    pair, and a line of launcher noise. Rank 2 completes its collectives 400 us after the others (late)."""
    lines = [f"[rank {rank}] inspector: dumping to ./nccl-inspector"]
    start_us = 1_767_225_600_000_000  # 2026-01-01 00:00:00 UTC, in us
    header = {"id": "0x7f3a9c", "comm_name": "default_pg", "rank": rank, "n_ranks": INSPECTOR_RANKS, "nnodes": 1}
    for sn in range(1, 17):
        coll, size = ("AllReduce", 64 << 20) if sn <= 12 else ("AllGather", 16 << 20)
        exec_us = 420.0 if coll == "AllReduce" else 180.0
        done_us = start_us + sn * 10_000 + round(exec_us) + (400 if rank == LATE_RANK else 0)
        meta = {"inspector_output_format_version": "v4.0", "git_rev": "2.28.3", "rec_mechanism": "profiler_plugin",
                "dump_timestamp_us": done_us, "hostname": "node-a", "pid": 4100 + rank}
        algbw = size / (exec_us * 1e-6) / 1e9
        factor = 2 * (INSPECTOR_RANKS - 1) / INSPECTOR_RANKS if coll == "AllReduce" else \
            (INSPECTOR_RANKS - 1) / INSPECTOR_RANKS
        perf = {"coll": coll, "coll_sn": sn, "coll_msg_size_bytes": size, "coll_exec_time_us": exec_us,
                "coll_timing_source": "kernel_gpu", "coll_algobw_gbs": round(algbw, 3),
                "coll_busbw_gbs": round(algbw * factor, 3)}
        lines.append(json.dumps({"header": header, "metadata": meta, "coll_perf": perf}))
    peer = rank ^ 1
    meta = {"inspector_output_format_version": "v4.0", "dump_timestamp_us": start_us + 200_000, "hostname": "node-a",
            "pid": 4100 + rank}
    lines.append(json.dumps({"header": header, "metadata": meta, "p2p_perf": {
        "p2p": "Send" if rank % 2 == 0 else "Recv", "p2p_sn": 1, "p2p_peer": peer, "p2p_msg_size_bytes": 1 << 20,
        "p2p_exec_time_us": 25.0}}))
    return "\n".join(lines) + "\n"


LOG_OUT = Path(__file__).resolve().parent / "nccl" / "debug_log"
LOG_HOSTS = ("node-a", "node-b")


def debug_log() -> str:
    """An NCCL_DEBUG=INFO log of 4 ranks on 2 nodes (2 GPUs each), interleaved in one file as mpirun
    writes it: version, inits (NCCL 2.2x form), nNodes lines, transports (P2P in a node, NET/IB across),
    10 AllReduce and 2 AllGather COLL lines per rank with timestamps, a TUNING line, a WARN, and noise."""
    ranks = [(r, LOG_HOSTS[r // 2], 5100 + r, r % 2) for r in range(4)]
    lines = ["[1,0]<stdout>:node-a:5100:5100 [0] NCCL INFO NCCL version 2.21.5+cuda12.4", "starting training"]
    for rank, host, pid, dev in ranks:
        prefix = f"[1,{rank}]<stdout>:{host}:{pid}:{pid + 7} [{dev}] NCCL INFO "
        lines += [
            prefix + f"ncclCommInitRank comm 0x55d0c{rank}a0 rank {rank} nranks 4 cudaDev {dev} nvmlDev {dev} "
                     f"busId {dev + 1}8000 commId 0x9e2f4c1d5a7b3e01 - Init START",
            prefix + f"comm 0x55d0c{rank}a0 rank {rank} nRanks 4 nNodes 2 localRanks 2 localRank {dev} MNNVL 0",
            prefix + f"Channel 00/0 : {rank}[{dev}] -> {(rank + 1) % 4}[{(dev + 1) % 2}] "
                     + ("via P2P/IPC" if dev == 0 else "[send] via NET/IB/0/GDRDMA"),
            prefix + f"Channel 01/0 : {rank}[{dev}] -> {(rank + 1) % 4}[{(dev + 1) % 2}] "
                     + ("via P2P/IPC" if dev == 0 else "[send] via NET/IB/1/GDRDMA"),
            prefix + f"ncclCommInitRank comm 0x55d0c{rank}a0 rank {rank} nranks 4 cudaDev {dev} nvmlDev {dev} "
                     f"busId {dev + 1}8000 commId 0x9e2f4c1d5a7b3e01 - Init COMPLETE",
        ]
    lines.append("[1,0]<stdout>:node-a:5100:5107 [0] NCCL INFO AllReduce: 67108864 Bytes -> Algo RING proto "
                 "SIMPLE channel{Lo..Hi}={0..1}")
    for op_count in range(12):
        op, count = ("AllReduce", 16 << 20) if op_count < 10 else ("AllGather", 4 << 20)
        for rank, host, pid, dev in ranks:
            stamp = f"2026-01-01 00:00:{op_count:02d}.{100 + rank * 50:06d}"
            lines.append(
                f"[1,{rank}]<stdout>:[{stamp}] {host}:{pid}:{pid + 7} [{dev}] NCCL INFO {op}: opCount {op_count:x} "
                f"sendbuff 0x7f00{rank}000 recvbuff 0x7f00{rank}800 count {count} datatype 7 op 0 root 0 "
                f"comm 0x55d0c{rank}a0 [nranks=4] stream 0x55d0d{rank}00")
    lines += ["", "[1,3]<stdout>:node-b:5103:5110 [1] transport/net_ib.cc:1234 NCCL WARN NET/IB : Got async event : "
              "port error", "loss 2.31"]
    return "\n".join(lines) + "\n"


def debug_log_shapes() -> dict[str, list[str]]:
    """One short log per init/topology line shape since NCCL 2.4 (docs/formats.md, NCCL debug log), each
    written by one process (host h, pid 9) driving GPUs 0 and 1 as ranks 0 and 1 of 2."""
    def info(dev: int, message: str) -> str:
        return f"h:9:1{dev} [{dev}] NCCL INFO {message}"

    init_old = [info(d, f"comm 0x5f{d} rank {d} nranks 2 cudaDev {d} nvmlDev {d} - Init COMPLETE") for d in (0, 1)]
    return {
        "version": ["h:9:10 [0] NCCL INFO NCCL version 2.4.8+cuda10.1", "NCCL version 2.18.3+cuda12.2"],
        "init_2.4": init_old,
        "init_busid": [info(d, f"comm 0x5f{d} rank {d} nranks 2 cudaDev {d} busId {d + 1}b000 - Init COMPLETE")
                       for d in (0, 1)],
        "init_commid": [info(d, f"ncclCommInitRankConfig comm 0x5f{d} rank {d} nranks 2 cudaDev {d} nvmlDev {d} "
                                f"busId {d + 1}b000 commId 0xa1b2 - Init COMPLETE") for d in (0, 1)],
        "nodes": [info(d, f"comm 0x5f{d} rank {d} nRanks 2 nNodes 1 localRanks 2 localRank {d} MNNVL 0")
                  for d in (0, 1)],
        "ring_2.4": [*init_old, info(0, "Ring 00 : 0[0] -> 1[1] via P2P/IPC"), info(1, "Ring 00 : 1[1] -> 0[0] via P2P/IPC")],
        "ring_net_2.4": [info(0, "Ring 00 : 1 -> 0 [receive] via NET/IB/0/GDRDMA"),
                         info(1, "Ring 00 : 1 -> 0 [send] via NET/IB/0/GDRDMA")],
        "channel_busid": [info(0, "Channel 00 : 1[f5000] -> 0[35000] [receive] via NET/AWS Libfabric/0"),
                          info(1, "Channel 00 : 1[f5000] -> 0[35000] [send] via NET/AWS Libfabric/0")],
        "channel_p2p_busid": [info(0, "Channel 00 : 0[35000] -> 1[f5000] via P2P/direct pointer"),
                              info(1, "Channel 00 : 1[f5000] -> 0[35000] via P2P/direct pointer")],
        "channel_conn": [info(0, "Channel 00/0 : 0[0] -> 1[1] via P2P/direct pointer/read"),
                         info(1, "Channel 00/1 : 1[1] -> 0[0] via P2P/CUMEM/read")],
        "ring_order": [info(d, f"Channel {c:02d}/02 :    0   1") for d in (0, 1) for c in (0, 1)]
                      + [info(0, "Ring 00 :    0   1"), info(0, "Channel 00 :    0   1")],
        "trees": [info(0, "Trees [0] 1/-1/-1->0->-1 [1] -1/-1/-1->0->1"), info(1, "Trees [0] -1/-1/-1->1->0")],
        "connected": [info(d, f"Connected all {what}") for d in (0, 1) for what in ("rings", "trees")],
        "network": [info(0, "Using network IB"), info(0, "Using network AWS Libfabric"),
                    info(0, "NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE ; OOB eth0:10.0.0.1<0>"),
                    info(0, "NET/Socket : Using [0]eth0:10.0.0.1<0>")],
        "init_start": [info(0, "ncclCommInitRank comm 0x5f0 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 1b000 "
                               "commId 0xa1b2 - Init START"),
                       info(0, "Init timings - ncclCommInitRank: rank 0 nranks 2 total 0.51 (kernels 0.20, alloc "
                               "0.01, bootstrap 0.02, allgathers 0.00, topo 0.15, graphs 0.00, connections 0.10, "
                               "rest 0.03)"),
                       info(0, "4 coll channels, 4 collnet channels, 0 nvls channels, 4 p2p channels, "
                               "2 p2p channels per peer"),
                       info(0, "comm 0x5f0 rank 0 nranks 2 cudaDev 0 busId 1b000 - Destroy COMPLETE")],
    }


FR_OUT = Path(__file__).resolve().parent / "nccl" / "flight_recorder"
FR_RANKS, HUNG_RANK = 4, 3


def flight_recorder_dump(rank: int) -> dict[str, object]:
    """One rank's Flight Recorder dump: 12 all_reduces and a send/recv in the default group; rank 3 is
    hung in all_reduce seq 10 (it completed 9; the others enqueued 12)."""
    last = 9 if rank == HUNG_RANK else 12
    entries: list[dict[str, object]] = []
    for seq in range(1, 13):
        state = "completed" if seq <= last else ("started" if seq == last + 1 else "scheduled")
        entry: dict[str, object] = {
            "record_id": seq - 1, "pg_id": 0, "process_group": ["0", "default_pg"], "collective_seq_id": seq,
            "p2p_seq_id": 0, "op_id": seq, "profiling_name": "nccl:all_reduce",
            "time_created_ns": 1_767_225_600_000_000_000 + seq * 10_000_000 + rank * 1_000,
            "input_sizes": [[4096, 1024]], "input_dtypes": ["Float"], "output_sizes": [[4096, 1024]],
            "output_dtypes": ["Float"], "state": state, "retired": state == "completed", "timeout_ms": 600_000,
            "is_p2p": False, "frames": [],
        }
        if state == "completed":
            entry["duration_ms"] = 1.25
            entry["time_discovered_started_ns"] = entry["time_created_ns"]
        entries.append(entry)
    peer = rank ^ 1
    entries.append({
        "record_id": 12, "pg_id": 0, "process_group": ["0", "default_pg"], "collective_seq_id": 0, "p2p_seq_id": 1,
        "op_id": 13, "profiling_name": f"nccl:{'send' if rank % 2 == 0 else 'recv'} "
                                       f"{rank if rank % 2 == 0 else peer}->{peer if rank % 2 == 0 else rank}",
        "time_created_ns": 1_767_225_600_000_000_000, "input_sizes": [[256]], "input_dtypes": ["BFloat16"],
        "output_sizes": [[256]], "output_dtypes": ["BFloat16"], "state": "completed", "is_p2p": True,
        "duration_ms": 0.05, "frames": [],
    })
    return {
        "version": "2.4", "comm_lib_version": "2.21.5", "rank": rank,
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": list(range(FR_RANKS))}},
        "pg_status": {"0": {"last_enqueued_collective": 12, "last_started_collective": min(last + 1, 12),
                            "last_completed_collective": last}},
        "entries": entries,
    }


PROFILER_OUT = Path(__file__).resolve().parent / "nccl" / "profiler_plugin"


def profiler_plugin_dump(rank: int) -> str:
    """The profiler plugin's dump for one rank of a 2-rank communicator: 8 AllReduce COLL begin/end pairs
    (RING/LL128 for small, RING/SIMPLE for large), PROXY events between them, the closing ``{}]``."""
    events: list[dict[str, object]] = []
    for seq in range(8):
        count = 1024 << (2 * seq)
        proto = "LL128" if count < (1 << 20) else "SIMPLE"
        args = {"SeqNum": seq, "CommHash": 4242424242, "Rank": rank, "Count": count, "Datatype": "ncclFloat32",
                "Algorithm": "RING", "Protocol": proto, "nChannels": 2 if proto == "LL128" else 8}
        start = 1000.0 + seq * 500.0 + rank * 3.0
        events.append({"name": "AllReduce", "cat": "COLL", "ph": "b", "id": seq, "pid": 4100 + rank, "tid": 1,
                       "ts": start, "args": args})
        events.append({"name": "ScheduleProxyOp", "cat": "PROXY", "ph": "b", "id": 100 + seq, "pid": 4100 + rank,
                       "tid": 2, "ts": start + 2.0, "args": {"Channel": 0, "Peer": 1 - rank}})
        events.append({"name": "ScheduleProxyOp", "cat": "PROXY", "ph": "e", "id": 100 + seq, "pid": 4100 + rank,
                       "tid": 2, "ts": start + 40.0})
        events.append({"name": "AllReduce", "cat": "COLL", "ph": "e", "id": seq, "pid": 4100 + rank, "tid": 1,
                       "ts": start + 12.5})
    return "[\n" + ",\n".join(json.dumps(e) for e in events) + ",\n{}]\n"


def profiler_plugin_228_dump(rank: int, *, quoted: bool = False) -> str:
    """NCCL 2.28's example plugin dump for one rank of a 2-rank communicator, printed as its C code prints
    it: GROUP_API, COLL_API (``"datatype": ncclFloat32`` and ``"Stream": 0x...`` bare unless ``quoted``),
    KERNEL_LAUNCH, COLL, then a Send/Recv pair via P2P_API and P2P, and the closing ``{}]``."""
    def bare(key: str, value: str) -> str:
        return f'"{key}": "{value}"' if quoted else f'"{key}": {value}'

    pid, ts = 4100 + rank, 1000.0 + rank * 3.0
    stream = "0x7f3a5c001230" if rank == 0 else "(nil)"
    lines = [
        (f'{{"name": "Group API", "cat": "GROUP_API", "ph": "b", "id": 0, "pid": {pid}, "tid": 1, "ts": {ts:f}, '
         '"args": {"groupApiId": 0, "groupDepth": 1}},'),
        (f'{{"name": "AllReduce", "cat": "COLL_API", "ph": "b", "id": 0, "pid": {pid}, "tid": 1, "ts": {ts + 1:f}, '
         f'"args": {{"count": 262144, {bare("datatype", "ncclFloat32")}, "root": 0, "GraphCaptured": 0, '
         f'{bare("Stream", stream)}}}}},'),
        (f'{{"name": "KernelLaunch", "cat": "KERNEL_LAUNCH", "ph": "b", "id": 0, "pid": {pid}, "tid": 1, '
         f'"ts": {ts + 2:f}, "args": {{"groupId": 0, {bare("Stream", stream)}}}}},'),
        (f'{{"name": "AllReduce", "cat": "COLL", "ph": "b", "id": 0, "pid": {pid}, "tid": 1, "ts": {ts + 3:f}, '
         f'"args": {{"SeqNum": 0, "CommHash": 4242424242, "Rank": {rank}, "Count": 262144, '
         '"Datatype": "ncclFloat32", "Algorithm": "RING", "Protocol": "LL128", "nChannels": 2}},'),
        f'{{"name": "AllReduce", "cat": "COLL", "ph": "e", "id": 0, "pid": {pid}, "tid": 1, "ts": {ts + 9:f}}},',
        (f'{{"name": "KernelLaunch", "cat": "KERNEL_LAUNCH", "ph": "e", "id": 0, "pid": {pid}, "tid": 1, '
         f'"ts": {ts + 10:f}}},'),
        f'{{"name": "AllReduce", "cat": "COLL_API", "ph": "e", "id": 0, "pid": {pid}, "tid": 1, "ts": {ts + 11:f}}},',
    ]
    func = "Send" if rank == 0 else "Recv"
    lines += [
        (f'{{"name": "{func}", "cat": "P2P_API", "ph": "b", "id": 0, "pid": {pid}, "tid": 1, "ts": {ts + 20:f}, '
         f'"args": {{"count": 4096, {bare("datatype", "ncclBfloat16")}, "GraphCaptured": 0, '
         f'{bare("Stream", stream)}}}}},'),
        (f'{{"name": "{func}", "cat": "P2P", "ph": "b", "id": 0, "pid": {pid}, "tid": 1, "ts": {ts + 21:f}, '
         f'"args": {{"CommHash": 4242424242, "Rank": {rank}, "Peer": {1 - rank}, "Count": 4096, '
         '"Datatype": "ncclBfloat16", "nChannels": 1}},'),
        f'{{"name": "{func}", "cat": "P2P", "ph": "e", "id": 0, "pid": {pid}, "tid": 1, "ts": {ts + 25:f}}},',
        f'{{"name": "{func}", "cat": "P2P_API", "ph": "e", "id": 0, "pid": {pid}, "tid": 1, "ts": {ts + 26:f}}},',
        f'{{"name": "Group API", "cat": "GROUP_API", "ph": "e", "id": 0, "pid": {pid}, "tid": 1, "ts": {ts + 30:f}}},',
    ]
    return "[\n" + "\n".join(lines) + "\n{}]\n"


def profiler_plugin_ce_dump(rank: int) -> str:
    """NCCL 2.29's example plugin dump with a copy-engine AllGather (``CE_COLL``, GPU timing, and its
    ``CE_SYNC``/``CE_BATCH`` children) after an ordinary COLL AllReduce."""
    pid = 4100 + rank
    coll = profiler_plugin_228_dump(rank, quoted=True).splitlines()[3:5]  # the COLL begin and end
    ce = [
        (f'{{"name": "AllGather", "cat": "CE_COLL", "ph": "b", "id": 0, "pid": {pid}, "tid": 1, "ts": 2000.000000, '
         '"args": {"eventId": 7, "count": 1048576, "datatype": "ncclBfloat16", "strategy": "memcpy", '
         '"start_ts_cpu": 2000.000000, "stop_ts_cpu": 2004.500000, "duration_cpu_us": 4.500000, '
         '"duration_gpu_us": 37}},'),
        (f'{{"name": "CeSync", "cat": "CE_SYNC", "ph": "b", "id": 0, "pid": {pid}, "tid": 1, "ts": 2000.500000, '
         '"args": {"eventId": 8, "type": "Ready", "strategy": "memcpy", "nRanks": 2, "start_ts_cpu": 2000.500000, '
         '"stop_ts_cpu": 2001.000000, "duration_cpu_us": 0.500000, "duration_gpu_us": 3}},'),
        f'{{"name": "CeSync", "cat": "CE_SYNC", "ph": "e", "id": 0, "pid": {pid}, "tid": 1, "ts": 2001.000000}},',
        f'{{"name": "AllGather", "cat": "CE_COLL", "ph": "e", "id": 0, "pid": {pid}, "tid": 1, "ts": 2004.500000}},',
    ]
    return "[\n" + "\n".join(coll + ce) + "\n{}]\n"


def inspector_pretty(rank: int, indent: int = 2) -> str:
    """:func:`inspector_lines` with each record pretty-printed over several lines (as ``jq .`` writes it)."""
    out = []
    for line in inspector_lines(rank).splitlines():
        out.append(json.dumps(json.loads(line), indent=indent) if line.startswith("{") else line)
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    files = {"all_reduce_perf.txt": all_reduce_text(), "all_gather_perf_old.txt": all_gather_old_text(),
             "reduce_scatter_perf.json": reduce_scatter_json()}
    for name, text in files.items():
        (OUT / name).write_text(text, encoding="utf-8")
        print(f"wrote {OUT / name}")
    generate_nccl_tests.OUT.mkdir(parents=True, exist_ok=True)
    for name, make in generate_nccl_tests.FILES.items():  # nccl-tests as users save it
        (generate_nccl_tests.OUT / name).write_text(make(), encoding="utf-8")
        print(f"wrote {generate_nccl_tests.OUT / name}")
    LOG_OUT.mkdir(parents=True, exist_ok=True)
    (LOG_OUT / "train-4ranks.log").write_text(debug_log(), encoding="utf-8")
    print(f"wrote {LOG_OUT / 'train-4ranks.log'}")
    PROFILER_OUT.mkdir(parents=True, exist_ok=True)
    for rank in range(2):
        (PROFILER_OUT / f"nccl_profile_4242424242_{rank}.json").write_text(profiler_plugin_dump(rank),
                                                                          encoding="utf-8")
    print(f"wrote {PROFILER_OUT}/nccl_profile_*.json")
    FR_OUT.mkdir(parents=True, exist_ok=True)
    for rank in range(FR_RANKS):  # JSON for ranks 0-2, the default pickle for rank 3
        dump = flight_recorder_dump(rank)
        if rank == FR_RANKS - 1:
            (FR_OUT / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(dump, protocol=4))
        else:
            (FR_OUT / f"nccl_trace_rank_{rank}.json").write_text(json.dumps(dump, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {FR_OUT}/nccl_trace_rank_*")
    INSPECTOR_OUT.mkdir(parents=True, exist_ok=True)
    for rank in range(INSPECTOR_RANKS):
        path = INSPECTOR_OUT / f"node-a-pid{4100 + rank}.log"
        path.write_text(inspector_lines(rank), encoding="utf-8")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
