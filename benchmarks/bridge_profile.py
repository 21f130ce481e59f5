"""Where a torch training step's time goes through the bridge (CUDA).

Wall clock a call (warm, same buffers, synchronised once at the end) of
torch's softmax and ours, forward, backward and forward + backward through
autograd, then a CUPTI trace (torch.profiler) of our forward + backward:
kernel time a step, GPU idle time between its kernels, host time a step.

    python benchmarks/bridge_profile.py [--shape 4096x4096] [--dtype float32] [--functions]

`--functions` times a training step through plain `torch.autograd.Function`s
whose forward / backward are torch's or ours (host and wall µs a step), and
ours with autograd's worker threads off: which part of the step costs.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import max_softmax.torch as mst
from max_softmax.torch import _launch as torch_launch


def _round_us(fn, reps: int) -> tuple[float, float]:
    """One round of `reps` back-to-back calls after a sync: µs a call until
    the loop returns (host) and until the GPU is done (wall)."""
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    host = time.perf_counter()
    torch.cuda.synchronize()
    end = time.perf_counter()
    return (host - start) / reps * 1e6, (end - start) / reps * 1e6


def wall_us(fn, reps: int) -> float:
    """Median of 5 rounds of `reps` back-to-back calls, µs a call."""
    fn()
    torch.cuda.synchronize()
    return sorted(_round_us(fn, reps)[1] for _ in range(5))[2]


def steps(x: torch.Tensor, dy: torch.Tensor) -> dict:
    """The calls to time, by name."""
    xg = x.detach().requires_grad_()
    y = torch.softmax(x, -1)
    out = torch.empty_like(x)
    rows, n = x.shape

    def ours_bwd_launch():
        torch_launch.run("softmax_backward", out, y, dy, outer=rows, n=n, inner=1)

    def step(fn):
        def run():
            xg.grad = None
            fn(xg, dim=-1).backward(dy)

        return run

    def by_hand(forward, backward):
        def run():
            backward(forward(x), dy)

        return run

    return {
        "torch fwd": lambda: torch.softmax(x, -1),
        "ours fwd": lambda: mst.softmax(x, dim=-1),
        "torch bwd": lambda: torch._softmax_backward_data(dy, y, -1, x.dtype),
        "ours bwd (run)": ours_bwd_launch,
        "torch fwd+bwd": step(torch.softmax),
        "ours fwd+bwd": step(mst.softmax),
        "torch fwd+bwd by hand": by_hand(
            lambda t: torch.softmax(t, -1),
            lambda y_, d: torch._softmax_backward_data(d, y_, -1, x.dtype),
        ),
        "ours fwd+bwd by hand": by_hand(
            lambda t: mst.softmax(t, dim=-1), lambda y_, d: mst._run("softmax_backward", -1, y_, d)
        ),
    }


def host_and_wall_us(fn, reps: int = 100) -> tuple[float, float]:
    """µs a call until the loop returns (host) and until the GPU is done (wall)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    host, wall = _round_us(fn, reps)
    return round(host, 1), round(wall, 1)


def function_steps(x: torch.Tensor, dy: torch.Tensor) -> None:
    """Print host / wall µs of a step through an autograd.Function made of
    torch's or our forward and backward, then ours single-threaded."""
    forwards = {
        "torch": lambda t: torch.softmax(t, -1),
        "ours": lambda t: mst._run("softmax", -1, t),
    }
    backwards = {
        "torch": lambda y, d: torch._softmax_backward_data(d, y, -1, y.dtype),
        "ours": lambda y, d: mst._run("softmax_backward", -1, y, d),
    }
    xg = x.detach().clone().requires_grad_()
    for fname, fwd in forwards.items():
        for bname, bwd in backwards.items():

            class Step(torch.autograd.Function):
                @staticmethod
                def forward(ctx, t, fwd=fwd):
                    y = fwd(t)
                    ctx.save_for_backward(y)
                    return y

                @staticmethod
                def backward(ctx, d, bwd=bwd):
                    (y,) = ctx.saved_tensors
                    return bwd(y, d)

            def step(fn=Step):
                xg.grad = None
                fn.apply(xg).backward(dy)

            host, wall = host_and_wall_us(step)
            print(
                json.dumps(
                    {"function": f"{fname} fwd / {bname} bwd", "host_us": host, "wall_us": wall}
                )
            )

    def ours():
        xg.grad = None
        mst.softmax(xg, dim=-1).backward(dy)

    torch.autograd.set_multithreading_enabled(False)
    try:
        host, wall = host_and_wall_us(ours)
    finally:
        torch.autograd.set_multithreading_enabled(True)
    print(
        json.dumps({"function": "ours, autograd single-threaded", "host_us": host, "wall_us": wall})
    )


def trace(fn, reps: int) -> dict:
    """CUPTI view of `reps` calls of fn: kernel µs, GPU idle µs between the
    first and last kernel, and host µs, each a call."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        host = (time.perf_counter() - start) / reps * 1e6
        torch.cuda.synchronize()
    kernels = sorted(
        (e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
        key=lambda e: e.time_range.start,
    )
    busy = sum(e.time_range.end - e.time_range.start for e in kernels)
    span = kernels[-1].time_range.end - kernels[0].time_range.start if kernels else 0
    names: dict[str, float] = {}
    for e in kernels:
        names[e.name[:60]] = names.get(e.name[:60], 0) + (e.time_range.end - e.time_range.start)
    return {
        "kernel_us": busy / reps,
        "idle_us": (span - busy) / reps,
        "host_us": host,
        "kernels": {k: v / reps for k, v in names.items()},
    }


def main() -> None:
    """Print one JSON line per timing and per trace."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="4096x4096")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--reps", type=int, default=100)
    parser.add_argument("--functions", action="store_true", help="the autograd.Function variants")
    args = parser.parse_args()
    rows, n = (int(v) for v in args.shape.split("x"))
    dtype = getattr(torch, args.dtype)
    x = torch.randn(rows, n, device="cuda", dtype=dtype)
    dy = torch.randn_like(x)
    torch_launch.extension()
    print(json.dumps({"launch_path": torch_launch.available(cuda=True), "shape": args.shape}))
    if args.functions:
        function_steps(x, dy)
        return
    calls = steps(x, dy)
    for name, fn in calls.items():
        print(json.dumps({"call": name, "wall_us": round(wall_us(fn, args.reps), 1)}))
    for name in ("torch fwd+bwd", "ours fwd+bwd", "ours fwd+bwd by hand", "ours fwd"):
        print(json.dumps({"trace": name, **trace(calls[name], 20)}), flush=True)


if __name__ == "__main__":
    main()
