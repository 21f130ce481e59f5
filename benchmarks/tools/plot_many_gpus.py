"""Plot `parallel_bench.py torch` results: fwd + bwd ms of each provider at
each world size, one panel per (shape, dtype), our one-GPU whole row as the
1-GPU bar.

    python benchmarks/tools/plot_many_gpus.py benchmarks/results/many_gpus/torch_w*.json \\
        --out benchmarks/results/many_gpus.png

Where a file set holds several runs of one case, the plot shows their median.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

PROVIDERS = {"ours": "ours", "megatron": "Megatron-core", "loss_parallel": "torch loss_parallel"}


def load(paths: list[Path]) -> dict:
    """{(rows, classes, dtype): {(provider, world): [ms, ...]}}; "single"
    rows become provider "one GPU" at world 1."""
    cases: dict = defaultdict(lambda: defaultdict(list))
    for path in paths:
        for r in json.loads(path.read_text())["results"]:
            if r.get("ms") is None:
                continue
            key = (r["rows"], r["classes"], r["dtype"])
            if r["provider"] == "single":
                cases[key][("one GPU", 1)].append(r["ms"])
            else:
                cases[key][(r["provider"], r["world"])].append(r["ms"])
    return cases


def plot(cases: dict, out: Path) -> None:
    """One bar panel per case: the one-GPU bar, then each provider per world."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted(cases)
    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 4.0), squeeze=False)
    worlds = sorted({w for k in keys for (p, w) in cases[k] if p != "one GPU"})
    colors = {"ours": "#1f77b4", "megatron": "#ff7f0e", "loss_parallel": "#7f7f7f"}
    for ax, key in zip(axes[0], keys):
        data = cases[key]
        one = statistics.median(data.get(("one GPU", 1), [float("nan")]))
        ax.bar([0], [one], color="#2ca02c", label="ours, one GPU, whole row")
        width = 0.8 / len(PROVIDERS)
        for i, world in enumerate(worlds):
            for j, provider in enumerate(PROVIDERS):
                times = data.get((provider, world))
                if not times:
                    continue
                x = 1 + i + (j - 1) * width
                label = PROVIDERS[provider] if i == 0 else None
                ax.bar([x], [statistics.median(times)], width, color=colors[provider], label=label)
        ax.set_xticks(range(len(worlds) + 1), ["1 GPU", *[f"{w} GPUs" for w in worlds]])
        rows, classes, dtype = key
        ax.set_title(f"{rows} x {classes} {dtype}", fontsize=10)
        ax.set_ylabel("fwd + bwd ms (lower is better)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8)
    fig.suptitle("Vocab-parallel cross-entropy on H100s", fontsize=11)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(out, dpi=110)


def main() -> None:
    """Parse the command line, plot, say where."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=Path("many_gpus.png"))
    args = parser.parse_args()
    plot(load(args.results), args.out)
    print(args.out)


if __name__ == "__main__":
    main()
