# Compiles every cross-entropy GPU kernel, the sharded (vocab-parallel) row
# kernels included, for sm_90 on a machine without a GPU:
#   mojo build -I . --target-accelerator sm_90 tests/gpu_cross_entropy_check.mojo
# Running the binary needs a GPU; building it is the check
# (tests/test_cross_entropy.py::test_gpu_kernels_compile).
from max.gpu.host import DeviceContext

from gpu_check_common import CHECK_DTYPES, ptr
from op.gpu_cross_entropy import launch_cross_entropy
from op.gpu_sharded_rows import launch_epilogue, launch_row_stats
from op.row_math import accum_dtype


def launch_all[dtype: DType](ctx: DeviceContext) raises:
    var x = ctx.enqueue_create_buffer[dtype](1 << 20)
    var g = ctx.enqueue_create_buffer[dtype](1 << 20)
    var l = ctx.enqueue_create_buffer[dtype](1024)
    var t = ctx.enqueue_create_buffer[DType.int64](1024)
    var o = ctx.enqueue_create_buffer[DType.float64](1008)
    var logits = ptr(x)
    var dlogits = ptr(g)
    var loss = ptr(l)
    var targets = ptr(t)
    var options = ptr(o)
    comptime for with_grad in [False, True]:
        comptime for reduction in ["mean", "sum", "none"]:
            # A register plan (n = 1000), the block-per-row kernel (16 rows
            # of 50257, past the register plans), the smem kernel (300 rows
            # of 20001; the launcher compiles both of its block sizes) and
            # the pair kernel (300 rows of 100003, clusters of two blocks).
            comptime launch = launch_cross_entropy[dtype, with_grad, reduction]
            launch(ctx, loss, dlogits, logits, targets, options, 16, 1000)
            launch(ctx, loss, dlogits, logits, targets, options, 16, 50257)
            launch(ctx, loss, dlogits, logits, targets, options, 300, 20001)
            launch(ctx, loss, dlogits, logits, targets, options, 300, 100003)
            # The extended options (z-loss, softcap; with hints; class
            # weights: 8 + n).
            launch(ctx, loss, dlogits, logits, targets, options, 16, 1000, 4)
            launch(ctx, loss, dlogits, logits, targets, options, 300, 1000, 7)
            launch(ctx, loss, dlogits, logits, targets, options, 16, 1000, 1008)
            # Each strategy forced (variant=): the same kernels.
            comptime for variant in ["register", "smem", "pair", "block"]:
                comptime forced = launch_cross_entropy[
                    dtype, with_grad, reduction, variant
                ]
                forced(ctx, loss, dlogits, logits, targets, options, 16, 1000)
    # The sharded (vocab-parallel) rows: (rows, 4) statistics of a slice,
    # without and with the target logit, and each epilogue.
    var st = ctx.enqueue_create_buffer[accum_dtype[dtype]()](4096)
    var stats = ptr(st)
    comptime for with_target in [False, True]:
        launch_row_stats[dtype, with_target](
            ctx, stats, logits, targets, options, 16, 50257
        )
    comptime for kind in ["softmax", "log_softmax", "cross_entropy"]:
        launch_epilogue[dtype, kind](
            ctx, dlogits, logits, stats, targets, options, 16, 50257
        )


def main() raises:
    var ctx = DeviceContext()
    comptime for dtype in CHECK_DTYPES:
        launch_all[dtype](ctx)
    ctx.synchronize()
