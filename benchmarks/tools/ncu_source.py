"""Summarise an Nsight Compute source page (one row a SASS instruction):
where a kernel's instructions and warp stalls go.

    python benchmarks/tools/ncu_source.py split_stream_sass.csv [--top 30]

The CSV is what `bash benchmarks/tools/gpu_session.sh ncu-source` writes
(`ncu --import R --page source --csv --print-source sass`). Prints the
instructions executed, the stall samples by reason, the excessive L2
sectors, then the instructions with the most stall samples, each with its
executions and its main stall reason (a poll re-read many times, or a
barrier every warp waits at, shows here; stop 33 found both in the bf16
split stream this way).
"""

from __future__ import annotations

import argparse
import csv
from collections.abc import Sequence

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"
EXCESS = "L2 Theoretical Sectors Global Excessive"


def number(row: Sequence[str], col: dict[str, int], name: str) -> float:
    """A numeric cell, 0 where the column is missing or not a number."""
    try:
        return float(row[col[name]])
    except (KeyError, ValueError, IndexError):
        return 0.0


def summarise(path: str, top: int) -> list[str]:
    """The summary's lines for the CSV at `path`."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    # Row 0 names the kernel, row 1 the columns.
    header, body = rows[1], rows[2:]
    col = {name: i for i, name in enumerate(header)}
    stalls = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    samples = sum(number(r, col, SAMPLES) for r in body) or 1.0
    lines = [
        f"{rows[0][1] if len(rows[0]) > 1 else path}: {len(body)} instructions",
        f"executed {sum(number(r, col, EXECUTED) for r in body):,.0f} warp instructions, "
        f"{samples:,.0f} stall samples, {sum(number(r, col, EXCESS) for r in body):,.0f} "
        "excessive L2 sectors",
    ]
    by_reason = {s: sum(number(r, col, s) for r in body) for s in stalls}
    for reason, n in sorted(by_reason.items(), key=lambda kv: -kv[1])[:8]:
        lines.append(f"  {reason[6:]:<18} {100 * n / samples:5.1f}%")
    lines.append(f"top {top} by stall samples: address, samples, executed, reason, instruction")
    for r in sorted(body, key=lambda r: -number(r, col, SAMPLES))[:top]:
        reason = max(stalls, key=lambda s: number(r, col, s))[6:] if stalls else ""
        lines.append(
            f"  {r[0][-6:]} {number(r, col, SAMPLES):6.0f} {number(r, col, EXECUTED):9.0f} "
            f"{reason:<16} {r[1].strip()[:60]}"
        )
    return lines


def main() -> None:
    """Print the summary of the CSV named on the command line."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    print("\n".join(summarise(args.csv, args.top)))


if __name__ == "__main__":
    main()
