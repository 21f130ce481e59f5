"""Every GPU kernel compiles for the H100 (sm_90), even on a machine without
a GPU; where CUDA's ptxas is installed, every kernel also fits its launch
(registers x threads per block within the SM's 65,536 registers) and spills
little."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHECK = ROOT / "tests" / "gpu_kernels_check.mojo"
SWEEP = ROOT / "benchmarks" / "tools" / "split_stream_sweep.mojo"
REGISTERS_PER_SM = 65536
MAX_SPILL_BYTES = 1024


def _mojo() -> str:
    local = Path(sys.executable).parent / "mojo"
    return str(local) if local.exists() else (shutil.which("mojo") or "mojo")


def _build(out: Path, *extra: str, source: Path = CHECK) -> None:
    cmd = [
        _mojo(),
        "build",
        "-I",
        str(ROOT),
        "--target-accelerator",
        "sm_90",
        *extra,
        str(source),
        "-o",
        str(out),
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=out.parent)
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert result.returncode == 0, "\n".join(errors[:40]) or result.stderr[-4000:]


def test_all_gpu_kernels_compile(tmp_path):
    _build(tmp_path / "check")


def test_split_stream_sweep_compiles(tmp_path):
    """The kernel-level benchmark (built here, run on the GPU machine) keeps
    up with the launcher it calls."""
    _build(tmp_path / "sweep", source=SWEEP)


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="CUDA's ptxas is not installed")
def test_kernels_fit_their_launch(tmp_path):
    """The check that would have caught CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES."""
    _build(tmp_path / "check.s", "--emit", "asm")
    ptx_files = sorted(tmp_path.glob("*.ptx"))
    assert len(ptx_files) > 50, "expected one PTX file per kernel instantiation"
    problems = []
    for ptx in ptx_files:
        text = ptx.read_text()
        threads = re.search(r"\.maxntid (\d+)", text)
        info = subprocess.run(
            ["ptxas", "-arch=sm_90a", "-v", str(ptx), "-o", "/dev/null"],
            capture_output=True,
            text=True,
            timeout=300,
        ).stderr
        regs = re.search(r"Used (\d+) registers", info)
        spills = re.search(r"(\d+) bytes spill stores", info)
        assert regs, info
        # Kernels without launch bounds run at most 1024 threads a block here.
        block = int(threads.group(1)) if threads else 1024
        if int(regs.group(1)) * block > REGISTERS_PER_SM:
            problems.append(f"{ptx.name}: {regs.group(1)} registers x {block} threads")
        if spills and int(spills.group(1)) > MAX_SPILL_BYTES:
            problems.append(f"{ptx.name}: {spills.group(1)} bytes of spill stores")
    assert not problems, "\n".join(problems)
