"""Samplers that make data order reproducible, shardable and resumable.

These are the building blocks ``searchlab.pytorch.DataLoader`` uses; they are public, as in
Determined, for users who assemble their own loaders.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sized

import torch
from torch.utils.data import Sampler

__all__ = [
    "DistributedSampler",
    "EpochSampler",
    "RepeatSampler",
    "ReproducibleShuffleSampler",
    "SkipSampler",
]


class ReproducibleShuffleSampler(Sampler[int]):
    """A shuffle whose order depends only on ``seed`` and the epoch, never on global RNG.

    Example:
        >>> s = ReproducibleShuffleSampler(range(10), seed=3); s.set_epoch(1); order = list(s)
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


class SkipSampler(Sampler[int]):
    """Skips the first ``skip`` items of another sampler (used to resume mid-epoch)."""

    def __init__(self, sampler: Sampler[int], skip: int) -> None:
        self._sampler = sampler
        self._skip = skip

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(iter(self._sampler), self._skip, None)

    def __len__(self) -> int:
        return max(len(self._sampler) - self._skip, 0)  # type: ignore[arg-type]


class RepeatSampler(Sampler[int]):
    """Repeats another sampler forever, calling ``set_epoch`` on it when it has one."""

    def __init__(self, sampler: Sampler[int]) -> None:
        self._sampler = sampler

    def __iter__(self) -> Iterator[int]:
        epoch = 0
        while True:
            if hasattr(self._sampler, "set_epoch"):
                self._sampler.set_epoch(epoch)
            yield from self._sampler
            epoch += 1


class DistributedSampler(Sampler[int]):
    """The ``rank``-th of ``num_replicas`` interleaved shards of another sampler's order.

    With ``pad=True`` (training) every shard has the same length, repeating the first
    indices, so that all workers take the same number of steps.
    """

    def __init__(
        self, sampler: Sampler[int], num_replicas: int, rank: int, pad: bool = True
    ) -> None:
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank is {rank}, but must be in [0, {num_replicas})")
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
    """

    def __init__(
        self, base: Sampler[int], num_replicas: int = 1, rank: int = 0, pad: bool = True
    ) -> None:
        self._base = base
        self._shard: Sampler[int] = (
            DistributedSampler(base, num_replicas, rank, pad) if num_replicas > 1 else base
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
