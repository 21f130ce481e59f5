"""Registers and spills of each kernel of a PTX build, without a GPU.

    python benchmarks/tools/ptx_kernels.py build tests/gpu_cross_entropy_check.mojo /tmp/ce
    python benchmarks/tools/ptx_spills.py /tmp/ce                 # every kernel
    python benchmarks/tools/ptx_spills.py /tmp/ce --match options  # names with "options"
    python benchmarks/tools/ptx_spills.py /tmp/ce --spills         # only those that spill

`ptxas -arch=sm_90a -v` (the target the PTX names) compiles each kernel's PTX (one file a kernel, as
`ptx_kernels.py build` leaves them) under the launch bounds the PTX carries
(`.maxntid`, `.minnctapersm`: 512 threads at 2 blocks an SM, or 1024 at 1,
cap the registers at 64) and reports the registers it used and the bytes
it spilled to local memory. A spill is a load through L1 a spilled value,
on every element of a sweep when the spill sits in its loop.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import os
import pathlib
import re
import subprocess
import sys

_ENTRY = re.compile(r"\.visible \.entry (\S+)\(")
_MAXNTID = re.compile(r"\.maxntid\s+(\d+)")
_MINCTA = re.compile(r"\.minnctapersm\s+(\d+)")
_TARGET = re.compile(r"\.target\s+(sm_\w+)")
_REGS = re.compile(r"Used (\d+) registers")
_SPILLS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


@dataclasses.dataclass
class Kernel:
    """One kernel's launch bounds and what ptxas made of it."""

    file: str
    threads: int
    min_blocks: int
    registers: int
    stack: int
    spill_stores: int
    spill_loads: int


def family(file_name: str) -> str:
    """The kernel's file name without its parameter hash."""
    return re.sub(r"_[0-9a-f]{16}\.ptx$", "", file_name)


def kernel_files(folder: pathlib.Path) -> list[pathlib.Path]:
    """The build's kernel PTX files (not the host module)."""
    files = []
    for path in sorted(folder.glob("*.ptx")):
        text = path.read_text()
        if ".asciz" not in text and _ENTRY.search(text):
            files.append(path)
    return files


def assemble(path: pathlib.Path) -> Kernel:
    """Run ptxas on one kernel's PTX (for the target it names, e.g.
    sm_90a) and read its report."""
    text = path.read_text()
    target = _TARGET.search(text)
    arch = target.group(1) if target else "sm_90a"
    threads = _MAXNTID.search(text)
    blocks = _MINCTA.search(text)
    result = subprocess.run(
        ["ptxas", f"-arch={arch}", "-v", str(path), "-o", os.devnull],
        capture_output=True,
        text=True,
        check=False,
    )
    report = result.stdout + result.stderr
    regs = _REGS.search(report)
    spills = _SPILLS.search(report)
    if result.returncode != 0 or not regs or not spills:
        raise RuntimeError(f"ptxas failed on {path.name}:\n{report}")
    return Kernel(
        path.name,
        int(threads.group(1)) if threads else 0,
        int(blocks.group(1)) if blocks else 0,
        int(regs.group(1)),
        int(spills.group(1)),
        int(spills.group(2)),
        int(spills.group(3)),
    )


def main() -> int:
    """The command line: a build folder, a name filter; prints the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("build", type=pathlib.Path, help="ptx_kernels.py build folder")
    parser.add_argument("--match", default="", help="only kernels whose name has this")
    parser.add_argument("--spills", action="store_true", help="only kernels that spill")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    files = [f for f in kernel_files(args.build) if args.match in f.name]
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        kernels = list(pool.map(lambda f: assemble(f), files))
    if args.spills:
        kernels = [k for k in kernels if k.spill_stores or k.spill_loads]
    print(f"{'threads':>7} {'min':>3} {'regs':>4} {'stack':>5} {'st':>5} {'ld':>5}  kernel")
    for k in sorted(kernels, key=lambda k: (family(k.file), k.file)):
        print(
            f"{k.threads:>7} {k.min_blocks:>3} {k.registers:>4} {k.stack:>5} "
            f"{k.spill_stores:>5} {k.spill_loads:>5}  {k.file}"
        )
    spilling = sum(1 for k in kernels if k.spill_stores or k.spill_loads)
    print(f"{len(kernels)} kernels, {spilling} spill")
    return 0


if __name__ == "__main__":
    sys.exit(main())
