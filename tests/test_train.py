"""The training example: gradients of the step graph match finite
differences, and training lowers the loss."""

from __future__ import annotations

import io

import numpy as np

from max_softmax.train import PARAMS, Trainer, init_params, make_problem, train


def test_step_gradients_match_finite_differences():
    problem = make_problem(samples=64, features=4, classes=3, hidden=8, seed=3, dtype=np.float64)
    params = init_params(problem, seed=3)
    trainer = Trainer(problem, "cpu")
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


def test_training_lowers_the_loss_and_fits():
    log = io.StringIO()
    history = train(steps=200, device_name="cpu", log_every=50, out=log)
    losses = [loss for _, loss, _ in history]
    assert losses[-1] < 0.5 * losses[0], log.getvalue()
    assert all(b <= a for a, b in zip(losses, losses[1:])), log.getvalue()
    assert history[-1][2] >= 0.95, log.getvalue()
