"""Before/after replay timing of our ops on one GPU: the proof a kernel refactor changed no speed.

Run it once per tree, alternating, in one sitting on the same machine:

    PYTHONPATH=$HOME/site:old/python python benchmarks/tools/ab_replay.py --tag old --out $OUT
    PYTHONPATH=$HOME/site:python     python benchmarks/tools/ab_replay.py --tag new --out $OUT
    (twice each), then: python benchmarks/tools/ab_replay.py --compare $OUT/ab_*.jsonl

Each (op, dtype) gets one graph with symbolic (rows, n) and K independent inputs (MAX merges
identical ops on identical inputs), captured once per shape and replayed: the figure is the median
of REPS replays of K ops, per op, as GB/s of the bytes the op must move. Inputs are fresh random
data of at least 256 MB in all per shape, so L2 (50 MB) holds none of it between ops. Uses only the
public graph API that both trees share.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

FWD_SHAPES = [
    (16384, 128),
    (4096, 1024),
    (4096, 4096),
    (4096, 16384),
    (4096, 65536),
    (8192, 50257),
    (32, 1048576),
]
CE_SHAPES = [(16384, 32000), (8192, 50257), (4096, 128256)]
MASKED_SHAPES = [(16384, 128), (4096, 1024), (4096, 4096), (4096, 16384), (2048, 32768)]
OPS = ("softmax", "log_softmax", "softmax_backward", "cross_entropy", "causal", "masked")
TENSORS = {
    "softmax": 2,
    "log_softmax": 2,
    "softmax_backward": 3,
    "cross_entropy": 2,
    "causal": 2,
    "masked": 3,
}


def _graph(op: str, dtype: str, k: int, cpu: bool = False):
    """A graph of K independent `op` calls on symbolic (rows, n) inputs."""
    from max.dtype import DType
    from max.graph import DeviceRef, Graph, TensorType

    import max_softmax

    dt = {"float32": DType.float32, "bfloat16": DType.bfloat16}[dtype]
    gpu = DeviceRef.CPU() if cpu else DeviceRef.GPU()
    x = TensorType(dt, ["rows", "n"], gpu)
    if op in ("softmax_backward", "masked"):
        types = [x] * (2 * k)
    elif op == "cross_entropy":
        types = [x, TensorType(DType.int64, ["rows"], gpu)] * k
    else:
        types = [x] * k
    with Graph(f"ab_{op}_{dtype}", input_types=types, custom_extensions=[max_softmax.KERNELS]) as g:
        ins = [v.tensor for v in g.inputs]
        outs = []
        for i in range(k):
            if op == "softmax":
                outs.append(max_softmax.ops.softmax(ins[i], axis=-1))
            elif op == "log_softmax":
                outs.append(max_softmax.ops.log_softmax(ins[i], axis=-1))
            elif op == "causal":
                outs.append(max_softmax.ops.softmax(ins[i], axis=-1, causal=True))
            elif op == "masked":
                outs.append(
                    max_softmax.ops.softmax(ins[2 * i], axis=-1, scale=0.125, mask=ins[2 * i + 1])
                )
            elif op == "softmax_backward":
                outs.append(max_softmax.ops.softmax_backward(ins[2 * i], ins[2 * i + 1], axis=-1))
            else:
                loss, grad = max_softmax.ops.cross_entropy_with_grad(ins[2 * i], ins[2 * i + 1])
                outs += [loss, grad]
        g.output(*outs)
    return g


def _inputs(op: str, dtype: str, rows: int, n: int, k: int, gpu, rng):
    """K fresh input sets on the GPU."""
    import ml_dtypes
    from max.driver import Buffer
    from max.dtype import DType

    def tensor():
        x = rng.standard_normal((rows, n), dtype=np.float32)
        if dtype == "float32":
            return Buffer.from_numpy(x).to(gpu)
        # bfloat16 by its bits: DLPack (Buffer.from_numpy) takes no ml_dtypes arrays.
        bits = x.astype(ml_dtypes.bfloat16).view(np.uint16)
        return Buffer.from_numpy(bits).view(DType.bfloat16).to(gpu)

    bufs = []
    for _ in range(k):
        bufs.append(tensor())
        if op in ("softmax_backward", "masked"):
            bufs.append(tensor())
        elif op == "cross_entropy":
            bufs.append(Buffer.from_numpy(rng.integers(0, n, rows).astype(np.int64)).to(gpu))
    return bufs


def run(args: argparse.Namespace) -> None:
    """Time every (op, dtype, shape) of this tree and append JSON lines to OUT/ab_TAG.jsonl."""
    from max.driver import Accelerator
    from max.engine import InferenceSession

    gpu = Accelerator()
    session = InferenceSession(devices=[gpu])
    rng = np.random.default_rng(0)
    out = Path(args.out) / f"ab_{args.tag}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)  # a new $OUT/sub folder on the device
    for op in args.ops:
        for dtype in args.dtypes:
            shapes = CE_SHAPES if op == "cross_entropy" else FWD_SHAPES
            if op == "causal":
                shapes = [(4096, 4096), (8192, 8192)]
            elif op == "masked":
                shapes = MASKED_SHAPES
            size = 4 if dtype == "float32" else 2
            models = {}
            for rows, n in shapes:
                k = args.k or int(min(16, max(2, (256 << 20) // (rows * n * size))))
                if k not in models:
                    t0 = time.perf_counter()
                    models[k] = session.load(_graph(op, dtype, k))
                    print(
                        f"compiled {op} {dtype} K={k} in {time.perf_counter() - t0:.1f}s",
                        flush=True,
                    )
                model = models[k]
                bufs = _inputs(op, dtype, rows, n, k, gpu, rng)
                key = hash((op, dtype, rows, n)) & 0x7FFFFFFF
                outs = model.capture(key, *bufs)
                gpu.synchronize()
                times = []
                for _ in range(args.reps):
                    t0 = time.perf_counter()
                    model.replay(key, *bufs)
                    gpu.synchronize()
                    times.append(time.perf_counter() - t0)
                per_op = statistics.median(times) / k
                moved = TENSORS[op] * rows * n * size
                rec = {
                    "tag": args.tag,
                    "op": op,
                    "dtype": dtype,
                    "shape": f"{rows}x{n}",
                    "k": k,
                    "us": per_op * 1e6,
                    "gbps": moved / per_op / 1e9,
                }
                print(json.dumps(rec), flush=True)
                with out.open("a") as f:
                    f.write(json.dumps(rec) + "\n")
                del outs
                model.release_captured_graph(key)
                del bufs


def smoke() -> None:
    """Build and run every op's graph (K = 2) on the CPU, small: the script's own check."""
    from max.driver import CPU
    from max.engine import InferenceSession

    cpu = CPU()
    session = InferenceSession(devices=[cpu])
    rng = np.random.default_rng(0)
    for op in OPS:
        model = session.load(_graph(op, "float32", 2, cpu=True))
        outs = model.execute(*_inputs(op, "float32", 8, 64, 2, cpu, rng))
        print(op, "ok", len(outs), "outputs")


def compare(files: list[str]) -> None:
    """A markdown table: each (op, dtype, shape), the best GB/s of each tag, new / old."""
    best: dict[tuple, dict[str, float]] = {}
    for name in files:
        for line in Path(name).read_text().splitlines():
            r = json.loads(line)
            cell = best.setdefault((r["op"], r["dtype"], r["shape"]), {})
            cell[r["tag"]] = max(cell.get(r["tag"], 0.0), r["gbps"])
    print("| op | dtype | shape | old GB/s | new GB/s | new / old |")
    print("|---|---|---|---|---|---|")
    for (op, dtype, shape), cell in best.items():
        old, new = cell.get("old"), cell.get("new")
        ratio = f"{new / old:.3f}" if old and new else "n/a"
        print(f"| {op} | {dtype} | {shape} | {old or 0:.0f} | {new or 0:.0f} | {ratio} |")


def main() -> None:
    """Command line: time this tree, or compare saved runs."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tag", default="new")
    p.add_argument("--out", default=".")
    p.add_argument("--ops", nargs="+", default=list(OPS), choices=OPS)
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--k", type=int, default=0, help="ops a graph (default: by size, 2-16)")
    p.add_argument("--compare", nargs="+")
    p.add_argument("--smoke", action="store_true", help="build one graph on the CPU and run it")
    args = p.parse_args()
    if args.compare:
        compare(args.compare)
    elif args.smoke:
        smoke()
    else:
        run(args)


if __name__ == "__main__":
    main()
