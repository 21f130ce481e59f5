"""The graph-free launch path: our dispatch called from Python directly.

A Python extension module (built by `max_softmax.launch`, once per
kernel sources, compiler and target, into the kernel cache) whose functions
take raw addresses and dims and run the very calls MAX's ops run (each
op's `OpCall`, op/op_call.mojo), with no graph, no `Model.execute` and no
buffer objects between: ~0.2 µs of host work a call instead of ~40 (2-core
CPU host). Every function is `_entry` for its name (ENTRIES, ARGUMENTS),
which reads its arguments in order and runs its call (`_run`, `_launch`).

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

from std.os import abort
from std.python import Python, PythonObject
from std.python._cpython import PyObjectPtr
from std.python.bindings import PythonModuleBuilder
from std.memory import OpaquePointer
from std.sys import is_defined
from max.gpu.host import DeviceContext, DeviceStream

from op.cross_entropy_ops import CrossEntropyCall
from op.dispatch import launch_auto
from op.gpu_launch import HeldRows
from op.masked_flags import CAUSAL_FLAG, FLAG_COMBINATIONS, MASK_FLAG
from op.masked_softmax_ops import MaskedCall
from op.op_call import (
    BackwardCall,
    DeviceOptions,
    ForwardCall,
    OpCall,
    RowsView,
)
from op.scale_ops import ScaleCall
from op.sharded_ops import ShardedCall
from op.soft_cross_entropy_ops import SoftCrossEntropyCall

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

comptime KINDS = ("softmax", "log_softmax", "cross_entropy")
"""The sharded ops' kinds, by their codes 0..2."""

comptime ENTRIES = (
    "softmax",
    "log_softmax",
    "softmax_backward",
    "log_softmax_backward",
    "softmax_masked",
    "log_softmax_masked",
    "cross_entropy",
    "soft_cross_entropy",
    "scale_rows",
    "sharded_row_stats",
    "sharded_epilogue",
)
"""The module's functions (`_run` reads each one's own arguments)."""

comptime ARGUMENTS = (
    "(ctx, stream, dtype, dst, src, outer, n, inner)",
    "(ctx, stream, dtype, dst, src, outer, n, inner)",
    "(ctx, stream, dtype, dx, y, dy, outer, n, inner)",
    "(ctx, stream, dtype, dx, logp, dy, outer, n, inner)",
    (
        "(ctx, stream, dtype, flags, dst, src, mask, options, outer, L, n,"
        " mask_rows)"
    ),
    (
        "(ctx, stream, dtype, flags, dst, src, mask, options, outer, L, n,"
        " mask_rows)"
    ),
    (
        "(ctx, stream, dtype, reduction, loss, dlogits, logits, targets,"
        " options, n_options, rows, n)"
    ),
    (
        "(ctx, stream, dtype, reduction, loss, dlogits, logits, probs,"
        " options, n_options, rows, n)"
    ),
    "(ctx, stream, dtype, data, factor, rows, n, per_row)",
    "(ctx, stream, dtype, kind, stats, logits, targets, options, rows, n)",
    (
        "(ctx, stream, dtype, kind, out, logits, row_in, targets, options,"
        " rows, n)"
    ),
)
"""Each function's arguments as Python passes them (its docstring): the
first three shared (MAX's device context, the torch stream or None, the
dtype code)."""


@always_inline
def _dtype_of[code: Int]() -> DType:
    """The element type a dtype code names (the order of DTYPE_CODES in
    launch.py)."""
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


def _arity_of(arguments: StaticString) -> Int:
    """How many arguments an entry of ARGUMENTS names."""
    return arguments.count(",") + 1


struct _Args:
    """An entry's arguments as Python passed them (a tuple), read in order:
    the items are ints (read without a Python object between) but for the
    torch stream."""

    var args: PythonObject
    """The tuple."""
    var python: Python
    """The interpreter (looked up once a call)."""
    var at: Int
    """The next item."""

    def __init__(out self, args: PythonObject):
        """Read `args` from its first item."""
        self.args = args
        self.python = Python()
        self.at = 0

    def count(self) -> Int:
        """How many items `args` holds."""
        return Int(self.python.cpython().PyObject_Length(self.args._obj_ptr))

    def item(mut self) -> PyObjectPtr:
        """The next item (borrowed)."""
        var item = self.python.cpython().PyTuple_GetItem(
            self.args._obj_ptr, self.at
        )
        self.at += 1
        return item

    def object(mut self) raises -> PythonObject:
        """The next item as an object."""
        return PythonObject(from_borrowed=self.item())

    def int(mut self) raises -> Int:
        """The next item, an int."""
        var item = self.item()
        ref cpython = self.python.cpython()
        var value = Int(cpython.PyLong_AsSsize_t(item))
        if value == -1 and cpython.PyErr_Occurred():
            # Not an int (or past Int): the checked conversion's error.
            cpython.PyErr_Clear()
            return Int(py=PythonObject(from_borrowed=item))
        return value

    def code(mut self, what: StaticString, count: Int) raises -> Int:
        """The next item, a code 0 ..< count of `what`."""
        var code = self.int()
        if code < 0 or code >= count:
            raise _bad_code(what, code, count)
        return code

    def held[dtype: DType](mut self) raises -> HeldRows[dtype]:
        """The next item, the address of a buffer of `dtype`."""
        return HeldRows[dtype](unsafe_from_address=self.int())

    def view(mut self, with_inner: Bool = True) raises -> RowsView:
        """The next three items (outer, n, inner), or two (rows, n)."""
        var outer = self.int()
        var n = self.int()
        var inner = self.int() if with_inner else 1
        if outer < 0 or n < 0 or inner < 0:
            raise Error(
                t"max_softmax: negative dims (outer={outer}, n={n},"
                t" inner={inner})"
            )
        return RowsView(outer, n, inner)


def _context(addr: Int) raises -> DeviceContext:
    """MAX's DeviceContext at `addr` (borrowed: MAX's Device object keeps
    it alive, and the caller holds that object)."""
    if addr == 0:
        raise Error("max_softmax: null device context")
    return DeviceContext(
        OpaquePointer[MutUntrackedOrigin](unsafe_from_address=addr)
    )


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


def _launch[
    C: OpCall
](
    ctx: DeviceContext, torch_stream: PythonObject, call: C, elements: Int
) raises:
    """Run `call` on the CPU (no torch stream) or queue it on the GPU in
    order with torch's stream."""
    if torch_stream is PythonObject(None):

        def on_cpu() raises {imm}:
            call.run["cpu"](ctx)

        _on_cpu(on_cpu, elements)
        return
    comptime if GPU:

        def on_gpu() raises {imm}:
            call.run["gpu"](ctx)

        _on_torch_stream(ctx, torch_stream, on_gpu)
    else:
        raise _no_gpu()


def _entry[
    name: StaticString, arguments: StaticString
](mut py_self: PythonObject, mut py_args: PythonObject) raises -> PythonObject:
    """The module function `name`: the context, torch stream and dtype it
    shares with the others, then its own `arguments` (`_run`)."""
    comptime arity = _arity_of(arguments)
    var args = _Args(py_args)
    if args.count() != arity:
        raise Error(
            t"max_softmax: {name}{arguments} takes {arity} arguments, got"
            t" {args.count()}"
        )
    var ctx = _context(args.int())
    var torch_stream = args.object()
    var code = args.code("dtype", DTYPE_COUNT)
    comptime for c in range(DTYPE_COUNT):
        if code == c:
            _run[name, _dtype_of[c]()](ctx, torch_stream, args)
    return PythonObject(None)


def _run[
    name: StaticString, dtype: DType
](ctx: DeviceContext, torch_stream: PythonObject, mut args: _Args) raises:
    """Read the rest of entry `name`'s arguments (ARGUMENTS) and run its
    call on `dtype` buffers."""
    comptime if name == "softmax" or name == "log_softmax":
        comptime log_out = name == "log_softmax"
        comptime launch_rows = launch_auto[dtype, log_out]
        var dst = args.held[dtype]()
        var src = args.held[dtype]()
        var view = args.view()
        var call = ForwardCall[dtype, log_out, launch_rows](dst, src, view)
        _launch(ctx, torch_stream, call, view.size())
    elif name == "softmax_backward" or name == "log_softmax_backward":
        # a = y, or log p for log_softmax_backward.
        comptime log_in = name == "log_softmax_backward"
        var dx = args.held[dtype]()
        var a = args.held[dtype]()
        var dy = args.held[dtype]()
        var view = args.view()
        var call = BackwardCall[dtype, log_in, "auto"](dx, a, dy, view)
        _launch(ctx, torch_stream, call, view.size())
    elif name == "softmax_masked" or name == "log_softmax_masked":
        # As the `softmax_masked` op (op/masked_softmax_ops.mojo), with the
        # flags (MASK_FLAG, CAUSAL_FLAG) given, and `options` the float64
        # (scale,) buffer on the context's device.
        var flags = args.code("masked flags", FLAG_COMBINATIONS)
        var dst = args.held[dtype]()
        var x = args.held[dtype]()
        var mask = args.held[dtype]()
        var scale = args.held[DType.float64]()
        var causal = args.view()  # (outer, L, n)
        var mask_rows = args.int()
        if mask_rows < 1:
            raise Error(t"max_softmax: mask_rows must be >= 1, got {mask_rows}")
        if causal.size() == 0:
            return
        var view = RowsView(causal.outer * causal.n, causal.inner, 1)
        var call = MaskedCall[dtype, name == "log_softmax_masked"](
            dst,
            x,
            view,
            causal.n,
            mask,
            mask_rows,
            DeviceOptions(scale, 1 + flags),
        )
        _launch(ctx, torch_stream, call, view.size())
    elif name == "cross_entropy" or name == "soft_cross_entropy":
        # d loss / d logits into `dlogits` unless its address is 0 (it may
        # be `logits`' own where the kernels allow: torch/linear.py's
        # `inplace_safe`); `n_options` options as the op's call reads;
        # the targets are int64 class indices, or for soft_cross_entropy
        # class probabilities of `dtype` shaped as the logits.
        var reduction = args.code("reduction", REDUCTION_COUNT)
        var loss = args.held[dtype]()
        var dlogits = args.int()
        var logits = args.int()
        var targets = args.int()
        var values = args.held[DType.float64]()
        var options = DeviceOptions(values, args.int())
        var view = args.view(with_inner=False)
        comptime for r in range(REDUCTION_COUNT):
            comptime for g in range(2):
                comptime with_grad = g == 1
                if reduction == r and (dlogits != 0) == with_grad:
                    # No gradient: the kernels never write through dlogits,
                    # so the logits stand in (as MAX's op).
                    var grad = HeldRows[dtype](
                        unsafe_from_address=dlogits if with_grad else logits
                    )
                    var x = HeldRows[dtype](unsafe_from_address=logits)
                    comptime rd = _reduction_of[r]()
                    comptime if name == "soft_cross_entropy":
                        var call = SoftCrossEntropyCall[dtype, with_grad, rd](
                            x,
                            HeldRows[dtype](unsafe_from_address=targets),
                            view,
                            options,
                            loss,
                            grad,
                        )
                        _launch(ctx, torch_stream, call, view.size())
                    else:
                        var call = CrossEntropyCall[dtype, with_grad, rd](
                            x,
                            HeldRows[DType.int64](unsafe_from_address=targets),
                            view,
                            options,
                            loss,
                            grad,
                        )
                        _launch(ctx, torch_stream, call, view.size())
    elif name == "scale_rows":
        # GPU contexts only: on the CPU the caller reads the factor itself.
        if torch_stream is PythonObject(None):
            raise Error("max_softmax: scale_rows runs on a GPU context only")
        var data = args.held[dtype]()
        var factor = args.held[dtype]()
        var view = args.view(with_inner=False)
        var call = ScaleCall[dtype](data, factor, view, args.int() != 0)
        _launch(ctx, torch_stream, call, view.size())
    elif name == "sharded_row_stats" or name == "sharded_epilogue":
        # torch/parallel.py; op/sharded_ops.mojo. Statistics read no row
        # inputs: their own buffer stands in, never read.
        comptime stats = name == "sharded_row_stats"
        var kind = args.code("kind", len(KINDS))
        var output = args.int()
        var logits = args.held[dtype]()
        var row_in = output if stats else args.int()
        var targets = args.held[DType.int64]()
        var options = args.held[DType.float64]()
        var view = args.view(with_inner=False)
        comptime for k in range(len(KINDS)):
            comptime S = ShardedCall[dtype, KINDS[k], stats]
            if kind == k:
                var call = S(
                    logits,
                    view,
                    targets,
                    options,
                    HeldRows[S.acc](unsafe_from_address=row_in),
                    HeldRows[S.out_dtype](unsafe_from_address=output),
                )
                _launch(ctx, torch_stream, call, view.size())
    else:
        comptime assert False, "no such entry"


# ===----------------------------------------------------------------------=== #
# The module
# ===----------------------------------------------------------------------=== #


@export
def PyInit_launch_ext() abi("C") -> PythonObject:
    """The module object Python's import machinery asks for."""
    try:
        var b = PythonModuleBuilder("launch_ext")
        comptime for i in range(len(ENTRIES)):
            comptime name: StaticString = ENTRIES[i]
            comptime arguments: StaticString = ARGUMENTS[i]
            b.def_py_function[_entry[name, arguments]](
                name, docstring=arguments
            )
        return b.finalize()
    except e:
        abort(t"max_softmax: failed to create the launch_ext module: {e}")
