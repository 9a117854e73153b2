"""``searchlab.pytorch.samplers``: Determined's samplers with its signatures, lengths and orders,
``adapt_batch_sampler``, ``data_length`` and ``DataLoader.get_data_loader(repeat=True)``."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import BatchSampler, SequentialSampler, TensorDataset

from searchlab import pytorch
from searchlab.errors import TrialDefinitionError
from searchlab.pytorch import samplers

TEN = SequentialSampler(range(10))


def _take(iterable: Any, n: int) -> list[Any]:
    return list(itertools.islice(iter(iterable), n))


def _batches(n: int, size: int) -> BatchSampler:
    return BatchSampler(SequentialSampler(range(n)), size, drop_last=False)


def test_repeat_samplers_cycle_forever_with_one_pass_as_length() -> None:
    repeat = samplers.RepeatSampler(SequentialSampler(range(3)))
    assert len(repeat) == 3
    assert _take(repeat, 7) == [0, 1, 2, 0, 1, 2, 0]
    batches = samplers.RepeatBatchSampler(_batches(5, 2))
    assert len(batches) == 3
    assert _take(batches, 4) == [[0, 1], [2, 3], [4], [0, 1]]


def test_distributed_sampler_takes_every_nth_item_without_padding() -> None:
    shards = [samplers.DistributedSampler(TEN, num_workers=3, rank=r) for r in range(3)]
    assert [list(s) for s in shards] == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    assert [len(s) for s in shards] == [4, 3, 3]
    assert list(samplers.DistributedSampler(TEN, num_workers=1, rank=0)) == list(range(10))
    with pytest.raises(TrialDefinitionError, match=r"rank is 3, but must be in \[0, 3\)"):
        samplers.DistributedSampler(TEN, num_workers=3, rank=3)


def test_distributed_batch_sampler_shards_whole_batches() -> None:
    base = _batches(10, 3)  # [0, 1, 2], [3, 4, 5], [6, 7, 8], [9]
    shards = [samplers.DistributedBatchSampler(base, num_workers=3, rank=r) for r in range(3)]
    assert [list(s) for s in shards] == [[[0, 1, 2], [9]], [[3, 4, 5]], [[6, 7, 8]]]
    assert [len(s) for s in shards] == [2, 1, 1]
    for workers, rank, message in [
        (2, 2, r"rank is 2, but must be in \[0, 2\)"),
        (2, -1, r"rank is -1, but must be in \[0, 2\)"),
        (0, 0, r"num_workers is 0, but must be >= 1"),
    ]:
        with pytest.raises(ValueError, match=message):  # a ValueError, as in Determined
            samplers.DistributedBatchSampler(base, num_workers=workers, rank=rank)


def test_skip_samplers_skip_once_and_report_the_underlying_length() -> None:
    skip = samplers.SkipSampler(TEN, 7)
    assert list(skip) == [7, 8, 9] and len(skip) == 10
    assert list(samplers.SkipSampler(TEN, 12)) == []
    skip_batches = samplers.SkipBatchSampler(_batches(10, 3), 2)
    assert list(skip_batches) == [[6, 7, 8], [9]] and len(skip_batches) == 4
    assert skip_batches.length == 4 and skip_batches.skip == 2
    # Skip before repeat: the skip applies to the first pass only.
    assert _take(samplers.RepeatSampler(samplers.SkipSampler(TEN, 8)), 4) == [8, 9, 8, 9]
    assert _take(samplers.SkipSampler(samplers.RepeatSampler(TEN), 8), 4) == [8, 9, 0, 1]


def test_reproducible_shuffle_is_numpys_random_state_stream() -> None:
    s = samplers.ReproducibleShuffleSampler(SequentialSampler(range(5)), seed=0)
    assert len(s) == 5
    first, second = list(s), list(s)
    assert first == [2, 0, 1, 3, 4]  # np.random.RandomState(0).shuffle([0, 1, 2, 3, 4])
    rng, expected = np.random.RandomState(0), []
    for _ in range(2):
        order = list(range(5))
        rng.shuffle(order)
        expected.append(order)
    assert [first, second] == expected  # each pass continues the stream
    again = samplers.ReproducibleShuffleSampler(SequentialSampler(range(5)), seed=0)
    np.random.seed(123)  # the global RNG plays no part
    assert list(again) == first
    batches = samplers.ReproducibleShuffleBatchSampler(_batches(6, 2), seed=0)
    assert list(batches) == [[4, 5], [2, 3], [0, 1]] and len(batches) == 3


def test_adapt_batch_sampler_repeats_then_shards_then_skips() -> None:
    adapted = pytorch.adapt_batch_sampler(
        _batches(10, 2), repeat=True, skip=1, num_replicas=2, rank=1
    )
    # The repeated stream's batches 1, 3, 5, 7, ... are rank 1's; the first of them is skipped.
    assert _take(adapted, 5) == [[6, 7], [0, 1], [4, 5], [8, 9], [2, 3]]
    assert len(adapted) == 2
    plain = pytorch.adapt_batch_sampler(_batches(4, 2))
    assert list(plain) == [[0, 1], [2, 3]]


def test_data_length_is_the_first_arrays_length() -> None:
    x = torch.zeros(6, 3)
    assert pytorch.data_length(x) == 6
    assert pytorch.data_length(np.zeros((4, 2))) == 4
    assert pytorch.data_length({"x": torch.zeros(5), "y": torch.zeros(9)}) == 5
    assert pytorch.data_length([torch.zeros(2), torch.zeros(7)]) == 2
    assert pytorch.data_length((np.zeros(3),)) == 3
    with pytest.raises(ValueError, match=r"data_length\(\) got an empty dict; it needs at least"):
        pytorch.data_length({})
    with pytest.raises(TypeError, match=r"data_length\(\) got int; pass an ndarray, a tensor"):
        pytorch.data_length(3)


DATA = TensorDataset(torch.arange(10))


def _ids(batches: Any) -> list[list[int]]:
    return [[int(i) for i in x] for (x,) in batches]


def test_get_data_loader_repeats_epochs_as_the_trainer_orders_them() -> None:
    loader = pytorch.DataLoader(DATA, batch_size=4)
    torch_loader = loader.get_data_loader(repeat=True)
    assert len(torch_loader) == 3  # one epoch, as Determined's RepeatBatchSampler reports
    assert _ids(_take(torch_loader, 5)) == [
        [0, 1, 2, 3],
        [4, 5, 6, 7],
        [8, 9],
        [0, 1, 2, 3],
        [4, 5, 6, 7],
    ]
    skipped = loader.get_data_loader(repeat=True, skip=2)
    assert _ids(_take(skipped, 2)) == [[8, 9], [0, 1, 2, 3]]  # the skip applies once
    shuffled = pytorch.DataLoader(DATA, batch_size=5, shuffle=True)
    stream = [i for b in _ids(_take(shuffled.get_data_loader(repeat=True), 4)) for i in b]
    epochs = shuffled.build(seed=0)
    expected = [i for e in (0, 1) for b in _ids(epochs.loader_for(e)) for i in b]
    assert stream == expected and stream[:10] != stream[10:]  # each epoch its own order
    assert _ids(iter(loader)) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]  # iter: epoch 0
