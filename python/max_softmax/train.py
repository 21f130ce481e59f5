"""`softmax train`: a 2-layer MLP classifier trained with MAX graphs whose
loss and its gradient come from our fused cross-entropy
(`ops.cross_entropy_with_grad`: one pass over the logits) and whose
hand-written backward pass does the rest (MAX graphs have no autodiff).

Data: Gaussian blobs, one per class, generated in code. The step graph
computes the loss, the accuracy and every gradient; numpy applies SGD with
momentum.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from max.dtype import DType
from max.graph import Graph, TensorType, ops

from . import ops as our_ops
from .devices import device, resolve_device
from .dtypes import max_dtype, to_buffer, to_numpy
from .models import build_graph, compiled, device_ref

PARAMS = ("w1", "b1", "w2", "b2")


@dataclass
class Problem:
    """A synthetic classification problem and its MLP sizes."""

    x: np.ndarray
    labels: np.ndarray
    """Class indices, int64."""
    classes: int
    hidden: int


def make_problem(
    samples: int = 2048,
    features: int = 20,
    classes: int = 5,
    hidden: int = 64,
    seed: int = 0,
    dtype=np.float32,
) -> Problem:
    """Gaussian blobs: class c is centred at a random point, unit noise."""
    rng = np.random.default_rng(seed)
    # Centres close enough that the classes overlap a little: a linear
    # model is not enough, the MLP has to learn.
    centers = rng.standard_normal((classes, features)) * 0.45
    labels = rng.integers(0, classes, samples)
    x = centers[labels] + rng.standard_normal((samples, features))
    return Problem(x.astype(dtype), labels.astype(np.int64), classes, hidden)


def init_params(problem: Problem, seed: int = 0) -> dict[str, np.ndarray]:
    """He-initialised weights, zero biases."""
    rng = np.random.default_rng(seed + 1)
    d, k, h = problem.x.shape[1], problem.classes, problem.hidden
    dt = problem.x.dtype
    return {
        "w1": (rng.standard_normal((d, h)) * np.sqrt(2 / d)).astype(dt),
        "b1": np.zeros((1, h), dt),
        "w2": (rng.standard_normal((h, k)) * np.sqrt(2 / h)).astype(dt),
        "b2": np.zeros((1, k), dt),
    }


def build_step_graph(problem: Problem, kind: str) -> Graph:
    """Graph (x, labels, w1, b1, w2, b2) -> (loss, accuracy, dw1, db1, dw2, db2)."""
    dt = max_dtype(problem.x.dtype)
    ref = device_ref(kind)
    n, d = problem.x.shape
    k, h = problem.classes, problem.hidden
    types = [
        TensorType(dt, [n, d], ref),
        TensorType(DType.int64, [n], ref),
        TensorType(dt, [d, h], ref),
        TensorType(dt, [1, h], ref),
        TensorType(dt, [h, k], ref),
        TensorType(dt, [1, k], ref),
    ]

    def step(x, labels, w1, b1, w2, b2):
        # Forward.
        pre = ops.matmul(x, w1) + b1
        hid = ops.relu(pre)
        logits = ops.matmul(hid, w2) + b2
        # The mean loss and d loss / d logits, fused.
        loss, dlogits = our_ops.cross_entropy_with_grad(logits, labels)
        predicted = ops.reshape(ops.argmax(logits, axis=-1), [n])
        hits = ops.cast(ops.equal(predicted, labels), dt)
        accuracy = ops.sum(hits, axis=0) / float(n)
        # Backward, by hand, from dlogits.
        dw2 = ops.matmul(ops.transpose(hid, 0, 1), dlogits)
        db2 = ops.sum(dlogits, axis=0)
        dhid = ops.matmul(dlogits, ops.transpose(w2, 0, 1))
        dpre = dhid * ops.cast(ops.greater(pre, ops.constant(0, dt, ref)), dt)
        dw1 = ops.matmul(ops.transpose(x, 0, 1), dpre)
        db1 = ops.sum(dpre, axis=0)
        return loss, accuracy, dw1, db1, dw2, db2

    return build_graph("mlp_step", types, step)


class Trainer:
    """Compiles the step graph once and runs SGD steps with it."""

    def __init__(self, problem: Problem, device_name: str = "auto"):
        self.kind = resolve_device(device_name)
        self.problem = problem
        shapes = (problem.x.shape, problem.classes, problem.hidden, str(problem.x.dtype))
        self.model = compiled(
            ("mlp_step", shapes, self.kind),
            self.kind,
            lambda: build_step_graph(problem, self.kind),
            "the training step graph",
            cost="train_step",  # its matmuls take MAX far longer than our ops
        )
        self.dev = device(self.kind)
        self.data = [to_buffer(a).to(self.dev) for a in (problem.x, problem.labels)]

    def step(self, params: dict[str, np.ndarray]) -> tuple[float, float, dict[str, np.ndarray]]:
        """Loss, accuracy and gradients at `params`."""
        weights = [to_buffer(np.ascontiguousarray(params[p])).to(self.dev) for p in PARAMS]
        out = [to_numpy(b) for b in self.model.execute(*self.data, *weights)]
        loss, acc = float(out[0].reshape(-1)[0]), float(out[1].reshape(-1)[0])
        grads = {p: g.reshape(params[p].shape) for p, g in zip(PARAMS, out[2:])}
        return loss, acc, grads


def train(
    steps: int = 300,
    lr: float = 0.5,
    momentum: float = 0.9,
    seed: int = 0,
    device_name: str = "auto",
    log_every: int = 100,
    out=sys.stdout,
) -> list[tuple[int, float, float]]:
    """Train the MLP; return (step, loss, accuracy) at each logged step."""
    problem = make_problem(seed=seed)
    params = init_params(problem, seed)
    velocity = {p: np.zeros_like(v) for p, v in params.items()}
    t0 = time.perf_counter()
    trainer = Trainer(problem, device_name)
    print(f"compiled the step graph on {trainer.kind} in {time.perf_counter() - t0:.1f}s", file=out)
    history = []
    for i in range(steps + 1):
        loss, acc, grads = trainer.step(params)
        if i % log_every == 0 or i == steps:
            history.append((i, loss, acc))
            print(f"step {i:4d}  loss {loss:.4f}  train accuracy {acc:.3f}", file=out)
        if i == steps:
            break
        for p in PARAMS:
            velocity[p] = momentum * velocity[p] - lr * grads[p]
            params[p] = (params[p] + velocity[p]).astype(params[p].dtype)
    print(f"done in {time.perf_counter() - t0:.1f}s", file=out)
    return history


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `softmax train`."""
    p = argparse.ArgumentParser(
        prog="softmax train",
        description="Train a 2-layer MLP classifier on synthetic Gaussian blobs with MAX "
        "graphs: the loss and its gradient from our fused cross-entropy, the rest of the "
        "backward pass by hand, SGD with momentum in numpy. Logs the loss every 100 steps.",
    )
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=["auto", "cpu", "gpu"], default="auto")
    args = p.parse_args(argv)
    history = train(args.steps, args.lr, seed=args.seed, device_name=args.device)
    final_acc = history[-1][2]
    verdict = ">= 0.95: OK" if final_acc >= 0.95 else "below 0.95"
    print(f"final train accuracy {final_acc:.3f} ({verdict})")
    return 0 if final_acc >= 0.95 else 1


__all__ = ["Trainer", "init_params", "make_problem", "train", "main"]
