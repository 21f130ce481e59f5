# Compiles the sharded (vocab-parallel) GPU kernels for sm_90 on a machine
# without a GPU:
#   mojo build -I . --target-accelerator sm_90 tests/gpu_sharded_check.mojo
# Running the binary needs a GPU; building it is the check.
from max.gpu.host import DeviceContext

from op.gpu_sharded_rows import launch_epilogue, launch_row_stats
from op.row_math import accum_dtype


def launch_all[dtype: DType](ctx: DeviceContext) raises:
    comptime acc = accum_dtype[dtype]()
    var x = ctx.enqueue_create_buffer[dtype](1 << 20)
    var y = ctx.enqueue_create_buffer[dtype](1 << 20)
    var st = ctx.enqueue_create_buffer[acc](4096)
    var t = ctx.enqueue_create_buffer[DType.int64](1024)
    var o = ctx.enqueue_create_buffer[DType.float64](4)
    var logits = rebind[Pointer[Scalar[dtype], MutAnyOrigin]](x.unsafe_ptr())
    var out = rebind[Pointer[Scalar[dtype], MutAnyOrigin]](y.unsafe_ptr())
    var stats = rebind[Pointer[Scalar[acc], MutAnyOrigin]](st.unsafe_ptr())
    var targets = rebind[Pointer[Int64, MutAnyOrigin]](t.unsafe_ptr())
    var options = rebind[Pointer[Float64, MutAnyOrigin]](o.unsafe_ptr())
    comptime for with_target in [False, True]:
        launch_row_stats[dtype, with_target](
            ctx, stats, logits, targets, options, 16, 50257
        )
    comptime for kind in ["softmax", "log_softmax", "cross_entropy"]:
        launch_epilogue[dtype, kind](
            ctx, out, logits, stats, targets, options, 16, 50257
        )


def main() raises:
    var ctx = DeviceContext()
    launch_all[DType.float32](ctx)
    launch_all[DType.float16](ctx)
    launch_all[DType.bfloat16](ctx)
    launch_all[DType.float64](ctx)
    ctx.synchronize()
