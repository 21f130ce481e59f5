"""Compare two PTX builds kernel by kernel after ptxas, without a GPU:
for refactors that change a kernel's parameter list (so every PTX file of
`ptx_kernels.py compare` differs) but should leave its machine code alone.

    python benchmarks/tools/ptx_kernels.py build tests/X_check.mojo /tmp/before
    (change the code)
    python benchmarks/tools/ptx_kernels.py build tests/X_check.mojo /tmp/after
    python benchmarks/tools/sass_compare.py /tmp/before /tmp/after

Kernels are paired by the order their names first appear in the host
module (module.ptx): the same check file launches them in the same order,
whatever their mangled names became. For each pair it prints the PTX
counts of global / generic loads and stores, `cvta.to.global` and
instruction lines, then compiles both with `ptxas -arch=sm_90a` and
compares the bytes of the kernel's .text section (SASS): identical bytes
are identical machine code, constant-bank parameter offsets included.
"""

from __future__ import annotations

import argparse
import collections
import pathlib
import re
import struct
import subprocess
import sys
import tempfile

_GENERIC_LD = re.compile(r"^(@!?%p\d+\s+)?ld\.(?!global|param|shared|local|const)")
_GENERIC_ST = re.compile(r"^(@!?%p\d+\s+)?st\.(?!global|param|shared|local|const)")
_GLOBAL_LD = re.compile(r"^(@!?%p\d+\s+)?ld\.global")
_GLOBAL_ST = re.compile(r"^(@!?%p\d+\s+)?st\.global")


def kernels_in_order(folder: pathlib.Path) -> list[pathlib.Path]:
    """The folder's kernel files, in the order the host module names them."""
    host = (folder / "module.ptx").read_text()
    files = [p for p in folder.glob("module_*.ptx")]
    at = {p: host.find(p.stem[len("module_") :]) for p in files}
    return sorted((p for p in files if at[p] >= 0), key=lambda p: at[p])


def ptx_counts(path: pathlib.Path) -> dict[str, int]:
    """Memory instructions and instruction lines of one kernel's PTX."""
    lines = [line.strip() for line in path.read_text().splitlines()]
    ins = [s for s in lines if s.endswith(";") and not s.startswith((".", "//"))]
    return {
        "instr": len(ins),
        "ld.global": sum(1 for s in ins if _GLOBAL_LD.match(s)),
        "st.global": sum(1 for s in ins if _GLOBAL_ST.match(s)),
        "ld.generic": sum(1 for s in ins if _GENERIC_LD.match(s)),
        "st.generic": sum(1 for s in ins if _GENERIC_ST.match(s)),
        "ld.param": sum(1 for s in ins if "ld.param" in s),
        "cvta.to.global": sum(1 for s in ins if "cvta.to.global" in s),
    }


def sass_text(path: pathlib.Path, work: pathlib.Path) -> bytes:
    """The .text bytes of the kernel's cubin (ptxas -arch=sm_90a)."""
    cubin = work / (path.stem + ".cubin")
    subprocess.run(["ptxas", "-arch=sm_90a", "-o", str(cubin), str(path)], check=True)
    b = cubin.read_bytes()
    shoff = struct.unpack_from("<Q", b, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", b, 0x3A)
    secs = [struct.unpack_from("<IIQQQQIIQQ", b, shoff + i * shentsize) for i in range(shnum)]
    names = secs[shstrndx][4]
    for s in secs:
        name = b[names + s[0] : b.index(b"\0", names + s[0])]
        if name.startswith(b".text."):
            return b[s[4] : s[4] + s[5]]
    raise RuntimeError(f"no .text section in {cubin}")


def family(path: pathlib.Path) -> str:
    """The kernel's family: its file name without the parameter hash."""
    return re.sub(r"_[0-9a-f]{16}$", "", path.stem)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("before", type=pathlib.Path)
    parser.add_argument("after", type=pathlib.Path)
    args = parser.parse_args()
    old, new = kernels_in_order(args.before), kernels_in_order(args.after)
    if len(old) != len(new):
        print(f"kernel counts differ: {len(old)} vs {len(new)}")
        return 2
    rows = collections.Counter()
    same_sass = 0
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        for a, b in zip(old, new):
            if family(a) != family(b):
                print(f"pairing failed: {a.name} vs {b.name}")
                return 2
            ca, cb = ptx_counts(a), ptx_counts(b)
            same = sass_text(a, work) == sass_text(b, work)
            same_sass += same
            diff = " ".join(
                f"{k} {ca[k]}->{cb[k]}" if ca[k] != cb[k] else f"{k} {ca[k]}" for k in ca
            )
            rows[(family(a), diff, "SASS same" if same else "SASS DIFFERS")] += 1
    for (fam, diff, sass), n in sorted(rows.items()):
        print(f"{n:3d} x {fam}: {diff}; {sass}")
    print(f"kernels: {len(old)}, SASS identical: {same_sass}")
    return 0 if same_sass == len(old) else 1


if __name__ == "__main__":
    sys.exit(main())
