"""The torch bridge's launch path: our kernels on torch tensors without a graph.

The bridge (`max_softmax.torch`) calls these with tensors it has checked; they pass
the tensors' addresses to the launch extension (`launch.py`), which runs the
same row functions MAX's ops call: ~1 µs of host work a call on the CPU,
where `Model.execute` costs 35-60 µs.

On CUDA the extension launches on MAX's own queue for the tensor's device
(for `cuda:N`, the DeviceContext MAX made for its `Accelerator(N)`, so
kernels, workspace allocator and compiled-function cache are MAX's, one set
a device), ordered against torch's current stream on that device with an
event each way: MAX's queue waits for what torch queued before the call,
torch's stream waits for the kernel before anything it queues after.
Nothing waits on the host, and the current device does not matter. On the
CPU the kernel runs before `run` returns.

What the caller guarantees (the bridge checks at its edge; nothing here
checks again):

- every tensor is contiguous in the (outer, n, inner) layout the dims name
  (any storage offset; the kernels check alignment themselves), of one dtype
  among `DTYPE_CODES`, on one device, CPU or CUDA;
- the output does not overlap an input unless the op is elementwise-safe
  (the kernels read a row before writing it, but the bridge never relies on
  it);
- the tensors stay alive until `run` returns (torch's stream then orders any
  reuse of their memory after the kernel).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .. import launch
from ..launch import LaunchError
from ..launch import extension as extension  # re-exported
from ..validation import EMPTY_LOSS


@torch.compiler.assume_constant_result
def available(cuda: bool = False) -> bool:
    """`launch.available`, where the bridge asks it. Under torch.compile the
    answer at trace time is baked into the graph: Dynamo cannot trace the
    lock that guards the extension's first load (a compiled call as a
    process's first use failed on it), and either answer gives the same
    numbers (a graph traced while a CUDA build runs keeps the graph path)."""
    return launch.available(cuda)


DTYPE_CODES: dict[torch.dtype, int] = {
    torch.float32: launch.DTYPE_CODES["float32"],
    torch.float16: launch.DTYPE_CODES["float16"],
    torch.bfloat16: launch.DTYPE_CODES["bfloat16"],
    torch.float64: launch.DTYPE_CODES["float64"],
}
"""The torch dtypes the extension takes, and their codes."""

_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_data_ptr = torch.Tensor.data_ptr


def _device_context(t: torch.Tensor) -> tuple[int, int]:
    """`t`'s device index (-1 on the CPU) and MAX's DeviceContext there, as
    an address."""
    index = t.get_device()
    return index, launch.cpu_context() if index < 0 else launch.gpu_context(index)


def _context_and_stream(t: torch.Tensor) -> tuple[int, int | None]:
    """MAX's DeviceContext for `t`'s device, as an address, and torch's
    current raw stream there (None on the CPU)."""
    index, ctx = _device_context(t)
    return ctx, None if index < 0 else _raw_stream(index)


Launcher = Callable[..., None]
"""`launch(out, *inputs)`: one row op on tensors of a fixed shape, dtype
and device (see `launcher`)."""


def launcher(op: str, like: torch.Tensor, outer: int, n: int, inner: int) -> Launcher:
    """A launch of row op `op` (one of ROW_OPS) on contiguous (outer, n,
    inner) tensors of `like`'s dtype and device: `launch(out, *inputs)`
    writes the op of `inputs` into `out` (see the module docstring for what
    the caller guarantees). Everything but the addresses and, on CUDA,
    torch's current stream is looked up here once, so a caller that keeps
    the launcher pays ~1 µs a call (the torch bridge's per-shape plans).

    Forward ops take the input x; backward ops take the forward's output
    (y, or log p) and dy, and write dx. On CUDA the op is queued in order on
    torch's current stream of the device and the launch returns at once; on
    the CPU it has run when the launch returns. Raises LaunchError where the
    extension cannot be built or a launch fails (e.g. a row too long for the
    GPU), ValueError for an unknown op, TypeError for a dtype not in
    DTYPE_CODES.
    """
    fn = launch.function(op)
    code = DTYPE_CODES.get(like.dtype)
    if code is None:
        raise TypeError(f"max_softmax: no {op} launch for {like.dtype}")
    index, ctx = _device_context(like)
    if outer * n * inner == 0:
        return lambda out, *inputs: None

    def launch_call(out: torch.Tensor, *inputs: torch.Tensor) -> None:
        # `launch.call` inlined: this is the bridge's per-call path (C
        # calls only, no Python frame but this one).
        try:
            fn(
                ctx,
                None if index < 0 else _raw_stream(index),
                code,
                out.data_ptr(),
                *map(_data_ptr, inputs),
                outer,
                n,
                inner,
            )
        except Exception as err:  # the extension raises plain Exception
            raise LaunchError(str(err)) from None

    return launch_call


def run(op: str, out: torch.Tensor, *inputs: torch.Tensor, outer: int, n: int, inner: int) -> None:
    """Write row op `op` of `inputs` into `out`, all contiguous (outer, n,
    inner) tensors of one dtype on one device: `launcher(op, out, outer, n,
    inner)(out, *inputs)`, for one call. Nothing is done when a dim is 0."""
    launcher(op, out, outer, n, inner)(out, *inputs)


def cross_entropy(
    loss: torch.Tensor,
    dlogits: torch.Tensor | None,
    logits: torch.Tensor,
    targets: torch.Tensor,
    options: torch.Tensor,
    reduction: str,
    soft: bool = False,
) -> None:
    """Cross-entropy of contiguous (rows, classes) `logits` against (rows,)
    int64 `targets` (with `soft`: class probabilities of the logits' shape
    and dtype, `options` the soft-target ones) into `loss` ((1,) for
    "mean"/"sum", (rows,) for "none"),
    and d loss / d logits into `dlogits` where given (it may be `logits`
    where torch/linear.py's `inplace_safe` allows). `options` is the
    contiguous float64 options tensor on the logits' device
    (`_options.options_tensor`): (ignore_index, label_smoothing), or with
    z-loss, softcap or class weights the extended options laid out by
    `validation.cross_entropy_options`, the extended kernels. With no rows or no
    classes the loss is `EMPTY_LOSS[reduction]` and dlogits zeros, as the
    bridge's graph path gives. Ordering and guarantees as `run`."""
    if fill_empty_cross_entropy(loss, dlogits, logits, reduction):
        return
    cross_entropy_launcher(logits, options, reduction, soft)(loss, dlogits, logits, targets)


CrossEntropyLauncher = Callable[
    [torch.Tensor, "torch.Tensor | None", torch.Tensor, torch.Tensor], None
]
"""`launch(loss, dlogits, logits, targets)`: cross-entropy of a fixed shape,
dtype, device, reduction and options (see `cross_entropy_launcher`)."""


def cross_entropy_launcher(
    logits: torch.Tensor, options: torch.Tensor, reduction: str, soft: bool = False
) -> CrossEntropyLauncher:
    """`cross_entropy` with everything but the tensors' addresses (and
    torch's current stream) looked up once: a caller that keeps the launcher
    (the bridge's per-shape plans) pays one Python call a launch. `logits`
    gives the shape (rows and classes >= 1), dtype and device; the launcher
    holds `options` alive. Arguments and guarantees as `cross_entropy`."""
    fn = launch.function("soft_cross_entropy" if soft else "cross_entropy")
    rows, classes = logits.shape
    index, ctx = _device_context(logits)
    code, reduction_code = DTYPE_CODES[logits.dtype], launch.REDUCTION_CODES[reduction]
    address, n_options = options.data_ptr(), options.shape[0]

    def launch_call(
        loss: torch.Tensor,
        dlogits: torch.Tensor | None,
        logits: torch.Tensor,
        targets: torch.Tensor,
    ) -> None:
        try:
            fn(
                ctx,
                None if index < 0 else _raw_stream(index),
                code,
                reduction_code,
                loss.data_ptr(),
                0 if dlogits is None else dlogits.data_ptr(),
                logits.data_ptr(),
                targets.data_ptr(),
                address,
                n_options,
                rows,
                classes,
            )
        except Exception as err:  # the extension raises plain Exception
            raise LaunchError(str(err)) from None

    launch_call.options = options  # type: ignore[attr-defined]
    return launch_call


def fill_empty_cross_entropy(
    loss: torch.Tensor, dlogits: torch.Tensor | None, logits: torch.Tensor, reduction: str
) -> bool:
    """Where the (rows, classes) `logits` have no rows or no classes, write
    the loss `EMPTY_LOSS[reduction]` and zeros into `dlogits` (where given),
    as the bridge's graph path gives, and return True: there is nothing to
    launch (`cross_entropy` here and `linear.cross_entropy_into`'s model
    path ask this first); else return False, writing nothing."""
    rows, classes = logits.shape
    if rows and classes:
        return False
    loss.fill_(EMPTY_LOSS[reduction])
    if dlogits is not None:
        dlogits.zero_()
    return True


def scale_rows(data: torch.Tensor, factor: torch.Tensor) -> None:
    """`data *= factor` in place for a contiguous CUDA (rows, n) `data` and a
    contiguous `factor` of its dtype and device, of one element or one a row
    ((rows,) or (rows, 1)), leaving rows whose factor is 1 unread and
    unwritten (`op/gpu_scale_rows.mojo`): the cross-entropy backward's
    scaling by an incoming gradient that is nearly always 1, without a pass
    over the gradient or a host sync. Ordering and guarantees as `run`."""
    rows, n = data.shape
    ctx, stream = _context_and_stream(data)
    launch.call(
        launch.function("scale_rows"),
        ctx,
        stream,
        DTYPE_CODES[data.dtype],
        data.data_ptr(),
        factor.data_ptr(),
        rows,
        n,
        int(factor.numel() > 1),
    )


def masked(
    out: torch.Tensor,
    x: torch.Tensor,
    mask: torch.Tensor,
    options: torch.Tensor,
    log_out: bool,
) -> None:
    """softmax (log-softmax if `log_out`) of scale * x + mask (and causal)
    of the contiguous (outer, L, n) `x` into `out`, as the masked model:
    `options` is the float64 tensor on x's device that
    `validation.masked_options` makes, the scale then one zero per flag
    value; row r = o * L + i reads row r % mask_rows of the contiguous
    (mask_rows, n) additive `mask` if the flags have MASK_FLAG (else `mask`
    is a placeholder, not read) and keeps columns j <= i if they have
    CAUSAL_FLAG. Nothing is done when a dim is 0. Ordering and guarantees
    as `run`."""
    outer, causal_rows, n = x.shape
    if outer * causal_rows * n == 0:
        return
    ctx, stream = _context_and_stream(x)
    flags = options.shape[0] - 1
    launch.run_masked(
        "log_softmax_masked" if log_out else "softmax_masked",
        ctx,
        stream,
        DTYPE_CODES[x.dtype],
        flags,
        out.data_ptr(),
        x.data_ptr(),
        mask.data_ptr(),
        options.data_ptr(),
        outer,
        causal_rows,
        n,
        mask.shape[0],
    )
