"""``PyTorchTrial``: the class a user writes, with Determined's contract."""

from __future__ import annotations

import abc
from typing import Any

import torch

from searchlab.pytorch._callback import PyTorchCallback
from searchlab.pytorch._context import PyTorchTrialContext
from searchlab.pytorch._data import DataLoader, records_in
from searchlab.pytorch._reducer import Reducer

__all__ = ["PyTorchTrial"]


class PyTorchTrial(abc.ABC):
    """A model, its optimizers and its data, trained by searchlab.

    Implement ``__init__`` (wrap models, optimizers, schedulers through the context), the two
    data loader builders, ``train_batch`` and exactly one of ``evaluate_batch`` and
    ``evaluate_full_dataset``.

    Example:
        >>> class MyTrial(PyTorchTrial):
        ...     def __init__(self, context):
        ...         self.context = context
        ...         self.model = context.wrap_model(torch.nn.Linear(4, 1))
        ...         self.opt = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), 0.1))
        ...     def build_training_data_loader(self): return DataLoader(train_set, batch_size=8)
        ...     def build_validation_data_loader(self): return DataLoader(val_set, batch_size=8)
        ...     def train_batch(self, batch, epoch_idx, batch_idx):
        ...         x, y = batch
        ...         loss = torch.nn.functional.mse_loss(self.model(x), y)
        ...         self.context.backward(loss); self.context.step_optimizer(self.opt)
        ...         return {"loss": loss}
        ...     def evaluate_batch(self, batch):
        ...         x, y = batch
        ...         return {"val_loss": torch.nn.functional.mse_loss(self.model(x), y)}
    """

    trial_context_class = PyTorchTrialContext

    @abc.abstractmethod
    def __init__(self, context: PyTorchTrialContext) -> None:
        """Build models, optimizers and schedulers, wrapping each through ``context``."""

    @abc.abstractmethod
    def build_training_data_loader(self) -> DataLoader:
        """The training data (a ``searchlab.pytorch.DataLoader``)."""

    @abc.abstractmethod
    def build_validation_data_loader(self) -> DataLoader:
        """The validation data (a ``searchlab.pytorch.DataLoader``)."""

    @abc.abstractmethod
    def train_batch(
        self, batch: Any, epoch_idx: int, batch_idx: int
    ) -> torch.Tensor | dict[str, Any]:
        """Train on one batch; return the loss or a dict of metrics (``batch_idx`` is global)."""

    def evaluate_batch(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        """Metrics of one validation batch; reduced over the data set per ``evaluation_reducer``."""
        raise NotImplementedError

    def evaluate_full_dataset(
        self, data_loader: torch.utils.data.DataLoader[Any]
    ) -> dict[str, Any]:
        """Metrics of the whole validation set, computed by the trial itself."""
        raise NotImplementedError

    def evaluation_reducer(self) -> Reducer | dict[str, Reducer]:
        """How ``evaluate_batch`` metrics are reduced: one ``Reducer`` or one per metric."""
        return Reducer.AVG

    def build_callbacks(self) -> dict[str, PyTorchCallback]:
        """Callbacks by name; the names key their state in checkpoints."""
        return {}

    def get_batch_length(self, batch: Any) -> int:
        """The number of records in ``batch`` (for ``Record`` lengths and throughput)."""
        return records_in(batch)
