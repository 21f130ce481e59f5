"""The graph-free launch path: our dispatch called from Python directly.

A Python extension module (built by `max_softmax.launch`, once per
kernel sources, compiler and target, into the kernel cache) whose functions
take raw addresses and dims and call the row functions MAX's ops call
(`op.dispatch.softmax_rows`, `softmax_backward_rows`, and cross-entropy's
launcher), with no graph, no `Model.execute` and no buffer objects between:
~0.2 µs of host work a call instead of ~40 (2-core CPU host).

Each function takes the DeviceContext MAX made for the device (the address
`max.driver.Device._device_context_ptr()` gives, as MAX's own
`kv_cache_ops.mojo` wraps it), and the torch stream to order against
(the torch bridge, `torch/_launch.py`; numpy arrays on the CPU pass None):

- `None`: a CPU context; the kernel runs on the calling thread (and MAX's
  CPU thread pool) before the function returns.
- an int (a CUstream, 0 for the legacy default stream): a GPU context. The
  kernel runs on MAX's queue, ordered against torch's stream with an event
  each way ("design B"): MAX's queue waits for what torch queued before the
  call, torch's stream waits for the kernel before anything it queues after.
  No host synchronisation, so the call returns as soon as it is queued.

Addresses are those of contiguous buffers of the (outer, n, inner) view on
the context's device, of the element type `dtype` names (DTYPE_CODES). The
caller guarantees them (the torch bridge and the array functions check at
their edge); an error raised by a
launcher (a row too long for the GPU, a bad code) comes back as a Python
exception.
"""

from std.memory import OpaquePointer
from std.os import abort
from std.python import Python, PythonObject
from std.python.bindings import PythonModuleBuilder
from std.sys import is_defined
from max.gpu.host import DeviceContext, DeviceStream

from op.cpu_ce_options import cross_entropy_options_cpu
from op.cpu_cross_entropy import cross_entropy_cpu
from op.cross_entropy_math import PLAIN_OPTIONS
from op.dispatch import launch_auto, softmax_backward_rows, softmax_rows
from op.cpu_masked_rows import masked_softmax_cpu
from op.gpu_ce_options_rows import launch_cross_entropy_options
from op.gpu_cross_entropy import launch_cross_entropy
from op.gpu_masked_rows import launch_masked_rows
from op.gpu_scale_rows import launch_scale_rows
from op.cpu_sharded_rows import epilogue_cpu, row_stats_cpu
from op.gpu_sharded_rows import launch_epilogue, launch_row_stats
from op.row_math import accum_dtype

comptime GPU = not is_defined["MAX_SOFTMAX_CPU_ONLY"]()
"""Whether this build holds the GPU path: a host with no GPU builds with
`-D MAX_SOFTMAX_CPU_ONLY` (no accelerator to compile for; ~20 s of compiler
time on 2 cores against ~100 s with sm_90), unless told a target accelerator."""

comptime GIL_FREE_ELEMENTS = 1 << 16
"""CPU calls on at least this many elements (tens of µs) release the GIL
while the kernel runs, so other Python threads go on; smaller ones keep it
(a release and re-acquire can wait a whole switch interval, 5 ms, when
another thread takes the GIL meanwhile)."""

comptime DTYPE_COUNT = 4
"""Dtype codes 0..3: float32, float16, bfloat16, float64 (`_dtype_of`)."""

comptime REDUCTION_COUNT = 3
"""Reduction codes 0..2: "mean", "sum", "none" (`_reduction_of`)."""

comptime MASK_FLAG = 1
"""Masked flags bit: the mask is read (else it is a placeholder)."""

comptime CAUSAL_FLAG = 2
"""Masked flags bit: row r keeps only columns j <= r % L."""


@always_inline
def _dtype_of[code: Int]() -> DType:
    """The element type a dtype code names (the order of DTYPE_CODES in
    torch_launch.py)."""
    comptime if code == 0:
        return DType.float32
    elif code == 1:
        return DType.float16
    elif code == 2:
        return DType.bfloat16
    else:
        return DType.float64


@always_inline
def _reduction_of[code: Int]() -> StaticString:
    """The cross-entropy reduction a reduction code names."""
    comptime if code == 0:
        return "mean"
    elif code == 1:
        return "sum"
    else:
        return "none"


@always_inline
def _ptr[dtype: DType](addr: Int) -> Pointer[Scalar[dtype], MutAnyOrigin]:
    """A buffer's elements at `addr`, as the kernels take them."""
    return Pointer[Scalar[dtype], MutAnyOrigin](unsafe_from_address=addr)


def _context(ctx_ptr: PythonObject) raises -> DeviceContext:
    """MAX's DeviceContext at `ctx_ptr` (borrowed: MAX's Device object keeps
    it alive, and the caller holds that object)."""
    var addr = Int(py=ctx_ptr)
    if addr == 0:
        raise Error("max_softmax: null device context")
    return DeviceContext(
        OpaquePointer[MutUntrackedOrigin](unsafe_from_address=addr)
    )


def _dims(
    outer_obj: PythonObject, n_obj: PythonObject, inner_obj: PythonObject
) raises -> Tuple[Int, Int, Int]:
    """(outer, n, inner) as Ints; a negative one would index anywhere."""
    var outer = Int(py=outer_obj)
    var n = Int(py=n_obj)
    var inner = Int(py=inner_obj)
    if outer < 0 or n < 0 or inner < 0:
        raise Error(
            t"max_softmax: negative dims (outer={outer}, n={n}, inner={inner})"
        )
    return (outer, n, inner)


def _bad_code(what: StaticString, code: Int, count: Int) -> Error:
    """The error for a code past its table."""
    return Error(t"max_softmax: unknown {what} code {code} (0..{count - 1})")


@always_inline
def _on_cpu[Kernel: def() raises -> None](kernel: Kernel, elements: Int) raises:
    """Run `kernel` on the calling thread, without the GIL if `elements` is
    at least GIL_FREE_ELEMENTS (it touches no Python object)."""
    if elements < GIL_FREE_ELEMENTS:
        kernel()
        return
    ref cpython = Python().cpython()
    var state = cpython.PyEval_SaveThread()
    try:
        kernel()
    except e:
        cpython.PyEval_RestoreThread(state)
        raise e^
    cpython.PyEval_RestoreThread(state)


def _no_gpu() -> Error:
    """The error for a GPU call into a build without the GPU path."""
    return Error(
        "max_softmax: the torch launch extension was built without a GPU"
        " target (no GPU was visible at build time)"
    )


def _torch_first(
    ctx: DeviceContext, torch_stream: PythonObject
) raises -> DeviceStream:
    """Torch's stream as a MAX stream, after making MAX's queue wait for
    what torch queued on it so far."""
    var ts = ctx.create_external_stream(
        OpaquePointer[MutAnyOrigin](unsafe_from_address=Int(py=torch_stream))
    )
    var before = ctx.create_event()
    ts.record_event(before)
    ctx.stream().enqueue_wait_for(before)
    return ts


def _torch_after(ctx: DeviceContext, ts: DeviceStream) raises:
    """Torch's stream waits for what MAX's queue holds so far (a wait copies
    the event's state when queued, so the event may go at once). Where the
    events fail, the host waits for MAX's queue before raising: torch must
    not reuse memory a queued kernel still writes."""
    try:
        var after = ctx.create_event()
        ctx.stream().record_event(after)
        ts.enqueue_wait_for(after)
    except e:
        ctx.synchronize()
        raise e^


def _on_torch_stream[
    Kernel: def() raises -> None
](ctx: DeviceContext, torch_stream: PythonObject, kernel: Kernel) raises:
    """Queue `kernel` (it launches on `ctx`) in order with torch's stream:
    MAX's queue waits for what torch queued so far, and torch's stream for
    what `kernel` queued, also when it raises, since torch must not reuse
    memory a queued kernel still writes."""
    var ts = _torch_first(ctx, torch_stream)
    try:
        kernel()
    except e:
        _torch_after(ctx, ts)
        raise e^
    _torch_after(ctx, ts)


# ===----------------------------------------------------------------------=== #
# softmax, log_softmax
# ===----------------------------------------------------------------------=== #


def _forward[
    log_out: Bool
](
    ctx_ptr: PythonObject,
    torch_stream: PythonObject,
    dtype_obj: PythonObject,
    dst_obj: PythonObject,
    src_obj: PythonObject,
    outer_obj: PythonObject,
    n_obj: PythonObject,
    inner_obj: PythonObject,
) raises -> PythonObject:
    """Softmax (or log-softmax) along n of the (outer, n, inner) buffer at
    `src` into `dst`."""
    var ctx = _context(ctx_ptr)
    var code = Int(py=dtype_obj)
    var dims = _dims(outer_obj, n_obj, inner_obj)
    var dst = Int(py=dst_obj)
    var src = Int(py=src_obj)
    var on_gpu = not (torch_stream is PythonObject(None))
    comptime for c in range(DTYPE_COUNT):
        comptime dtype = _dtype_of[c]()
        if code == c:
            if not on_gpu:

                def forward_cpu() raises {imm}:
                    softmax_rows[
                        "cpu", dtype, log_out, launch_auto[dtype, log_out]
                    ](
                        ctx,
                        _ptr[dtype](dst),
                        _ptr[dtype](src),
                        dims[0],
                        dims[1],
                        dims[2],
                    )

                _on_cpu(forward_cpu, dims[0] * dims[1] * dims[2])
                return PythonObject(None)
            comptime if GPU:

                def gpu_launch() raises {imm}:
                    softmax_rows[
                        "gpu", dtype, log_out, launch_auto[dtype, log_out]
                    ](
                        ctx,
                        _ptr[dtype](dst),
                        _ptr[dtype](src),
                        dims[0],
                        dims[1],
                        dims[2],
                    )

                _on_torch_stream(ctx, torch_stream, gpu_launch)
                return PythonObject(None)
            else:
                raise _no_gpu()
    raise _bad_code("dtype", code, DTYPE_COUNT)


def softmax(
    ctx_ptr: PythonObject,
    torch_stream: PythonObject,
    dtype: PythonObject,
    dst: PythonObject,
    src: PythonObject,
    outer: PythonObject,
    n: PythonObject,
    inner: PythonObject,
) raises -> PythonObject:
    """Softmax along n of the (outer, n, inner) buffer at `src` into `dst`."""
    return _forward[False](
        ctx_ptr, torch_stream, dtype, dst, src, outer, n, inner
    )


def log_softmax(
    ctx_ptr: PythonObject,
    torch_stream: PythonObject,
    dtype: PythonObject,
    dst: PythonObject,
    src: PythonObject,
    outer: PythonObject,
    n: PythonObject,
    inner: PythonObject,
) raises -> PythonObject:
    """Log-softmax along n of the (outer, n, inner) buffer at `src` into
    `dst`."""
    return _forward[True](
        ctx_ptr, torch_stream, dtype, dst, src, outer, n, inner
    )


# ===----------------------------------------------------------------------=== #
# softmax_backward, log_softmax_backward
# ===----------------------------------------------------------------------=== #


def _backward[
    log_in: Bool
](
    ctx_ptr: PythonObject,
    torch_stream: PythonObject,
    dtype_obj: PythonObject,
    dx_obj: PythonObject,
    a_obj: PythonObject,
    dy_obj: PythonObject,
    outer_obj: PythonObject,
    n_obj: PythonObject,
    inner_obj: PythonObject,
) raises -> PythonObject:
    """The gradient along n of softmax (`a` = y) or log-softmax (`a` = log p)
    into `dx`, from the incoming gradient `dy`."""
    var ctx = _context(ctx_ptr)
    var code = Int(py=dtype_obj)
    var dims = _dims(outer_obj, n_obj, inner_obj)
    var dx = Int(py=dx_obj)
    var a = Int(py=a_obj)
    var dy = Int(py=dy_obj)
    var on_gpu = not (torch_stream is PythonObject(None))
    comptime for c in range(DTYPE_COUNT):
        comptime dtype = _dtype_of[c]()
        if code == c:
            if not on_gpu:

                def backward_cpu() raises {imm}:
                    softmax_backward_rows["cpu", dtype, log_in](
                        ctx,
                        _ptr[dtype](dx),
                        _ptr[dtype](a),
                        _ptr[dtype](dy),
                        dims[0],
                        dims[1],
                        dims[2],
                    )

                _on_cpu(backward_cpu, dims[0] * dims[1] * dims[2])
                return PythonObject(None)
            comptime if GPU:

                def gpu_launch() raises {imm}:
                    softmax_backward_rows["gpu", dtype, log_in](
                        ctx,
                        _ptr[dtype](dx),
                        _ptr[dtype](a),
                        _ptr[dtype](dy),
                        dims[0],
                        dims[1],
                        dims[2],
                    )

                _on_torch_stream(ctx, torch_stream, gpu_launch)
                return PythonObject(None)
            else:
                raise _no_gpu()
    raise _bad_code("dtype", code, DTYPE_COUNT)


def softmax_backward(
    ctx_ptr: PythonObject,
    torch_stream: PythonObject,
    dtype: PythonObject,
    dx: PythonObject,
    y: PythonObject,
    dy: PythonObject,
    outer: PythonObject,
    n: PythonObject,
    inner: PythonObject,
) raises -> PythonObject:
    """The softmax gradient along n into `dx`: y * (dy - sum(dy * y))."""
    return _backward[False](
        ctx_ptr, torch_stream, dtype, dx, y, dy, outer, n, inner
    )


def log_softmax_backward(
    ctx_ptr: PythonObject,
    torch_stream: PythonObject,
    dtype: PythonObject,
    dx: PythonObject,
    logp: PythonObject,
    dy: PythonObject,
    outer: PythonObject,
    n: PythonObject,
    inner: PythonObject,
) raises -> PythonObject:
    """The log-softmax gradient along n into `dx`: dy - exp(logp) * sum(dy)."""
    return _backward[True](
        ctx_ptr, torch_stream, dtype, dx, logp, dy, outer, n, inner
    )


# ===----------------------------------------------------------------------=== #
# softmax_masked, log_softmax_masked
# ===----------------------------------------------------------------------=== #


def _masked_on[
    dtype: DType, log_out: Bool, has_mask: Bool, causal: Bool
](
    ctx: DeviceContext,
    torch_stream: PythonObject,
    on_gpu: Bool,
    dst: Int,
    src: Int,
    mask: Int,
    options: Int,
    rows: Int,
    causal_rows: Int,
    n: Int,
    mask_rows: Int,
) raises:
    """One instance of the masked launch (see `_masked`)."""
    var opts = Pointer[Float64, MutAnyOrigin](unsafe_from_address=options)
    if not on_gpu:

        def masked_on_cpu() raises {imm}:
            masked_softmax_cpu[dtype, log_out, has_mask, causal](
                _ptr[dtype](dst),
                _ptr[dtype](src),
                _ptr[dtype](mask),
                rows,
                n,
                mask_rows,
                opts[unsafe_offset=0],
                causal_rows,
            )

        _on_cpu(masked_on_cpu, rows * n)
        return
    comptime if GPU:

        def gpu_launch() raises {imm}:
            launch_masked_rows[dtype, log_out, has_mask, causal](
                ctx,
                _ptr[dtype](dst),
                _ptr[dtype](src),
                _ptr[dtype](mask),
                opts,
                rows,
                n,
                mask_rows,
                causal_rows,
            )

        _on_torch_stream(ctx, torch_stream, gpu_launch)
    else:
        raise _no_gpu()


def _masked[
    log_out: Bool
](
    ctx_ptr: PythonObject,
    torch_stream: PythonObject,
    dtype_obj: PythonObject,
    flags_obj: PythonObject,
    dst_obj: PythonObject,
    src_obj: PythonObject,
    mask_obj: PythonObject,
    options_obj: PythonObject,
    outer_obj: PythonObject,
    causal_rows_obj: PythonObject,
    n_obj: PythonObject,
    mask_rows_obj: PythonObject,
) raises -> PythonObject:
    """Softmax (or log-softmax) of scale * x + mask (and causal) along the
    rows of the (outer, L, n) buffer at `src` into `dst`, as the
    `softmax_masked` op (`op/masked_softmax_ops.mojo`): row r = o * L + i
    reads mask row r % mask_rows when `flags` has MASK_FLAG, keeps columns
    j <= i when it has CAUSAL_FLAG; `options` is the float64 (scale,)
    buffer on the context's device."""
    var ctx = _context(ctx_ptr)
    var code = Int(py=dtype_obj)
    var flags = Int(py=flags_obj)
    var dims = _dims(outer_obj, causal_rows_obj, n_obj)
    var mask_rows = Int(py=mask_rows_obj)
    var dst = Int(py=dst_obj)
    var src = Int(py=src_obj)
    var mask = Int(py=mask_obj)
    var options = Int(py=options_obj)
    var on_gpu = not (torch_stream is PythonObject(None))
    if flags < 0 or flags > MASK_FLAG + CAUSAL_FLAG:
        raise _bad_code("masked flags", flags, 2 * CAUSAL_FLAG)
    if mask_rows < 1:
        raise Error(t"max_softmax: mask_rows must be >= 1, got {mask_rows}")
    var rows = dims[0] * dims[1]
    if rows * dims[2] == 0:
        return PythonObject(None)
    comptime for c in range(DTYPE_COUNT):
        comptime dtype = _dtype_of[c]()
        if code == c:
            comptime for f in range(2 * CAUSAL_FLAG):
                if flags == f:
                    _masked_on[
                        dtype,
                        log_out,
                        (f & MASK_FLAG) != 0,
                        (f & CAUSAL_FLAG) != 0,
                    ](
                        ctx,
                        torch_stream,
                        on_gpu,
                        dst,
                        src,
                        mask,
                        options,
                        rows,
                        dims[1],
                        dims[2],
                        mask_rows,
                    )
                    return PythonObject(None)
    raise _bad_code("dtype", code, DTYPE_COUNT)


def softmax_masked(
    ctx_ptr: PythonObject,
    torch_stream: PythonObject,
    dtype: PythonObject,
    flags: PythonObject,
    dst: PythonObject,
    src: PythonObject,
    mask: PythonObject,
    options: PythonObject,
    outer: PythonObject,
    causal_rows: PythonObject,
    n: PythonObject,
    mask_rows: PythonObject,
) raises -> PythonObject:
    """Softmax of scale * x + mask (and causal) into `dst` (see `_masked`)."""
    return _masked[False](
        ctx_ptr,
        torch_stream,
        dtype,
        flags,
        dst,
        src,
        mask,
        options,
        outer,
        causal_rows,
        n,
        mask_rows,
    )


def log_softmax_masked(
    ctx_ptr: PythonObject,
    torch_stream: PythonObject,
    dtype: PythonObject,
    flags: PythonObject,
    dst: PythonObject,
    src: PythonObject,
    mask: PythonObject,
    options: PythonObject,
    outer: PythonObject,
    causal_rows: PythonObject,
    n: PythonObject,
    mask_rows: PythonObject,
) raises -> PythonObject:
    """Log-softmax of scale * x + mask (and causal) into `dst` (see
    `_masked`)."""
    return _masked[True](
        ctx_ptr,
        torch_stream,
        dtype,
        flags,
        dst,
        src,
        mask,
        options,
        outer,
        causal_rows,
        n,
        mask_rows,
    )


# ===----------------------------------------------------------------------=== #
# cross_entropy
# ===----------------------------------------------------------------------=== #


def _cross_entropy_on[
    dtype: DType, reduction: StaticString, with_grad: Bool
](
    ctx: DeviceContext,
    torch_stream: PythonObject,
    on_gpu: Bool,
    loss: Int,
    dlogits: Int,
    logits: Int,
    targets: Int,
    options: Int,
    n_options: Int,
    rows: Int,
    n: Int,
) raises:
    """One instance of the cross-entropy launch (see `cross_entropy`): the
    plain kernels for PLAIN_OPTIONS options, the extended family (z-loss,
    softcap, class weights) for more, as MAX's op picks them
    (op/cross_entropy_ops.mojo)."""
    var target_ptr = Pointer[Int64, MutAnyOrigin](unsafe_from_address=targets)
    var opts = Pointer[Float64, MutAnyOrigin](unsafe_from_address=options)
    var extended = n_options > PLAIN_OPTIONS
    if not on_gpu:

        def cross_entropy_on_cpu() raises {imm}:
            if extended:
                cross_entropy_options_cpu[dtype, with_grad, reduction](
                    _ptr[dtype](loss),
                    _ptr[dtype](dlogits),
                    _ptr[dtype](logits),
                    target_ptr,
                    opts,
                    n_options,
                    rows,
                    n,
                )
                return
            cross_entropy_cpu[dtype, with_grad, reduction](
                _ptr[dtype](loss),
                _ptr[dtype](dlogits),
                _ptr[dtype](logits),
                target_ptr,
                Int64(opts[unsafe_offset=0]),
                opts[unsafe_offset=1],
                rows,
                n,
            )

        _on_cpu(cross_entropy_on_cpu, rows * n)
        return
    comptime if GPU:

        def gpu_launch() raises {imm}:
            if extended:
                launch_cross_entropy_options[dtype, with_grad, reduction](
                    ctx,
                    _ptr[dtype](loss),
                    _ptr[dtype](dlogits),
                    _ptr[dtype](logits),
                    target_ptr,
                    opts,
                    n_options,
                    rows,
                    n,
                )
                return
            launch_cross_entropy[dtype, with_grad, reduction](
                ctx,
                _ptr[dtype](loss),
                _ptr[dtype](dlogits),
                _ptr[dtype](logits),
                target_ptr,
                opts,
                rows,
                n,
            )

        _on_torch_stream(ctx, torch_stream, gpu_launch)
    else:
        raise _no_gpu()


def cross_entropy(
    ctx_ptr: PythonObject,
    torch_stream: PythonObject,
    dtype_obj: PythonObject,
    reduction_obj: PythonObject,
    loss_obj: PythonObject,
    dlogits_obj: PythonObject,
    logits_obj: PythonObject,
    targets_obj: PythonObject,
    options_obj: PythonObject,
    n_options_obj: PythonObject,
    rows_obj: PythonObject,
    n_obj: PythonObject,
) raises -> PythonObject:
    """Cross-entropy of (rows, n) logits against (rows,) int64 targets into
    `loss` ((1,) for "mean"/"sum", (rows,) for "none"), and d loss / d logits
    into `dlogits` unless its address is 0 (it may be `logits`' own address
    where the kernels allow: torch/linear.py's `inplace_safe`). `options`
    holds `n_options` float64 values on the context's device: 2,
    (ignore_index, label_smoothing), the plain kernels; more,
    (ignore_index, label_smoothing, z_loss, softcap[, a weight per class]),
    the extended family (op/cpu_ce_options.mojo,
    op/gpu_ce_options_rows.mojo), as MAX's op picks them."""
    var ctx = _context(ctx_ptr)
    var code = Int(py=dtype_obj)
    var reduction_code = Int(py=reduction_obj)
    var n_options = Int(py=n_options_obj)
    var dims = _dims(rows_obj, n_obj, PythonObject(1))
    var loss = Int(py=loss_obj)
    var dlogits = Int(py=dlogits_obj)
    var logits = Int(py=logits_obj)
    var targets = Int(py=targets_obj)
    var options = Int(py=options_obj)
    var on_gpu = not (torch_stream is PythonObject(None))
    if reduction_code < 0 or reduction_code >= REDUCTION_COUNT:
        raise _bad_code("reduction", reduction_code, REDUCTION_COUNT)
    if n_options < PLAIN_OPTIONS:
        raise Error(
            t"max_softmax: cross_entropy options must hold at least"
            t" {PLAIN_OPTIONS} values, got {n_options}"
        )
    comptime for c in range(DTYPE_COUNT):
        comptime dtype = _dtype_of[c]()
        if code == c:
            comptime for r in range(REDUCTION_COUNT):
                comptime reduction = _reduction_of[r]()
                if reduction_code == r:
                    if dlogits != 0:
                        _cross_entropy_on[dtype, reduction, True](
                            ctx,
                            torch_stream,
                            on_gpu,
                            loss,
                            dlogits,
                            logits,
                            targets,
                            options,
                            n_options,
                            dims[0],
                            dims[1],
                        )
                    else:
                        # No gradient: the kernels never write through
                        # this pointer (as MAX's cross_entropy op).
                        _cross_entropy_on[dtype, reduction, False](
                            ctx,
                            torch_stream,
                            on_gpu,
                            loss,
                            logits,
                            logits,
                            targets,
                            options,
                            n_options,
                            dims[0],
                            dims[1],
                        )
                    return PythonObject(None)
    raise _bad_code("dtype", code, DTYPE_COUNT)


def scale_rows(
    ctx_ptr: PythonObject,
    torch_stream: PythonObject,
    dtype_obj: PythonObject,
    data_obj: PythonObject,
    factor_obj: PythonObject,
    rows_obj: PythonObject,
    n_obj: PythonObject,
    per_row_obj: PythonObject,
) raises -> PythonObject:
    """Multiply the (rows, n) buffer at `data` in place by the factors at
    `factor` (one, or one a row if `per_row`), on the GPU, skipping rows
    whose factor is 1 without reading them (`op.gpu_scale_rows`). GPU
    contexts only: on the CPU the caller reads the factor itself."""
    if torch_stream is PythonObject(None):
        raise Error("max_softmax: scale_rows runs on a GPU context only")
    var ctx = _context(ctx_ptr)
    var code = Int(py=dtype_obj)
    var dims = _dims(rows_obj, n_obj, PythonObject(1))
    var data = Int(py=data_obj)
    var factor = Int(py=factor_obj)
    var per_row = Int(py=per_row_obj) != 0
    comptime for c in range(DTYPE_COUNT):
        comptime dtype = _dtype_of[c]()
        if code == c:
            comptime if GPU:

                def gpu_launch() raises {imm}:
                    launch_scale_rows[dtype](
                        ctx,
                        _ptr[dtype](data),
                        _ptr[dtype](factor),
                        dims[0],
                        dims[1],
                        per_row,
                    )

                _on_torch_stream(ctx, torch_stream, gpu_launch)
                return PythonObject(None)
            else:
                raise _no_gpu()
    raise _bad_code("dtype", code, DTYPE_COUNT)


# ===----------------------------------------------------------------------=== #
# sharded (vocab-parallel) row ops: torch/parallel.py
# ===----------------------------------------------------------------------=== #


def _sharded_on[
    dtype: DType, kind: StaticString, stats: Bool
](
    ctx: DeviceContext,
    torch_stream: PythonObject,
    dst: Int,
    logits: Int,
    row_in: Int,
    targets: Int,
    options: Int,
    rows: Int,
    n: Int,
) raises:
    """One instance of `sharded_row_stats` (`stats`) or `sharded_epilogue`."""
    comptime acc = accum_dtype[dtype]()
    var t = Pointer[Int64, MutAnyOrigin](unsafe_from_address=targets)
    var o = Pointer[Float64, MutAnyOrigin](unsafe_from_address=options)
    if torch_stream is PythonObject(None):

        def on_cpu() raises {imm}:
            comptime if stats:
                row_stats_cpu[dtype, kind == "cross_entropy"](
                    _ptr[acc](dst), _ptr[dtype](logits), t, o, rows, n
                )
            else:
                epilogue_cpu[dtype, kind](
                    _ptr[dtype](dst),
                    _ptr[dtype](logits),
                    _ptr[acc](row_in),
                    t,
                    o,
                    rows,
                    n,
                )

        _on_cpu(on_cpu, rows * n)
        return
    comptime if GPU:

        def gpu_launch() raises {imm}:
            comptime if stats:
                launch_row_stats[dtype, kind == "cross_entropy"](
                    ctx, _ptr[acc](dst), _ptr[dtype](logits), t, o, rows, n
                )
            else:
                launch_epilogue[dtype, kind](
                    ctx,
                    _ptr[dtype](dst),
                    _ptr[dtype](logits),
                    _ptr[acc](row_in),
                    t,
                    o,
                    rows,
                    n,
                )

        _on_torch_stream(ctx, torch_stream, gpu_launch)
    else:
        raise _no_gpu()


def _sharded[
    stats: Bool
](
    ctx_ptr: PythonObject,
    torch_stream: PythonObject,
    dtype_obj: PythonObject,
    kind_obj: PythonObject,
    out_obj: PythonObject,
    logits_obj: PythonObject,
    row_in_obj: PythonObject,
    targets_obj: PythonObject,
    options_obj: PythonObject,
    rows_obj: PythonObject,
    n_obj: PythonObject,
) raises:
    """Dispatch a sharded call on its dtype and kind codes."""
    var ctx = _context(ctx_ptr)
    var code = Int(py=dtype_obj)
    var kind_code = Int(py=kind_obj)
    var dims = _dims(rows_obj, n_obj, PythonObject(1))
    if kind_code < 0 or kind_code >= 3:
        raise _bad_code("kind", kind_code, 3)
    comptime for c in range(DTYPE_COUNT):
        comptime dtype = _dtype_of[c]()
        if code == c:
            comptime for k in range(3):
                comptime kind = ("softmax", "log_softmax", "cross_entropy")[k]
                if kind_code == k:
                    _sharded_on[dtype, kind, stats](
                        ctx,
                        torch_stream,
                        Int(py=out_obj),
                        Int(py=logits_obj),
                        Int(py=row_in_obj),
                        Int(py=targets_obj),
                        Int(py=options_obj),
                        dims[0],
                        dims[1],
                    )
                    return
    raise _bad_code("dtype", code, DTYPE_COUNT)


def sharded_row_stats(
    ctx_ptr: PythonObject,
    torch_stream: PythonObject,
    dtype_obj: PythonObject,
    kind_obj: PythonObject,
    stats_obj: PythonObject,
    logits_obj: PythonObject,
    targets_obj: PythonObject,
    options_obj: PythonObject,
    rows_obj: PythonObject,
    n_obj: PythonObject,
) raises -> PythonObject:
    """Per-row statistics (rows, 4) of a (rows, n) slice of classes
    (op/sharded_ops.mojo); kind 0 softmax, 1 log_softmax, 2 cross_entropy."""
    _sharded[True](
        ctx_ptr,
        torch_stream,
        dtype_obj,
        kind_obj,
        stats_obj,
        logits_obj,
        PythonObject(0),
        targets_obj,
        options_obj,
        rows_obj,
        n_obj,
    )
    return PythonObject(None)


def sharded_epilogue(
    ctx_ptr: PythonObject,
    torch_stream: PythonObject,
    dtype_obj: PythonObject,
    kind_obj: PythonObject,
    out_obj: PythonObject,
    logits_obj: PythonObject,
    row_in_obj: PythonObject,
    targets_obj: PythonObject,
    options_obj: PythonObject,
    rows_obj: PythonObject,
    n_obj: PythonObject,
) raises -> PythonObject:
    """The slice's softmax, log-softmax or cross-entropy gradient from the
    rows' global (max, sum, scale) (rows, 3) (op/sharded_ops.mojo)."""
    _sharded[False](
        ctx_ptr,
        torch_stream,
        dtype_obj,
        kind_obj,
        out_obj,
        logits_obj,
        row_in_obj,
        targets_obj,
        options_obj,
        rows_obj,
        n_obj,
    )
    return PythonObject(None)


# ===----------------------------------------------------------------------=== #
# The module
# ===----------------------------------------------------------------------=== #


@export
def PyInit_launch_ext() abi("C") -> PythonObject:
    """The module object Python's import machinery asks for."""
    try:
        var b = PythonModuleBuilder("launch_ext")
        b.def_function[softmax](
            "softmax",
            docstring="softmax(ctx, stream, dtype, dst, src, outer, n, inner)",
        )
        b.def_function[log_softmax](
            "log_softmax",
            docstring=(
                "log_softmax(ctx, stream, dtype, dst, src, outer, n, inner)"
            ),
        )
        b.def_function[softmax_backward](
            "softmax_backward",
            docstring=(
                "softmax_backward(ctx, stream, dtype, dx, y, dy, outer, n,"
                " inner)"
            ),
        )
        b.def_function[log_softmax_backward](
            "log_softmax_backward",
            docstring=(
                "log_softmax_backward(ctx, stream, dtype, dx, logp, dy, outer,"
                " n, inner)"
            ),
        )
        b.def_function[softmax_masked](
            "softmax_masked",
            docstring=(
                "softmax_masked(ctx, stream, dtype, flags, dst, src, mask,"
                " options, outer, L, n, mask_rows)"
            ),
        )
        b.def_function[log_softmax_masked](
            "log_softmax_masked",
            docstring=(
                "log_softmax_masked(ctx, stream, dtype, flags, dst, src, mask,"
                " options, outer, L, n, mask_rows)"
            ),
        )
        b.def_function[cross_entropy](
            "cross_entropy",
            docstring=(
                "cross_entropy(ctx, stream, dtype, reduction, loss, dlogits,"
                " logits, targets, options, n_options, rows, n)"
            ),
        )
        b.def_function[scale_rows](
            "scale_rows",
            docstring=(
                "scale_rows(ctx, stream, dtype, data, factor, rows, n, per_row)"
            ),
        )
        b.def_function[sharded_row_stats](
            "sharded_row_stats",
            docstring=(
                "sharded_row_stats(ctx, stream, dtype, kind, stats, logits,"
                " targets, options, rows, n)"
            ),
        )
        b.def_function[sharded_epilogue](
            "sharded_epilogue",
            docstring=(
                "sharded_epilogue(ctx, stream, dtype, kind, out, logits,"
                " row_in, targets, options, rows, n)"
            ),
        )
        return b.finalize()
    except e:
        abort(t"max_softmax: failed to create the launch_ext module: {e}")
