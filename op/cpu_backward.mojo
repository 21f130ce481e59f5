"""Vectorized, multithreaded CPU kernels of the backward ops.

Same layout and tasking as cpu_rows.mojo (`run_rows`): contiguous rows are
split into tasks of whole rows with two SIMD sweeps (row sum; gradient);
other axes are processed W columns at a time along the contiguous inner
dimension.
"""

from std.sys import simd_width_of

from .cpu_sweeps import (
    RowBlocks,
    RowPieces,
    RowTerms,
    blocked_sum,
    column_sum,
    each_piece,
    run_rows,
)
from .gpu_launch import HeldRows
from .row_math import accum_dtype, backward_out, backward_term
from .row_tensors import RowTensors


def softmax_backward_cpu[
    dtype: DType, log_in: Bool
](t: RowTensors[dtype], outer: Int, n: Int, inner: Int) raises:
    """Gradient of softmax (a = y) or log-softmax (a = log p) for every row.

    Parameters:
        dtype: Element type of all three tensors.
        log_in: `a` is log-softmax output (log_softmax_backward).

    Args:
        t: The gradient (`dst`; `outer * n * inner` elements, row-major)
            from the forward op's output (`a`) and the incoming gradient
            (`b`).
        outer: Product of the dims before the axis.
        n: Length of the axis.
        inner: Product of the dims after it.
    """
    comptime acc = accum_dtype[dtype]()
    comptime assert acc.is_floating_point()
    run_rows[simd_width_of[acc]()](
        BackwardRows[dtype, log_in](t), outer, n, inner
    )


@fieldwise_init
struct BackwardPlaces[dtype: DType, log_in: Bool, contiguous: Bool](
    RowPieces, RowTerms
):
    """The backward at the places of a row: place j is element base + j
    (`contiguous`) or base + j * stride (down columns). Its terms are
    `backward_term`; `put` writes dx given the row's sum `s`."""

    comptime acc = accum_dtype[Self.dtype]()

    var t: RowTensors[Self.dtype]
    """The gradient (`dst`) from the forward op's output (`a`) and dy
    (`b`)."""
    var base: Int
    """Place 0's element."""
    var stride: Int
    """Elements from one place to the next (not `contiguous`)."""
    var s: Scalar[Self.acc]
    """The row's sum of `backward_term` (`put`; the lanes' own sums down
    columns are passed to `put_lanes`)."""

    @always_inline
    def at(self, j: Int) -> Int:
        """Place j's element."""
        comptime if Self.contiguous:
            return self.base + j
        else:
            return self.base + j * self.stride

    @staticmethod
    @always_inline
    def load[w: Int](x: HeldRows[Self.dtype], at: Int) -> SIMD[Self.acc, w]:
        """The w elements of `x` at `at`, widened."""
        return x.unsafe_offset(at).unsafe_load[width=w]().cast[Self.acc]()

    @always_inline
    def term[w: Int](self, j: Int) -> SIMD[Self.acc, w]:
        """`backward_term` of the w elements at place j."""
        var at = self.at(j)
        return backward_term[Self.log_in, Self.acc, w](
            self.load[w](self.t.a, at), self.load[w](self.t.b, at)
        )

    @always_inline
    def put_lanes[w: Int](self, j: Int, s: SIMD[Self.acc, w]):
        """Write dx of the w elements at place j given their sums `s`."""
        var at = self.at(j)
        var g = backward_out[Self.log_in, Self.acc, w](
            self.load[w](self.t.a, at), self.load[w](self.t.b, at), s
        )
        self.t.dst.unsafe_offset(at).unsafe_store(g.cast[Self.dtype]())

    @always_inline
    def put[w: Int](self, j: Int):
        """Write dx of the w elements at place j."""
        self.put_lanes[w](j, SIMD[Self.acc, w](self.s))


@fieldwise_init
struct BackwardRows[dtype: DType, log_in: Bool](RowBlocks):
    """The backward of whole rows: two sweeps, the row's sum of
    `backward_term` and the gradient."""

    var t: RowTensors[Self.dtype]
    """The gradient (`dst`) from the forward op's output (`a`) and dy
    (`b`)."""

    def rows(self, begin: Int, end: Int, n: Int) raises:
        """Contiguous rows begin ... end - 1, SIMD across each row."""
        comptime W = simd_width_of[accum_dtype[Self.dtype]()]()
        for r in range(begin, end):
            var places = BackwardPlaces[Self.dtype, Self.log_in, True](
                self.t, r * n, 1, 0
            )
            places.s = blocked_sum[W](places, n)
            each_piece[W](places, n)

    @always_inline
    def columns[w: Int](self, base: Int, n: Int, stride: Int):
        """`w` adjacent columns of stride `stride` at once."""
        var places = BackwardPlaces[Self.dtype, Self.log_in, False](
            self.t, base, stride, 0
        )
        var s = column_sum[w](places, n)
        for j in range(n):
            places.put_lanes[w](j, s)
