"""Training loaders with workers: one loader across epochs with ``persistent_workers``, a fresh
one per epoch without; either way, batches and their random augmentations resume exactly."""

from __future__ import annotations

import itertools
import os
import random
from typing import Any

import numpy as np
import pytest
import torch
from api_trials import LinearTrial, train
from torch.utils.data import BatchSampler, Dataset, RandomSampler, SequentialSampler

from searchlab import pytorch
from searchlab.pytorch import Batch


class _WhoLoaded(Dataset[Any]):
    """Item ``i`` of a regression set, augmented with noise from torch, NumPy and ``random``
    in the process that loads it, and that process's id."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 3, generator=g)
        self.y = torch.randn(n, 1, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int, int]:
        noise = 0.1 * torch.randn(3) + float(np.random.rand()) + random.random()
        return self.x[i] + noise, self.y[i], i, os.getpid()


class _WorkerTrial(LinearTrial):
    """``LinearTrial`` on ``_WhoLoaded``; notes each batch's indices and the processes that
    loaded them. Hyperparameters: ``workers`` (2), ``persistent`` (True), ``user_sampler``
    (a ``batch_sampler`` of the user's own)."""

    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        super().__init__(context)
        self.seen: list[list[int]] = []
        self.loaders: set[int] = set()

    def build_training_data_loader(self) -> pytorch.DataLoader:
        data = _WhoLoaded(12)
        size = self.context.get_per_slot_batch_size()
        workers = {
            "num_workers": int(self.hp.get("workers", 2)),
            "persistent_workers": bool(self.hp.get("persistent", True)),
        }
        if self.hp.get("user_sampler"):
            batches = BatchSampler(SequentialSampler(data), size, drop_last=False)
            return pytorch.DataLoader(data, batch_sampler=batches, **workers)
        return pytorch.DataLoader(data, batch_size=size, shuffle=True, **workers)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        x, y, index, pid = batch
        self.seen.append([int(i) for i in index])
        self.loaders.update(int(p) for p in pid)
        return super().train_batch((x, y), epoch_idx, batch_idx)


HP = {"global_batch_size": 4}  # 3 batches per epoch


def test_persistent_workers_serve_every_epoch_of_a_run(tmp_path) -> None:
    run = train(tmp_path, HP, trial_cls=_WorkerTrial, max_length=Batch(9))  # 3 epochs
    assert len(run.trial.seen) == 9
    assert len(run.trial.loaders) == 2  # the same 2 workers for the 3 epochs
    assert os.getpid() not in run.trial.loaders
    epochs = [sorted(i for b in run.trial.seen[e * 3 : e * 3 + 3] for i in b) for e in range(3)]
    assert epochs == [list(range(12))] * 3
    assert run.trial.seen[:3] != run.trial.seen[3:6]  # reshuffled per epoch


def test_without_persistent_workers_each_epoch_starts_its_own(tmp_path) -> None:
    # As torch's own loop: a new iteration of a loader without persistent workers starts new
    # workers, which copy the dataset as the trial left it at the epoch's start.
    hp = {**HP, "persistent": False}
    run = train(tmp_path, hp, trial_cls=_WorkerTrial, max_length=Batch(9))
    assert len(run.trial.loaders) == 6
    persistent = train(tmp_path / "p", HP, trial_cls=_WorkerTrial, max_length=Batch(9))
    assert run.trial.seen == persistent.trial.seen
    assert torch.equal(run.trial.weights[-1], persistent.trial.weights[-1])


def test_a_user_batch_sampler_keeps_a_loader_per_epoch(tmp_path) -> None:
    # Its iteration may draw from the global RNG when an epoch starts: a loader that fetches
    # ahead across the epoch's end would draw it earlier than an epoch's own loader does.
    run = train(tmp_path, {**HP, "user_sampler": True}, trial_cls=_WorkerTrial, max_length=Batch(6))
    assert run.trial.seen == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]] * 2
    assert len(run.trial.loaders) == 4  # 2 workers in each of the 2 epochs


@pytest.mark.parametrize("persistent", [True, False])
def test_resumed_anywhere_batches_and_augmentations_are_the_uninterrupted_ones(
    tmp_path, persistent
) -> None:
    hp = {**HP, "persistent": persistent}
    whole = train(tmp_path / "whole", hp, trial_cls=_WorkerTrial, max_length=Batch(9))
    for pause in (1, 2, 3, 4, 7):  # mid-epoch, at an epoch's end, just after, the last epoch
        first = train(tmp_path / f"a{pause}", hp, trial_cls=_WorkerTrial, max_length=Batch(pause))
        rest = train(
            tmp_path / f"b{pause}",
            hp,
            trial_cls=_WorkerTrial,
            max_length=Batch(9),
            latest_checkpoint=first.path,
        )
        assert first.trial.seen + rest.trial.seen == whole.trial.seen, pause
        # The noise each batch got in its worker is the same: so are the weights.
        assert torch.equal(rest.trial.weights[-1], whole.trial.weights[-1]), pause


def test_a_batch_gets_the_same_augmentation_whichever_worker_loads_it(tmp_path) -> None:
    one = train(tmp_path / "1", {**HP, "workers": 1}, trial_cls=_WorkerTrial, max_length=Batch(6))
    two = train(tmp_path / "2", HP, trial_cls=_WorkerTrial, max_length=Batch(6))
    assert one.trial.seen == two.trial.seen
    assert torch.equal(one.trial.weights[-1], two.trial.weights[-1])


def test_a_repeating_torch_loader_skips_across_epochs() -> None:
    data = torch.utils.data.TensorDataset(torch.arange(10))
    loader = pytorch.DataLoader(data, batch_size=3, shuffle=True)
    epochs = loader.build(seed=0)
    order = [[int(i) for i in b] for e in range(3) for (b,) in epochs.loader_for(e)]
    repeating = loader.get_data_loader(repeat=True, skip=5)  # into the second epoch
    got = [[int(i) for i in b] for (b,), _ in zip(repeating, range(6))]
    assert got == order[5:11]
    assert len(repeating) == len(epochs) == 4


def test_a_repeating_loader_with_a_stateful_user_sampler_goes_through_the_skipped_epochs() -> None:
    # The sampler's generator runs on from epoch to epoch: epoch 2's order exists only after
    # epochs 0 and 1 were drawn.
    def loader() -> pytorch.DataLoader:
        data = torch.utils.data.TensorDataset(torch.arange(9))
        sampler = RandomSampler(data, generator=torch.Generator().manual_seed(1))
        return pytorch.DataLoader(data, batch_sampler=BatchSampler(sampler, 3, False))

    def take(torch_loader: Any, n: int) -> list[list[int]]:
        return [[int(i) for i in b] for (b,) in itertools.islice(torch_loader, n)]

    whole = take(loader().get_data_loader(repeat=True), 10)
    assert whole[6:9] != whole[0:3]  # epochs differ
    for skip in (2, 3, 7):
        assert take(loader().get_data_loader(repeat=True, skip=skip), 3) == whole[skip : skip + 3]


def test_a_users_random_sampler_is_reseeded_by_every_build() -> None:
    # ``len(loader)`` in build_training_data_loader (to size a schedule) builds it first.
    data = torch.utils.data.TensorDataset(torch.arange(10))
    loader = pytorch.DataLoader(data, batch_size=3, sampler=RandomSampler(data))
    assert len(loader) == 4
    epochs = loader.build(seed=5)
    assert epochs.stateless
    torch.manual_seed(0)
    first = [[int(i) for i in b] for (b,) in epochs.loader_for(1)]
    torch.manual_seed(123)
    again = [[int(i) for i in b] for (b,) in loader.build(seed=5).loader_for(1)]
    assert again == first


def _indices(batches: Any, n: int) -> list[list[int]]:
    return [list(b) for b in itertools.islice(iter(batches), n)]


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("replicas", [1, 2])
def test_an_epoch_is_handed_out_as_asked_with_its_order_fixed_at_its_first_batch(
    monkeypatch: pytest.MonkeyPatch, shuffle: bool, replicas: int
) -> None:
    from searchlab.pytorch import samplers
    from searchlab.pytorch._data import _EpochsFrom

    data = torch.utils.data.TensorDataset(torch.arange(1000))
    loader = pytorch.DataLoader(data, batch_size=10, shuffle=shuffle, drop_last=True)
    epochs = loader.build(seed=3, num_replicas=replicas, rank=replicas - 1)
    per_epoch = len(epochs)
    # The order drawn all at once, epoch by epoch (what a resumed run must reproduce).
    whole = [list(b) for e in range(3) for b in list(epochs.batches_of(e))]
    assert len(whole) == 3 * per_epoch

    pulled = []  # indices taken from the epoch's sampler so far
    fixed_iter = samplers.EpochSampler.__iter__

    def counting(self: Any) -> Any:
        for i in fixed_iter(self):
            pulled.append(i)
            yield i

    monkeypatch.setattr(samplers.EpochSampler, "__iter__", counting)
    stream = iter(_EpochsFrom(epochs, 0, 7))
    got = _indices(stream, 2)
    assert len(pulled) <= 3 * 10  # not the epoch's 1000 / replicas
    # Another epoch's position and generator set meanwhile do not move this epoch's order.
    list(epochs.batches_of(2, 4))
    got += _indices(stream, per_epoch - 7 - 2 + per_epoch + 3)
    assert got == whole[7 : 7 + len(got)]


def test_a_users_sampler_on_searchlabs_generator_still_draws_each_epoch_at_once() -> None:
    from searchlab.pytorch._data import _EpochsFrom

    data = torch.utils.data.TensorDataset(torch.arange(50))
    sampler = RandomSampler(data, replacement=True, num_samples=50)
    loader = pytorch.DataLoader(data, batch_size=5, sampler=sampler)
    epochs = loader.build(seed=1)
    assert not epochs.order_fixed_at_start  # it draws from the generator as it goes
    whole = [list(b) for e in range(2) for b in list(epochs.batches_of(e))]
    stream = iter(_EpochsFrom(epochs, 0, 0))
    got = _indices(stream, 3)
    list(epochs.batches_of(1, 2))  # reseeds the shared generator
    got += _indices(stream, 12)
    assert got == whole[:15]
