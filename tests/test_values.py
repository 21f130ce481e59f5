"""Softmax and log-softmax values against scipy.special in float64."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import DEVICES, DTYPES, GPU_SKIP, assert_matches_scipy, random_logits

import max_softmax

OPS = ["softmax", "log_softmax"]

# Shapes and every axis of each, negative ones included.
SHAPES_AXES = [
    ((128,), -1),  # the classic puzzle vector
    ((1,), 0),
    ((1000,), 0),  # not a power of two
    ((7, 50257), -1),  # GPT-2 vocabulary
    ((16, 1025), 1),
    ((3, 5, 7), 0),
    ((3, 5, 7), 1),
    ((3, 5, 7), 2),
    ((3, 5, 7), -3),
    ((2, 3, 4, 5), 0),
    ((2, 3, 4, 5), 2),
    ((2, 3, 4, 5), -1),
    ((2, 3, 4, 5), -3),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,axis", SHAPES_AXES)
def test_matches_scipy(rng, device, op, dtype, shape, axis):
    x = random_logits(rng, shape, dtype)
    y = getattr(max_softmax, op)(x, axis=axis, device=device)
    assert_matches_scipy(op, y, x, axis)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape,axis", [((2, 1 << 20), -1), ((1 << 20, 3), 0)])
def test_long_rows(rng, device, shape, axis):
    x = random_logits(rng, shape, "float32")
    y = max_softmax.softmax(x, axis=axis, device=device)
    assert_matches_scipy("softmax", y, x, axis)


@pytest.mark.parametrize("device", DEVICES)
def test_properties(rng, device):
    """Rows sum to 1, 0 <= p <= 1, shift invariance, argmax preserved."""
    x = random_logits(rng, (64, 300), "float32")
    p = max_softmax.softmax(x, device=device)
    np.testing.assert_allclose(p.sum(axis=-1), 1.0, rtol=1e-5)
    assert np.all((p >= 0) & (p <= 1))
    shifted = max_softmax.softmax(x + np.float32(100), device=device)
    np.testing.assert_allclose(shifted, p, rtol=1e-4, atol=1e-7)
    assert np.array_equal(p.argmax(axis=-1), x.argmax(axis=-1))
    again = max_softmax.softmax(x, device=device)
    assert np.array_equal(again, p), "same input must give bit-identical output"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16bit_softmax_within_one_ulp(rng, device, dtype):
    """16-bit softmax is at most one unit in the last place from the float64
    softmax rounded to the dtype, for logits spread over [-90, 10] and -inf
    (results under 1.2e-38, float32's smallest normal, excepted).
    Both exps in use (float32 `exp`, and `exp_lean` for 16-bit softmax on
    AVX-512 CPUs) must leave that much to the final rounding."""
    from max_softmax.dtypes import DTYPE_NAMES
    from max_softmax.reference import reference

    np_dtype = np.dtype(DTYPE_NAMES[dtype])
    x = rng.uniform(-90, 10, size=(64, 4099)).astype(np_dtype)
    x[:, ::97] = -np.inf
    got = max_softmax.softmax(x, device=device)
    want = reference("softmax", x, -1).astype(np_dtype)
    # Positive (and zero) 16-bit floats order like their bit patterns.
    ulps = np.abs(got.view(np.int16).astype(np.int32) - want.view(np.int16).astype(np.int32))
    # Below float32's smallest normal (bfloat16 reaches there) the float32
    # math flushes or loses bits; there only the absolute error is bounded.
    tiny = want.astype(np.float64) < np.finfo(np.float32).tiny
    assert ulps[~tiny].max() <= 1, f"{(ulps[~tiny] > 1).sum()} elements off by more than one ulp"
    assert np.all(got[tiny].astype(np.float64) <= np.finfo(np.float32).tiny)
    assert np.all(got[:, ::97] == 0)


@pytest.mark.parametrize("device", DEVICES)
def test_non_contiguous_input(rng, device):
    base = random_logits(rng, (20, 30), "float32")
    view = base[::2, ::-3]
    y = max_softmax.softmax(view, axis=0, device=device)
    assert_matches_scipy("softmax", y, np.ascontiguousarray(view), 0)


def test_other_shape_does_not_recompile(rng, monkeypatch):
    from max.dtype import DType

    from max_softmax import launch

    monkeypatch.setattr(launch, "ENABLED", False)  # the compiled models' path

    from max_softmax.models import ModelKey, compile_count

    for shape in [(3, 10), (5, 7, 2), (1000,)]:
        max_softmax.softmax(random_logits(rng, shape, "float32"), device="cpu")
    assert compile_count[ModelKey("softmax", DType.float32, "cpu")] == 1


# --- GPU kernel families and dispatch boundaries -------------------------

VARIANT_CASES = [
    ("warp", (5, 100)),
    ("warp", (9, 512)),
    ("warp", (6, 511)),
    ("warp", (9, 1024)),  # aligned float32: a warp a row of 8 chunks (WIDE_WARP_PLAN)
    ("warp", (5, 1000)),
    ("block", (3, 1025)),
    ("block", (2, 32768)),
    ("block", (2, 32767)),
    ("smem", (3, 1000)),
    ("smem", (3, 40001)),
    ("smem", (4, 50257)),
    ("smem", (2, 65536)),
    ("smem", (2, 74240)),  # float32 capacity: 4 x (4 x 1024 + (227 KB - 1 KB) / 16 B)
    ("smem", (2, 36992)),  # float32: last row with 512 threads, two blocks an SM
    ("smem", (2, 36993)),
    ("smem", (2, 73984)),  # the same boundary for 16-bit types
    ("smem", (2, 73985)),
    ("smem", (2, 36995)),  # float32: the last row one 512-thread block holds
    ("smem", (2, 36996)),  # ... the first over a cluster of two (smem_parts_for)
    ("smem", (2, 73974)),  # float32: the last over two, halves of 512 threads
    ("smem", (2, 73975)),  # ... one 1024-thread block again
    ("split", (3, 1000)),
    ("split", (2, (1 << 20) + 3)),
    ("split", (2, 16384)),  # one chunk exactly
    ("split", (2, 16385)),
    ("split", (5, 50257)),  # unaligned rows: scalar loads
    ("split", (300, 40000)),  # more rows than the L2 window: lag < rows
    ("split", (40, 1 << 20)),  # lag 4 rows (float32) of 40
    # Resident blocks streaming chunks: 56 KB of float32 (14336 values),
    # 24 KB of 16-bit values (12288).
    ("split_stream", (3, 1000)),
    ("split_stream", (2, 12288)),  # one 16-bit chunk exactly
    ("split_stream", (2, 12289)),
    ("split_stream", (2, 28672)),  # two float32 chunks exactly
    ("split_stream", (2, 28673)),
    ("split_stream", (5, 50257)),  # unaligned rows: scalar head and tail
    ("split_stream", (3, (1 << 20) + 3)),
    ("split_stream", (40, 1 << 20)),  # several chunks a block
    ("split_stream", (1, 128 * 16384)),  # float32 capacity: 8 MB
    ("split_stream", (300, 40000)),  # a block's next chunk often in its row
    ("split_stream", (2000, 3000)),  # a row a chunk, many chunks a block
]

# Rows whose chunks differ: one chunk all -inf or all NaN, the others
# finite, so the split kernels' pairs must fold correctly across chunks.
# Elements a chunk, by kernel and dtype ("auto" picks split_stream here).
GPU_CHUNKS = {
    "split": {"float32": 16384, "bfloat16": 16384, "float64": 16384},
    "split_stream": {"float32": 14336, "bfloat16": 12288, "float64": 7168},
    "auto": {"float32": 14336, "bfloat16": 12288, "float64": 7168},
    # Not chunks: rows of 3 x these + 5 need a whole SM, so "smem" splits
    # float32 and float64 rows over a cluster of two blocks, a half each
    # (row 1's odd "chunk" is two thirds of the first half).
    "smem": {"float32": 20000, "bfloat16": 40000, "float64": 10000},
}
# Row 1 is one odd chunk and then `rest` throughout; "minus_inf_chunk_tiny_rest"
# makes the row max -1e30, where a chunk of -inf must still give 0
# (0 * exp(0 + 1e30) would be NaN).
CHUNK_PATTERNS = {
    "minus_inf_chunk": (-np.inf, 1.0),
    "nan_chunk": (np.nan, 1.0),
    "plus_inf_chunk": (np.inf, 1.0),
    "huge_chunk": (1e30, -1e30),
    "minus_inf_chunk_tiny_rest": (-np.inf, -1e30),
}


# On the CPU, fewer long rows than cores are cut into chunks of 65536 that
# run in parallel (cpu_rows.SoftmaxRows.split_rows): each row goes alone.
CPU_CHUNK = 65536


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
@pytest.mark.parametrize("pattern", list(CHUNK_PATTERNS))
def test_cpu_split_row_patterns(rng, dtype, pattern):
    first, rest = CHUNK_PATTERNS[pattern]
    x = random_logits(rng, (2, 3 * CPU_CHUNK + 5), dtype)
    x[0, CPU_CHUNK : 2 * CPU_CHUNK] = first  # a middle chunk of row 0
    x[1, :CPU_CHUNK] = first  # the first chunk of row 1
    x[1, CPU_CHUNK:] = rest
    for op in OPS:
        for row in (x[:1], x[1:]):
            y = getattr(max_softmax, op)(row, device="cpu")
            assert_matches_scipy(op, y, row, -1)


@GPU_SKIP
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
@pytest.mark.parametrize("variant", list(GPU_CHUNKS))
@pytest.mark.parametrize("pattern", list(CHUNK_PATTERNS))
def test_gpu_split_chunk_patterns(rng, variant, pattern, dtype):
    first, rest = CHUNK_PATTERNS[pattern]
    chunk = GPU_CHUNKS[variant][dtype]
    x = random_logits(rng, (2, 3 * chunk + 5), dtype)
    x[0, chunk : 2 * chunk] = first  # a middle chunk of row 0
    x[1, :chunk] = first  # the first chunk of row 1
    x[1, chunk:] = rest
    for op in OPS:
        y = getattr(max_softmax, op)(x, device="gpu", variant=variant)
        assert_matches_scipy(op, y, x, -1)


# Rows "smem" splits over a cluster of two blocks, a half each (float32 and
# float64 rows that need a whole SM, smem_parts_for).
CLUSTER_ROWS = {"float32": [40001, 73000], "float64": [20001, 36000]}


@GPU_SKIP
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("pattern", list(CHUNK_PATTERNS))
def test_gpu_cluster_half_patterns(rng, pattern, dtype):
    """A whole half of a row special (row 0 the first half, row 1 the
    second, its tail included): each half's own pair must fold into the
    row's (a half of only -inf is the pair (-inf, 0))."""
    first, rest = CHUNK_PATTERNS[pattern]
    for n in CLUSTER_ROWS[dtype]:
        x = random_logits(rng, (2, n), dtype)
        half = n // 2
        x[0, : half + 8] = first
        x[0, half + 8 :] = rest
        x[1, : half - 8] = rest
        x[1, half - 8 :] = first
        for op in OPS:
            y = getattr(max_softmax, op)(x, device="gpu", variant="smem")
            assert_matches_scipy(op, y, x, -1)


@GPU_SKIP
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("variant,shape", VARIANT_CASES)
def test_gpu_variants(rng, variant, shape, dtype, op):
    x = random_logits(rng, shape, dtype)
    y = getattr(max_softmax, op)(x, device="gpu", variant=variant)
    assert_matches_scipy(op, y, x, -1)


@GPU_SKIP
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("n", [32769, 50257, 74240, 74241, 148480, 148481])
def test_gpu_many_long_rows(rng, n, dtype):
    """Enough rows (>= 264) that "auto" picks the on-chip rows kernel up
    to its capacity (a block a row, or for float32 rows that need a whole
    SM a cluster of two) and the split kernel past it."""
    x = random_logits(rng, (264, n), dtype)
    assert_matches_scipy("softmax", max_softmax.softmax(x, device="gpu"), x, -1)


@GPU_SKIP
@pytest.mark.parametrize("dtype,itemsize", [("float32", 4), ("bfloat16", 2)])
@pytest.mark.parametrize("extra", [0, 5])
def test_gpu_rows_past_on_chip_split(rng, dtype, itemsize, extra):
    """Rows of up to 8 MB are held on chip across blocks (split_stream), longer
    ones re-read from L2 (split)."""
    x = random_logits(rng, (2, 8 * 2**20 // itemsize + extra), dtype)
    assert_matches_scipy("softmax", max_softmax.softmax(x, device="gpu"), x, -1)


# Row lengths around every boundary of the GPU dispatch table (fp32 V=4
# and bf16 V=8 share these in units of elements).
BOUNDARIES = [128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536]


@GPU_SKIP
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("n", [b + d for b in BOUNDARIES for d in (-1, 0, 1)])
def test_gpu_dispatch_boundaries(rng, n, dtype):
    x = random_logits(rng, (5, n), dtype)
    gpu = max_softmax.softmax(x, device="gpu")
    assert_matches_scipy("softmax", gpu, x, -1)


@pytest.mark.parametrize(
    "device",
    [
        pytest.param("cpu", marks=pytest.mark.big),  # ~20 GB of RAM: pytest --big
        pytest.param("gpu", marks=GPU_SKIP),
    ],
)
@pytest.mark.parametrize("shape,axis", [((65537, 32768), -1), ((32768, 65537), 0)])
def test_more_than_2_31_elements(rng, device, shape, axis):
    """2^31 + 2^15 float16 elements (4.3 GB): offsets past 2^31 must not wrap
    (the kernels index with 64-bit Int). Rows at both ends are checked."""
    # Random bits below 0x4C00 are float16 values in [0, 16): no NaN or inf,
    # made at memory speed (float64 normals would need 17 GB).
    bits = rng.integers(0, 0x4C00, size=shape, dtype=np.uint16)
    x = bits.view(np.float16)
    y = max_softmax.softmax(x, axis=axis, device=device)
    count = shape[0] if axis == -1 else shape[1]
    rows = [0, 1, count // 2, count - 2, count - 1]
    take = (lambda a: a[rows]) if axis == -1 else (lambda a: a[:, rows])
    assert_matches_scipy("softmax", take(y), take(x), axis)
