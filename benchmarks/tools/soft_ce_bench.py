"""Cross-entropy with class-probability targets, fwd + bwd through autograd on CUDA: our
torch bridge (the fused soft_cross_entropy op) against torch eager and torch.compile.

    python benchmarks/tools/soft_ce_bench.py --out soft_ce.json

Each provider gets fresh leaf logits from sets rotated over > 256 MB (L2 holds none), warm-up,
then the median of CUDA-event times of `loss.backward()` included; a device copy of the
logits' bytes beside them. GB/s-eq = 3 x logits bytes (logits and probabilities read, the
gradient written) / time. Values are checked against float64 torch first.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from cuda_events import median_ms

SHAPES = [(4096, 32000), (8192, 50257), (4096, 128256)]
L2_BYTES = 256 << 20


def _providers() -> dict:
    """Name -> loss function of (logits, probs)."""
    import max_softmax.torch as mst

    compiled = torch.compile(lambda x, p: F.cross_entropy(x, p))
    return {
        "ours": lambda x, p: mst.cross_entropy(x, p),
        "torch": lambda x, p: F.cross_entropy(x, p),
        "torch.compile": compiled,
    }


def _sets(rows: int, n: int, dtype: torch.dtype) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Input sets (logits, probabilities) together over `L2_BYTES`."""
    size = rows * n * torch.finfo(dtype).bits // 8
    count = max(2, -(-L2_BYTES // (2 * size)))
    out = []
    for _ in range(count):
        x = torch.randn(rows, n, device="cuda", dtype=dtype) * 4
        p = torch.softmax(torch.randn(rows, n, device="cuda"), -1).to(dtype)
        out.append((x, p))
    return out


def _time(fn, sets, reps: int, warmup: int) -> float:
    """Median ms of fn's fwd + bwd on fresh leaves."""

    def leaf(i: int) -> tuple:
        x, p = sets[i % len(sets)]
        return x.detach().requires_grad_(), p

    return median_ms(lambda x, p: fn(x, p).backward(), reps, warmup, leaf)


def _copy_ms(sets, reps: int) -> float:
    """Median ms of a device copy of one logits tensor."""

    def pair(i: int) -> tuple:
        x = sets[i % len(sets)][0]
        return torch.empty_like(x), x

    return median_ms(torch.Tensor.copy_, reps, 2, pair)


def _check(fn, x: torch.Tensor, p: torch.Tensor) -> str:
    """'ok' if fn's loss and gradient match float64 torch at the dtype's tolerance."""
    leaf = x[:64].detach().requires_grad_()
    loss = fn(leaf, p[:64])
    loss.backward()
    ref_leaf = x[:64].double().requires_grad_()
    ref = F.cross_entropy(ref_leaf, p[:64].double())
    ref.backward()
    tol = 1e-4 if x.dtype == torch.float32 else 2e-2
    ok = abs(float(loss) - float(ref)) <= tol * max(1.0, abs(float(ref)))
    ok = ok and torch.allclose(leaf.grad.double(), ref_leaf.grad, rtol=tol, atol=tol / x.shape[1])
    return "ok" if ok else "mismatch"


def main() -> None:
    """Time every (shape, dtype, provider) and write JSON lines and a summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("soft_ce.json"))
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    providers = _providers()
    records = []
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        for rows, n in SHAPES:
            sets = _sets(rows, n, dtype)
            nbytes = rows * n * torch.finfo(dtype).bits // 8
            copy = _copy_ms(sets, args.reps)
            for name, fn in providers.items():
                rec = {"provider": name, "dtype": dtype_name, "rows": rows, "n": n}
                try:
                    rec["check"] = _check(fn, *sets[0])
                    rec["ms"] = _time(fn, sets, args.reps, args.warmup)
                    rec["gbps_eq"] = 3 * nbytes / rec["ms"] / 1e6
                except Exception as e:  # a peer that cannot run the shape
                    rec["error"] = f"{type(e).__name__}: {e}"[:200]
                rec["copy_gbps"] = 2 * nbytes / copy / 1e6
                records.append(rec)
                print(json.dumps(rec), flush=True)
            del sets
            torch.cuda.empty_cache()
    args.out.write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
