"""Whole searches through a fake driver loop; saving and restoring mid-search."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from searchers._base import Action, ExitReason
from searchers.adaptive import AdaptivePlan, AdaptiveSearch, build_adaptive_plan
from searchlab.errors import CheckpointError, ConfigError

BOTH_WAYS = pytest.mark.parametrize("smaller_is_better", [True, False])

ValueFn = Callable[[int, int], float]  # (trial number, length) -> smaller-is-better value


@dataclass
class Run:
    """What a fake driver saw: every event, and what each trial trained."""

    events: list[tuple[Any, ...]] = field(default_factory=list)
    lengths: dict[str, list[int]] = field(default_factory=dict)
    units: int = 0
    started: int = 0


def _new_search(plan: AdaptivePlan, smaller_is_better: bool, stop_once: bool) -> AdaptiveSearch:
    return AdaptiveSearch(
        plan,
        lambda trial_id: {"n": int(trial_id[1:])},
        smaller_is_better=smaller_is_better,
        stop_once=stop_once,
    )


def _restored(search: AdaptiveSearch) -> AdaptiveSearch:
    state = json.loads(json.dumps(search.state_dict(), allow_nan=False))
    fresh = _new_search(search.plan, search.smaller_is_better, search.stop_once)
    fresh.load_state_dict(state)
    return fresh


def _drive(
    plan: AdaptivePlan,
    value: ValueFn,
    *,
    smaller_is_better: bool = True,
    stop_once: bool = False,
    exits: dict[tuple[str, int], ExitReason] | None = None,
    restore_at: int | None = None,
) -> Run:
    """Run a whole search: resume promoted trials, start new ones while the search allows,
    train the oldest running trial to its target and report, stop closed trials.

    ``exits`` makes a trial exit instead of reporting at a length; ``restore_at`` swaps the
    search for one restored from its JSON state right after that step's report.
    """
    search = _new_search(plan, smaller_is_better, stop_once)
    exits = exits or {}
    run = Run()
    running: dict[str, int] = {}  # trial -> length to train to, oldest first
    paused: set[str] = set()
    brackets: dict[str, int] = {}
    for step in range(100_000):
        while (resume := search.next_resume()) is not None:
            trial_id, train_to = resume
            paused.remove(trial_id)
            running[trial_id] = train_to
            run.events.append(("resume", trial_id, train_to))
        while (start := search.start_trial(f"t{run.started}")) is not None:
            trial_id = f"t{run.started}"
            run.started += 1
            running[trial_id], run.lengths[trial_id] = start.train_to, []
            brackets[trial_id] = start.bracket or 0
            run.events.append(("start", trial_id, start.bracket, start.hparams))
        for b, bracket in enumerate(plan.brackets):
            assert sum(1 for t in running if brackets[t] == b) <= bracket.concurrency
        if not running:
            break
        trial_id = next(iter(running))
        train_to = running.pop(trial_id)
        if (trial_id, train_to) in exits:
            search.trial_exited(trial_id, exits[trial_id, train_to])
            run.events.append(("exit", trial_id))
        else:
            _train_and_report(search, run, trial_id, train_to, value, smaller_is_better)
            decision = run.events[-1][-1]
            if decision.action is Action.CONTINUE:
                running[trial_id] = decision.train_to
            elif decision.action is Action.PAUSE:
                paused.add(trial_id)
        if step == restore_at:  # with resumes and closed trials still to be collected
            search = _restored(search)
        for closed in search.closed_trials():
            paused.remove(closed)
            run.events.append(("closed", closed))
    assert search.finished
    assert not paused
    return run


def _train_and_report(
    search: AdaptiveSearch, run: Run, trial_id: str, train_to: int, value: ValueFn, sib: bool
) -> None:
    trained = run.lengths[trial_id][-1] if run.lengths[trial_id] else 0
    run.units += train_to - trained
    run.lengths[trial_id].append(train_to)
    v = value(int(trial_id[1:]), train_to)
    decision = search.report(trial_id, train_to, v if sib else -v)
    run.events.append(("report", trial_id, train_to, decision))


def _best_first(n: int, length: int) -> float:
    """Later trials are worse at every length: results reach each rung best first."""
    return n + 1.0 / length


def _scrambled(n: int, length: int) -> float:
    return (n * 7919) % 97 + 1.0 / length


def _final_lengths(run: Run) -> dict[int, int]:
    counts: dict[int, int] = {}
    for lengths in run.lengths.values():
        if lengths:
            counts[lengths[-1]] = counts.get(lengths[-1], 0) + 1
    return counts


def _assert_lengths_increase(run: Run) -> None:
    for trial_id, lengths in run.lengths.items():
        assert all(a < b for a, b in itertools.pairwise(lengths)), (trial_id, lengths)


@BOTH_WAYS
def test_full_aggressive_search_trains_what_the_plan_says(smaller_is_better: bool) -> None:
    plan = build_adaptive_plan(64, 16, mode="aggressive", divisor=4)
    assert [b.rung_ends for b in plan.brackets] == [[4, 16, 64]]
    run = _drive(plan, _best_first, smaller_is_better=smaller_is_better)
    assert run.started == 16
    assert run.units == plan.total_length() == 160
    assert {k: v for k, v in _final_lengths(run).items() if v} == {4: 12, 16: 3, 64: 1}
    _assert_lengths_increase(run)


@BOTH_WAYS
def test_full_standard_search_matches_the_promotion_preview(smaller_is_better: bool) -> None:
    plan = build_adaptive_plan(1000, 64)
    run = _drive(plan, _best_first, smaller_is_better=smaller_is_better)
    assert run.started == 64
    assert _final_lengths(run) == plan.trials_per_length() == {15: 34, 62: 20, 250: 9, 1000: 1}
    assert run.units == plan.total_length()
    _assert_lengths_increase(run)


PLANS = [
    pytest.param(1000, 256, {}, id="L1000-T256"),
    pytest.param(937, 16, {}, id="L937-T16"),
    pytest.param(1000, 64, {"mode": "conservative", "max_concurrent_trials": 0}, id="cons-C0"),
    pytest.param(1000, 100, {"divisor": 3, "max_concurrent_trials": 1}, id="d3-C1"),
    pytest.param(100, 30, {"divisor": 2.5, "bracket_rungs": [3, 1]}, id="d2.5-explicit"),
]


@pytest.mark.parametrize(("max_length", "max_trials", "kwargs"), PLANS)
def test_best_first_searches_end_where_the_preview_says(
    max_length: int, max_trials: int, kwargs: dict[str, Any]
) -> None:
    plan = build_adaptive_plan(max_length, max_trials, **kwargs)
    run = _drive(plan, _best_first)
    assert run.started == sum(b.num_trials for b in plan.brackets)
    preview = {length: n for length, n in plan.trials_per_length().items() if n}
    assert _final_lengths(run) == preview
    assert run.units == plan.total_length()


@pytest.mark.parametrize("stop_once", [False, True])
@pytest.mark.parametrize(("max_length", "max_trials", "kwargs"), PLANS)
def test_scrambled_searches_finish(
    max_length: int, max_trials: int, kwargs: dict[str, Any], stop_once: bool
) -> None:
    plan = build_adaptive_plan(max_length, max_trials, **kwargs)
    run = _drive(plan, _scrambled, stop_once=stop_once)
    assert run.started == sum(b.num_trials for b in plan.brackets)
    if not stop_once:
        assert run.units >= plan.total_length()
    _assert_lengths_increase(run)


def test_any_arrival_order_trains_at_least_the_preview() -> None:
    # A newcomer that beats promoted trials is promoted too: the preview is a lower bound.
    plan = build_adaptive_plan(1000, 64)
    run = _drive(plan, _scrambled)
    assert run.units == sum(lengths[-1] for lengths in run.lengths.values())
    assert run.units >= plan.total_length()
    _assert_lengths_increase(run)


@BOTH_WAYS
def test_full_stopping_search_never_pauses(smaller_is_better: bool) -> None:
    plan = build_adaptive_plan(1000, 64)
    run = _drive(plan, _scrambled, smaller_is_better=smaller_is_better, stop_once=True)
    assert run.started == 64
    decisions = [e[-1].action for e in run.events if e[0] == "report"]
    assert Action.PAUSE not in decisions
    assert not [e for e in run.events if e[0] in ("resume", "closed")]
    assert decisions.count(Action.STOP) == 64
    _assert_lengths_increase(run)


# For the standard plan L=64, T=16, C=5: bracket 0 rung ends [4, 16, 64], bracket 1 [16, 64].
EXITS = {
    ("t3", 16): ExitReason.ERRORED,  # bracket 1, before its first result
    ("t5", 4): ExitReason.INVALID_HP,
    ("t0", 16): ExitReason.USER_CANCELED,  # after it was promoted and resumed
    ("t8", 64): ExitReason.ERRORED,  # on its way to the last rung
}


def _steps(run: Run) -> int:
    return sum(1 for event in run.events if event[0] in ("report", "exit"))


@BOTH_WAYS
def test_search_with_exits_still_finishes(smaller_is_better: bool) -> None:
    plan = build_adaptive_plan(64, 16, mode="standard", max_concurrent_trials=5)
    run = _drive(plan, _scrambled, smaller_is_better=smaller_is_better, exits=EXITS)
    assert run.started == 17  # 16 counted, plus a replacement for the InvalidHP one
    assert [e[1] for e in run.events if e[0] == "exit"] == ["t3", "t5", "t0", "t8"]
    _assert_lengths_increase(run)


@pytest.mark.parametrize("stop_once", [False, True])
@BOTH_WAYS
def test_restored_search_makes_the_same_decisions(smaller_is_better: bool, stop_once: bool) -> None:
    plan = build_adaptive_plan(64, 16, mode="standard", max_concurrent_trials=5)
    kwargs: dict[str, Any] = {
        "smaller_is_better": smaller_is_better,
        "stop_once": stop_once,
        "exits": EXITS,
    }
    straight = _drive(plan, _scrambled, **kwargs)
    assert len([e for e in straight.events if e[0] == "exit"]) >= 3
    for restore_at in range(_steps(straight)):
        restored = _drive(plan, _scrambled, restore_at=restore_at, **kwargs)
        assert restored.events == straight.events, f"restored after step {restore_at}"


def test_state_dict_is_plain_json_with_infinities_as_strings() -> None:
    search = _new_search(build_adaptive_plan(64, 16, mode="aggressive"), True, False)
    assert search.start_trial("t0") is not None
    search.trial_exited("t0", ExitReason.ERRORED)
    text = json.dumps(search.state_dict(), allow_nan=False)
    assert '["t0", "inf", false]' in text


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"stop_once": True}, r"searcher stop_once is True, but the saved search state has False"),
        (
            {"smaller_is_better": False},
            r"searcher smaller_is_better is False, but the saved search state has True",
        ),
        ({"max_trials": 17}, r"searcher brackets is \[\{'rungs': 3, 'trials': 17"),
    ],
)
def test_state_from_another_config_is_refused(change: dict[str, Any], match: str) -> None:
    saved = _new_search(build_adaptive_plan(64, 16, mode="aggressive"), True, False).state_dict()
    plan = build_adaptive_plan(64, change.get("max_trials", 16), mode="aggressive")
    other = _new_search(plan, change.get("smaller_is_better", True), change.get("stop_once", False))
    with pytest.raises(ConfigError, match=match):
        other.load_state_dict(saved)


def test_state_of_another_version_is_refused() -> None:
    search = _new_search(build_adaptive_plan(64, 16, mode="aggressive"), True, False)
    state = {**search.state_dict(), "version": 99}
    with pytest.raises(CheckpointError, match=r"state version is 99, but must be 1"):
        search.load_state_dict(state)


def test_rung_table_counts_results_promotions_and_outstanding() -> None:
    search = _new_search(build_adaptive_plan(1000, 64), True, False)
    table = search.rung_table()
    assert [t["bracket"] for t in table] == [0, 1, 2]
    assert [[r["rung_end"] for r in t["rungs"]] for t in table] == [
        [15, 62, 250, 1000],
        [62, 250, 1000],
        [250, 1000],
    ]
    for n in range(6):
        start = search.start_trial(f"t{n}")
        assert start is not None and start.bracket == 0
    start = search.start_trial("t6")
    assert start is not None and start.bracket == 1  # bracket 0 has its 6 initial trials
    for n in range(4):
        search.report(f"t{n}", 15, float(n))
    rungs = search.rung_table()[0]["rungs"]
    assert rungs[0] == {
        "rung": 0,
        "rung_end": 15,
        "results": 4,
        "promoted": 1,
        "outstanding": 2,  # t4 and t5; the trials owed are not started yet
    }
    assert rungs[1]["outstanding"] == 1  # t0, promoted, waits to resume
    assert search.trial_position("t0") == (0, 1)
    assert search.trial_position("t6") == (1, 0)
