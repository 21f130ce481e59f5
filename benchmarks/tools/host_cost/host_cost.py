"""Where a graph op's time goes on the host: our softmax against MAX's built-in
and against custom ops that do no work, K ops in one graph.

    python benchmarks/tools/host_cost/host_cost.py [--device gpu] [--k 16] [--reps 50]

For each provider and shape it prints (and writes as JSON lines with --out)
three per-op figures, medians over `reps`:
  enqueue  wall time of `model.execute(...)` alone / K (host work; the GPU
           runs behind it),
  exec     execute + device sync / K (what a graph user waits for),
  replay   the same graph captured once and replayed, + sync / K.
Providers: MAX's ops.softmax and ops.negate (an elementwise op), our
softmax through max_softmax.ops (reshapes around the custom op) and on a
rank-3 input (no reshape), and the two probes of
probe_ops/: `probe_launch` (one empty kernel) and `probe_nothing`. The
differences split our per-op cost into MAX's custom-op floor, a launch, and
our own dispatch. The "causal" providers build our causal softmax (scale
0.125) through the front door and with the graph ops around the custom op
taken away one by one (the cast of its placeholder mask, the reshapes, a
mask and options constant of its own per op): what each costs a call.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def probe_library() -> Path:
    """probe_ops/ precompiled into a temporary .mojoc."""
    out = Path(tempfile.mkdtemp()) / "probe_ops.mojoc"
    subprocess.run(["mojo", "precompile", str(HERE / "probe_ops"), "-o", str(out)], check=True)
    return out


def provider_bodies(ms_ops, max_ops):
    """name -> (rank of the input, per-op graph function)."""

    def custom(name):
        def body(x):
            from max.graph import TensorType

            (y,) = max_ops.custom(
                name=name,
                device=x.device,
                values=[x],
                out_types=[TensorType(x.dtype, x.shape, x.device)],
            )
            return y.tensor

        return body

    consts: dict[int, dict] = {}

    def causal(reshape: bool, cast: bool, share: bool):
        def body(x):
            from max.dtype import DType
            from max.graph import Graph

            from max_softmax.validation import masked_flags, masked_options

            made = consts.setdefault(id(Graph.current), {}) if share else {}
            if not made:
                if cast:  # the front door's placeholder: a float32 constant, cast
                    zeros = np.zeros((1, 1), np.float32)
                    made["mask"] = max_ops.cast(
                        max_ops.constant(zeros, DType.float32, device=x.device), x.dtype
                    )
                else:
                    made["mask"] = max_ops.constant([[0.0]], x.dtype, device=x.device)
                flags = masked_flags(False, True)  # causal, no mask
                made["options"] = max_ops.constant(
                    np.array(masked_options(0.125, flags)), DType.float64, device=x.device
                )
            v = max_ops.reshape(x, [1, x.shape[0], x.shape[1]]) if reshape else x
            y = ms_ops.softmax_masked(v, made["mask"], made["options"])
            return max_ops.reshape(y, x.shape) if reshape else y

        return body

    return {
        "causal: front door": (2, lambda x: ms_ops.softmax(x, scale=0.125, causal=True)),
        "causal: reshapes, cast": (2, causal(True, True, False)),
        "causal: reshapes": (2, causal(True, False, False)),
        "causal: rank 3": ("L3", causal(False, False, False)),
        "causal: rank 3, shared constants": ("L3", causal(False, False, True)),
        "max.ops.softmax": (2, lambda x: max_ops.softmax(x, axis=-1)),
        "max.ops.negate": (2, max_ops.negate),
        "ours (rank 2, reshapes)": (2, lambda x: ms_ops.softmax(x, axis=-1)),
        "ours (rank 3)": (3, lambda x: ms_ops.softmax(x, axis=1)),
        "probe_launch": (3, custom("probe_launch")),
        "probe_nothing": (3, custom("probe_nothing")),
    }


def main() -> int:
    """Build each provider's K-op graph, time it on each shape, print a table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="gpu", choices=["cpu", "gpu"])
    p.add_argument("--k", type=int, default=16)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--shapes", default="64x128,16384x128")
    p.add_argument("--only", default="", help="providers whose name contains this")
    p.add_argument("--out", type=Path, help="append JSON lines here")
    args = p.parse_args()

    from max.dtype import DType
    from max.graph import Graph, TensorType
    from max.graph import ops as max_ops

    from max_softmax import ops as ms_ops
    from max_softmax.devices import device
    from max_softmax.dtypes import DTYPE_NAMES, to_buffer
    from max_softmax.kernels import kernel_library
    from max_softmax.models import device_ref, session

    dev = device(args.device)
    libs = [kernel_library(), probe_library()]
    shapes = [tuple(int(d) for d in s.split("x")) for s in args.shapes.split(",")]
    sync = dev.synchronize if args.device == "gpu" else (lambda: None)
    rng = np.random.default_rng(0)
    rows_out = []
    for name, (rank, fn) in provider_bodies(ms_ops, max_ops).items():
        if args.only not in name:
            continue
        dims = ["rows", "n"] + (["one"] if rank == 3 else [])
        if rank == "L3":  # the masked op's own (outer, L, n) view
            dims = ["one", "rows", "n"]
        t = TensorType(getattr(DType, args.dtype), dims, device_ref(args.device))
        with Graph(
            f"host_cost_{len(rows_out)}", input_types=[t] * args.k, custom_extensions=libs
        ) as g:
            g.output(*[fn(v.tensor) for v in g.inputs])
        t0 = time.perf_counter()
        model = session(args.device).load(g)
        load_s = time.perf_counter() - t0
        for rows, n in shapes:
            shape = (rows, n) + ((1,) if rank == 3 else ())
            if rank == "L3":
                shape = (1, rows, n)
            bufs = [
                to_buffer(rng.standard_normal(shape).astype(DTYPE_NAMES[args.dtype])).to(dev)
                for _ in range(args.k)
            ]
            for _ in range(5):
                model.execute(*bufs)
            sync()
            enq, ex = [], []
            for _ in range(args.reps):
                t0 = time.perf_counter()
                outs = model.execute(*bufs)
                t1 = time.perf_counter()
                sync()
                t2 = time.perf_counter()
                enq.append((t1 - t0) / args.k)
                ex.append((t2 - t0) / args.k)
                del outs
            rep = None
            if args.device == "gpu":
                outs = model.capture(1, *bufs)
                model.replay(1, *bufs)
                sync()
                times = []
                for _ in range(args.reps):
                    t0 = time.perf_counter()
                    model.replay(1, *bufs)
                    sync()
                    times.append((time.perf_counter() - t0) / args.k)
                rep = statistics.median(times)
                del outs
                model.release_captured_graph(1)
            row = {
                "provider": name,
                "shape": f"{rows}x{n}",
                "dtype": args.dtype,
                "k": args.k,
                "enqueue_us": round(statistics.median(enq) * 1e6, 2),
                "exec_us": round(statistics.median(ex) * 1e6, 2),
                "replay_us": None if rep is None else round(rep * 1e6, 2),
                "load_s": round(load_s, 2),
            }
            rows_out.append(row)
            print(json.dumps(row), flush=True)
            del bufs
    print("\n| provider | shape | enqueue µs/op | exec µs/op | replay µs/op |")
    print("|---|---|---|---|---|")
    for r in rows_out:
        cells = [r[c] for c in ("provider", "shape", "enqueue_us", "exec_us", "replay_us")]
        print("| " + " | ".join(str(c) for c in cells) + " |")
    if args.out:
        with args.out.open("a") as f:
            for r in rows_out:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
