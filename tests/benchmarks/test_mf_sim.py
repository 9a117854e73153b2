"""The simulated runner and the method adapters of ``search_efficiency.py``."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest
from _mf_methods import (
    OptunaHyperband,
    RayASHA,
    SearchlabMethod,
    searchlab_config,
    searchlab_trials_for_budget,
)
from _mf_problems import SyntheticCurves
from _mf_sim import Job, Outcome, Report, best_so_far, simulate
from _mf_stats import budget_to_reach, iqm


class _Line:
    """A curve whose value is 1 / t, no noise."""

    def observe(self, t: int) -> float:
        return 1.0 / t

    true = observe


class _PauseOnce:
    """Two trials; each pauses at unit 2, then both resume and stop at 4."""

    def __init__(self) -> None:
        self.started, self.paused, self.resumed = 0, [], 0

    def next_job(self) -> Job | None:
        if self.started < 2:
            self.started += 1
            return Job(f"t{self.started}", {"x": self.started})
        if len(self.paused) == 2 or (self.paused and self.resumed):
            self.resumed += 1
            return Job(self.paused.pop(0))
        return None

    def report(self, trial_id: str, length: int, value: float) -> Outcome:
        if length == 2:
            self.paused.append(trial_id)
            return Outcome.PAUSE
        return Outcome.STOP if length == 4 else Outcome.CONTINUE

    def close(self) -> None:
        pass


def test_a_resumed_trial_repeats_nothing() -> None:
    result = simulate(_PauseOnce(), lambda hp: _Line(), workers=2, max_length=4, budget=100)
    assert result.spent == 8 and result.ended == "finished"
    assert result.resumes == 2
    lengths = Counter((r.trial_id, r.length) for r in result.reports)
    assert set(lengths.values()) == {1} and len(lengths) == 8


def test_the_run_ends_when_the_budget_is_spent() -> None:
    result = simulate(_PauseOnce(), lambda hp: _Line(), workers=2, max_length=4, budget=5)
    assert result.spent == 5 and result.ended == "budget"
    assert [r.spent for r in result.reports] == [1, 2, 3, 4, 5]


def test_best_so_far_follows_the_lowest_observed_value() -> None:
    reports = [
        Report(1, 1, "a", 1, 0.5, 0.6),
        Report(2, 1, "b", 1, 0.7, 0.1),
        Report(3, 2, "a", 2, 0.4, 0.45),
    ]
    assert best_so_far(reports, [0, 1, 2, 3], use_true=False) == [np.inf, 0.5, 0.5, 0.4]
    assert best_so_far(reports, [3], use_true=True, optimum=0.05) == [pytest.approx(0.4)]


def _searchlab(problem: Any, budget: int, **kw: Any) -> SearchlabMethod:
    common = {"workers": 4, "divisor": 3.0, "seed": 0}
    trials = searchlab_trials_for_budget(problem, budget, **common, **kw)
    cfg = searchlab_config(problem, name="adaptive_asha", max_trials=trials, **common, **kw)
    return SearchlabMethod(cfg, 4)


@pytest.mark.parametrize("stop_once", [False, True])
def test_searchlab_adaptive_finishes_its_plan_without_repeating_work(stop_once: bool) -> None:
    problem = SyntheticCurves(max_length=27)
    method = _searchlab(problem, 10_000, stop_once=stop_once)
    result = simulate(
        method, lambda hp: problem.curve(hp, 0), workers=4, max_length=27, budget=10**6
    )
    assert result.ended == "finished"
    per_trial = Counter(r.trial_id for r in result.reports)
    assert sum(per_trial.values()) == result.spent  # every unit once
    assert max(r.length for r in result.reports) == 27
    assert (result.resumes > 0) is not stop_once  # promotion resumes paused trials
    assert method.driver.finished


def test_searchlab_trials_for_budget_fits_the_preview() -> None:
    from searchers import adaptive_plan
    from searchlab.config import load_experiment_config

    problem = SyntheticCurves(max_length=81)
    common = {"workers": 8, "divisor": 3.0, "seed": 0}
    trials = searchlab_trials_for_budget(problem, 2430, **common)

    def total(n: int) -> int:
        cfg = searchlab_config(problem, name="adaptive_asha", max_trials=n, **common)
        return adaptive_plan(load_experiment_config(cfg)).total_length()

    assert total(trials) <= 2430 < total(trials + 1)


def test_ray_asha_stops_trials_and_never_trains_past_max_t() -> None:
    problem = SyntheticCurves(max_length=27)
    method = RayASHA(problem, seed=0, divisor=3.0, num_samples=30)
    result = simulate(
        method, lambda hp: problem.curve(hp, 0), workers=4, max_length=27, budget=10**6
    )
    lengths = Counter(r.trial_id for r in result.reports)
    assert result.trials == 30 and result.ended == "finished"
    assert max(lengths.values()) == 27 and min(lengths.values()) == 1


def test_optuna_prunes_with_hyperband() -> None:
    problem = SyntheticCurves(max_length=27)
    method = OptunaHyperband(problem, seed=0, divisor=3.0, n_trials=40)
    result = simulate(
        method, lambda hp: problem.curve(hp, 0), workers=4, max_length=27, budget=10**6
    )
    lengths = Counter(r.trial_id for r in result.reports).values()
    assert result.trials == 40 and min(lengths) < 27 == max(lengths)


def test_syne_tune_asha_runs_when_installed() -> None:
    pytest.importorskip("syne_tune")
    from _mf_methods import SyneTuneMethod

    problem = SyntheticCurves(max_length=9)
    method = SyneTuneMethod(problem, kind="asha", seed=0, divisor=3.0, num_samples=20)
    result = simulate(
        method, lambda hp: problem.curve(hp, 0), workers=2, max_length=9, budget=10**6
    )
    assert result.trials == 20 and result.ended == "finished"


def test_iqm_drops_the_outer_quarters() -> None:
    assert iqm([1, 2, 3, 4, 100, -100, 2.5, 3.5]) == pytest.approx(np.mean([2, 2.5, 3, 3.5]))
    assert iqm([5.0]) == 5.0
    assert budget_to_reach(np.array([3.0, 2.0, 1.0]), [10, 20, 30], 2.0) == 20.0
    assert budget_to_reach(np.array([3.0, 2.0, 1.0]), [10, 20, 30], 0.5) is None
