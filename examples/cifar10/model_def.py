"""A small CNN on CIFAR-10, written as a Determined `PyTorchTrial` for searchlab.

The shape of Determined's `cifar10_pytorch` example: four 3x3 convolutions in two blocks,
each block ending in max pooling and dropout, then a dense layer, trained with RMSprop.
Apart from the import (`from searchlab import pytorch` instead of
`from determined import pytorch`) this is the code a Determined user writes.

Run a search over it with `searchlab run examples/cifar10/adaptive.yaml`, or train once in
this process with `python examples/cifar10/model_def.py` (add `--offline` without internet).
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

# 32x32 input: block 1 (padded conv, unpadded conv: 30, pool: 15), block 2 (15, 13, pool: 6).
_FLAT_FEATURES = 64 * 6 * 6


class CIFARTrial(pytorch.PyTorchTrial):
    """Four convolutions and two dense layers, trained with RMSprop.

    Hyperparameters: `learning_rate`, `learning_rate_decay` (RMSprop's weight decay),
    `layer1_dropout`, `layer2_dropout` (after each convolution block), `layer3_dropout`
    (before the last layer) and `global_batch_size`.

    Example:
        >>> with pytorch.init(hparams=hparams, exp_conf=config) as context:
        ...     trial = CIFARTrial(context)
        ...     pytorch.Trainer(trial, context).fit(max_length=pytorch.Batch(100))
    """

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        self.model = context.wrap_model(
            nn.Sequential(
                nn.Conv2d(3, 32, kernel_size=3, padding=1),
                nn.ReLU(),
                nn.Conv2d(32, 32, kernel_size=3),
                nn.ReLU(),
                nn.MaxPool2d(2),
                nn.Dropout(context.get_hparam("layer1_dropout")),
                nn.Conv2d(32, 64, kernel_size=3, padding=1),
                nn.ReLU(),
                nn.Conv2d(64, 64, kernel_size=3),
                nn.ReLU(),
                nn.MaxPool2d(2),
                nn.Dropout(context.get_hparam("layer2_dropout")),
                nn.Flatten(),
                nn.Linear(_FLAT_FEATURES, 512),
                nn.ReLU(),
                nn.Dropout(context.get_hparam("layer3_dropout")),
                nn.Linear(512, len(data.LABEL_NAMES)),
            )
        )
        self.optimizer = context.wrap_optimizer(
            torch.optim.RMSprop(
                self.model.parameters(),
                lr=context.get_hparam("learning_rate"),
                weight_decay=context.get_hparam("learning_rate_decay"),
                alpha=0.9,
            )
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
        loss = nn.functional.cross_entropy(output, labels)
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        return {"loss": loss, "train_error": 1.0 - _accuracy(output, labels)}

    def evaluate_batch(self, batch: pytorch.TorchData) -> dict[str, Any]:
        images, labels = cast(tuple[torch.Tensor, torch.Tensor], batch)
        output = self.model(images)
        accuracy = _accuracy(output, labels)
        return {
            "validation_loss": nn.functional.cross_entropy(output, labels).item(),
            "validation_accuracy": accuracy,
            "validation_error": 1.0 - accuracy,
        }


def _accuracy(logits: torch.Tensor, labels: torch.Tensor) -> float:
    return logits.argmax(dim=1).eq(labels).float().mean().item()


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
        trial = CIFARTrial(context)
        pytorch.Trainer(trial, context).fit(
            max_length=pytorch.Batch(100), validation_period=pytorch.Batch(50)
        )


if __name__ == "__main__":
    main()
