"""Vocab-parallel cross-entropy and sharded softmax on several GPUs.

torch (one process a GPU)::

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \\
      torchrun --nproc-per-node 2 benchmarks/tools/parallel_bench.py torch --out r.json

times fwd+bwd of `max_softmax.torch.parallel.vocab_parallel_cross_entropy`
("ours"), Megatron-core's `vocab_parallel_cross_entropy` (the wheel in
.gpu-peers/, extracted to a temporary folder if megatron is not importable),
torch's `loss_parallel` on a DTensor sharded on the class axis, and our
one-GPU `max_softmax.torch.cross_entropy` on the whole row ("single", every
rank at once on its own GPU), at 8192 x 128256 and 16384 x 256000, bf16 and
fp32. GB/s per GPU counts three passes over the GPU's logits (the forward's
read, the backward's read and its gradient write): the least any of them
must move.

MAX (one process, every GPU)::

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \\
      python benchmarks/tools/parallel_bench.py max --gpus 2 --out m.json

times `max_softmax.ops.sharded_softmax` over the GPUs against our softmax
of the whole row on one GPU and the built-in composition (ops.max ->
allgather -> exp/sum -> allreduce.sum -> divide). GB/s per GPU counts one
read and one write of the GPU's slice.

Both refuse to run unless NVLink multicast is off (the three variables
above): a program that uses multicast can take a shared host's GPUs out of
service.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import zipfile
from pathlib import Path

REQUIRED_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
ROOT = Path(__file__).resolve().parents[2]
SHAPES = [(8192, 128256), (16384, 256000)]


def check_env() -> None:
    """Exit unless NVLink multicast is off in this environment."""
    wrong = {k: os.environ.get(k) for k, v in REQUIRED_ENV.items() if os.environ.get(k) != v}
    if wrong:
        want = " ".join(f"{k}={v}" for k, v in REQUIRED_ENV.items())
        sys.exit(f"parallel_bench: refusing to run without {want} (got {wrong})")


def parse_shapes(text: str | None) -> list[tuple[int, int]]:
    """'8192x128256,16384x256000' -> [(8192, 128256), (16384, 256000)]."""
    if not text:
        return SHAPES
    return [tuple(int(v) for v in s.split("x")) for s in text.split(",")]  # type: ignore[misc]


def split_widths(classes: int, world: int) -> list[int]:
    """Contiguous widths in rank order, the remainder on the first ranks."""
    base, extra = divmod(classes, world)
    return [base + (1 if r < extra else 0) for r in range(world)]


# ---------------------------------------------------------------------------
# torch
# ---------------------------------------------------------------------------


def import_megatron():
    """Megatron-core's vocab_parallel_cross_entropy and parallel_state, or None."""
    try:
        from megatron.core import parallel_state
        from megatron.core.tensor_parallel.cross_entropy import vocab_parallel_cross_entropy
    except ImportError:
        wheels = sorted((ROOT / ".gpu-peers").glob("megatron_core-*.whl"))
        if not wheels:
            return None
        # One folder a rank: torchrun's ranks extracting into one folder at once collide
        # (FileExistsError, seen on 2 H100s).
        rank = os.environ.get("RANK", "0")
        target = Path(tempfile.gettempdir()) / f"megatron-{wheels[-1].stem}-rank{rank}"
        if not (target / "megatron").is_dir():
            with zipfile.ZipFile(wheels[-1]) as z:
                z.extractall(target)
        sys.path.insert(0, str(target))
        try:
            from megatron.core import parallel_state
            from megatron.core.tensor_parallel.cross_entropy import (
                vocab_parallel_cross_entropy,
            )
        except ImportError as err:
            print(f"parallel_bench: megatron-core does not import: {err}", file=sys.stderr)
            return None
    return vocab_parallel_cross_entropy, parallel_state


def time_cuda(torch, step, warmup: int, iters: int) -> float:
    """Median milliseconds of `step()` by CUDA events, ranks in step."""
    import torch.distributed as dist

    for _ in range(warmup):
        step()
    times = []
    for _ in range(iters):
        dist.barrier()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def profile_steps(torch, step, rank: int, stem: str, steps: int = 5) -> None:
    """torch.profiler over `steps` calls of `step` after a warm-up: rank 0
    prints the ops by CUDA and CPU time and writes a Chrome trace to
    `stem`.json (where the time goes between our two kernels)."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    if rank == 0:
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25), flush=True)
        print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=15), flush=True)
        prof.export_chrome_trace(f"{stem}.json")


def run_torch(args) -> None:
    """The torchrun side: one GPU a rank."""
    os.environ.setdefault("MODULAR_DEVICE_CONTEXT_MEMORY_MANAGER_SIZE_PERCENT", "30")
    # Our kernels through the launch extension from the first call (build it once
    # beforehand: every rank builds its own copy otherwise), not MAX models while
    # it builds in the background.
    os.environ.setdefault("MAX_SOFTMAX_LAUNCH", "extension")
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    import max_softmax.torch as mst
    from max_softmax.torch import parallel

    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", local)
    megatron = import_megatron()
    if megatron is not None:
        megatron[1].initialize_model_parallel(tensor_model_parallel_size=world)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.parallel import loss_parallel

    mesh = init_device_mesh("cuda", (world,))
    results = []
    dtypes = {"bfloat16": torch.bfloat16, "float32": torch.float32}
    for rows, classes in parse_shapes(args.shapes):
        widths = split_widths(classes, world)
        for name in args.dtypes.split(","):
            dtype = dtypes[name]
            gen = torch.Generator(device=device).manual_seed(0)
            x = torch.randn(rows, widths[rank], device=device, dtype=dtype, generator=gen)
            t = torch.randint(0, classes, (rows,), device=device, generator=gen)
            dist.broadcast(t, 0)
            shard_bytes = x.numel() * x.element_size()
            providers = {}

            def ours(x=x, t=t):
                xg = x.detach().requires_grad_()
                parallel.vocab_parallel_cross_entropy(xg, t).backward()

            providers["ours"] = ours
            if megatron is not None:
                mcore = megatron[0]

                def megatron_ce(x=x, t=t, mcore=mcore):
                    xg = x.detach().requires_grad_()
                    # Megatron's loss is per token; it may overwrite its input.
                    mcore(xg.clone() if args.megatron_clone else xg, t).mean().backward()

                providers["megatron"] = megatron_ce

            if len(set(widths)) == 1:

                def torch_loss_parallel(x=x, t=t):
                    xg = x.detach().requires_grad_()
                    dt = DTensor.from_local(xg, mesh, [Shard(1)], run_check=False)
                    with loss_parallel():
                        F.cross_entropy(dt, t).backward()

                providers["loss_parallel"] = torch_loss_parallel
            whole_bytes = rows * classes * x.element_size()
            if not args.skip_single:
                # Made just before its timing and freed after (see below):
                # the whole row and its gradient are 2 x world x the shard.
                holder: dict = {}

                def single(t=t, holder=holder, shape=(rows, classes), dtype=dtype, gen=gen):
                    if "whole" not in holder:
                        holder["whole"] = torch.randn(
                            shape, device=device, dtype=dtype, generator=gen
                        )
                    xg = holder["whole"].detach().requires_grad_()
                    mst.cross_entropy(xg, t).backward()

                providers["single"] = single
            for provider, step in providers.items():
                if args.profile and provider == "ours":
                    profile_steps(torch, step, rank, f"{args.profile}_{rows}x{classes}_{name}")
                try:
                    ms = time_cuda(torch, step, args.warmup, args.iters)
                    moved = 3 * (whole_bytes if provider == "single" else shard_bytes)
                    row = {
                        "provider": provider,
                        "rows": rows,
                        "classes": classes,
                        "dtype": name,
                        "world": world,
                        "ms": ms,
                        "gbps_per_gpu": moved / ms / 1e6,
                    }
                    if provider == "ours":
                        row["backend"] = parallel.backend(x)
                except Exception as err:  # a peer that fails is recorded, not fatal
                    row = {"provider": provider, "rows": rows, "classes": classes}
                    row |= {"dtype": name, "world": world, "error": repr(err)[:300]}
                times = [None] * world
                dist.all_gather_object(times, row.get("ms"))
                row["ms_per_rank"] = times
                results.append(row)
                if rank == 0:
                    print(json.dumps(row), flush=True)
                torch.cuda.empty_cache()
            providers.clear()
            del x
            torch.cuda.empty_cache()
    if rank == 0 and args.out:
        Path(args.out).write_text(json.dumps({"kind": "torch", "results": results}, indent=1))
    dist.destroy_process_group()


# ---------------------------------------------------------------------------
# MAX
# ---------------------------------------------------------------------------


def run_max(args) -> None:
    """One process driving every GPU through one MAX multi-device graph."""
    import numpy as np
    from max.driver import CPU, Accelerator, Buffer
    from max.dtype import DType
    from max.engine import InferenceSession
    from max.graph import DeviceRef, Graph, TensorType, ops
    from max.nn.comm import Signals

    import max_softmax
    from max_softmax import ops as graph_ops

    gpus = args.gpus
    accels = [Accelerator(id=i) for i in range(gpus)]
    session = InferenceSession(devices=[CPU(), *accels])
    refs = [DeviceRef.GPU(id=i) for i in range(gpus)]
    signals = Signals(devices=refs)
    dtypes = {"bfloat16": DType.bfloat16, "float32": DType.float32}
    results = []

    def builtin(shards, buffers):
        maxes = [ops.max(s, axis=-1) for s in shards]
        gathered = ops.allgather(maxes, buffers, axis=1)
        big = [ops.max(g, axis=-1) for g in gathered]
        exps = [ops.exp(s - m) for s, m in zip(shards, big)]
        sums = ops.allreduce.sum([ops.sum(e, axis=-1) for e in exps], buffers)
        return [e / s for e, s in zip(exps, sums)]

    def timed(model, inputs) -> float:
        for _ in range(args.warmup):
            model.execute(*inputs)
        for a in accels:
            a.synchronize()
        times = []
        for _ in range(args.iters):
            start = time.perf_counter()
            model.execute(*inputs)
            for a in accels:
                a.synchronize()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)

    for rows, classes in parse_shapes(args.shapes):
        widths = split_widths(classes, gpus)
        for name in args.dtypes.split(","):
            dtype = dtypes[name]
            rng = np.random.default_rng(0)
            whole = rng.standard_normal((rows, classes), dtype=np.float32)
            cuts = np.cumsum(widths)[:-1]
            shard_arrays = np.split(whole, cuts, axis=1)
            shard_types = [TensorType(dtype, [rows, w], device=r) for w, r in zip(widths, refs)]
            shard_bufs = []
            for a, arr in zip(accels, shard_arrays):
                b = Buffer.from_numpy(np.ascontiguousarray(arr)).to(a)
                shard_bufs.append(b if dtype == DType.float32 else _cast(session, b, dtype, a))
            for provider, body in (("sharded", graph_ops.sharded_softmax), ("builtin", builtin)):
                with Graph(
                    f"bench_{provider}",
                    input_types=[*shard_types, *signals.input_types()],
                    custom_extensions=[max_softmax.KERNELS],
                ) as g:
                    shards = [v.tensor for v in g.inputs[:gpus]]
                    buffers = [v.buffer for v in g.inputs[gpus:]]
                    g.output(*body(shards, buffers))
                model = session.load(g)
                ms = timed(model, [*shard_bufs, *signals.buffers()])
                moved = 2 * rows * max(widths) * (4 if dtype == DType.float32 else 2)
                results.append(_max_row(provider, rows, classes, name, gpus, ms, moved))
            with Graph(
                "bench_one_gpu",
                input_types=[TensorType(dtype, [rows, classes], device=refs[0])],
                custom_extensions=[max_softmax.KERNELS],
            ) as g:
                g.output(graph_ops.softmax(g.inputs[0].tensor, axis=-1))
            model = session.load(g)
            one = Buffer.from_numpy(whole).to(accels[0])
            if dtype != DType.float32:
                one = _cast(session, one, dtype, accels[0])
            ms = timed(model, [one])
            moved = 2 * rows * classes * (4 if dtype == DType.float32 else 2)
            results.append(_max_row("one_gpu", rows, classes, name, 1, ms, moved))
            for r in results[-3:]:
                print(json.dumps(r), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"kind": "max", "results": results}, indent=1))


def _max_row(provider, rows, classes, dtype, gpus, ms, moved) -> dict:
    return {
        "provider": provider,
        "rows": rows,
        "classes": classes,
        "dtype": dtype,
        "gpus": gpus,
        "ms": ms,
        "gbps_per_gpu": moved / ms / 1e6,
    }


def _cast(session, buf, dtype, accel):
    """`buf` (float32, on `accel`) cast to `dtype` by a one-op graph."""
    from max.graph import DeviceRef, Graph, TensorType, ops

    ref = DeviceRef.GPU(id=accel.id)
    with Graph("cast", input_types=[TensorType(buf.dtype, buf.shape, device=ref)]) as g:
        g.output(ops.cast(g.inputs[0].tensor, dtype))
    return session.load(g).execute(buf)[0]


def main() -> None:
    """Parse the command line and run one side."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("side", choices=["torch", "max"])
    parser.add_argument("--shapes", help="ROWSxCLASSES,... (default: the issue's two)")
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--gpus", type=int, default=2, help="max side: GPUs to use")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--skip-single", action="store_true", help="no one-GPU whole-row run")
    parser.add_argument(
        "--megatron-clone",
        action="store_true",
        help="give Megatron a copy of the logits (it subtracts the max in place)",
    )
    parser.add_argument("--out", help="JSON file for the results")
    parser.add_argument(
        "--profile", help="torch side: profile ours at each shape, traces to PROFILE_<shape>.json"
    )
    args = parser.parse_args()
    check_env()
    (run_torch if args.side == "torch" else run_max)(args)


if __name__ == "__main__":
    main()
