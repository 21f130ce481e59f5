# Compiles every masked-softmax GPU kernel for sm_90 on a machine without a
# GPU:
#   mojo build -I . --target-accelerator sm_90 tests/gpu_masked_check.mojo
# Running the binary needs a GPU; building it is the check
# (tests/test_masked_softmax.py::test_gpu_kernels_compile).
from max.gpu.host import DeviceContext

from op.gpu_masked_rows import launch_masked_rows
from op.masked_flags import (
    CAUSAL_FLAG,
    FLAG_COMBINATIONS,
    MASK_FLAG,
    masked_flags,
)


def launch_all[dtype: DType](ctx: DeviceContext) raises:
    var xb = ctx.enqueue_create_buffer[dtype](1 << 20)
    var yb = ctx.enqueue_create_buffer[dtype](1 << 20)
    var mb = ctx.enqueue_create_buffer[dtype](1 << 20)
    var ob = ctx.enqueue_create_buffer[DType.float64](2)
    var x = rebind[Pointer[Scalar[dtype], MutAnyOrigin]](xb.unsafe_ptr())
    var y = rebind[Pointer[Scalar[dtype], MutAnyOrigin]](yb.unsafe_ptr())
    var m = rebind[Pointer[Scalar[dtype], MutAnyOrigin]](mb.unsafe_ptr())
    var o = rebind[Pointer[Float64, MutAnyOrigin]](ob.unsafe_ptr())
    comptime for log_out in [False, True]:
        # The flags as the registered op reads them, at run time from the
        # options' length (masked_softmax_ops.masked_rows): each picks its
        # compile-time-specialised launcher.
        for flags in range(FLAG_COMBINATIONS):
            comptime for f in range(FLAG_COMBINATIONS):
                if masked_flags(1 + flags) == f:
                    comptime has_mask = (f & MASK_FLAG) != 0
                    comptime causal = (f & CAUSAL_FLAG) != 0
                    comptime launch = launch_masked_rows[
                        dtype, log_out, has_mask, causal
                    ]
                    # Every register plan (n = 1000 picks one; the launcher
                    # compiles all), and the block-per-row kernel (n = 50257).
                    launch(ctx, y, x, m, o, 16, 1000, 16, 4)
                    launch(ctx, y, x, m, o, 16, 50257, 1, 16)
                    # Each strategy forced (variant=): the same kernels.
                    comptime for variant in ["register", "block"]:
                        comptime forced = launch_masked_rows[
                            dtype, log_out, has_mask, causal, variant
                        ]
                        forced(ctx, y, x, m, o, 16, 1000, 16, 4)


def main() raises:
    var ctx = DeviceContext()
    launch_all[DType.float32](ctx)
    launch_all[DType.float16](ctx)
    launch_all[DType.bfloat16](ctx)
    launch_all[DType.float64](ctx)
    ctx.synchronize()
