"""Loader workers' random numbers drawn from each batch's place in the run, not from the worker.

A random transform in a loader worker (a crop, a flip, noise) draws from that worker's RNGs.
torch seeds them once per worker, and hands batches to workers in turn from wherever the
loader started, so after a resume the same batch meets another worker in another state: the
resumed run's augmentations, and so its weights, differ from the uninterrupted run's. Here
each training batch carries a seed made from the trial seed, the rank, the epoch and the
batch's index in the epoch, and the worker seeds torch, ``random`` and NumPy with it before
fetching the batch. So a batch's random numbers are the same however many workers there are,
whichever worker fetches it, and wherever the run was paused. Only worker processes reseed: a
loader without workers draws from the trainer's own RNGs, which checkpoints restore.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, get_worker_info

__all__ = ["SeedPerBatch", "SeededBatch", "batch_seed", "seeded_batches"]


class SeededBatch(list):  # type: ignore[type-arg]
    """A batch of dataset indices, with the seed its loader worker draws from."""

    def __init__(self, indices: Iterable[int], seed: int) -> None:
        super().__init__(indices)
        self.seed = seed


_MASK = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    """SplitMix64's output function: a well-mixed 64-bit value of ``x``."""
    z = (x + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def batch_seed(trial_seed: int, rank: int, epoch: int, index: int) -> int:
    """The seed of batch ``index`` of ``epoch`` on ``rank`` (64 bits, well mixed; ~2 us, on
    the trainer's thread for every batch, where NumPy's ``SeedSequence`` took ~25 us)."""
    seed = _splitmix64(trial_seed & _MASK)
    for part in (rank, epoch, index):
        seed = _splitmix64(seed ^ part)
    return seed


def seeded_batches(
    batches: Iterable[list[int]], trial_seed: int, rank: int, epoch: int, first: int
) -> Iterator[SeededBatch]:
    """``batches`` of ``epoch``, the first being its batch ``first``, each with its seed."""
    for index, batch in enumerate(batches, first):
        yield SeededBatch(batch, batch_seed(trial_seed, rank, epoch, index))


class SeedPerBatch(Dataset[Any]):
    """The user's dataset, read a batch at a time: in a loader worker, the RNGs are seeded
    with the batch's seed first. Other attributes are the user's dataset's."""

    def __init__(self, dataset: Dataset[Any]) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]

    def __getitems__(self, batch: list[int]) -> list[Any]:
        seed = getattr(batch, "seed", None)
        if seed is not None and get_worker_info() is not None:
            # The CPU generator alone: a worker has no CUDA, and torch.manual_seed would queue
            # a CUDA seeding with its stack (0.2 ms a batch).
            torch.default_generator.manual_seed(seed)
            random.seed(seed)
            np.random.seed(seed % 2**32)
        indices = list(batch)
        getitems = getattr(self.dataset, "__getitems__", None)
        if callable(getitems):
            return getitems(indices)  # type: ignore[no-any-return]
        return [self.dataset[i] for i in indices]

    def __getattr__(self, name: str) -> Any:
        if name == "dataset" or name.startswith("__"):
            raise AttributeError(name)  # not set yet (unpickling) or a special name
        return getattr(self.dataset, name)
