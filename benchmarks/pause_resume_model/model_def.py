"""The trial of ``benchmarks/pause_resume.py``: a small MLP or a ResNet-18 on random data.

Every training batch reports ``step_start``, the wall clock when the batch began, so the
benchmark can see when training really went on after a resume. Every validation reports the
same loss: with results tied, ASHA resumes the paused trial when the second one reports, which
makes the pause/resume sequence of the benchmark the same on every run.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

from searchlab import pytorch


def _build_model(name: str) -> nn.Module:
    if name == "small":
        return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    if name == "resnet18":
        import torchvision

        return torchvision.models.resnet18(num_classes=10)
    raise ValueError(f"hyperparameter model is {name!r}, but must be 'small' or 'resnet18'")


def _dataset(name: str, n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    shape = (n, 8) if name == "small" else (n, 3, 32, 32)
    classes = 2 if name == "small" else 10
    return TensorDataset(
        torch.randn(*shape, generator=g), torch.randint(0, classes, (n,), generator=g)
    )


class PauseResumeTrial(pytorch.PyTorchTrial):
    """SGD with momentum, so the optimizer state is as large as the weights."""

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        self.name = str(context.get_hparams()["model"])
        self.model = context.wrap_model(_build_model(self.name))
        self.opt = context.wrap_optimizer(
            torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        )

    def build_training_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(
            _dataset(self.name, 64, seed=0),
            batch_size=self.context.get_per_slot_batch_size(),
            shuffle=True,
        )

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(_dataset(self.name, 8, seed=1), batch_size=8)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        step_start = time.time()
        x, y = batch
        loss = nn.functional.cross_entropy(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.opt)
        return {"loss": loss, "step_start": step_start}

    def evaluate_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        return {"validation_loss": torch.tensor(1.0)}
