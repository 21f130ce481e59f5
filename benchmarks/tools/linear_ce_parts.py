"""Where the time of `max_softmax.torch.linear_cross_entropy` goes, part by
part, on CUDA: each chunk's three GEMMs and its cross-entropy, timed alone,
against the same GEMMs over all rows at once (the three-GEMM floor).

    python benchmarks/tools/linear_ce_parts.py --out parts.json
    python benchmarks/tools/linear_ce_parts.py --shape 16384x2304x256000 --softcap 30 \\
        --chunks 1024,2048,4096

For each chunk size (rows), one JSON line per part, as the chunked loop
runs them (torch/linear.py `_passes`):

- logits: `torch.mm(h_c, W^T, out=buf)`;
- cross_entropy: our fused cross-entropy over the chunk, in place (the
  softcap's extended kernel where `--softcap`);
- dh: `dh_c.addmm_(g, W, beta=0)`;
- dw_first / dw_acc: `dW.addmm_(g^T, h_c)` with beta 0 (the first chunk)
  and beta 1 (every later one: it reads and writes all of dW);
- chunk_total: the sum a whole pass would take, chunks x (logits + ce + dh)
  + dw_first + (chunks - 1) x dw_acc;

and the floor's three GEMMs over all rows. CUDA events, median of `--reps`
after warm-up; inputs are bf16 as in `linear_ce_bench.py`.

`--profile` instead runs one whole `linear_cross_entropy` fwd + bwd (the
default chunking), then the floor's three GEMMs, each under torch.profiler,
and writes their GPU kernels summed by name (calls, ms) beside each one's
CUDA-event time and the kernels' total (busy) time: what the parts above
leave out.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from cuda_events import median_ms


def _chunk_parts(hc, w, tc, dhc, dw, options, reps: int) -> dict[str, float]:
    """ms of each part of one chunk of rows `hc` (see the module docstring)."""
    from max_softmax.torch import _launch as torch_launch

    buf = torch.empty(hc.shape[0], w.shape[0], device=hc.device, dtype=hc.dtype)
    loss = torch.empty(hc.shape[0], device=hc.device, dtype=hc.dtype)
    wt = w.t()

    def ce() -> None:
        torch.mm(hc, wt, out=buf)  # fresh logits: the kernel writes over them
        torch_launch.cross_entropy(loss, buf, buf, tc, options, "none")

    parts = {
        "logits": median_ms(lambda: torch.mm(hc, wt, out=buf), reps),
        "dh": median_ms(lambda: dhc.addmm_(buf, w, beta=0), reps),
        "dw_first": median_ms(lambda: dw.addmm_(buf.t(), hc, beta=0), reps),
        "dw_acc": median_ms(lambda: dw.addmm_(buf.t(), hc, beta=1), reps),
    }
    parts["cross_entropy"] = median_ms(ce, reps) - parts["logits"]
    return parts


def measure(shape: tuple[int, int, int], softcap: float | None, chunks: list[int], reps: int):
    """Yield one record per (chunk rows, part), then the floor's GEMMs."""
    from max_softmax.torch.linear import _options

    rows, hidden, vocab = shape
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    h = torch.randn(rows, hidden, device=dev, dtype=torch.bfloat16, generator=gen)
    w = torch.randn(vocab, hidden, device=dev, dtype=torch.bfloat16, generator=gen) * 0.02
    t = torch.randint(0, vocab, (rows,), device=dev, generator=gen)
    dw = torch.empty_like(w)
    dh = torch.empty_like(h)
    options = _options(dev, -100, 0.0, 0.0, softcap or 0.0)
    base = {"shape": f"{rows}x{hidden}x{vocab}", "softcap": softcap}
    for c in chunks:
        parts = _chunk_parts(h[:c], w, t[:c], dh[:c], dw, options, reps)
        n = -(-rows // c)
        parts["chunk_total"] = (
            n * (parts["logits"] + parts["cross_entropy"] + parts["dh"])
            + parts["dw_first"]
            + (n - 1) * parts["dw_acc"]
        )
        for part, ms in parts.items():
            yield {**base, "chunk_rows": c, "chunks": n, "part": part, "ms": round(ms, 4)}
    logits = torch.empty(rows, vocab, device=dev, dtype=torch.bfloat16)
    floor = {
        "floor_logits": median_ms(lambda: torch.mm(h, w.t(), out=logits), reps),
        "floor_dh": median_ms(lambda: torch.mm(logits, w, out=dh), reps),
        "floor_dw": median_ms(lambda: torch.mm(logits.t(), h, out=dw), reps),
    }
    floor["floor_total"] = sum(floor.values())
    for part, ms in floor.items():
        yield {**base, "chunk_rows": rows, "chunks": 1, "part": part, "ms": round(ms, 4)}


def profile(shape: tuple[int, int, int], softcap: float | None, reps: int):
    """Yield, for one `linear_cross_entropy` fwd + bwd and then the floor's
    three GEMMs: the median CUDA-event time, the kernels' busy time, and
    the kernels summed by name (largest first)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from max_softmax.torch.linear import linear_cross_entropy

    rows, hidden, vocab = shape
    gen = torch.Generator(device="cuda").manual_seed(0)
    h = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = torch.randn(vocab, hidden, device="cuda", dtype=torch.bfloat16, generator=gen)
    w /= hidden**0.5
    h.requires_grad_(True)
    w.requires_grad_(True)
    t = torch.randint(0, vocab, (rows,), device="cuda", generator=gen)

    def step() -> None:
        h.grad = w.grad = None
        linear_cross_entropy(h, w, t, softcap=softcap).backward()

    def floor() -> None:
        logits = h.detach() @ w.detach().t()
        _ = logits @ w.detach(), logits.t() @ h.detach()

    base = {"shape": f"{rows}x{hidden}x{vocab}", "softcap": softcap}
    for what, fn in (("call", step), ("floor", floor)):
        yield {**base, "what": what, "part": "wall", "ms": round(median_ms(fn, reps), 4)}
        with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        totals: dict[str, list[float]] = {}
        for event in prof.events():
            if event.device_type == torch.autograd.DeviceType.CUDA:
                entry = totals.setdefault(event.name[:90], [0, 0.0])
                entry[0] += 1
                entry[1] += event.time_range.elapsed_us() / 1000
        busy = sum(ms for _, ms in totals.values())
        yield {**base, "what": what, "part": "kernels", "ms": round(busy, 4)}
        for name, (calls, ms) in sorted(totals.items(), key=lambda kv: -kv[1][1]):
            yield {**base, "what": what, "part": name, "calls": calls, "ms": round(ms, 4)}


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, time the parts and write JSON lines."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="16384x2304x256000", help="rows x hidden x vocab")
    p.add_argument("--softcap", type=float, default=None)
    p.add_argument("--chunks", default="1024,2048,4096", help="chunk rows, comma-separated")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--profile", action="store_true", help="one whole call's kernels, by name")
    p.add_argument("--out", type=Path, default=None, help="JSON lines (default: stdout only)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("linear_ce_parts: needs CUDA", file=sys.stderr)
        return 2
    shape = tuple(int(s) for s in args.shape.split("x"))
    chunks = [int(s) for s in args.chunks.split(",")]
    sink = args.out.open("a") if args.out else None
    records = (
        profile(shape, args.softcap, args.reps)
        if args.profile
        else measure(shape, args.softcap, chunks, args.reps)
    )
    for record in records:
        line = json.dumps(record)
        print(line, flush=True)
        if sink:
            sink.write(line + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
