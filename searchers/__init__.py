"""Search logic: each searcher name maps to a builder of a pure ``SearchMethod``.

Nothing here imports Ray or torch; ``searchlab.experiment`` adapts these to Ray Tune.

Example:
    >>> from searchers import build_search_method
    >>> method = build_search_method(load_experiment_config("configs/grid.yaml"))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from searchers._base import Action, Decision, ExitReason, SearchMethod, TrialStart
from searchers._sampled import SampledSearch
from searchers._simple import GridSearch, RandomSearch, SingleSearch
from searchers._space import HyperparameterSpace, flatten_hparams, unflatten_hparams
from searchers._tpe import build_hparam_sampler
from searchers.adaptive import (
    AdaptivePlan,
    AdaptiveSearch,
    build_adaptive_plan,
    build_async_halving_plan,
)
from searchlab.config import ExperimentConfig, SearcherName
from searchlab.errors import ConfigError

__all__ = [
    "SEARCHERS",
    "Action",
    "Decision",
    "ExitReason",
    "HyperparameterSpace",
    "SearchMethod",
    "TrialStart",
    "adaptive_plan",
    "build_search_method",
    "flatten_hparams",
    "preview_plan",
    "unflatten_hparams",
]


def _single(cfg: ExperimentConfig) -> SearchMethod:
    return SingleSearch(
        HyperparameterSpace.from_config(cfg),
        cfg.searcher.max_length.value,
        seed=cfg.reproducibility.experiment_seed,
        smaller_is_better=cfg.searcher.smaller_is_better,
    )


def _grid(cfg: ExperimentConfig) -> SearchMethod:
    return GridSearch(
        HyperparameterSpace(cfg.hyperparameters, grid=True),
        cfg.searcher.max_length.value,
        seed=cfg.reproducibility.experiment_seed,
        smaller_is_better=cfg.searcher.smaller_is_better,
    )


def _random(cfg: ExperimentConfig) -> SearchMethod:
    return RandomSearch.from_config(cfg)


def adaptive_plan(cfg: ExperimentConfig) -> AdaptivePlan:
    """The brackets and rungs of an ``adaptive_asha`` or ``async_halving`` config."""
    s: Any = cfg.searcher
    common = {"divisor": s.divisor, "max_concurrent_trials": s.max_concurrent_trials}
    if s.name is SearcherName.ASYNC_HALVING:
        return build_async_halving_plan(
            s.max_length.value, s.max_trials, num_rungs=s.num_rungs, **common
        )
    return build_adaptive_plan(
        s.max_length.value,
        s.max_trials,
        mode=s.mode.value,
        max_rungs=s.max_rungs,
        bracket_rungs=s.bracket_rungs,
        **common,
    )


def _adaptive(cfg: ExperimentConfig) -> SearchMethod:
    s: Any = cfg.searcher
    sampler = build_hparam_sampler(cfg)
    inner = AdaptiveSearch(
        adaptive_plan(cfg),
        sampler.sample,
        smaller_is_better=s.smaller_is_better,
        stop_once=s.stop_once,
    )
    return SampledSearch(
        inner,
        sampler,
        seed=cfg.reproducibility.experiment_seed,
        smaller_is_better=s.smaller_is_better,
    )


SEARCHERS: dict[SearcherName, Callable[[ExperimentConfig], SearchMethod]] = {
    SearcherName.SINGLE: _single,
    SearcherName.GRID: _grid,
    SearcherName.RANDOM: _random,
    SearcherName.ADAPTIVE_ASHA: _adaptive,
    SearcherName.ASYNC_HALVING: _adaptive,
}


def build_search_method(cfg: ExperimentConfig) -> SearchMethod:
    """The search method of ``cfg.searcher.name``."""
    builder = SEARCHERS.get(cfg.searcher.name)
    if builder is None:
        valid = ", ".join(sorted(n.value for n in SEARCHERS))
        raise ConfigError(
            f"{cfg.source_name}: searcher.name: {cfg.searcher.name!r} is not a searcher; use one of {valid}"
        )
    return builder(cfg)


def preview_plan(cfg: ExperimentConfig) -> dict[str, Any]:
    """What a config will run: brackets and how many trials train to each length."""
    s: Any = cfg.searcher
    unit = s.max_length.unit.value
    if s.name in (SearcherName.ADAPTIVE_ASHA, SearcherName.ASYNC_HALVING):
        # SPEC: the preview counts trials per length with `rt - max(int(rt/d), 1)` in both modes.
        plan = adaptive_plan(cfg).to_dict(stop_once=True)
        plan["unit"] = unit
        return plan
    length = s.max_length.value
    if s.name is SearcherName.GRID:
        n = HyperparameterSpace(cfg.hyperparameters, grid=True).grid_size()
    elif s.name is SearcherName.RANDOM:
        n = s.max_trials
    else:
        n = 1
    concurrency = s.max_concurrent_trials or n
    return {
        "brackets": [
            {"rungs": 1, "trials": n, "concurrency": min(concurrency, n), "rung_ends": [length]}
        ],
        "trials_per_length": {str(length): n},
        "unit": unit,
    }
