"""Determined-style trial fixtures whose results can be worked out by hand.

``OneVarTrial``: one weight ``w`` (starting at 0) and the loss ``mean(w * x)``, so the
gradient of a batch is the mean of its ``x`` and plain SGD moves ``w`` by ``-lr * mean(x)``.
The training records are ``x = 1..8`` in batches of 2 (no shuffling): the batch gradients are
1.5, 3.5, 5.5, 7.5, then again from the start (an epoch is 4 batches). Hyperparameters pick
the LR schedule's step mode, gradient clipping and momentum.

``CounterCallback`` counts every hook call.
"""

from __future__ import annotations

import collections
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

from searchlab import pytorch

BATCH_GRADIENTS = [1.5, 3.5, 5.5, 7.5]  # mean x of each training batch of an epoch
VALIDATION_BATCH_MEANS = [1.5, 3.5, 5.5, 7.5]


def gradient(batch: int) -> float:
    """The gradient of training batch ``batch`` (0-based, counting across epochs)."""
    return BATCH_GRADIENTS[batch % 4]


class CounterCallback(pytorch.PyTorchCallback):
    """Counts each hook; remembers the epochs and checkpoint uuids it was given."""

    def __init__(self) -> None:
        self.calls: collections.Counter[str] = collections.Counter()
        self.epochs_started: list[int] = []
        self.workload_batches: list[int] = []

    def on_trial_startup(self, first_batch_idx: int, checkpoint_uuid: str | None) -> None:
        self.calls["on_trial_startup"] += 1

    def on_trial_shutdown(self) -> None:
        self.calls["on_trial_shutdown"] += 1

    def on_training_start(self) -> None:
        self.calls["on_training_start"] += 1

    def on_training_epoch_start(self, epoch_idx: int) -> None:
        self.calls["on_training_epoch_start"] += 1
        self.epochs_started.append(epoch_idx)

    def on_training_epoch_end(self, epoch_idx: int) -> None:
        self.calls["on_training_epoch_end"] += 1

    def on_training_workload_end(self, avg_metrics: dict, batch_metrics: list) -> None:
        self.calls["on_training_workload_end"] += 1
        self.workload_batches.append(len(batch_metrics))

    def on_validation_start(self) -> None:
        self.calls["on_validation_start"] += 1

    def on_validation_end(self, metrics: dict[str, Any]) -> None:
        self.calls["on_validation_end"] += 1

    def on_checkpoint_save_start(self, checkpoint: dict[str, Any]) -> None:
        self.calls["on_checkpoint_save_start"] += 1

    def on_checkpoint_end(self, checkpoint_dir: str) -> None:
        self.calls["on_checkpoint_end"] += 1

    def state_dict(self) -> dict[str, Any]:
        return {"calls": dict(self.calls)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.calls = collections.Counter(state_dict["calls"])


class OneVarTrial(pytorch.PyTorchTrial):
    """``w`` fitted by SGD on ``mean(w * x)``; see the module docstring."""

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        self.model = context.wrap_model(nn.Linear(1, 1, bias=False))
        with torch.no_grad():
            self.model.weight.zero_()
        self.opt = context.wrap_optimizer(
            torch.optim.SGD(
                self.model.parameters(),
                lr=context.get_hparam("lr"),
                momentum=context.get_hparams().get("momentum", 0.0),
            )
        )
        mode = context.get_hparams().get("step_mode")
        if mode is not None:
            self.sched = context.wrap_lr_scheduler(
                torch.optim.lr_scheduler.StepLR(self.opt, step_size=1, gamma=0.5),
                step_mode=pytorch.LRScheduler.StepMode[mode],
            )
        self.callback = CounterCallback()
        self.weights: list[float] = []  # w after each batch

    def build_callbacks(self) -> dict[str, pytorch.PyTorchCallback]:
        return {"counter": self.callback}

    def build_training_data_loader(self) -> pytorch.DataLoader:
        xs = torch.arange(1.0, 9.0).unsqueeze(1)
        return pytorch.DataLoader(
            TensorDataset(xs), batch_size=self.context.get_per_slot_batch_size()
        )

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(TensorDataset(torch.arange(1.0, 9.0).unsqueeze(1)), batch_size=2)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        (x,) = batch
        loss = (self.model(x)).mean()
        self.context.backward(loss)
        clip = self.context.get_hparams().get("clip")
        self.context.step_optimizer(
            self.opt,
            clip_grads=(lambda params: nn.utils.clip_grad_norm_(params, clip)) if clip else None,
        )
        self.weights.append(self.model.weight.item())
        return {"loss": loss}

    def evaluate_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        (x,) = batch
        m = x.mean().item()
        return {"validation_loss": abs(self.model.weight.item()), "m": m}


def weight(trial: OneVarTrial) -> float:
    return trial.model.weight.item()
