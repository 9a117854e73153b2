"""Adaptive ASHA (Determined's ``adaptive_asha`` and ``async_halving``) as pure search logic.

Example:
    >>> from searchers.adaptive import AdaptiveSearch, build_adaptive_plan
    >>> plan = build_adaptive_plan(1000, 64, mode="standard")
    >>> [b.rung_ends for b in plan.brackets]
    [[15, 62, 250, 1000], [62, 250, 1000], [250, 1000]]
    >>> search = AdaptiveSearch(plan, lambda trial_id: {}, smaller_is_better=False)
"""

from __future__ import annotations

from searchers.adaptive._plan import (
    AdaptivePlan,
    BracketPlan,
    Mode,
    allocate_concurrency,
    allocate_trials,
    build_adaptive_plan,
    build_async_halving_plan,
    compute_rung_ends,
)
from searchers.adaptive._rungs import Promotion, PromotionRungs, Rung, RungEntry
from searchers.adaptive._search import AdaptiveSearch, TrialStatus
from searchers.adaptive._stopping import StoppingRungs

__all__ = [
    "AdaptivePlan",
    "AdaptiveSearch",
    "BracketPlan",
    "Mode",
    "Promotion",
    "PromotionRungs",
    "Rung",
    "RungEntry",
    "StoppingRungs",
    "TrialStatus",
    "allocate_concurrency",
    "allocate_trials",
    "build_adaptive_plan",
    "build_async_halving_plan",
    "compute_rung_ends",
]
