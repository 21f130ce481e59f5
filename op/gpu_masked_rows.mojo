"""Scaled, masked and causal softmax on the GPU, rows along the last axis.

Each value is z = x * scale + mask (`row_math.masked_value`); row r of the
(rows, n) input uses mask row `r % mask_rows` and, when causal, keeps
columns j <= i with i = r % L, the mask computed here rather than read.
`scale` is a run-time value read from a float64 `options` tensor on the
device (no host sync), so a new scale re-uses the compiled model; L is a
launch argument; whether there is a
mask and whether it is causal are compile-time flags.

- rows up to 32K elements (any dtype): a register plan of
  gpu_register_rows (8 to 512 threads a row, several rows a block for
  short rows); x and the mask row are read once, z held in registers in
  the accumulator type, the row written once. A causal row reads nothing
  past its diagonal: whole chunks there are skipped. Launched with
  Programmatic Dependent Launch as the plain forward (`PDL`): in a graph
  of such ops each launch overlaps the previous one's tail.
- longer rows: a block of 512 threads a row, an online (max, sum of exp)
  pass, then a pass that reads x (and the mask) again and writes: the
  block strategy (`block_rows`, gpu_block_rows) over `MaskedBlockRow`.

`MaskedRows` holds the buffers and launches either; `variant=` forces one
("register", "block").

16-byte vector loads where x, the mask and the output start aligned and
n % V == 0; coalesced scalar loads otherwise. Nothing synchronises with the
host: the launch is capture-safe.
"""

from max.gpu import MAX_THREADS_PER_BLOCK_METADATA
from max.gpu.host import DeviceContext
from max.gpu.primitives.grid_controls import pdl_launch_attributes
from std.utils import StaticTuple
from std.utils.numerics import inf

from .dispatch import launch_register_strategy
from .gpu_block_rows import LOOP_A_PATH, block_rows
from .gpu_launch import HeldRows, aligned16, held, kernel_arg, vector_flag_of
from .gpu_reductions import block_max, block_max_sum, block_sum
from .gpu_register_rows import (
    MAX_ROW_REGISTERS,
    PDL,
    PDL_LEVEL,
    AlignedInstances,
    RegisterPlanKernel,
    block_threads,
    enqueue_split_aligned,
    register_plan,
    register_rows,
)
from .row_math import (
    accum_dtype,
    masked_epilogue,
    masked_row_scale,
    masked_value,
    online_add,
    sum_shift,
    vector_width,
)
from .row_op import BlockRowOp, RegisterRowOp
from .row_tensors import RowTensors, tensors_of
from .variants import RowStrategies, Strategy, launch_strategy, no_strategy

# Threads of the block-per-row kernel for rows past the register plans.
comptime BLOCK_ROW_THREADS = 512


@always_inline
def row_limit[causal: Bool](row: Int, n: Int, causal_rows: Int) -> Int:
    """Columns [0, limit) of `row` are kept: all n, or to the diagonal."""
    comptime if causal:
        return min(n, row % causal_rows + 1)
    return n


@always_inline
def _chunk[
    dtype: DType, has_mask: Bool, causal: Bool, V: Int
](
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    mask: Pointer[Scalar[dtype], MutAnyOrigin],
    e0: Int,
    limit: Int,
    scale: Scalar[accum_dtype[dtype]()],
) -> SIMD[accum_dtype[dtype](), V]:
    """z of the aligned vector [e0, e0 + V), -inf past `limit` (read only
    where e0 < limit; n % V == 0, so the vector lies inside the row)."""
    comptime acc = accum_dtype[dtype]()
    var z = SIMD[acc, V](-inf[acc]())
    if e0 < limit:
        var mk = SIMD[acc, V](0)
        comptime if has_mask:
            mk = (
                mask.unsafe_offset(e0)
                .unsafe_load[width=V, alignment=16]()
                .cast[acc]()
            )
        z = masked_value[acc, V](
            x.unsafe_offset(e0)
            .unsafe_load[width=V, alignment=16]()
            .cast[acc](),
            scale,
            mk,
        )
        comptime if causal:
            comptime for v in range(V):
                if e0 + v >= limit:
                    z[v] = -inf[acc]()
    return z


@always_inline
def _element[
    dtype: DType, has_mask: Bool
](
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    mask: Pointer[Scalar[dtype], MutAnyOrigin],
    e: Int,
    limit: Int,
    scale: Scalar[accum_dtype[dtype]()],
) -> Scalar[accum_dtype[dtype]()]:
    """z of element e, -inf past `limit` (read only where e < limit)."""
    comptime acc = accum_dtype[dtype]()
    if e >= limit:
        return -inf[acc]()
    var mk = Scalar[acc](0)
    comptime if has_mask:
        mk = mask[unsafe_offset=e].cast[acc]()
    return masked_value[acc, 1](x[unsafe_offset=e].cast[acc](), scale, mk)


@__llvm_metadata(
    MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](
        Int32(block_threads[threads]())
    ),
)
def masked_register_kernel[
    dtype: DType,
    log_out: Bool,
    has_mask: Bool,
    causal: Bool,
    threads: Int,
    V: Int,
    K: Int,
    pdl: Bool,
    aligned: Bool,
](
    dst: Pointer[Scalar[dtype], MutAnyOrigin],
    src: Pointer[Scalar[dtype], MutAnyOrigin],
    mask: Pointer[Scalar[dtype], MutAnyOrigin],
    options: Pointer[Float64, MutAnyOrigin],
    rows: Int64,
    n: Int64,
    mask_rows: Int64,
    causal_rows: Int64,
    vector_flag: Int32,
):
    """Masked softmax of rows of length `n <= threads * V * K`, z held in
    registers: the register strategy (`register_rows`, whose chunks thread
    t holds) over `MaskedRegisterRow`. Launched with Programmatic Dependent
    Launch if `pdl`, and compiled for aligned rows only if `aligned`, as
    `register_rows_kernel`.

    Args:
        dst: Output rows.
        src: Input rows.
        mask: Additive mask rows (not read unless `has_mask`).
        options: (scale,) on the device.
        rows: Number of rows.
        n: Row length.
        mask_rows: Rows of the mask; row r uses row r % mask_rows.
        causal_rows: L: causal row r keeps columns j <= r % L.
        vector_flag: Nonzero when dst, src and mask rows start 16-byte aligned.
    """
    comptime assert max(V, 4) * K <= MAX_ROW_REGISTERS
    var op = MaskedRegisterRow[dtype, log_out, has_mask, causal, threads, V, K](
        MaskedRows[dtype, log_out, has_mask, causal](
            held(dst),
            held(src),
            held(mask),
            held(options),
            Int(rows),
            Int(n),
            Int(mask_rows),
            Int(causal_rows),
            vector_flag,
        )
    )
    register_rows[pdl=pdl, aligned=aligned](op, rows, n, vector_flag)


struct MaskedRegisterRow[
    dtype: DType,
    log_out: Bool,
    has_mask: Bool,
    causal: Bool,
    T: Int,
    V: Int,
    K: Int,
](RegisterRowOp):
    """Masked softmax (log-softmax with `log_out`) of `src` into `dst` as a
    `RegisterRowOp`: K chunks of V a thread, held as z = x * scale + mask
    in the accumulator type (-inf past the row or a causal row's diagonal,
    which is not read); it folds (max, sum of exp(z - max))."""

    comptime threads = Self.T
    comptime acc = accum_dtype[Self.dtype]()

    var rows: MaskedRows[Self.dtype, Self.log_out, Self.has_mask, Self.causal]
    """The tensors and their shape."""
    var x: HeldRows[Self.dtype]
    """This group's input row."""
    var y: HeldRows[Self.dtype]
    """This group's output row."""
    var m_row: HeldRows[Self.dtype]
    """This group's mask row."""
    var len: Int
    """Elements of the row written (0 past the last row)."""
    var limit: Int
    """Elements of the row read: `len`, or to a causal row's diagonal."""
    var z: SIMD[Self.acc, Self.V * Self.K]
    """The thread's chunks of z."""
    var scale: Scalar[Self.acc]
    """What x is multiplied by."""
    var shift: Scalar[Self.acc]
    """`sum_shift` of the row's max."""
    var rs: Scalar[Self.acc]
    """The row's `masked_row_scale`."""

    @always_inline
    def __init__(
        out self,
        rows: MaskedRows[Self.dtype, Self.log_out, Self.has_mask, Self.causal],
    ):
        """The op on these rows; nothing is read yet (the strategy may
        first wait for the previous grid)."""
        self.rows = rows
        self.x = rows.src
        self.y = rows.dst
        self.m_row = rows.mask
        self.len = 0
        self.limit = 0
        self.scale = 0
        self.z = SIMD[Self.acc, Self.V * Self.K](0)
        self.shift = 0
        self.rs = 0

    @always_inline
    def begin(mut self, row: Int, len: Int):
        """The scale, the row's limit, its input, output and mask rows."""
        var n = self.rows.n
        self.scale = self.rows.options[unsafe_offset=0].cast[Self.acc]()
        self.len = len
        comptime if Self.causal:
            self.limit = row_limit[Self.causal](row, len, self.rows.causal_rows)
        else:
            self.limit = len
        self.x = self.rows.src.unsafe_offset(row * n)
        self.y = self.rows.dst.unsafe_offset(row * n)
        self.m_row = self.rows.mask.unsafe_offset(
            (row % self.rows.mask_rows) * n
        )

    @always_inline
    def fold(mut self, t: Int, vector_loads: Bool):
        """Load z (-inf past the limit), then the row's shift and
        `masked_row_scale`."""
        comptime acc = Self.acc
        comptime assert acc.is_floating_point()
        comptime block = block_threads[Self.T]()
        var x = kernel_arg(self.x)
        var m_row = kernel_arg(self.m_row)
        var z = SIMD[acc, Self.V * Self.K](-inf[acc]())
        comptime for k in range(Self.K):
            var zc: SIMD[acc, Self.V]
            if vector_loads:
                zc = _chunk[Self.dtype, Self.has_mask, Self.causal, Self.V](
                    x, m_row, (k * Self.T + t) * Self.V, self.limit, self.scale
                )
            else:
                zc = SIMD[acc, Self.V](-inf[acc]())
                comptime for v in range(Self.V):
                    zc[v] = _element[Self.dtype, Self.has_mask](
                        x,
                        m_row,
                        (k * Self.V + v) * Self.T + t,
                        self.limit,
                        self.scale,
                    )
            z = z.insert[offset=k * Self.V](zc)
        self.z = z
        var row_max = block_max[acc, Self.T, block](z.reduce_max())
        self.shift = sum_shift[acc](row_max)
        var s = Scalar[acc](0)
        comptime for k in range(Self.K):
            s += (
                masked_epilogue[False, acc, Self.V](
                    z.slice[Self.V, offset=k * Self.V](),
                    self.shift,
                    Scalar[acc](1),
                )
            ).reduce_add()
        self.rs = masked_row_scale[Self.log_out, acc](
            block_sum[acc, Self.T, block](s), row_max
        )

    @always_inline
    def finish(self, live: Bool, row: Int, t: Int):
        """Nothing a row."""
        pass

    @always_inline
    def write(self, t: Int, vector_loads: Bool):
        """The chunks' masked softmax, to the row's end (0 or -inf past a
        causal row's diagonal)."""
        comptime acc = Self.acc
        var y = kernel_arg(self.y)
        comptime for k in range(Self.K):
            var out = masked_epilogue[Self.log_out, acc, Self.V](
                self.z.slice[Self.V, offset=k * Self.V](), self.shift, self.rs
            ).cast[Self.dtype]()
            if vector_loads:
                var e0 = (k * Self.T + t) * Self.V
                if e0 < self.len:
                    y.unsafe_offset(e0).unsafe_store[alignment=16](out)
            else:
                comptime for v in range(Self.V):
                    var e = (k * Self.V + v) * Self.T + t
                    if e < self.len:
                        y[unsafe_offset=e] = out[v]


@__llvm_metadata(
    MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](Int32(T)),
)
def masked_block_kernel[
    dtype: DType,
    log_out: Bool,
    has_mask: Bool,
    causal: Bool,
    V: Int,
    T: Int,
](
    dst: Pointer[Scalar[dtype], MutAnyOrigin],
    src: Pointer[Scalar[dtype], MutAnyOrigin],
    mask: Pointer[Scalar[dtype], MutAnyOrigin],
    options: Pointer[Float64, MutAnyOrigin],
    n: Int64,
    mask_rows: Int64,
    causal_rows: Int64,
    vector_flag: Int32,
):
    """Masked softmax of a row of any length, a block of T threads a row:
    an online (max, sum of exp) pass, then a second read that writes.
    Arguments as `masked_register_kernel` (one block a row)."""
    var op = MaskedBlockRow[dtype, log_out, has_mask, causal, V, T](
        tensors_of(dst, src, mask), options, mask_rows, causal_rows
    )
    block_rows[walk=LOOP_A_PATH](op, n, vector_flag)


struct MaskedBlockRow[
    dtype: DType,
    log_out: Bool,
    has_mask: Bool,
    causal: Bool,
    V_: Int,
    T_: Int,
](BlockRowOp):
    """Masked softmax (log-softmax with `log_out`) of `src` into `dst` as a
    `BlockRowOp`: an online (max, sum of exp(z - max)) fold of
    z = x * scale + mask to the row's limit, then z again from a second
    read, written to the row's end (-inf past a causal row's diagonal,
    which is not read)."""

    comptime threads = Self.T_
    comptime width = Self.V_
    comptime acc = accum_dtype[Self.dtype]()

    var options: HeldRows[DType.float64]
    """(scale,) on the device."""
    var shape: Tuple[Int, Int]
    """Rows of the mask and L (causal row r keeps columns j <= r % L)."""
    var limit: Int
    """Elements of the row read: all, or to a causal row's diagonal."""
    var x: HeldRows[Self.dtype]
    """The input rows, then (`begin`) the block's row."""
    var y: HeldRows[Self.dtype]
    """The output rows, then the block's row."""
    var m_row: HeldRows[Self.dtype]
    """The mask rows, then the block's row of them (r % mask_rows)."""
    var scale: Scalar[Self.acc]
    """What x is multiplied by."""
    var part: Tuple[Scalar[Self.acc], Scalar[Self.acc]]
    """The thread's online (max, sum of exp(z - max))."""
    var row: Tuple[Scalar[Self.acc], Scalar[Self.acc]]
    """The row's `sum_shift` of its max and its `masked_row_scale`."""

    @always_inline
    def __init__(
        out self,
        t: RowTensors[Self.dtype],
        options: Pointer[Float64, MutAnyOrigin],
        mask_rows: Int64,
        causal_rows: Int64,
    ):
        """The op on these tensors (dst from src and the mask); nothing is
        read yet."""
        comptime assert Self.acc.is_floating_point()
        self.x = t.a
        self.y = t.dst
        self.m_row = t.b
        self.options = held(options)
        self.shape = (Int(mask_rows), Int(causal_rows))
        self.limit = 0
        self.scale = 0
        self.part = (Scalar[Self.acc](0), Scalar[Self.acc](0))
        self.row = (Scalar[Self.acc](0), Scalar[Self.acc](0))

    @always_inline
    def begin(mut self, row: Int, len: Int) -> Int:
        """The scale, the row's limit, its input, output and mask rows."""
        self.scale = kernel_arg(self.options)[unsafe_offset=0].cast[Self.acc]()
        comptime if Self.causal:
            self.limit = row_limit[Self.causal](row, len, self.shape[1])
        else:
            self.limit = len
        self.x = self.x.unsafe_offset(row * len)
        self.y = self.y.unsafe_offset(row * len)
        self.m_row = self.m_row.unsafe_offset((row % self.shape[0]) * len)
        self.part = (-inf[Self.acc](), Scalar[Self.acc](0))
        return self.limit

    @always_inline
    def _z_vector(self, e: Int) -> SIMD[Self.acc, Self.V_]:
        """z of the vector at e (n % V == 0: it lies inside the row; the
        last one a causal row reads may straddle its diagonal)."""
        return _chunk[Self.dtype, Self.has_mask, Self.causal, Self.V_](
            kernel_arg(self.x),
            kernel_arg(self.m_row),
            e,
            self.limit,
            self.scale,
        )

    @always_inline
    def _z_element(self, e: Int) -> Scalar[Self.acc]:
        """z of element e."""
        return _element[Self.dtype, Self.has_mask](
            kernel_arg(self.x),
            kernel_arg(self.m_row),
            e,
            self.limit,
            self.scale,
        )

    @always_inline
    def fold_vector(mut self, e: Int):
        """Fold the vector's z into (m, s)."""
        self.part = online_add[Self.acc, Self.V_](
            self.part[0], self.part[1], self._z_vector(e)
        )

    @always_inline
    def fold_element(mut self, e: Int):
        """Fold the element's z into (m, s)."""
        self.part = online_add[Self.acc, 1](
            self.part[0], self.part[1], self._z_element(e)
        )

    @always_inline
    def combine(mut self):
        """The row's shift and `masked_row_scale`."""
        var pair = block_max_sum[Self.acc, Self.T_](self.part[0], self.part[1])
        self.row = (
            sum_shift[Self.acc](pair[0]),
            masked_row_scale[Self.log_out, Self.acc](pair[1], pair[0]),
        )

    @always_inline
    def write_vector(self, e: Int):
        """The vector's masked softmax."""
        kernel_arg(self.y).unsafe_offset(e).unsafe_store[alignment=16](
            masked_epilogue[Self.log_out, Self.acc, Self.V_](
                self._z_vector(e), self.row[0], self.row[1]
            ).cast[Self.dtype]()
        )

    @always_inline
    def write_element(self, e: Int):
        """The element's masked softmax."""
        kernel_arg(self.y)[unsafe_offset=e] = masked_epilogue[
            Self.log_out, Self.acc, 1
        ](self._z_element(e), self.row[0], self.row[1]).cast[Self.dtype]()


@fieldwise_init
struct MaskedRows[dtype: DType, log_out: Bool, has_mask: Bool, causal: Bool](
    AlignedInstances, ImplicitlyCopyable, RegisterPlanKernel, RowStrategies
):
    """Masked rows with their buffers: the strategies "register"
    (`masked_register_kernel`, rows to 32K elements) and "block"
    (`masked_block_kernel`, any length); for "register" also the plan
    kernel with its arguments (`launch_register_strategy`)."""

    var dst: HeldRows[Self.dtype]
    """Output rows."""
    var src: HeldRows[Self.dtype]
    """Input rows."""
    var mask: HeldRows[Self.dtype]
    """Mask rows."""
    var options: HeldRows[DType.float64]
    """(scale,) on the device."""
    var rows: Int
    """Number of rows."""
    var n: Int
    """Row length."""
    var mask_rows: Int
    """Rows of the mask."""
    var causal_rows: Int
    """L of the causal rows."""
    var vector_flag: Int32
    """Whether the rows start 16-byte aligned (`vector_flag_of`)."""

    @staticmethod
    def op_name() -> String:
        """The op's name in error messages."""
        return "log_softmax_masked" if Self.log_out else "softmax_masked"

    @staticmethod
    def has(s: Strategy) -> Bool:
        """Strategies "register" and "block"."""
        return s == Strategy.REGISTER or s == Strategy.BLOCK

    def auto(self, ctx: DeviceContext) raises -> Strategy:
        """A register plan where one holds the row, else a block a row."""
        if register_plan(self.n, vector_width[Self.dtype](), 1) >= 0:
            return Strategy.REGISTER
        return Strategy.BLOCK

    def launch[s: Strategy](self, ctx: DeviceContext) raises:
        """Enqueue the rows under `s`."""
        comptime V = vector_width[Self.dtype]()
        comptime if s == Strategy.REGISTER:
            launch_register_strategy[V, MAX_ROW_REGISTERS](
                ctx, self, self.rows, self.n, Self.op_name()
            )
        elif s == Strategy.BLOCK:
            comptime kernel = masked_block_kernel[
                Self.dtype,
                Self.log_out,
                Self.has_mask,
                Self.causal,
                V,
                BLOCK_ROW_THREADS,
            ]
            ctx.enqueue_function[kernel](
                kernel_arg(self.dst),
                kernel_arg(self.src),
                kernel_arg(self.mask),
                kernel_arg(self.options),
                Int64(self.n),
                Int64(self.mask_rows),
                Int64(self.causal_rows),
                self.vector_flag,
                grid_dim=self.rows,
                block_dim=BLOCK_ROW_THREADS,
            )
        else:
            no_strategy(Self.op_name())

    def enqueue[
        T: Int, K: Int
    ](self, ctx: DeviceContext, grid: Int, block: Int) raises:
        """Enqueue `masked_register_kernel` for T threads a row, K chunks a
        thread: its aligned-only instance where the rows are aligned and
        `split_aligned` says so."""
        enqueue_split_aligned[Self.dtype, T, K](
            self, self.vector_flag, ctx, grid, block
        )

    def enqueue_instance[
        T: Int, K: Int, aligned: Bool
    ](self, ctx: DeviceContext, grid: Int, block: Int) raises:
        """Enqueue the kernel's instance for aligned rows or for any rows."""
        comptime V = vector_width[Self.dtype]()
        comptime kernel = masked_register_kernel[
            Self.dtype,
            Self.log_out,
            Self.has_mask,
            Self.causal,
            T,
            V,
            K,
            PDL,
            aligned,
        ]
        ctx.enqueue_function[kernel](
            kernel_arg(self.dst),
            kernel_arg(self.src),
            kernel_arg(self.mask),
            kernel_arg(self.options),
            Int64(self.rows),
            Int64(self.n),
            Int64(self.mask_rows),
            Int64(self.causal_rows),
            self.vector_flag,
            grid_dim=grid,
            block_dim=block,
            attributes=pdl_launch_attributes(PDL_LEVEL),
        )


def launch_masked_rows[
    dtype: DType,
    log_out: Bool,
    has_mask: Bool,
    causal: Bool,
    variant: StaticString = "auto",
](
    ctx: DeviceContext,
    dst: Pointer[Scalar[dtype], MutAnyOrigin],
    src: Pointer[Scalar[dtype], MutAnyOrigin],
    mask: Pointer[Scalar[dtype], MutAnyOrigin],
    options: Pointer[Float64, MutAnyOrigin],
    rows: Int,
    n: Int,
    mask_rows: Int,
    causal_rows: Int,
) raises:
    """Masked softmax of `rows` rows of `n` on the GPU under the strategy
    `variant` names ("auto": a register plan for rows up to 32K elements,
    else a block a row; "register"; "block")."""
    comptime V = vector_width[dtype]()
    if rows == 0 or n == 0:
        return
    var aligned = aligned16(Int(dst), Int(src), Int(mask) if has_mask else 0)
    comptime L = MaskedRows[dtype, log_out, has_mask, causal]
    launch_strategy[L, variant](
        L(
            held(dst),
            held(src),
            held(mask),
            held(options),
            rows,
            n,
            mask_rows,
            causal_rows,
            vector_flag_of(aligned, n, V),
        ),
        ctx,
    )
