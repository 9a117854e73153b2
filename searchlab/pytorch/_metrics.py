"""Checking and reducing the metrics a trial returns."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from searchlab.errors import TrialDefinitionError
from searchlab.pytorch._distributed import DistributedContext
from searchlab.pytorch._reducer import Reducer, reduce_values

__all__ = ["check_metrics", "mean_metrics", "reduce_validation", "to_float"]


def check_metrics(metrics: Any, where: str) -> dict[str, Any]:
    """``metrics`` as a dict of scalars; a Tensor alone means ``{"loss": tensor}``."""
    if isinstance(metrics, torch.Tensor):
        metrics = {"loss": metrics}
    if not isinstance(metrics, dict):
        raise TrialDefinitionError(
            f"{where} returned {type(metrics).__name__}; it must return a dict of metrics "
            "(or a loss Tensor)"
        )
    for name, value in metrics.items():
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise TrialDefinitionError(
                    f"{where} returned metric {name!r} with shape {tuple(value.shape)}; metrics "
                    "must be scalars: reduce it (e.g. `.mean()`) or use a MetricReducer"
                )
        elif isinstance(value, (int, float)):
            continue
        elif hasattr(value, "item"):  # numpy scalars and arrays
            if getattr(value, "size", 1) != 1:
                raise TrialDefinitionError(
                    f"{where} returned metric {name!r} with shape "
                    f"{tuple(getattr(value, 'shape', ()))}; metrics must be scalars: reduce it "
                    "(e.g. `.mean()`) or use a MetricReducer"
                )
        else:
            raise TrialDefinitionError(
                f"{where} returned metric {name!r} of type {type(value).__name__}; metrics must "
                "be numbers or one-element tensors"
            )
    return metrics


def to_float(value: Any) -> float:
    if isinstance(value, torch.Tensor):
        return float(value.detach().float().item())
    return float(value)


def mean_metrics(
    batch_metrics: Sequence[dict[str, Any]], distributed: DistributedContext
) -> dict[str, float]:
    """Per-metric mean over the batches of a window (and over workers, weighted by batches)."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    stacked: dict[str, list[Any]] = {}
    for metrics in batch_metrics:
        for k, v in metrics.items():
            stacked.setdefault(k, []).append(v)
    for k, values in stacked.items():
        tensors = [v.detach().reshape(()).double() for v in values if isinstance(v, torch.Tensor)]
        floats = torch.stack(tensors).tolist() if tensors else []  # one device sync per metric
        floats += [float(v) for v in values if not isinstance(v, torch.Tensor)]
        # fsum is exactly rounded, so the mean does not depend on whether part of the window
        # came back from a checkpoint as Python floats: resumed metrics stay bit-identical.
        sums[k], counts[k] = math.fsum(floats), len(values)
    if distributed.size > 1:
        gathered = distributed.allgather((sums, counts))
        sums = {k: sum(s.get(k, 0.0) for s, _ in gathered) for k in sums}
        counts = {k: sum(c.get(k, 0) for _, c in gathered) for k in counts}
    return {k: sums[k] / counts[k] for k in sums}


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
