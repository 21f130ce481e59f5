"""Wall-clock GB/s of the fused cross-entropy (loss + dlogits) on the GPU,
through `model.execute` of `models.cross_entropy_model` (reduction "mean",
no ignored rows): 2 x logits bytes / call, beside a torch device copy of the
same bytes. A quick A/B tool for the kernels of op/gpu_cross_entropy.mojo
and its op/gpu_ce_*.mojo families; `softmax bench --op cross_entropy` is
the benchmark of record.

    python benchmarks/tools/cross_entropy_wall.py float32:16384x32000 bfloat16:8192x50257

A third field turns on the extended options (the kernels' extended terms,
op/gpu_cross_entropy.mojo): any of z (z_loss 1e-4), cap (softcap 30), w
(class weights), eps (label smoothing 0.1), joined by "+":

    python benchmarks/tools/cross_entropy_wall.py bfloat16:16384x32000:z+cap+w
"""

import sys
import time

import numpy as np
from max.dtype import DType

from max_softmax.devices import device
from max_softmax.dtypes import DTYPE_NAMES, to_buffer
from max_softmax.models import cross_entropy_model
from max_softmax.validation import cross_entropy_options


def copy_gbps(nbytes: int) -> float:
    """A torch device copy of `nbytes` (NaN without torch)."""
    try:
        import torch
    except ImportError:
        return float("nan")
    x = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda")
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        y.copy_(x)
    end.record()
    torch.cuda.synchronize()
    return 2 * nbytes / (start.elapsed_time(end) / 10 * 1e-3) / 1e9


def main(specs: list[str], reps: int = 20) -> None:
    """Time each DTYPE:ROWSxN of `specs` and print one line each."""
    gpu = device("gpu")
    for spec in specs:
        dtype, shape, *extra = spec.split(":")
        rows, n = map(int, shape.split("x"))
        flags = set(extra[0].split("+")) if extra else set()
        options = cross_entropy_options(
            -100,
            0.1 if "eps" in flags else 0.0,
            1e-4 if "z" in flags else 0.0,
            30.0 if "cap" in flags else 0.0,
            np.linspace(0.5, 1.5, n) if "w" in flags else None,
        )
        model = cross_entropy_model(True, getattr(DType, dtype), "gpu", "mean")
        rng = np.random.default_rng(0)
        x = rng.standard_normal((rows, n), dtype=np.float32).astype(DTYPE_NAMES[dtype])
        inputs = [
            to_buffer(x).to(gpu),
            to_buffer(rng.integers(0, n, size=rows)).to(gpu),
            to_buffer(options).to(gpu),
        ]
        for _ in range(3):
            model.execute(*inputs)
        gpu.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            model.execute(*inputs)
        gpu.synchronize()
        secs = (time.perf_counter() - t0) / reps
        nbytes = x.nbytes
        print(
            f"{spec}: {secs * 1e6:.0f} us/call, {2 * nbytes / secs / 1e9:.0f} GB/s "
            f"(wall, exec); copy {copy_gbps(nbytes):.0f}",
            flush=True,
        )


if __name__ == "__main__":
    main(sys.argv[1:])
