"""Each ``LRScheduler.StepMode``: when the trainer steps a wrapped scheduler, with ``frequency``.

The trials use a StepLR that halves the LR per step, so the LR a batch trains with tells how
many scheduler steps came before it: ``lr = 0.1 * 0.5 ** steps``.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from api_trials import regression_data, train
from torch import nn

from searchlab import pytorch
from searchlab.pytorch import Batch, LRScheduler


def steps_seen(lrs: list[float]) -> list[int]:
    return [round(math.log2(0.1 / lr)) for lr in lrs]


@pytest.mark.parametrize(
    ("mode", "frequency", "expected"),
    [
        # epochs of 4 batches: one step after each epoch (every 2nd epoch with frequency 2)
        ("STEP_EVERY_EPOCH", 1, [b // 4 for b in range(10)]),
        ("STEP_EVERY_EPOCH", 2, [b // 8 for b in range(10)]),
        ("STEP_EVERY_BATCH", 1, list(range(10))),
        ("STEP_EVERY_BATCH", 3, [b // 3 for b in range(10)]),
        ("STEP_EVERY_OPTIMIZER_STEP", 1, list(range(10))),
        ("STEP_EVERY_OPTIMIZER_STEP", 4, [b // 4 for b in range(10)]),
        ("MANUAL_STEP", 1, [0] * 10),
    ],
)
def test_step_mode_steps_scheduler_at_its_events(tmp_path, mode, frequency, expected) -> None:
    hp = {"global_batch_size": 4, "n_train": 16, "step_mode": mode, "frequency": frequency}
    run = train(tmp_path, hp, max_length=Batch(10))
    assert steps_seen(run.trial.lrs) == expected


def test_manual_step_is_stepped_only_by_the_trial(tmp_path) -> None:
    hp = {"global_batch_size": 4, "step_mode": "MANUAL_STEP", "manual_every": 3}
    run = train(tmp_path, hp, max_length=Batch(10))
    # The trial steps after batches 2, 5 and 8; the trainer never does.
    assert steps_seen(run.trial.lrs) == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3]


def test_optimizer_step_mode_counts_accumulated_updates_only(tmp_path) -> None:
    hp = {"global_batch_size": 4, "step_mode": "STEP_EVERY_OPTIMIZER_STEP", "passes": 2}
    run = train(tmp_path, hp, max_length=Batch(8))
    # The optimizer steps after batches 1, 3, 5, 7.
    assert steps_seen(run.trial.lrs) == [0, 0, 1, 1, 2, 2, 3, 3]


def test_batch_step_mode_under_accumulation_catches_up_as_determined(tmp_path) -> None:
    hp = {"global_batch_size": 4, "step_mode": "STEP_EVERY_BATCH", "passes": 2}
    run = train(tmp_path, hp, max_length=Batch(8))
    # Steps happen with the update, two at a time: an update uses its first batch's LR.
    assert steps_seen(run.trial.lrs) == [0, 0, 2, 2, 4, 4, 6, 6]


def test_frequency_phase_survives_a_resume(tmp_path) -> None:
    hp = {"global_batch_size": 4, "step_mode": "STEP_EVERY_BATCH", "frequency": 3}
    whole = train(tmp_path / "whole", hp, max_length=Batch(10))
    first = train(tmp_path / "first", hp, max_length=Batch(5))
    second = train(tmp_path / "second", hp, max_length=Batch(10), latest_checkpoint=first.path)
    assert steps_seen(first.trial.lrs + second.trial.lrs) == steps_seen(whole.trial.lrs)
    assert second.trial.sched.last_epoch == whole.trial.sched.last_epoch == 3


class TwoOptimizerTrial(pytorch.PyTorchTrial):
    """Two models; ``opt_a`` steps every batch, ``opt_b`` every other batch (as in a GAN)."""

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        self.a = context.wrap_model(nn.Linear(3, 1))
        self.b = context.wrap_model(nn.Linear(3, 1))
        self.opt_a = context.wrap_optimizer(torch.optim.SGD(self.a.parameters(), lr=0.1))
        self.opt_b = context.wrap_optimizer(torch.optim.SGD(self.b.parameters(), lr=0.1))
        mode = LRScheduler.StepMode.STEP_EVERY_OPTIMIZER_STEP
        self.sched_a = context.wrap_lr_scheduler(
            torch.optim.lr_scheduler.StepLR(self.opt_a, 1, gamma=0.5), mode
        )
        self.sched_b = context.wrap_lr_scheduler(
            torch.optim.lr_scheduler.StepLR(self.opt_b, 1, gamma=0.5), mode
        )
        self.lrs: list[tuple[float, float]] = []

    def build_training_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(regression_data(16), batch_size=4)

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(regression_data(4), batch_size=4)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        x, y = batch
        self.lrs.append((self.opt_a.param_groups[0]["lr"], self.opt_b.param_groups[0]["lr"]))
        loss_a = nn.functional.mse_loss(self.a(x), y)
        self.context.backward(loss_a)
        self.context.step_optimizer(self.opt_a)
        if batch_idx % 2 == 1:
            loss_b = nn.functional.mse_loss(self.b(x), y)
            self.context.backward(loss_b)
            self.context.step_optimizer(self.opt_b)
        return {"loss": loss_a}

    def evaluate_batch(self, batch: Any) -> dict[str, Any]:
        x, y = batch
        return {"validation_loss": nn.functional.mse_loss(self.a(x), y)}


def test_each_scheduler_follows_its_own_optimizer(tmp_path) -> None:
    run = train(tmp_path, {"global_batch_size": 4}, trial_cls=TwoOptimizerTrial, max_length=6)
    a = steps_seen([lr for lr, _ in run.trial.lrs])
    b = steps_seen([lr for _, lr in run.trial.lrs])
    assert a == [0, 1, 2, 3, 4, 5]
    assert b == [0, 0, 1, 1, 2, 2]


def test_wrapped_scheduler_delegates_to_torch_scheduler(tmp_path) -> None:
    run = train(tmp_path, {"global_batch_size": 4, "step_mode": "STEP_EVERY_EPOCH"}, max_length=8)
    sched = run.trial.sched
    assert isinstance(sched.scheduler, torch.optim.lr_scheduler.StepLR)
    assert sched.last_epoch == 2  # attribute of the torch scheduler
    assert sched.get_last_lr() == [pytest.approx(0.025)]


def test_invalid_step_mode_and_frequency_are_rejected() -> None:
    opt = torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    with pytest.raises(ValueError, match="step_mode is 'STEP_EVERY_EPOCH', but must be one of"):
        LRScheduler(sched, "STEP_EVERY_EPOCH")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="frequency is 0, but must be >= 1"):
        LRScheduler(sched, LRScheduler.StepMode.STEP_EVERY_BATCH, frequency=0)
