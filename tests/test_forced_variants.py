"""`variant=` forces each strategy of the backward, cross-entropy and masked
ops (op/variants.mojo: one switch for every op) on shapes "auto" would not
give it, against the float64 references; a strategy that cannot take the
rows is a clear error. The GPU runs them; the CPU has one family and
refuses a forced variant."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import GPU_SKIP, random_logits

import max_softmax
from max_softmax.reference import (
    compare_backward,
    compare_cross_entropy,
    cross_entropy_reference,
    masked_reference,
)
from max_softmax.validation import (
    BACKWARD_VARIANTS,
    CROSS_ENTROPY_VARIANTS,
    MASKED_VARIANTS,
    masked_flags,
    masked_options,
)

DTYPES = ["float32", "float16"]

BACKWARD_CASES = [
    ("register", (5, 1000)),
    ("register", (3, 16383)),
    ("smem", (3, 1000)),
    ("smem", (3, 20001)),
    ("cluster2", (3, 50001)),
    ("cluster4", (3, 40001)),
    ("split_stream", (3, 1000)),
    ("split_stream", (2, 100003)),
    ("block", (3, 1000)),
    ("block", (2, 70001)),
]

CROSS_ENTROPY_CASES = [
    ("register", (5, 1000)),
    ("smem", (3, 1000)),
    ("smem", (3, 20001)),
    ("pair", (3, 1000)),
    ("pair", (3, 100003)),
    ("block", (3, 1000)),
    ("block", (3, 50257)),
]

MASKED_CASES = [
    ("register", (5, 1000)),
    ("register", (3, 32768)),
    ("block", (5, 1000)),
    ("block", (3, 40001)),
]


def _run_gpu(build, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """Build a graph on the GPU whose inputs are `arrays` (`build` maps the
    input values to the outputs) and run it once."""
    from max.driver import Accelerator, Buffer
    from max.dtype import DType
    from max.engine import InferenceSession
    from max.graph import DeviceRef, Graph, TensorType

    gpu = Accelerator()
    types = [TensorType(DType.from_numpy(a.dtype), a.shape, DeviceRef.GPU()) for a in arrays]
    with Graph("forced", input_types=types, custom_extensions=[max_softmax.KERNELS]) as g:
        outs = build(*(v.tensor for v in g.inputs))
        g.output(*outs)
    model = InferenceSession(devices=[gpu]).load(g)
    results = model.execute(*(Buffer.from_numpy(a).to(gpu) for a in arrays))
    return [r.to_numpy() for r in results]


@pytest.mark.parametrize(
    "variants,cases",
    [
        (BACKWARD_VARIANTS, BACKWARD_CASES),
        (CROSS_ENTROPY_VARIANTS, CROSS_ENTROPY_CASES),
        (MASKED_VARIANTS, MASKED_CASES),
    ],
    ids=["backward", "cross_entropy", "masked"],
)
def test_variant_names_per_op(variants, cases):
    """Each op lists "auto" and exactly the strategies its cases (`*_CASES`) force
    (each of which the GPU tests run, so the Mojo launch struct has it)."""
    assert variants[0] == "auto"
    assert sorted(variants[1:]) == sorted({variant for variant, _ in cases})


@pytest.mark.parametrize(
    "op,variant",
    [("softmax_backward", "warp"), ("cross_entropy", "split"), ("softmax_masked", "smem")],
)
def test_unknown_variant_for_the_op(op, variant):
    from max_softmax.validation import check_variant

    with pytest.raises(ValueError, match=f"unknown variant '{variant}' for {op}"):
        check_variant(variant, "gpu", op)


def test_cpu_refuses_a_forced_variant():
    from max_softmax.validation import check_variant

    with pytest.raises(ValueError, match="GPU kernel family"):
        check_variant("register", "cpu", "cross_entropy")


@GPU_SKIP
@pytest.mark.parametrize("op", ["softmax_backward", "log_softmax_backward"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant,shape", BACKWARD_CASES)
def test_gpu_backward_variants(rng, op, dtype, variant, shape):
    x = random_logits(rng, shape, dtype)
    forward = "softmax" if op == "softmax_backward" else "log_softmax"
    a = getattr(max_softmax, forward)(x, axis=-1, device="gpu")
    dy = random_logits(rng, shape, dtype, scale=1.0)
    (dx,) = _run_gpu(
        lambda av, gv: [getattr(max_softmax.ops, op)(av, gv, axis=-1, variant=variant)], [a, dy]
    )
    result = compare_backward(op, dx, a, dy, -1)
    assert result.ok, result


@GPU_SKIP
@pytest.mark.parametrize("with_grad", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant,shape", CROSS_ENTROPY_CASES)
def test_gpu_cross_entropy_variants(rng, with_grad, dtype, variant, shape):
    x = random_logits(rng, shape, dtype)
    t = rng.integers(0, shape[1], size=shape[0]).astype(np.int64)
    t[0] = -100  # an ignored row

    def build(logits, targets):
        if with_grad:
            return list(
                max_softmax.ops.cross_entropy_with_grad(
                    logits, targets, label_smoothing=0.1, variant=variant
                )
            )
        return [max_softmax.ops.cross_entropy(logits, targets, variant=variant)]

    outs = _run_gpu(build, [x, t])
    want_loss, want_grad = cross_entropy_reference(x, t, label_smoothing=0.1 if with_grad else 0.0)
    got_grad = outs[1] if with_grad else want_grad
    ok, loss_err, grad_err = compare_cross_entropy(outs[0], got_grad, want_loss, want_grad, dtype)
    assert ok, (loss_err, grad_err)


@GPU_SKIP
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant,shape", MASKED_CASES)
def test_gpu_masked_variants(rng, op, dtype, variant, shape):
    from max.dtype import DType
    from max.graph import ops

    x = random_logits(rng, shape, dtype)
    mask = np.where(rng.random(shape[1]) < 0.1, -np.inf, 0.0).astype(dtype)
    kernel = getattr(max_softmax.ops, f"{op}_masked")

    def build(xv, mv):
        flags = masked_flags(True, True)
        options = ops.constant(
            np.array(masked_options(0.5, flags)), DType.float64, device=xv.device
        )
        x3 = ops.reshape(xv, [1, shape[0], shape[1]])
        m2 = ops.reshape(mv, [1, shape[1]])
        y = kernel(x3, m2, options, variant=variant)
        return [ops.reshape(y, list(shape))]

    (y,) = _run_gpu(build, [x, mask])
    want = masked_reference(op, x, -1, scale=0.5, mask=mask, causal=True)
    tol = 1e-5 if dtype == "float32" else 2e-3
    np.testing.assert_allclose(y.astype(np.float64), want, rtol=tol, atol=tol)


@GPU_SKIP
def test_gpu_forced_variant_that_cannot_take_the_rows():
    """The register strategy holds rows to 32K values: longer ones raise."""
    x = np.zeros((2, 40000), dtype=np.float32)
    with pytest.raises(ValueError, match="register"):
        _run_gpu(
            lambda av, gv: [max_softmax.ops.softmax_backward(av, gv, variant="register")],
            [x, x],
        )
