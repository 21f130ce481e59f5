"""Cross-entropy fwd + bwd through autograd on CUDA: the torch bridge on both
of its launch paths against our replayed graph and the peers, in JSON.

    python benchmarks/tools/bridge_ce_bench.py --out bridge_ce.json
    python benchmarks/tools/bridge_ce_bench.py --shapes 8192x50257 --dtypes bfloat16 \\
        --providers ours_launch,ours_graph
    python benchmarks/tools/bridge_ce_bench.py --options none,z_loss,softcap,weight,all
    python benchmarks/tools/bridge_ce_bench.py --dry-run --options all   # CPU: arguments

Providers (each guarded: one that cannot be imported, built or run is
recorded as such, the rest go on):

- ours_launch: `max_softmax.torch.cross_entropy`, the launch extension
  (built first, in the foreground);
- ours_graph: the same with the extension switched off: the graph path
  (`MAX_SOFTMAX_LAUNCH=graph`: destination-passing models on buffer views);
- ours_inplace: ours_launch with `inplace_backward=True` (the gradient over
  the logits);
- replay: MAX capture/replay of K `ops.cross_entropy_with_grad` calls on K
  input sets (the kernel with no torch, no autograd, no per-call host work);
- eager: `F.cross_entropy`; compile: the same under `torch.compile`;
- liger: liger_kernel's LigerCrossEntropyLoss; quack: quack's cross_entropy.

Options (`--options`, each a set of records): none; z_loss (1e-4: each
row adds z lse^2); softcap (30: logits c tanh(x / c) first); weight (class
weights); all (the three together). Ours takes them as arguments (the
extended options, through the launch extension or the op's model as
without them); eager and
compile write softcap and z-loss in torch ops around F.cross_entropy
(weight= is torch's); liger passes them as LigerCrossEntropyLoss's
softcap, lse_square_scale and weight; quack where its cross_entropy takes
them (else "unsupported"), as are ours_inplace and replay (plain only).

`--dry-run` needs no GPU: it checks the arguments, resolves each provider
(imports, the options it takes) and runs ours and eager once on small CPU
logits, printing the losses side by side; nothing is timed.

Each torch call gets fresh logits (`torch.randn`, outside the timed span)
requiring grad and fresh targets; the timed span (CUDA events) is the loss
and `loss.backward()`. The figure is the median of `--reps` calls after
`--warmup`, and GB/s-eq = 2 x logits bytes / time (the read of the logits
and the write of their gradient).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from cuda_events import median_ms

SHAPES = [(8192, 50257), (4096, 128256), (16384, 32000)]
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
PROVIDERS = [
    "ours_launch",
    "ours_graph",
    "ours_inplace",
    "replay",
    "eager",
    "compile",
    "liger",
    "quack",
]

OPTION_SETS: dict[str, dict] = {
    "none": {},
    "z_loss": {"z_loss": 1e-4},
    "softcap": {"softcap": 30.0},
    "weight": {"weight": True},
    "all": {"z_loss": 1e-4, "softcap": 30.0, "weight": True},
}
"""`--options` names: the cross-entropy options each set times ("weight":
class weights, drawn per case)."""

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class Unsupported(Exception):
    """A provider that cannot run here (not installed, not built)."""


def class_weight(n: int, device: str) -> torch.Tensor:
    """Class weights for the "weight" options: float32 in [0.5, 1.5)."""
    g = torch.Generator(device=device).manual_seed(1)
    return torch.rand(n, device=device, generator=g) + 0.5


def _ours(
    path: str,
    inplace: bool = False,
    options: dict | None = None,
    weight: torch.Tensor | None = None,
    build: bool = True,
) -> Loss:
    """The bridge's cross-entropy with the launch extension on ("launch",
    built now where `build`) or off ("graph"), under `options`."""
    import max_softmax.torch as mst
    from max_softmax import launch
    from max_softmax.torch import _launch as torch_launch

    options = options or {}
    if path == "launch":
        launch.CUDA_ENABLED = True
        if build:
            try:
                launch.extension()
            except Exception as err:
                raise Unsupported(f"launch extension: {err}") from None
        torch_launch.available = launch.available
    else:
        torch_launch.available = lambda cuda=False: False
    if inplace:
        if options:
            raise Unsupported("inplace_backward takes no weight, z_loss or softcap")
        return lambda x, t: mst.cross_entropy(x, t, inplace_backward=True)
    if not options:
        return mst.cross_entropy
    z_loss, softcap = options.get("z_loss", 0.0), options.get("softcap")
    return lambda x, t: mst.cross_entropy(x, t, weight, z_loss=z_loss, softcap=softcap)


def torch_ops_loss(options: dict, weight: torch.Tensor | None) -> Loss:
    """F.cross_entropy with softcap and z-loss written in torch ops, the
    semantics of ours: logits c tanh(x / c) first; each row adds z lse^2,
    inside the mean (over the sum of the targets' weights with weights)."""
    z_loss, softcap = options.get("z_loss", 0.0), options.get("softcap")
    if not options:
        return F.cross_entropy

    def loss(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        w = None if weight is None else weight.to(x.dtype)
        y = softcap * torch.tanh(x / softcap) if softcap else x
        ce = F.cross_entropy(y, t, weight=w)
        if not z_loss:
            return ce
        z = torch.logsumexp(y.to(torch.promote_types(y.dtype, torch.float32)), -1).square()
        count = t.numel() if w is None else w[t].float().sum()
        return ce + z_loss * z.sum() / count

    return loss


def _liger(options: dict, weight: torch.Tensor | None) -> Loss:
    """LigerCrossEntropyLoss under `options`, where its version takes them."""
    try:
        from liger_kernel.transformers import LigerCrossEntropyLoss
    except Exception as err:
        raise Unsupported(f"liger_kernel: {err}") from None
    names = {"z_loss": "lse_square_scale", "softcap": "softcap", "weight": "weight"}
    kwargs = _supported(LigerCrossEntropyLoss.__init__, options, names, weight, "liger")
    return LigerCrossEntropyLoss(**kwargs)


def _quack(options: dict, weight: torch.Tensor | None) -> Loss:
    """quack's cross_entropy under `options`, where it takes them."""
    try:  # quack/__init__ exports names that shadow its submodules
        q = importlib.import_module("quack.cross_entropy")
    except Exception as err:
        raise Unsupported(f"quack.cross_entropy: {err}") from None
    names = {"z_loss": "lse_square_scale", "softcap": "softcap", "weight": "weight"}
    kwargs = _supported(q.cross_entropy, options, names, weight, "quack")
    return lambda x, t: q.cross_entropy(x, t, reduction="mean", **kwargs)


def _supported(
    fn: Callable, options: dict, names: dict[str, str], weight: torch.Tensor | None, who: str
) -> dict:
    """`options` as `fn`'s keyword arguments (`names` maps ours to its),
    or Unsupported naming the first one `fn` does not take."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}
    kwargs = {}
    for key, value in options.items():
        name = names[key]
        if name not in params:
            raise Unsupported(f"{who} takes no {key} ({name}=)")
        kwargs[name] = weight if key == "weight" else value
    return kwargs


def make_loss(
    provider: str, option: str = "none", weight: torch.Tensor | None = None, build: bool = True
) -> Loss:
    """The loss function `provider` times under the `option` set (raises
    Unsupported); `weight` the class weights where the set has them."""
    options = OPTION_SETS[option]
    if provider in ("ours_launch", "ours_graph", "ours_inplace"):
        path = "graph" if provider == "ours_graph" else "launch"
        return _ours(path, provider == "ours_inplace", options, weight, build)
    if provider == "eager":
        return torch_ops_loss(options, weight)
    if provider == "compile":
        return torch.compile(torch_ops_loss(options, weight))
    if provider == "liger":
        return _liger(options, weight)
    if provider == "quack":
        return _quack(options, weight)
    if provider == "replay":
        if options:
            raise Unsupported("replay times the plain op only")
        raise ValueError("replay is timed by time_replay, not as a loss")
    raise ValueError(f"unknown provider {provider!r}; choose from {PROVIDERS}")


def time_torch(loss_fn: Loss, rows: int, n: int, dtype: torch.dtype, warmup: int, reps: int):
    """Median ms of loss + backward, fresh logits and targets each call."""

    def fresh(i: int) -> tuple:
        x = torch.randn(rows, n, device="cuda", dtype=dtype).requires_grad_()
        return x, torch.randint(0, n, (rows,), device="cuda")

    return median_ms(lambda x, t: loss_fn(x, t).backward(), reps, warmup, fresh)


def time_replay(rows: int, n: int, dtype: str, reps: int) -> float:
    """Median ms a call of K captured `ops.cross_entropy_with_grad` calls on
    K input sets, replayed (ab_replay's graph)."""
    import numpy as np
    from max.driver import Accelerator
    from max.engine import InferenceSession

    sys.path.insert(0, str(Path(__file__).parent))
    import ab_replay

    gpu = Accelerator()
    session = InferenceSession(devices=[gpu])
    size = 4 if dtype == "float32" else 2
    k = int(min(16, max(2, (256 << 20) // (rows * n * size))))
    model = session.load(ab_replay._graph("cross_entropy", dtype, k))
    bufs = ab_replay._inputs("cross_entropy", dtype, rows, n, k, gpu, np.random.default_rng(0))
    key = hash(("bridge_ce", dtype, rows, n)) & 0x7FFFFFFF
    outs = model.capture(key, *bufs)
    gpu.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        model.replay(key, *bufs)
        gpu.synchronize()
        times.append(time.perf_counter() - t0)
    del outs
    model.release_captured_graph(key)
    return statistics.median(times) / k * 1e3


def run_case(
    provider: str, rows: int, n: int, dtype: str, warmup: int, reps: int, option: str = "none"
) -> dict:
    """One (provider, options, dtype, shape) record."""
    record: dict = {"provider": provider, "options": option, "dtype": dtype, "rows": rows, "n": n}
    try:
        if provider == "replay":
            if OPTION_SETS[option]:
                raise Unsupported("replay times the plain op only")
            ms = time_replay(rows, n, dtype, reps)
        else:
            weight = class_weight(n, "cuda") if "weight" in OPTION_SETS[option] else None
            ms = time_torch(
                make_loss(provider, option, weight), rows, n, DTYPES[dtype], warmup, reps
            )
    except Unsupported as err:
        return {**record, "status": "unsupported", "why": str(err)}
    except torch.OutOfMemoryError as err:
        torch.cuda.empty_cache()
        return {**record, "status": "oom", "why": str(err)[:200]}
    except Exception as err:  # one provider's failure must not end the run
        return {**record, "status": "error", "why": f"{type(err).__name__}: {err}"[:400]}
    moved = 2 * rows * n * torch.tensor([], dtype=DTYPES[dtype]).element_size()
    return {**record, "status": "ok", "ms": ms, "gbps_eq": moved / (ms * 1e-3) / 1e9}


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, time every case, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("bridge_ce.json"))
    parser.add_argument("--providers", default=",".join(PROVIDERS))
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--shapes", default=",".join(f"{r}x{n}" for r, n in SHAPES))
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument(
        "--options",
        default="none",
        help=f"comma-separated option sets from {list(OPTION_SETS)} (default: none)",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="no GPU: check the arguments, resolve the providers, run ours and eager on the CPU",
    )
    args = parser.parse_args(argv)
    try:
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
        if any(len(s) != 2 or min(s) < 1 for s in shapes):
            raise ValueError
    except ValueError:
        parser.error(f"--shapes takes ROWSxN,... of positive ints, got {args.shapes!r}")
    providers = args.providers.split(",")
    for name, known, flag in (
        (providers, PROVIDERS, "--providers"),
        (args.options.split(","), list(OPTION_SETS), "--options"),
        (args.dtypes.split(","), list(DTYPES), "--dtypes"),
    ):
        unknown = [x for x in name if x not in known]
        if unknown:
            parser.error(f"{flag}: unknown {unknown}; choose from {known}")
    options = args.options.split(",")
    if args.dry_run:
        return dry_run(providers, options, args.dtypes.split(","))
    if not torch.cuda.is_available():
        print("bridge_ce_bench: needs a CUDA device (--dry-run checks on the CPU)", file=sys.stderr)
        return 2
    # The launch paths switch a module attribute: the graph path last, so
    # the extension's providers are not timed on it by mistake.
    providers.sort(key=lambda p: p == "ours_graph")
    records = []
    for provider in providers:
        for option in options:
            for dtype in args.dtypes.split(","):
                for rows, n in shapes:
                    rec = run_case(provider, rows, n, dtype, args.warmup, args.reps, option)
                    print(json.dumps(rec), flush=True)
                    records.append(rec)
                    torch.cuda.empty_cache()
    meta = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "warmup": args.warmup,
        "reps": args.reps,
        "option_sets": {k: OPTION_SETS[k] for k in options},
    }
    args.out.write_text(json.dumps({"meta": meta, "records": records}, indent=1) + "\n")
    return 0


def dry_run(providers: list[str], options: list[str], dtypes: list[str]) -> int:
    """Resolve every (provider, options) pair and run those that can run on
    the CPU (ours, eager) once on small logits, one JSON line each; returns
    1 if one of those failed or ours and eager disagree, else 0."""
    rows, n = 64, 1000
    failed = False
    for option in options:
        weight = class_weight(n, "cpu") if "weight" in OPTION_SETS[option] else None
        for dtype in dtypes:
            g = torch.Generator().manual_seed(0)
            x = (torch.randn(rows, n, generator=g) * 20).to(DTYPES[dtype])
            t = torch.randint(0, n, (rows,), generator=g)
            want = torch_ops_loss(OPTION_SETS[option], weight)(x.double(), t).item()
            for provider in providers:
                rec: dict = {"provider": provider, "options": option, "dtype": dtype}
                try:
                    if provider == "replay":
                        if OPTION_SETS[option]:
                            raise Unsupported("replay times the plain op only")
                        rec.update(status="resolved", why="MAX replay: timed on the GPU only")
                        print(json.dumps(rec), flush=True)
                        continue
                    fn = make_loss(provider, option, weight, build=False)
                    if provider.startswith("ours") or provider == "eager":
                        leaf = x.clone().requires_grad_()
                        loss = fn(leaf, t)
                        loss.backward()
                        rec.update(status="ran", loss=loss.item(), float64_eager=want)
                        tol = 1e-4 if dtype == "float32" else 2e-2
                        if not abs(loss.item() - want) <= tol * max(1.0, abs(want)):
                            rec["status"] = "mismatch"
                            failed = True
                    else:
                        rec["status"] = "resolved"
                except Unsupported as err:
                    rec.update(status="unsupported", why=str(err))
                except Exception as err:
                    rec.update(status="error", why=f"{type(err).__name__}: {err}"[:400])
                    failed = failed or provider.startswith("ours") or provider == "eager"
                print(json.dumps(rec), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
