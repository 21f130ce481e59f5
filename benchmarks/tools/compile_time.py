"""Time the compile of one softmax model against a given kernel library.

    python benchmarks/tools/compile_time.py --kernels op --device gpu
    python benchmarks/tools/compile_time.py --kernels /tmp/old/op --device gpu   # another version

Builds the graph our `row_op_model` builds (one `softmax` custom op on a
rank-3 tensor with symbolic dims, variant "auto") against the library at
--kernels, precompiled first with `mojo precompile` so that packaging is not
counted, empties MAX's compile cache (~/.cache/modular), then times graph
build and `InferenceSession.load` (the kernel compile). It imports nothing
from max_softmax, so it times old and new trees alike. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    """Precompile, empty the cache, build, load, execute once; print timings."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kernels", type=Path, required=True, help="the op/ source directory")
    p.add_argument("--device", default="gpu", choices=["cpu", "gpu"])
    p.add_argument("--dtype", default="float32")
    p.add_argument("--label", default="")
    p.add_argument(
        "--op",
        default="softmax",
        help="custom op to compile from --kernels: one input, an output of its shape "
        '(e.g. "log_softmax")',
    )
    p.add_argument(
        "--variant", default="auto", help='our op\'s variant ("warp": one family compiled)'
    )
    p.add_argument(
        "--builtin",
        action="store_true",
        help="MAX's ops.softmax instead of ours (the library still loaded): MAX's own share",
    )
    args = p.parse_args()

    import numpy as np
    from max.driver import CPU, Accelerator, Buffer
    from max.dtype import DType
    from max.engine import InferenceSession
    from max.graph import DeviceRef, Graph, TensorType, ops
    from mojo.run import subprocess_run_mojo

    package = Path(tempfile.mkdtemp()) / "kernels_under_test.mojoc"
    t0 = time.perf_counter()
    subprocess_run_mojo(
        ["precompile", str(args.kernels), "-o", str(package)], check=True, capture_output=True
    )
    t_pre = time.perf_counter() - t0
    shutil.rmtree(Path.home() / ".cache" / "modular", ignore_errors=True)
    dev, ref = (
        (Accelerator(), DeviceRef.GPU()) if args.device == "gpu" else (CPU(), DeviceRef.CPU())
    )
    dtype = getattr(DType, args.dtype)
    t = TensorType(dtype, ["outer", "n", "inner"], device=ref)
    t0 = time.perf_counter()
    with Graph("compile_time", input_types=[t], custom_extensions=[package]) as g:
        x = g.inputs[0].tensor
        if args.builtin:
            g.output(ops.softmax(x, axis=1))
        else:
            parameters = {} if args.variant == "auto" else {"variant": args.variant}
            (y,) = ops.custom(
                name=args.op, device=ref, values=[x], out_types=[t], parameters=parameters
            )
            g.output(y.tensor)
    t_build = time.perf_counter() - t0
    t0 = time.perf_counter()
    model = InferenceSession(devices=[dev]).load(g)
    t_load = time.perf_counter() - t0
    a = np.random.default_rng(0).standard_normal((4, 1000, 1)).astype(np.float32)
    (out,) = model.execute(Buffer.from_numpy(a).to(dev))
    rows_ok = None  # only softmax's rows sum to 1
    if args.op == "softmax" or args.builtin:
        rows_ok = bool(np.allclose(out.to(CPU()).to_numpy().sum(axis=1), 1.0, atol=1e-4))
    print(
        json.dumps(
            {
                "label": args.label,
                "kernels": str(args.kernels),
                "device": args.device,
                "op": "max.ops.softmax" if args.builtin else f"{args.op} variant={args.variant}",
                "precompile_s": round(t_pre, 2),
                "graph_build_s": round(t_build, 2),
                "cold_load_s": round(t_load, 2),
                "rows_sum_to_1": rows_ok,
            }
        )
    )
    return 1 if rows_ok is False else 0


if __name__ == "__main__":
    sys.exit(main())
