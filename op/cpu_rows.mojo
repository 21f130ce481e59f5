"""Vectorized, multithreaded CPU softmax over a `(outer, n, inner)` view.

Contiguous rows (`inner == 1`) are split into tasks of whole rows; each row
takes three SIMD sweeps (max; exp and sum; scale). Fewer long rows than
cores are cut into chunks that run in parallel instead, their (max, sum)
pairs folded per row between two parallel phases. Rows along another axis
(`inner > 1`) are processed `W` columns at a time, so the SIMD lanes run
along the contiguous inner dimension and every load is still a vector load.
"""

from std.math import ceildiv
from std.sys import simd_width_of, size_of
from std.sys.info import num_logical_cores
from std.utils.numerics import inf

from .cpu_sweeps import (
    RowBlocks,
    RowPieces,
    RowTerms,
    blocked_sum,
    column_sum,
    each_piece,
    run_rows,
)
from .cpu_tasks import run_tasks
from .gpu_launch import HeldRows, held, kernel_arg

from .row_math import (
    accum_dtype,
    epilogue,
    exp_nan,
    fold_pair,
    online_sum_guard,
    row_exp,
    row_scale,
    sum_shift,
)
from .row_tensors import RowTensors

# Elements of a row a task takes when few long rows are split across cores
# (256 KB of float32: the task's sweeps stay in L2).
comptime ROW_CHUNK = 1 << 16


def softmax_cpu[
    dtype: DType, log_out: Bool
](t: RowTensors[dtype], outer: Int, n: Int, inner: Int) raises:
    """Softmax (or log-softmax) of every row of the input into the output.

    Parameters:
        dtype: Element type of both tensors.
        log_out: Write log-softmax instead of softmax.

    Args:
        t: The output (`dst`; `outer * n * inner` elements, row-major) and
            the input (`a`), the same shape.
        outer: Product of the dims before the softmax axis.
        n: Length of the softmax axis.
        inner: Product of the dims after it.
    """
    var op = SoftmaxRows[dtype, log_out](t.dst, t.a)
    # Fewer long rows than cores: a task per row would leave cores idle.
    # With a row a core or more, whole rows are faster: at 4 x 1M float32 on
    # 2 cores, 1.9-3.0 ms against 3.3-4.0 ms for 64 chunks in two parallel
    # phases (benchmarks/RESULTS.md).
    if inner == 1 and n >= 2 * ROW_CHUNK and outer < num_logical_cores():
        op.split_rows(outer, n)
    else:
        run_rows[simd_width_of[accum_dtype[dtype]()]()](op, outer, n, inner)


@fieldwise_init
struct SoftmaxRows[dtype: DType, log_out: Bool](RowBlocks):
    """Softmax (or log-softmax) of rows: whole contiguous rows, long ones
    cut into chunks, or down columns."""

    comptime acc = accum_dtype[Self.dtype]()
    # Softmax parks the exps and rescales them in the last sweep instead of
    # computing exp twice: 32/64-bit types in dst; 16-bit types in a float32
    # scratch row per task (parking them in dst would round twice). The
    # 16-bit outputs need exps good to ~1e-6, not float32's 1e-7: exp_lean.
    comptime park_in_dst = not Self.log_out and size_of[Self.dtype]() >= 4
    comptime park_in_scratch = not Self.log_out and size_of[Self.dtype]() < 4
    comptime lean = Self.park_in_scratch

    var dst: HeldRows[Self.dtype]
    """The output."""
    var src: HeldRows[Self.dtype]
    """The input."""

    def rows(self, begin: Int, end: Int, n: Int) raises:
        """Rows begin ... end - 1, each in three sweeps (max; exp and sum;
        write)."""
        comptime assert Self.acc.is_floating_point()
        var scratch_row = List[Scalar[Self.acc]](
            capacity=n if Self.park_in_scratch else 0
        )
        var scratch = held(
            rebind[Pointer[Scalar[Self.acc], MutAnyOrigin]](
                scratch_row.unsafe_ptr()
            )
        )
        for r in range(begin, end):
            var x = self.src.unsafe_offset(r * n)
            var row = ExpTerms[
                Self.dtype, Self.park_in_dst, Self.park_in_scratch, Self.lean
            ](
                self.dst.unsafe_offset(r * n),
                scratch,
                x,
                _max_of[Self.dtype](kernel_arg(x), n),
            )
            row.write[Self.log_out](
                n, row_scale[Self.log_out, Self.acc](row.sum(n))
            )
        _ = scratch_row^

    @always_inline
    def columns[w: Int](self, base: Int, n: Int, stride: Int):
        """Softmax down `w` adjacent columns of stride `stride` at once."""
        comptime acc = Self.acc
        comptime assert acc.is_floating_point()
        var m = SIMD[acc, w](-inf[acc]())
        for j in range(n):
            m = max(
                m,
                self.src.unsafe_offset(base + j * stride)
                .unsafe_load[width=w]()
                .cast[acc](),
            )
        var s = column_sum[w](
            ColumnExps[Self.dtype, w](self.src, base, stride, m), n
        )
        var scale = row_scale[Self.log_out, acc, w](s)
        for j in range(n):
            var at = base + j * stride
            var v = (
                self.src.unsafe_offset(at).unsafe_load[width=w]().cast[acc]()
            )
            self.dst.unsafe_offset(at).unsafe_store(
                epilogue[Self.log_out, acc, w](v, m, scale).cast[Self.dtype]()
            )

    def split_rows(self, rows: Int, n: Int) raises:
        """Rows cut into chunks of `ROW_CHUNK` that run in parallel: each chunk's
        pair (max, sum of exp(x - max)), then each row's pairs folded, then each
        chunk written."""
        comptime acc = Self.acc
        comptime assert acc.is_floating_point()
        var dst = self.dst
        var src = self.src
        var chunks = ceildiv(n, ROW_CHUNK)
        var tasks = rows * chunks
        # 32/64-bit softmax parks exp(x - chunk max) in dst and rescales it by
        # exp(chunk max - row max) / sum; 16-bit types compute exp again, lean.
        comptime park_in_dst = not Self.log_out and size_of[Self.dtype]() >= 4
        comptime lean = not Self.log_out and size_of[Self.dtype]() < 4
        var pairs_list = List[Scalar[acc]](length=2 * tasks, fill=0)
        var pairs = pairs_list.unsafe_ptr()
        var row_pairs_list = List[Scalar[acc]](length=2 * rows, fill=0)
        var row_pairs = row_pairs_list.unsafe_ptr()
        # Nothing parks in a scratch row here: the sweeps get an empty one.
        var empty = List[Scalar[acc]]()
        var no_scratch = held(
            rebind[Pointer[Scalar[acc], MutAnyOrigin]](empty.unsafe_ptr())
        )

        def chunk_pair(t: Int) raises {imm}:
            var c = t % chunks
            var begin = (t // chunks) * n + c * ROW_CHUNK
            var count = min(ROW_CHUNK, n - c * ROW_CHUNK)
            var m = _max_of[Self.dtype](
                kernel_arg(src.unsafe_offset(begin)), count
            )
            var s = ExpTerms[Self.dtype, park_in_dst, False, lean](
                dst.unsafe_offset(begin),
                no_scratch,
                src.unsafe_offset(begin),
                sum_shift[acc](m),
            ).sum(count)
            pairs[unsafe_offset=2 * t] = m
            pairs[unsafe_offset=2 * t + 1] = s

        run_tasks(chunk_pair, tasks)

        # Each row's max and scale, folded once from its chunks' pairs.
        for r in range(rows):
            var row_max = -inf[acc]()
            var row_sum = Scalar[acc](0)
            for k in range(r * chunks, (r + 1) * chunks):
                (row_max, row_sum) = fold_pair[acc](
                    row_max,
                    row_sum,
                    pairs[unsafe_offset=2 * k],
                    pairs[unsafe_offset=2 * k + 1],
                )
            row_pairs[unsafe_offset=2 * r] = row_max
            row_pairs[unsafe_offset=2 * r + 1] = row_scale[Self.log_out, acc](
                online_sum_guard[acc](row_max, row_sum)
            )

        def write_chunk(t: Int) raises {imm}:
            var r = t // chunks
            var c = t % chunks
            var begin = r * n + c * ROW_CHUNK
            var count = min(ROW_CHUNK, n - c * ROW_CHUNK)
            var row_max = row_pairs[unsafe_offset=2 * r]
            var scale = row_pairs[unsafe_offset=2 * r + 1]
            comptime if park_in_dst:
                # Parked exps are exp(x - sum_shift(chunk max)). A chunk whose
                # max is -inf parked zeros, which exp(-inf - row max) = 0 keeps;
                # one whose max is +inf (or a row of NaN) makes the scale NaN
                # anyway.
                scale = (
                    exp_nan[acc, 1](pairs[unsafe_offset=2 * t] - row_max)
                    * scale
                )
            ExpTerms[Self.dtype, park_in_dst, False, lean](
                dst.unsafe_offset(begin),
                no_scratch,
                src.unsafe_offset(begin),
                row_max,
            ).write[Self.log_out](count, scale)

        run_tasks(write_chunk, tasks)
        _ = pairs_list^
        _ = row_pairs_list^
        _ = empty^


@always_inline
def _max_of[
    dtype: DType
](x: Pointer[Scalar[dtype], MutAnyOrigin], count: Int) -> Scalar[
    accum_dtype[dtype]()
]:
    """The largest of x[0:count], NaN left out (-inf if there is none)."""
    comptime acc = accum_dtype[dtype]()
    comptime W = simd_width_of[acc]()
    var n_vec = count - count % W
    # A select, not `max`: one vmaxps instead of two instructions that keep
    # NaN out. NaN is left out either way (v > m is false); a NaN in the row
    # makes its sum, and so the row, NaN. Four running maxima, so the sweep
    # is not one chain of dependent maxes.
    var mv = SIMD[acc, 4 * W](-inf[acc]())
    var j4 = n_vec - n_vec % (4 * W)
    for j in range(0, j4, 4 * W):
        var v = x.unsafe_offset(j).unsafe_load[width=4 * W]().cast[acc]()
        mv = v.gt(mv).select(v, mv)
    for j in range(j4, n_vec, W):
        var v = x.unsafe_offset(j).unsafe_load[width=W]().cast[acc]()
        var low = mv.slice[W]()
        mv = mv.insert(v.gt(low).select(v, low))
    var m = mv.reduce_max()
    for j in range(n_vec, count):
        var v = x[unsafe_offset=j].cast[acc]()
        m = v.gt(m).select(v, m)
    return m


@fieldwise_init
struct ExpTerms[
    dtype: DType, park_in_dst: Bool, park_in_scratch: Bool, lean: Bool
](ImplicitlyCopyable, RowTerms):
    """exp(x - m) of a row, each exp parked in y or scratch (`lean`: by
    `exp_lean` in the vector body, for 16-bit softmax)."""

    comptime acc = accum_dtype[Self.dtype]()

    var y: HeldRows[Self.dtype]
    """Where the exps park (`park_in_dst`)."""
    var scratch: HeldRows[Self.acc]
    """Where the exps park (`park_in_scratch`)."""
    var x: HeldRows[Self.dtype]
    """The row."""
    var m: Scalar[Self.acc]
    """What is subtracted before the exp."""

    @always_inline
    def value[w: Int](self, j: Int) -> SIMD[Self.acc, w]:
        """The w values at j where they are kept: parked in y or scratch,
        else x's."""
        comptime if Self.park_in_dst:
            return (
                self.y.unsafe_offset(j).unsafe_load[width=w]().cast[Self.acc]()
            )
        elif Self.park_in_scratch:
            return self.scratch.unsafe_offset(j).unsafe_load[width=w]()
        else:
            return (
                self.x.unsafe_offset(j).unsafe_load[width=w]().cast[Self.acc]()
            )

    @always_inline
    def sum(self, count: Int) -> Scalar[Self.acc]:
        """The sum of exp(x - m) over x[0:count], each exp parked."""
        return blocked_sum[simd_width_of[Self.acc]()](self, count)

    @always_inline
    def write[log_out: Bool](self, count: Int, scale: Scalar[Self.acc]):
        """Write y[0:count] from the row's values (`SoftmaxWrite`)."""
        each_piece[simd_width_of[Self.acc]()](
            SoftmaxWrite[
                Self.dtype,
                log_out,
                Self.park_in_dst,
                Self.park_in_scratch,
                Self.lean,
            ](self, scale),
            count,
        )

    @always_inline
    def term[w: Int](self, j: Int) -> SIMD[Self.acc, w]:
        """exp(x - m) at j, parked."""
        var d = (
            self.x.unsafe_offset(j).unsafe_load[width=w]().cast[Self.acc]()
            - self.m
        )
        var e: SIMD[Self.acc, w]
        comptime if w == 1:
            e = exp_nan[Self.acc, w](d)
        else:
            e = row_exp[Self.acc, w, Self.lean](d)
        comptime if Self.park_in_dst:
            self.y.unsafe_offset(j).unsafe_store(e.cast[Self.dtype]())
        elif Self.park_in_scratch:
            self.scratch.unsafe_offset(j).unsafe_store(e)
        return e


@fieldwise_init
struct SoftmaxWrite[
    dtype: DType,
    log_out: Bool,
    park_in_dst: Bool,
    park_in_scratch: Bool,
    lean: Bool,
](RowPieces):
    """Writes a row of y from the values at each place: those parked in y
    (`park_in_dst`) or in the scratch row (`park_in_scratch`), else x's.
    Parked softmax values are exps, written times `scale`; otherwise the
    epilogue (`lean`: softmax's exp by `exp_lean` in the vector body). A
    log-softmax with its values in the scratch row (cpu_masked_rows) writes
    (value - m) - scale."""

    comptime acc = accum_dtype[Self.dtype]()

    var row: ExpTerms[
        Self.dtype, Self.park_in_dst, Self.park_in_scratch, Self.lean
    ]
    """The row, where its exps are parked, and its max."""
    var scale: Scalar[Self.acc]
    """The row's `row_scale` (times any rescaling of parked exps)."""

    @always_inline
    def put[w: Int](self, j: Int):
        """Write y at j."""
        comptime parked = Self.park_in_dst or Self.park_in_scratch
        var v = self.row.value[w](j)
        var out: SIMD[Self.acc, w]
        comptime if parked and not Self.log_out:
            out = v * self.scale
        elif Self.lean and not Self.log_out and w > 1:
            out = row_exp[Self.acc, w, Self.lean](v - self.row.m) * self.scale
        else:
            out = epilogue[Self.log_out, Self.acc, w](v, self.row.m, self.scale)
        self.row.y.unsafe_offset(j).unsafe_store(out.cast[Self.dtype]())


@fieldwise_init
struct ColumnExps[dtype: DType, w: Int](RowTerms):
    """exp(x - m) down w columns of stride `stride` from `base`."""

    comptime acc = accum_dtype[Self.dtype]()

    var src: HeldRows[Self.dtype]
    """The input."""
    var base: Int
    """The columns' first element."""
    var stride: Int
    """Elements from one row to the next."""
    var m: SIMD[Self.acc, Self.w]
    """The columns' maxima."""

    @always_inline
    def term[v: Int](self, j: Int) -> SIMD[Self.acc, v]:
        """exp(x - m) of row j's w columns."""
        var x = (
            self.src.unsafe_offset(self.base + j * self.stride)
            .unsafe_load[width=v]()
            .cast[Self.acc]()
        )
        return exp_nan[Self.acc, v](x - rebind[SIMD[Self.acc, v]](self.m))
