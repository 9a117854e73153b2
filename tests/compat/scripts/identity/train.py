"""Gradient aggregation across workers, on the identity model of Determined's harness tests.

``w * x`` with ``w`` starting at 0 and the loss ``mean(w * x)``: the gradient of a worker's
batch is the mean of its ``x``, and data-parallel training averages it over the workers, so
each update moves ``w`` by ``-lr`` times the mean ``x`` of the global batch. The records are
``x = 1..8`` in global batches of 4 (means 2.5 and 6.5). Each rank prints its weights as JSON.

Run by hand under the launcher:
    python3 -m searchlab.launch.torch_distributed --nproc_per_node 2 -- python3 train.py
"""

import argparse
import json
import tempfile

import torch
from torch.utils.data import TensorDataset

from searchlab import pytorch


class IdentityTrial(pytorch.PyTorchTrial):
    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        self.model = context.wrap_model(torch.nn.Linear(1, 1, bias=False))
        with torch.no_grad():
            self.model.weight.zero_()
        self.opt = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.1))
        self.weights = []

    def build_training_data_loader(self) -> pytorch.DataLoader:
        data = TensorDataset(torch.arange(1.0, 9.0).unsqueeze(1))
        return pytorch.DataLoader(data, batch_size=self.context.get_per_slot_batch_size())

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        return pytorch.DataLoader(TensorDataset(torch.ones(2, 1)), batch_size=2)

    def train_batch(self, batch, epoch_idx: int, batch_idx: int) -> dict:
        (x,) = batch
        loss = self.model(x).mean()
        self.context.backward(loss)
        self.context.step_optimizer(self.opt)
        self.weights.append(self.model.weight.item())  # DDP forwards .weight to the module
        return {"loss": loss}

    def evaluate_batch(self, batch, batch_idx: int) -> dict:
        return {"validation_loss": abs(self.model.weight.item())}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--aggregation", type=int, default=1)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory() as checkpoints,
        pytorch.init(
            hparams={"global_batch_size": 4},
            aggregation_frequency=args.aggregation,
            checkpoint_dir=checkpoints,
        ) as context,
    ):
        trial = IdentityTrial(context)
        pytorch.Trainer(trial, context).fit(max_length=pytorch.Batch(args.batches))
        rank, size = context.distributed.get_rank(), context.distributed.get_size()
        print(json.dumps({"rank": rank, "size": size, "weights": trial.weights}), flush=True)


if __name__ == "__main__":
    main()
