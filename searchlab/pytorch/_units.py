"""Training lengths: ``Batch(n)``, ``Epoch(n)`` and ``Record(n)``, as in Determined."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from searchlab.pytorch._errors import TrialValueError

__all__ = ["Batch", "Epoch", "Record", "TrainUnit"]


@dataclass(frozen=True)
class TrainUnit:
    """A length of training; subclasses say in which unit ``value`` counts.

    Example:
        >>> Batch(100).to_batches(epoch_len=50, global_batch_size=32)
        100
    """

    value: int

    def __post_init__(self) -> None:
        if not isinstance(self.value, int) or isinstance(self.value, bool) or self.value < 0:
            raise TrialValueError(
                f"{type(self).__name__}({self.value!r}): the length must be an int >= 0"
            )

    def to_batches(self, epoch_len: int, global_batch_size: int | None) -> int:
        """This length in batches, given the epoch length and the global batch size."""
        raise NotImplementedError

    @staticmethod
    def from_spec(unit: str, value: int) -> TrainUnit:
        """A ``TrainUnit`` from a config length (``{"batches": 100}`` means ``Batch(100)``)."""
        classes: dict[str, type[TrainUnit]] = {"batches": Batch, "epochs": Epoch, "records": Record}
        if unit not in classes:
            raise TrialValueError(f"unknown length unit {unit!r}; use one of {sorted(classes)}")
        return classes[unit](int(value))

    @staticmethod
    def coerce(length: Any) -> TrainUnit:
        """Accept a TrainUnit, an int (batches), a ``{unit: n}`` dict or a config ``Length``."""
        if isinstance(length, TrainUnit):
            return length
        if isinstance(length, int) and not isinstance(length, bool):
            return Batch(length)
        if isinstance(length, dict) and len(length) == 1:
            ((unit, value),) = length.items()
            return TrainUnit.from_spec(str(unit), int(value))
        unit = getattr(length, "unit", None)
        if unit is not None:
            return TrainUnit.from_spec(str(getattr(unit, "value", unit)), int(length.value))
        raise TrialValueError(
            f"cannot use {length!r} as a length; pass Batch(n), Epoch(n), Record(n) or an int"
        )


@dataclass(frozen=True)
class Batch(TrainUnit):
    """A number of batches (optimizer steps of the global batch)."""

    def to_batches(self, epoch_len: int, global_batch_size: int | None) -> int:
        return self.value


@dataclass(frozen=True)
class Epoch(TrainUnit):
    """A number of passes over the training data loader."""

    def to_batches(self, epoch_len: int, global_batch_size: int | None) -> int:
        return self.value * epoch_len


@dataclass(frozen=True)
class Record(TrainUnit):
    """A number of training records (samples); rounded up to whole global batches."""

    def to_batches(self, epoch_len: int, global_batch_size: int | None) -> int:
        if not global_batch_size:
            raise TrialValueError(
                f"Record({self.value}) needs the hyperparameter `global_batch_size` to turn "
                "records into batches; set it or give the length in batches or epochs"
            )
        return math.ceil(self.value / global_batch_size)
