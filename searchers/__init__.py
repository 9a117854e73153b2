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
from searchers._driver import Choice, Phase, RunnerStatus, SearchDriver, TrialPlan
from searchers._sampled import SampledSearch
from searchers._simple import GridSearch, RandomSearch, SingleSearch
from searchers._space import (
    DEFAULT_MAX_GRID_TRIALS,
    HyperparameterSpace,
    check_grid_limit,
    check_grid_size,
    flatten_hparams,
    unflatten_hparams,
)
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
    "DEFAULT_MAX_GRID_TRIALS",
    "SEARCHERS",
    "Action",
    "Choice",
    "Decision",
    "ExitReason",
    "HyperparameterSpace",
    "Phase",
    "RunnerStatus",
    "SearchDriver",
    "SearchMethod",
    "TrialPlan",
    "TrialStart",
    "adaptive_plan",
    "build_search_method",
    "check_grid_size",
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
    s: Any = cfg.searcher
    return GridSearch(
        HyperparameterSpace(cfg.hyperparameters, grid=True),
        s.max_length.value,
        seed=cfg.reproducibility.experiment_seed,
        max_concurrent_trials=s.max_concurrent_trials,
        smaller_is_better=s.smaller_is_better,
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


def _trial_count(cfg: ExperimentConfig, max_grid_trials: int | None) -> int:
    """How many trials a single, grid or random search runs (a grid is checked, never built)."""
    s: Any = cfg.searcher
    if s.name is SearcherName.GRID:
        space = HyperparameterSpace(cfg.hyperparameters, grid=True)
        return check_grid_size(space, max_grid_trials, cfg.source_name)
    check_grid_limit(max_grid_trials)
    return int(s.max_trials) if s.name is SearcherName.RANDOM else 1


def build_search_method(
    cfg: ExperimentConfig, *, max_grid_trials: int | None = DEFAULT_MAX_GRID_TRIALS
) -> SearchMethod:
    """The search method of ``cfg.searcher.name``.

    Args:
        cfg: A loaded config.
        max_grid_trials: The most points a grid search may have (None: no limit); a bigger
            grid is refused before anything is built. Grid points are made one at a time.

    Raises:
        ConfigError: For a grid over ``max_grid_trials`` (the message names the biggest axes
            and ``--max-grid-trials``), or a bad ``max_grid_trials``.
    """
    builder = SEARCHERS.get(cfg.searcher.name)
    if builder is None:
        valid = ", ".join(sorted(n.value for n in SEARCHERS))
        raise ConfigError(
            f"{cfg.source_name}: searcher.name: {cfg.searcher.name!r} is not a searcher; use one of {valid}"
        )
    _trial_count(cfg, max_grid_trials)
    return builder(cfg)


def preview_plan(
    cfg: ExperimentConfig, *, max_grid_trials: int | None = DEFAULT_MAX_GRID_TRIALS
) -> dict[str, Any]:
    """What a config will run: brackets and how many trials train to each length.

    A grid's size is computed from its counts, so even a huge grid previews at once; one over
    ``max_grid_trials`` (None: no limit) is refused as :func:`build_search_method` would.
    """
    s: Any = cfg.searcher
    unit = s.max_length.unit.value
    if s.name in (SearcherName.ADAPTIVE_ASHA, SearcherName.ASYNC_HALVING):
        check_grid_limit(max_grid_trials)
        # SPEC: the preview counts trials per length with `rt - max(int(rt/d), 1)` in both modes.
        plan = adaptive_plan(cfg).to_dict(stop_once=True)
        plan["unit"] = unit
        return plan
    length = s.max_length.value
    n = _trial_count(cfg, max_grid_trials)
    concurrency = s.max_concurrent_trials or n
    return {
        "brackets": [
            {"rungs": 1, "trials": n, "concurrency": min(concurrency, n), "rung_ends": [length]}
        ],
        "trials_per_length": {str(length): n},
        "unit": unit,
    }
