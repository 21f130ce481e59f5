# Compiles every soft-target cross-entropy GPU kernel for sm_90 on a
# machine without a GPU:
#   mojo build -I . --target-accelerator sm_90 tests/gpu_soft_targets_check.mojo
# Running the binary needs a GPU; building it is the check.
from max.gpu.host import DeviceContext

from gpu_check_common import CHECK_DTYPES, ptr
from op.gpu_soft_cross_entropy import launch_soft_cross_entropy


def launch_all[dtype: DType](ctx: DeviceContext) raises:
    var x = ctx.enqueue_create_buffer[dtype](1 << 20)
    var pr = ctx.enqueue_create_buffer[dtype](1 << 20)
    var g = ctx.enqueue_create_buffer[dtype](1 << 20)
    var l = ctx.enqueue_create_buffer[dtype](1024)
    var o = ctx.enqueue_create_buffer[DType.float64](300_002)
    var logits = ptr(x)
    var probs = ptr(pr)
    var dlogits = ptr(g)
    var loss = ptr(l)
    var options = ptr(o)
    comptime for with_grad in [False, True]:
        comptime for reduction in ["mean", "sum", "none"]:
            comptime launch = launch_soft_cross_entropy[
                dtype, with_grad, reduction
            ]
            # On chip: 512 threads (n = 1000) and 1024 (n = 20001), with
            # class weights (2 + n options); past it, a block a row.
            launch(ctx, loss, dlogits, logits, probs, options, 2, 16, 1000)
            launch(ctx, loss, dlogits, logits, probs, options, 20003, 16, 20001)
            launch(ctx, loss, dlogits, logits, probs, options, 2, 3, 300_000)


def main() raises:
    var ctx = DeviceContext()
    comptime for dtype in CHECK_DTYPES:
        launch_all[dtype](ctx)
    ctx.synchronize()
