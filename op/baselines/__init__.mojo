# Baseline GPU kernels: designs the live kernels replaced, kept so that every
# faster kernel can be measured against them (`variant=` in the Python API,
# through op/variants.mojo, the only live file that imports from here).
# Nothing live imports these files; they import from the live ones.
#
#   gpu_tree_rows.mojo       the reference design ("tree"): a block per row,
#                            shared-memory tree reductions, three reads
#   gpu_online_rows.mojo     long rows ("online"): a block per row, online
#                            max/sum, then a second read
#   gpu_split_smem_rows.mojo split rows ("split_smem"): a block a 72 KB chunk,
#                            which waits for its row holding it
