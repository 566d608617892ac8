"""Capture real GPU traces on one NVIDIA GPU: PyTorch profiler (Kineto), CUDA graphs, torch.compile, memory, NCCL, JAX.

What it makes, one folder per part under ``--out`` (each part runs in a process of its own, with a
time limit, so one that fails or hangs costs only itself):

- ``train``: a 6-layer GPT (d=1024, 16 heads, T=1024, batch 8, vocabulary 8192) trained with AdamW
  under bf16 autocast, causal ``scaled_dot_product_attention`` (flash attention kernels). Profiled
  with CPU+CUDA, ``record_shapes``, ``profile_memory``, ``with_stack``, ``with_flops``,
  ``with_modules`` over ``schedule(wait=2, warmup=2, active=3)``: ``train.pt.trace.json.gz``; the
  profiler's memory timeline (``memory_timeline.raw.json.gz``: [time, action, bytes, category]); the
  caching allocator's history as a snapshot pickle (``memory_snapshot.pickle.gz``).
- ``conv``: torchvision ResNet-18, batch 64 at 224x224, channels-last, bf16 autocast, SGD:
  convolution forward and backward kernels with shapes (``conv.pt.trace.json.gz``).
- ``graphs``: a 4-layer MLP's whole training step (forward, backward, SGD) captured once as a CUDA
  graph and replayed, with eager work around it (``graphs.pt.trace.json.gz``).
- ``compile``: a 2-layer GPT under ``torch.compile`` (Triton kernels, compiled regions)
  (``compile.pt.trace.json.gz``).
- ``nccl``: one-rank NCCL process group: all-reduce, all-gather, reduce-scatter, broadcast from 4 KB
  to 64 MB, with ``NCCL_DEBUG=INFO`` (``nccl.<host>.<pid>.log``), the Flight Recorder's dump
  (``flight_recorder.pickle``) and the Kineto trace (``nccl.pt.trace.json.gz``). One GPU only: NCCL
  refuses two ranks on one device, so multi-rank traffic is the ``ddp`` part's, over gloo.
- ``ddp``: 2 ranks sharing the one GPU, DistributedDataParallel over gloo with CUDA tensors, rank 1
  the straggler (extra matmuls): ``rank{0,1}.pt.trace.json.gz``.
- ``leak``: a 2-layer MLP that keeps 32 MB of every step's output (a leak), empties the allocator's
  cache each step (``cudaMalloc``/``cudaFree`` inside steps) and ends with one allocation too large
  for the device (an ``[OutOfMemory]`` event): ``leak.pt.trace.json.gz``, ``leak_snapshot.pickle.gz``.
- ``jax``: a jitted 4-layer MLP training step on the GPU, 8 steps under
  ``jax.profiler.StepTraceAnnotation``, in ``jax.profiler.trace``: ``jax.xplane.pb``.

``manifest.json`` records the GPU, the versions and each part's status and seconds. Run on a machine
with one NVIDIA GPU, PyTorch with CUDA, torchvision and JAX with CUDA (not tracelake dependencies)::

    python3 sample_traces/capture_gpu.py --out /tmp/gpu        # every part
    python3 sample_traces/capture_gpu.py --part train --out /tmp/gpu

``--device cpu`` runs the PyTorch parts on the CPU (a dry run of the script itself). This script is
not imported by the package or its tests; the traces it wrote are described in
sample_traces/README.md.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

PARTS = ("train", "graphs", "jax", "nccl", "conv", "ddp", "compile", "leak")
LIMITS_S = {"train": 100, "graphs": 60, "jax": 90, "nccl": 60, "conv": 60, "ddp": 90, "compile": 110, "leak": 60}


def gzip_file(path: Path) -> Path:
    """``path`` -> ``path.gz`` (mtime 0); the plain file is removed."""
    target = path.with_name(path.name + ".gz")
    with open(path, "rb") as src, open(target, "wb") as raw:
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6) as dst:
            shutil.copyfileobj(src, dst)
    path.unlink()
    return target


def profiler(out: Path, name: str, device: str, *, memory: bool = True, stack: bool = True,
             active: int = 3, extra: Callable[[Any], None] | None = None) -> Any:
    import torch

    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)

    def ready(prof: Any) -> None:
        path = out / f"{name}.pt.trace.json"
        prof.export_chrome_trace(str(path))
        gzip_file(path)
        if extra is not None:
            extra(prof)

    return torch.profiler.profile(
        activities=activities, record_shapes=True, profile_memory=memory, with_stack=stack,
        with_flops=True, with_modules=stack,
        schedule=torch.profiler.schedule(wait=2, warmup=2, active=active, repeat=1), on_trace_ready=ready)


def gpt(layers: int, d: int = 1024, heads: int = 16, vocab: int = 8192) -> Any:
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(vocab, d)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln = nn.LayerNorm(d)
            self.head = nn.Linear(d, vocab, bias=False)

        def forward(self, idx: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            x = self.emb(idx)
            for block in self.blocks:
                x = block(x)
            logits = self.head(self.ln(x))
            return F.cross_entropy(logits.flatten(0, 1).float(), target.flatten())

    return GPT()


def autocast(device: str) -> Any:
    import torch

    return torch.autocast(device_type=device, dtype=torch.bfloat16)


def part_train(out: Path, device: str) -> None:
    import torch

    torch.manual_seed(0)
    model = gpt(6).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=(device == "cuda"))
    batch, seq = (8, 1024) if device == "cuda" else (1, 64)
    gen = torch.Generator(device=device).manual_seed(1)
    if device == "cuda":
        torch.cuda.memory._record_memory_history(max_entries=40000)

    def memory_files(prof: Any) -> None:
        started = time.monotonic()
        prof.export_memory_timeline(str(out / "memory_timeline.raw.json.gz"),
                                    device="cuda:0" if device == "cuda" else "cpu")
        print(f"  memory timeline exported in {time.monotonic() - started:.1f}s", flush=True)

    with profiler(out, "train", device, extra=memory_files) as prof:
        for _ in range(7):
            idx = torch.randint(0, 8192, (batch, seq), device=device, generator=gen)
            with autocast(device):
                loss = model(idx, idx.roll(-1, dims=1))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            prof.step()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.memory._dump_snapshot(str(out / "memory_snapshot.pickle"))
        torch.cuda.memory._record_memory_history(enabled=None)
        gzip_file(out / "memory_snapshot.pickle")


def part_conv(out: Path, device: str) -> None:
    import torch
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=1000).to(device).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    batch = 64 if device == "cuda" else 2
    with profiler(out, "conv", device, memory=False, stack=False) as prof:
        for _ in range(7):
            x = torch.randn(batch, 3, 224, 224, device=device).to(memory_format=torch.channels_last)
            y = torch.randint(0, 1000, (batch,), device=device)
            with autocast(device):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            prof.step()


def part_graphs(out: Path, device: str) -> None:
    import torch
    from torch import nn

    if device != "cuda":
        print("  graphs: CUDA only, skipped on the CPU")
        return
    torch.manual_seed(0)
    model = nn.Sequential(*(m for _ in range(4) for m in (nn.Linear(2048, 2048), nn.ReLU()))).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    static_x = torch.randn(256, 2048, device="cuda")
    static_y = torch.randn(256, 2048, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            nn.functional.mse_loss(model(static_x), static_y).backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = nn.functional.mse_loss(model(static_x), static_y)
        static_loss.backward()
        opt.step()
    with profiler(out, "graphs", device, memory=False, stack=False, active=4) as prof:
        for step in range(8):
            static_x.copy_(torch.randn(256, 2048, device="cuda"))
            graph.replay()
            total = static_loss.item()  # a host sync each step, as a training loop's logging does
            _ = total + step
            prof.step()


def part_compile(out: Path, device: str) -> None:
    import torch

    torch.manual_seed(0)
    model = gpt(2).to(device)
    compiled = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch, seq = (8, 1024) if device == "cuda" else (1, 64)
    started = time.monotonic()
    for _ in range(2):  # compile outside the profiled window
        idx = torch.randint(0, 8192, (batch, seq), device=device)
        with autocast(device):
            compiled(idx, idx.roll(-1, dims=1)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    print(f"  compiled in {time.monotonic() - started:.1f}s", flush=True)
    with profiler(out, "compile", device, memory=False, stack=False) as prof:
        for _ in range(7):
            idx = torch.randint(0, 8192, (batch, seq), device=device)
            with autocast(device):
                loss = compiled(idx, idx.roll(-1, dims=1))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            prof.step()


def part_leak(out: Path, device: str) -> None:
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4096, 4096), nn.GELU(), nn.Linear(4096, 4096)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    kept: list[Any] = []
    if device == "cuda":
        torch.cuda.memory._record_memory_history(max_entries=20000)
    with profiler(out, "leak", device, stack=False, active=5) as prof:
        for step in range(9):
            out_t = model(torch.randn(2048, 4096, device=device))
            kept.append(out_t.detach().clone())  # the leak: 32 MB of fp32 kept per step
            out_t.square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if device == "cuda":
                torch.cuda.empty_cache()  # the churn: cached blocks go back, the next step cudaMallocs again
            if step == 8:  # one failed allocation in the last profiled step: an [OutOfMemory] event
                try:
                    torch.empty(1 << 48, dtype=torch.uint8, device=device)
                except (RuntimeError, MemoryError) as exc:
                    print(f"  expected out of memory: {str(exc).splitlines()[0][:100]}", flush=True)
            prof.step()
    if device == "cuda":
        torch.cuda.memory._dump_snapshot(str(out / "leak_snapshot.pickle"))
        gzip_file(out / "leak_snapshot.pickle")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def part_nccl(out: Path, device: str) -> None:
    import torch
    import torch.distributed as dist

    if device != "cuda":
        print("  nccl: CUDA only, skipped on the CPU")
        return
    os.environ.update({
        "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,COLL,NET,GRAPH,ENV,TUNING",
        "NCCL_DEBUG_FILE": str(out / "nccl.%h.%p.log"), "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"})
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                            device_id=torch.device("cuda:0"))
    sizes = [1 << n for n in range(12, 27, 2)]  # 4 KB .. 64 MB
    with profiler(out, "nccl", device, memory=False, stack=False, active=2) as prof:
        for _ in range(6):
            for size in sizes:
                t = torch.ones(size // 4, device="cuda")
                dist.all_reduce(t)
                gathered = torch.empty(size // 4, device="cuda")
                dist.all_gather_into_tensor(gathered, t)
                dist.reduce_scatter_tensor(t, gathered)
                dist.broadcast(t, 0)
            torch.cuda.synchronize()
            prof.step()
    dump = getattr(torch._C._distributed_c10d, "_dump_nccl_trace", None)
    if dump is not None:
        (out / "flight_recorder.pickle").write_bytes(dump())
    dist.destroy_process_group()


def ddp_rank(rank: int, out: str, port: int) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024)).cuda(),
                bucket_cap_mb=4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    extra = torch.randn(4096, 4096, device="cuda")
    with profiler(Path(out), f"rank{rank}", "cuda", memory=False, stack=False) as prof:
        for _ in range(7):
            x = torch.randn(512, 1024, device="cuda")
            if rank == 1:  # the straggler
                with torch.profiler.record_function("straggler_delay"):
                    y = extra
                    for _ in range(40):
                        y = torch.tanh(y @ extra)
                    torch.cuda.synchronize()
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            prof.step()
    dist.destroy_process_group()


def part_ddp(out: Path, device: str) -> None:
    import torch.multiprocessing as mp

    if device != "cuda":
        print("  ddp: CUDA only, skipped on the CPU")
        return
    mp.spawn(ddp_rank, args=(str(out), free_port()), nprocs=2, join=True)


def part_jax(out: Path, device: str) -> None:
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax
    import jax.numpy as jnp

    keys = jax.random.split(jax.random.PRNGKey(0), 5)
    params = [jax.random.normal(k, (2048, 2048), jnp.float32) * 0.02 for k in keys[:4]]

    def loss(ps: list[Any], x: Any) -> Any:
        for w in ps:
            x = jax.nn.relu(x @ w.astype(jnp.bfloat16))
        return jnp.mean(x.astype(jnp.float32) ** 2)

    @jax.jit
    def step(ps: list[Any], x: Any) -> tuple[list[Any], Any]:
        value, grads = jax.value_and_grad(loss)(ps, x)
        return [p - 0.01 * g for p, g in zip(ps, grads)], value

    x = jax.random.normal(keys[4], (1024, 2048), jnp.bfloat16)
    params, value = step(params, x)
    value.block_until_ready()
    folder = out / "profile"
    with jax.profiler.trace(str(folder)):
        for i in range(8):
            with jax.profiler.StepTraceAnnotation("train", step_num=i):
                params, value = step(params, x)
                value.block_until_ready()
    planes = sorted(folder.rglob("*.xplane.pb"))
    print(f"  jax {jax.__version__} on {jax.devices()}: {[p.name for p in planes]}", flush=True)
    shutil.copyfile(planes[0], out / "jax.xplane.pb")
    shutil.rmtree(folder)


def run_part(name: str, out: Path, device: str) -> None:
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    globals()[f"part_{name}"](folder, device)


def versions() -> dict[str, str]:
    found: dict[str, str] = {"python": sys.version.split()[0]}
    for module in ("torch", "torchvision", "jax", "jaxlib"):
        try:
            found[module] = __import__(module).__version__
        except Exception as exc:  # noqa: BLE001 - recorded, not raised
            found[module] = f"missing: {exc}"
    try:
        import torch

        if torch.cuda.is_available():
            found["gpu"] = torch.cuda.get_device_name(0)
            found["cuda"] = str(torch.version.cuda)
            found["nccl"] = str(torch.cuda.nccl.version())
    except Exception as exc:  # noqa: BLE001
        found["gpu"] = f"unknown: {exc}"
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--part", choices=PARTS, action="append", help="one part (repeatable); default all")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.inside:
        run_part(args.part[0], args.out, args.device)
        return
    manifest: dict[str, Any] = {"versions": versions(), "parts": {}}
    for name in args.part or PARTS:
        started = time.monotonic()
        command = [sys.executable, __file__, "--inside", "--part", name, "--out", str(args.out),
                   "--device", args.device]
        try:
            done = subprocess.run(command, timeout=LIMITS_S[name], check=False)
            status = "ok" if done.returncode == 0 else f"exit {done.returncode}"
        except subprocess.TimeoutExpired:
            status = f"timed out after {LIMITS_S[name]}s"
        files = {p.relative_to(args.out / name).as_posix(): p.stat().st_size
                 for p in sorted((args.out / name).rglob("*")) if p.is_file()}
        manifest["parts"][name] = {"status": status, "seconds": round(time.monotonic() - started, 1),
                                   "files": files}
        print(f"{name}: {status} in {time.monotonic() - started:.1f}s, {files}", flush=True)
        (args.out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")  # after each part


if __name__ == "__main__":
    main()
