"""The trivial trial of ``benchmarks/scheduler_overhead.py``: almost no work per batch.

``train_batch`` runs one SGD step of ``Linear(1, 1)`` on one number and then sleeps
``hparams.batch_sleep_s`` (0: no sleep), so a trial's time is the scheduler's and the engine's,
plus a known sleep. The Ray side of the benchmark runs the very same step in its
``tune.Trainable`` (``step_model``), so both sides train the same thing.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

from searchlab import pytorch


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(1, 1)


def step_model(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> torch.Tensor:
    """One SGD step on one number: what a batch of either side of the benchmark does."""
    opt.zero_grad(set_to_none=True)
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    return loss.detach()


class OverheadTrial(pytorch.PyTorchTrial):
    """One tiny SGD step and an optional sleep per batch; a constant validation metric."""

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        self.sleep_s = float(context.get_hparams().get("batch_sleep_s", 0.0))
        self.model = context.wrap_model(make_model())
        self.opt = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.01))

    def build_training_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(TensorDataset(torch.ones(64, 1)), batch_size=1)

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(TensorDataset(torch.ones(1, 1)), batch_size=1)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        (x,) = batch
        self.opt.zero_grad(set_to_none=True)
        loss = self.model(x).pow(2).mean()
        self.context.backward(loss)
        self.context.step_optimizer(self.opt)
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return {"loss": loss}

    def evaluate_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        return {"validation_loss": torch.tensor(float(self.context.get_hparam("x")))}
