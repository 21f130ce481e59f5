"""`softmax bench`: GB/s of our kernels against every peer that is installed.

Method (the same for every provider, so the numbers compare):

- Fresh random inputs (never zeros). K distinct input/output pairs are
  rotated so that the K tensors together exceed the GPU's L2 (50 MB on an
  H100): each call reads from HBM, as in a model.
- Marginal time per call = (T(K calls) - T(1 call)) / (K - 1), each T the
  median of several synchronized wall-clock runs after a warm-up. This
  removes fixed per-`execute` / per-sync overhead (MAX's ~30 us) for all
  providers alike. For MAX (ours and the built-in) the K calls are K ops in
  one graph, executed once.
- GB/s = bytes that must move (read input + write output = 2 x tensor
  bytes) / time; the roof is a device copy of the same tensors measured in
  the same run.
- Every provider's output is checked against the float64 SciPy reference
  (first rows) before it is timed; a failing provider is reported, not
  timed. An error in one provider becomes a note in its row, never the end
  of the sweep.

Three figures per MAX provider (ours, ours:<variant>, max.ops.softmax), side
by side in the table and in each JSON row:

- exec (`us`, `gbps`, the headline): the K-op graph executed, marginal wall
  time as above. MAX adds 7-16 µs of host work per graph op (H100), which
  this counts: it is what a user calling `model.execute` gets.
- replay (`replay_us`, `replay_gbps`): the same K-op graph captured once as a
  device graph (`model.capture`) and replayed (`model.replay`, same buffers),
  marginal like exec: (T(R replays + sync) - T(1 replay + sync)) / ((R - 1)
  K), R = max(2, ceil(96 / K)), each T a median, the two timed alternately.
  This removes a sample's fixed cost (the first replay's host time and
  launch, the sync's return: ~15-25 µs, not the same for MAX's replay and
  torch's), and there is no per-op host work: what a user who captures
  gets. Where T(R) <= T(1) the figure is None with a note (raise --reps).
  First, replayed output 0 must equal executed output 0 bit for bit, else
  the figure is skipped with a note. On the CPU capture is unsupported:
  the figure is None with MAX's reason in `notes["replay"]`.
- device (`device_us`, `device_gbps`): the GPU's own busy time, the union of
  every kernel, memcpy and memset span CUPTI records during the K ops, / K
  (device_timer.py; GPU with torch only, else None with a note).

Peers (copy, torch, ours:torch, triton, quack, torch.compile, liger, jax,
scipy, numpy) have one timed figure, in `us`/`gbps`: their marginal
wall-clock time, or with `--timer device` (the default on a GPU with torch)
their GPU busy time per call, which is then also their `device_*` (the wall
figure stays in `extra.wall_us`). A peer launches its kernels straight from
Python, so that figure stands beside all three of ours; the table's "% of
copy" and "ours <figure> / best peer <figure>" columns compare like with
like: ours' device figure when the peers were timed on the device, ours'
exec figure when they were timed by wall clock.

On a GPU the torch-based peers (every one but jax, scipy and numpy) also
get a replay figure (`replay_us`, `replay_gbps`; `extra.replay` =
"torch.cuda.graph"): their K-call body captured once into a
`torch.cuda.CUDAGraph` and replayed, timed exactly as ours' replay (the same
loop). It is what a torch user who captures gets, set against ours' replay
in the table's "ours replay / best peer replay": like for like, where our
replay (wall clock) against a peer's busy time would charge ours the
launch gaps that busy time leaves out. First, replayed output 0 must equal the eager body's
output 0 bit for bit (the captured output is filled with NaN first), else
no figure. A body that cannot be captured gets none, with the reason in
`notes["replay"]`: one that waits on the host mid-call (Liger-Kernel's
cross-entropy counts the kept targets with `.item()`), or one whose
capture torch or the library refuses (bodies through autograd,
torch.compile and our torch bridge are tried like the rest; the note says
why where one fails). jax, scipy, numpy and every peer on the CPU have no
replay (`replay_*` None, with a note).

`--op` picks what is timed: `softmax` (default; our graph op and every
peer), `softmax_backward` / `log_softmax_backward` (read y or log y and dy,
write dx: 3 tensors a call; peers torch's backward and, for softmax, QuACK's
where importable), `torch_fwd_bwd` (a torch training step's
softmax, forward + backward through autograd: 5 tensors a call; our op
through the `max_softmax.torch` bridge, its overhead included, against
`torch.softmax`), `cross_entropy` (the mean loss and its gradient
dlogits of (rows, V) logits and int64 targets, 5% of them ignore_index
-100; GB/s = 2 x logits bytes, what a fused kernel must move: read the
logits once, write dlogits once. Ours is a K-op graph of
`ops.cross_entropy_with_grad`; peers torch's `F.cross_entropy` + `.backward()`,
its `torch.compile` (GPU), our torch bridge `ours:torch`, and on the GPU
Liger-Kernel and QuACK where importable; the check is against a float64
reference of the mean over the whole batch, computed in chunks), or
`cross_entropy_loss` (the same loss alone, no gradient: GB/s = 1 x logits
bytes, as it only reads them. The copy counts 2 x, so the issue's target,
loss time <= 0.55 x copy time, is >= 91% of copy GB/s; the table also gives
ours' time over the copy's. Ours is a K-op graph of the registry op
`cross_entropy`; peers as for cross_entropy, each under `torch.no_grad()`:
torch, torch.compile, ours:torch and QuACK run their forward alone, and
Liger-Kernel where its kernel skips the gradient on logits that do not
require grad, else its row says why not). With
`--bridge` the softmax sweep also times our op called
from torch (`ours:torch`); `--latency` times one call on a tiny input
instead (latency.py).

Before the first shape, the bench says what each provider needs and builds
all of it side by side, one build per core (ahead.py): per dtype a 1-op and
a K-op graph for each MAX provider (symbolic dims: they serve every shape),
and on the CPU the launch extension for `ours:numpy`. Nothing compiles while
anything is timed. `--dtype` defaults to float32 on the CPU (float32 and
bfloat16 on a GPU). On the CPU the softmax forward times ours as numpy users
call it, `ours:numpy` (no graph); `--graph` adds ours as a K-op MAX graph.

Output goes to ./softmax-bench/ (`--out`), never over files git tracks:
`bench_<device>[_<op>][_<tag>].json` first (rewritten after every shape),
then `.md` (title, run metadata, table, footnotes) and `.png`. `--record
FILE` appends every row, with the run's metadata, to a JSON-lines file
(benchmarks/results/results.jsonl gets its data this way).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from ..devices import NoGPUError, resolve_device
from ..dtypes import DTYPE_NAMES
from .measure import flag_impossible
from .progress import say
from .record import (
    DEFAULT_OUT,
    OutputError,
    append_record,
    refuse_tracked,
    run_info,
    run_kind,
    write_json,
)
from .report import document, plot, table
from .workloads import WORKLOADS, Row

__all__ = ["WORKLOADS", "Row", "build_parser", "flag_impossible", "main", "resolve_timer", "table"]


DEFAULT_DTYPES: dict[str, tuple[str, ...]] = {
    "gpu": ("float32", "bfloat16"),
    # numpy has no bfloat16 and the CPU has no bf16 math: float32 is what a
    # CPU user runs, and a second dtype would double the graphs to compile.
    "cpu": ("float32",),
}
"""The dtypes timed when `--dtype` is not given, per device kind."""


def _shape(text: str) -> tuple[int, int]:
    try:
        rows, n = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad shape {text!r}; use e.g. 4096x1024") from None
    if rows < 1 or n < 1:
        raise argparse.ArgumentTypeError(f"bad shape {text!r}; dims must be >= 1")
    return rows, n


def build_parser() -> argparse.ArgumentParser:
    """Arguments of `softmax bench`."""
    p = argparse.ArgumentParser(
        prog="softmax bench",
        description="GB/s of our kernels against every peer that is installed (MAX's "
        "ops.softmax, torch, Triton, JAX, QuACK, SciPy, numpy) and a copy, each checked "
        "against a float64 reference before it is timed. First it says what each provider "
        "needs and builds it all side by side, one build per core: per dtype a 1-op and a "
        "K-op MAX graph for each MAX provider (MAX's built-in; ours on a GPU, or on the CPU "
        "with --graph), 12-17 s each on a quiet core the first time, ~1-2 s from MAX's "
        "cache after; on the CPU the launch extension for ours:numpy. Writes JSON, Markdown "
        "and a PNG; a figure it cannot give says why and what to do on the same line.",
    )
    p.add_argument(
        "--device",
        choices=["auto", "cpu", "gpu"],
        default="auto",
        help="where to time (default auto: the first GPU, else the CPU)",
    )
    p.add_argument(
        "--dtype",
        nargs="+",
        choices=list(DTYPE_NAMES),
        help="dtypes to time (default: float32 and bfloat16 on a GPU, float32 on the CPU, "
        "where each dtype costs each MAX provider its own graphs to compile)",
    )
    p.add_argument(
        "--shape",
        dest="shapes",
        action="append",
        type=_shape,
        help="ROWSxN (repeatable; default: each op's standard shapes and a sweep)",
    )
    p.add_argument(
        "--variants",
        nargs="*",
        default=[],
        help="also time these forced kernel families, e.g. warp smem split",
    )
    p.add_argument(
        "--op",
        choices=list(WORKLOADS),
        default="softmax",
        help="what a call computes (the backward ops: 3 tensors; torch_fwd_bwd: 5; "
        "cross_entropy: loss and dlogits, 2 x logits; cross_entropy_loss: the loss alone, "
        "1 x logits; masked_softmax: softmax(x * 0.125 + mask), 3; causal_softmax: 2)",
    )
    p.add_argument(
        "--bridge", action="store_true", help="also time our op called from torch (ours:torch)"
    )
    p.add_argument(
        "--graph",
        action="store_true",
        help="on the CPU, also time ours as a K-op MAX graph (ours; two more graphs per dtype "
        "to compile) beside ours:numpy, as numpy users call it (the launch extension, no "
        "graph), which alone is timed by default for --op softmax",
    )
    p.add_argument("--latency", action="store_true", help="time one call on a tiny input instead")
    p.add_argument(
        "--timer",
        choices=["auto", "wall", "device"],
        default="auto",
        help="what the peers' one figure is: wall (marginal wall clock) or device (GPU "
        "busy time from CUPTI); auto: device on a GPU with torch installed. MAX graphs "
        "always get all three figures they can",
    )
    p.add_argument(
        "--reps",
        type=int,
        default=15,
        help="timing rounds per case, each figure a median of them (default 15); a "
        "figure whose T(K) <= T(1) is timed again with 2x, then 4x the rounds",
    )
    p.add_argument(
        "--max-k",
        type=int,
        default=16,
        help="most rotating input sets per shape (default 16; each K value is one more "
        "MAX graph per provider and dtype to compile)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    p.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default ./{DEFAULT_OUT}/)"
    )
    p.add_argument("--tag", default="", help="suffix for the output file names")
    p.add_argument(
        "--record",
        type=Path,
        metavar="FILE",
        help="also append every row, with the run's metadata, to FILE (JSON lines)",
    )
    p.add_argument("--from-json", type=Path, help="redo the table and plot from a saved JSON")
    return p


def resolve_timer(timer: str, kind: str) -> str:
    """ "device" or "wall": what `--timer auto` means on `kind`, and a clear
    error where the device timer cannot run."""
    from .device_timer import available

    if timer == "auto":
        return "device" if kind == "gpu" and available() else "wall"
    if timer == "device" and not (kind == "gpu" and available()):
        raise SystemExit("softmax bench: --timer device needs a GPU and torch with CUDA")
    return timer


def _method(args: argparse.Namespace) -> str:
    if args.timer == "device":
        peers = "GPU busy time per call (CUPTI spans)"
    else:
        peers = "marginal wall-clock time per call"
        if args.kind == "cpu":
            peers += ", providers interleaved round by round"
    replay = "; torch peers: + replay in a torch CUDA graph" if args.kind == "gpu" else ""
    return (
        f"K rotating inputs, medians of {args.reps} runs; MAX graphs: exec, replay and "
        f"device figures; peers: {peers}{replay}"
    )


def _finish(results: list[Row], meta: dict, out: Path, stem: str, json_too: bool = True) -> None:
    """Write the Markdown and the plot, print the table."""
    text = document(results, meta)
    (out / f"{stem}.md").write_text(text)
    print(text)
    png = out / f"{stem}.png"
    wrote = f"{out / stem}.json, .md" if json_too else f"{out / stem}.md"
    if plot(results, png, meta.get("op", "softmax")):
        say(f"wrote {wrote} and .png")
    else:
        say(
            f"wrote {wrote}; plot skipped: matplotlib is not installed "
            "(pip install 'max-softmax[bench]')"
        )


def _from_json(args: argparse.Namespace) -> int:
    data = json.loads(args.from_json.read_text())
    results = [Row.from_dict(r) for r in data["results"]]
    meta = data.get("meta") or {}
    stem = args.from_json.stem
    refuse_tracked([args.out / f"{stem}.md", args.out / f"{stem}.png"])
    args.out.mkdir(parents=True, exist_ok=True)
    _finish(results, meta, args.out, stem, json_too=False)
    return 0


def _latency(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from .latency import latency_table, measure_latency

    stem = f"latency_{args.kind}{'_' + args.tag if args.tag else ''}"
    refuse_tracked([args.out / f"{stem}.json", args.out / f"{stem}.md"])
    args.out.mkdir(parents=True, exist_ok=True)
    meta = run_info(args.kind, argv, run_kind(args.kind, "softmax", latency=True), op="softmax")
    rows = measure_latency(args.kind)
    write_json(args.out / f"{stem}.json", meta, rows)
    facts = {**meta, "device": f"{meta['device']} ({args.kind})", "command": f"`{meta['command']}`"}
    text = f"# softmax bench --latency on {meta['device']}\n\n" + "\n".join(
        f"- {k}: {facts[k]}" for k in ("date", "commit", "device", "command") if meta.get(k)
    )
    text += "\n\n" + latency_table(rows) + "\n"
    (args.out / f"{stem}.md").write_text(text)
    print(text)
    if args.record:
        append_record(args.record, rows, meta, "softmax")
    return 0


def _sweep(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from .sweep import run_sweep

    op = "" if args.op == "softmax" else f"_{args.op}"
    stem = f"bench_{args.kind}{op}{'_' + args.tag if args.tag else ''}"
    refuse_tracked([args.out / f"{stem}.{ext}" for ext in ("json", "md", "png")])
    args.out.mkdir(parents=True, exist_ok=True)
    run = run_kind(args.kind, args.op, bridge=args.bridge)
    meta = run_info(args.kind, argv, run, op=args.op, timer=args.timer, method=_method(args))
    say(f"{meta['device']} ({args.kind}); results go to {args.out}/{stem}.*")

    def save(rows: list[Row]) -> None:
        write_json(args.out / f"{stem}.json", meta, [asdict(r) for r in rows])

    results = run_sweep(args, save)
    save(results)
    _finish(results, meta, args.out, stem)
    if args.record:
        append_record(args.record, [asdict(r) for r in results], meta, args.op)
        say(f"appended {len(results)} rows to {args.record}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the sweep (or `--latency`, or `--from-json`), write JSON, Markdown
    and PNG, print the table; 130 on Ctrl-C, 2 on a refused output."""
    argv = list(sys.argv[2:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    try:
        if args.from_json:
            return _from_json(args)
        say("starting: finding the device and the timers (torch, if installed, loads now)...")
        args.kind = resolve_device(args.device)
        args.dtype = args.dtype or list(DEFAULT_DTYPES[args.kind.split(":")[0]])
        args.timer = resolve_timer(args.timer, args.kind)
        args.device_timer = args.kind == "gpu" and resolve_timer("auto", "gpu") == "device"
        if args.latency:
            return _latency(args, argv)
        return _sweep(args, argv)
    except (OutputError, NoGPUError) as err:
        print(f"softmax bench: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nsoftmax bench: interrupted; rows measured so far are in the JSON", file=sys.stderr)
        return 130
