"""Prove a refactor left the GPU kernels unchanged: compare their sm_90 PTX.

    python benchmarks/tools/ptx_kernels.py build tests/gpu_kernels_check.mojo /tmp/before
    (change the code)
    python benchmarks/tools/ptx_kernels.py build tests/gpu_kernels_check.mojo /tmp/after
    python benchmarks/tools/ptx_kernels.py compare /tmp/before /tmp/after

`mojo build --emit asm` writes one PTX file per kernel beside its output. A
kernel's name (and the names of its parameters and shared arrays) carries
the mangled Mojo path, which moving or renaming a function changes without
changing the code, so every mangled name is replaced by one token before
the bodies are compared. The bodies are compared as a multiset: the same
number of kernels with the same instructions is an unchanged PTX.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import pathlib
import re
import subprocess
import sys

# Mojo's mangled symbols (a module path, a hash of the parameters, and what
# is derived from them: parameters, shared arrays), and LLVM's numbered
# extern shared symbol.
_MANGLED = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*_[0-9a-f]{16}(?![0-9a-f])[A-Za-z0-9_$]*")
_NUMBERED = re.compile(r"extern_ptr_syml_[0-9]+")
_ENTRY = re.compile(r"\.visible \.entry (\S+)\(")


def normalized(ptx: str) -> str:
    """Return a kernel's PTX with every mangled name replaced by `K`."""
    return _NUMBERED.sub("extern_ptr_syml", _MANGLED.sub("K", ptx))


def kernel_digests(folder: pathlib.Path) -> dict[str, list[str]]:
    """Map each normalized body's digest to the kernel files that have it."""
    digests: dict[str, list[str]] = collections.defaultdict(list)
    for path in sorted(folder.glob("*.ptx")):
        text = path.read_text()
        if ".asciz" in text or not _ENTRY.search(text):
            continue  # the host module, which embeds the kernels as strings
        digest = hashlib.sha256(normalized(text).encode()).hexdigest()
        digests[digest].append(path.name)
    return digests


def family(file_name: str) -> str:
    """Return the kernel's family: its file name without the parameter hash."""
    return re.sub(r"_[0-9a-f]{16}\.ptx$", "", file_name)


def compare(before: pathlib.Path, after: pathlib.Path) -> int:
    """Print what changed between two builds; return 0 when nothing did."""
    old, new = kernel_digests(before), kernel_digests(after)
    n_old = sum(map(len, old.values()))
    n_new = sum(map(len, new.values()))
    lost = collections.Counter()
    gained = collections.Counter()
    for digest in old.keys() | new.keys():
        a, b = old.get(digest, []), new.get(digest, [])
        if len(a) > len(b):
            lost.update(family(f) for f in a[len(b) :])
        if len(b) > len(a):
            gained.update(family(f) for f in b[len(a) :])
    same = n_old - sum(lost.values())
    print(f"kernels: {n_old} before, {n_new} after, {same} identical")
    for name, count in sorted(lost.items()):
        print(f"  changed or gone: {count} x {name}")
    for name, count in sorted(gained.items()):
        print(f"  changed or new:  {count} x {name}")
    return 0 if not lost and not gained else 1


def build(check: pathlib.Path, out: pathlib.Path) -> int:
    """Build a check file's kernels for sm_90 into `out` (one PTX a kernel)."""
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.ptx"):
        old.unlink()
    command = [
        "mojo",
        "build",
        "-I",
        ".",
        "--target-accelerator",
        "sm_90",
        "--emit",
        "asm",
        str(check),
        "-o",
        str(out / "module.ptx"),
    ]
    return subprocess.run(command, check=False).returncode


def main() -> int:
    """The command line: `build CHECK OUT` or `compare BEFORE AFTER`."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build a check file's kernels as PTX")
    b.add_argument("check", type=pathlib.Path)
    b.add_argument("out", type=pathlib.Path)
    c = sub.add_parser("compare", help="compare two builds' kernels")
    c.add_argument("before", type=pathlib.Path)
    c.add_argument("after", type=pathlib.Path)
    args = parser.parse_args()
    if args.command == "build":
        return build(args.check, args.out)
    return compare(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())
