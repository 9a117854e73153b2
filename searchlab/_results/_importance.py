"""Hyperparameter importance of an experiment's trials by Optuna's fANOVA evaluator."""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pandas as pd

from searchlab._results._records import flatten_hparams
from searchlab.errors import SearchlabError

if TYPE_CHECKING:
    from searchlab.config import HParamSpec

__all__ = ["hyperparameter_importance"]

_SEED = 0
_PLAIN = (type(None), bool, int, float, str)


def hyperparameter_importance(
    trials: pd.DataFrame,
    records: list[dict[str, Any]],
    hp_config: dict[str, Any],
    *,
    metric: str,
    smaller_is_better: bool,
    where: os.PathLike[str] | str,
) -> pd.Series:
    """Importance per hyperparameter (summing to 1), most important first."""
    import optuna

    column = f"best_{metric}"
    if column in trials:
        values = pd.to_numeric(trials[column], errors="coerce").astype("float64")
    else:
        values = pd.Series(float("nan"), index=trials.index)
    scored = trials[values.map(math.isfinite)]
    if len(scored) < 2:
        raise SearchlabError(
            f"{where}: hyperparameter importance needs at least 2 trials with a finite "
            f"{metric}, got {len(scored)}; wait for more trials to validate"
        )
    if values[scored.index].nunique() < 2:
        raise SearchlabError(
            f"{where}: the {len(scored)} trials with a {metric} all have the same value, so no "
            "hyperparameter explains it"
        )
    specs = _varied_specs(hp_config, where)
    hparams = {rec["trial_id"]: flatten_hparams(rec.get("hparams") or {}) for rec in records}
    points = [
        (hparams.get(trial_id, {}), float(value))
        for trial_id, value in zip(scored["trial_id"], values[scored.index])
    ]
    distributions = _distributions(specs, [p for p, _ in points])
    if not distributions:
        raise SearchlabError(
            f"{where}: no hyperparameter varies across the {len(points)} trials with a "
            f"{metric} (constants are left out), so none can explain it"
        )
    direction = (
        optuna.study.StudyDirection.MINIMIZE
        if smaller_is_better
        else optuna.study.StudyDirection.MAXIMIZE
    )
    study_trials = [
        optuna.trial.create_trial(
            params={name: _choice(p[name]) for name in distributions},
            distributions=distributions,
            value=value,
        )
        for p, value in points
    ]
    with _quiet_optuna(optuna):
        study = optuna.create_study(direction=direction)
        study.add_trials(study_trials)
        try:
            evaluator = optuna.importance.FanovaImportanceEvaluator(seed=_SEED)
            importances = optuna.importance.get_param_importances(study, evaluator=evaluator)
        except ImportError as exc:
            raise SearchlabError(
                f"hyperparameter importance needs scikit-learn (Optuna's fANOVA fits random "
                f"forests): pip install scikit-learn ({exc})"
            ) from None
    series = pd.Series(importances, name="importance", dtype="float64")
    series.index.name = "hyperparameter"
    return series.sort_values(ascending=False, kind="stable")


def _varied_specs(hp_config: dict[str, Any], where: Any) -> list[HParamSpec]:
    from searchlab.config import HParamType, parse_hyperparameters

    try:
        specs = parse_hyperparameters(hp_config)
    except ValueError as exc:
        raise SearchlabError(
            f"{where}/experiment.json: config.hyperparameters: {exc}; the experiment's config "
            "is damaged"
        ) from None
    return [s for s in specs if s.type is not HParamType.CONST]


def _choice(value: Any) -> Any:
    """A value Optuna accepts as a categorical choice (lists and maps as their JSON)."""
    return value if isinstance(value, _PLAIN) else json.dumps(value, sort_keys=True)


def _distributions(specs: list[HParamSpec], points: list[dict[str, Any]]) -> dict[str, Any]:
    """Each hyperparameter that took more than one value, with its range from the config
    (widened to the values the trials had, should the config have changed)."""
    from optuna.distributions import (
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
    )

    from searchlab.config import HParamType

    out: dict[str, Any] = {}
    for spec in specs:
        seen = [p.get(spec.name) for p in points]
        if any(spec.name not in p for p in points) or len({_choice(v) for v in seen}) < 2:
            continue
        numbers = [v for v in seen if isinstance(v, (int, float)) and not isinstance(v, bool)]
        ranged = len(numbers) == len(seen) and all(math.isfinite(v) for v in numbers)
        if spec.type is HParamType.INT and ranged and all(float(v).is_integer() for v in numbers):
            low, high = min(spec.minval, *numbers), max(spec.maxval, *numbers)
            out[spec.name] = IntDistribution(int(low), int(high))
        elif spec.type is HParamType.DOUBLE and ranged:
            low, high = min(spec.minval, *numbers), max(spec.maxval, *numbers)
            out[spec.name] = FloatDistribution(float(low), float(high))
        elif spec.type is HParamType.LOG and ranged and min(numbers) > 0:
            low = min(spec.base**spec.minval, *numbers)
            high = max(spec.base**spec.maxval, *numbers)
            out[spec.name] = FloatDistribution(float(low), float(high), log=True)
        else:
            choices = dict.fromkeys(_choice(v) for v in (*spec.vals, *seen))
            out[spec.name] = CategoricalDistribution(list(choices))
    return out


@contextlib.contextmanager
def _quiet_optuna(optuna: Any) -> Iterator[None]:
    """Optuna logs each new study at INFO; this one is internal."""
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(verbosity)
