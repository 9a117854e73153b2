"""Metric writers, as ``determined.tensorboard.metric_writers``."""

from __future__ import annotations

import abc
from typing import Any

__all__ = ["MetricWriter"]


class MetricWriter(abc.ABC):
    """Writes scalar metrics to TensorBoard event files.

    Example:
        >>> class PrintWriter(MetricWriter):
        ...     def add_scalar(self, name, value, step): print(name, value, step)
        ...     def reset(self): pass
        ...     def flush(self): pass
    """

    @abc.abstractmethod
    def add_scalar(self, name: str, value: Any, step: int) -> None:
        """Write ``value`` of ``name`` at ``step``."""

    @abc.abstractmethod
    def reset(self) -> None:
        """Close the current event file; the next write starts a new one."""

    @abc.abstractmethod
    def flush(self) -> None:
        """Write what is buffered to disk."""
