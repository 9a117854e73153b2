"""One loader across epochs: its worker processes start once per run, the order stays exact."""

from __future__ import annotations

import os
from typing import Any

import torch
from api_trials import LinearTrial, train
from torch.utils.data import BatchSampler, Dataset, SequentialSampler

from searchlab import pytorch
from searchlab.pytorch import Batch


class _WhoLoaded(Dataset[Any]):
    """Item ``i`` of a regression set, with the id of the process that loaded it."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 3, generator=g)
        self.y = torch.randn(n, 1, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int, int]:
        return self.x[i], self.y[i], i, os.getpid()


class _WorkerTrial(LinearTrial):
    """``LinearTrial`` on ``_WhoLoaded`` with 2 loader workers; notes each batch's indices and
    the processes that loaded them. ``user_sampler``: a ``batch_sampler`` of the user's own."""

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        super().__init__(context)
        self.seen: list[list[int]] = []
        self.loaders: set[int] = set()

    def build_training_data_loader(self) -> pytorch.DataLoader:
        data = _WhoLoaded(12)
        size = self.context.get_per_slot_batch_size()
        if self.hp.get("user_sampler"):
            batches = BatchSampler(SequentialSampler(data), size, drop_last=False)
            return pytorch.DataLoader(data, batch_sampler=batches, num_workers=2)
        return pytorch.DataLoader(data, batch_size=size, shuffle=True, num_workers=2)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        x, y, index, pid = batch
        self.seen.append([int(i) for i in index])
        self.loaders.update(int(p) for p in pid)
        return super().train_batch((x, y), epoch_idx, batch_idx)


HP = {"global_batch_size": 4}  # 3 batches per epoch


def test_one_loader_serves_every_epoch_of_a_run(tmp_path) -> None:
    run = train(tmp_path, HP, trial_cls=_WorkerTrial, max_length=Batch(9))  # 3 epochs
    assert len(run.trial.seen) == 9
    assert len(run.trial.loaders) == 2  # the same 2 workers for the 3 epochs
    assert os.getpid() not in run.trial.loaders
    epochs = [sorted(i for b in run.trial.seen[e * 3 : e * 3 + 3] for i in b) for e in range(3)]
    assert epochs == [list(range(12))] * 3
    assert run.trial.seen[:3] != run.trial.seen[3:6]  # reshuffled per epoch


def test_a_user_batch_sampler_keeps_a_loader_per_epoch(tmp_path) -> None:
    # Its iteration may draw from the global RNG when an epoch starts: a loader that fetches
    # ahead across the epoch's end would draw it earlier than an epoch's own loader does.
    run = train(tmp_path, {**HP, "user_sampler": True}, trial_cls=_WorkerTrial, max_length=Batch(6))
    assert run.trial.seen == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]] * 2
    assert len(run.trial.loaders) == 4  # 2 workers in each of the 2 epochs


def test_resumed_anywhere_the_batches_are_the_uninterrupted_ones(tmp_path) -> None:
    whole = train(tmp_path / "whole", HP, trial_cls=_WorkerTrial, max_length=Batch(9))
    for pause in (2, 3, 4, 7):  # mid-epoch, at an epoch's end, just after, in the last epoch
        first = train(tmp_path / f"a{pause}", HP, trial_cls=_WorkerTrial, max_length=Batch(pause))
        rest = train(
            tmp_path / f"b{pause}",
            HP,
            trial_cls=_WorkerTrial,
            max_length=Batch(9),
            latest_checkpoint=first.path,
        )
        assert first.trial.seen + rest.trial.seen == whole.trial.seen, pause
        assert torch.equal(rest.trial.weights[-1], whole.trial.weights[-1]), pause


def test_a_repeating_torch_loader_skips_across_epochs() -> None:
    data = torch.utils.data.TensorDataset(torch.arange(10))
    loader = pytorch.DataLoader(data, batch_size=3, shuffle=True)
    epochs = loader.build(seed=0)
    order = [[int(i) for i in b] for e in range(3) for (b,) in epochs.loader_for(e)]
    repeating = loader.get_data_loader(repeat=True, skip=5)  # into the second epoch
    got = [[int(i) for i in b] for (b,), _ in zip(repeating, range(6))]
    assert got == order[5:11]
    assert len(repeating) == len(epochs) == 4
