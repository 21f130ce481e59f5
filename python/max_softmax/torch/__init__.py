"""PyTorch bridge: our Mojo kernels on `torch.Tensor`s, with autograd.

    from max_softmax.torch import softmax, log_softmax, cross_entropy
    y = softmax(x, dim=-1)          # instead of torch.softmax(x, dim=-1)
    loss = F.nll_loss(log_softmax(logits, dim=-1), target); loss.backward()
    loss = cross_entropy(logits, target); loss.backward()  # fused, F.cross_entropy

Runs on CPU and CUDA tensors; dtype and device follow the input, like
`torch.softmax`. Gradients are exact in reverse mode to any order
(`create_graph=True`), in forward mode, and under `torch.func` (`grad`,
`jvp`, `vmap`); the first-order backward passes are our `softmax_backward` /
`log_softmax_backward` ops. Needs the `[torch]` extra; `import max_softmax`
works without torch.

A call is lean: torch allocates the output, and the launch extension (or
the op's destination-passing model, `_graph_path`) writes into it, with no
copy, no host synchronisation and no dispatcher between. Under
`torch.compile` each op is a registered torch custom op
(`max_softmax::<op>`, opaque to the compiler) around the same call.

Modules: `_functional` (softmax, log_softmax), `_autograd` (their
Functions), `_masked` (scale / mask / causal), `_cross_entropy`,
`_modules` (nn.Modules), `_rows` (the row ops: checks, launch plans, custom
ops), `_graph_path` (MAX models on torch memory), `_device` (which devices).
"""

from __future__ import annotations

from ..validation import TargetIndexError, TensorMismatchError
from ._cross_entropy import cross_entropy
from ._functional import log_softmax, softmax
from ._modules import CrossEntropyLoss, LogSoftmax, Softmax, Softmax2d
from .linear import linear_cross_entropy

__all__ = [
    "CrossEntropyLoss",
    "LogSoftmax",
    "Softmax",
    "Softmax2d",
    "TargetIndexError",
    "TensorMismatchError",
    "cross_entropy",
    "linear_cross_entropy",
    "log_softmax",
    "softmax",
]
