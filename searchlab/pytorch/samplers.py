"""Samplers, as ``determined.pytorch.samplers``, and the ones searchlab's DataLoader uses.

The Determined samplers keep Determined's signatures, lengths and orders, for users who assemble
their own loaders (e.g. an ``IterableDataset`` after
``context.experimental.disable_dataset_reproducibility_checks()``): shuffle, then skip, then
repeat, as Determined's documentation says. ``EpochShuffleSampler`` and ``EpochSampler`` are
searchlab's own: an order chosen by (seed, epoch), so a resumed trial never iterates past the
batches it already trained on.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sized
from typing import Any

import numpy as np
import torch
from torch.utils.data import BatchSampler, Sampler

from searchlab.pytorch._errors import TrialValueError

__all__ = [
    "DistributedBatchSampler",
    "DistributedSampler",
    "EpochSampler",
    "EpochShuffleSampler",
    "RepeatBatchSampler",
    "RepeatSampler",
    "ReproducibleShuffleBatchSampler",
    "ReproducibleShuffleSampler",
    "SkipBatchSampler",
    "SkipSampler",
]


def _check_shard(num_workers: int, rank: int) -> None:
    if num_workers < 1:
        raise TrialValueError(f"num_workers is {num_workers}, but must be >= 1")
    if not 0 <= rank < num_workers:
        raise TrialValueError(f"rank is {rank}, but must be in [0, {num_workers})")


class RepeatSampler(Sampler[Any]):
    """Iterates another sampler again and again, forever; ``len`` is one pass's length.

    Example:
        >>> it = iter(RepeatSampler(SequentialSampler(range(2))))
        >>> [next(it) for _ in range(5)]
        [0, 1, 0, 1, 0]
    """

    def __init__(self, sampler: Sampler[Any]) -> None:
        self._sampler = sampler

    def __len__(self) -> int:
        return len(self._sampler)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        while True:
            yield from self._sampler


class RepeatBatchSampler(BatchSampler):
    """Iterates another batch sampler's batches forever; ``len`` is one pass's length.

    Example:
        >>> batches = RepeatBatchSampler(BatchSampler(SequentialSampler(range(3)), 2, False))
        >>> it = iter(batches); [next(it) for _ in range(3)]
        [[0, 1], [2], [0, 1]]
    """

    def __init__(self, batch_sampler: BatchSampler) -> None:
        self.batch_sampler = batch_sampler

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def __iter__(self) -> Iterator[list[int]]:
        while True:
            yield from self.batch_sampler


class DistributedSampler(Sampler[Any]):
    """The items of another sampler that belong to shard ``rank`` of ``num_workers`` (every
    ``num_workers``-th item from ``rank``), unlike torch's standalone one: no shuffle, no padding.

    Example:
        >>> list(DistributedSampler(SequentialSampler(range(7)), num_workers=3, rank=1))
        [1, 4]
    """

    def __init__(self, sampler: Sampler[Any], num_workers: int, rank: int) -> None:
        _check_shard(num_workers, rank)
        self._sampler = sampler
        self._num_workers = num_workers
        self._rank = rank

    def __len__(self) -> int:
        n = len(self._sampler)  # type: ignore[arg-type]
        return n // self._num_workers + int(n % self._num_workers > self._rank)

    def __iter__(self) -> Iterator[Any]:
        if self._num_workers == 1:
            yield from self._sampler
            return
        for i, item in enumerate(self._sampler):
            if i % self._num_workers == self._rank:
                yield item


class DistributedBatchSampler(BatchSampler):
    """The batches of another batch sampler that belong to shard ``rank`` of ``num_workers``.

    Example:
        >>> base = BatchSampler(SequentialSampler(range(10)), 2, False)
        >>> list(DistributedBatchSampler(base, num_workers=2, rank=1))
        [[2, 3], [6, 7]]
    """

    def __init__(self, batch_sampler: BatchSampler, num_workers: int, rank: int) -> None:
        _check_shard(num_workers, rank)
        self.batch_sampler = batch_sampler
        self.num_workers = num_workers
        self.rank = rank

    def __len__(self) -> int:
        n = len(self.batch_sampler)
        return n // self.num_workers + int(n % self.num_workers > self.rank)

    def __iter__(self) -> Iterator[list[int]]:
        if self.num_workers == 1:
            yield from self.batch_sampler
            return
        for i, batch in enumerate(self.batch_sampler):
            if i % self.num_workers == self.rank:
                yield batch


def _skip(iterable: Any, skip: int) -> Iterator[Any]:
    return itertools.islice(iter(iterable), skip, None)


class SkipSampler(Sampler[Any]):
    """Skips the first ``skip`` items of another sampler. Skip before you repeat.

    ``len`` is the underlying sampler's, whatever the skip, as in Determined (the skip applies
    once, to a repeated training sampler).

    Example:
        >>> s = SkipSampler(SequentialSampler(range(5)), 2); list(s), len(s)
        ([2, 3, 4], 5)
    """

    def __init__(self, sampler: Sampler[Any], skip: int) -> None:
        self._sampler = sampler
        self._skip = skip

    def __len__(self) -> int:
        return len(self._sampler)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        return _skip(self._sampler, self._skip)


class SkipBatchSampler(BatchSampler):
    """Skips the first ``skip`` batches of another batch sampler; ``len`` is the underlying one's.

    Example:
        >>> base = BatchSampler(SequentialSampler(range(6)), 2, False)
        >>> list(SkipBatchSampler(base, 1))
        [[2, 3], [4, 5]]
    """

    def __init__(self, batch_sampler: BatchSampler, skip: int) -> None:
        self.batch_sampler = batch_sampler
        self.skip = skip
        self.length = len(batch_sampler)

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def __iter__(self) -> Iterator[list[int]]:
        return _skip(self.batch_sampler, self.skip)


class ReproducibleShuffleSampler(Sampler[Any]):
    """Shuffles another sampler's items with ``np.random.RandomState(seed)``.

    Each pass continues the same random stream, so successive passes differ but the sequence
    of passes is the same in every run. Shuffle before skipping and before repeating.

    Example:
        >>> s = ReproducibleShuffleSampler(SequentialSampler(range(5)), seed=0)
        >>> list(s)  # np.random.RandomState(0).shuffle([0, 1, 2, 3, 4])
        [2, 0, 1, 3, 4]
    """

    def __init__(self, sampler: Sampler[Any], seed: int) -> None:
        self._sampler = sampler
        self._rng = np.random.RandomState(seed)

    def __iter__(self) -> Iterator[Any]:
        indices = list(self._sampler)
        self._rng.shuffle(indices)
        return iter(indices)

    def __len__(self) -> int:
        return len(self._sampler)  # type: ignore[arg-type]


class ReproducibleShuffleBatchSampler(BatchSampler):
    """Shuffles the order of another batch sampler's batches with ``RandomState(seed)``.

    Prefer :class:`ReproducibleShuffleSampler`: shuffling records also varies batch contents.

    Example:
        >>> base = BatchSampler(SequentialSampler(range(6)), 2, False)
        >>> list(ReproducibleShuffleBatchSampler(base, seed=0))
        [[4, 5], [2, 3], [0, 1]]
    """

    def __init__(self, batch_sampler: BatchSampler, seed: int) -> None:
        self._batch_sampler = batch_sampler
        self._rng = np.random.RandomState(seed)

    def __iter__(self) -> Iterator[list[int]]:
        batches = list(self._batch_sampler)
        self._rng.shuffle(batches)
        return iter(batches)

    def __len__(self) -> int:
        return len(self._batch_sampler)


class EpochShuffleSampler(Sampler[int]):
    """searchlab's shuffle: the order of ``range(len(data_source))`` for ``(seed, epoch)`` only.

    Any epoch's order can be made without the ones before it, and the global RNGs are never
    touched; this is the order of ``DataLoader(shuffle=True)``.

    Example:
        >>> s = EpochShuffleSampler(range(10), seed=3); s.set_epoch(1); order = list(s)
    """

    def __init__(self, data_source: Sized, seed: int) -> None:
        self._n = len(data_source)
        self._seed = seed
        self._epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self._epoch = epoch

    def __iter__(self) -> Iterator[int]:
        gen = torch.Generator()
        gen.manual_seed(self._seed * 1_000_003 + self._epoch)
        return iter(torch.randperm(self._n, generator=gen).tolist())

    def __len__(self) -> int:
        return self._n


class _PaddedShard(Sampler[int]):
    """Shard ``rank`` of ``num_replicas`` interleaved shards; with ``pad`` (training) every shard
    has the same length, repeating the first indices, so all workers take the same steps."""

    def __init__(self, sampler: Sampler[int], num_replicas: int, rank: int, pad: bool) -> None:
        _check_shard(num_replicas, rank)
        self._sampler = sampler
        self._num_replicas = num_replicas
        self._rank = rank
        self._pad = pad

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self._sampler, "set_epoch"):
            self._sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        indices = list(self._sampler)
        if self._pad and indices:
            total = math.ceil(len(indices) / self._num_replicas) * self._num_replicas
            while len(indices) < total:
                indices += indices[: total - len(indices)]
        return iter(indices[self._rank :: self._num_replicas])

    def __len__(self) -> int:
        n = len(self._sampler)  # type: ignore[arg-type]
        if self._pad:
            return math.ceil(n / self._num_replicas)
        return len(range(self._rank, n, self._num_replicas))


class EpochSampler(Sampler[int]):
    """The sampler searchlab's ``DataLoader`` trains with: per-epoch order, shard, skip.

    Validation shards are not padded (``pad=False``), so no record is counted twice.
    ``set_position(epoch, skip)`` selects the epoch's order (a reproducible shuffle or the
    dataset order) and skips the first ``skip`` indices of this worker's shard.

    Example:
        >>> s = EpochSampler(EpochShuffleSampler(range(8), seed=1), num_replicas=2, rank=0)
        >>> s.set_position(epoch=2, skip=1); len(s)
        3
    """

    def __init__(
        self, base: Sampler[int], num_replicas: int = 1, rank: int = 0, pad: bool = True
    ) -> None:
        self._base = base
        self._shard: Sampler[int] = (
            _PaddedShard(base, num_replicas, rank, pad) if num_replicas > 1 else base
        )
        self._skip = 0

    def set_position(self, epoch: int, skip: int) -> None:
        if hasattr(self._shard, "set_epoch"):
            self._shard.set_epoch(epoch)
        self._skip = skip

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(iter(self._shard), self._skip, None)

    def __len__(self) -> int:
        return max(len(self._shard) - self._skip, 0)  # type: ignore[arg-type]
