"""Cross-entropy rows too long for one SM: the on-chip cross-entropy
(gpu_ce_smem_rows' `ce_smem_kernel`) with a thread-block cluster of two
blocks a row, each holding half of it on chip.

`ce_kernel_for` (gpu_cross_entropy) gives it as many rows as the smem
kernel takes (at least SPLIT_BELOW_ROWS), to `pair_capacity(V)` (~148K
fp32, ~296K 16-bit classes).
"""

from .gpu_ce_smem_rows import launch_ce_parts


# `launch_ce_parts` with a cluster of two blocks a row (to
# `pair_capacity(V)`).
comptime launch_ce_pair[
    dtype: DType, with_grad: Bool, mean: Bool, reduce: Bool
] = launch_ce_parts[dtype, with_grad, mean, reduce, 2]
