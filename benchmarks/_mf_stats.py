"""Statistics of ``search_efficiency``: interquartile means over seeds, bootstrap intervals,
and the budget one method needs to reach another's final quality."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["bootstrap_iqm", "budget_to_reach", "iqm", "iqm_curve"]


def iqm(values: Sequence[float] | np.ndarray) -> float:
    """Interquartile mean: the mean of the middle 50% (rliable's IQM; ``inf`` counts as worst).

    With n values, the lowest and highest ``n/4`` are dropped, fractional parts weighted, as in
    ``scipy.stats.trim_mean(values, 0.25)``.
    """
    x = np.sort(np.asarray(values, dtype=float))
    n = len(x)
    if n == 0:
        return math.nan
    cut = n * 0.25
    lo, hi = math.floor(cut), n - math.floor(cut)
    weights = np.ones(n)
    weights[:lo] = 0.0
    weights[hi:] = 0.0
    frac = cut - lo
    if frac > 0 and hi - lo > 2:
        weights[lo] -= frac
        weights[hi - 1] -= frac
    kept = weights > 0
    if np.isinf(x[kept]).any():
        return math.inf
    return float(np.sum(x[kept] * weights[kept]) / np.sum(weights[kept]))


def iqm_curve(curves: np.ndarray) -> np.ndarray:
    """IQM over seeds (rows) at each budget point (columns)."""
    return np.array([iqm(curves[:, j]) for j in range(curves.shape[1])])


def bootstrap_iqm(
    curves: np.ndarray, *, reps: int = 1000, seed: int = 0, level: float = 0.95
) -> tuple[np.ndarray, np.ndarray]:
    """A percentile bootstrap interval of the IQM curve, resampling seeds (whole curves)."""
    rng = np.random.default_rng(seed)
    n = curves.shape[0]
    samples = np.empty((reps, curves.shape[1]))
    for r in range(reps):
        samples[r] = iqm_curve(curves[rng.integers(0, n, n)])
    tail = (1.0 - level) / 2.0 * 100.0
    with np.errstate(invalid="ignore"):
        low = np.nanpercentile(np.where(np.isinf(samples), np.nan, samples), tail, axis=0)
        high = np.percentile(samples, 100.0 - tail, axis=0)
    return low, high


def budget_to_reach(curve: np.ndarray, grid: Sequence[int], target: float) -> float | None:
    """The first budget in ``grid`` where ``curve`` is at or below ``target`` (None: never)."""
    for b, value in zip(grid, curve):
        if value <= target + 1e-12:
            return float(b)
    return None
