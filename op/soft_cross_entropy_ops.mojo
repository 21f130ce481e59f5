"""The soft-target cross-entropy ops' work (`SoftCrossEntropyCall`, the
cross-entropy's `LossCall` with probability targets): the loss against
class probabilities, or the loss and its gradient, fused.

Each takes logits and probabilities as (rows, classes) views of one dtype
(a free reshape in the graph, see python/max_softmax/ops.py) and
`options`, a float64 tensor on the op's device: (eps, z_loss[, class
weights]) (soft_target_math). Run-time values, so one compiled model per
(op, dtype, reduction, device) serves all of them; the options' length
(known on the host) tells whether the kernels read weights. `reduction`
("mean", "sum", "none") is a compile-time parameter: it decides the loss's
shape, (1,) or (rows,).

`soft_cross_entropy_with_grad` also writes dlogits = d loss / d logits
(for "none": the gradient of the sum of the row losses). The launch
extension builds the same call; the `*_into` twins write into given
buffers, for the torch bridge (see registered_ops.mojo).
"""

from .cross_entropy_ops import LossCall

comptime SoftCrossEntropyCall[
    dtype: DType, with_grad: Bool, reduction: StaticString
] = LossCall[dtype, dtype, with_grad, reduction]
"""Cross-entropy of (rows, n) logits against (rows, n) class probabilities
of their dtype."""
