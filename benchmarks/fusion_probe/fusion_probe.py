"""Does MAX fuse elementwise producers into a custom op's input?

    python benchmarks/fusion_probe/fusion_probe.py [--device cpu|gpu]
        [--shape 1024x4096] [--reps 10] [--rounds 15] [--ir-dir DIR] [--checks]

Builds `probe(x * 0.125 + mask)` graphs with the ops of
benchmarks/fusion_probe/probe_ops (a row softmax that reads its input by
`_fused_load` from an input declared `_FusedInputTensor`, the same with a
`_FusedOutputTensor` written by `_fused_store`, and its twin on ordinary
`InputTensor` / `OutputTensor`), and next to them MAX's `ops.softmax` and
max_softmax's ops on the same expression.

Prints JSON lines: per graph its compile seconds and max error against
numpy; then, after timing all graphs in interleaved rounds (each round runs
every graph --reps times and keeps the median), per graph the median and the
best of the rounds' times per `Model.execute`, and the GB/s of reading x and
mask and writing the output (3 tensors). With `--ir-dir DIR` MAX writes the IR and the Mojo it
generates for every graph it compiles under DIR/<graph>/
(`InferenceSession.debug.ir_output_dir`), and the script prints, per graph,
the kernels of the generated Mojo (its `# FusionInfo:` trees): how many, and
which graph ops each one runs (`mo.mul`, `mo.add` inside the custom op's
kernel means MAX fused them). It keeps the generated `.mojo` files and
deletes the ~450 MB of `.mlir` dumps of each graph.

The softmax probes are CPU code; `--device gpu` skips them and runs the
copy probe (`probe_copy_fused`, MAX's `foreach` over a fused input: one
kernel for x * 0.125 + mask and the copy if MAX fuses on the GPU too), MAX's
softmax and ours.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

SCALE = 0.125
PROBES = Path(__file__).resolve().parent / "probe_ops"


def main() -> int:
    """Parse the arguments; build, check and time each graph."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "gpu"])
    ap.add_argument("--shape", default="1024x4096")
    ap.add_argument("--reps", type=int, default=10, help="executes a round")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--ir-dir", default=None)
    ap.add_argument("--only", nargs="*", default=None, help="graph names to run")
    ap.add_argument(
        "--checks",
        action="store_true",
        help="only the checks: has_prologue_fusion, a reshape between producers and op",
    )
    args = ap.parse_args()

    from max.engine import InferenceSession

    if args.ir_dir:
        Path(args.ir_dir).mkdir(parents=True, exist_ok=True)

    rows, n = (int(v) for v in args.shape.split("x"))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, n), dtype=np.float32) * 4
    mask = np.where(rng.random((rows, n)) < 0.1, -np.inf, 0.0).astype(np.float32)
    mask[:, 0] = 0.0  # no row fully masked
    z = x * np.float32(SCALE) + mask
    want = np.exp(z - z.max(axis=1, keepdims=True))
    want /= want.sum(axis=1, keepdims=True)

    runner = Runner(args.device, rows, n)
    if args.checks:
        return checks(runner, x, mask, z, args.ir_dir)
    built = {}  # name -> (model, buffers, compile seconds)
    for i, (name, (fn, inputs)) in enumerate(GRAPHS.items()):
        if args.only is not None and name not in args.only:
            continue
        if args.device == "gpu" and name.startswith(("probe_fused", "probe_plain")):
            continue  # CPU-only probe kernels
        ir_dir = None
        if args.ir_dir:
            ir_dir = Path(args.ir_dir).resolve() / f"g{i}"
            ir_dir.mkdir(parents=True, exist_ok=True)
            InferenceSession.debug.ir_output_dir = str(ir_dir)
        arrays = [z] if inputs == "z" else [x, mask]
        model, compile_s = runner._graph("g", fn, len(arrays))
        bufs = runner._buffers(arrays)
        out = runner.output(model, bufs)
        expect = z if name.startswith("probe_copy") else want
        expect = expect * 2 if name.endswith("* 2") else expect
        same = out == expect  # equal infinities (the copy probe's -inf) count as exact
        err = float(np.max(np.abs(np.where(same, 0, out - np.where(same, 0, expect)))))
        row = {"graph": name, "compile_s": round(compile_s, 2), "max_err": err}
        if ir_dir is not None:
            row["kernels"] = kernels(ir_dir)
            for big in ir_dir.glob("*.mlir"):  # keep the generated Mojo only
                big.unlink()
        print(json.dumps(row), flush=True)
        built[name] = (model, bufs)
    # Timed in rounds, every graph once a round, so that drift on a noisy
    # machine lands on all of them alike; a round's time is the median of
    # --reps executes; the result, the median and the best of the rounds.
    rounds: dict[str, list[float]] = {name: [] for name in built}
    for _ in range(args.rounds):
        for name, (model, bufs) in built.items():
            rounds[name].append(runner.median(model, bufs, args.reps))
    for name, times in rounds.items():
        med = statistics.median(times)
        print(
            json.dumps(
                {
                    "graph": name,
                    "device": args.device,
                    "shape": args.shape,
                    "median_ms": round(med * 1e3, 3),
                    "best_round_ms": round(min(times) * 1e3, 3),
                    "gb_s_3_tensors": round(3 * x.nbytes / med / 1e9, 2),
                }
            ),
            flush=True,
        )
    return 0


def checks(runner: Runner, x, mask, z, ir_dir: str | None) -> int:
    """Does MAX pass `has_prologue_fusion` to a custom op that declares it
    (the flag probe's output)? Does a reshape between the producers and the
    op stop the fusion (the kernels, with --ir-dir)?"""
    from max.dtype import DType
    from max.engine import InferenceSession
    from max.graph import TensorType, ops

    def flag(v):
        out = TensorType(DType.float32, [1], v.device)
        return _probe("probe_prologue_flag", v, out)

    rows, n = x.shape
    cases = {
        "flag(x * 0.125 + mask)": (lambda a, m: flag(_scaled(a, m)), [x, mask]),
        "flag(z), z given": (flag, [z]),
        "probe_fused(reshape(x * 0.125 + mask))": (
            lambda a, m: _probe(
                "probe_softmax_fused", ops.reshape(_scaled(a, m), [rows * 2, n // 2])
            ),
            [x, mask],
        ),
        "probe_copy(reshape(x * 0.125 + mask, [rows, n, 1]))": (
            lambda a, m: _probe("probe_copy_fused", ops.reshape(_scaled(a, m), [rows, n, 1])),
            [x, mask],
        ),
    }
    for i, (name, (fn, arrays)) in enumerate(cases.items()):
        where = None
        if ir_dir:
            where = Path(ir_dir).resolve() / f"check{i}"
            where.mkdir(parents=True, exist_ok=True)
            InferenceSession.debug.ir_output_dir = str(where)
        model, _ = runner._graph("check", fn, len(arrays))
        out = runner.output(model, runner._buffers(arrays))
        row = {"graph": name}
        if name.startswith("flag"):
            row["has_prologue_fusion"] = float(out[0])
        elif name.startswith("probe_copy"):
            row["exact"] = bool(np.array_equal(out.reshape(rows, n), z))
        else:
            zz = z.reshape(rows * 2, n // 2)
            want = np.exp(zz - zz.max(axis=1, keepdims=True))
            want /= want.sum(axis=1, keepdims=True)
            row["max_err"] = float(np.nanmax(np.abs(out - want)))
        if where is not None:
            row["kernels"] = kernels(where)
            for big in where.glob("*.mlir"):
                big.unlink()
        print(json.dumps(row), flush=True)
    return 0


def kernels(ir_dir: Path) -> list[str]:
    """The graph-op kernels of the Mojo MAX generated into `ir_dir`: one
    string per `# FusionInfo:` tree that runs a graph op (mo.* or custom__*),
    its op names joined by " > " in tree order."""
    found = []
    for path in sorted(ir_dir.glob("*.mojo")):
        for block in path.read_text().split("# FusionInfo:")[1:]:
            lines = []
            for line in block.splitlines()[1:]:
                if not line.startswith("#"):
                    break
                lines.append(line.lstrip("# │├└─").split(" : ")[0].strip())
            ops = [v for v in lines if v.startswith(("mo.", "custom__"))]
            if ops and " > ".join(lines) not in found:
                found.append(" > ".join(v for v in lines if v))
    return found


def _probe(name: str, z, out_type=None):
    """`ops.custom` of a probe op on z (output like z unless told)."""
    from max.graph import TensorType, ops

    out_type = out_type or TensorType(z.dtype, z.shape, z.device)
    return ops.custom(name, z.device, [z], out_types=[out_type])[0]


def _scaled(x, mask):
    """The producers: x * 0.125 + mask, as MAX's elementwise graph ops."""
    return x * SCALE + mask


def _ours(z):
    from max_softmax.ops import softmax

    return softmax(z)


def _ours_masked(x, mask):
    from max_softmax.ops import softmax

    return softmax(x, scale=SCALE, mask=mask)


def _max_softmax(z):
    from max.graph import ops

    return ops.softmax(z, axis=-1)


GRAPHS: dict[str, tuple[Callable, str]] = {
    "probe_fused(x * 0.125 + mask)": (
        lambda x, m: _probe("probe_softmax_fused", _scaled(x, m)),
        "xm",
    ),
    "probe_plain(x * 0.125 + mask)": (
        lambda x, m: _probe("probe_softmax_plain", _scaled(x, m)),
        "xm",
    ),
    "probe_fused_io(x * 0.125 + mask) * 2": (
        lambda x, m: _probe("probe_softmax_fused_io", _scaled(x, m)) * 2.0,
        "xm",
    ),
    "probe_fused(x * 0.125 + mask) * 2": (
        lambda x, m: _probe("probe_softmax_fused", _scaled(x, m)) * 2.0,
        "xm",
    ),
    "probe_fused(z), z given": (lambda z: _probe("probe_softmax_fused", z), "z"),
    "probe_copy(x * 0.125 + mask)": (lambda x, m: _probe("probe_copy_fused", _scaled(x, m)), "xm"),
    "probe_copy(z), z given": (lambda z: _probe("probe_copy_fused", z), "z"),
    "probe_plain(z), z given": (lambda z: _probe("probe_softmax_plain", z), "z"),
    "max ops.softmax(x * 0.125 + mask)": (lambda x, m: _max_softmax(_scaled(x, m)), "xm"),
    "max ops.softmax(z), z given": (_max_softmax, "z"),
    "ours softmax(x * 0.125 + mask)": (lambda x, m: _ours(_scaled(x, m)), "xm"),
    "ours softmax(z), z given": (_ours, "z"),
    "ours softmax(x, scale, mask) fused op": (_ours_masked, "xm"),
}


def _precompiled(package: Path) -> Path:
    """`package` precompiled once into a temporary `.mojoc` (MAX would
    re-package the sources at every Graph, and edits during a run would
    break it)."""
    out = Path(tempfile.mkdtemp(prefix="fusion_probe_")) / f"{package.name}.mojoc"
    mojo = shutil.which("mojo") or str(Path(sys.executable).parent / "mojo")
    subprocess.run([mojo, "precompile", str(package), "-o", str(out)], check=True)
    return out


class Runner:
    """Builds, compiles and times one-output graphs on one device."""

    def __init__(self, kind: str, rows: int, n: int) -> None:
        from max.driver import CPU, Accelerator
        from max.engine import InferenceSession

        from max_softmax.kernels import kernel_library

        self.kind, self.rows, self.n = kind, rows, n
        self.dev = Accelerator() if kind == "gpu" else CPU()
        self.session = InferenceSession(devices=[self.dev])
        self.libs = [_precompiled(PROBES), kernel_library()]

    def _graph(self, name: str, fn: Callable, count: int):
        from max.dtype import DType
        from max.graph import DeviceRef, Graph, TensorType

        ref = DeviceRef.GPU() if self.kind == "gpu" else DeviceRef.CPU()
        t = TensorType(DType.float32, [self.rows, self.n], ref)
        with Graph(name, input_types=[t] * count, custom_extensions=self.libs) as g:
            g.output(fn(*(v.tensor for v in g.inputs)))
        t0 = time.perf_counter()
        model = self.session.load(g)
        return model, time.perf_counter() - t0

    def _buffers(self, arrays):
        from max.driver import Buffer

        return [Buffer.from_numpy(np.ascontiguousarray(a)).to(self.dev) for a in arrays]

    def output(self, model, bufs) -> np.ndarray:
        """One execute's output, on the host."""
        from max.driver import CPU

        return model.execute(*bufs)[0].to(CPU()).to_numpy()

    def median(self, model, bufs, reps: int) -> float:
        """Median seconds of `reps` executes (synchronised on a GPU)."""
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            res = model.execute(*bufs)
            if self.kind == "gpu":
                self.dev.synchronize()
            times.append(time.perf_counter() - t0)
            del res
        return statistics.median(times)


if __name__ == "__main__":
    raise SystemExit(main())
