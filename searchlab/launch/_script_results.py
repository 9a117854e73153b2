"""What a script trial's report means to the search: the rung it ends, and why it cannot count.

Pure functions of a ``Report`` and the trial's plan (no Ray, no torch).

Example:
    >>> rung_of(Report("validation", {"x": 3, "batches": 8}, 8, by_time_metric=True),
    ...         rung_ends=[4, 8], next_rung=0, unit="batches")
    0
"""

from __future__ import annotations

import math
from typing import Any

from searchlab.core._channel import Report

__all__ = ["metric_problem", "non_finite", "rung_of"]


def rung_of(report: Report, rung_ends: list[int], next_rung: int, unit: str) -> int | None:
    """The rung a validation ends: the next one, once its length is reached.

    The Trainer says at which rung length it validated (``searcher_length``), as do searcher
    operations; other Core API validations are read by the time metric in their metrics
    (``batches`` falls back to ``steps_completed``).
    """
    if next_rung >= len(rung_ends):
        return None
    length: Any = report.searcher_length
    if length is None and report.by_time_metric:
        length = report.metrics.get(unit, report.batches if unit == "batches" else None)
    if not isinstance(length, int | float) or isinstance(length, bool):
        return None
    return next_rung if length >= rung_ends[next_rung] else None


def metric_problem(report: Report, metric: str) -> str | None:
    """Why a rung-end validation cannot be a searcher result (None when it can)."""
    value = report.metrics.get(metric)
    where = f"at {report.batches} batches" if report.batches >= 0 else "at its rung end"
    if metric not in report.metrics:
        return (
            f"the searcher metric {metric!r} is not among the validation metrics "
            f"{sorted(report.metrics)} that the script reported {where}; report it "
            "with the validation metrics or change searcher.metric"
        )
    if isinstance(value, bool) or not isinstance(value, int | float):
        return (
            f"the searcher metric {metric!r} that the script reported {where} is "
            f"{value!r:.80}, not a number; the searcher compares numbers: report a scalar"
        )
    return None


def non_finite(report: Report, metric: str) -> str | None:
    """A NaN or infinite loss or searcher metric ends the trial (as for class trials)."""
    name = "loss" if report.group == "training" else metric
    value = report.metrics.get(name)
    if report.group not in ("training", "validation") or isinstance(value, bool):
        return None
    if not isinstance(value, int | float) or math.isfinite(value):
        return None
    first = report.first_non_finite.get(name, report.batches)
    return (
        f"{report.group} metric {name!r} is {value} at batch {first}; the trial stops and "
        "counts as the worst result (lower the learning rate or check the data)"
    )
