"""Two calls of our softmax on one random input, for Nsight Compute to count.

Run through `bash benchmarks/gpu_session.sh ncu DTYPE ROWS N [VARIANT]`,
which profiles the second call's kernel (the first compiles and warms up).
"""

import sys

import ml_dtypes
import numpy as np

import max_softmax


def main() -> None:
    """Parse DTYPE ROWS N [VARIANT] and run softmax twice on the GPU."""
    dtype, rows, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    variant = sys.argv[4] if len(sys.argv) > 4 else "auto"
    np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    x = np.random.default_rng(0).standard_normal((rows, n)).astype(np_dtype)
    for _ in range(2):
        max_softmax.softmax(x, device="gpu", variant=variant)


if __name__ == "__main__":
    main()
