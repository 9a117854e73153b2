"""Each compared method's real decision code, behind the runner's ``Method`` interface.

- **searchlab** (``adaptive_asha``, its ``stop_once`` mode, ``sampler: tpe``, and ``random``):
  ``searchers.build_search_method`` of a real experiment config, wrapped in the
  ``searchers.SearchDriver`` and fed events in the order Ray Tune gives them to searchlab's
  adapters: new trials are asked for (``suggest``) while fewer than ``workers`` are pending,
  ``choose`` picks what a free worker runs (a promoted paused trial or a pending new one) and
  which paused trials are closed out, and every rung-end result goes to ``on_result``. Results
  between rung ends are not shown to the driver (searchlab validates for the searcher only at
  rung ends); a trial at its last rung ends, as Tune's ``done`` makes it.
- **Ray Tune ASHA**: ``ray.tune.schedulers.ASHAScheduler`` (``on_trial_add``,
  ``on_trial_result``, ``on_trial_complete`` with real ``Trial`` stubs), configurations drawn
  by Ray's own search-space domains (``tune.loguniform(...).sample``): random search.
- **Optuna**: a real study, ``TPESampler`` + ``HyperbandPruner``, ask/tell; every unit is
  ``trial.report``-ed and ``trial.should_prune()`` decides.
- **Syne Tune**: its ``ASHA`` and ``BOHB`` schedulers (``suggest``, ``on_trial_add``,
  ``on_trial_result``, ``on_trial_remove``), driven as its ``Tuner`` drives them.

All methods get the same reduction factor, minimum length (1 unit) and maximum length.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
from _mf_problems import Param, Problem
from _mf_sim import Job, Outcome

__all__ = [
    "OptunaHyperband",
    "RayASHA",
    "SearchlabMethod",
    "SyneTuneMethod",
    "searchlab_config",
    "searchlab_trials_for_budget",
]

METRIC = "val_error"
_NO_CONTROLLER: Any = None  # ASHAScheduler never uses Tune's controller


def searchlab_config(
    problem: Problem,
    *,
    name: str,
    max_trials: int,
    workers: int,
    divisor: float,
    seed: int,
    mode: str = "standard",
    stop_once: bool = False,
    sampler: str = "random",
) -> dict[str, Any]:
    """The experiment config a searchlab user would write for this search."""
    searcher: dict[str, Any] = {
        "name": name,
        "metric": METRIC,
        "smaller_is_better": True,
        "max_length": {"batches": problem.max_length},
        "max_trials": max_trials,
        "max_concurrent_trials": workers,
        "sampler": sampler,
    }
    if name == "adaptive_asha":
        searcher.update(divisor=divisor, mode=mode, stop_once=stop_once)
    return {
        "name": f"bench-{problem.name}",
        "entrypoint": "model_def:Trial",
        "hyperparameters": {p.name: p.searchlab() for p in problem.space},
        "searcher": searcher,
        "reproducibility": {"experiment_seed": seed},
    }


def searchlab_trials_for_budget(problem: Problem, budget: int, **kwargs: Any) -> int:
    """The most ``max_trials`` whose plan (``searchlab preview``) fits in ``budget`` units."""
    from searchers import adaptive_plan
    from searchlab.config import load_experiment_config

    def total(trials: int) -> int:
        cfg = load_experiment_config(
            searchlab_config(problem, name="adaptive_asha", max_trials=trials, **kwargs)
        )
        return adaptive_plan(cfg).total_length(stop_once=bool(kwargs.get("stop_once")))

    lo, hi = 1, 2
    while total(hi) <= budget:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if total(mid) <= budget else (lo, mid)
    return lo


class SearchlabMethod:
    """searchlab's search driver and method, fed as its Ray Tune adapters feed them."""

    def __init__(self, config: Mapping[str, Any], workers: int) -> None:
        from searchers import RunnerStatus, SearchDriver, build_search_method
        from searchers._driver import FINISHED
        from searchlab.config import load_experiment_config

        cfg = load_experiment_config(dict(config))
        self.driver = SearchDriver(build_search_method(cfg), smaller_is_better=True)
        self._status = RunnerStatus
        self._finished_token = FINISHED
        self.workers = workers
        self.runner: dict[str, Any] = {}  # trial -> RunnerStatus, in creation order
        self._ids = itertools.count()
        self._no_more = False

    def _add_trials(self) -> None:
        pending = sum(s is self._status.PENDING for s in self.runner.values())
        while not self._no_more and pending < self.workers:
            trial_id = f"t{next(self._ids)}"
            plan = self.driver.suggest(trial_id)
            if plan is None:
                return
            if plan == self._finished_token:
                self._no_more = True
                return
            self.runner[trial_id] = self._status.PENDING
            pending += 1

    def next_job(self) -> Job | None:
        from searchers import ExitReason

        self._add_trials()
        choice = self.driver.choose(dict(self.runner))
        for trial_id in choice.stop:
            self.runner[trial_id] = self._status.ENDED
            self.driver.on_exit(trial_id, ExitReason.COMPLETED)
        for trial_id in choice.pause:
            self.runner[trial_id] = self._status.PAUSED
        if choice.run is None:
            return None
        was = self.runner[choice.run]
        self.runner[choice.run] = self._status.RUNNING
        if was is self._status.PAUSED:
            return Job(choice.run)
        plan = self.driver.plan(choice.run)
        assert plan is not None
        return Job(choice.run, plan.hparams)

    def report(self, trial_id: str, length: int, value: float) -> Outcome:
        from searchers import Action, ExitReason

        plan = self.driver.plan(trial_id)
        assert plan is not None
        if length not in plan.rung_ends:
            return Outcome.CONTINUE
        action = self.driver.on_result(trial_id, length, value)
        if length >= plan.rung_ends[-1] or action is Action.STOP:
            self.runner[trial_id] = self._status.ENDED
            self.driver.on_exit(trial_id, ExitReason.COMPLETED)
            return Outcome.STOP
        if action is Action.PAUSE:
            self.runner[trial_id] = self._status.PAUSED
            return Outcome.PAUSE
        return Outcome.CONTINUE

    def close(self) -> None:
        pass


def _ray_domain(param: Param) -> Any:
    from ray import tune

    if param.kind == "int":
        return tune.randint(int(param.low), int(param.high) + 1)  # upper bound exclusive
    if param.log:
        return tune.loguniform(param.low, param.high)
    return tune.uniform(param.low, param.high)


class RayASHA:
    """Ray Tune's ``ASHAScheduler`` with random search (Ray's own sampling)."""

    def __init__(
        self, problem: Problem, *, seed: int, divisor: float, num_samples: int | None
    ) -> None:
        from ray.tune.schedulers import ASHAScheduler

        self.scheduler = ASHAScheduler(
            time_attr="training_iteration",
            metric=METRIC,
            mode="min",
            max_t=problem.max_length,
            grace_period=1,
            reduction_factor=divisor,
            brackets=1,
        )
        self.domains = {p.name: _ray_domain(p) for p in problem.space}
        self.rng = np.random.RandomState(seed)
        self.num_samples = num_samples
        self.trials: dict[str, Any] = {}

    def next_job(self) -> Job | None:
        from ray.tune.experiment import Trial

        if self.num_samples is not None and len(self.trials) >= self.num_samples:
            return None
        config = {n: d.sample(random_state=self.rng) for n, d in self.domains.items()}
        trial_id = f"r{len(self.trials)}"
        trial = Trial("simulated", config=config, trial_id=trial_id, stub=True)
        self.trials[trial_id] = trial
        self.scheduler.on_trial_add(_NO_CONTROLLER, trial)
        return Job(trial_id, config)

    def report(self, trial_id: str, length: int, value: float) -> Outcome:
        from ray.tune.schedulers import TrialScheduler

        trial = self.trials[trial_id]
        result = {"training_iteration": length, METRIC: value}
        decision = self.scheduler.on_trial_result(_NO_CONTROLLER, trial, result)
        if decision == TrialScheduler.STOP or length >= self.scheduler._max_t:
            self.scheduler.on_trial_complete(_NO_CONTROLLER, trial, result)
            return Outcome.STOP
        return Outcome.CONTINUE

    def close(self) -> None:
        pass


def _optuna_distribution(param: Param) -> Any:
    import optuna

    if param.kind == "int":
        return optuna.distributions.IntDistribution(int(param.low), int(param.high))
    return optuna.distributions.FloatDistribution(param.low, param.high, log=param.log)


class OptunaHyperband:
    """An Optuna study: ``TPESampler`` with ``HyperbandPruner``, through ask and tell."""

    def __init__(
        self, problem: Problem, *, seed: int, divisor: float, n_trials: int | None
    ) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.optuna = optuna
        self.study = optuna.create_study(
            direction="minimize",
            sampler=optuna.samplers.TPESampler(seed=seed),
            pruner=optuna.pruners.HyperbandPruner(
                min_resource=1, max_resource=problem.max_length, reduction_factor=int(divisor)
            ),
        )
        self.distributions = {p.name: _optuna_distribution(p) for p in problem.space}
        self.max_length = problem.max_length
        self.n_trials = n_trials
        self.trials: dict[str, Any] = {}

    def next_job(self) -> Job | None:
        if self.n_trials is not None and len(self.trials) >= self.n_trials:
            return None
        trial = self.study.ask(fixed_distributions=self.distributions)
        trial_id = f"o{trial.number}"
        self.trials[trial_id] = trial
        return Job(trial_id, dict(trial.params))

    def report(self, trial_id: str, length: int, value: float) -> Outcome:
        trial = self.trials[trial_id]
        trial.report(value, length)
        if length >= self.max_length:
            self.study.tell(trial, value)
            return Outcome.STOP
        if trial.should_prune():
            self.study.tell(trial, state=self.optuna.trial.TrialState.PRUNED)
            return Outcome.STOP
        return Outcome.CONTINUE

    def close(self) -> None:
        pass


def _syne_domain(param: Param) -> Any:
    from syne_tune import config_space as cs

    if param.kind == "int":
        return cs.randint(int(param.low), int(param.high))  # both bounds included
    if param.log:
        return cs.loguniform(param.low, param.high)
    return cs.uniform(param.low, param.high)


class SyneTuneMethod:
    """Syne Tune's ``ASHA`` (random search) or ``BOHB`` (ASHA + KDE) scheduler."""

    def __init__(
        self,
        problem: Problem,
        *,
        kind: str,
        seed: int,
        divisor: float,
        num_samples: int | None,
    ) -> None:
        from syne_tune.optimizer import baselines

        logging.getLogger("syne_tune").setLevel(logging.WARNING)
        np.random.seed(seed)  # Syne Tune's bracket choice uses NumPy's global generator
        space = {p.name: _syne_domain(p) for p in problem.space}
        common = {
            "config_space": space,
            "metric": METRIC,
            "time_attr": "epoch",
            "max_t": problem.max_length,
            "do_minimize": True,
            "random_seed": seed,
            "grace_period": 1,
            "reduction_factor": divisor,
        }
        cls = {"asha": baselines.ASHA, "bohb": baselines.BOHB}[kind]
        self.scheduler = cls(**common)
        self.max_length = problem.max_length
        self.num_samples = num_samples
        self.trials: dict[str, Any] = {}

    def next_job(self) -> Job | None:
        import datetime

        from syne_tune.backend.trial_status import Trial

        if self.num_samples is not None and len(self.trials) >= self.num_samples:
            return None
        suggestion = self.scheduler.suggest()
        if suggestion is None:
            return None
        trial = Trial(
            trial_id=len(self.trials),
            config=dict(suggestion.config),
            creation_time=datetime.datetime.now(),
        )
        trial_id = f"s{trial.trial_id}"
        self.trials[trial_id] = trial
        self.scheduler.on_trial_add(trial)
        return Job(trial_id, _plain(trial.config))

    def report(self, trial_id: str, length: int, value: float) -> Outcome:
        from syne_tune.optimizer.scheduler import SchedulerDecision

        trial = self.trials[trial_id]
        decision = self.scheduler.on_trial_result(trial, {METRIC: value, "epoch": length})
        if decision == SchedulerDecision.STOP or length >= self.max_length:
            self.scheduler.on_trial_remove(trial)
            return Outcome.STOP
        return Outcome.CONTINUE

    def close(self) -> None:
        pass


def _plain(config: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, (np.integer,)):
            value = int(value)
        elif isinstance(value, (np.floating,)):
            value = float(value)
        out[key] = value
    return out
