"""A small CNN on MNIST, written as a Determined `PyTorchTrial` for searchlab.

Apart from the import (`from searchlab import pytorch` instead of
`from determined import pytorch`) this is the code a Determined user writes:
`__init__` wraps the model, optimizer and LR scheduler with the trial context,
the two `build_*_data_loader` methods return `pytorch.DataLoader`s, and
`train_batch` / `evaluate_batch` run one batch. Batches arrive already on the
trial's device.

Run a search over it with `searchlab run examples/mnist/grid.yaml`, or train once in
this process with `python examples/mnist/model_def.py` (add `--offline` without internet).
"""

from __future__ import annotations

import argparse
import pathlib
from typing import Any, cast

import data
import torch
import yaml
from torch import nn

from searchlab import pytorch

# Relative `data.data_dir` paths in the experiment config start here.
MODEL_DIR = pathlib.Path(__file__).resolve().parent

# 28x28 input, two unpadded 3x3 convolutions (26, then 24), 2x2 max pooling: 12x12.
_POOLED_PIXELS = 12 * 12


class MNistTrial(pytorch.PyTorchTrial):
    """Two convolutions and two dense layers, trained with Adadelta.

    Hyperparameters: `learning_rate` (Adadelta's lr, decayed by 0.7 each epoch),
    `n_filters1`, `n_filters2` (convolution widths), `dropout1`, `dropout2`, and
    `global_batch_size`.

    Example:
        >>> with pytorch.init(hparams=hparams, exp_conf=config) as context:
        ...     trial = MNistTrial(context)
        ...     pytorch.Trainer(trial, context).fit(max_length=pytorch.Batch(100))
    """

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        n_filters1 = context.get_hparam("n_filters1")
        n_filters2 = context.get_hparam("n_filters2")
        self.model = context.wrap_model(
            nn.Sequential(
                nn.Conv2d(1, n_filters1, kernel_size=3, stride=1),
                nn.ReLU(),
                nn.Conv2d(n_filters1, n_filters2, kernel_size=3, stride=1),
                nn.ReLU(),
                nn.MaxPool2d(2),
                nn.Dropout(context.get_hparam("dropout1")),
                nn.Flatten(),
                nn.Linear(_POOLED_PIXELS * n_filters2, 128),
                nn.ReLU(),
                nn.Dropout(context.get_hparam("dropout2")),
                nn.Linear(128, 10),
                nn.LogSoftmax(dim=1),
            )
        )
        self.optimizer = context.wrap_optimizer(
            torch.optim.Adadelta(self.model.parameters(), lr=context.get_hparam("learning_rate"))
        )
        self.lr_sched = context.wrap_lr_scheduler(
            torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=1, gamma=0.7),
            step_mode=pytorch.LRScheduler.StepMode.STEP_EVERY_EPOCH,
        )

    def build_training_data_loader(self) -> pytorch.DataLoader:
        dataset = data.build_dataset(self.context.get_data_config(), MODEL_DIR, train=True)
        return pytorch.DataLoader(
            dataset, batch_size=self.context.get_per_slot_batch_size(), shuffle=True
        )

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        dataset = data.build_dataset(self.context.get_data_config(), MODEL_DIR, train=False)
        return pytorch.DataLoader(dataset, batch_size=self.context.get_per_slot_batch_size())

    def train_batch(
        self, batch: pytorch.TorchData, epoch_idx: int, batch_idx: int
    ) -> dict[str, Any]:
        images, labels = cast(tuple[torch.Tensor, torch.Tensor], batch)
        output = self.model(images)
        loss = nn.functional.nll_loss(output, labels)
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        return {"loss": loss, "train_error": 1.0 - _accuracy(output, labels)}

    def evaluate_batch(self, batch: pytorch.TorchData) -> dict[str, Any]:
        images, labels = cast(tuple[torch.Tensor, torch.Tensor], batch)
        output = self.model(images)
        return {
            "validation_loss": nn.functional.nll_loss(output, labels).item(),
            "accuracy": _accuracy(output, labels),
        }


def _accuracy(log_probs: torch.Tensor, labels: torch.Tensor) -> float:
    return log_probs.argmax(dim=1).eq(labels).float().mean().item()


def main() -> None:
    """Trains the trial once in this process, with the hyperparameters of const.yaml."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument(
        "--offline", action="store_true", help="train on the generated stand-in (no download)"
    )
    args = parser.parse_args()
    config = yaml.safe_load((MODEL_DIR / "const.yaml").read_text())
    config["data"]["offline"] = args.offline
    with pytorch.init(hparams=config["hyperparameters"], exp_conf=config) as context:
        trial = MNistTrial(context)
        pytorch.Trainer(trial, context).fit(
            max_length=pytorch.Batch(100), validation_period=pytorch.Batch(50)
        )


if __name__ == "__main__":
    main()
