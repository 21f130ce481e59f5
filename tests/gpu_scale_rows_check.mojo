# Compiles the scale_rows GPU kernel (the op op/scale_ops.mojo registers, and
# the launch extension's scale_rows) for sm_90 on a machine without a GPU:
#   mojo build -I . --target-accelerator sm_90 tests/gpu_scale_rows_check.mojo
# Running the binary needs a GPU; building it is the check.
from max.gpu.host import DeviceContext

from op.gpu_scale_rows import launch_scale_rows
from op.scale_ops import ScaleRows


def launch_all[dtype: DType](ctx: DeviceContext) raises:
    var x = ctx.enqueue_create_buffer[dtype](1 << 20)
    var f = ctx.enqueue_create_buffer[dtype](1024)
    var data = rebind[Pointer[Scalar[dtype], MutAnyOrigin]](x.unsafe_ptr())
    var factor = rebind[Pointer[Scalar[dtype], MutAnyOrigin]](f.unsafe_ptr())
    launch_scale_rows[dtype](ctx, data, factor, 1024, 1000, True)
    launch_scale_rows[dtype](ctx, data, factor, 16, 50257, False)


def main() raises:
    var ctx = DeviceContext()
    launch_all[DType.float32](ctx)
    launch_all[DType.float16](ctx)
    launch_all[DType.bfloat16](ctx)
    launch_all[DType.float64](ctx)
    ctx.synchronize()
