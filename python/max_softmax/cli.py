"""The `softmax` command: run our op, check it against SciPy, report.

softmax                          # GPT-2 logits batch + the classic 128-vector
softmax --shape 4,1000 --axis 0 --dtype bfloat16 --device cpu
softmax bench ...                # the benchmark sweep (see max_softmax/bench)
softmax warmup [--device ...]    # build the kernels and models ahead of time
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence

import numpy as np

from . import arrays
from .devices import DEVICE_CHOICES, resolve_device
from .dtypes import DTYPE_NAMES
from .reference import compare, compare_backward
from .validation import normalize_axis

DEFAULT_SHAPES: tuple[tuple[int, ...], ...] = ((8, 50257), (128,))
"""A batch of GPT-2 logits (vocabulary 50257) and the classic 128-vector."""


def _shape(text: str) -> tuple[int, ...]:
    """A shape from "8,50257" or "8x50257": every dim a whole number >= 0."""
    try:  # int() refuses an empty part, so "3,x" and "3," are errors, not shape 3
        dims = tuple(int(d) for d in text.lower().replace("x", ",").split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad shape {text!r}; use e.g. 8,50257") from None
    if any(d < 0 for d in dims):
        raise argparse.ArgumentTypeError(f"bad shape {text!r}; dims must be >= 0")
    return dims


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the `softmax` command."""
    p = argparse.ArgumentParser(
        prog="softmax",
        description="Run max-softmax's Mojo kernels on random logits (on the CPU "
        "through the launch extension, on a GPU in a MAX graph), check them against "
        "scipy.special.softmax (float64) and time them.",
        epilog="subcommands: 'softmax bench --help' (speed against MAX, torch, Triton, "
        "JAX), 'softmax train --help' (a classifier trained with our ops), "
        "'softmax warmup --help' (build the kernels and models ahead of time, "
        "for images and CI). "
        "MAX_SOFTMAX_QUIET=1 silences the compile notices.",
    )
    p.add_argument(
        "--shape",
        type=_shape,
        action="append",
        help="input shape, e.g. 8,50257 (repeatable; default: 8,50257 and 128)",
    )
    p.add_argument("--axis", type=int, default=-1, help="softmax axis (default -1)")
    p.add_argument("--dtype", choices=list(DTYPE_NAMES), default="float32")
    p.add_argument("--device", choices=list(DEVICE_CHOICES), default="auto")
    p.add_argument("--op", choices=["softmax", "log_softmax"], default="softmax")
    p.add_argument(
        "--backward",
        action="store_true",
        help="also run the op's backward (softmax_backward / log_softmax_backward) "
        "on a random dy and check it against the float64 formula",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=20, help="timed calls per shape")
    p.add_argument("--scale", type=float, default=4.0, help="std of the random logits")
    return p


def run_check(args: argparse.Namespace) -> bool:
    """Run each shape, print the report, return True if all agree with SciPy."""
    kind = resolve_device(args.device)
    dtype = DTYPE_NAMES[args.dtype]
    rng = np.random.default_rng(args.seed)
    fn = getattr(arrays, args.op)
    shapes = args.shape or DEFAULT_SHAPES
    for shape in shapes:  # bad axes fail before anything is printed
        normalize_axis(args.axis, len(shape))
    print(f"max-softmax {args.op}  device={kind}  dtype={args.dtype}  seed={args.seed}")
    if args.dtype in ("float16", "bfloat16"):
        print(f"  (errors are against the float64 reference rounded to {args.dtype})")
    all_ok = True
    for shape in shapes:
        x = (rng.standard_normal(shape) * args.scale).astype(dtype)
        t0 = time.perf_counter()
        y = fn(x, axis=args.axis, device=kind)
        first = time.perf_counter() - t0
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            fn(x, axis=args.axis, device=kind)
            times.append(time.perf_counter() - t0)
        c = compare(args.op, y, x, args.axis)
        all_ok &= c.ok
        probs = y.astype(np.float64)
        if args.op == "log_softmax":
            probs = np.exp(probs)
        sums = probs.sum(axis=args.axis)
        row_sums = f"[{sums.min():.6f}, {sums.max():.6f}]" if y.size else "n/a (empty)"
        per_call = statistics.median(times) * 1e6 if times else float("nan")
        print(
            f"  shape={'x'.join(map(str, shape)):>12}  "
            f"max_abs_err={c.max_abs_err:.2e}  max_rel_err={c.max_rel_err:.2e}  "
            f"row_sums={row_sums}  "
            f"first_call={first:.2f}s  per_call={per_call:.0f}us (numpy in/out)  "
            f"{'OK' if c.ok else 'FAIL'} (rtol={c.rtol:g}, atol={c.atol:g})"
        )
        if args.backward and y.size:
            bop = args.op + "_backward"
            dy = rng.standard_normal(shape).astype(dtype)
            dx = getattr(arrays, bop)(y, dy, axis=args.axis, device=kind)
            b = compare_backward(bop, dx, y, dy, args.axis)
            all_ok &= b.ok
            print(
                f"  {bop} shape={'x'.join(map(str, shape))}  max_abs_err={b.max_abs_err:.2e}  "
                f"grad_row_sums_max={np.abs(dx.astype(np.float64).sum(axis=args.axis)).max():.2e}"
                f"  {'OK' if b.ok else 'FAIL'}"
            )
    print("check against scipy.special." + args.op + ": " + ("PASSED" if all_ok else "FAILED"))
    return all_ok


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `softmax` console script: 0 passed, 1 failed check,
    2 bad arguments, 130 interrupted (Ctrl-C, even mid-compile)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "bench":
            from .bench import main as bench_main

            return bench_main(argv[1:])
        if argv and argv[0] == "warmup":
            from .warmup import main as warmup_main

            return warmup_main(argv[1:])
        if argv and argv[0] == "train":
            from .train import main as train_main

            return train_main(argv[1:])
        args = build_parser().parse_args(argv)
        try:
            return 0 if run_check(args) else 1
        except (TypeError, ValueError, RuntimeError) as err:
            print(f"softmax: error: {err}", file=sys.stderr)
            return 2
    except KeyboardInterrupt:
        print("softmax: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
