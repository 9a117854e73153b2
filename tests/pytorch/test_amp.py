"""Mixed precision on CPU: a user's GradScaler via ``wrap_scaler``, and ``use_amp()`` (bf16)."""

from __future__ import annotations

from typing import Any

import torch
from api_trials import LinearTrial, train
from torch import nn

from searchlab import pytorch
from searchlab.pytorch import Batch


class ScalerTrial(LinearTrial):
    """Determined's documented pattern for managing a GradScaler yourself."""

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        super().__init__(context)
        self.scaler = context.wrap_scaler(
            torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=1)
        )
        self.scales: list[float] = []

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        x, y = batch
        loss = nn.functional.mse_loss(self.model(x), y)
        self.scales.append(float(self.scaler.get_scale()))
        self.context.backward(self.scaler.scale(loss))
        self.context.step_optimizer(self.opt, scaler=self.scaler)
        self.scaler.update()
        self.weights.append(torch.cat([p.detach().reshape(-1) for p in self.model.parameters()]))
        return {"loss": loss}


def test_wrapped_scaler_trains_exactly_like_unscaled_fp32(tmp_path) -> None:
    scaled = train(tmp_path / "s", {"global_batch_size": 4}, trial_cls=ScalerTrial, max_length=5)
    plain = train(tmp_path / "p", {"global_batch_size": 4}, max_length=5)
    # Power-of-two scaling is exact in fp32: unscaled once, the updates are bit-identical.
    assert torch.equal(scaled.trial.weights[-1], plain.trial.weights[-1])
    # No inf/NaN steps, growth_interval=1: the scale doubles after every batch.
    assert scaled.trial.scales == [1024.0 * 2**k for k in range(5)]


def test_wrapped_scaler_state_is_saved_and_restored(tmp_path) -> None:
    hp = {"global_batch_size": 4}
    whole = train(tmp_path / "w", hp, trial_cls=ScalerTrial, max_length=Batch(6))
    first = train(tmp_path / "a", hp, trial_cls=ScalerTrial, max_length=Batch(3))
    state = torch.load(f"{first.path}/state-dict.pth", map_location="cpu", weights_only=False)
    assert state["scaler_state_dict"][0]["scale"] == 8192.0
    second = train(
        tmp_path / "b", hp, trial_cls=ScalerTrial, max_length=Batch(6), latest_checkpoint=first.path
    )
    assert second.trial.scales[0] == 8192.0  # restored before training resumed
    assert first.trial.scales + second.trial.scales == whole.trial.scales
    assert torch.equal(second.trial.weights[-1], whole.trial.weights[-1])


class AutoAmpTrial(LinearTrial):
    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        context.experimental.use_amp()
        super().__init__(context)
        self.seen: dict[str, Any] = {}

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        x, _ = batch
        self.seen["train_autocast"] = torch.is_autocast_enabled("cpu")
        self.seen["train_dtype"] = torch.get_autocast_dtype("cpu")
        self.seen["train_out"] = self.model(x).dtype
        return super().train_batch(batch, epoch_idx, batch_idx)

    def evaluate_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        self.seen["eval_out"] = self.model(batch[0]).dtype
        return super().evaluate_batch(batch, batch_idx)


def test_use_amp_on_cpu_runs_under_bf16_autocast_without_scaler(tmp_path) -> None:
    run = train(tmp_path, {"global_batch_size": 4}, trial_cls=AutoAmpTrial, max_length=Batch(4))
    seen = run.trial.seen
    assert seen["train_autocast"] is True
    assert seen["train_dtype"] == torch.bfloat16
    assert seen["train_out"] == torch.bfloat16
    assert seen["eval_out"] == torch.bfloat16  # validation runs under autocast too
    assert not torch.is_autocast_enabled("cpu")  # only inside the trial's calls
    # bf16 needs no loss scaling: nothing to save.
    state = torch.load(f"{run.path}/state-dict.pth", map_location="cpu", weights_only=False)
    assert state["scaler_state_dict"] == []
    # The model kept fp32 weights and learned.
    assert run.trial.model.weight.dtype == torch.float32
    assert run.trial.losses[-1] < run.trial.losses[0]


def test_context_autocast_follows_use_amp() -> None:
    ctx = pytorch.PyTorchTrialContext({}, device="cpu")
    with ctx.autocast():
        assert not torch.is_autocast_enabled("cpu")
    ctx.experimental.use_amp()
    with ctx.autocast():
        assert torch.is_autocast_enabled("cpu")
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16
