"""GPU kernels of the backward ops (softmax_backward, log_softmax_backward)
for short rows, the fallback, and rows along another axis.

They read two tensors and write one, with one row reduction in between.
Rows that fit the forward's register plans at 32 registers of each
tensor's values are held in registers, both tensors, with the forward's
chunk loaders and plan launcher (gpu_register_rows), so each is read once.
16-bit rows are held in their own dtype, as the forward holds them, and
widened a chunk at a time: a 16-byte chunk is 4 registers in any dtype.
Longer rows go on chip (gpu_backward_smem_rows, gpu_backward_stream_rows;
dispatch.mojo's `backward_kernel_for` picks; `BackwardRows` there launches
the register plans). Rows those cannot take (over
8 MB, or a GPU too small for a row's chunks): a block per row sums dy * y
(or dy), then re-reads the row (mostly from L2) to write the gradient, the
block strategy (`block_rows`, gpu_block_rows) over `BackwardBlockRow`.
Rows along another axis use a thread per column, as gpu_strided_rows does.
"""

from max.gpu import MAX_THREADS_PER_BLOCK_METADATA, block_idx, thread_idx
from max.gpu.host import DeviceContext
from std.memory import bitcast
from std.sys import inlined_assembly, size_of
from std.utils import StaticTuple

from .gpu_block_rows import ONE_LOOP, block_rows
from .gpu_launch import HeldRows, held, kernel_arg, vector_flag_of
from .gpu_reductions import block_sum
from .gpu_register_rows import (
    WARP_THREADS,
    block_threads,
    chunk_registers,
    load_row_chunks,
    register_rows,
    store_row_chunks,
)
from .gpu_strided_rows import STRIDED_THREADS, launch_strided
from .row_math import (
    accum_dtype,
    backward_out,
    backward_term,
    load_widened,
    vector_width,
)
from .row_op import BlockRowOp, RegisterRowOp
from .row_tensors import LaunchRows, RowTensors, tensors_of

# 32-bit registers of each tensor's row values a thread holds, as loaded:
# the two tensors share the forward's budget (MAX_ROW_REGISTERS).
comptime BACKWARD_ROW_REGISTERS = 32
# Registers of a 16-byte chunk held in its own dtype.
comptime RAW_CHUNK_REGISTERS = 4
# Backward rows too long for the register plans: a block per row.
comptime BACKWARD_BLOCK_THREADS = 512


def backward_plan_registers(V: Int) -> Int:
    """`register_plan`'s `max_registers` for the backward kernels:
    `BACKWARD_ROW_REGISTERS` registers of each tensor's chunks as held, in
    the widened count `register_plan` uses (`chunk_registers`). 32 for
    float32 and float64, whose chunks are held as they are counted; 64 for
    16-bit types, whose chunks are held raw (4 registers) but counted
    widened (8): 8 chunks a tensor, rows to 32K."""
    return BACKWARD_ROW_REGISTERS * chunk_registers(V) // RAW_CHUNK_REGISTERS


def backward_min_blocks_per_sm[dtype: DType, threads: Int, K: Int]() -> Int:
    """Blocks of the register kernel an SM must be able to hold (1: no
    demand, the compiler chooses).

    16-bit block rows of at most 4 chunks a tensor (32 registers of both
    raw rows) ask for 1024 resident threads, which caps them at 64
    registers: they fit without spilling (widened, they took 96-167), so
    an SM holds 2 rows of 512 threads or 8 of 128. 16-bit warp rows have no
    barrier between the sum and the output, so the compiler reuses the
    sum's widened values there: at 64 registers they spill, left alone
    they take 63-80 (6-8 blocks of 128 an SM). float32 and float64 rows
    run at copy speed with the compiler's choice.
    """
    if size_of[dtype]() == 2 and threads > WARP_THREADS and K <= 4:
        return 1024 // block_threads[threads]()
    return 1


@__llvm_metadata(
    MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](
        Int32(block_threads[threads]())
    )
)
def backward_register_kernel[
    dtype: DType, log_in: Bool, threads: Int, V: Int, K: Int
](
    dx: Pointer[Scalar[dtype], MutAnyOrigin],
    a: Pointer[Scalar[dtype], MutAnyOrigin],
    dy: Pointer[Scalar[dtype], MutAnyOrigin],
    rows: Int64,
    n: Int64,
    vector_flag: Int32,
):
    """Rows of `n <= threads * V * K`, both inputs held in registers, for
    plans without a residency demand (`backward_min_blocks_per_sm` is 1).

    Parameters and arguments as for `backward_rows_kernel`, plus K, the
    16-byte chunks of each tensor per thread.
    """
    var op = BackwardRegisterRow[dtype, log_in, threads, V, K](
        tensors_of(dx, a, dy), n
    )
    register_rows[pdl=False, aligned=False](op, rows, n, vector_flag)


@__llvm_metadata(
    MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](
        Int32(block_threads[threads]())
    ),
    `nvvm.minctasm`=SIMDLength(backward_min_blocks_per_sm[dtype, threads, K]()),
)
def backward_resident_register_kernel[
    dtype: DType, log_in: Bool, threads: Int, V: Int, K: Int
](
    dx: Pointer[Scalar[dtype], MutAnyOrigin],
    a: Pointer[Scalar[dtype], MutAnyOrigin],
    dy: Pointer[Scalar[dtype], MutAnyOrigin],
    rows: Int64,
    n: Int64,
    vector_flag: Int32,
):
    """`backward_register_kernel` for plans that ask for more resident
    blocks (`backward_min_blocks_per_sm` > 1). A kernel of its own: launch
    bounds change the compiled code even where they ask for nothing (a
    minimum of 1 block gave float32 other instructions).
    """
    var op = BackwardRegisterRow[dtype, log_in, threads, V, K](
        tensors_of(dx, a, dy), n
    )
    register_rows[pdl=False, aligned=False](op, rows, n, vector_flag)


struct BackwardRegisterRow[
    dtype: DType, log_in: Bool, T_: Int, V_: Int, K_: Int
](RegisterRowOp):
    """The backward (of log-softmax with `log_in`) as a `RegisterRowOp`: K
    chunks of V of each of `a` and `dy` a thread, held as loaded (float32,
    float64: summed and written as whole vectors) or raw (16-bit: half the
    registers widened values take, so an SM holds twice the rows, widened
    one chunk at a time in each pass); it folds the sum of dy * y (or of
    dy). Padding 0 adds 0 to either sum."""

    comptime threads = Self.T_

    var dx: HeldRows[Self.dtype]
    """Output gradient rows."""
    var a: HeldRows[Self.dtype]
    """Forward output rows (y or log p)."""
    var dy: HeldRows[Self.dtype]
    """Incoming gradient rows."""
    var n: Int
    """Row length."""
    var base: Int
    """Offset of this group's row."""
    var dx_row: HeldRows[Self.dtype]
    """This group's output row, for 16-bit rows (taken in `fold`, with the
    input rows, before the loads)."""
    var len: Int
    """Elements of the row read (0 past the last row)."""
    var av: SIMD[Self.dtype, Self.V_ * Self.K_]
    """The thread's chunks of `a`."""
    var gv: SIMD[Self.dtype, Self.V_ * Self.K_]
    """The thread's chunks of `dy`."""
    var total: Scalar[accum_dtype[Self.dtype]()]
    """The row's sum."""

    @always_inline
    def __init__(out self, tensors: RowTensors[Self.dtype], n: Int64):
        """The op on these tensors (dx from y or log p and dy), rows of
        `n`."""
        comptime assert accum_dtype[Self.dtype]().is_floating_point()
        comptime assert chunk_registers(Self.V_) * Self.K_ <= (
            backward_plan_registers(Self.V_)
        )
        self.dx = tensors.dst
        self.a = tensors.a
        self.dy = tensors.b
        self.n = Int(n)
        self.base = 0
        self.dx_row = self.dx
        self.len = 0
        self.av = SIMD[Self.dtype, Self.V_ * Self.K_](0)
        self.gv = SIMD[Self.dtype, Self.V_ * Self.K_](0)
        self.total = 0

    @always_inline
    def begin(mut self, row: Int, len: Int):
        """The row's offset."""
        self.base = row * self.n
        self.len = len

    @always_inline
    def fold(mut self, t: Int, vector_loads: Bool):
        """Load both tensors' chunks, then the row's sum."""
        comptime acc = accum_dtype[Self.dtype]()
        comptime T = Self.T_
        comptime V = Self.V_
        comptime K = Self.K_
        comptime block = block_threads[T]()
        comptime if Self.dtype == acc:
            self.av = load_row_chunks[Self.dtype, T, V, K, Self.dtype](
                kernel_arg(self.a).unsafe_offset(self.base),
                self.len,
                t,
                vector_loads,
                0,
            )
            self.gv = load_row_chunks[Self.dtype, T, V, K, Self.dtype](
                kernel_arg(self.dy).unsafe_offset(self.base),
                self.len,
                t,
                vector_loads,
                0,
            )
            self.total = block_sum[acc, T, block](
                backward_term[Self.log_in, acc, V * K](
                    self.av.cast[acc](), self.gv.cast[acc]()
                ).reduce_add()
            )
        else:
            self.dx_row = held(kernel_arg(self.dx).unsafe_offset(self.base))
            var a = kernel_arg(self.a).unsafe_offset(self.base)
            var dy = kernel_arg(self.dy).unsafe_offset(self.base)
            self.av = load_thread_chunks[Self.dtype, T, V, K](
                a, self.len, t, vector_loads
            )
            self.gv = load_thread_chunks[Self.dtype, T, V, K](
                dy, self.len, t, vector_loads
            )
            var s = Scalar[acc](0)
            comptime for k in range(K):
                s += backward_term[Self.log_in, acc, V](
                    self.av.slice[V, offset=k * V]().cast[acc](),
                    self.gv.slice[V, offset=k * V]().cast[acc](),
                ).reduce_add()
            self.total = block_sum[acc, T, block](s)

    @always_inline
    def write(self, t: Int, vector_loads: Bool):
        """The chunks' gradient, where they were read."""
        comptime acc = accum_dtype[Self.dtype]()
        comptime T = Self.T_
        comptime V = Self.V_
        comptime K = Self.K_
        comptime if Self.dtype == acc:
            store_row_chunks[Self.dtype, T, V, K, acc](
                kernel_arg(self.dx).unsafe_offset(self.base),
                backward_out[Self.log_in, acc, V * K](
                    self.av.cast[acc](), self.gv.cast[acc](), self.total
                ),
                self.len,
                t,
                vector_loads,
            )
        else:
            # Without the copies the output pass would reuse the sum's
            # widened chunks, keeping all of them (twice the raw registers)
            # alive across the reduction.
            var av = opaque_copy(self.av)
            var gv = opaque_copy(self.gv)
            var out = SIMD[Self.dtype, V * K](0)
            comptime for k in range(K):
                out = out.insert[offset=k * V](
                    backward_out[Self.log_in, acc, V](
                        av.slice[V, offset=k * V]().cast[acc](),
                        gv.slice[V, offset=k * V]().cast[acc](),
                        self.total,
                    ).cast[Self.dtype]()
                )
            store_thread_chunks[Self.dtype, T, V, K](
                kernel_arg(self.dx_row), out, self.len, t, vector_loads
            )


@always_inline
def load_thread_chunks[
    dtype: DType, threads: Int, V: Int, K: Int
](
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    len: Int,
    t: Int,
    vector_loads: Bool,
) -> SIMD[dtype, V * K]:
    """`load_row_chunks` of thread t in its own dtype, padded with 0, with
    t's offset moved into `x` and `len`: each element's bound check then
    compares one register with a constant, instead of holding a 64-bit
    index per element (up to 64 registers at 4 chunks)."""
    if vector_loads:
        return load_row_chunks[dtype, threads, V, K, dtype](
            x.unsafe_offset(t * V), len - t * V, 0, True, 0
        )
    return load_row_chunks[dtype, threads, V, K, dtype](
        x.unsafe_offset(t), len - t, 0, False, 0
    )


@always_inline
def store_thread_chunks[
    dtype: DType, threads: Int, V: Int, K: Int
](
    x: Pointer[Scalar[dtype], MutAnyOrigin],
    vals: SIMD[dtype, V * K],
    len: Int,
    t: Int,
    vector_loads: Bool,
):
    """Write thread t's K chunks back where `load_thread_chunks` got them."""
    if vector_loads:
        store_row_chunks[dtype, threads, V, K, dtype](
            x.unsafe_offset(t * V), vals, len - t * V, 0, True
        )
    else:
        store_row_chunks[dtype, threads, V, K, dtype](
            x.unsafe_offset(t), vals, len - t, 0, False
        )


@always_inline
def opaque_copy[dtype: DType, W: Int](v: SIMD[dtype, W]) -> SIMD[dtype, W]:
    """`v` through an empty register move the compiler cannot see through,
    so values computed from the copy are not merged with the same values
    computed from `v`. For 16-bit vectors (two elements a register)."""
    comptime assert W % 2 == 0
    var words = bitcast[DType.uint32, W // 2](v)
    comptime for i in range(W // 2):
        words[i] = inlined_assembly[
            "mov.b32 $0, $1;",
            UInt32,
            constraints="=r,r",
            has_side_effect=True,
        ](words[i])
    return bitcast[dtype, W](words)


@__llvm_metadata(
    MAX_THREADS_PER_BLOCK_METADATA=StaticTuple[Int32, 1](Int32(threads))
)
def backward_rows_kernel[
    dtype: DType, log_in: Bool, threads: Int, V: Int
](
    dx: Pointer[Scalar[dtype], MutAnyOrigin],
    a: Pointer[Scalar[dtype], MutAnyOrigin],
    dy: Pointer[Scalar[dtype], MutAnyOrigin],
    n: Int64,
    vector_flag: Int32,
):
    """A block of `threads` threads per contiguous row of length `n`, one
    block per row.

    Parameters:
        dtype: Element type.
        log_in: `a` holds log-softmax output (log_softmax_backward).
        threads: Threads per block.
        V: Elements per 16-byte vector of `dtype`.

    Args:
        dx: Output gradient rows.
        a: Forward output rows (y or log p).
        dy: Incoming gradient rows.
        n: Row length.
        vector_flag: Nonzero when rows are 16-byte aligned (n % V == 0).
    """
    var op = BackwardBlockRow[dtype, log_in, threads, V](tensors_of(dx, a, dy))
    block_rows[walk=ONE_LOOP](op, n, vector_flag)


struct BackwardBlockRow[dtype: DType, log_in: Bool, T_: Int, V_: Int](
    BlockRowOp
):
    """The backward (of log-softmax with `log_in`) as a `BlockRowOp`: it
    folds the sum of dy * y (or of dy) over the row, then writes dx from a
    second read of both tensors."""

    comptime threads = Self.T_
    comptime width = Self.V_
    comptime acc = accum_dtype[Self.dtype]()

    var dx: HeldRows[Self.dtype]
    """Output gradient rows."""
    var a: HeldRows[Self.dtype]
    """Forward output rows (y or log p)."""
    var dy: HeldRows[Self.dtype]
    """Incoming gradient rows."""
    var base: Int
    """Offset of the block's row."""
    var s: Scalar[Self.acc]
    """The thread's part of the row's sum, then (`combine`) the row's."""

    @always_inline
    def __init__(out self, tensors: RowTensors[Self.dtype]):
        """The op on these tensors (dx from y or log p and dy)."""
        comptime assert Self.acc.is_floating_point()
        self.dx = tensors.dst
        self.a = tensors.a
        self.dy = tensors.b
        self.base = 0
        self.s = 0

    @always_inline
    def begin(mut self, row: Int, len: Int) -> Int:
        """The row's offset; every element is folded."""
        self.base = row * len
        return len

    @always_inline
    def fold_vector(mut self, e: Int):
        """Add the vector's dy * y (or dy)."""
        self.s += backward_term[Self.log_in, Self.acc, Self.V_](
            load_widened[Self.V_](kernel_arg(self.a), self.base + e),
            load_widened[Self.V_](kernel_arg(self.dy), self.base + e),
        ).reduce_add()

    @always_inline
    def fold_element(mut self, e: Int):
        """Add the element's dy * y (or dy)."""
        self.s += backward_term[Self.log_in, Self.acc, 1](
            kernel_arg(self.a)[unsafe_offset=self.base + e].cast[Self.acc](),
            kernel_arg(self.dy)[unsafe_offset=self.base + e].cast[Self.acc](),
        )

    @always_inline
    def combine(mut self):
        """The row's sum."""
        self.s = block_sum[Self.acc, Self.T_, Self.T_](self.s)

    @always_inline
    def write_vector(self, e: Int):
        """The vector's gradient."""
        var g = backward_out[Self.log_in, Self.acc, Self.V_](
            load_widened[Self.V_](kernel_arg(self.a), self.base + e),
            load_widened[Self.V_](kernel_arg(self.dy), self.base + e),
            self.s,
        )
        kernel_arg(self.dx).unsafe_offset(self.base + e).unsafe_store[
            alignment=16
        ](g.cast[Self.dtype]())

    @always_inline
    def write_element(self, e: Int):
        """The element's gradient."""
        kernel_arg(self.dx)[unsafe_offset=self.base + e] = backward_out[
            Self.log_in, Self.acc, 1
        ](
            kernel_arg(self.a)[unsafe_offset=self.base + e].cast[Self.acc](),
            kernel_arg(self.dy)[unsafe_offset=self.base + e].cast[Self.acc](),
            self.s,
        ).cast[
            Self.dtype
        ]()


def backward_strided_kernel[
    dtype: DType, log_in: Bool
](
    dx: Pointer[Scalar[dtype], MutAnyOrigin],
    a: Pointer[Scalar[dtype], MutAnyOrigin],
    dy: Pointer[Scalar[dtype], MutAnyOrigin],
    outer: Int64,
    n: Int64,
    inner: Int64,
):
    """One thread per column (o, i) of the (outer, n, inner) view."""
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    var col = Int(block_idx.x) * STRIDED_THREADS + Int(thread_idx.x)
    var stride = Int(inner)
    if col >= Int(outer) * stride:
        return
    var len = Int(n)
    var base = (col // stride) * len * stride + col % stride
    var s = Scalar[acc](0)
    for j in range(len):
        var at = base + j * stride
        s += backward_term[log_in, acc, 1](
            a[unsafe_offset=at].cast[acc](), dy[unsafe_offset=at].cast[acc]()
        )
    for j in range(len):
        var at = base + j * stride
        dx[unsafe_offset=at] = backward_out[log_in, acc, 1](
            a[unsafe_offset=at].cast[acc](), dy[unsafe_offset=at].cast[acc](), s
        ).cast[dtype]()


comptime backward_register_kernel_for[
    dtype: DType, log_in: Bool, T: Int, K: Int
] = backward_register_kernel[
    dtype, log_in, T, vector_width[dtype](), K
] if backward_min_blocks_per_sm[
    dtype, T, K
]() == 1 else backward_resident_register_kernel[
    dtype, log_in, T, vector_width[dtype](), K
]
"""The register kernel for T threads a row, K chunks of each tensor a
thread: `backward_resident_register_kernel` where the plan asks for
resident blocks, else `backward_register_kernel` (`BackwardRows` in
dispatch.mojo enqueues it)."""


def launch_backward_block[
    dtype: DType, log_in: Bool
](ctx: DeviceContext, r: LaunchRows[dtype]) raises:
    """Launch `backward_rows_kernel` on `r`'s rows (dx from a and dy), a
    block per row: any row length."""
    comptime V = vector_width[dtype]()
    comptime kernel = backward_rows_kernel[
        dtype, log_in, BACKWARD_BLOCK_THREADS, V
    ]
    ctx.enqueue_function[kernel](
        r.dst(),
        r.a(),
        r.b(),
        Int64(r.n),
        vector_flag_of(r.aligned, r.n, V),
        grid_dim=r.rows,
        block_dim=BACKWARD_BLOCK_THREADS,
    )


def launch_backward_strided[
    dtype: DType, log_in: Bool
](
    ctx: DeviceContext, t: RowTensors[dtype], outer: Int, n: Int, inner: Int
) raises:
    """`backward_strided_kernel` on the (outer, n, inner) view of `t` (dx
    from y or log p and dy)."""
    launch_strided[backward_strided_kernel[dtype, log_in]](
        ctx,
        outer * inner,
        kernel_arg(t.dst),
        kernel_arg(t.a),
        kernel_arg(t.b),
        Int64(outer),
        Int64(n),
        Int64(inner),
    )
