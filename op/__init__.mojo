# max-softmax: the Mojo package MAX loads with `custom_extensions=[".../op"]`.
#
# Layout (one job per file):
#   softmax_op.mojo         the @extensibility.register structs MAX calls
#   inplace_ops.mojo        the same ops writing into a given buffer (torch bridge)
#   dispatch.mojo           the one table choosing a kernel from (rows, n, dtype)
#   row_math.mojo           numerics shared by every kernel (accumulator type,
#                           guarded exp-differences, the softmax/log-softmax epilogue)
#   gpu_reductions.mojo     warp-shuffle and block reductions
#   gpu_tree_rows.mojo      baseline: block per row, shared-memory tree reduction
#   gpu_register_rows.mojo  short and medium rows held in registers
#                           (a warp per row, or a block per row)
#   gpu_smem_rows.mojo      long rows (to ~74K fp32): a block per row, on chip in
#                           registers + shared memory, read once
#   gpu_split_stream_rows.mojo few or long rows (to 8 MB): each row split into
#                           chunks (56 KB fp32, 24 KB 16-bit) that resident
#                           blocks stream through two shared-memory buffers,
#                           read once
#   gpu_split_smem_rows.mojo baseline split: a block a 72 KB chunk, held in
#                           shared memory; the chunk steps both share
#   gpu_split_rows.mojo     rows over 8 MB: each row split across many blocks
#                           in one launch, re-read from L2
#   gpu_online_rows.mojo    baseline for long rows: online max/sum pass, then a
#                           normalising pass, a block per row
#   gpu_backward_rows.mojo  softmax/log-softmax backward kernels
#   gpu_strided_rows.mojo   softmax over an axis that is not the last one
#   cpu_rows.mojo           vectorized, multithreaded CPU kernels
#   cpu_backward.mojo       the backward ops on the CPU
