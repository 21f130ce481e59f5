"""Time the cold compile of one masked-softmax model against a kernel library.

    XDG_CACHE_HOME=$(mktemp -d) python benchmarks/tools/masked_compile_time.py --kernels op
    XDG_CACHE_HOME=$(mktemp -d) python benchmarks/tools/masked_compile_time.py \\
        --kernels /tmp/old/op --flags 1,1          # an op/ tree with compile-time flags

Builds the graph `models.masked_model` builds (one `softmax_masked` custom op
on x (outer, L, n), mask (mask_rows, mask_n), float64 options, symbolic
dims) against the op/ tree at --kernels, precompiled first so that
packaging is not counted, then times `InferenceSession.load` (the kernel
compile), wall and this process's CPU seconds (the CPU figure moves less on
a shared machine). Default: the flags ride in the options' length (one model
for every mask / causal combination); --flags HAS_MASK,CAUSAL passes them as
the compile-time parameters of an op/ tree that takes them (one model a
combination). A fresh XDG_CACHE_HOME keeps MAX's compile cache cold. It
imports nothing from max_softmax, so it times old and new trees alike.
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path


def _cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main() -> int:
    """Precompile, build, load cold, run each combination once; print timings."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kernels", type=Path, required=True, help="the op/ source directory")
    p.add_argument("--device", default="cpu", choices=["cpu", "gpu"])
    p.add_argument("--dtype", default="float32")
    p.add_argument(
        "--op", default="softmax_masked", choices=["softmax_masked", "log_softmax_masked"]
    )
    p.add_argument(
        "--flags",
        default=None,
        help="HAS_MASK,CAUSAL (0 or 1 each): compile-time parameters of an op/ tree taking them",
    )
    args = p.parse_args()

    import numpy as np
    from max.driver import CPU, Accelerator, Buffer
    from max.dtype import DType
    from max.engine import InferenceSession
    from max.graph import DeviceRef, Graph, TensorType, ops
    from mojo.run import subprocess_run_mojo

    package = Path(tempfile.mkdtemp()) / "kernels_under_test.mojoc"
    subprocess_run_mojo(
        ["precompile", str(args.kernels), "-o", str(package)], check=True, capture_output=True
    )
    dev, ref = (
        (Accelerator(), DeviceRef.GPU()) if args.device == "gpu" else (CPU(), DeviceRef.CPU())
    )
    dtype = getattr(DType, args.dtype)
    fixed = None if args.flags is None else tuple(bool(int(v)) for v in args.flags.split(","))
    types = [
        TensorType(dtype, ["outer", "L", "n"], device=ref),
        TensorType(dtype, ["mask_rows", "mask_n"], device=ref),
        TensorType(DType.float64, ["n_options"] if fixed is None else [1], device=ref),
    ]
    parameters = {} if fixed is None else {"has_mask": fixed[0], "causal": fixed[1]}
    with Graph("masked_compile_time", input_types=types, custom_extensions=[package]) as g:
        x, m, o = (v.tensor for v in g.inputs)
        (y,) = ops.custom(
            name=args.op,
            device=ref,
            values=[x, m, o],
            out_types=[TensorType(x.dtype, x.shape, ref)],
            parameters=parameters,
        )
        g.output(y.tensor)
    cpu0, t0 = _cpu_seconds(), time.perf_counter()
    model = InferenceSession(devices=[dev]).load(g)
    wall, cpu = time.perf_counter() - t0, _cpu_seconds() - cpu0
    a = np.random.default_rng(0).standard_normal((1, 4, 8)).astype(np.float32)
    x_buf = Buffer.from_numpy(a).to(dev)
    mask = Buffer.from_numpy(np.zeros((1, 8), np.float32)).to(dev)
    ok = True
    for flags in [None] if fixed is not None else range(4):
        options = np.array([1.0] + [0.0] * (flags or 0))
        (out,) = model.execute(x_buf, mask, Buffer.from_numpy(options).to(dev))
        ok &= bool(np.allclose(out.to(CPU()).to_numpy().sum(-1), 1.0, atol=1e-4))
    print(
        json.dumps(
            {
                "kernels": str(args.kernels),
                "device": args.device,
                "op": args.op,
                "flags": "run time (options' length)" if fixed is None else args.flags,
                "cold_load_wall_s": round(wall, 1),
                "cold_load_cpu_s": round(cpu, 1),
                "rows_sum_to_1": ok,
            }
        )
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
