"""Cross-entropy rows too long for one SM: the on-chip cross-entropy
(gpu_ce_smem_rows' `ce_smem_kernel`) with a thread-block cluster of two
blocks a row, each holding half of it on chip.

`ce_kernel_for` (gpu_cross_entropy) gives it as many rows as the smem
kernel takes (at least SPLIT_BELOW_ROWS), to `pair_capacity(V)` (~148K
fp32, ~296K 16-bit classes).
"""

from max.gpu.host import DeviceContext

from .gpu_ce_smem_rows import launch_ce_parts
from .row_math import accum_dtype


def launch_ce_pair[
    dtype: DType, with_grad: Bool, mean: Bool, reduce: Bool
](
    ctx: DeviceContext,
    dlogits: Pointer[Scalar[dtype], MutAnyOrigin],
    logits: Pointer[Scalar[dtype], MutAnyOrigin],
    targets: Pointer[Int64, MutAnyOrigin],
    options: Pointer[Float64, MutAnyOrigin],
    count: Pointer[Float64, MutAnyOrigin],
    row_losses: Pointer[Scalar[accum_dtype[dtype]()], MutAnyOrigin],
    loss: Pointer[Scalar[dtype], MutAnyOrigin],
    rows: Int,
    n: Int,
    aligned: Bool,
) raises:
    """`launch_ce_parts` with a cluster of two blocks a row. Raises past
    `pair_capacity(V)`."""
    launch_ce_parts[dtype, with_grad, mean, reduce, 2](
        ctx,
        dlogits,
        logits,
        targets,
        options,
        count,
        row_losses,
        loss,
        rows,
        n,
        aligned,
    )
