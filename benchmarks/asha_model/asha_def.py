"""The trial of ``vs_ray_asha.py``: one training step, run by searchlab and by Ray Tune alike.

A model directory (Ray ships it to the workers), importing only torch, torchvision and
searchlab. ``TrainStep`` holds everything both sides share: the model (ResNet-18 in
channels-last with bf16 autocast on CUDA, or a tiny CNN for ``--smoke``), SGD with momentum,
the data (one batch resident on the device, or a loader of CIFAR-shaped uint8 images with
workers and pinned memory) and a cheap validation. ``AshaTrial`` is the searchlab
``PyTorchTrial`` around it; ``_asha_sides.py`` (run by ``vs_ray_asha.py``) wraps the same
``TrainStep`` in a Ray Tune ``Trainable``. Each training report carries ``w_start``/``w_end`` (wall-clock time at the
window's first batch and after its last, synchronised) and ``gap_s`` (how long training
waited before the window: the report's way through the search and the next call).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from searchlab import pytorch


def _process_start() -> float:
    """When this process started, in ``time.time()`` seconds (NaN where /proc is missing)."""
    try:
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])  # field 22: starttime
            up = float(uptime.read().split()[0])
        return time.time() - (up - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return math.nan


PROCESS_START = _process_start()

MEAN = torch.tensor((0.4914, 0.4822, 0.4465)).view(1, 3, 1, 1) * 255
STD = torch.tensor((0.2470, 0.2435, 0.2616)).view(1, 3, 1, 1) * 255


class Normalise(nn.Module):
    def __init__(self, channels_last: bool) -> None:
        super().__init__()
        self.channels_last = channels_last
        self.register_buffer("mean", MEAN.clone())
        self.register_buffer("std", STD.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = (x.float() - self.mean) / self.std
        return x.contiguous(memory_format=torch.channels_last) if self.channels_last else x


def build_model(kind: str, device: torch.device) -> nn.Module:
    channels_last = device.type == "cuda"
    if kind == "resnet18":
        import torchvision

        body: nn.Module = torchvision.models.resnet18(num_classes=10)
    else:
        body = nn.Sequential(
            nn.Conv2d(3, 8, 3, stride=2),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(8, 10),
        )
    model = nn.Sequential(Normalise(channels_last), body).to(device)
    return model.to(memory_format=torch.channels_last) if channels_last else model


def images(n: int, seed: int, size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 images (a mean per class plus noise), CIFAR-shaped unless ``size`` says another
    side, and their labels."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (n,), generator=g)
    means = torch.randint(0, 256, (10, 3, 1, 1), generator=torch.Generator().manual_seed(99))
    noise = torch.randint(-60, 61, (n, 3, size, size), generator=g)
    return (means[labels] + noise).clamp(0, 255).to(torch.uint8), labels


class ImageSet(torch.utils.data.Dataset):
    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


class Window:
    """Times a report window: first batch start, end (synchronised) and the wait before it.

    Each window also carries when its process started and when its ``TrainStep`` was built,
    to split the time to a search's first batch.
    """

    def __init__(self, device: torch.device, step: TrainStep) -> None:
        self.device = device
        self.stamps = {
            "proc_start": PROCESS_START,
            "build_began": step.build_began,
            "built_at": step.built_at,
        }
        self.start: float | None = None
        self.reported_at: float | None = None
        self.gap = 0.0

    def batch_started(self) -> None:
        if self.start is None:
            self.start = time.time()
            if self.reported_at is not None:
                self.gap = time.perf_counter() - self.reported_at

    def close(self) -> dict[str, float]:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        out = {
            "w_start": float(self.start or time.time()),
            "w_end": time.time(),
            "gap_s": self.gap,
            "gpu": _gpu_index(),
            **self.stamps,
        }
        self.start, self.gap, self.reported_at = None, 0.0, time.perf_counter()
        return out


def _gpu_index() -> float:
    """The physical GPU this process trains on (-1: none or unknown), to tell GPUs apart."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return float(visible) if visible.isdigit() else -1.0


class TrainStep:
    """Model, optimizer, data and step that both sides run, given the hyperparameters."""

    def __init__(self, hp: dict[str, Any], device: torch.device, seed: int) -> None:
        self.build_began = time.time()
        torch.manual_seed(seed)
        self.hp, self.device = hp, device
        self.amp = device.type == "cuda"
        if self.amp:
            torch.backends.cudnn.benchmark = True
        self.model = build_model(str(hp.get("model", "resnet18")), device)
        # What training calls: the model, or its data-parallel wrapper on several GPUs.
        # Validation calls the bare model, so one rank can validate without the others.
        self.forward_model: nn.Module = self.model
        self.opt = torch.optim.SGD(
            self.model.parameters(), lr=float(hp["lr"]), momentum=0.9, weight_decay=5e-4
        )
        self.batch = int(hp.get("batch", 256))
        # 32 (CIFAR) by default; larger images give the GPU more work per kernel launch.
        self.size = int(hp.get("image_size", 32))
        x, y = images(self.batch, seed=1, size=self.size)
        self.resident = (x.to(device), y.to(device))
        vx, vy = images(self.batch, seed=2, size=self.size)
        self.val = (vx.to(device), vy.to(device))
        self.built_at = time.time()

    def loader_kwargs(self) -> dict[str, Any]:
        resident = self.hp.get("data", "resident") == "resident"
        return {
            "batch_size": self.batch,
            "shuffle": not resident,  # a resident batch's loader yields indices only
            "drop_last": True,
            "num_workers": int(self.hp.get("num_workers", 4)),
            "pin_memory": self.device.type == "cuda",
            "persistent_workers": int(self.hp.get("num_workers", 4)) > 0,
        }

    def dataset(self) -> torch.utils.data.Dataset:
        if self.hp.get("data", "resident") == "resident":
            return _Indices(int(self.hp.get("epoch_batches", 1_000)) * self.batch)
        return ImageSet(*images(int(self.hp.get("n_train", 8192)), seed=3, size=self.size))

    def inputs(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if self.hp.get("data", "resident") == "resident":
            return self.resident
        x, y = batch
        return x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)

    def loss(
        self, x: torch.Tensor, y: torch.Tensor, model: nn.Module | None = None
    ) -> torch.Tensor:
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.amp):
            return nn.functional.cross_entropy((model or self.forward_model)(x), y)

    def train_step(self, batch: Any) -> torch.Tensor:
        """One optimizer step of the hand-written loop on ``batch``; its loss (detached)."""
        loss = self.loss(*self.inputs(batch))
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return loss.detach()

    def train_window(self, batches: Iterator[Any], window: Window, n: int) -> float:
        """Train ``n`` batches from ``batches`` (Ray's sides; searchlab's trial steps one at a
        time); the window's mean loss."""
        losses = []
        for _ in range(n):
            batch = next(batches)
            window.batch_started()
            losses.append(self.train_step(batch))
        return float(torch.stack(losses).float().mean())

    @torch.no_grad()
    def validate(self) -> float:
        self.model.eval()
        loss = float(self.loss(*self.val, model=self.model))
        self.model.train()
        return loss


def train_rate(step: TrainStep, batches: Iterator[Any], n: int) -> float:
    """Batches per second of ``n`` steps of the hand-written loop (``step``'s model and
    optimizer on ``batches``), between two synchronisations: the solo rate of
    ``vs_ray_asha.py`` and the blocks of ``write_overlap.py``."""
    cuda = step.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
    began = time.perf_counter()
    for _ in range(n):
        step.train_step(next(batches))
    if cuda:
        torch.cuda.synchronize()
    return n / (time.perf_counter() - began)


class _Indices(torch.utils.data.Dataset):
    """A resident batch's loader: indices only (the step reads the batch on the device)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


class WindowTimes(pytorch.MetricReducer):
    """``w_start``/``w_end``/``gap_s`` of each training report, as one reduced dict."""

    def __init__(self, window: Window) -> None:
        self.window = window

    def reset(self) -> None:
        pass

    def per_slot_reduce(self) -> dict[str, float]:
        return self.window.close()

    def cross_slot_reduce(self, per_slot_metrics: list[Any]) -> dict[str, float]:
        return dict(per_slot_metrics[0])


class AshaTrial(pytorch.PyTorchTrial):
    """``TrainStep`` as a searchlab trial (autocast inside the step, as on the Ray side)."""

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        hp = context.get_hparams()
        self.step = TrainStep(hp, context.device, seed=context.get_trial_seed() % 2**31)
        self.model = context.wrap_model(self.step.model)  # DDP on several slots
        self.step.forward_model = self.model
        self.opt = context.wrap_optimizer(self.step.opt)
        self.slots = context.distributed.size
        self.window = Window(context.device, self.step)
        context.wrap_reducer(WindowTimes(self.window), name=None, for_validation=False)
        context.experimental.disable_auto_to_device()

    def build_training_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(self.step.dataset(), **self.step.loader_kwargs())

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(_Indices(self.slots), batch_size=1)  # a batch per rank

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        self.window.batch_started()
        loss = self.step.loss(*self.step.inputs(batch))
        self.context.backward(loss)
        self.context.step_optimizer(self.opt)
        return {"loss": loss}

    def evaluate_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        return {"validation_loss": self.step.validate()}
