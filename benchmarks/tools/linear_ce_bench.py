"""Fused linear + cross-entropy on CUDA: fwd+bwd time and peak memory of
`max_softmax.torch.linear_cross_entropy` against its peers, in JSON.

    python benchmarks/tools/linear_ce_bench.py --out linear_ce.json
    python benchmarks/tools/linear_ce_bench.py --shapes 8192x4096x32000 --providers ours,liger
    python benchmarks/tools/linear_ce_bench.py --dry-run   # CPU: arguments and providers

Providers (each guarded: one that cannot be imported or runs out of memory
is recorded as such, the rest go on):

- ours: chunked, in place, chunk i's cross-entropy beside chunk i+1's GEMM
  (overlap=True);
- ours_serial: the chunks one after another in one buffer (the default);
- ours:MiB, ours_serial:MiB: with chunk_bytes = MiB (without: the
  library's default_chunk_bytes; the chunk trades memory for the dW GEMM's
  efficiency);
- eager: F.linear + F.cross_entropy, the logits materialised;
- compile: the same under torch.compile;
- liger: liger_kernel's LigerFusedLinearCrossEntropyLoss;
- cce: cut_cross_entropy.linear_cross_entropy;
- quack: quack-kernels' chunked linear cross-entropy, where it has one;
- gemm_floor: cuBLAS h @ W^T, dlogits @ W and dlogits^T @ h alone (the
  three GEMMs every chunked method runs; no cross-entropy).

Each (shape, softcap, provider) gets fresh bf16 inputs, warm-up calls,
then `--reps` timed fwd+bwd calls (CUDA events, median). Peak memory is
`torch.cuda.max_memory_allocated()` during one fwd+bwd minus what was
allocated before it (inputs) and minus the gradients it leaves (dh, dW):
the method's own working memory. At a softcap shape every provider that
takes a softcap applies it (ours by the extended cross-entropy kernel);
`softcap_applied` says which did. Peers' wheels:
`pip install --no-deps .gpu-peers/*.whl`.

`--dry-run` needs no GPU: it checks the arguments, resolves each provider
and runs ours and eager once on a small CPU head (with the softcap where
the shape has one), printing their losses side by side; nothing is timed.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

SHAPES = [(8192, 4096, 128256, None), (16384, 2304, 256000, 30.0), (8192, 4096, 32000, None)]
"""(rows, hidden, vocab, softcap): Llama-3-8B, Gemma-2-2B (softcap 30), a 32K head."""

PROVIDERS = [
    "ours",
    "ours_serial",
    "ours:256",
    "ours:1024",
    "ours_serial:1024",
    "eager",
    "compile",
    "liger",
    "cce",
    "quack",
    "gemm_floor",
]

Step = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]
"""One fwd+bwd: (h, w, target), leaving h.grad and w.grad."""


class Unsupported(Exception):
    """A provider that cannot run this case (not installed, no softcap)."""


def _capped(logits: torch.Tensor, softcap: float | None) -> torch.Tensor:
    return logits if softcap is None else softcap * torch.tanh(logits / softcap)


def _eager_loss(h, w, t, softcap):
    # In the logits' dtype (bf16), not upcast to float32: the leaner eager.
    return F.cross_entropy(_capped(F.linear(h, w), softcap), t)


def make_step(provider: str, softcap: float | None) -> tuple[Step, bool]:
    """The fwd+bwd of `provider`, and whether it applies `softcap`."""
    name, _, mib = provider.partition(":")
    if name in ("ours", "ours_serial"):
        from max_softmax.torch import linear as lce

        overlap = name == "ours"
        chunk_bytes = int(mib) * 2**20 if mib else None  # None: the library's default

        def ours(h, w, t):
            lce.linear_cross_entropy(
                h, w, t, softcap=softcap, chunk_bytes=chunk_bytes, overlap=overlap
            ).backward()

        return ours, True
    if provider == "eager":
        return (lambda h, w, t: _eager_loss(h, w, t, softcap).backward()), True
    if provider == "compile":
        compiled = torch.compile(lambda h, w, t: _eager_loss(h, w, t, softcap))
        return (lambda h, w, t: compiled(h, w, t).backward()), True
    if provider == "liger":
        try:
            from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
        except ImportError as err:
            raise Unsupported(f"liger_kernel: {err}") from None
        fn = LigerFusedLinearCrossEntropyLoss(softcap=softcap)
        return (lambda h, w, t: fn(w, h, t).backward()), True
    if provider == "cce":
        try:
            from cut_cross_entropy import linear_cross_entropy
        except ImportError as err:
            raise Unsupported(f"cut_cross_entropy: {err}") from None
        return (lambda h, w, t: linear_cross_entropy(h, w, t, softcap=softcap).backward()), True
    if provider == "quack":
        fn = _quack()
        if softcap is not None:
            return (lambda h, w, t: fn(h, w, t).backward()), False
        return (lambda h, w, t: fn(h, w, t).backward()), True
    if provider == "gemm_floor":

        def floor(h, w, t):
            # dlogits stands in for the cross-entropy's output: the GEMMs'
            # time does not depend on its values.
            logits = h @ w.t()
            h.grad = logits @ w
            w.grad = logits.t() @ h

        return floor, True
    raise ValueError(f"unknown provider {provider!r}")


def _quack() -> Callable:
    """QuACK's chunked linear cross-entropy (x, weight, target) -> loss."""
    try:
        import quack.linear_cross_entropy as q
    except ImportError as err:
        raise Unsupported(f"quack.linear_cross_entropy: {err}") from None
    for name in ("chunked_linear_cross_entropy", "linear_cross_entropy"):
        fn = getattr(q, name, None)
        if fn is not None:
            return fn
    raise Unsupported("quack.linear_cross_entropy has no linear cross-entropy function")


def _inputs(rows: int, hidden: int, vocab: int, provider: str):
    g = torch.Generator(device="cuda").manual_seed(0)
    h = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(vocab, hidden, device="cuda", dtype=torch.bfloat16, generator=g)
    w /= hidden**0.5
    t = torch.randint(0, vocab, (rows,), device="cuda", generator=g)
    needs_grad = provider != "gemm_floor"
    return h.requires_grad_(needs_grad), w.requires_grad_(needs_grad), t


def run_case(provider: str, shape: tuple, softcap: float | None, warmup: int, reps: int) -> dict:
    """One (provider, shape, softcap) record."""
    rows, hidden, vocab = shape
    record: dict = {"provider": provider, "rows": rows, "hidden": hidden, "vocab": vocab}
    record["softcap"] = softcap
    try:
        step, applied = make_step(provider, softcap)
    except Unsupported as err:
        return {**record, "status": "unsupported", "why": str(err)}
    record["softcap_applied"] = applied if softcap is not None else None
    h, w, t = _inputs(rows, hidden, vocab, provider)
    try:
        for _ in range(warmup):
            h.grad = w.grad = None
            step(h, w, t)
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            h.grad = w.grad = None
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step(h, w, t)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        h.grad = w.grad = None
        gc.collect()
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step(h, w, t)
        torch.cuda.synchronize()
        grads = sum(g.numel() * g.element_size() for g in (h.grad, w.grad) if g is not None)
        peak = torch.cuda.max_memory_allocated() - base - grads
    except torch.OutOfMemoryError as err:
        return {**record, "status": "oom", "why": str(err).splitlines()[0]}
    finally:
        del h, w, t
        gc.collect()
        torch.cuda.empty_cache()
    flops = 3 * 2 * rows * hidden * vocab
    ms = statistics.median(times)
    return {
        **record,
        "status": "ok",
        "ms": ms,
        "ms_all": times,
        "tflops": flops / ms / 1e9,
        "extra_peak_bytes": peak,
        "logits_bytes_bf16": rows * vocab * 2,
    }


def dry_run(providers: list[str], shapes: list[tuple]) -> int:
    """Resolve every provider and run ours and eager once on a small CPU
    head with each shape's softcap, one JSON line each; 1 if ours fails or
    disagrees with float64 eager, else 0."""
    failed = False
    for _, _, _, softcap in shapes:
        g = torch.Generator().manual_seed(0)
        rows, hidden, vocab = 48, 32, 500
        h = torch.randn(rows, hidden, generator=g)
        w = torch.randn(vocab, hidden, generator=g) * 8 / hidden**0.5
        t = torch.randint(0, vocab, (rows,), generator=g)
        want = _eager_loss(h.double(), w.double(), t, softcap).item()
        for provider in providers:
            rec: dict = {"provider": provider, "softcap": softcap}
            try:
                step, applied = make_step(provider, softcap)
                rec["softcap_applied"] = applied if softcap is not None else None
                name = provider.partition(":")[0]
                if name in ("ours", "ours_serial"):
                    from max_softmax.torch import linear as lce

                    hg, wg = h.clone().requires_grad_(), w.clone().requires_grad_()
                    loss = lce.linear_cross_entropy(hg, wg, t, softcap=softcap)
                    loss.backward()
                    ok = abs(loss.item() - want) <= 1e-4 * max(1.0, abs(want))
                    rec.update(status="ran" if ok else "mismatch", loss=loss.item(), eager64=want)
                    failed = failed or not ok
                elif provider in ("eager", "gemm_floor"):
                    hg, wg = h.clone().requires_grad_(), w.clone().requires_grad_()
                    step(hg, wg, t)
                    rec["status"] = "ran"
                else:
                    rec["status"] = "resolved"
            except Unsupported as err:
                rec.update(status="unsupported", why=str(err))
            except Exception as err:
                rec.update(status="error", why=f"{type(err).__name__}: {err}"[:400])
                failed = failed or provider.startswith("ours")
            print(json.dumps(rec), flush=True)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    """Run the grid and write JSON (and one line a record to stderr)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("linear_ce.json"))
    p.add_argument("--shapes", default=None, help="RxHxV[:softcap],... (default: the three heads)")
    p.add_argument("--providers", default=",".join(PROVIDERS))
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="no GPU: check the arguments, resolve the providers, run ours and eager on the CPU",
    )
    args = p.parse_args(argv)
    shapes = SHAPES
    if args.shapes:
        shapes = []
        for item in args.shapes.split(","):
            dims, _, cap = item.partition(":")
            try:
                r, hdim, v = (int(x) for x in dims.split("x"))
                shapes.append((r, hdim, v, float(cap) if cap else None))
            except ValueError:
                p.error(f"--shapes takes RxHxV[:softcap],..., got {item!r}")
    providers = args.providers.split(",")
    unknown = [x for x in providers if x.partition(":")[0] not in PROVIDERS and x not in PROVIDERS]
    if unknown:
        p.error(f"--providers: unknown {unknown}; choose from {PROVIDERS} (ours:MiB too)")
    if args.dry_run:
        return dry_run(providers, shapes)
    if not torch.cuda.is_available():
        print("linear_ce_bench: needs CUDA (--dry-run checks on the CPU)", file=sys.stderr)
        return 2
    records = []
    for r, hdim, v, cap in shapes:
        for provider in providers:
            rec = run_case(provider, (r, hdim, v), cap, args.warmup, args.reps)
            records.append(rec)
            print(json.dumps({k: x for k, x in rec.items() if k != "ms_all"}), file=sys.stderr)
    meta = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "dtype": "bfloat16",
        "reduction": "mean",
        "ignore_index": "none ignored",
    }
    args.out.write_text(json.dumps({"meta": meta, "records": records}, indent=1))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
