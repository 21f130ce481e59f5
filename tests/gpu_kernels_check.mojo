# Compiles every GPU kernel for sm_90 on a machine without a GPU:
#   mojo build -I . --target-accelerator sm_90 tests/gpu_kernels_check.mojo
# Running the binary needs a GPU; building it is the check (test_gpu_build.py).
from max.gpu.host import DeviceContext

from op.baselines.registered_ops import launch_baseline
from op.dispatch import softmax_backward_rows, softmax_rows
from op.variants import launch_variant


def launch_all[dtype: DType](ctx: DeviceContext) raises:
    var x = ctx.enqueue_create_buffer[dtype](1 << 20)
    var y = ctx.enqueue_create_buffer[dtype](1 << 20)
    var src = rebind[Pointer[Scalar[dtype], MutAnyOrigin]](x.unsafe_ptr())
    var dst = rebind[Pointer[Scalar[dtype], MutAnyOrigin]](y.unsafe_ptr())
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
            softmax_rows["gpu", dtype, log_out, live](ctx, dst, src, 4, 1000, 1)
        comptime for variant in ["tree", "online", "split_smem"]:
            comptime baseline = launch_baseline[dtype, log_out, variant]
            softmax_rows["gpu", dtype, log_out, baseline](
                ctx, dst, src, 4, 1000, 1
            )
        comptime auto = launch_variant[dtype, log_out, "auto"]
        softmax_rows["gpu", dtype, log_out, auto](ctx, dst, src, 4, 100, 7)
        softmax_backward_rows["gpu", dtype, log_out](
            ctx, dst, src, src, 4, 1000, 1
        )
        softmax_backward_rows["gpu", dtype, log_out](
            ctx, dst, src, src, 4, 100, 7
        )


def main() raises:
    var ctx = DeviceContext()
    launch_all[DType.float32](ctx)
    launch_all[DType.float16](ctx)
    launch_all[DType.bfloat16](ctx)
    launch_all[DType.float64](ctx)
    ctx.synchronize()
