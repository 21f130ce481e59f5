"""The float64 sum of a launch's row losses that the one-block reduce
kernels (soft targets' `soft_reduce_kernel`, cross-entropy's
`ce_reduce_kernel`) write their loss from."""

from .gpu_reductions import block_sum


@always_inline
def block_loss_sum[
    acc: DType, T: Int
](
    t: Int, row_losses: Pointer[Scalar[acc], MutAnyOrigin], rows: Int64
) -> Float64:
    """The sum of `rows` row losses over one block of T threads (this one
    `t`), in float64 whatever their type and always in the same order of
    additions; every thread gets it."""
    var s = Float64(0)
    for r in range(t, Int(rows), T):
        s += row_losses[unsafe_offset=r].cast[DType.float64]()
    return block_sum[DType.float64, T](s)
