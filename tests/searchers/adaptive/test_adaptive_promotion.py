"""The promotion rule (SPEC.md "Promotion"): rungs alone, then through AdaptiveSearch."""

from __future__ import annotations

import pytest

from searchers._base import Action, Decision, ExitReason
from searchers.adaptive import (
    AdaptiveSearch,
    Promotion,
    PromotionRungs,
    build_async_halving_plan,
)

BOTH_WAYS = pytest.mark.parametrize("smaller_is_better", [True, False])


def _always(trial_id: str) -> bool:
    return True


def _record(rungs: PromotionRungs, trial_id: str, value: float, index: int = 0) -> Promotion | None:
    return rungs.record(trial_id, index, value, alive=True, can_resume=_always)


def _rungs(divisor: float, trials: int) -> PromotionRungs:
    rungs = PromotionRungs([4, 16, 64], divisor)
    for _ in range(trials):
        rungs.admit()
    return rungs


def _search(
    smaller_is_better: bool, *, max_trials: int = 4, concurrency: int = 4
) -> AdaptiveSearch:
    """Two rungs (8, 16), divisor 2, one bracket."""
    plan = build_async_halving_plan(
        16, max_trials, num_rungs=2, divisor=2, max_concurrent_trials=concurrency
    )
    return AdaptiveSearch(
        plan, lambda trial_id: {"id": trial_id}, smaller_is_better=smaller_is_better
    )


def _raw(value: float, smaller_is_better: bool) -> float:
    """The metric a trial reports for a smaller-is-better ``value``."""
    return value if smaller_is_better else -value


def _start(search: AdaptiveSearch, *trial_ids: str) -> None:
    for trial_id in trial_ids:
        assert search.start_trial(trial_id) is not None, trial_id


def _rung_counts(search: AdaptiveSearch, rung: int) -> tuple[int, int, int]:
    row = search.rung_table()[0]["rungs"][rung]
    return row["results"], row["promoted"], row["outstanding"]


# The rung state machine.


def test_rung_promotes_nobody_before_divisor_results() -> None:
    rungs = _rungs(divisor=4, trials=4)
    assert [_record(rungs, t, v) for t, v in [("a", 1.0), ("b", 2.0), ("c", 3.0)]] == [None] * 3
    assert _record(rungs, "d", 4.0) == Promotion("a", 1, now=False)
    assert [e.trial_id for e in rungs.rungs[0].entries] == ["a", "b", "c", "d"]
    assert rungs.rungs[1].outstanding == 1


def test_newcomer_in_the_top_goes_on_at_once() -> None:
    rungs = _rungs(divisor=2, trials=2)
    assert _record(rungs, "a", 5.0) is None
    assert _record(rungs, "b", 1.0) == Promotion("b", 1, now=True)
    assert [(e.trial_id, e.promoted) for e in rungs.rungs[0].entries] == [("b", True), ("a", False)]


def test_newcomer_ranks_after_equal_results() -> None:
    rungs = _rungs(divisor=2, trials=2)
    _record(rungs, "a", 1.0)
    assert _record(rungs, "b", 1.0) == Promotion("a", 1, now=False)


def test_result_already_promoted_is_not_promoted_twice() -> None:
    rungs = _rungs(divisor=2, trials=4)
    _record(rungs, "a", 5.0)
    assert _record(rungs, "b", 1.0) == Promotion("b", 1, now=True)
    assert _record(rungs, "c", 0.0) == Promotion("c", 1, now=True)
    # Quota 1 -> 2, but the result at position 1 (b) went on already.
    assert _record(rungs, "d", 9.0) is None
    assert rungs.rungs[0].num_promoted == 2


def test_trial_that_cannot_resume_is_passed_over() -> None:
    rungs = _rungs(divisor=2, trials=2)
    _record(rungs, "a", 1.0)
    assert rungs.record("b", 0, 2.0, alive=True, can_resume=lambda t: t != "a") is None
    assert rungs.rungs[0].num_promoted == 0


def test_close_out_goes_bottom_up_and_stops_at_a_rung_still_waiting() -> None:
    rungs = _rungs(divisor=2, trials=4)
    for trial_id, value in [("a", 1.0), ("b", 2.0), ("c", 3.0)]:
        _record(rungs, trial_id, value)
    assert rungs.close_out(num_trials=4) == []  # rung 0 does not hold 4 results yet
    _record(rungs, "d", 4.0)
    assert rungs.close_out(num_trials=4) == ["c", "d"]
    _record(rungs, "a", 1.0, index=1)
    assert rungs.close_out(num_trials=4) == ["c", "d"]  # rung 1 still waits for b
    assert _record(rungs, "b", 2.0, index=1) == Promotion("a", 2, now=False)
    # Rung 1 is through; a went on to the last rung, whose trials are done anyway.
    assert rungs.close_out(num_trials=4) == ["c", "d", "b"]


# Decisions of the search.


@BOTH_WAYS
def test_decisions_pause_continue_and_stop(smaller_is_better: bool) -> None:
    search = _search(smaller_is_better)
    start = search.start_trial("a")
    assert start is not None
    assert (start.train_to, start.rung_ends, start.bracket) == (8, [8, 16], 0)
    assert start.hparams == {"id": "a"}
    _start(search, "b")
    assert search.report("a", 8, _raw(5.0, smaller_is_better)) == Decision(Action.PAUSE)
    assert search.report("b", 8, _raw(1.0, smaller_is_better)) == Decision(Action.CONTINUE, 16)
    assert search.trial_position("b") == (0, 1)
    assert search.report("b", 16, _raw(1.0, smaller_is_better)) == Decision(Action.STOP)


@BOTH_WAYS
def test_better_value_is_promoted_whichever_the_direction(smaller_is_better: bool) -> None:
    search = _search(smaller_is_better)
    _start(search, "a", "b")
    search.report("a", 8, _raw(1.0, smaller_is_better))
    assert search.report("b", 8, _raw(2.0, smaller_is_better)) == Decision(Action.PAUSE)
    assert search.next_resume() == ("a", 16)
    assert search.next_resume() is None


@BOTH_WAYS
def test_ties_promote_the_earlier_result(smaller_is_better: bool) -> None:
    search = _search(smaller_is_better)
    _start(search, "a", "b")
    search.report("a", 8, _raw(1.0, smaller_is_better))
    assert search.report("b", 8, _raw(1.0, smaller_is_better)) == Decision(Action.PAUSE)
    assert search.next_resume() == ("a", 16)


@BOTH_WAYS
def test_report_below_rung_end_continues_without_a_result(smaller_is_better: bool) -> None:
    search = _search(smaller_is_better)
    _start(search, "a")
    assert search.report("a", 5, _raw(9.0, smaller_is_better)) == Decision(Action.CONTINUE, 8)
    assert _rung_counts(search, 0) == (0, 0, 1)


@BOTH_WAYS
def test_promoted_trials_resume_before_new_trials_start(smaller_is_better: bool) -> None:
    search = _search(smaller_is_better, max_trials=8, concurrency=2)
    _start(search, "a", "b")
    assert search.start_trial("x") is None  # bracket concurrency reached
    search.report("a", 8, _raw(1.0, smaller_is_better))  # promotes nobody: a new trial is owed
    search.report("b", 8, _raw(2.0, smaller_is_better))  # promotes a: no new trial for this
    assert search.start_trial("c") is None  # a must resume first
    assert search.next_resume() == ("a", 16)
    _start(search, "c")
    assert search.start_trial("d") is None


@BOTH_WAYS
def test_errored_trial_counts_worst_and_the_bracket_goes_on(smaller_is_better: bool) -> None:
    search = _search(smaller_is_better, max_trials=4, concurrency=2)
    _start(search, "a", "b")
    search.trial_exited("a", ExitReason.ERRORED)
    assert search.state_dict()["brackets"][0]["rungs"][0]["entries"] == [["a", "inf", False]]
    _start(search, "c")  # owed: the error promoted nobody
    # Any real result beats the errored one, so b goes on at once.
    assert search.report("b", 8, _raw(3.0, smaller_is_better)) == Decision(Action.CONTINUE, 16)


@BOTH_WAYS
def test_promotion_that_lands_on_an_exited_trial_resumes_nothing(smaller_is_better: bool) -> None:
    search = _search(smaller_is_better, max_trials=4, concurrency=2)
    _start(search, "a", "b")
    search.trial_exited("a", ExitReason.ERRORED)
    _start(search, "c")
    # Quota grows to 1 and lands on a (the older of two equal worst results): a is not resumed,
    # and as nobody was promoted, a new trial is owed instead.
    search.trial_exited("b", ExitReason.USER_CANCELED)
    assert search.next_resume() is None
    assert _rung_counts(search, 0) == (2, 0, 1)
    _start(search, "d")


@BOTH_WAYS
def test_trial_that_errors_after_promotion_is_not_resumed(smaller_is_better: bool) -> None:
    search = _search(smaller_is_better, max_trials=4, concurrency=2)
    _start(search, "a", "b")
    search.report("a", 8, _raw(1.0, smaller_is_better))
    _start(search, "c")
    search.report("b", 8, _raw(2.0, smaller_is_better))  # promotes a
    search.trial_exited("a", ExitReason.ERRORED)
    assert search.next_resume() is None
    # Its promotion is lost: it counts as the worst result of rung 1, and a trial is owed.
    assert _rung_counts(search, 1) == (1, 0, 0)
    assert search.trial_position("a") == (0, 1)
    _start(search, "d")


@BOTH_WAYS
def test_paused_trial_that_exits_counts_worst_at_its_rung(smaller_is_better: bool) -> None:
    search = _search(smaller_is_better)
    _start(search, "a", "b")
    search.report("a", 8, _raw(1.0, smaller_is_better))
    search.trial_exited("a", ExitReason.USER_CANCELED)
    # Without the exit, b's result would promote a; now b ranks first and goes on at once.
    assert search.report("b", 8, _raw(2.0, smaller_is_better)) == Decision(Action.CONTINUE, 16)
    assert search.next_resume() is None


@BOTH_WAYS
def test_close_out_returns_paused_trials_once(smaller_is_better: bool) -> None:
    search = _search(smaller_is_better)
    _start(search, "a", "b", "c", "d")
    for trial_id, value in [("a", 1.0), ("b", 2.0), ("c", 3.0)]:
        assert search.report(trial_id, 8, _raw(value, smaller_is_better)).action is Action.PAUSE
    assert search.closed_trials() == []
    search.report("d", 8, _raw(4.0, smaller_is_better))
    assert search.closed_trials() == ["c", "d"]
    assert search.closed_trials() == []
    assert [search.next_resume(), search.next_resume()] == [("a", 16), ("b", 16)]
    assert not search.finished
    assert search.report("a", 16, _raw(1.0, smaller_is_better)) == Decision(Action.STOP)
    assert search.report("b", 16, _raw(2.0, smaller_is_better)) == Decision(Action.STOP)
    assert search.finished
    assert search.closed_trials() == []


@BOTH_WAYS
def test_invalid_hp_trial_is_replaced_and_not_counted(smaller_is_better: bool) -> None:
    search = _search(smaller_is_better, max_trials=2, concurrency=2)
    _start(search, "a", "b")
    search.trial_exited("a", ExitReason.INVALID_HP)
    _start(search, "c")
    assert search.start_trial("d") is None
    search.report("b", 8, _raw(1.0, smaller_is_better))
    search.report("c", 8, _raw(2.0, smaller_is_better))
    assert search.next_resume() == ("b", 16)
    assert search.closed_trials() == ["c"]
    assert search.report("b", 16, _raw(1.0, smaller_is_better)) == Decision(Action.STOP)
    assert search.finished


@BOTH_WAYS
def test_invalid_hp_after_promotion_forgets_every_result(smaller_is_better: bool) -> None:
    search = _search(smaller_is_better, max_trials=4, concurrency=2)
    _start(search, "a", "b")
    search.report("a", 8, _raw(1.0, smaller_is_better))
    _start(search, "c")
    search.report("b", 8, _raw(2.0, smaller_is_better))
    assert search.next_resume() == ("a", 16)
    search.trial_exited("a", ExitReason.INVALID_HP)
    assert _rung_counts(search, 0) == (1, 0, 1)
    assert _rung_counts(search, 1) == (0, 0, 0)
    _start(search, "d")


def test_exits_of_trials_the_search_is_through_with_change_nothing() -> None:
    search = _search(True, max_trials=4, concurrency=2)
    _start(search, "a", "b")
    search.report("a", 8, 5.0)
    _start(search, "c")
    search.report("b", 8, 1.0)  # b goes on at once, a stays paused
    search.report("b", 16, 1.0)  # last rung: b is done
    _start(search, "d")
    before = search.state_dict()
    search.trial_exited("b", ExitReason.COMPLETED)
    search.trial_exited("b", ExitReason.ERRORED)
    assert search.state_dict() == before


def test_misuse_raises_value_error() -> None:
    search = _search(True)
    _start(search, "a", "b")
    with pytest.raises(ValueError, match=r"trial 'a' was started before"):
        search.start_trial("a")
    with pytest.raises(ValueError, match=r"trial 'zz' is not a trial of this search"):
        search.report("zz", 8, 1.0)
    with pytest.raises(ValueError, match=r"trial 'zz' is not a trial of this search"):
        search.trial_exited("zz", ExitReason.ERRORED)
    search.report("a", 8, 1.0)
    with pytest.raises(ValueError, match=r"trial 'a' reported a result while paused"):
        search.report("a", 16, 1.0)
