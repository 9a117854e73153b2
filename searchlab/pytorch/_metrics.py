"""Checking, converting and reducing the metrics a trial returns.

As in Determined, a metric may be a number, a tensor or array of any shape, a string, ``None``,
or a list/dict of those. Scalars (numbers, one-element tensors and arrays) are reported as
floats; other values as Python lists (``tensor.tolist()``). A training window's average is the
mean over every number of the window, which for equal-shape tensors is Determined's
``np.mean`` over the stacked values; a metric that holds no numbers, or arrays of different
shapes, is reported with the value ``None``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from searchlab.errors import TrialDefinitionError
from searchlab.pytorch._distributed import DistributedContext
from searchlab.pytorch._reducer import Reducer, reduce_values

__all__ = [
    "check_metrics",
    "is_numerical_scalar",
    "mean_metrics",
    "numeric_values",
    "reduce_validation",
    "report_value",
    "to_float",
    "to_python",
]

_PLAIN = (int, float, str, type(None))


def check_metrics(metrics: Any, where: str) -> dict[str, Any]:
    """``metrics`` as a dict; a Tensor alone means ``{"loss": tensor}``."""
    if isinstance(metrics, torch.Tensor):
        metrics = {"loss": metrics}
    if not isinstance(metrics, dict):
        raise TrialDefinitionError(
            f"{where} returned {type(metrics).__name__}; it must return a dict of metrics "
            "(or a loss Tensor)"
        )
    for name, value in metrics.items():
        bad = _unsupported(value)
        if bad is not None:
            raise TrialDefinitionError(
                f"{where} returned metric {name!r} holding a {type(bad).__name__}; metrics must "
                "be numbers, tensors, numpy arrays, strings or lists/dicts of them"
            )
    return metrics


def _unsupported(value: Any) -> Any:
    """The first part of ``value`` that is no metric value, or None when all of it is."""
    if isinstance(value, (torch.Tensor, np.ndarray, np.generic, *_PLAIN)):
        return None
    if isinstance(value, (list, tuple)):
        return next((b for b in map(_unsupported, value) if b is not None), None)
    if isinstance(value, dict):
        return next((b for b in map(_unsupported, value.values()) if b is not None), None)
    return value


def is_numerical_scalar(value: Any) -> bool:
    """A number, or a one-element numeric tensor or array (what TensorBoard can plot)."""
    if isinstance(value, (int, float)):  # bool included, as in Determined
        return True
    if isinstance(value, torch.Tensor):
        return value.numel() == 1 and not value.is_complex()
    if isinstance(value, (np.ndarray, np.generic)):
        return value.size == 1 and value.dtype.kind in "biuf"
    return False


def to_python(value: Any) -> Any:
    """``value`` with tensors and arrays as Python numbers (one element) or lists."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        return value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, np.ndarray):
        return value.item() if value.size == 1 else value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        return [to_python(v) for v in value]
    if isinstance(value, dict):
        return {k: to_python(v) for k, v in value.items()}
    return value


def to_float(value: Any) -> float:
    if isinstance(value, torch.Tensor):
        return float(value.detach().double().item())
    return float(value)


def report_value(value: Any) -> Any:
    """How a metric is reported: a float for scalars, else its Python form (lists, str)."""
    return to_float(value) if is_numerical_scalar(value) else to_python(value)


def numeric_values(values: Sequence[Any]) -> np.ndarray | None:
    """The values stacked as one float64 array (equal shapes, numbers only), else None."""
    try:
        arr = np.asarray([to_python(v) for v in values], dtype=np.float64)
    except (TypeError, ValueError):  # strings, dicts, ragged shapes
        return None
    return arr


def _window_sum(values: list[Any]) -> tuple[float | None, int]:
    """Exact sum and count of a window's numbers; (None, 0) when they cannot be averaged."""
    if all(is_numerical_scalar(v) for v in values):
        tensors = [v.detach().reshape(()).double() for v in values if isinstance(v, torch.Tensor)]
        floats = torch.stack(tensors).tolist() if tensors else []  # one device sync per metric
        floats += [to_float(v) for v in values if not isinstance(v, torch.Tensor)]
        # fsum is exactly rounded, so the mean does not depend on whether part of the window
        # came back from a checkpoint as Python floats: resumed metrics stay bit-identical.
        return math.fsum(floats), len(values)
    arr = numeric_values(values)
    if arr is None or arr.size == 0:
        return None, 0
    return math.fsum(arr.ravel().tolist()), int(arr.size)


def mean_metrics(
    batch_metrics: Sequence[dict[str, Any]], distributed: DistributedContext
) -> dict[str, Any]:
    """Per-metric mean over the batches of a window (and over workers, weighted by numbers).

    ``None`` values are skipped, as Determined skipped them; a metric that cannot be averaged
    (strings, arrays of different shapes) is ``None``.
    """
    sums: dict[str, float | None] = {}
    counts: dict[str, int] = {}
    stacked: dict[str, list[Any]] = {}
    for metrics in batch_metrics:
        for k, v in metrics.items():
            stacked.setdefault(k, [])
            if v is not None:
                stacked[k].append(v)
    for k, values in stacked.items():
        sums[k], counts[k] = _window_sum(values)
    if distributed.size > 1:
        gathered = distributed.allgather((sums, counts))
        sums = {k: _sum_or_none([s.get(k, 0.0) for s, _ in gathered]) for k in sums}
        counts = {k: sum(c.get(k, 0) for _, c in gathered) for k in counts}
    out: dict[str, Any] = {}
    for k, total in sums.items():
        out[k] = total / counts[k] if total is not None and counts[k] else None
    return out


def _sum_or_none(parts: list[float | None]) -> float | None:
    return None if any(p is None for p in parts) else math.fsum(parts)  # type: ignore[arg-type]


def reduce_validation(
    per_batch: dict[str, list[float]],
    reducers: Reducer | dict[str, Reducer],
    distributed: DistributedContext,
) -> dict[str, float]:
    """Reduce per-batch validation values: per worker first, then across workers.

    AVG is the unweighted mean over a worker's batches, then the mean across workers weighted
    by their batch counts; SUM, MAX and MIN combine the same way on both levels.
    """
    local: dict[str, tuple[float, int]] = {}
    for name, values in per_batch.items():
        reducer = reducers.get(name, Reducer.AVG) if isinstance(reducers, dict) else reducers
        local[name] = (reduce_values(reducer, values) if values else math.nan, len(values))
    gathered = distributed.allgather(local) if distributed.size > 1 else [local]
    out: dict[str, float] = {}
    for name in local:
        reducer = reducers.get(name, Reducer.AVG) if isinstance(reducers, dict) else reducers
        parts = [g[name] for g in gathered if name in g and g[name][1] > 0]
        if not parts:
            out[name] = math.nan
        elif reducer is Reducer.AVG:
            out[name] = sum(v * n for v, n in parts) / sum(n for _, n in parts)
        else:
            out[name] = reduce_values(reducer, [v for v, _ in parts])
    return out
