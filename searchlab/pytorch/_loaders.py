"""The per-epoch loader factories of a trial's training and validation data."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from searchlab.errors import TrialDefinitionError
from searchlab.pytorch._context import PyTorchTrialContext
from searchlab.pytorch._data import DataLoader, each_epoch

__all__ = ["epoch_loader"]


def epoch_loader(loader: Any, context: PyTorchTrialContext, where: str, training: bool) -> Any:
    """The per-epoch factory for ``loader`` (a searchlab or, if allowed, a torch DataLoader)."""
    dist = context.distributed
    if isinstance(loader, DataLoader):
        return loader.build(
            seed=context.get_trial_seed(), num_replicas=dist.size, rank=dist.rank, training=training
        )
    if isinstance(loader, torch.utils.data.DataLoader):
        if not context._allow_torch_loaders:
            raise TrialDefinitionError(
                f"{where} returned a torch.utils.data.DataLoader; return "
                "searchlab.pytorch.DataLoader (same arguments) so that data order, sharding and "
                "resume are exact, or call context.experimental."
                "disable_dataset_reproducibility_checks() in __init__ to use it as is"
            )
        return _TorchLoader(loader)
    raise TrialDefinitionError(
        f"{where} returned {type(loader).__name__}; it must return a searchlab.pytorch.DataLoader"
    )


class _TorchLoader:
    """A user's own torch DataLoader: resume skips batches by iterating past them."""

    def __init__(self, loader: torch.utils.data.DataLoader[Any]) -> None:
        self._loader = loader

    def __len__(self) -> int:
        return len(self._loader)

    # Its iteration may draw from the global RNG (a shuffle without a generator): started
    # with the first batch only, never early.
    starts_at_stream = False

    def loader_for(self, epoch: int, skip_batches: int = 0) -> Iterator[Any]:
        set_epoch = getattr(getattr(self._loader, "sampler", None), "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)
        it = iter(self._loader)
        for _ in range(skip_batches):
            next(it, None)
        return it

    def stream(self, epoch: int, skip_batches: int = 0) -> Iterator[Any]:
        """Every batch from ``skip_batches`` of ``epoch`` on: the loader iterated once per epoch
        (its own ``persistent_workers`` decides whether its workers outlive an epoch)."""
        return each_epoch(self.loader_for, epoch, skip_batches)
