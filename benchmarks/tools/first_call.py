"""Time what a new process pays before its first result, with the public API only.

    python benchmarks/tools/first_call.py --device cpu [--cold] [--op softmax] [--dtype float32]

Prints one JSON line: seconds to import max_softmax, to get the first result
(which compiles or loads the model), and for a second call. `--cold` empties
MAX's compile cache (~/.cache/modular) first, so the first call compiles.
Works against any version of the package (it is used for before/after runs).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

T0 = time.perf_counter()


def main() -> int:
    """Parse arguments, run the timed calls, print the JSON line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "gpu"])
    p.add_argument("--op", default="softmax")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--cold", action="store_true", help="empty ~/.cache/modular first")
    p.add_argument("--label", default="", help="a name for this run in the JSON line")
    args = p.parse_args()
    if args.cold:
        shutil.rmtree(Path.home() / ".cache" / "modular", ignore_errors=True)
    t_start = time.perf_counter()
    import numpy as np

    import max_softmax
    from max_softmax.dtypes import DTYPE_NAMES

    t_import = time.perf_counter()
    x = np.random.default_rng(0).standard_normal((8, 1000)).astype(DTYPE_NAMES[args.dtype])
    fn = getattr(max_softmax, args.op)
    y = fn(x, axis=-1, device=args.device)
    t_first = time.perf_counter()
    fn(x, axis=-1, device=args.device)
    t_second = time.perf_counter()
    ok = bool(np.allclose(np.asarray(y, np.float64).sum(-1), 1.0, atol=1e-2))
    print(
        json.dumps(
            {
                "label": args.label,
                "device": args.device,
                "op": args.op,
                "dtype": args.dtype,
                "cold": args.cold,
                "python_start_s": round(t_start - T0, 3),
                "import_s": round(t_import - t_start, 3),
                "first_call_s": round(t_first - t_import, 3),
                "second_call_s": round(t_second - t_first, 4),
                "rows_sum_to_1": ok,
            }
        )
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
