"""Samplers and ``DataLoader``: reproducible, shardable, resumable data order."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from api_trials import LinearTrial, train
from torch.utils.data import IterableDataset, RandomSampler, SequentialSampler, TensorDataset

from searchlab import pytorch
from searchlab.errors import TrialDefinitionError
from searchlab.pytorch import Batch, samplers


def test_epoch_shuffle_depends_on_seed_and_epoch_only() -> None:
    s = samplers.EpochShuffleSampler(range(20), seed=3)
    epoch0 = list(s)
    torch.manual_seed(123)  # the global RNG plays no part
    assert list(s) == epoch0
    assert sorted(epoch0) == list(range(20)) and epoch0 != list(range(20))
    s.set_epoch(1)
    assert list(s) != epoch0 and sorted(s) == list(range(20))
    other = samplers.EpochShuffleSampler(range(20), seed=4)
    assert list(other) != epoch0
    state = torch.get_rng_state()
    list(s)
    assert torch.equal(torch.get_rng_state(), state)


def test_epoch_sampler_shards_interleave_and_pad() -> None:
    base = SequentialSampler(range(10))
    padded = [samplers.EpochSampler(base, 3, r) for r in range(3)]
    assert [list(s) for s in padded] == [[0, 3, 6, 9], [1, 4, 7, 0], [2, 5, 8, 1]]
    assert [len(s) for s in padded] == [4, 4, 4]  # every worker takes the same steps
    unpadded = [samplers.EpochSampler(base, 3, r, pad=False) for r in range(3)]
    assert [list(s) for s in unpadded] == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    assert [len(s) for s in unpadded] == [4, 3, 3]
    with pytest.raises(TrialDefinitionError, match=r"rank is 3, but must be in \[0, 3\)"):
        samplers.EpochSampler(base, 3, 3)


def test_epoch_sampler_selects_epoch_and_skips() -> None:
    base = samplers.EpochShuffleSampler(range(8), seed=1)
    s = samplers.EpochSampler(base)
    s.set_position(2, 3)
    base.set_epoch(2)
    assert list(s) == list(base)[3:] and len(s) == 5


def _epoch_loader(loader: pytorch.DataLoader, seed: int = 5):
    return loader.build(seed=seed)


def _records(torch_loader: Any) -> list[int]:
    return [int(i) for (x,) in torch_loader for i in x]


DATA = TensorDataset(torch.arange(10))


def test_data_loader_epochs_are_reproducible_and_resumable() -> None:
    epochs = _epoch_loader(pytorch.DataLoader(DATA, batch_size=3, shuffle=True))
    assert len(epochs) == 4
    e0, e1 = _records(epochs.loader_for(0)), _records(epochs.loader_for(1))
    assert sorted(e0) == sorted(e1) == list(range(10)) and e0 != e1
    assert _records(epochs.loader_for(1, skip_batches=2)) == e1[6:]
    again = _epoch_loader(pytorch.DataLoader(DATA, batch_size=3, shuffle=True))
    assert _records(again.loader_for(1)) == e1
    assert _records(_epoch_loader(pytorch.DataLoader(DATA, batch_size=3)).loader_for(0)) == list(
        range(10)
    )
    dropped = _epoch_loader(pytorch.DataLoader(DATA, batch_size=3, drop_last=True))
    assert len(dropped) == 3 and len(pytorch.DataLoader(DATA, batch_size=3)) == 4


def test_data_loader_shards_by_rank() -> None:
    loader = pytorch.DataLoader(DATA, batch_size=2, shuffle=True)
    shards = [_records(loader.build(seed=0, num_replicas=2, rank=r).loader_for(0)) for r in (0, 1)]
    assert sorted(shards[0] + shards[1]) == list(range(10))
    whole = _records(loader.build(seed=0).loader_for(0))
    assert shards[0] == whole[0::2] and shards[1] == whole[1::2]


class IdTrial(LinearTrial):
    """Trains on records with ids; a user's RandomSampler as the training order."""

    def build_training_data_loader(self) -> pytorch.DataLoader:
        data = TensorDataset(torch.arange(12.0).unsqueeze(1).repeat(1, 3), torch.zeros(12, 1))
        return pytorch.DataLoader(data, batch_size=4, sampler=RandomSampler(data))

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        self.ids = getattr(self, "ids", [])
        self.ids += [int(v) for v in batch[0][:, 0]]
        return super().train_batch(batch, epoch_idx, batch_idx)


def test_a_users_random_sampler_resumes_in_the_same_order(tmp_path) -> None:
    hp = {"global_batch_size": 4}
    whole = train(tmp_path / "w", hp, trial_cls=IdTrial, max_length=Batch(7))
    first = train(tmp_path / "a", hp, trial_cls=IdTrial, max_length=Batch(4))
    second = train(
        tmp_path / "b", hp, trial_cls=IdTrial, max_length=Batch(7), latest_checkpoint=first.path
    )
    assert first.trial.ids + second.trial.ids == whole.trial.ids
    epochs = [whole.trial.ids[i : i + 12] for i in (0, 12)]
    assert sorted(epochs[0]) == list(range(12)) and epochs[1][:4] != epochs[0][:4]


class _Stream(IterableDataset):
    def __iter__(self):
        return iter(range(3))


def test_data_loader_argument_errors() -> None:
    # TrialDefinitionErrors (the experiment stops with one line), and still the builtin
    # errors Determined raised, for code that catches those.
    with pytest.raises(TrialDefinitionError, match=r"needs a map-style dataset .* got _Stream"):
        pytorch.DataLoader(_Stream())
    with pytest.raises(TypeError, match=r"DataLoader needs a map-style dataset"):
        pytorch.DataLoader(_Stream())
    with pytest.raises(TrialDefinitionError, match="batch_sampler is mutually exclusive"):
        pytorch.DataLoader(DATA, batch_size=2, batch_sampler=[[0, 1]])
    with pytest.raises(ValueError, match="sampler is mutually exclusive with shuffle; shuffle"):
        pytorch.DataLoader(DATA, sampler=SequentialSampler(DATA), shuffle=True)
    with pytest.raises(TrialDefinitionError, match="batch_size=None is not supported"):
        pytorch.DataLoader(DATA, batch_size=None)


def test_get_data_loader_gives_a_torch_loader() -> None:
    loader = pytorch.DataLoader(DATA, batch_size=4).get_data_loader(skip=1)
    assert isinstance(loader, torch.utils.data.DataLoader)
    assert _records(loader) == list(range(4, 10))
