"""Metric reduction: built-in ``Reducer`` kinds and user-defined ``MetricReducer``."""

from __future__ import annotations

import abc
import enum
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["MetricReducer", "Reducer", "reduce_values"]


class Reducer(enum.Enum):
    """How per-batch validation metrics combine into one value.

    Example:
        >>> class MyTrial(PyTorchTrial):
        ...     def evaluation_reducer(self):
        ...         return {"accuracy": Reducer.AVG, "errors": Reducer.SUM}
    """

    AVG = "avg"
    SUM = "sum"
    MAX = "max"
    MIN = "min"


def reduce_values(reducer: Reducer, values: Sequence[float]) -> float:
    """Reduce a list of numbers the way ``reducer`` says."""
    arr = np.asarray(values, dtype=np.float64)
    if reducer is Reducer.AVG:
        return float(arr.mean())
    if reducer is Reducer.SUM:
        return float(arr.sum())
    if reducer is Reducer.MAX:
        return float(arr.max())
    return float(arr.min())


class MetricReducer(abc.ABC):
    """A custom metric computed across a whole validation (or training window).

    Register it with ``context.wrap_reducer(reducer, name=...)`` and feed it from
    ``evaluate_batch``/``train_batch``. ``per_slot_reduce`` runs on each worker and
    ``cross_slot_reduce`` combines the workers' results.

    Example:
        >>> class F1(MetricReducer):
        ...     def reset(self): self.tp = self.fp = self.fn = 0
        ...     def update(self, tp, fp, fn): self.tp += tp; self.fp += fp; self.fn += fn
        ...     def per_slot_reduce(self): return (self.tp, self.fp, self.fn)
        ...     def cross_slot_reduce(self, per_slot):
        ...         tp, fp, fn = map(sum, zip(*per_slot)); return 2 * tp / (2 * tp + fp + fn)
    """

    @abc.abstractmethod
    def reset(self) -> None:
        """Clear the accumulated state; called before each validation or training window."""

    @abc.abstractmethod
    def per_slot_reduce(self) -> Any:
        """This worker's partial result (must be picklable)."""

    @abc.abstractmethod
    def cross_slot_reduce(self, per_slot_metrics: list[Any]) -> Any:
        """The final metric (a number, or a dict of numbers) from every worker's partial result."""
