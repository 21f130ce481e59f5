"""ncu target: the torch bridge's cross-entropy at fp32 16384 x 32000, plain and softcap 30,
each call inside an NVTX range ("plain", "softcap") after warm-up, so `--nvtx-include` picks them:

    ncu --nvtx --nvtx-include "softcap/" --nvtx-include "plain/" --section SpeedOfLight \
        --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
        --section WarpStateStats --section SchedulerStats python benchmarks/tools/ncu_softcap.py
"""

import torch

import max_softmax.torch as mt

x = torch.randn(16384, 32000, device="cuda", dtype=torch.float32, requires_grad=True)
t = torch.randint(0, 32000, (16384,), device="cuda")
for cap in (None, 30.0):
    for _ in range(3):
        mt.cross_entropy(x, t, softcap=cap).backward()
torch.cuda.synchronize()
for name, cap in (("plain", None), ("softcap", 30.0)):
    torch.cuda.nvtx.range_push(name)
    loss = mt.cross_entropy(x, t, softcap=cap)
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
print("ok", float(loss))
