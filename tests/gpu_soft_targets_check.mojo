# Compiles every soft-target cross-entropy GPU kernel for sm_90 on a
# machine without a GPU:
#   mojo build -I . --target-accelerator sm_90 tests/gpu_soft_targets_check.mojo
# Running the binary needs a GPU; building it is the check.
from max.gpu.host import DeviceBuffer, DeviceContext

from gpu_check_common import CHECK_DTYPES
from op.gpu_launch import HeldRows
from op.op_call import DeviceOptions, RowsView
from op.soft_cross_entropy_ops import SoftCrossEntropyCall


def held_of[dtype: DType](buf: DeviceBuffer[dtype]) -> HeldRows[dtype]:
    """The buffer's device address, as an op call holds it."""
    return rebind[HeldRows[dtype]](buf.unsafe_ptr())


def launch_all[dtype: DType](ctx: DeviceContext) raises:
    var x = ctx.enqueue_create_buffer[dtype](1 << 20)
    var pr = ctx.enqueue_create_buffer[dtype](1 << 20)
    var g = ctx.enqueue_create_buffer[dtype](1 << 20)
    var l = ctx.enqueue_create_buffer[dtype](1024)
    var o = ctx.enqueue_create_buffer[DType.float64](300_002)
    comptime for with_grad in [False, True]:
        comptime for reduction in ["mean", "sum", "none"]:
            # (options, rows, n). On chip: 512 threads (n = 1000) and 1024
            # (n = 20001), with class weights (2 + n options); past it, a
            # block a row.
            comptime for shape in [
                (2, 16, 1000),
                (20003, 16, 20001),
                (2, 3, 300_000),
            ]:
                var call = SoftCrossEntropyCall[dtype, with_grad, reduction](
                    held_of(x),
                    held_of(pr),
                    RowsView(shape[1], shape[2], 1),
                    DeviceOptions(held_of(o), shape[0]),
                    held_of(l),
                    held_of(g),
                )
                call.run["gpu"](ctx)


def main() raises:
    var ctx = DeviceContext()
    comptime for dtype in CHECK_DTYPES:
        launch_all[dtype](ctx)
    ctx.synchronize()
