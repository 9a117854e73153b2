"""Metric reduction: built-in ``Reducer`` kinds and user-defined ``MetricReducer``."""

from __future__ import annotations

import abc
import enum
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["MetricReducer", "Reducer", "SimpleReducer", "reduce_values"]


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


class SimpleReducer(MetricReducer):
    """A reducer function wrapped as a ``MetricReducer``: what ``wrap_reducer(fn)`` returns.

    Call ``update(value)`` during ``train_batch``/``evaluate_batch``; at the end of the window
    ``fn`` gets the list of every value from every worker (interleaved by rank, which restores
    the data order when each worker calls ``update`` once per batch) and returns the metric.

    Example:
        >>> def roc_auc(values):
        ...     y_true, y_score = zip(*values)
        ...     return sklearn.metrics.roc_auc_score(np.concatenate(y_true), np.concatenate(y_score))
        >>> self.auc = context.wrap_reducer(roc_auc, name="roc_auc")
        >>> self.auc.update((y.cpu().numpy(), scores.cpu().numpy()))  # in evaluate_batch
    """

    def __init__(self, fn: Callable[[list[Any]], Any]) -> None:
        self.fn = fn
        self.values: list[Any] = []

    def reset(self) -> None:
        self.values = []

    def update(self, value: Any) -> None:
        """Add one value (any picklable object) for ``fn``."""
        self.values.append(value)

    def per_slot_reduce(self) -> list[Any]:
        return self.values

    def cross_slot_reduce(self, per_slot_metrics: list[Any]) -> Any:
        missing = object()
        interleaved = itertools.zip_longest(*per_slot_metrics, fillvalue=missing)
        return self.fn([v for row in interleaved for v in row if v is not missing])
