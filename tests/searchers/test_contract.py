"""One contract, every registered searcher, built the way experiments build them.

Each searcher in ``searchers.SEARCHERS`` is built from a config through
``build_search_method`` (the path production takes) and driven by ``SearchDriver`` with a
fake runner of a few slots. Whatever the searcher, it must hand out trials whose rung ends
rise to the searcher's length, answer every result, respect ``max_concurrent_trials``, end,
and save a JSON-able state from which a copy makes the same decisions.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from searchers import (
    SEARCHERS,
    Action,
    ExitReason,
    RunnerStatus,
    SearchDriver,
    adaptive_plan,
    build_search_method,
)
from searchers._driver import FINISHED
from searchlab.config import SearcherName, load_experiment_config

MAX_LENGTH = 16
HPARAMS = {
    "global_batch_size": 8,
    "lr": {"type": "log", "base": 10, "minval": -3, "maxval": -1, "count": 3},
    "width": {"type": "int", "minval": 4, "maxval": 16, "count": 2},
    "act": {"type": "categorical", "vals": ["relu", "tanh"]},
}
SEARCHER_FIELDS: dict[SearcherName, dict[str, Any]] = {
    SearcherName.SINGLE: {},
    SearcherName.GRID: {"max_concurrent_trials": 2},
    SearcherName.RANDOM: {"max_trials": 6, "max_concurrent_trials": 2},
    SearcherName.ADAPTIVE_ASHA: {
        "max_trials": 8,
        "mode": "standard",
        "divisor": 2,
        "max_concurrent_trials": 2,
    },
    SearcherName.ASYNC_HALVING: {
        "max_trials": 8,
        "num_rungs": 3,
        "divisor": 2,
        "max_concurrent_trials": 2,
    },
}


def test_every_registered_searcher_is_under_contract() -> None:
    assert set(SEARCHERS) == set(SEARCHER_FIELDS)


def _config(name: SearcherName, smaller_is_better: bool = True) -> Any:
    searcher = {
        "name": name.value,
        "metric": "loss",
        "smaller_is_better": smaller_is_better,
        "max_length": {"batches": MAX_LENGTH},
        **SEARCHER_FIELDS[name],
    }
    config = {
        "name": "contract",
        "entrypoint": "m:T",
        "hyperparameters": HPARAMS,
        "searcher": searcher,
        "reproducibility": {"experiment_seed": 5},
    }
    return load_experiment_config(config)


def _value(hparams: dict[str, Any], length: int) -> float:
    return round(hparams["lr"] * 100 + hparams["width"] / length + (hparams["act"] == "tanh"), 9)


def _drive(
    driver: SearchDriver, started: tuple[str, ...] = (), slots: int = 3, steps: int = 2000
) -> dict[str, list[int]]:
    """Run the search to its end (``started``: trials handed out already); returns the
    lengths each trial reported at."""
    status = dict.fromkeys(started, RunnerStatus.PENDING)
    trained = dict.fromkeys(started, 0)
    reported: dict[str, list[int]] = {t: [] for t in started}
    for _ in range(steps):
        while sum(s is RunnerStatus.PENDING for s in status.values()) < slots:
            tid = f"t{len(status)}"
            plan = driver.suggest(tid)
            if plan is None or plan == FINISHED:
                break
            status[tid], trained[tid], reported[tid] = RunnerStatus.PENDING, 0, []
        choice = driver.choose(dict(status))
        for tid in choice.stop:
            status[tid] = RunnerStatus.ENDED
            driver.on_exit(tid, ExitReason.COMPLETED)
        if choice.run:
            status[choice.run] = RunnerStatus.PENDING
        for tid in [t for t, s in status.items() if s is RunnerStatus.PENDING][:slots]:
            if sum(s is RunnerStatus.RUNNING for s in status.values()) < slots:
                status[tid] = RunnerStatus.RUNNING
        running = [t for t, s in status.items() if s is RunnerStatus.RUNNING]
        if not running:
            if driver.finished and not any(s is RunnerStatus.PENDING for s in status.values()):
                return reported
            continue
        tid = running[0]
        plan = driver.plan(tid)
        assert plan is not None
        nxt = next(e for e in plan.rung_ends if e > trained[tid])
        trained[tid] = nxt
        reported[tid].append(nxt)
        action = driver.on_result(tid, nxt, _value(plan.hparams, nxt))
        if nxt == plan.rung_ends[-1] or action is Action.STOP:
            status[tid] = RunnerStatus.ENDED
            driver.on_exit(tid, ExitReason.COMPLETED)
        elif action is Action.PAUSE:
            status[tid] = RunnerStatus.PAUSED
    raise AssertionError("the search did not end")


@pytest.mark.parametrize("name", list(SEARCHER_FIELDS), ids=lambda n: n.value)
@pytest.mark.parametrize("smaller_is_better", [True, False])
class TestSearcherContract:
    def test_trials_rise_to_the_searchers_length_and_the_search_ends(
        self, name: SearcherName, smaller_is_better: bool
    ) -> None:
        driver = SearchDriver(build_search_method(_config(name, smaller_is_better)))
        reported = _drive(driver)
        assert reported and driver.finished and driver.method.finished
        for tid, lengths in reported.items():
            plan = driver.plan(tid)
            assert plan is not None
            assert (
                plan.rung_ends == sorted(set(plan.rung_ends)) and plan.rung_ends[-1] == MAX_LENGTH
            )
            assert lengths == plan.rung_ends[: len(lengths)]  # each rung once, in order
            assert 0 <= plan.trial_seed < 2**31

    def test_no_more_trials_run_at_once_than_max_concurrent_trials(
        self, name: SearcherName, smaller_is_better: bool
    ) -> None:
        config = _config(name, smaller_is_better)
        cap = SEARCHER_FIELDS[name].get("max_concurrent_trials")
        if name in (SearcherName.ADAPTIVE_ASHA, SearcherName.ASYNC_HALVING):
            cap = max(cap, len(adaptive_plan(config).brackets))  # at least one per bracket
        driver = SearchDriver(build_search_method(config))
        started = [
            t for t in (f"t{i}" for i in range(10)) if driver.suggest(t) not in (None, FINISHED)
        ]
        assert started
        if cap:
            assert len(started) <= cap  # the registry passes the cap on (grid included)

    def test_a_saved_state_makes_the_same_decisions(
        self, name: SearcherName, smaller_is_better: bool
    ) -> None:
        config = _config(name, smaller_is_better)
        first = SearchDriver(build_search_method(config))
        live = tuple(t for t in ("a", "b") if first.suggest(t) not in (None, FINISHED))
        assert live
        saved = json.loads(json.dumps(first.state_dict()))
        copy = SearchDriver(build_search_method(config))
        copy.load_state_dict(saved)
        assert _drive(copy, live) == _drive(first, live)  # same trials, same hparams, same ends
        assert [copy.plan(t) for t in ("t0", "t1")] == [first.plan(t) for t in ("t0", "t1")]
        assert copy.method.state_dict() == first.method.state_dict()
