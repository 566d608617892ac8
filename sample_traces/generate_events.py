"""The simulation and event output of the Kineto trace generator (``generate.py``).

``_Rank`` simulates one rank (a CPU thread, three CUDA streams, the profiler's id counters) and
formats its events from per-rank text templates into a ``_Sink``, which writes one step at a time
and counts what it wrote; ``_run_step`` advances every rank through a step in lockstep, completing
each collective at the same time on all of them. The ops come from ``generate_catalog``.
Standard library only.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Generator, Iterator
from typing import TYPE_CHECKING, BinaryIO

try:
    from .generate_catalog import (
        _ALLGATHER, _ALLREDUCE, _API, _COMPUTE, _DDP_BWD, _DDP_FWD, _GRAPH_ID, _H2D, _HOST_PID_BASE, _ITEM, _MEMCPY,
        _NCCL, _NCCL_GEOMETRY, _OPTIM, _T0, _TINY_OPS, _US, _ZERO, _Coll, _DevOp, _inputs, _Op)
except ImportError:  # run as a script
    from generate_catalog import (  # type: ignore[no-redef]
        _ALLGATHER, _ALLREDUCE, _API, _COMPUTE, _DDP_BWD, _DDP_FWD, _GRAPH_ID, _H2D, _HOST_PID_BASE, _ITEM, _MEMCPY,
        _NCCL, _NCCL_GEOMETRY, _OPTIM, _T0, _TINY_OPS, _US, _ZERO, _Coll, _DevOp, _inputs, _Op)

if TYPE_CHECKING:
    from .generate import Scenario

# ---------------------------------------------------------------------------
# Output: event text templates and the streaming sink
# ---------------------------------------------------------------------------

_X = ('  {\n    "ph": "X", "cat": "%s", "name": "%s", "pid": %d, "tid": %d,\n'
      '    "ts": %.3f, "dur": %.3f,\n    "args": {\n      %s\n    }\n  }')
# Two-stage templates: the first % fills the static parts, leaving %d/%.3f fields for each event.
_X_TEMPLATE = _X.replace("%.3f", "%%.3f")  # cat, name, pid, tid, args format -> ts, dur, args values
_FLOW_TEMPLATE = ('  {\n    "ph": "%s", "id": %%d, "pid": %d, "tid": %d, "ts": %%.3f,\n'
                  '    "cat": "%s", "name": "%s"%s\n  }')  # ph, pid, tid, cat, cat, bp -> id, ts
_META = '  {\n    "name": "%s", "ph": "M", "ts": %.3f, "pid": %s, "tid": %s,\n    "args": {\n      %s\n    }\n  }'


class _Sink:
    """Collects one step's formatted events, then writes them as one chunk; counts what it wrote."""

    def __init__(self, fh: BinaryIO | None) -> None:
        self.fh = fh
        self.buf: list[str] = []
        self.sep = ""
        self.cats: Counter[str] = Counter()
        self.events = self.nbytes = self.nccl = 0

    def write(self, text: str) -> None:
        data = text.encode()
        if self.fh is not None:
            self.fh.write(data)
        self.nbytes += len(data)

    def add(self, cat: str | None, text: str) -> None:
        self.buf.append(text)
        self.events += 1
        if cat:
            self.cats[cat] += 1

    def flush(self) -> None:
        if self.buf:
            self.write(self.sep + ",\n".join(self.buf))
            self.sep = ",\n"
            self.buf.clear()


def _mix(*parts: int) -> int:
    seed = 0
    for part in parts:
        seed = seed * 1_000_003 + part
    return seed


# ---------------------------------------------------------------------------
# Simulation of one rank
# ---------------------------------------------------------------------------

_Step = Generator[tuple[int, int], int, None]  # yields (arrival, transfer) at each collective


class _Rank:
    """One rank's process: a CPU thread, three CUDA streams and the profiler's id counters.

    Timing is always simulated, identically; events are formatted only for the rank
    being written (``live``), so the other ranks cost little while they pace the collectives.
    """

    def __init__(self, sc: Scenario, rank: int, sink: _Sink | None) -> None:
        self.sc, self.rank = sc, rank
        self.live = sink is not None
        self.sink = sink if sink is not None else _Sink(None)  # never flushed when not live
        self.pid = _HOST_PID_BASE + rank
        self.dev = rank % 8
        self.slow = sc.straggler_slowdown if rank == sc.straggler_rank else 1.0
        self.launch_ns = (8000, 2000) if sc.launch_bound else (4500, 3500)  # launch call: lo, span
        pairs = _TINY_OPS if sc.launch_bound else tuple(zip(_DDP_FWD, _DDP_BWD))
        self.fwd = tuple(fwd for fwd, _ in pairs)  # forward op of layer i: fwd[i % len(fwd)]
        self.bwd = tuple(bwd for _, bwd in pairs)
        self.cpu = _T0 + 200 * _US + rank * 37_117  # profilers start a little apart
        self.free = {_COMPUTE: 0, _MEMCPY: 0, _NCCL: 0}  # when each stream becomes idle
        self.streams: set[int] = set()
        self.rng = random.Random(sc.seed)
        self.rand = self.rng.random
        self.ext = self.corr = self.ev = self.seq = self.py_id = self.pg_seq = 0
        self.gpu_lo, self.gpu_hi = 1 << 62, 0
        self.templates: dict[object, str] = {}
        self.pg_ranks = "[" + ", ".join(map(str, range(sc.ranks))) + "]"

    # -- id counters and emission helpers ---------------------------------

    def _next(self, counter: str) -> int:
        value = getattr(self, counter) + 1
        setattr(self, counter, value)
        return value

    def _dt(self, lo: float, hi: float) -> int:
        """A random CPU/GPU delay between ``lo`` and ``hi`` microseconds, in ns."""
        return int((lo + (hi - lo) * self.rand()) * _US)

    # Events are formatted from per-rank templates: the text of one kind of event with its
    # static parts (names, pids, static args) filled in and %-fields left for ts, dur and ids.

    @staticmethod
    def _template(cat: str, name: str, pid: int, tid: int, args_fmt: str) -> str:
        return _X_TEMPLATE % (cat, name.replace("%", "%%"), pid, tid, args_fmt)

    def _op(self, cat: str, name: str, static: str, ts: int, dur: int, ext: int,
            seq: int | None = None, fwd_thread: int = 0, ev: int | None = None) -> None:
        """A cpu_op or user_annotation with the profiler's usual args."""
        key = (cat, name, static, seq is None, fwd_thread)
        tmpl = self.templates.get(key)
        if tmpl is None:
            fmt = '"External id": %d,"Record function id": %d, '
            if seq is not None:
                fmt += f'"Sequence number": %d, "Fwd thread id": {fwd_thread}, '
            fmt += (static.replace("%", "%%") + ", " if static else "") + '"Ev Idx": %d'
            tmpl = self.templates[key] = self._template(cat, name, self.pid, self.pid, fmt)
        if ev is None:
            self.ev = ev = self.ev + 1
        values = (ext, ext, ev) if seq is None else (ext, ext, seq, ev)
        self.sink.add(cat, tmpl % (ts / _US, dur / _US, *values))

    def _py(self, name: str, ts: int, dur: int, parent: int | None, ident: int, ev: int) -> None:
        tmpl = self.templates.get(("py", name))
        if tmpl is None:
            fmt = '"Python parent id": %s, "Python id": %d, "Ev Idx": %d'
            tmpl = self._template("python_function", name, self.pid, self.pid, fmt)
            self.templates["py", name] = tmpl
        parent_text = "null" if parent is None else parent
        self.sink.add("python_function", tmpl % (ts / _US, dur / _US, parent_text, ident, ev))

    def _flow(self, ph: str, fid: int, pid: int, tid: int, ts: int, cat: str) -> None:
        key = (ph, pid, tid, cat)
        tmpl = self.templates.get(key)
        if tmpl is None:
            bp = ', "bp": "e"' if ph == "f" else ""
            tmpl = self.templates[key] = _FLOW_TEMPLATE % (ph, pid, tid, cat, cat, bp)
        self.sink.add(cat, tmpl % (fid, ts / _US))

    def _device(self, dev: _DevOp, ts: int, dur: int, ext: int, corr: int, extra: str = "") -> None:
        """A kernel, memcpy or memset on ``dev.stream`` of this rank's GPU."""
        tmpl = self.templates.get(dev) if not extra else None
        if tmpl is None:
            tail = dev.tail.replace("%", "%%") or f'"bytes": {dev.nbytes}, "memory bandwidth (GB/s)": %r'
            fmt = ('"External id": %d,      ' + ('"queued": 0, ' if dev.cat == "kernel" else "")
                   + f'"device": {self.dev}, "context": 1,      "stream": {dev.stream}, "correlation": %d,      '
                   + tail + extra.replace("%", "%%"))
            tmpl = self._template(dev.cat, dev.name, self.dev, dev.stream, fmt)
            if not extra:
                self.templates[dev] = tmpl
        values = (ext, corr) if dev.tail else (ext, corr, dev.nbytes / dur)
        self.sink.add(dev.cat, tmpl % (ts / _US, dur / _US, *values))
        self.streams.add(dev.stream)
        self.gpu_lo, self.gpu_hi = min(self.gpu_lo, ts), max(self.gpu_hi, ts + dur)

    def _runtime(self, api: str, ts: int, dur: int, ext: int, corr: int) -> None:
        cat, cbid = _API[api]
        tmpl = self.templates.get(api)
        if tmpl is None:
            fmt = f'"External id": %d,      "cbid": {cbid}, "correlation": %d'
            tmpl = self.templates[api] = self._template(cat, api, self.pid, self.pid, fmt)
        self.sink.add(cat, tmpl % (ts / _US, dur / _US, ext, corr))

    def _begin(self, name: str, cat: str = "user_annotation") -> tuple[str, str, int, int, int]:
        """Open a span on the CPU thread; ``_end`` closes and emits it."""
        ident = self._next("py_id" if cat == "python_function" else "ext")
        frame = (cat, name, self.cpu, ident, self._next("ev"))
        self.cpu += self._dt(1.0, 3.0)
        return frame

    def _end(self, frame: tuple[str, str, int, int, int]) -> None:
        self.cpu += self._dt(1.0, 3.0)
        if not self.live:
            return
        cat, name, start, ident, ev = frame
        if cat == "python_function":
            self._py(name, start, self.cpu - start, None, ident, ev)
        else:
            self._op(cat, name, "", start, self.cpu - start, ident, ev=ev)

    # -- operators and collectives ------------------------------------------

    def _run(self, op: _Op, after: int = 0, seq: int | None = None, py_parent: int = 0) -> int:
        """Run ``op`` on the CPU thread, enqueue its device ops; return when the last one ends."""
        rand, free, ext, corr = self.rand, self.free, self.ext, self.corr  # hot path: locals only
        t = py_start = self.cpu  # delays below are "lo_ns + int(span_ns * rand())"
        if op.py:
            t += 2500 + int(2500 * rand())
        opened = []
        for k, frame in enumerate(op.frames):
            ext += 1
            opened.append((frame, t, ext, seq if k < op.seq_frames else None))
            t += 1500 + int(2500 * rand())
        launch_lo, launch_span = self.launch_ns
        launches, done = [], 0
        for leaf in op.leaves:
            ext += 1
            corr += 1
            dev = leaf.dev
            api_ts = t + 1500 + int(2000 * rand())
            api_dur = launch_lo + int(launch_span * rand())
            start = max(api_ts + 2500 + int(3500 * rand()), free[dev.stream], after)
            scale = self.slow if dev.cat == "kernel" else 1.0
            free[dev.stream] = done = start + int(dev.us * scale * (960 + 80 * rand()))
            leaf_end = api_ts + api_dur + 1000 + int(2000 * rand())
            launches.append((leaf, t, leaf_end - t, ext, api_ts, api_dur, corr, start, done - start))
            t = leaf_end + 1000 + int(2000 * rand())
        ends = []
        for _ in opened:  # innermost frame closes first
            ends.append(t)
            t += 1000 + int(2000 * rand())
        self.cpu = t + (2000 + int(2000 * rand()) if op.py else 8000 + int(12000 * rand()))
        self.ext, self.corr = ext, corr
        if not self.live:
            return done
        if op.py:
            self._py(op.py, py_start, t - py_start, py_parent, self._next("py_id"), self._next("ev"))
        fwd_thread = int(op.flow == "f")
        for k, (((cat, name, static), start, ext, sq), end) in enumerate(zip(opened, reversed(ends))):
            self._op(cat, name, static, start, end - start, ext, sq, fwd_thread)
            if sq is not None and k == op.seq_frames - 1 and op.flow:
                self._flow(op.flow, sq, self.pid, self.pid, start, "fwdbwd")
        leaf_seq = seq if op.seq_frames > len(op.frames) else None  # a frameless op is sequenced itself
        for leaf, start, dur, ext, api_ts, api_dur, corr, g_start, g_dur in launches:
            self._op("cpu_op", leaf.name, leaf.static, start, dur, ext, leaf_seq, fwd_thread)
            if leaf_seq is not None and op.flow:
                self._flow(op.flow, leaf_seq, self.pid, self.pid, start, "fwdbwd")
                leaf_seq = None
            self._runtime(leaf.api, api_ts, api_dur, ext, corr)
            self._flow("s", corr, self.pid, self.pid, api_ts, "ac2g")
            self._device(leaf.dev, g_start, g_dur, ext, corr)
            self._flow("f", corr, self.dev, leaf.dev.stream, g_start, "ac2g")
        return done

    def _graph(self, ops: list[_Op], after: int) -> int:
        """Replay the kernels of ``ops`` as one captured CUDA graph; return when the last one ends.

        One cpu_op (``CUDAGraph.replay``) calls ``cudaGraphLaunch`` once; every kernel carries its
        correlation, back to back on the compute stream with the short gaps of graph scheduling.
        """
        rand, free = self.rand, self.free
        start_cpu = self.cpu
        ext, corr = self._next("ext"), self._next("corr")
        api_ts = start_cpu + 1500 + int(2000 * rand())
        api_dur = 6000 + int(4000 * rand())  # one call for the whole graph
        start = max(api_ts + 3000 + int(3000 * rand()), free[_COMPUTE], after)
        nodes = []
        for node, dev in enumerate((leaf.dev for op in ops for leaf in op.leaves if leaf.dev.cat == "kernel"), 1):
            dur = int(dev.us * self.slow * (960 + 80 * rand()))
            nodes.append((dev, start, dur, node))
            start += dur + 500 + int(1500 * rand())  # the graph's own scheduling gap between dependent nodes
        done = nodes[-1][1] + nodes[-1][2] if nodes else start
        free[_COMPUTE] = max(free[_COMPUTE], done)
        end = api_ts + api_dur + 1000 + int(2000 * rand())
        self.cpu = end + 8000 + int(12000 * rand())
        if not self.live:
            return done
        self._op("cpu_op", "CUDAGraph.replay", "", start_cpu, end - start_cpu, ext)
        self._runtime("cudaGraphLaunch", api_ts, api_dur, ext, corr)
        self._flow("s", corr, self.pid, self.pid, api_ts, "ac2g")
        for dev, ts, dur, node in nodes:
            self._device(dev, ts, dur, ext, corr,
                         extra=f', "graph id": {_GRAPH_ID}, "graph node id": {(_GRAPH_ID << 32) | node}')
        if nodes:
            self._flow("f", corr, self.dev, nodes[0][0].stream, nodes[0][1], "ac2g")
        return done

    def _collective(self, c: _Coll, ready: int) -> Generator[tuple[int, int], int, int]:
        """Issue ``c`` once the compute stream reached ``ready``; return its (global) end time."""
        dt, world = self._dt, self.sc.ranks
        seq = self._next("pg_seq")
        t_op = self.cpu
        t_rpc = t_op + dt(4.0, 8.0)
        t_rec = t_rpc + dt(5.0, 10.0)  # ProcessGroupNCCL::syncStream: record + wait event
        rec_dur, wait_dur = dt(2.0, 4.0), dt(1.5, 3.0)
        t_wait = t_rec + rec_dur + dt(0.5, 1.5)
        t_ann = t_wait + wait_dur + dt(2.0, 5.0)
        t_api = t_ann + dt(3.0, 6.0)
        api_dur = dt(7.0, 12.0)
        ann_end = t_api + api_dur + dt(2.0, 4.0)
        rpc_end = ann_end + dt(3.0, 8.0)
        op_end = rpc_end + dt(2.0, 5.0)
        self.cpu = op_end + dt(8.0, 15.0)
        start = max(t_api + dt(4.0, 8.0), self.free[_NCCL], ready)
        jitter = random.Random(_mix(self.sc.seed, seq)).uniform(0.97, 1.08)  # same on every rank
        end = yield start, int(c.transfer_ns(world, self.sc.busbw_gbps) * jitter)
        self.free[_NCCL] = end
        if not self.live:
            return end
        e_op, e_rpc, e_ann = self._next("ext"), self._next("ext"), self._next("ext")
        out = c.out_nelems(world)
        common = (f'"Collective name": "{c.coll}", "dtype": "BFloat16", "In msg nelems": {c.nelems}, '
                  f'"Out msg nelems": {out}, "In split size": "[]", "Out split size": "[]", ')
        group = (f'"Group size": {world}, "Process Group Name": "0", "Process Group Description": "default_pg", '
                 f'"Process Group Ranks": "{self.pg_ranks}"')
        self._op("cpu_op", c.op, "", t_op, op_end - t_op, e_op)
        args = (f'"External id": {e_rpc},"Record function id": {e_rpc}, "Ev Idx": {self._next("ev")}, {common}'
                f'"Global rank start": 0, "Global rank stride": 1, {group}, "Rank": {self.rank}, "Seq": {seq}')
        kernel_name, kernel_args, annotation = c.kernel, f", {common}{group}, \"Seq\": {seq}", ""
        if not self.sc.comm_metadata:  # PyTorch <= 2.0: shapes only, old kernel names
            args = (f'"External id": {e_rpc}, "Ev Idx": {self._next("ev")}, "Input Dims": [[], [], [], [], [], [], '
                    '[]], "Input type": ["TensorList", "Scalar", "Scalar", "Scalar", "", "", ""]')
            kernel_name, kernel_args = _old_kernel_name(c.kernel), ""
            annotation = _inputs((c.nelems,))
        self.sink.add("cpu_op", _X % ("cpu_op", "record_param_comms", self.pid, self.pid, t_rpc / _US,
                                      (rpc_end - t_rpc) / _US, args))
        self._runtime("cudaEventRecord", t_rec, rec_dur, e_rpc, self._next("corr"))
        self._runtime("cudaStreamWaitEvent", t_wait, wait_dur, e_rpc, self._next("corr"))
        self._op("user_annotation", c.annotation, annotation, t_ann, ann_end - t_ann, e_ann)
        corr = self._next("corr")
        self._runtime("cudaLaunchKernelExC", t_api, api_dur, e_ann, corr)
        self._flow("s", corr, self.pid, self.pid, t_api, "ac2g")
        kernel = _DevOp("kernel", kernel_name, 0.0, stream=_NCCL, tail=_NCCL_GEOMETRY)
        self._device(kernel, start, end - start, e_ann, corr, kernel_args)
        self._flow("f", corr, self.dev, _NCCL, start, "ac2g")
        self.sink.nccl += 1
        return end

    # -- one training step ----------------------------------------------------

    def step(self, n: int) -> _Step:
        """ProfilerStep#n: data, all-gather, forward, backward with bucketed all-reduce, optimizer, sync."""
        sc, live = self.sc, self.live
        self.rng = random.Random(_mix(sc.seed, self.rank, n))
        self.rand, dt = self.rng.random, self._dt
        profiler_step = self._begin(f"ProfilerStep#{n}")
        self.gpu_lo, self.gpu_hi = 1 << 62, 0
        py = self._begin("train.py(58): train_step", "python_function") if sc.launch_bound else None
        loader = self._begin("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__")
        stall = sc.straggler_delay_us if self.rank == sc.straggler_rank else 0.0
        self.cpu += dt(120.0, 220.0) + int(stall * _US)
        self._end(loader)
        ready = self._run(_H2D)
        zero = self._begin("Optimizer.zero_grad#AdamW.zero_grad")
        ready = max(ready, self._run(_ZERO))
        self._end(zero)
        if sc.ranks > 1:  # parameters are gathered before the forward may start
            ready = yield from self._collective(_ALLGATHER, ready)
        forward = self._begin("DistributedDataParallel.forward" if sc.ranks > 1 else "## forward ##")
        seqs = []
        if sc.cuda_graph:
            seqs = [self._next("seq") for _ in range(sc.layers)]
            self._graph([self.fwd[i % len(self.fwd)] for i in range(sc.layers)], after=ready)
        for i in range(0 if sc.cuda_graph else sc.layers):
            seqs.append(self._next("seq"))
            self._run(self.fwd[i % len(self.fwd)], after=ready, seq=seqs[-1], py_parent=py[3] if py else 0)
        self._end(forward)
        backward = self._begin("## backward ##")
        cuts = {round(sc.layers * (b + 1) / sc.buckets) for b in range(sc.buckets)}
        grads_done = 0
        for j, i in enumerate(reversed(range(sc.layers))):
            grad = self._run(self.bwd[i % len(self.bwd)], seq=seqs[i])
            if sc.ranks > 1 and j + 1 in cuts:  # a bucket of gradients is ready: all-reduce it
                bucket = _ALLREDUCE[sorted(cuts).index(j + 1) % len(_ALLREDUCE)]
                grads_done = yield from self._collective(bucket, grad)
        self._end(backward)
        optimizer = self._begin("Optimizer.step#AdamW.step")
        for op in _OPTIM:  # the compute stream waits for the last all-reduce
            self._run(op, after=grads_done)
        self._end(optimizer)
        copied = self._run(_ITEM)  # loss.item(): copy to host, then block until the GPU is done
        sync_ts, corr = self.cpu, self._next("corr")
        self.cpu = max(sync_ts + dt(3.0, 6.0), copied + dt(2.0, 5.0))
        if live:
            self._runtime("cudaStreamSynchronize", sync_ts, self.cpu - sync_ts, self.ext, corr)
        self.cpu += dt(10.0, 30.0)
        if py:
            self._end(py)
        self._end(profiler_step)
        if live:
            self.sink.add("gpu_user_annotation", _X % (
                "gpu_user_annotation", f"ProfilerStep#{n}", self.dev, _COMPUTE, self.gpu_lo / _US,
                (self.gpu_hi - self.gpu_lo) / _US, f'"External id": {profiler_step[3]}'))
        self.cpu += dt(30.0, 80.0)

    def trailer(self) -> Iterator[tuple[str | None, str]]:
        """Kineto's closing events: process/thread metadata, the profiler span and instants."""
        begin, end = _T0 / _US, max(self.cpu, *self.free.values()) / _US + 50.0
        process = "python3.11"
        for pid, name, label, order in ((self.pid, process, "CPU", self.pid),
                                        (self.dev, process, f"GPU {self.dev}", 16777216 + self.dev)):
            yield None, _META % ("process_name", begin, pid, 0, f'"name": "{name}"')
            yield None, _META % ("process_labels", begin, pid, 0, f'"labels": "{label}"')
            yield None, _META % ("process_sort_index", begin, pid, 0, f'"sort_index": {order}')
        threads = [(self.pid, self.pid, f"thread {self.pid} (pt_main_thread)", self.pid)]
        threads += [(self.dev, s, f"stream {s} ", s) for s in sorted(self.streams)]
        for pid, tid, name, order in threads:
            yield None, _META % ("thread_name", begin, pid, tid, f'"name": "{name}"')
            yield None, _META % ("thread_sort_index", begin, pid, tid, f'"sort_index": {order}')
        yield "Trace", (f'  {{\n    "ph": "X", "cat": "Trace", "ts": {begin:.3f}, "dur": {end - begin:.3f},\n'
                        '    "pid": "Spans", "tid": "PyTorch Profiler",\n    "name": "PyTorch Profiler (0)",\n'
                        '    "args": {\n      "Op count": 0\n    }\n  }')
        yield None, _META % ("process_sort_index", begin, '"Spans"', 0, '"sort_index": 536870912')
        for name, pid, tid, ts in (("Iteration Start: PyTorch Profiler", "Traces", "Trace PyTorch Profiler", begin),
                                   ("Record Window End", "", "", end)):
            yield None, (f'  {{\n    "name": "{name}", "ph": "i", "s": "g",\n'
                         f'    "pid": "{pid}", "tid": "{tid}", "ts": {ts:.3f}\n  }}')


def _run_step(ranks: list[_Rank], n: int) -> None:
    """Advance every rank through step ``n`` in lockstep, completing each collective globally."""
    steps = [rank.step(n) for rank in ranks]

    def advance(step: _Step, value: int | None) -> tuple[int, int] | None:
        try:
            return step.send(value)
        except StopIteration:
            return None

    pending = [advance(s, None) for s in steps]
    while pending[0] is not None:
        end = max(arrival for arrival, _ in pending) + pending[0][1]
        pending = [advance(s, end) for s in steps]


def _old_kernel_name(kernel: str) -> str:
    """``ncclDevKernel_AllReduce_Sum_bf16_RING_LL(...)`` as NCCL 2.7 to 2.18 named it: ``ncclKernel_AllReduce_RING_LL_Sum_...``."""
    op = kernel.split("(")[0].split("_")[1]
    return f"ncclKernel_{op}_RING_LL_Sum_{'__nv_bfloat16' if op == 'AllReduce' else 'int8_t'}(ncclWorkElem)"
