"""The training example: gradients of the step graph match finite
differences, the launch path computes the same step (its fused output layer
as the unfused float64 step), training starts before
the step graph is ready and moves into it, and it reaches the README's
accuracy."""

from __future__ import annotations

import io
import threading

import numpy as np
import pytest

from max_softmax import train as demo
from max_softmax.train import (
    GRAPH,
    LAUNCH,
    PARAMS,
    Trainer,
    init_params,
    launch_step,
    make_problem,
    train,
)


@pytest.fixture(scope="module")
def small():
    """A float64 problem small enough for finite differences, and its trainer."""
    problem = make_problem(samples=64, features=4, classes=3, hidden=8, seed=3, dtype=np.float64)
    return problem, Trainer(problem, "cpu")


def test_step_gradients_match_finite_differences(small):
    problem, trainer = small
    params = init_params(problem, seed=3)
    _, _, grads = trainer.step(params)
    rng = np.random.default_rng(0)
    h = 1e-6
    for name in PARAMS:
        for _ in range(4):
            i = tuple(int(rng.integers(0, s)) for s in params[name].shape)
            up = {k: v.copy() for k, v in params.items()}
            down = {k: v.copy() for k, v in params.items()}
            up[name][i] += h
            down[name][i] -= h
            numeric = (trainer.step(up)[0] - trainer.step(down)[0]) / (2 * h)
            np.testing.assert_allclose(grads[name][i], numeric, rtol=1e-5, atol=1e-8)


def test_the_launch_path_computes_the_graphs_step(small):
    """numpy matmuls + our fused cross-entropy on arrays: the same loss,
    accuracy and gradients as the step graph."""
    problem, trainer = small
    params = init_params(problem, seed=3)
    g_loss, g_acc, g_grads = trainer.step(params)
    loss, acc, grads = launch_step(problem, params)
    assert loss == pytest.approx(g_loss, rel=1e-12) and acc == g_acc
    for name in PARAMS:
        assert grads[name].shape == params[name].shape
        np.testing.assert_allclose(grads[name], g_grads[name], rtol=1e-10, atol=1e-14)


def _unfused_step(problem, params):
    """The step in float64 numpy, the output layer unfused: logits, their
    log-softmax, the mean loss and every gradient by hand."""
    p = {k: v.astype(np.float64) for k, v in params.items()}
    x, labels, rows = problem.x.astype(np.float64), problem.labels, len(problem.labels)
    pre = x @ p["w1"] + p["b1"]
    hid = np.maximum(pre, 0)
    logits = hid @ p["w2"].T + p["b2"]
    shifted = logits - logits.max(axis=-1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    loss = -logp[np.arange(rows), labels].mean()
    dlogits = np.exp(logp)
    dlogits[np.arange(rows), labels] -= 1
    dlogits /= rows
    dpre = (dlogits @ p["w2"]) * (pre > 0)
    grads = {
        "w1": x.T @ dpre,
        "b1": dpre.sum(axis=0, keepdims=True),
        "w2": dlogits.T @ hid,
        "b2": dlogits.sum(axis=0),
    }
    return loss, grads


@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-10), (np.float32, 2e-4)])
def test_the_fused_output_layer_matches_the_unfused_reference(dtype, rtol):
    """The launch path's step (linear_cross_entropy_with_grad for the
    output layer and loss) against the unfused float64 step."""
    problem = make_problem(samples=96, features=6, classes=7, hidden=10, seed=5, dtype=dtype)
    params = init_params(problem, seed=5)
    params["b2"] += np.linspace(-0.5, 0.5, problem.classes).astype(dtype)  # a bias that counts
    loss, _, grads = launch_step(problem, params)
    want_loss, want = _unfused_step(problem, params)
    assert loss == pytest.approx(want_loss, rel=rtol)
    for name in PARAMS:
        assert grads[name].shape == params[name].shape, name
        size = np.abs(want[name]).max()
        np.testing.assert_allclose(grads[name], want[name], rtol=rtol, atol=rtol * size)


def test_training_lowers_the_loss_and_reaches_the_readmes_accuracy():
    """The default run (300 steps) ends at train accuracy 1.000, as the
    README says; the logged losses fall at every log line."""
    log = io.StringIO()
    history = train(steps=300, device_name="cpu", log_every=50, out=log, path="launch")
    assert [h.step for h in history] == [0, 50, 100, 150, 200, 250, 300]
    losses = [h.loss for h in history]
    assert losses[-1] < 0.05 * losses[0], log.getvalue()
    assert all(b < a for a, b in zip(losses, losses[1:])), log.getvalue()
    assert f"{history[-1].accuracy:.3f}" == "1.000", log.getvalue()  # as printed
    assert {h.path for h in history} == {LAUNCH}


class _Slow:
    """A stand-in for the step graph's trainer whose compile ends only when
    `ready` is set; its steps are the launch path's (the real graph's
    agreement is tested above)."""

    def __init__(self, ready: threading.Event) -> None:
        self.ready, self.made = ready, 0

    def __call__(self, problem, kind):
        assert self.ready.wait(60), "the test never released the compile"
        self.made += 1
        trainer = type("FakeTrainer", (), {})()
        trainer.kind = kind
        trainer.step = lambda params: launch_step(problem, params)
        return trainer


class _Watch(io.StringIO):
    """A log that sets `event` once `text` has been written to it."""

    def __init__(self, text: str, event: threading.Event) -> None:
        super().__init__()
        self.text, self.event = text, event

    def write(self, s: str) -> int:
        n = super().write(s)
        if self.text in self.getvalue():
            self.event.set()
        return n


@pytest.fixture
def uncached(monkeypatch):
    """As on a machine that never compiled the step graph."""
    monkeypatch.setattr(demo, "step_graph_cached", lambda problem, kind: False)


def test_training_starts_before_the_step_graph_is_ready_and_moves_into_it(uncached):
    ready = threading.Event()
    slow = _Slow(ready)
    log = _Watch("step   20", ready)  # the compile "ends" once step 20 is logged
    history = train(steps=400, device_name="cpu", log_every=20, out=log, make=slow)
    text = log.getvalue()
    assert slow.made == 1
    assert text.index("training starts now on the launch path") < text.index("step    0")
    assert history[0].path == LAUNCH and history[1].path == LAUNCH  # steps 0 and 20
    assert history[-1].path == GRAPH, text
    switched = "step graph ready after" in text
    assert switched or "training ended before the step graph compiled" in text, text
    if switched:  # once in the graph, every later step stays there
        paths = [h.path for h in history]
        first = paths.index(GRAPH)
        assert set(paths[first:]) == {GRAPH}


def test_a_run_that_ends_first_waits_for_the_graph_and_checks_its_last_step(uncached):
    ready = threading.Event()
    slow = _Slow(ready)
    log = _Watch("training ended before the step graph compiled", ready)
    history = train(steps=30, device_name="cpu", log_every=10, out=log, make=slow)
    text = log.getvalue()
    assert [h.path for h in history] == [LAUNCH] * 4 + [GRAPH]
    assert history[-1].step == history[-2].step == 30
    assert history[-1].loss == pytest.approx(history[-2].loss)
    assert "agrees with the launch path" in text


def test_help_says_what_it_runs_and_how_often_it_logs(capsys):
    with pytest.raises(SystemExit):
        demo.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for words in (
        "linear_cross_entropy_with_grad",
        "every 100 steps",
        "--log-every",
        "--path",
        "softmax warmup --train",
        "launch path",
        "SGD with momentum",
    ):
        assert words in text, words
