"""What the cross-entropy kernel families share: the device's options
(ignore_index, label smoothing), the gradient's scale, where a row's loss
goes (`store_row_loss`), and the pieces of a row laid out as a scalar head,
an aligned vector body and a scalar tail (gpu_ce_block_rows,
gpu_ce_smem_rows): the gradient of a kept row's logits (`CrossEntropyGrad`),
the fill of a row not kept, and the thread that writes the target's entry;
which rows hold exps on chip (`holds_exp`); the tensors the row kernels
take, as one argument (`CEArgs`).
"""

from std.sys import size_of

from .cross_entropy_math import grad_of
from .gpu_launch import GlobalRows, KernelArgs, in_global
from .gpu_smem_rows import HELD_EXP_SHIFT, HeldMap
from .row_math import accum_dtype, exp_nan
from .row_part import RowPart

# 16-bit rows on chip: after sweep 2, the cross-entropy's on-chip op
# (gpu_ce_smem_rows) keeps exp(x - max) * 2^HELD_EXP_SHIFT (`held_exp`; under
# a softcap, times its chain factor) in place of each logit, in the logits'
# own type, so the gradient sweep computes no exp (`holds_exp`). The shift
# keeps float16's full precision down to exp(x - max) = 2^-29 (subnormals
# to 2^-39), below which a float16 gradient is subnormal or 0 anyway; the
# largest value, 2^15, stays under float16's 65504. bfloat16 holds any exp,
# rounded to 8 bits: without label smoothing the gradient, rounded again, is
# within one bfloat16 ulp of the correctly rounded value (~74% equal on
# normal logits), float16 within one float16 ulp; with smoothing, entries
# where p ~ eps / V nearly cancel and keep the held exp's absolute error (up
# to 2^-9 x eps / V x scale in bfloat16), many ulps of a result near 0.


@always_inline
def holds_exp[dtype: DType]() -> Bool:
    """Whether the on-chip cross-entropy holds exps (2^HELD_EXP_SHIFT times
    them) in place of the logits after sweep 2: 16-bit rows, where two exps
    a value (one for the sum, one for the gradient) kept the SM busy while
    HBM idled (78-81% of copy against float32's 96%)."""
    return size_of[dtype]() == 2


@always_inline
def ce_options[
    acc: DType
](options: Pointer[Float64, MutAnyOrigin]) -> Tuple[Int64, Scalar[acc]]:
    """(ignore_index, label smoothing) from the device's options tensor."""
    return (
        Int64(options[unsafe_offset=0]),
        options[unsafe_offset=1].cast[acc](),
    )


@always_inline
def grad_scale[
    acc: DType, mean: Bool
](count: Pointer[Float64, MutAnyOrigin]) -> Scalar[acc]:
    """The gradient's scale: 1 / rows kept for "mean", else 1."""
    comptime if mean:
        return Scalar[acc](1 / count[unsafe_offset=0])
    return Scalar[acc](1)


@always_inline
def store_row_loss[
    dtype: DType, reduce: Bool
](
    row_losses: Pointer[Scalar[accum_dtype[dtype]()], MutAnyOrigin],
    loss: Pointer[Scalar[dtype], MutAnyOrigin],
    row: Int,
    value: Scalar[accum_dtype[dtype]()],
):
    """Row `row`'s loss: into `row_losses` in the accumulator type where the
    losses are reduced after the kernel (`reduce`), else into `loss` in
    dtype."""
    comptime if reduce:
        row_losses[unsafe_offset=row] = value
    else:
        loss[unsafe_offset=row] = value.cast[dtype]()


@fieldwise_init
struct CEArgs[dtype: DType](KernelArgs):
    """The tensors every class-index cross-entropy row kernel takes first
    (`ce_block_kernel`, `ce_register_kernel`, `ce_smem_kernel`), passed as
    one by value, in the order they had as separate parameters (the SASS
    stays theirs); a kernel takes each pointer out with `in_global`.
    `CELaunchRows` holds it."""

    comptime device_type: AnyType = Self

    var dlogits: GlobalRows[Self.dtype]
    """Gradient rows (written only `with_grad`)."""
    var logits: GlobalRows[Self.dtype]
    """Logit rows."""
    var targets: GlobalRows[DType.int64]
    """A class index a row."""
    var options: GlobalRows[DType.float64]
    """(ignore_index, label smoothing), then the extended options."""
    var count: GlobalRows[DType.float64]
    """The (weighted) count of kept rows (read only for "mean")."""
    var row_losses: GlobalRows[accum_dtype[Self.dtype]()]
    """A loss a row, accumulator type (written if `reduce`)."""
    var loss: GlobalRows[Self.dtype]
    """A loss a row in dtype (written unless `reduce`)."""

    @staticmethod
    def get_type_name() -> String:
        """The type's name, for kernel-argument error messages."""
        return "CEArgs"

    @always_inline
    def store_loss[
        reduce: Bool
    ](self, row: Int, value: Scalar[accum_dtype[Self.dtype]()]):
        """Row `row`'s loss where `reduce` sends it (`store_row_loss`)."""
        store_row_loss[Self.dtype, reduce](
            in_global(self.row_losses), in_global(self.loss), row, value
        )


@fieldwise_init
struct CELaunchRows[dtype: DType](ImplicitlyCopyable):
    """`rows` class-index cross-entropy rows of `n` as a row kernel's
    launcher takes them (`launch_ce_block`, `launch_ce_parts`,
    `enqueue_ce_register`): the kernels' `CEArgs`, and whether logits and
    dlogits start 16-byte aligned. `CERows` holds one, as the forward's
    strategies hold a `LaunchRows`, so the launchers need not import it."""

    var args: CEArgs[Self.dtype]
    """The tensors, as the row kernels take them."""
    var rows: Int
    """Number of rows."""
    var n: Int
    """Row length."""
    var aligned: Bool
    """Whether logits and dlogits start 16-byte aligned."""


struct CrossEntropyGrad[dtype_: DType, holds_exp: Bool](HeldMap):
    """The gradient of held logits, (exp(x - max) / sum - eps / V) *
    scale; with `holds_exp`, the held body values are `held_exp`s already
    and each takes one FMA."""

    comptime dtype = Self.dtype_

    var row_max: Scalar[accum_dtype[Self.dtype_]()]
    """The row's max."""
    var inv_s: Scalar[accum_dtype[Self.dtype_]()]
    """1 / the row's sum of exp(x - max)."""
    var smooth: Scalar[accum_dtype[Self.dtype_]()]
    """eps / V (`smoothing_of`)."""
    var scale: Scalar[accum_dtype[Self.dtype_]()]
    """The gradient's scale (`grad_scale`)."""
    var per_held: Scalar[accum_dtype[Self.dtype_]()]
    """scale / sum / 2^HELD_EXP_SHIFT: a held exp's factor."""
    var shift: Scalar[accum_dtype[Self.dtype_]()]
    """-eps / V * scale."""

    @always_inline
    def __init__(
        out self,
        row_max: Scalar[accum_dtype[Self.dtype_]()],
        inv_s: Scalar[accum_dtype[Self.dtype_]()],
        smooth: Scalar[accum_dtype[Self.dtype_]()],
        scale: Scalar[accum_dtype[Self.dtype_]()],
    ):
        """The map of a row with these terms."""
        comptime acc = accum_dtype[Self.dtype_]()
        self.row_max = row_max
        self.inv_s = inv_s
        self.smooth = smooth
        self.scale = scale
        self.per_held = 0
        self.shift = 0
        comptime if Self.holds_exp:
            self.per_held = inv_s * Scalar[acc](2.0**-HELD_EXP_SHIFT) * scale
            self.shift = -smooth * scale

    @always_inline
    def body[w: Int](self, v: SIMD[Self.dtype, w]) -> SIMD[Self.dtype, w]:
        """The gradient of held body values."""
        comptime if Self.holds_exp:
            return (
                v.cast[accum_dtype[Self.dtype]()]()
                .fma(self.per_held, self.shift)
                .cast[Self.dtype]()
            )
        return self.edge[w](v.cast[accum_dtype[Self.dtype]()]())

    @always_inline
    def edge[
        w: Int
    ](self, v: SIMD[accum_dtype[Self.dtype](), w]) -> SIMD[Self.dtype, w]:
        """The gradient of logits in the accumulator type."""
        comptime acc = accum_dtype[Self.dtype]()
        return grad_of[acc, w](
            exp_nan[acc, w](v - self.row_max),
            self.inv_s,
            self.smooth,
            self.scale,
        ).cast[Self.dtype]()


@always_inline
def fill_part[
    dtype: DType, V: Int, T: Int
](y: Pointer[Scalar[dtype], MutAnyOrigin], p: RowPart, fill: Scalar[dtype]):
    """Thread `p.t`'s share of a gradient row (or part) not kept (0 for an
    ignored row, NaN for a bad target), reading nothing."""
    for i in range(p.t, p.nvec, T):
        y.unsafe_offset(p.head + i * V).unsafe_store[alignment=16](
            SIMD[dtype, V](fill)
        )
    for e in range(p.t, p.head, T):
        y[unsafe_offset=e] = fill
    for e in range(p.tail_begin + p.t, p.len, T):
        y[unsafe_offset=e] = fill


@always_inline
def target_owner[V: Int, T: Int](tgt: Int, head: Int, tail_begin: Int) -> Int:
    """The thread of a T-thread block that writes the row's element `tgt`
    in `_write_grad` and `CrossEntropyRow`: element e of the scalar head by
    thread e % T, vector i of the body by thread i % T, tail element
    tail_begin + j by thread j."""
    if tgt < head:
        return tgt % T
    if tgt >= tail_begin:
        return (tgt - tail_begin) % T
    return ((tgt - head) // V) % T
