"""Row softmax probes (CPU only) that differ only in how the input is
declared: `_FusedInputTensor` (MAX may fuse elementwise producers into it)
or `InputTensor` (MAX materialises the producers first).

`probe_softmax_fused_io` also declares its output `_FusedOutputTensor` and
writes it by `_fused_store`, so MAX may fuse elementwise consumers into it.

A `_FusedInputTensor` never carries a usable pointer: MAX's generated code
passes `Pointer.unsafe_dangling()` and binds a load functor
(`_bind_to_fused_input`) whether or not producers were fused, so the kernel
must read it only by `_fused_load` (or `_lambda_load`).
"""

import extensibility
from extensibility import InputTensor, OutputTensor, foreach
from extensibility import _FusedInputTensor as FusedInputTensor
from extensibility import _FusedOutputTensor as FusedOutputTensor
from max.algorithm import sync_parallelize
from max.gpu.host import DeviceContext
from layout import Coord
from std.math import exp
from std.utils import IndexList

comptime W = 8
"""SIMD width of the probes' loads (float32: one AVX2 register)."""


@extensibility.register("probe_softmax_fused")
struct ProbeSoftmaxFused:
    """Row softmax whose input MAX may fuse producers into."""

    @staticmethod
    def execute[
        target: StaticString, dtype: DType
    ](
        output: OutputTensor[dtype=dtype, rank=2, static_spec=_],
        input: FusedInputTensor[dtype=dtype, rank=2, ...],
        ctx: DeviceContext,
    ) capturing raises:
        """Softmax along axis 1, reading the input by `_fused_load`."""
        comptime assert dtype.is_floating_point(), "probe: floats only"
        var rows = input.dim_size(0)
        var n = input.dim_size(1)
        var dst = output.unsafe_ptr()

        def row(r: Int) raises {imm}:
            var m = SIMD[dtype, W](Scalar[dtype].MIN)
            var c = 0
            while c + W <= n:
                m = max(m, input._fused_load[W, 2](IndexList[2](r, c)))
                c += W
            var mx = m.reduce_max()
            while c < n:
                mx = max(mx, input._fused_load[1, 2](IndexList[2](r, c))[0])
                c += 1
            var s = SIMD[dtype, W](0)
            c = 0
            while c + W <= n:
                s += exp(input._fused_load[W, 2](IndexList[2](r, c)) - mx)
                c += W
            var total = s.reduce_add()
            while c < n:
                total += exp(
                    input._fused_load[1, 2](IndexList[2](r, c))[0] - mx
                )
                c += 1
            var inv = 1 / total
            c = 0
            while c + W <= n:
                var e = exp(input._fused_load[W, 2](IndexList[2](r, c)) - mx)
                dst.unsafe_offset(r * n + c).unsafe_store(e * inv)
                c += W
            while c < n:
                var e1 = exp(
                    input._fused_load[1, 2](IndexList[2](r, c))[0] - mx
                )
                dst[unsafe_offset=r * n + c] = e1 * inv
                c += 1

        sync_parallelize(row, rows)


@extensibility.register("probe_softmax_fused_io")
struct ProbeSoftmaxFusedIO:
    """Row softmax with a fusable input and a fusable output."""

    @staticmethod
    def execute[
        target: StaticString, dtype: DType
    ](
        output: FusedOutputTensor[dtype=dtype, rank=2, ...],
        input: FusedInputTensor[dtype=dtype, rank=2, ...],
        ctx: DeviceContext,
    ) capturing raises:
        """Softmax along axis 1: `_fused_load` in, `_fused_store` out."""
        comptime assert dtype.is_floating_point(), "probe: floats only"
        var rows = input.dim_size(0)
        var n = input.dim_size(1)

        def row(r: Int) raises {imm}:
            var m = SIMD[dtype, W](Scalar[dtype].MIN)
            var c = 0
            while c + W <= n:
                m = max(m, input._fused_load[W, 2](IndexList[2](r, c)))
                c += W
            var mx = m.reduce_max()
            while c < n:
                mx = max(mx, input._fused_load[1, 2](IndexList[2](r, c))[0])
                c += 1
            var s = SIMD[dtype, W](0)
            c = 0
            while c + W <= n:
                s += exp(input._fused_load[W, 2](IndexList[2](r, c)) - mx)
                c += W
            var total = s.reduce_add()
            while c < n:
                total += exp(
                    input._fused_load[1, 2](IndexList[2](r, c))[0] - mx
                )
                c += 1
            var inv = 1 / total
            c = 0
            while c + W <= n:
                var e = exp(input._fused_load[W, 2](IndexList[2](r, c)) - mx)
                output._fused_store[W, 2](IndexList[2](r, c), e * inv)
                c += W
            while c < n:
                var e1 = exp(
                    input._fused_load[1, 2](IndexList[2](r, c))[0] - mx
                )
                output._fused_store[1, 2](
                    IndexList[2](r, c), SIMD[dtype, 1](e1 * inv)
                )
                c += 1

        sync_parallelize(row, rows)


@extensibility.register("probe_softmax_plain")
struct ProbeSoftmaxPlain:
    """The same row softmax on an ordinary (materialised) input."""

    @staticmethod
    def execute[
        target: StaticString, dtype: DType
    ](
        output: OutputTensor[dtype=dtype, rank=2, static_spec=_],
        input: InputTensor[dtype=dtype, rank=2, static_spec=_],
        ctx: DeviceContext,
    ) raises:
        """Softmax along axis 1, reading the input by `load`."""
        comptime assert dtype.is_floating_point(), "probe: floats only"
        var rows = input.dim_size(0)
        var n = input.dim_size(1)
        var dst = output.unsafe_ptr()

        def row(r: Int) raises {imm}:
            var m = SIMD[dtype, W](Scalar[dtype].MIN)
            var c = 0
            while c + W <= n:
                m = max(m, input.load[W, 2](IndexList[2](r, c)))
                c += W
            var mx = m.reduce_max()
            while c < n:
                mx = max(mx, input.load[1, 2](IndexList[2](r, c))[0])
                c += 1
            var s = SIMD[dtype, W](0)
            c = 0
            while c + W <= n:
                s += exp(input.load[W, 2](IndexList[2](r, c)) - mx)
                c += W
            var total = s.reduce_add()
            while c < n:
                total += exp(input.load[1, 2](IndexList[2](r, c))[0] - mx)
                c += 1
            var inv = 1 / total
            c = 0
            while c + W <= n:
                var e = exp(input.load[W, 2](IndexList[2](r, c)) - mx)
                dst.unsafe_offset(r * n + c).unsafe_store(e * inv)
                c += W
            while c < n:
                var e1 = exp(input.load[1, 2](IndexList[2](r, c))[0] - mx)
                dst[unsafe_offset=r * n + c] = e1 * inv
                c += 1

        sync_parallelize(row, rows)


@extensibility.register("probe_copy_fused")
struct ProbeCopyFused:
    """Copies its fusable input through MAX's `foreach` (CPU or GPU): the
    smallest op that shows fusion on either device."""

    @staticmethod
    def execute[
        target: StaticString, dtype: DType, rank: Int
    ](
        output: OutputTensor[dtype=dtype, rank=rank, static_spec=_],
        input: FusedInputTensor[dtype=dtype, rank=rank, ...],
        ctx: DeviceContext,
    ) capturing raises:
        """Copy: output = input, read by `_fused_load`."""

        @always_inline
        def func[width: Int](idx: Coord) {var input} -> SIMD[dtype, width]:
            return input._fused_load[width](idx)

        foreach[target=target](func, output, ctx)


@extensibility.register("probe_prologue_flag")
struct ProbePrologueFlag:
    """Writes the `has_prologue_fusion` parameter MAX passes to an op that
    declares it (as its own `mo.reduce.softmax` does): 1.0 when producers
    were fused into the input, 0.0 when not (or when MAX passed nothing: the
    generated Mojo under --ir-dir shows which)."""

    @staticmethod
    def execute[
        target: StaticString,
        dtype: DType,
        has_prologue_fusion: Bool = False,
    ](
        flag: OutputTensor[dtype=DType.float32, rank=1, static_spec=_],
        input: FusedInputTensor[dtype=dtype, rank=2, ...],
        ctx: DeviceContext,
    ) capturing raises:
        """Write the flag."""
        flag.unsafe_ptr()[unsafe_offset=0] = 1.0 if has_prologue_fusion else 0.0
