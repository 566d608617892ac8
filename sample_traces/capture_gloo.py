"""Capture real multi-rank PyTorch profiler (Kineto) traces on CPU, with the gloo backend.

What it makes: one folder per scenario under ``sample_traces/pytorch_gloo/<scenario>/``,
holding ``rank{r}.pt.trace.json.gz`` per rank (Chrome trace JSON exported by
``torch.profiler``, gzipped with ``mtime=0``). Unlike ``generate.py`` these are *real*
traces: the timings come from the machine they were captured on, so a rerun writes
different files (same shape, same event names, different ``ts``/``dur``).

Scenarios (each spawns its ranks with ``torch.multiprocessing.spawn``, MASTER_ADDR
127.0.0.1 and a free port, ``init_process_group("gloo")``, one intra-op thread per rank):

- ``ddp``: 2 ranks, a 3-layer MLP under DistributedDataParallel (small buckets, so
  several allreduces per step). Rank 1 is the straggler: its forward sleeps 15 ms and
  runs 8 extra 256x256 matmuls, so rank 0 waits in the gradient allreduces.
- ``pipeline``: 4 stages, one per rank (3 Linear+ReLU stages, then Linear+ReLU+Linear),
  with ``torch.distributed.pipelining`` (``PipelineStage`` + ``Schedule1F1B``,
  4 microbatches of 4 samples). The stage-to-stage
  activations (forward, rank r -> r+1) and gradients (backward, r+1 -> r) travel as gloo
  P2P send/recv (the schedule posts them with ``dist.isend``/``dist.irecv``, through
  ``batch_isend_irecv`` where sends and receives mix); the last stage computes the
  cross-entropy loss.
  The API works on CPU/gloo in the torch version below, so there is no hand-written
  fallback.
- ``fsdp``: 2 ranks, FSDP2 (``torch.distributed.fsdp.fully_shard``) on a 3-layer MLP,
  each Linear sharded, on a 1-D CPU device mesh: all-gathers of the parameters in forward
  and backward, reduce-scatters of the gradients (gloo runs ``_reduce_scatter_base_`` as
  a full all-reduce: the trace shows ``gloo:all_reduce`` under it).
- ``hybrid``: 4 ranks, 2 pipeline stages x 2 data-parallel replicas written by hand
  (``dist.isend``/``irecv``/``send``/``recv`` between the stages on the default group,
  then a gradient all-reduce in the stage's own subgroup ``new_group([0, 1])`` or
  ``new_group([2, 3])``: two process groups per rank). Rank 3 is the straggler (sleep +
  extra matmuls), so rank 2 waits in the subgroup all-reduce, rank 1 waits for its
  gradients from rank 3, and rank 0 waits in the all-reduce with rank 1.

Every rank profiles with ``activities=[CPU]``, ``record_shapes=True``, ``with_stack=False``
and ``schedule(wait=1, warmup=1, active=3, repeat=1)`` over 5 iterations, calling
``prof.step()`` after each, so each trace holds ``ProfilerStep#2``..``#4`` (the three
active steps). Seeded: the model with ``torch.manual_seed(0)`` (``hybrid``: the stage
index), the data with a generator seeded ``1000 + rank`` (``pipeline``: 1000 on every
rank; ``hybrid``: ``1000 + replica``); timings still vary from run to run.

Run (from the repository root; it takes well under a minute on 2 cores)::

    python3 -m venv /tmp/torchvenv      # a venv of its own: torch is not a tracelake dependency
    /tmp/torchvenv/bin/pip install torch --index-url https://download.pytorch.org/whl/cpu
    # (where only PyPI is reachable: `pip install "torch==2.13.0+cpu"` from a wheel mirror,
    #  or plain `pip install torch`, which also pulls the CUDA libraries it does not need here)
    /tmp/torchvenv/bin/python sample_traces/capture_gloo.py                  # every scenario
    /tmp/torchvenv/bin/python sample_traces/capture_gloo.py --scenario ddp --out /tmp/x

Captured with torch 2.13.0+cpu (Python 3.11.7, Linux x86_64, 2 cores), about 30 s for all
four scenarios. This script is not imported by the package or its tests; the traces it
wrote are described in sample_traces/README.md and docs/formats.md ("Distributed CPU
traces (gloo)").
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "pytorch_gloo"
ITERATIONS = 5  # wait 1 + warmup 1 + active 3
SCENARIOS = ("ddp", "pipeline", "fsdp", "hybrid")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gzip_file(path: Path) -> Path:
    """``path`` -> ``path.gz`` (mtime 0, no file name in the header); the plain file is removed."""
    target = path.with_name(path.name + ".gz")
    with open(path, "rb") as src, open(target, "wb") as raw:
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as dst:
            shutil.copyfileobj(src, dst)
    path.unlink()
    return target


def make_profiler(out: Path, rank: int) -> torch.profiler.profile:
    def on_trace_ready(prof: torch.profiler.profile) -> None:
        path = out / f"rank{rank}.pt.trace.json"
        prof.export_chrome_trace(str(path))
        gzip_file(path)

    return torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        record_shapes=True,
        with_stack=False,
        schedule=torch.profiler.schedule(wait=1, warmup=1, active=3, repeat=1),
        on_trace_ready=on_trace_ready,
    )


class MLP(nn.Module):
    def __init__(self, slow: bool = False) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, 256)
        self.fc2 = nn.Linear(256, 256)
        self.fc3 = nn.Linear(256, 10)
        self.slow = slow
        self.register_buffer("extra", torch.randn(256, 256), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(x))
        if self.slow:  # the straggler: host sleep + extra compute
            with torch.profiler.record_function("straggler_delay"):
                time.sleep(0.015)
                y = h
                for _ in range(8):
                    y = torch.tanh(y @ self.extra)
                h = h + 0.0 * y
        h = torch.relu(self.fc2(h))
        return self.fc3(h)


def train_mlp(model: nn.Module, opt: torch.optim.Optimizer, rank: int, out: Path) -> None:
    """The profiled loop of ``ddp`` and ``fsdp``: batches of 32 x 64 floats seeded ``1000 + rank``."""
    gen = torch.Generator().manual_seed(1000 + rank)
    with make_profiler(out, rank) as prof:
        for _ in range(ITERATIONS):
            x = torch.randn(32, 64, generator=gen)
            y = torch.randint(0, 10, (32,), generator=gen)
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            prof.step()


def run_ddp(rank: int, world: int, out: Path) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(MLP(slow=(rank == 1)), bucket_cap_mb=0.1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    train_mlp(model, opt, rank, out)


def run_pipeline(rank: int, world: int, out: Path) -> None:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    torch.manual_seed(0)
    stages = [nn.Sequential(nn.Linear(32 if i == 0 else 128, 128), nn.ReLU()) for i in range(world - 1)]
    stages.append(nn.Sequential(nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10)))
    module = stages[rank]
    microbatches, mb_size = 4, 4
    stage = PipelineStage(module, rank, world, torch.device("cpu"),
                          input_args=torch.empty(mb_size, 32 if rank == 0 else 128))
    schedule = Schedule1F1B(stage, n_microbatches=microbatches, loss_fn=nn.functional.cross_entropy)
    opt = torch.optim.SGD(module.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(1000)  # same data on both ranks: the first feeds x, the last y
    with make_profiler(out, rank) as prof:
        for _ in range(ITERATIONS):
            x = torch.randn(microbatches * mb_size, 32, generator=gen)
            y = torch.randint(0, 10, (microbatches * mb_size,), generator=gen)
            opt.zero_grad()
            if rank == 0:
                schedule.step(x)
            else:
                losses: list[torch.Tensor] = []
                schedule.step(target=y, losses=losses)
            opt.step()
            prof.step()


def run_fsdp(rank: int, world: int, out: Path) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (world,))
    model = MLP()
    for layer in (model.fc1, model.fc2, model.fc3):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    train_mlp(model, opt, rank, out)


def run_hybrid(rank: int, world: int, out: Path) -> None:
    """2 pipeline stages x 2 data-parallel replicas, by hand: ranks 0, 1 run stage 0, ranks 2, 3 stage 1.

    Stage 0 of replica r is rank r, stage 1 is rank r + 2: activations go r -> r + 2 and
    gradients r + 2 -> r with ``dist.isend``/``dist.irecv`` on the default group (2
    microbatches, GPipe order). Then each stage all-reduces its gradients in its own
    subgroup (``new_group([0, 1])`` or ``new_group([2, 3])``), so every rank has two process
    groups. Rank 3 is slow (sleep + extra matmuls in its forward): rank 2 waits for it in
    the subgroup all-reduce, and rank 1 waits for its gradients.
    """
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank creates both, in order
    stage, replica = divmod(rank, 2)
    dp_group = groups[stage]
    torch.manual_seed(stage)
    if stage == 0:
        module: nn.Module = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU())
        peer = rank + 2
    else:
        module = nn.Sequential(nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))
        peer = rank - 2
    extra = torch.randn(128, 128)
    opt = torch.optim.SGD(module.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(1000 + replica)  # a replica's two stages see the same batch
    microbatches, mb_size = 2, 8
    with make_profiler(out, rank) as prof:
        for _ in range(ITERATIONS):
            x = torch.randn(microbatches, mb_size, 32, generator=gen)
            y = torch.randint(0, 10, (microbatches, mb_size), generator=gen)
            opt.zero_grad()
            if stage == 0:
                outputs = [module(x[m]) for m in range(microbatches)]
                sends = [dist.isend(o.detach(), peer) for o in outputs]
                grads = [torch.empty_like(o) for o in outputs]
                recvs = [dist.irecv(g, peer) for g in grads]
                for work in sends + recvs:
                    work.wait()
                torch.autograd.backward(outputs, grads)
            else:
                acts = [torch.empty(mb_size, 128) for _ in range(microbatches)]
                for a in acts:
                    dist.recv(a, peer)
                    a.requires_grad_()
                losses = []
                for m, a in enumerate(acts):
                    h = a
                    if rank == 3:  # the straggler
                        with torch.profiler.record_function("straggler_delay"):
                            time.sleep(0.01)
                            for _ in range(8):
                                h = torch.tanh(h @ extra)
                            h = a + 0.0 * h
                    losses.append(nn.functional.cross_entropy(module(h), y[m]))
                torch.stack(losses).sum().backward()
                for a in acts:
                    dist.send(a.grad, peer)
            flat = torch.cat([p.grad.reshape(-1) for p in module.parameters()])
            dist.all_reduce(flat, group=dp_group)
            offset = 0
            for p in module.parameters():
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad) / 2)
                offset += p.numel()
            opt.step()
            prof.step()


RUNNERS = {"ddp": run_ddp, "pipeline": run_pipeline, "fsdp": run_fsdp, "hybrid": run_hybrid}
WORLD = {"ddp": 2, "pipeline": 4, "fsdp": 2, "hybrid": 4}


def worker(rank: int, world: int, port: int, scenario: str, out: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        RUNNERS[scenario](rank, world, Path(out))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def capture(scenario: str, out_root: Path) -> Path:
    world = WORLD[scenario]
    out = out_root / scenario
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("rank*.pt.trace.json*"):
        old.unlink()
    mp.spawn(worker, args=(world, free_port(), scenario, str(out)), nprocs=world, join=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=(*SCENARIOS, "all"), default="all")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="root folder (default: %(default)s)")
    args = parser.parse_args(argv)
    for name in SCENARIOS if args.scenario == "all" else (args.scenario,):
        start = time.perf_counter()
        out = capture(name, args.out)
        files = sorted(out.glob("rank*.pt.trace.json.gz"))
        sizes = ", ".join(f"{p.name} {p.stat().st_size / 1024:.0f} KiB" for p in files)
        print(f"{name}: {time.perf_counter() - start:.1f} s, {sizes}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
