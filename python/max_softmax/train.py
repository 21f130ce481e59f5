"""`softmax train`: a 2-layer MLP classifier trained with a MAX graph whose
output layer and loss are our fused linear + cross-entropy
(`linear_graph.linear_cross_entropy_with_grad`: logits, loss and the output
layer's gradients in chunks of rows, the logits never whole) and whose
hand-written backward pass does the rest (MAX graphs have no autodiff).

Data: Gaussian blobs, one per class, generated in code. A step computes the
loss, the accuracy and every gradient; numpy applies SGD with momentum.

No wait without a word: the step graph takes MAX ~140 s to compile on a
2-core CPU the first time (~3 s from MAX's cache after). Where this machine
has compiled it before (or `softmax warmup --train` did), training runs in
the graph from step 0. Else the graph compiles on a thread while training
starts at once on the launch path, the same step computed by numpy matmuls
and our fused `max_softmax.linear_cross_entropy_with_grad` on arrays (the
launch extension, no graph); it moves into the graph when the compile ends, and a
run that ends first waits for it (saying so) and checks its last step in
the graph. Every logged line names the path that computed it.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import NamedTuple, TextIO

import numpy as np
from max.dtype import DType
from max.graph import Graph, TensorType, ops

from .devices import device, resolve_device
from .dtypes import max_dtype, to_buffer, to_numpy
from .linear_graph import linear_cross_entropy_with_grad
from .models import build_graph, compile_marker, compiled, device_ref

PARAMS = ("w1", "b1", "w2", "b2")

LOG_EVERY = 100
"""Steps between two logged lines (the first and the last step are always logged)."""

TARGET_ACCURACY = 0.95
"""The final train accuracy `softmax train` checks (the default run reaches 1.000)."""

GRAPH = "MAX graph"
LAUNCH = "launch path"
"""The two paths a step runs on, as the log names them: the compiled step
graph, or numpy matmuls + our fused linear + cross-entropy through the
launch extension."""


@dataclass
class Problem:
    """A synthetic classification problem and its MLP sizes."""

    x: np.ndarray
    labels: np.ndarray
    """Class indices, int64."""
    classes: int
    hidden: int


class Logged(NamedTuple):
    """One logged step: its number, loss and train accuracy, and the path
    that computed it (GRAPH or LAUNCH)."""

    step: int
    loss: float
    accuracy: float
    path: str


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
    """He-initialised weights, zero biases. The output layer's w2 is (classes,
    hidden) and b2 (classes,), as `nn.Linear(hidden, classes)`: the layout
    `linear_cross_entropy` takes."""
    rng = np.random.default_rng(seed + 1)
    d, k, h = problem.x.shape[1], problem.classes, problem.hidden
    dt = problem.x.dtype
    return {
        "w1": (rng.standard_normal((d, h)) * np.sqrt(2 / d)).astype(dt),
        "b1": np.zeros((1, h), dt),
        "w2": (rng.standard_normal((k, h)) * np.sqrt(2 / h)).astype(dt),
        "b2": np.zeros(k, dt),
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
        TensorType(dt, [k, h], ref),
        TensorType(dt, [k], ref),
    ]

    def step(x, labels, w1, b1, w2, b2):
        # Forward.
        pre = ops.matmul(x, w1) + b1
        hid = ops.relu(pre)
        # The output layer, the mean loss and their gradients, fused.
        loss, dhid, dw2, db2 = linear_cross_entropy_with_grad(hid, w2, labels, b2)
        # The accuracy reads the logits again (a small matmul, outside the loss).
        logits = ops.matmul(hid, ops.transpose(w2, 0, 1)) + b2
        predicted = ops.reshape(ops.argmax(logits, axis=-1), [n])
        hits = ops.cast(ops.equal(predicted, labels), dt)
        accuracy = ops.sum(hits, axis=0) / float(n)
        # Backward, by hand, from dhid.
        dpre = dhid * ops.cast(ops.greater(pre, ops.constant(0, dt, ref)), dt)
        dw1 = ops.matmul(ops.transpose(x, 0, 1), dpre)
        db1 = ops.sum(dpre, axis=0)
        return loss, accuracy, dw1, db1, dw2, db2

    return build_graph("mlp_step", types, step)


def step_key(problem: Problem, kind: str) -> Hashable:
    """The models cache key of `problem`'s step graph on device `kind`."""
    shapes = (problem.x.shape, problem.classes, problem.hidden, str(problem.x.dtype))
    # "lce": the step with the fused output layer (a marker of the older
    # step graph must not claim this one is in MAX's cache).
    return ("mlp_step_lce", shapes, kind)


def step_graph_cached(problem: Problem, kind: str) -> bool:
    """Whether this machine compiled `problem`'s step graph for the current
    kernels before (MAX's cache then loads it in ~3 s)."""
    return compile_marker(step_key(problem, kind)).is_file()


class Trainer:
    """Compiles (or loads) the step graph once and runs steps with it."""

    def __init__(self, problem: Problem, device_name: str = "auto"):
        self.kind = resolve_device(device_name)
        self.problem = problem
        self.model = compiled(
            step_key(problem, self.kind),
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


def launch_step(
    problem: Problem, params: dict[str, np.ndarray]
) -> tuple[float, float, dict[str, np.ndarray]]:
    """The step graph's math without a graph: numpy matmuls, and the output
    layer with the mean loss and their gradients from our fused
    `linear_cross_entropy_with_grad` on numpy arrays (its cross-entropy on
    the CPU through the launch extension). Loss, accuracy and gradients at
    `params`, as `Trainer.step`."""
    from .linear import linear_cross_entropy_with_grad

    x, labels = problem.x, problem.labels
    pre = x @ params["w1"] + params["b1"]
    hid = np.maximum(pre, 0)
    loss, dhid, dw2, db2 = linear_cross_entropy_with_grad(
        hid, params["w2"], labels, params["b2"], device="cpu"
    )
    logits = hid @ params["w2"].T + params["b2"]  # for the accuracy only
    accuracy = float(np.mean(np.argmax(logits, axis=-1) == labels))
    dpre = dhid * (pre > 0)
    grads = {
        "w1": x.T @ dpre,
        "b1": dpre.sum(axis=0, keepdims=True),
        "w2": dw2,
        "b2": db2,
    }
    return float(loss), accuracy, grads


def compile_in_child(seed: int, kind: str) -> None:
    """Compile the step graph of `make_problem(seed=seed)` on device `kind`
    in a child process, into MAX's cache and our compile marker: on a
    thread beside the numpy steps, MAX's compile took the GIL often enough
    to slow them ~10x. The child's notices go to this process's stderr."""
    code = (
        "from max_softmax.train import Trainer, make_problem; "
        f"Trainer(make_problem(seed={int(seed)}), {kind!r})"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def start_trainer(
    problem: Problem,
    kind: str,
    make: Callable[[Problem, str], Trainer] = Trainer,
    seed: int | None = None,
) -> Future[Trainer]:
    """`make(problem, kind)` on a daemon thread; its future. With `seed`
    (`problem` being `make_problem(seed=seed)`) a child process compiles
    the graph first (`compile_in_child`): the thread then only loads it
    from MAX's cache."""
    future: Future[Trainer] = Future()

    def run() -> None:
        try:
            if seed is not None:
                compile_in_child(seed, kind)
            future.set_result(make(problem, kind))
        except BaseException as err:  # handed to whoever waits on it
            future.set_exception(err)

    threading.Thread(target=run, name="max-softmax step graph", daemon=True).start()
    return future


def _failed(err: BaseException, out: TextIO) -> None:
    print(
        f"the step graph failed ({type(err).__name__}: {err}): no step in the MAX graph", file=out
    )


def train(
    steps: int = 300,
    lr: float = 0.5,
    momentum: float = 0.9,
    seed: int = 0,
    device_name: str = "auto",
    log_every: int = LOG_EVERY,
    out: TextIO = sys.stdout,
    path: str = "auto",
    make: Callable[[Problem, str], Trainer] | None = None,
) -> list[Logged]:
    """Train the MLP; return the logged steps (every `log_every`-th, and the last).

    `path`: "auto" trains in the step graph where it is cached, else starts
    on the launch path while the graph compiles and moves into it once it
    is ready (waiting for it at the end, to run the last step in it, if
    training ends first); "graph" compiles (or loads) the graph first and
    trains in it; "launch" never builds the graph. `make` builds the
    graph's trainer (default: `Trainer`, its compile in a child process
    while training runs; tests pass a slow stand-in, run on a thread)."""
    child = seed if make is None else None
    make = make or Trainer
    problem = make_problem(seed=seed)
    params = init_params(problem, seed)
    velocity = {p: np.zeros_like(v) for p, v in params.items()}
    t0 = time.perf_counter()
    kind = resolve_device(device_name)
    trainer: Trainer | None = None
    pending: Future[Trainer] | None = None
    if path == "graph" or (path == "auto" and step_graph_cached(problem, kind)):
        if step_graph_cached(problem, kind):  # unannounced by models.compiled: say it here
            print(
                f"loading the step graph for {kind} from MAX's cache (~3 s on an idle CPU)...",
                file=out,
            )
        trainer = make(problem, kind)
        print(f"step graph ready on {kind} after {time.perf_counter() - t0:.1f}s", file=out)
    compile_later = path == "auto" and trainer is None
    if compile_later:
        print(
            f"the step graph is not compiled on this machine yet: training starts now on the "
            f"{LAUNCH} (numpy matmuls + our fused linear_cross_entropy_with_grad, no graph) "
            f"while the graph compiles for {kind} beside it, and moves into the graph when it "
            "is ready",
            file=out,
            flush=True,
        )
        # A child process: on another core from the extension's build on a
        # cold install, and no GIL taken from the steps.
        pending = start_trainer(problem, kind, make, child)
    history: list[Logged] = []
    for i in range(steps + 1):
        if trainer is None and pending is not None and pending.done():
            err = pending.exception()
            if err is not None:  # training goes on on the launch path
                _failed(err, out)
                pending = None
            else:
                trainer = pending.result()
                at = time.perf_counter() - t0
                print(f"step graph ready after {at:.1f}s: steps {i}+ run in the {GRAPH}", file=out)
        where = GRAPH if trainer else LAUNCH
        loss, acc, grads = trainer.step(params) if trainer else launch_step(problem, params)
        if i % log_every == 0 or i == steps:
            history.append(Logged(i, loss, acc, where))
            print(
                f"step {i:4d}  loss {loss:.4f}  train accuracy {acc:.3f}  "
                f"[{where}, {time.perf_counter() - t0:.1f}s]",
                file=out,
                flush=True,
            )
        if i == steps:
            break
        for p in PARAMS:
            velocity[p] = momentum * velocity[p] - lr * grads[p]
            params[p] = (params[p] + velocity[p]).astype(params[p].dtype)
    if trainer is None and pending is not None:
        print(
            "training ended before the step graph compiled: waiting for it (announced "
            "above) to run the last step in the MAX graph...",
            file=out,
            flush=True,
        )
        try:
            trainer = pending.result()
        except Exception as err:
            _failed(err, out)
        else:
            g_loss, g_acc, _ = trainer.step(params)
            last = history[-1]
            agree = abs(g_loss - last.loss) <= 1e-4 * max(1.0, abs(last.loss))
            print(
                f"step {steps:4d}  loss {g_loss:.4f}  train accuracy {g_acc:.3f}  [{GRAPH}, "
                f"{time.perf_counter() - t0:.1f}s]: "
                f"{'agrees with' if agree else 'DIFFERS from'} the {LAUNCH}",
                file=out,
            )
            history.append(Logged(steps, g_loss, g_acc, GRAPH))
    print(f"done in {time.perf_counter() - t0:.1f}s", file=out)
    return history


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `softmax train`."""
    p = argparse.ArgumentParser(
        prog="softmax train",
        description="Train a 2-layer MLP classifier (20 features, 64 hidden units, 5 "
        "classes) on 2048 synthetic Gaussian-blob samples. A step is a MAX graph: "
        "matmul and ReLU forward, the output layer, the mean loss and their gradients "
        "from our fused linear_cross_entropy_with_grad (max_softmax.linear_graph), the "
        "rest of the backward pass by hand (MAX graphs have no autodiff); numpy applies "
        "SGD with momentum. The first "
        "run on a machine compiles that graph (~140 s on 2 cores, cached after; "
        "'softmax warmup --train' builds it ahead): meanwhile training starts at once on "
        "the launch path (numpy matmuls + our fused linear + cross-entropy on arrays, no "
        "graph) "
        "and moves into the graph when it is ready. Logs the step, loss, train accuracy, "
        f"path and elapsed time every {LOG_EVERY} steps and at the last step; exits 0 "
        f"when the final train accuracy is >= {TARGET_ACCURACY}, else 1.",
    )
    p.add_argument("--steps", type=int, default=300, help="SGD steps (default 300)")
    p.add_argument("--lr", type=float, default=0.5, help="learning rate (default 0.5)")
    p.add_argument("--seed", type=int, default=0, help="data and init seed (default 0)")
    p.add_argument(
        "--log-every",
        type=int,
        default=LOG_EVERY,
        help=f"steps between logged lines (default {LOG_EVERY})",
    )
    p.add_argument(
        "--device",
        choices=["auto", "cpu", "gpu"],
        default="auto",
        help="where the step graph runs (default auto: the first GPU, else the CPU)",
    )
    p.add_argument(
        "--path",
        choices=["auto", "graph", "launch"],
        default="auto",
        help="auto (default): the graph where it is cached, else the launch path until "
        "it compiles; graph: wait for the graph, train in it; launch: no graph at all",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `softmax train`: 0 when the final train accuracy
    reaches TARGET_ACCURACY, 1 below it, 2 for a bad argument."""
    args = build_parser().parse_args(argv)
    if args.steps < 0 or args.log_every < 1:
        print("softmax train: error: --steps must be >= 0 and --log-every >= 1", file=sys.stderr)
        return 2
    history = train(
        args.steps,
        args.lr,
        seed=args.seed,
        device_name=args.device,
        log_every=args.log_every,
        path=args.path,
    )
    final_acc = history[-1].accuracy
    ok = final_acc >= TARGET_ACCURACY
    verdict = f">= {TARGET_ACCURACY}: OK" if ok else f"below {TARGET_ACCURACY}"
    print(f"final train accuracy {final_acc:.3f} ({verdict})")
    return 0 if ok else 1


__all__ = [
    "Logged",
    "Trainer",
    "build_parser",
    "init_params",
    "launch_step",
    "main",
    "make_problem",
    "start_trainer",
    "step_graph_cached",
    "train",
]
