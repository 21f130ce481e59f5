"""benchmarks/tools/ncu_source.py: the summary of an Nsight Compute source page."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location(
    "ncu_source", ROOT / "benchmarks" / "tools" / "ncu_source.py"
)
ncu_source = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ncu_source)

HEADER = [
    "Address",
    "Source",
    ncu_source.SAMPLES,
    ncu_source.EXECUTED,
    ncu_source.EXCESS,
    "stall_barrier",
    "stall_long_sb",
    "stall_barrier (Not Issued)",
]


def test_totals_reasons_and_ranking(tmp_path):
    rows = [
        ["0x7f00c010", "  LDG.E.64.STRONG.GPU R18, [R16.64]", "30", "900", "12", "0", "30", "0"],
        ["0x7f00c020", "  BAR.SYNC 0x0", "60", "100", "0", "60", "0", "60"],
        ["0x7f00c030", "  FADD R1, R2, R3", "10", "1000", "-", "4", "6", "9"],
    ]
    path = tmp_path / "sass.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Kernel Name", "my_kernel"])
        w.writerow(HEADER)
        w.writerows(rows)
    lines = ncu_source.summarise(str(path), top=2)
    assert lines[0] == "my_kernel: 3 instructions"
    assert lines[1] == (
        "executed 2,000 warp instructions, 100 stall samples, 12 excessive L2 sectors"
    )
    # Reasons by share of all samples; "Not Issued" columns are not reasons.
    assert lines[2].split() == ["barrier", "64.0%"]
    assert lines[3].split() == ["long_sb", "36.0%"]
    assert lines[4].startswith("top 2 by stall samples")
    top = lines[-2:]
    assert top[0].split()[:4] == ["00c020", "60", "100", "barrier"]
    assert top[1].split()[:4] == ["00c010", "30", "900", "long_sb"]
