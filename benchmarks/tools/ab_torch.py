"""Before/after timing of the torch bridge's first-order calls: the proof an autograd change
slowed no user call.

Run it once per tree, alternating, in one sitting on the same machine:

    PYTHONPATH=$HOME/site:old/python python benchmarks/tools/ab_torch.py --tag old --out $OUT
    PYTHONPATH=$HOME/site:python     python benchmarks/tools/ab_torch.py --tag new --out $OUT
    (twice each), then: python benchmarks/tools/ab_torch.py --compare $OUT/abt_*.jsonl

`--small` times the host-bound calls instead (`SMALL_CASES`: 8x100 and 256x1000), the
forward alone and the forward and backward, best of `--reps` samples of `--inner` calls.

Each case is a public call of `max_softmax.torch` and its backward, as a training step makes
them: softmax / log_softmax (`y.backward(dy)`), scaled causal softmax, and cross-entropy
(`loss.backward()`). Every timed call gets its own leaf tensor (a view of one of several input
sets, together over 256 MB on CUDA, so L2 holds none of it) and the figure is the median of
`--reps` calls after warm-up: CUDA events on a GPU, wall time on the CPU. The launch extension
is built in the foreground before timing, so both trees time the same launch path.
Uses only the public API both trees share.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

CUDA_CASES = [
    ("softmax", "bfloat16", (4096, 4096)),
    ("softmax", "float32", (8192, 50257)),
    ("log_softmax", "bfloat16", (8192, 50257)),
    ("log_softmax", "float32", (256, 1024)),
    ("causal", "bfloat16", (64, 1024, 1024)),
    ("cross_entropy", "bfloat16", (8192, 50257)),
    ("cross_entropy", "float32", (4096, 128256)),
    ("cross_entropy", "bfloat16", (256, 32000)),
]
CPU_CASES = [
    ("softmax", "float32", (64, 1000)),
    ("softmax", "float32", (1024, 4096)),
    ("log_softmax", "float32", (1024, 4096)),
    ("causal", "float32", (4, 256, 256)),
    ("cross_entropy", "float32", (512, 32000)),
]
SMALL_CASES = [
    (op, "float32", shape)
    for op in ("softmax", "log_softmax", "cross_entropy")
    for shape in ((8, 100), (256, 1000))
]
"""`--small`: host-bound calls, where the bridge's Python is most of the time; each is timed
as a forward alone (nothing requires grad) and as a forward and backward."""
L2_BYTES = 256 << 20
"""Input bytes per case on CUDA, over several sets: well past the H100's 50 MB L2."""


def _step(op: str) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """One forward and backward of `op` on a leaf x with its second input (dy or targets)."""
    import max_softmax.torch as mst

    if op == "cross_entropy":
        return lambda x, t: mst.cross_entropy(x, t).backward()
    if op == "causal":
        return lambda x, dy: mst.softmax(x, -1, scale=0.125, causal=True).backward(dy)
    fn = getattr(mst, op)
    return lambda x, dy: fn(x, -1).backward(dy)


def _forward(op: str) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """One forward of `op` on x (which requires no grad) with its second input."""
    import max_softmax.torch as mst

    if op == "cross_entropy":
        return lambda x, t: mst.cross_entropy(x, t)
    fn = getattr(mst, op)
    return lambda x, dy: fn(x, -1)


def _input_sets(op: str, dtype: torch.dtype, shape: tuple[int, ...], device: str) -> list:
    """Fresh random (x, dy or targets) pairs, enough of them to defeat L2 on CUDA."""
    numel = 1
    for d in shape:
        numel *= d
    per_set = numel * torch.finfo(dtype).bits // 8 * 2
    sets = max(2, -(-L2_BYTES // per_set)) if device == "cuda" else 2
    out = []
    for _ in range(min(sets, 16)):
        x = torch.randn(shape, dtype=dtype, device=device) * 3
        if op == "cross_entropy":
            second = torch.randint(0, shape[-1], shape[:-1], device=device)
        else:
            second = torch.randn(shape, dtype=dtype, device=device)
        out.append((x, second))
    return out


def _time_case(op: str, dtype_name: str, shape: tuple[int, ...], device: str, reps: int) -> dict:
    """Median ms of one fwd+bwd call of `op` at `shape`."""
    dtype = getattr(torch, dtype_name)
    step = _step(op)
    sets = _input_sets(op, dtype, shape, device)
    times = []
    for i in range(reps + 5):
        base, second = sets[i % len(sets)]
        x = base.detach().requires_grad_()
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step(x, second)
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end)
        else:
            t0 = time.perf_counter()
            step(x, second)
            ms = (time.perf_counter() - t0) * 1e3
        if i >= 5:
            times.append(ms)
    return {"op": op, "dtype": dtype_name, "shape": list(shape), "ms": statistics.median(times)}


def _time_small(op: str, dtype_name: str, shape: tuple[int, ...], device: str, args) -> list:
    """Per call ms of `op` at `shape`, forward alone and forward + backward: each sample is
    the mean of `args.inner` calls back to back (one sync at the end on CUDA), the figure the
    best of `args.reps` samples (the least disturbed on a shared machine), the median beside
    it. `args.clock` "thread" counts the calling thread's CPU time only: the host work of a
    call, what a busy machine's other processes do not inflate (the kernel's own threads and
    any wait for them left out)."""
    dtype = getattr(torch, dtype_name)
    sets = _input_sets(op, dtype, shape, device)[:2]
    clock = time.thread_time if args.clock == "thread" else time.perf_counter
    out = []
    for kind, fn in (("fwd", _forward(op)), ("fwd+bwd", _step(op))):
        grad = kind == "fwd+bwd"
        samples = []
        for rep in range(args.reps + 2):
            xs = [base.detach().requires_grad_(grad) for base, _ in sets]
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = clock()
            for i in range(args.inner):
                fn(xs[i & 1], sets[i & 1][1])
            if device == "cuda":
                torch.cuda.synchronize()
            if rep >= 2:
                samples.append((clock() - t0) * 1e3 / args.inner)
        out.append(
            {
                "op": op,
                "dtype": dtype_name,
                "shape": list(shape),
                "pass": kind,
                "ms": min(samples),
                "median_ms": statistics.median(samples),
                "clock": args.clock,
            }
        )
    return out


def _prepare_extension(device: str) -> None:
    """Build and load the launch extension now, so no call times a build or the graph path."""
    from max_softmax import launch

    launch.extension()
    if device == "cuda":
        launch.CUDA_ENABLED = True


def measure(tag: str, out: Path, device: str, args: argparse.Namespace) -> Path:
    """Time every case of `device` (`SMALL_CASES` with `args.small`; those whose
    "op:dtype:shape" holds `args.only`) and append the records to out/abt_<tag>.jsonl."""
    _prepare_extension(device)
    cases = SMALL_CASES if args.small else CUDA_CASES if device == "cuda" else CPU_CASES
    if args.only:
        cases = [c for c in cases if args.only in f"{c[0]}:{c[1]}:{'x'.join(map(str, c[2]))}"]
    path = out / f"abt_{tag}.jsonl"
    with path.open("a") as f:
        for op, dtype_name, shape in cases:
            if args.small:
                timed = _time_small(op, dtype_name, shape, device, args)
            else:
                timed = [_time_case(op, dtype_name, shape, device, args.reps)]
            for t in timed:
                record = {"tag": tag, "device": device, **t}
                f.write(json.dumps(record) + "\n")
                print(json.dumps(record), flush=True)
    return path


def compare(paths: list[Path]) -> str:
    """A markdown table: per case, the best median of each tag, and new / old."""
    best: dict[tuple, dict[str, float]] = {}
    for p in paths:
        for line in p.read_text().splitlines():
            r = json.loads(line)
            shape = "x".join(map(str, r["shape"]))
            key = (r["device"], r["op"], r.get("pass", "fwd+bwd"), r["dtype"], shape)
            tags = best.setdefault(key, {})
            tags[r["tag"]] = min(tags.get(r["tag"], float("inf")), r["ms"])
    rows = [
        "| device | op | pass | dtype | shape | old ms | new ms | old/new |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (dev, op, kind, dt, shape), tags in sorted(best.items()):
        old, new = tags.get("old"), tags.get("new")
        ratio = f"{old / new:.3f}" if old and new else "n/a (a tag is missing)"
        fmt = lambda v: f"{v:.4f}" if v else "-"  # noqa: E731
        rows.append(
            f"| {dev} | {op} | {kind} | {dt} | {shape} | {fmt(old)} | {fmt(new)} | {ratio} |"
        )
    return "\n".join(rows)


def main() -> None:
    """Measure one tree (`--tag`) or compare the records (`--compare`)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tag", help="old or new: which tree this process runs")
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None)
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--only", default="", help='cases whose "op:dtype:shape" holds this')
    parser.add_argument(
        "--small", action="store_true", help="the small host-bound cases, fwd and fwd+bwd"
    )
    parser.add_argument("--inner", type=int, default=200, help="--small: calls a sample")
    parser.add_argument(
        "--clock",
        choices=("wall", "thread"),
        default="wall",
        help="--small: wall time, or the calling thread's CPU time (host work only)",
    )
    parser.add_argument("--compare", type=Path, nargs="*")
    args = parser.parse_args()
    if args.compare:
        print(compare(args.compare))
        return
    if args.tag not in ("old", "new"):
        parser.error("--tag old|new (or --compare files)")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    args.out.mkdir(parents=True, exist_ok=True)
    measure(args.tag, args.out, device, args)


if __name__ == "__main__":
    main()
