"""``DataLoader``: torch's arguments, with the data order owned by searchlab.

The trainer builds torch ``DataLoader``s from the stored arguments, with an order that depends
only on the trial seed and the epoch, sharded by rank, and skipping what was already trained on
a resume. So a paused and resumed trial sees exactly the batches an uninterrupted one would,
and the global RNG streams (dropout, augmentation) stay untouched. Loader workers draw their
random numbers from each batch's place in the run (``_worker_seed``). With
``persistent_workers=True`` and searchlab's own samplers, one loader serves every epoch of a
run, so its workers start once, as torch's own loop would keep them; otherwise each epoch
gets a fresh loader, whose workers see the dataset as the trial left it at the epoch's start.
"""

from __future__ import annotations

import itertools
import math
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Union

import numpy as np
import torch
from torch.utils.data import BatchSampler, Dataset, RandomSampler, Sampler, SequentialSampler

from searchlab.pytorch import samplers
from searchlab.pytorch._errors import TrialTypeError, TrialValueError
from searchlab.pytorch._worker_seed import SeedPerBatch, seeded_batches
from searchlab.pytorch.samplers import EpochSampler, EpochShuffleSampler

__all__ = [
    "DataLoader",
    "TorchData",
    "adapt_batch_sampler",
    "data_length",
    "each_epoch",
    "to_device",
]

TorchData = Union[dict[str, torch.Tensor], Sequence[torch.Tensor], torch.Tensor]


class DataLoader:
    """A description of a torch ``DataLoader`` that searchlab can shard and resume.

    Takes the arguments of ``torch.utils.data.DataLoader``; ``batch_size`` is per worker
    (use ``context.get_per_slot_batch_size()``). Datasets must be map-style.

    Example:
        >>> def build_training_data_loader(self):
        ...     return DataLoader(self.train_set, batch_size=self.context.get_per_slot_batch_size(),
        ...                       shuffle=True, num_workers=2)
    """

    def __init__(
        self,
        dataset: Dataset[Any],
        batch_size: int | None = 1,
        shuffle: bool = False,
        sampler: Sampler[int] | None = None,
        batch_sampler: Sampler[list[int]] | None = None,
        num_workers: int = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        pin_memory: bool | None = None,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: torch.Generator | None = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
    ) -> None:
        if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
            raise TrialTypeError(
                f"DataLoader needs a map-style dataset (with __len__ and __getitem__), got "
                f"{type(dataset).__name__}; wrap an IterableDataset in torch's DataLoader and call "
                "context.experimental.disable_dataset_reproducibility_checks()"
            )
        if batch_sampler is not None and (
            batch_size != 1 or shuffle or sampler is not None or drop_last
        ):
            raise TrialValueError(
                "batch_sampler is mutually exclusive with batch_size, shuffle, sampler and "
                "drop_last; pass only batch_sampler"
            )
        if sampler is not None and shuffle:
            raise TrialValueError(
                "sampler is mutually exclusive with shuffle; shuffle inside the sampler or "
                "drop shuffle=True"
            )
        if batch_size is None and batch_sampler is None:
            raise TrialValueError(
                "batch_size=None is not supported: searchlab trains on batches; pass "
                "batch_size=context.get_per_slot_batch_size()"
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self.drop_last = drop_last
        self.generator = generator
        self._loader_kwargs: dict[str, Any] = {
            "num_workers": num_workers,
            "collate_fn": collate_fn,
            # None: pin when CUDA is there, so batches reach the GPU by non-blocking copies.
            "pin_memory": torch.cuda.is_available() if pin_memory is None else pin_memory,
            "timeout": timeout,
            "worker_init_fn": worker_init_fn,
            "multiprocessing_context": multiprocessing_context,
            "prefetch_factor": prefetch_factor,
            "persistent_workers": persistent_workers and num_workers > 0,
        }

    def _base_sampler(self, seed: int) -> Sampler[int]:
        if self.sampler is not None:
            return self.sampler
        if self.shuffle:
            return EpochShuffleSampler(self.dataset, seed)  # type: ignore[arg-type]
        return SequentialSampler(self.dataset)  # type: ignore[arg-type]

    def build(
        self, *, seed: int, num_replicas: int = 1, rank: int = 0, training: bool = True
    ) -> _EpochLoader:
        """The per-epoch loader factory the trainer uses."""
        return _EpochLoader(
            self, seed=seed, num_replicas=num_replicas, rank=rank, training=training
        )

    def get_data_loader(
        self, repeat: bool = False, skip: int = 0, num_replicas: int = 1, rank: int = 0
    ) -> torch.utils.data.DataLoader[Any]:
        """A plain torch ``DataLoader`` of this description (Determined's method).

        The order is the one searchlab trains with (trial seed 0): epoch 0, then, with
        ``repeat=True``, epochs 1, 2, ... without end. ``skip`` drops the first batches of this
        worker's shard (``rank`` of ``num_replicas``), once. Its ``len`` is one epoch's.
        """
        epochs = self.build(seed=0, num_replicas=num_replicas, rank=rank)
        if not repeat:
            return epochs.loader_for(epoch=0, skip_batches=skip)
        if epochs.stateless and len(epochs):  # any epoch's order can be drawn directly
            epoch, within = divmod(skip, len(epochs))
            return epochs.loader_of(_EpochsFrom(epochs, epoch, within))
        # A user's sampler may carry state from epoch to epoch: go through the skipped ones.
        every = _EpochsFrom(epochs, 0, 0)
        return epochs.loader_of(_SkipBatches(every, skip, length=len(epochs)))

    def __iter__(self) -> Iterator[Any]:
        """Iterate epoch 0, as a torch ``DataLoader`` would (for use outside a trainer)."""
        return iter(self.get_data_loader())

    def __len__(self) -> int:
        return len(self.build(seed=0))


# The users' RandomSamplers that searchlab gave a generator of its own.
_GIVEN_GENERATORS: weakref.WeakSet[RandomSampler] = weakref.WeakSet()


class _EpochLoader:
    """Makes the torch ``DataLoader`` of any epoch, at any batch of it."""

    def __init__(
        self, spec: DataLoader, *, seed: int, num_replicas: int, rank: int, training: bool
    ) -> None:
        self._spec = spec
        self._seed = seed
        self._rank = rank
        self._own_generator: torch.Generator | None = None
        if spec.batch_sampler is not None:
            self._sampler: EpochSampler | None = None
            self._batches: Sampler[list[int]] = spec.batch_sampler
        else:
            base = spec._base_sampler(seed)
            if isinstance(base, RandomSampler) and (
                base.generator is None or base in _GIVEN_GENERATORS
            ):
                # torch's RandomSampler draws from the global RNG: give it its own stream,
                # reseeded per epoch so that a resumed run draws the same order. Every build
                # of the description reseeds it (``len(loader)`` builds one too).
                if base.generator is None:
                    base.generator = torch.Generator()
                    _GIVEN_GENERATORS.add(base)
                self._own_generator = base.generator
            self._sampler = EpochSampler(base, num_replicas, rank, pad=training)
            assert spec.batch_size is not None
            self._batches = BatchSampler(self._sampler, spec.batch_size, spec.drop_last)
        # Every epoch's order is known without the global RNG or a sampler's own state. (A
        # user's sampler may draw from the global RNG when an epoch's iteration starts, which
        # a loader's prefetch across the epoch's end would move.)
        self.stateless = spec.batch_sampler is None and (
            spec.sampler is None or self._own_generator is not None
        )
        # searchlab's own samplers (a shuffle or the dataset order, sharded) fix an epoch's
        # whole order when its first index is drawn; a user's RandomSampler may go on drawing
        # from the generator ``batches_of`` reseeds.
        self.order_fixed_at_start = spec.batch_sampler is None and spec.sampler is None
        kwargs = spec._loader_kwargs
        self._one_loader = self.stateless and bool(kwargs["persistent_workers"])
        self._seed_workers = training and int(kwargs["num_workers"]) > 0
        self._len = len(self._batches)  # type: ignore[arg-type]

    def __len__(self) -> int:
        return self._len

    @property
    def starts_at_stream(self) -> bool:
        """``stream`` starts the loader's workers, and they fetch their first batches, as soon
        as it is called: one persistent loader serves the run, and its order draws on no RNG
        but its own, so making the stream early changes no batch and no random number."""
        return self._one_loader

    def batches_of(self, epoch: int, skip_batches: int = 0) -> Sampler[list[int]]:
        """The index batches ``skip_batches..`` of ``epoch`` (a batch sampler)."""
        batch_sampler: Any = self._batches
        if self._own_generator is not None:
            self._own_generator.manual_seed(self._seed * 1_000_003 + epoch)
        if self._sampler is not None:
            self._sampler.set_position(epoch, skip_batches * (self._spec.batch_size or 1))
        elif skip_batches:
            batch_sampler = _SkipBatches(self._batches, skip_batches)
        return batch_sampler  # type: ignore[no-any-return]

    def loader_for(self, epoch: int, skip_batches: int = 0) -> torch.utils.data.DataLoader[Any]:
        """The torch loader yielding batches ``skip_batches..`` of ``epoch``."""
        return self.loader_of(self.batches_of(epoch, skip_batches), epoch)

    def stream(self, epoch: int, skip_batches: int = 0) -> Iterator[Any]:
        """The training batches from ``skip_batches`` of ``epoch`` on, epoch after epoch.

        With ``persistent_workers`` and a stateless order, one torch loader serves every
        epoch, so its workers start once per run; otherwise each epoch gets a fresh loader
        when it starts. With workers, each batch's random numbers come from its place.
        """
        seed = self._seed_workers
        if self._one_loader:
            epochs = _EpochsFrom(self, epoch, skip_batches, seed=seed)
            return iter(self._training_loader(epochs, epoch))
        return each_epoch(
            lambda e, s: self._training_loader(_OneEpoch(self, e, s, seed=seed), e),
            epoch,
            skip_batches,
        )

    def seeded(self, batches: Iterable[list[int]], epoch: int, first: int) -> Iterable[list[int]]:
        """``batches`` of ``epoch`` from its batch ``first``, seeded for loader workers."""
        return seeded_batches(batches, self._seed, self._rank, epoch, first)

    def _training_loader(
        self, batch_sampler: Sampler[list[int]], epoch: int
    ) -> torch.utils.data.DataLoader[Any]:
        dataset = self._spec.dataset
        if self._seed_workers:
            dataset = SeedPerBatch(dataset)
        return self.loader_of(batch_sampler, epoch, dataset=dataset)

    def loader_of(
        self,
        batch_sampler: Sampler[list[int]],
        epoch: int = 0,
        dataset: Dataset[Any] | None = None,
    ) -> torch.utils.data.DataLoader[Any]:
        gen = torch.Generator()
        # Worker seeds come from this generator instead of the global RNG.
        gen.manual_seed(self._seed * 7_919 + epoch)
        return torch.utils.data.DataLoader(
            self._spec.dataset if dataset is None else dataset,
            batch_sampler=batch_sampler,
            generator=gen,
            **self._spec._loader_kwargs,
        )


def each_epoch(
    loader_for: Callable[[int, int], Iterable[Any]], epoch: int, skip_batches: int
) -> Iterator[Any]:
    """The batches of ``loader_for(epoch, skip_batches)``, then of every later epoch's loader."""
    while True:
        yield from loader_for(epoch, skip_batches)
        epoch, skip_batches = epoch + 1, 0


class _OneEpoch(Sampler[list[int]]):
    """The index batches of ``epoch`` from batch ``skip``, drawn as the loader asks."""

    def __init__(self, epochs: _EpochLoader, epoch: int, skip: int, *, seed: bool = False) -> None:
        self._epochs = epochs
        self._epoch = epoch
        self._skip = skip
        self._seed = seed  # tag each batch with its seed (a training loader with workers)

    def __iter__(self) -> Iterator[list[int]]:
        batches: Iterable[list[int]] = self._epochs.batches_of(self._epoch, self._skip)
        if self._seed:
            batches = self._epochs.seeded(batches, self._epoch, self._skip)
        return iter(batches)

    def __len__(self) -> int:
        return max(len(self._epochs) - self._skip, 0)


class _EpochsFrom(Sampler[list[int]]):
    """The index batches of an ``_EpochLoader`` from batch ``skip`` of ``epoch`` on, epoch after
    epoch without end; ``len`` is one epoch's (as Determined's ``RepeatBatchSampler``). An
    epoch's order is taken when its first batch is asked for, so the sampler's position and
    generator are set for that epoch alone: searchlab's own samplers fix the whole order then
    and hand out its batches as they are asked for; a user's sampler given searchlab's
    generator may draw from it as it goes, so its epoch is drawn all at once."""

    def __init__(self, epochs: _EpochLoader, epoch: int, skip: int, *, seed: bool = False) -> None:
        self._epochs = epochs
        self._epoch = epoch
        self._skip = skip
        self._seed = seed  # tag each batch with its seed (a training loader with workers)

    def __iter__(self) -> Iterator[list[int]]:
        epoch, skip = self._epoch, self._skip
        while True:
            batches = self._epoch_batches(epoch, skip)
            if batches is None and not skip:
                return  # an empty epoch: every later one is empty too
            if batches is not None:
                yield from self._epochs.seeded(batches, epoch, skip) if self._seed else batches
            epoch, skip = epoch + 1, 0

    def _epoch_batches(self, epoch: int, skip: int) -> Iterable[list[int]] | None:
        """The batches of ``epoch`` from ``skip``, its order taken now; None if there are none.

        Drawing all of an epoch at once took ~30 ms for 256k indices and ~0.2 s for an
        ImageNet-sized epoch (2 CPU cores), at every trial's start and resume."""
        batches = iter(self._epochs.batches_of(epoch, skip))
        if not self._epochs.order_fixed_at_start:
            drawn = list(batches)
            return drawn or None
        # Drawing the first batch creates the samplers' iterators, which take the epoch's
        # order and position; it also tells an empty epoch (a repeating loader stops there).
        first = next(batches, None)
        return None if first is None else itertools.chain([first], batches)

    def __len__(self) -> int:
        return len(self._epochs)


class _SkipBatches(Sampler[list[int]]):
    """``batches`` without the first ``skip``; ``len``: ``length``, else what is left."""

    def __init__(self, batches: Sampler[list[int]], skip: int, length: int | None = None) -> None:
        self._batches = batches
        self._skip = skip
        self._length = length

    def __iter__(self) -> Any:
        return itertools.islice(iter(self._batches), self._skip, None)

    def __len__(self) -> int:
        if self._length is not None:
            return self._length
        return max(len(self._batches) - self._skip, 0)  # type: ignore[arg-type]


def to_device(data: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """Move every tensor inside ``data`` (dicts, lists, tuples, namedtuples) to ``device``."""
    if isinstance(data, torch.Tensor):
        return data.to(device, non_blocking=non_blocking)
    if isinstance(data, dict):
        return {k: to_device(v, device, non_blocking) for k, v in data.items()}
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(to_device(v, device, non_blocking) for v in data))
    if isinstance(data, (list, tuple)):
        return type(data)(to_device(v, device, non_blocking) for v in data)
    if hasattr(data, "to") and callable(data.to):
        try:
            return data.to(device)
        except TypeError:
            return data
    return data


def records_in(batch: Any) -> int:
    """The number of records in a batch: the first dimension of its first tensor."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)) and batch:
        return records_in(batch[0])
    return math.nan  # type: ignore[return-value]


def data_length(data: Any) -> int:
    """The batch length of ``data``: the length of its first array or tensor (Determined's).

    Accepts an ndarray or tensor, or a dict, list or tuple whose first element is one.
    """
    if isinstance(data, (np.ndarray, torch.Tensor)):
        return len(data)
    if isinstance(data, (dict, list, tuple)):
        if len(data) == 0:
            raise TrialValueError(
                f"data_length() got an empty {type(data).__name__}; it needs at least one "
                "np.ndarray or torch.Tensor in it"
            )
        first = next(iter(data.values())) if isinstance(data, dict) else data[0]
        return len(first)
    raise TrialTypeError(
        f"data_length() got {type(data).__name__}; pass an ndarray, a tensor, or a "
        "dict/list/tuple of them"
    )


def adapt_batch_sampler(
    batch_sampler: BatchSampler,
    repeat: bool = False,
    skip: int = 0,
    num_replicas: int = 1,
    rank: int = 0,
) -> BatchSampler:
    """Repeat, shard and skip a batch sampler, in Determined's order (its function of the name).

    Skipping comes last: ``skip`` counts this worker's batches.
    """
    if repeat:
        batch_sampler = samplers.RepeatBatchSampler(batch_sampler)
    if num_replicas > 1:
        batch_sampler = samplers.DistributedBatchSampler(batch_sampler, num_replicas, rank)
    if skip > 0:
        batch_sampler = samplers.SkipBatchSampler(batch_sampler, skip)
    return batch_sampler
