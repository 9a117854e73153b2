"""A Determined 0.38-style training script: a PyTorchTrial trained by the Trainer API.

Written as Determined's tutorial writes it (``det.get_cluster_info()``, ``pytorch.init()``,
``Trainer.fit(max_length=..., latest_checkpoint=info.latest_checkpoint)``), with only the import
changed. The model is one weight ``w`` (starting at 0) fitted to ``y = 2x`` by SGD with
momentum, so the weight after any number of batches is one exact sequence of numbers; each
validation reports it (``weight``).

Run by hand (no trial): ``python train.py --batches 8`` trains locally.
"""

import argparse
import logging

import torch
from torch.utils.data import TensorDataset

import searchlab as det
from searchlab import pytorch


class LinearTrial(pytorch.PyTorchTrial):
    def __init__(self, context: pytorch.PyTorchTrialContext, hparams: dict) -> None:
        self.context = context
        self.model = context.wrap_model(torch.nn.Linear(1, 1, bias=False))
        with torch.no_grad():
            self.model.weight.zero_()
        self.optimizer = context.wrap_optimizer(
            torch.optim.SGD(self.model.parameters(), lr=hparams["lr"], momentum=0.9)
        )
        if hparams.get("invalid"):
            raise det.InvalidHP("this learning rate is not allowed")

    def build_training_data_loader(self) -> pytorch.DataLoader:
        xs = torch.linspace(0.1, 1.6, 16).reshape(-1, 1)
        data = TensorDataset(xs, 2 * xs)
        return pytorch.DataLoader(data, batch_size=self.context.get_per_slot_batch_size())

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        xs = torch.tensor([[1.0], [2.0]])
        return pytorch.DataLoader(TensorDataset(xs, 2 * xs), batch_size=2)

    def train_batch(self, batch, epoch_idx: int, batch_idx: int) -> dict:
        x, y = batch
        loss = ((self.model(x) - y) ** 2).mean()
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        return {"loss": loss}

    def evaluate_batch(self, batch, batch_idx: int) -> dict:
        x, y = batch
        return {
            "validation_loss": ((self.model(x) - y) ** 2).mean().item(),
            "weight": self.model.weight.item(),
        }


def main() -> None:
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=16)
    parser.add_argument("--validate-every", type=int, default=100)
    args = parser.parse_args()
    info = det.get_cluster_info()
    if info is None:
        hparams, latest_checkpoint = {"lr": 0.05, "global_batch_size": 4}, None
    else:
        hparams, latest_checkpoint = info.trial.hparams, info.latest_checkpoint
        # One line per run of the script, for the tests to count runs and resumes.
        print(f"run {info.trial._trial_run_id} from {latest_checkpoint}", flush=True)
    with pytorch.init(hparams=hparams) as train_context:
        trial = LinearTrial(train_context, hparams)
        trainer = pytorch.Trainer(trial, train_context)
        trainer.fit(
            max_length=pytorch.Batch(args.batches),
            latest_checkpoint=latest_checkpoint,
            validation_period=pytorch.Batch(args.validate_every),
        )


if __name__ == "__main__":
    main()
