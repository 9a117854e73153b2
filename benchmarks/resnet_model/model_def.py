"""ResNet-18 on CIFAR-shaped data as a searchlab trial, for the GPU benchmarks.

A model directory: Ray ships it to the trial workers, so it imports only searchlab, torch,
torchvision and its neighbour ``cifar_data``. The data are synthetic CIFAR-10 files (see
``cifar_data``), written once per machine where ``data.root`` of the experiment config says
(default: a folder in the temp directory).

Hyperparameters (all optional): ``global_batch_size`` (256), ``lr`` (0.1), ``momentum``
(0.9), ``weight_decay`` (5e-4), ``num_workers`` (4, per loader), ``amp`` (true: bf16
autocast through ``context.experimental.use_amp()``), ``channels_last`` (true),
``cudnn_benchmark`` (true). Data config: ``root``, ``n_train`` (50000), ``n_test`` (1024),
``seed`` (0), ``epoch_images`` (images per training epoch, repeating the ``n_train``
images when larger; default ``n_train``).

Besides ``loss``, each training report carries ``wall_time``: the ``time.time()`` at which
the report's window ended (after the loss values were copied off the GPU, so it marks
finished work). The benchmarks time trials with it.
"""

from __future__ import annotations

import pathlib
import tempfile
import time
from typing import Any

import torch
import torchvision
from cifar_data import CifarTensors, ensure_fake_cifar
from torch import nn

from searchlab import pytorch

__all__ = [
    "DATA_DEFAULTS",
    "HPARAM_DEFAULTS",
    "CifarInput",
    "CifarResNetTrial",
    "ReportGap",
    "WallClock",
    "make_model",
    "make_optimizer",
    "prepare_data",
]

HPARAM_DEFAULTS: dict[str, Any] = {
    "global_batch_size": 256,
    "lr": 0.1,
    "momentum": 0.9,
    "weight_decay": 5e-4,
    "num_workers": 4,
    "amp": True,
    "channels_last": True,
    "cudnn_benchmark": True,
}
DATA_DEFAULTS: dict[str, Any] = {
    "root": None,
    "n_train": 50_000,
    "n_test": 1024,
    "seed": 0,
    "epoch_images": None,
}
_MEAN = (0.4914, 0.4822, 0.4465)
_STD = (0.2470, 0.2435, 0.2616)


class CifarInput(nn.Module):
    """uint8 images to normalised floats, on the model's device (so workers stay cheap)."""

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, channels_last: bool) -> None:
        super().__init__()
        self.channels_last = channels_last
        self.register_buffer("mean", torch.tensor(_MEAN).view(1, 3, 1, 1) * 255)
        self.register_buffer("std", torch.tensor(_STD).view(1, 3, 1, 1) * 255)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = (x.float() - self.mean) / self.std
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return x


def make_model(channels_last: bool = True) -> nn.Module:
    """``CifarInput`` then ``torchvision.models.resnet18(num_classes=10)``."""
    model = nn.Sequential(CifarInput(channels_last), torchvision.models.resnet18(num_classes=10))
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model


def make_optimizer(model: nn.Module, hp: dict[str, Any]) -> torch.optim.Optimizer:
    return torch.optim.SGD(
        model.parameters(),
        lr=float(hp["lr"]),
        momentum=float(hp["momentum"]),
        weight_decay=float(hp["weight_decay"]),
    )


def prepare_data(data_conf: dict[str, Any]) -> pathlib.Path:
    """The synthetic CIFAR root of ``data_conf`` (written there first if missing)."""
    conf = {**DATA_DEFAULTS, **data_conf}
    n_train, n_test, seed = int(conf["n_train"]), int(conf["n_test"]), int(conf["seed"])
    root = conf["root"] or (
        pathlib.Path(tempfile.gettempdir()) / f"searchlab-fake-cifar-{n_train}-{n_test}-{seed}"
    )
    return ensure_fake_cifar(root, n_train, n_test, seed)


class WallClock(pytorch.MetricReducer):
    """A training metric whose value is the wall-clock time of the report."""

    def reset(self) -> None:
        pass

    def per_slot_reduce(self) -> float:
        return time.time()

    def cross_slot_reduce(self, per_slot_metrics: list[Any]) -> float:
        return float(max(per_slot_metrics))


class ReportGap(pytorch.MetricReducer):
    """Seconds this window's training waited between the previous report and its first batch:
    the report's way through Tune (or back to the caller) and the next call (0 at first)."""

    def __init__(self) -> None:
        self._reported_at: float | None = None
        self._waited = 0.0

    def reset(self) -> None:
        pass

    def batch_started(self) -> None:
        if self._reported_at is not None:
            self._waited += time.perf_counter() - self._reported_at
            self._reported_at = None

    def per_slot_reduce(self) -> float:
        waited, self._waited = self._waited, 0.0
        self._reported_at = time.perf_counter()
        return waited

    def cross_slot_reduce(self, per_slot_metrics: list[Any]) -> float:
        return float(max(per_slot_metrics))


class CifarResNetTrial(pytorch.PyTorchTrial):
    """ResNet-18, SGD with momentum, cross-entropy; bf16 autocast via ``use_amp()``."""

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        self.hp = {**HPARAM_DEFAULTS, **context.get_hparams()}
        if self.hp["amp"]:
            context.experimental.use_amp()
        torch.backends.cudnn.benchmark = bool(self.hp["cudnn_benchmark"])
        self.model = context.wrap_model(make_model(bool(self.hp["channels_last"])))
        self.opt = context.wrap_optimizer(make_optimizer(self.model, self.hp))
        context.wrap_reducer(WallClock(), name="wall_time", for_validation=False)
        self.report_gap = ReportGap()
        context.wrap_reducer(self.report_gap, name="report_gap_s", for_validation=False)
        self.root = prepare_data(context.get_data_config())
        epoch_images = context.get_data_config().get("epoch_images")
        self.epoch_images = int(epoch_images) if epoch_images else None

    def _loader(self, train: bool) -> pytorch.DataLoader:
        return pytorch.DataLoader(
            CifarTensors.load(self.root, train=train, length=self.epoch_images if train else None),
            batch_size=self.context.get_per_slot_batch_size(),
            shuffle=train,
            drop_last=train,
            num_workers=int(self.hp["num_workers"]) if train else 0,
            pin_memory=self.context.device.type == "cuda",
        )

    def build_training_data_loader(self) -> pytorch.DataLoader:
        return self._loader(train=True)

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        return self._loader(train=False)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        self.report_gap.batch_started()
        x, y = batch
        loss = nn.functional.cross_entropy(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.opt)
        return {"loss": loss}

    def evaluate_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        x, y = batch
        logits = self.model(x).float()
        return {
            "validation_loss": nn.functional.cross_entropy(logits, y),
            "accuracy": (logits.argmax(1) == y).float().mean(),
        }
