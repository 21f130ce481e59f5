"""Forced kernel families: `variant=` other than "auto".

Benchmarks and tests run each family on shapes the table would not give it.
The variant is a compile-time parameter, so a forced variant compiles its
own family only. This is the only live file that imports op/baselines.
"""

from max.gpu.host import DeviceContext

from .baselines.gpu_online_rows import launch_online_rows
from .baselines.gpu_split_smem_rows import launch_split_smem_rows
from .baselines.gpu_tree_rows import launch_tree_rows
from .gpu_register_rows import launch_register_rows
from .gpu_smem_rows import launch_smem_rows
from .gpu_split_rows import launch_split_rows
from .gpu_split_stream_rows import launch_split_stream


def launch_variant[
    dtype: DType, log_out: Bool, variant: StaticString
](
    ctx: DeviceContext,
    dst: Pointer[Scalar[dtype], MutAnyOrigin],
    src: Pointer[Scalar[dtype], MutAnyOrigin],
    rows: Int,
    n: Int,
    aligned: Bool,
) raises:
    """Launch the family `variant` names on `rows` contiguous rows of `n`,
    whatever the table would pick. Raises for a name that is none of
    "tree", "warp", "block", "smem", "online", "split", "split_smem",
    "split_stream", and where the family cannot take rows of `n`."""
    comptime if variant == "tree":
        launch_tree_rows[dtype, log_out](ctx, dst, src, rows, n)
    elif variant == "warp":
        launch_register_rows[dtype, log_out, False](
            ctx, dst, src, rows, n, aligned
        )
    elif variant == "block":
        launch_register_rows[dtype, log_out, True](
            ctx, dst, src, rows, n, aligned
        )
    elif variant == "smem":
        launch_smem_rows[dtype, log_out](ctx, dst, src, rows, n, aligned)
    elif variant == "online":
        launch_online_rows[dtype, log_out](ctx, dst, src, rows, n, aligned)
    elif variant == "split":
        launch_split_rows[dtype, log_out](ctx, dst, src, rows, n, aligned)
    elif variant == "split_smem":
        launch_split_smem_rows[dtype, log_out](ctx, dst, src, rows, n, aligned)
    elif variant == "split_stream":
        launch_split_stream[dtype, log_out](ctx, dst, src, rows, n, aligned)
    else:
        raise Error("max_softmax: unknown variant '" + String(variant) + "'")
