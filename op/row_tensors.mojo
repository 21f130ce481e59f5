"""What every GPU launcher of contiguous rows is given: the op's tensors
(an output, one or two inputs) and its rows.

The forward reads one input and the backward two (y or log p, and dy);
both pass three tensors, a one-input op its input twice, so that one
struct carries either op's rows from its table to a strategy's launcher.
"""

from .gpu_launch import HeldRows, held, kernel_arg


@fieldwise_init
struct RowTensors[dtype: DType](ImplicitlyCopyable):
    """An op's tensors, as its launchers and kernels pass them on."""

    var dst: HeldRows[Self.dtype]
    """Output rows (the backward's dx)."""
    var a: HeldRows[Self.dtype]
    """Input rows (the forward's x; the backward's y or log p)."""
    var b: HeldRows[Self.dtype]
    """The second input's rows (the backward's dy); `a` again for
    one-input ops."""


def tensors_of[
    dtype: DType
](
    dst: Pointer[Scalar[dtype], MutAnyOrigin],
    a: Pointer[Scalar[dtype], MutAnyOrigin],
    b: Pointer[Scalar[dtype], MutAnyOrigin],
) -> RowTensors[dtype]:
    """`dst` from `a` and `b` (a one-input op passes `a` twice), held."""
    return RowTensors(held(dst), held(a), held(b))


@fieldwise_init
struct LaunchRows[dtype: DType](ImplicitlyCopyable):
    """`rows` contiguous rows of `n` of an op's tensors, and whether every
    buffer starts 16-byte aligned: a launcher's arguments."""

    var tensors: RowTensors[Self.dtype]
    """The output and the inputs."""
    var rows: Int
    """Number of rows."""
    var n: Int
    """Row length."""
    var aligned: Bool
    """Whether the buffers start 16-byte aligned."""

    def __init__(
        out self,
        dst: Pointer[Scalar[Self.dtype], MutAnyOrigin],
        a: Pointer[Scalar[Self.dtype], MutAnyOrigin],
        b: Pointer[Scalar[Self.dtype], MutAnyOrigin],
        rows: Int,
        n: Int,
        aligned: Bool,
    ):
        """Rows of `dst` from `a` and `b` (a one-input op passes `a`
        twice)."""
        self = Self(tensors_of(dst, a, b), rows, n, aligned)

    def dst(self) -> Pointer[Scalar[Self.dtype], MutAnyOrigin]:
        """The output, as the kernels take it."""
        return kernel_arg(self.tensors.dst)

    def a(self) -> Pointer[Scalar[Self.dtype], MutAnyOrigin]:
        """The (first) input, as the kernels take it."""
        return kernel_arg(self.tensors.a)

    def b(self) -> Pointer[Scalar[Self.dtype], MutAnyOrigin]:
        """The second input (`a` for one-input ops), as the kernels take
        it."""
        return kernel_arg(self.tensors.b)
