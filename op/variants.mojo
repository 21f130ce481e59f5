"""The launcher `variant=` names: "auto" (the table) or a forced live family.

Benchmarks and tests run each family on shapes the table would not give it.
The variant is a compile-time parameter, so a forced variant compiles its
own family only. The baselines ("tree", "online", "split_smem") are ops of
their own in baselines/registered_ops.mojo: nothing here imports them.
"""

from max.gpu.host import DeviceContext

from .dispatch import launch_auto
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
    """Launch the family `variant` names on `rows` contiguous rows of `n`
    ("auto": the one the table picks). Raises for a name that is none of
    "auto", "warp", "block", "smem", "split", "split_stream", and where the
    family cannot take rows of `n`."""
    comptime if variant == "auto":
        launch_auto[dtype, log_out](ctx, dst, src, rows, n, aligned)
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
    elif variant == "split":
        launch_split_rows[dtype, log_out](ctx, dst, src, rows, n, aligned)
    elif variant == "split_stream":
        launch_split_stream[dtype, log_out](ctx, dst, src, rows, n, aligned)
    else:
        raise Error("max_softmax: unknown variant '" + String(variant) + "'")
