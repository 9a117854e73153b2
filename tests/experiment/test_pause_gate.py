"""While a trial's pause is under way and the next trial could only take its place, the
adapters hand Tune no trial to start.

Tune starts what it is handed in the same step; with the pausing trial's worker still busy
saving, that is a new worker process, which Tune drops once the pause frees the old one (the
end-to-end case is in ``test_adaptive_e2e.py``). These tests pin the gate itself.
"""

from __future__ import annotations

import pickle
from types import SimpleNamespace
from typing import Any
from unittest import mock

from ray.tune.experiment import Trial
from ray.tune.schedulers import TrialScheduler

from searchers._base import Action
from searchers._driver import Choice
from searchlab.experiment._adapters import GatedSearcher, RunControl, SearchScheduler
from searchlab.experiment._protocol import TrialReport
from searchlab.experiment._tune import _trials_that_fit


def _parts(concurrency: int = 1) -> tuple[mock.Mock, GatedSearcher, SearchScheduler]:
    driver = mock.Mock()
    driver.suggest.return_value = None  # "ask later": no trial config to build
    driver.choose.return_value = Choice()
    control = RunControl(concurrency=concurrency)
    searcher = GatedSearcher(driver, "validation_loss", smaller_is_better=True, control=control)
    return driver, searcher, SearchScheduler(searcher, smaller_is_better=True)


def _rung_result(length: int) -> dict[str, Any]:
    return TrialReport(length=length, rung=0).attach({"validation_loss": 0.5})


def _controller(*trials: Any) -> Any:
    return SimpleNamespace(get_trials=lambda: list(trials))


def test_nothing_is_suggested_or_chosen_until_the_pause_is_done() -> None:
    driver, searcher, scheduler = _parts()
    driver.on_result.return_value = Action.PAUSE
    trial = SimpleNamespace(trial_id="a", status=Trial.RUNNING)

    decision = scheduler.on_trial_result(_controller(trial), trial, _rung_result(4))

    assert decision == TrialScheduler.PAUSE
    assert searcher.control.hold_new_trials()
    assert searcher.suggest("b") is None
    assert scheduler.choose_trial_to_run(_controller(trial)) is None
    driver.suggest.assert_not_called()
    driver.choose.assert_not_called()

    trial.status = Trial.PAUSED  # Tune saved it and freed (or cached) its worker
    assert not searcher.control.hold_new_trials()
    searcher.suggest("b")
    scheduler.choose_trial_to_run(_controller(trial))
    driver.suggest.assert_called_once_with("b")
    driver.choose.assert_called_once()


def test_a_trial_that_fits_beside_the_pausing_one_is_not_held() -> None:
    driver, searcher, scheduler = _parts(concurrency=3)
    driver.on_result.return_value = Action.PAUSE
    pausing = SimpleNamespace(trial_id="a", status=Trial.RUNNING)
    running = SimpleNamespace(trial_id="b", status=Trial.RUNNING)
    scheduler.on_trial_add(_controller(pausing, running), running)

    scheduler.on_trial_result(_controller(pausing, running), pausing, _rung_result(4))

    assert not searcher.control.hold_new_trials()  # a third trial fits: a free place
    searcher.suggest("c")
    driver.suggest.assert_called_once_with("c")
    running.status = Trial.PENDING  # now the places are taken: only the pausing one's is left
    scheduler.on_trial_add(
        _controller(pausing, running), SimpleNamespace(trial_id="c", status=Trial.PENDING)
    )
    assert searcher.control.hold_new_trials()


def test_a_trial_that_goes_on_holds_nothing_back() -> None:
    driver, searcher, scheduler = _parts()
    driver.on_result.return_value = Action.CONTINUE
    trial = SimpleNamespace(trial_id="a", status=Trial.RUNNING)

    scheduler.on_trial_result(_controller(trial), trial, _rung_result(4))

    assert not searcher.control.hold_new_trials()
    searcher.suggest("b")
    driver.suggest.assert_called_once_with("b")


def test_a_pause_that_fails_releases_the_gate_even_if_tune_retries_the_trial() -> None:
    driver, searcher, scheduler = _parts()
    driver.on_result.return_value = Action.PAUSE
    trial = SimpleNamespace(trial_id="a", status=Trial.RUNNING, error_file=None)
    scheduler.on_trial_result(_controller(trial), trial, _rung_result(4))

    with mock.patch("searchlab.experiment._adapters.trial_error_text", return_value="boom"):
        scheduler.on_trial_error(_controller(trial), trial)  # Tune runs it again: RUNNING

    assert not searcher.control.hold_new_trials()


def test_the_gate_does_not_travel_with_tunes_pickles() -> None:
    control = RunControl(concurrency=1)
    control.pause_started(SimpleNamespace(trial_id="a", status=Trial.RUNNING))  # type: ignore[arg-type]

    copy = pickle.loads(pickle.dumps(control))

    assert control.hold_new_trials() and not copy.hold_new_trials()


def test_the_concurrency_grows_to_the_most_trials_seen_busy() -> None:
    # Started as 1 (a cluster whose GPU nodes had not joined yet), then two trials ran: a
    # pause with the other trial running fills that, one running alone does not.
    control = RunControl(concurrency=1)
    pausing = SimpleNamespace(trial_id="a", status=Trial.RUNNING)
    other = SimpleNamespace(trial_id="b", status=Trial.RUNNING)
    control.track(other)  # type: ignore[arg-type]
    control.pause_started(pausing)  # type: ignore[arg-type]

    assert control.hold_new_trials() and control.concurrency == 2
    other.status = Trial.TERMINATED
    assert not control.hold_new_trials()  # a place is free beside the pausing trial


def test_fractional_gpus_count_every_trial_that_fits() -> None:
    cfg = SimpleNamespace(
        resources=SimpleNamespace(slots_per_trial=1),
        searcher=SimpleNamespace(max_concurrent_trials=0),
    )
    fit = _trials_that_fit(cfg, {"cpu": 1, "gpu": 0.2}, {"CPU": 16.0, "GPU": 1.0})  # type: ignore[arg-type]
    assert fit == 5  # 1.0 // 0.2 is 4.0 in floating point
