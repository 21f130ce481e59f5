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
(or dy), then re-reads the row (mostly from L2) to write the gradient.
Rows along another axis use a thread per column, as gpu_strided_rows does.
"""

from max.gpu import MAX_THREADS_PER_BLOCK_METADATA, block_idx, thread_idx
from max.gpu.host import DeviceContext
from std.math import ceildiv
from std.memory import bitcast
from std.sys import inlined_assembly, size_of
from std.utils import StaticTuple

from .gpu_launch import vector_flag_of
from .gpu_reductions import block_sum
from .gpu_register_rows import (
    WARP_THREADS,
    block_threads,
    chunk_registers,
    load_row_chunks,
    store_row_chunks,
)
from .row_math import (
    accum_dtype,
    backward_out,
    backward_term,
    load_widened,
    vector_width,
)

comptime BACKWARD_STRIDED_THREADS = 256
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
    backward_register_rows[dtype, log_in, threads, V, K](
        dx, a, dy, rows, n, vector_flag
    )


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
    backward_register_rows[dtype, log_in, threads, V, K](
        dx, a, dy, rows, n, vector_flag
    )


@always_inline
def backward_register_rows[
    dtype: DType, log_in: Bool, threads: Int, V: Int, K: Int
](
    dx: Pointer[Scalar[dtype], MutAnyOrigin],
    a: Pointer[Scalar[dtype], MutAnyOrigin],
    dy: Pointer[Scalar[dtype], MutAnyOrigin],
    rows: Int64,
    n: Int64,
    vector_flag: Int32,
):
    """The body of both register kernels: this thread's row and its chunks
    of it, held as loaded (float32, float64) or raw
    (`backward_raw_row_chunks`, 16-bit)."""
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    comptime assert chunk_registers(V) * K <= backward_plan_registers(V)
    comptime block = block_threads[threads]()
    var vector_loads = vector_flag != 0
    var t = Int(thread_idx.x) % threads
    var row = (
        Int(block_idx.x) * (block // threads) + Int(thread_idx.x) // threads
    )
    var len = Int(n)
    if row >= Int(rows):
        comptime if threads == 32:
            return
        len = 0  # stay for the block's barriers; touch nothing
        row = 0
    var base = row * Int(n)
    comptime if dtype == acc:
        # float32, float64: held as loaded, summed and written as whole
        # vectors. Padding 0 adds 0 to either row sum (dy * y, or dy).
        var av = load_row_chunks[dtype, threads, V, K, acc](
            a.unsafe_offset(base), len, t, vector_loads, 0
        )
        var gv = load_row_chunks[dtype, threads, V, K, acc](
            dy.unsafe_offset(base), len, t, vector_loads, 0
        )
        var total = block_sum[acc, threads, block](
            backward_term[log_in, acc, V * K](av, gv).reduce_add()
        )
        store_row_chunks[dtype, threads, V, K, acc](
            dx.unsafe_offset(base),
            backward_out[log_in, acc, V * K](av, gv, total),
            len,
            t,
            vector_loads,
        )
    else:
        backward_raw_row_chunks[dtype, log_in, threads, V, K](
            dx.unsafe_offset(base),
            a.unsafe_offset(base),
            dy.unsafe_offset(base),
            len,
            t,
            vector_loads,
        )


@always_inline
def backward_raw_row_chunks[
    dtype: DType, log_in: Bool, threads: Int, V: Int, K: Int
](
    dx: Pointer[Scalar[dtype], MutAnyOrigin],
    a: Pointer[Scalar[dtype], MutAnyOrigin],
    dy: Pointer[Scalar[dtype], MutAnyOrigin],
    len: Int,
    t: Int,
    vector_loads: Bool,
):
    """Thread t's K chunks of a 16-bit row of `len`, held in their own
    dtype (half the registers widened values take, so an SM holds twice
    the rows) and widened one chunk at a time in each pass."""
    comptime acc = accum_dtype[dtype]()
    comptime block = block_threads[threads]()
    # Padding 0 adds 0 to either row sum (dy * y, or dy).
    var av = load_thread_chunks[dtype, threads, V, K](a, len, t, vector_loads)
    var gv = load_thread_chunks[dtype, threads, V, K](dy, len, t, vector_loads)
    var s = Scalar[acc](0)
    comptime for k in range(K):
        s += backward_term[log_in, acc, V](
            av.slice[V, offset=k * V]().cast[acc](),
            gv.slice[V, offset=k * V]().cast[acc](),
        ).reduce_add()
    var total = block_sum[acc, threads, block](s)
    # Without the copies the output pass would reuse the sum's widened
    # chunks, keeping all of them (twice the raw registers) alive across
    # the reduction.
    av = opaque_copy(av)
    gv = opaque_copy(gv)
    var out = SIMD[dtype, V * K](0)
    comptime for k in range(K):
        out = out.insert[offset=k * V](
            backward_out[log_in, acc, V](
                av.slice[V, offset=k * V]().cast[acc](),
                gv.slice[V, offset=k * V]().cast[acc](),
                total,
            ).cast[dtype]()
        )
    store_thread_chunks[dtype, threads, V, K](dx, out, len, t, vector_loads)


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
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    var t = Int(thread_idx.x)
    var len = Int(n)
    var base = Int(block_idx.x) * len
    var step = threads * V if vector_flag != 0 else threads
    var first = t * V if vector_flag != 0 else t

    var s = Scalar[acc](0)
    for e in range(first, len, step):
        if vector_flag != 0:
            s += backward_term[log_in, acc, V](
                load_widened[V](a, base + e),
                load_widened[V](dy, base + e),
            ).reduce_add()
        else:
            s += backward_term[log_in, acc, 1](
                a[unsafe_offset=base + e].cast[acc](),
                dy[unsafe_offset=base + e].cast[acc](),
            )
    var total = block_sum[acc, threads, threads](s)

    for e in range(first, len, step):
        if vector_flag != 0:
            var g = backward_out[log_in, acc, V](
                load_widened[V](a, base + e),
                load_widened[V](dy, base + e),
                total,
            )
            dx.unsafe_offset(base + e).unsafe_store[alignment=16](
                g.cast[dtype]()
            )
        else:
            dx[unsafe_offset=base + e] = backward_out[log_in, acc, 1](
                a[unsafe_offset=base + e].cast[acc](),
                dy[unsafe_offset=base + e].cast[acc](),
                total,
            ).cast[dtype]()


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
    var col = Int(block_idx.x) * BACKWARD_STRIDED_THREADS + Int(thread_idx.x)
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
](
    ctx: DeviceContext,
    dx: Pointer[Scalar[dtype], MutAnyOrigin],
    a: Pointer[Scalar[dtype], MutAnyOrigin],
    dy: Pointer[Scalar[dtype], MutAnyOrigin],
    rows: Int,
    n: Int,
    aligned: Bool,
) raises:
    """Launch `backward_rows_kernel`, a block per row: any row length."""
    comptime V = vector_width[dtype]()
    comptime kernel = backward_rows_kernel[
        dtype, log_in, BACKWARD_BLOCK_THREADS, V
    ]
    ctx.enqueue_function[kernel](
        dx,
        a,
        dy,
        Int64(n),
        vector_flag_of(aligned, n, V),
        grid_dim=rows,
        block_dim=BACKWARD_BLOCK_THREADS,
    )


def launch_backward_strided[
    dtype: DType, log_in: Bool
](
    ctx: DeviceContext,
    dx: Pointer[Scalar[dtype], MutAnyOrigin],
    a: Pointer[Scalar[dtype], MutAnyOrigin],
    dy: Pointer[Scalar[dtype], MutAnyOrigin],
    outer: Int,
    n: Int,
    inner: Int,
) raises:
    """Launch `backward_strided_kernel`: a thread per column of the
    (outer, n, inner) view."""
    comptime kernel = backward_strided_kernel[dtype, log_in]
    ctx.enqueue_function[kernel](
        dx,
        a,
        dy,
        Int64(outer),
        Int64(n),
        Int64(inner),
        grid_dim=ceildiv(outer * inner, BACKWARD_STRIDED_THREADS),
        block_dim=BACKWARD_STRIDED_THREADS,
    )
