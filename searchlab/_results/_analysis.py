"""Views of an experiment's frames: learning curves, the best trials, hyperparameter importance."""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np
import pandas as pd

from searchlab._results._importance import hyperparameter_importance
from searchlab._results._records import flatten_hparams
from searchlab._results._reports import FIXED_COLUMNS, GROUPS
from searchlab.errors import SearchlabError

__all__ = ["best_rows", "flatten_hparams", "hyperparameter_importance", "learning_curves"]


def best_rows(trials: pd.DataFrame, column: str, smaller_is_better: bool, n: int) -> pd.DataFrame:
    """The ``n`` best rows by ``column``; ties keep trial order, rows without a value go last."""
    if column not in trials or trials.empty:
        return trials.head(0)
    values = pd.to_numeric(trials[column], errors="coerce").to_numpy(dtype="float64")
    missing = np.isnan(values)
    key = np.where(missing, 0.0, values if smaller_is_better else -values)
    order = np.lexsort((key, missing))  # stable: by missing first, then by key
    return trials.iloc[order[:n]]


def learning_curves(
    metrics: pd.DataFrame,
    metric: str,
    group: str | None,
    where: os.PathLike[str] | str,
    searcher_metric: str,
) -> pd.DataFrame:
    """``metric`` by batches (rows) and trial (columns) from the reports of one group."""
    if group is not None and group not in GROUPS:
        raise SearchlabError(
            f"The value of `group` is {group!r}, but must be one of: {', '.join(GROUPS)} (or None)"
        )
    names = [c for c in metrics.columns if c not in FIXED_COLUMNS]
    if metric not in names:
        if metric == searcher_metric:  # an experiment that has not validated yet
            return _empty_curves()
        raise SearchlabError(
            f"{where}: no report holds the metric {metric!r}; the reports hold: "
            f"{', '.join(names) or 'no metric yet'}"
        )
    valued = metrics[metrics[metric].notna()]
    group = group or _group_of(valued, metric, searcher_metric, where)
    rows = valued[valued["group"] == group]
    if rows.empty:
        return _empty_curves()
    trial_order = rows["trial_id"].unique()
    curves = rows.groupby(["batches", "trial_id"], sort=True)[metric].last().unstack("trial_id")
    curves = curves.reindex(columns=pd.Index(trial_order, name="trial_id"))
    curves.index.name = "batches"
    return curves


def _group_of(valued: pd.DataFrame, metric: str, searcher_metric: str, where: Any) -> str:
    if metric == searcher_metric:
        return "validation"
    if metric == "loss":
        return "training"
    groups = list(valued["group"].unique())
    if len(groups) > 1:
        raise SearchlabError(
            f"{where}: both training and validation reports hold {metric!r}; pass "
            "group='training' or group='validation'"
        )
    return str(groups[0]) if groups else "validation"


def _empty_curves() -> pd.DataFrame:
    return pd.DataFrame(
        index=pd.Index([], name="batches", dtype="int64"),
        columns=pd.Index([], name="trial_id", dtype="object"),
        dtype="float64",
    )


def finite(value: Any) -> float | None:
    """``value`` as a finite float, else None."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None
