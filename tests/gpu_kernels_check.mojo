# Compiles every GPU kernel for sm_90 on a machine without a GPU:
#   mojo build -I . --target-accelerator sm_90 tests/gpu_kernels_check.mojo
# Running the binary needs a GPU; building it is the check (test_gpu_build.py).
from max.gpu.host import DeviceContext

from gpu_check_common import CHECK_DTYPES, ptr
from op.dispatch import launch_variant, softmax_backward_rows, softmax_rows
from op.gpu_scale_rows import launch_scale_rows
from op.row_tensors import tensors_of


def launch_all[dtype: DType](ctx: DeviceContext) raises:
    var x = ctx.enqueue_create_buffer[dtype](1 << 20)
    var y = ctx.enqueue_create_buffer[dtype](1 << 20)
    var src = ptr(x)
    var dst = ptr(y)
    var tensors = tensors_of(dst, src, src)
    # Room for the backward's largest shape below (300 x 80001).
    var big_x = ctx.enqueue_create_buffer[dtype](300 * 80001)
    var big_y = ctx.enqueue_create_buffer[dtype](300 * 80001)
    var big_src = ptr(big_x)
    var big_dst = ptr(big_y)
    var big_tensors = tensors_of(big_dst, big_src, big_src)
    comptime for log_out in [False, True]:
        comptime for variant in [
            "auto",
            "warp",
            "block",
            "smem",
            "split",
            "split_stream",
        ]:
            comptime live = launch_variant[dtype, log_out, variant]
            softmax_rows["gpu", dtype, log_out, live](ctx, tensors, 4, 1000, 1)
        comptime auto = launch_variant[dtype, log_out, "auto"]
        softmax_rows["gpu", dtype, log_out, auto](ctx, tensors, 4, 100, 7)
        # Backward, a shape for each family of backward_kernel_for
        # (dispatch.mojo): registers, on chip a block a row (16-bit),
        # a cluster of four blocks a row (fp32 40001, fp64 20001), of two
        # (16-bit 80001), split stream (unaligned n too), and the
        # block-per-row fallback.
        comptime for shape in [
            (4, 1000),
            (4, 100),
            (300, 50257),
            (300, 40001),
            (300, 80001),
            (300, 20001),
            (8, 300000),
            (2, 1 << 20),
            (1, 3 << 20),
        ]:
            softmax_backward_rows["gpu", dtype, log_out](
                ctx, big_tensors, shape[0], shape[1], 1
            )
        # Each backward strategy forced (variant=): the same kernels.
        comptime for variant in [
            "register",
            "smem",
            "cluster2",
            "cluster4",
            "split_stream",
            "block",
        ]:
            softmax_backward_rows["gpu", dtype, log_out, variant](
                ctx, big_tensors, 300, 1000, 1
            )
    # scale_rows (the op op/scale_ops.mojo registers; the launch extension's
    # cross-entropy backward): one factor, one a row.
    launch_scale_rows[dtype](ctx, dst, src, 4, 1000, False)
    launch_scale_rows[dtype](ctx, dst, src, 4, 1000, True)


def main() raises:
    var ctx = DeviceContext()
    comptime for dtype in CHECK_DTYPES:
        launch_all[dtype](ctx)
    ctx.synchronize()
