"""The stopping variant (``stop_once: true``, SPEC.md "Stopping")."""

from __future__ import annotations

import pytest

from searchers._base import Action, Decision, ExitReason
from searchers.adaptive import AdaptiveSearch, StoppingRungs, build_async_halving_plan

BOTH_WAYS = pytest.mark.parametrize("smaller_is_better", [True, False])


def _search(
    smaller_is_better: bool, *, max_trials: int = 8, concurrency: int = 8
) -> AdaptiveSearch:
    """Three rungs (4, 8, 16), divisor 2, one bracket."""
    plan = build_async_halving_plan(
        16, max_trials, num_rungs=3, divisor=2, max_concurrent_trials=concurrency
    )
    return AdaptiveSearch(
        plan, lambda trial_id: {}, smaller_is_better=smaller_is_better, stop_once=True
    )


def _raw(value: float, smaller_is_better: bool) -> float:
    return value if smaller_is_better else -value


def _start(search: AdaptiveSearch, *trial_ids: str) -> None:
    for trial_id in trial_ids:
        assert search.start_trial(trial_id) is not None, trial_id


def _results(search: AdaptiveSearch) -> list[tuple[int, int]]:
    return [(row["results"], row["promoted"]) for row in search.rung_table()[0]["rungs"]]


def test_rung_keeps_the_top_fraction_and_the_first_result() -> None:
    rungs = StoppingRungs([4, 8, 16], divisor=2)
    for _ in range(4):
        rungs.admit()
    assert rungs.record("a", 0, 5.0, alive=True)  # 1 result: quota max(0, 1) = 1
    assert rungs.record("b", 0, 1.0, alive=True)  # rank 0 of 2, quota 1
    assert not rungs.record("c", 0, 9.0, alive=True)  # rank 2 of 3, quota 1
    assert rungs.record("d", 0, 3.0, alive=True)  # rank 1 of 4, quota 2
    assert [(e.trial_id, e.promoted) for e in rungs.rungs[0].entries] == [
        ("b", True),
        ("d", True),
        ("a", True),
        ("c", False),
    ]
    assert rungs.rungs[1].outstanding == 3


def test_rung_ranks_a_newcomer_ahead_of_equal_results() -> None:
    rungs = StoppingRungs([4, 8], divisor=2)
    rungs.admit()
    rungs.admit()
    assert rungs.record("a", 0, 1.0, alive=True)
    assert rungs.record("b", 0, 1.0, alive=True)  # ahead of a: rank 0 < quota 1
    assert [e.trial_id for e in rungs.rungs[0].entries] == ["b", "a"]


def test_exited_trial_never_goes_on_even_as_the_first_result() -> None:
    rungs = StoppingRungs([4, 8], divisor=2)
    rungs.admit()
    assert not rungs.record("a", 0, float("inf"), alive=False)


@BOTH_WAYS
def test_decisions_continue_or_stop(smaller_is_better: bool) -> None:
    search = _search(smaller_is_better)
    _start(search, "a", "b", "c", "d")
    decisions = [
        search.report(t, 4, _raw(v, smaller_is_better))
        for t, v in [("a", 5.0), ("b", 1.0), ("c", 9.0), ("d", 3.0)]
    ]
    assert decisions == [
        Decision(Action.CONTINUE, 8),
        Decision(Action.CONTINUE, 8),
        Decision(Action.STOP),
        Decision(Action.CONTINUE, 8),
    ]
    assert search.report("b", 8, _raw(1.0, smaller_is_better)) == Decision(Action.CONTINUE, 16)
    assert search.report("b", 16, _raw(1.0, smaller_is_better)) == Decision(Action.STOP)
    assert search.next_resume() is None
    assert search.closed_trials() == []


@BOTH_WAYS
def test_ties_let_the_newcomer_go_on(smaller_is_better: bool) -> None:
    search = _search(smaller_is_better)
    _start(search, "a", "b")
    assert search.report("a", 4, _raw(1.0, smaller_is_better)).action is Action.CONTINUE
    assert search.report("b", 4, _raw(1.0, smaller_is_better)).action is Action.CONTINUE


@BOTH_WAYS
def test_a_stop_makes_room_for_a_new_trial(smaller_is_better: bool) -> None:
    search = _search(smaller_is_better, max_trials=3, concurrency=2)
    _start(search, "a", "b")
    assert search.start_trial("c") is None
    search.report("a", 4, _raw(1.0, smaller_is_better))  # goes on: no new trial
    assert search.start_trial("c") is None
    assert search.report("b", 4, _raw(2.0, smaller_is_better)) == Decision(Action.STOP)
    _start(search, "c")
    assert search.report("c", 4, _raw(3.0, smaller_is_better)) == Decision(Action.STOP)
    assert search.start_trial("d") is None  # all 3 trials were created
    assert not search.finished
    search.report("a", 16, _raw(1.0, smaller_is_better))
    assert search.finished


@BOTH_WAYS
def test_a_result_past_several_rung_ends_counts_at_each(smaller_is_better: bool) -> None:
    search = _search(smaller_is_better)
    _start(search, "a", "b")
    assert search.report("a", 9, _raw(1.0, smaller_is_better)) == Decision(Action.CONTINUE, 16)
    assert search.trial_position("a") == (0, 2)
    assert search.report("b", 20, _raw(0.5, smaller_is_better)) == Decision(Action.STOP)
    assert _results(search) == [(2, 2), (2, 2), (1, 0)]


@BOTH_WAYS
def test_report_below_the_rung_end_is_not_a_result(smaller_is_better: bool) -> None:
    search = _search(smaller_is_better)
    _start(search, "a")
    assert search.report("a", 3, _raw(1.0, smaller_is_better)) == Decision(Action.CONTINUE, 4)
    assert _results(search)[0] == (0, 0)


@BOTH_WAYS
def test_errored_trial_counts_worst_and_is_replaced(smaller_is_better: bool) -> None:
    search = _search(smaller_is_better, max_trials=3, concurrency=2)
    _start(search, "a", "b")
    search.trial_exited("a", ExitReason.ERRORED)
    assert _results(search)[0] == (1, 0)
    _start(search, "c")
    # The errored result is the worst: b ranks first of 2 and goes on.
    assert search.report("b", 4, _raw(7.0, smaller_is_better)).action is Action.CONTINUE


@BOTH_WAYS
def test_invalid_hp_trial_is_forgotten_and_replaced(smaller_is_better: bool) -> None:
    search = _search(smaller_is_better, max_trials=2, concurrency=2)
    _start(search, "a", "b")
    search.report("a", 4, _raw(1.0, smaller_is_better))
    search.trial_exited("a", ExitReason.INVALID_HP)
    assert _results(search)[0] == (0, 0)
    _start(search, "c")
    assert search.start_trial("d") is None
    search.report("b", 16, _raw(1.0, smaller_is_better))
    search.report("c", 16, _raw(2.0, smaller_is_better))
    assert search.finished
