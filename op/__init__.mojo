# max-softmax: the Mojo package MAX loads with `custom_extensions=[".../op"]`.
#
# Layout (one job per file):
#   registered_ops.mojo     the @extensibility.register structs MAX calls:
#                           softmax, log_softmax, *_backward, and the *_into
#                           twins that write into a given buffer (torch bridge)
#   dispatch.mojo           the one table choosing a kernel family from (rows,
#                           n, dtype), and the routing to its launcher
#   variants.mojo           the launcher `variant=` names: "auto" (the table)
#                           or a forced live family, for benchmarks and tests
#   row_math.mojo           numerics shared by every kernel (accumulator type,
#                           guarded exp-differences, the softmax/log-softmax epilogue)
#
# GPU kernel families, each with its launcher (`launch_*`: grid, workspace,
# capacity check) beside its kernel:
#   gpu_register_rows.mojo  short and medium rows held in registers (a warp
#                           per row, or a block per row); the register plans
#                           and the one plan launcher, forward and backward
#   gpu_smem_rows.mojo      long rows (to ~74K fp32): a block per row, on chip in
#                           registers + shared memory, read once
#   gpu_split_stream_rows.mojo few or long rows (to 8 MB): each row split into
#                           chunks (56 KB fp32, 24 KB 16-bit) that resident
#                           blocks stream through two shared-memory buffers,
#                           read once; the loop and launcher serve the
#                           backward too (`StreamedChunks`)
#   gpu_split_rows.mojo     rows over 8 MB: each row split across many blocks
#                           in one launch, re-read from L2
#   gpu_strided_rows.mojo   softmax over an axis that is not the last one
#   gpu_backward_rows.mojo  backward: rows in registers (the register plans,
#                           both tensors), the block-per-row fallback, and
#                           rows along another axis
#   gpu_backward_smem_rows.mojo backward rows whose y and dy fit one SM
#                           together: a block per row, on chip, read once
#   gpu_backward_stream_rows.mojo backward rows too long for that, or too
#                           few (to 8 MB): the split stream with y's and dy's
#                           chunks in each buffer, read once
#
# What the GPU families share:
#   gpu_launch.mojo         alignment flags every launcher passes
#   gpu_reductions.mojo     warp-shuffle and block reductions
#   gpu_split_chunks.mojo   the chunk steps of the on-chip splits (load a chunk
#                           of one or more tensors into shared memory, sweep
#                           it to reduce it or to write it)
#   gpu_split_workspace.mojo the split kernels' counters and pairs (device
#                           protocol, host allocation) and the on-chip splits'
#                           row limit and room checks
#
# CPU:
#   cpu_rows.mojo           vectorized, multithreaded CPU kernels
#   cpu_backward.mojo       the backward ops on the CPU
#
# Cross-entropy (loss, or loss and d loss / d logits, fused; rows of classes):
#   cross_entropy_ops.mojo  the @extensibility.register structs (cross_entropy,
#                           cross_entropy_with_grad and their *_into twins)
#                           and the CPU/GPU routing
#   cross_entropy_math.mojo the loss and gradient formulas both targets share
#   cpu_cross_entropy.mojo  the CPU kernel (rows as tasks, SIMD sweeps)
#   gpu_cross_entropy.mojo  the GPU entry point: target count and loss
#                           reduction kernels, the row kernel choice
#                           (`ce_kernel_for`) and the launcher
#   gpu_ce_register_rows.mojo rows held in registers (the softmax plans)
#   gpu_ce_smem_rows.mojo   rows on chip, a block a row (the forward's smem
#                           layout), read once
#   gpu_ce_pair_rows.mojo   rows past one SM: a cluster of two blocks a row,
#                           each holding half on chip, read once
#   gpu_ce_block_rows.mojo  any other rows, and the loss alone past the
#                           register plans: a block a row, an online pass
#                           (four loads a thread for the loss alone), the
#                           row re-read for the gradient
#   gpu_ce_common.mojo      what the families share: the options, the
#                           gradient's scale, a row's head/body/tail pieces
#   scale_ops.mojo          scale_rows: rows times a device factor in place, rows
#                           whose factor is 1 unread (the bridge's backward)
#
# Scaled, masked and causal softmax (softmax of scale * x + mask, causal
# masks computed in the kernel; a row with nothing kept gives 0 / -inf):
#   masked_softmax_ops.mojo the @extensibility.register structs
#                           (softmax_masked, log_softmax_masked and their
#                           *_into twins) and the CPU/GPU routing
#   cpu_masked_rows.mojo    the CPU kernel (rows as tasks, SIMD sweeps)
#   gpu_masked_rows.mojo    the GPU kernels: register rows (the softmax
#                           plans), a block per longer row, and the launcher
#
# Sharded rows (classes split over devices): sharded_ops.mojo (registrations), cpu_/gpu_sharded_rows.mojo
