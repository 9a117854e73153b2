"""Gradient accumulation and clipping through ``step_optimizer``, against hand computations."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from api_trials import LinearTrial, regression_data, train

from searchlab.pytorch import Batch, PyTorchCallback


def mse_grad(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Gradient of mean((x @ W^T + b - y)^2) by hand, flattened as (W, b) like flat_params."""
    weight, bias = w[:3].reshape(1, 3), w[3]
    residual = x @ weight.T + bias - y  # (n, 1)
    n = x.shape[0]
    return torch.cat([(2 / n) * (residual.T @ x).reshape(-1), (2 / n) * residual.sum().reshape(1)])


def sgd_by_hand(w0: torch.Tensor, x: torch.Tensor, y: torch.Tensor, lr: float = 0.1):
    return w0 - lr * mse_grad(w0, x, y)


DATA = regression_data(16)


@pytest.mark.parametrize(
    ("hparams", "init_kwargs"),
    [
        ({"passes": 4}, {}),  # wrap_optimizer(backward_passes_per_step=4)
        ({}, {"aggregation_frequency": 4}),  # optimizations.aggregation_frequency
    ],
    ids=["backward_passes_per_step", "aggregation_frequency"],
)
def test_four_accumulated_batches_make_one_averaged_update(tmp_path, hparams, init_kwargs):
    hp = {"global_batch_size": 4, "n_train": 16, **hparams}
    run = train(tmp_path, hp, init_kwargs=init_kwargs, max_length=Batch(4))
    w0, weights = run.trial.initial, run.trial.weights
    # No update inside the accumulation window...
    for w in weights[:3]:
        assert torch.equal(w, w0)
    # ...then one SGD step with the mean gradient of the 16 records (4 equal batches of 4).
    x, y = DATA.tensors
    assert torch.allclose(weights[3], sgd_by_hand(w0, x, y), atol=1e-6)


def test_accumulated_update_equals_one_batch_four_times_larger(tmp_path) -> None:
    small = train(tmp_path / "a", {"global_batch_size": 4, "passes": 4}, max_length=Batch(4))
    large = train(tmp_path / "b", {"global_batch_size": 16}, max_length=Batch(1))
    assert torch.equal(small.trial.initial, large.trial.initial)
    assert torch.allclose(small.trial.weights[-1], large.trial.weights[-1], atol=1e-6)


def test_without_accumulation_every_batch_updates(tmp_path) -> None:
    run = train(tmp_path, {"global_batch_size": 4}, max_length=Batch(2))
    x, y = DATA.tensors
    w1 = sgd_by_hand(run.trial.initial, x[:4], y[:4])
    assert torch.allclose(run.trial.weights[0], w1, atol=1e-6)
    assert torch.allclose(run.trial.weights[1], sgd_by_hand(w1, x[4:8], y[4:8]), atol=1e-6)


class GradNorms(PyTorchCallback):
    """Records the gradient norm the optimizer steps with (after clipping)."""

    def __init__(self) -> None:
        self.norms: list[float] = []

    def on_before_optimizer_step(self, parameters: Any) -> None:
        grads = [p.grad.reshape(-1) for p in parameters if p.grad is not None]
        self.norms.append(float(torch.cat(grads).norm()))


class ClippedTrial(LinearTrial):
    def build_callbacks(self) -> dict[str, PyTorchCallback]:
        self.grad_norms = GradNorms()
        return {"grad_norms": self.grad_norms}


@pytest.mark.parametrize("max_norm", [0.01, 0.5])
def test_clip_grads_clips_before_the_step(tmp_path, max_norm) -> None:
    hp = {"global_batch_size": 4, "clip": max_norm}
    run = train(tmp_path, hp, trial_cls=ClippedTrial, max_length=Batch(3))
    x, y = DATA.tensors
    raw = mse_grad(run.trial.initial, x[:4], y[:4])
    assert raw.norm() > max_norm  # so clipping must act
    assert run.trial.grad_norms.norms == pytest.approx([max_norm] * 3, rel=1e-4)
    expected = run.trial.initial - 0.1 * raw * (max_norm / raw.norm())
    assert torch.allclose(run.trial.weights[0], expected, atol=1e-6)


def test_without_clip_grads_the_full_gradient_is_used(tmp_path) -> None:
    run = train(tmp_path, {"global_batch_size": 4}, trial_cls=ClippedTrial, max_length=Batch(1))
    x, y = DATA.tensors
    raw = mse_grad(run.trial.initial, x[:4], y[:4])
    assert run.trial.grad_norms.norms == [pytest.approx(float(raw.norm()), rel=1e-5)]


def test_clipping_applies_to_the_averaged_accumulated_gradient(tmp_path) -> None:
    hp = {"global_batch_size": 4, "passes": 4, "clip": 0.01}
    run = train(tmp_path, hp, trial_cls=ClippedTrial, max_length=Batch(4))
    x, y = DATA.tensors
    mean_grad = mse_grad(run.trial.initial, x, y)
    assert len(run.trial.grad_norms.norms) == 1  # one optimizer step for four batches
    expected = run.trial.initial - 0.1 * mean_grad * (0.01 / mean_grad.norm())
    assert torch.allclose(run.trial.weights[3], expected, atol=1e-6)
