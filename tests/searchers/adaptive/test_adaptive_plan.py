"""Bracket and rung arithmetic of adaptive ASHA: the SPEC.md test vectors, previews, errors."""

from __future__ import annotations

import json
from typing import Any

import pytest

from searchers.adaptive import (
    AdaptivePlan,
    BracketPlan,
    Mode,
    allocate_concurrency,
    allocate_trials,
    build_adaptive_plan,
    build_async_halving_plan,
    compute_rung_ends,
)
from searchlab.errors import ConfigError


def _shape(plan: AdaptivePlan) -> list[tuple[int, int, int]]:
    return [(b.num_rungs, b.num_trials, b.concurrency) for b in plan.brackets]


@pytest.mark.parametrize(
    ("max_trials", "divisor", "rungs", "expected"),
    [
        (20, 3, [3, 2, 1], [12, 5, 3]),
        (50, 3, [4, 3], [35, 15]),
        (50, 4, [3, 2], [37, 13]),
        (100, 4, [4, 3, 2], [70, 22, 8]),
    ],
)
def test_bracket_trials_match_spec(
    max_trials: int, divisor: float, rungs: list[int], expected: list[int]
) -> None:
    assert allocate_trials(max_trials, divisor, rungs) == expected
    plan = build_adaptive_plan(10_000, max_trials, divisor=divisor, bracket_rungs=rungs)
    assert [b.num_trials for b in plan.brackets] == expected


@pytest.mark.parametrize(
    ("max_concurrent", "expected"),
    [(0, [3, 3, 3]), (11, [4, 4, 3]), (2, [1, 1, 1]), (3, [1, 1, 1])],
)
def test_bracket_concurrency_matches_spec(max_concurrent: int, expected: list[int]) -> None:
    assert allocate_concurrency(max_concurrent, 3, [9, 3, 1]) == expected


def test_rung_ends_match_spec() -> None:
    assert compute_rung_ends(4, 2, 10) == [1, 2, 5, 10]
    plan = build_async_halving_plan(10, 1, num_rungs=4, divisor=2)
    assert plan.brackets[0].rung_ends == [1, 2, 5, 10]


def test_standard_plan_l1000_t64() -> None:
    plan = build_adaptive_plan(1000, 64, mode="standard", divisor=4, max_rungs=5)
    assert _shape(plan) == [(4, 45, 6), (3, 14, 5), (2, 5, 5)]
    assert [b.rung_ends for b in plan.brackets] == [
        [15, 62, 250, 1000],
        [62, 250, 1000],
        [250, 1000],
    ]
    assert plan.divisor == 4.0


def test_standard_plan_l1000_t256() -> None:
    plan = build_adaptive_plan(1000, 256)
    assert _shape(plan) == [(5, 182, 6), (4, 56, 5), (3, 18, 5)]
    assert plan.brackets[0].rung_ends == [3, 15, 62, 250, 1000]


def test_standard_plan_l937_t16() -> None:
    plan = build_adaptive_plan(937, 16, mode=Mode.STANDARD)
    assert _shape(plan) == [(3, 12, 8), (2, 4, 8)]
    assert [b.rung_ends for b in plan.brackets] == [[58, 234, 937], [234, 937]]


def test_aggressive_plan_is_one_bracket() -> None:
    plan = build_adaptive_plan(1000, 64, mode="aggressive")
    assert _shape(plan) == [(4, 64, 16)]


def test_conservative_plan_has_every_rung_count() -> None:
    plan = build_adaptive_plan(1000, 64, mode="conservative")
    assert [b.num_rungs for b in plan.brackets] == [4, 3, 2, 1]
    assert plan.brackets[-1].rung_ends == [1000]


def test_bracket_rungs_override_mode_and_are_sorted_descending() -> None:
    plan = build_adaptive_plan(1000, 64, mode="aggressive", bracket_rungs=[2, 4, 3])
    assert [b.num_rungs for b in plan.brackets] == [4, 3, 2]


def test_rungs_are_limited_by_length_and_trials() -> None:
    assert [b.num_rungs for b in build_adaptive_plan(15, 1000, mode="aggressive").brackets] == [2]
    assert [b.num_rungs for b in build_adaptive_plan(10**6, 3, mode="aggressive").brackets] == [1]


def test_unlimited_concurrency_uses_last_bracket_trials_or_divisor() -> None:
    plan = build_adaptive_plan(1000, 64, max_concurrent_trials=0)
    assert [b.concurrency for b in plan.brackets] == [5, 5, 5]
    assert [b.initial_trials for b in plan.brackets] == [5, 5, 5]


def test_initial_trials_are_capped_by_bracket_trials() -> None:
    bracket = BracketPlan(num_rungs=2, num_trials=3, concurrency=8, rung_ends=[250, 1000])
    assert bracket.initial_trials == 3


def test_preview_stopping_matches_spec() -> None:
    plan = build_adaptive_plan(1000, 64)
    assert plan.trials_per_length(stop_once=True) == {15: 34, 62: 20, 250: 7, 1000: 3}
    assert plan.total_length(stop_once=True) == 15 * 34 + 62 * 20 + 250 * 7 + 1000 * 3


def test_preview_promotion_needs_divisor_results_to_promote() -> None:
    # Bracket 0: 45 -> 11 -> 2 -> 0 (2 < d results promote nobody); bracket 1: 14 -> 3 -> 0;
    # bracket 2: 5 -> 1.
    plan = build_adaptive_plan(1000, 64)
    assert plan.trials_per_length() == {15: 34, 62: 20, 250: 9, 1000: 1}
    assert plan.total_length() == 15 * 34 + 62 * 20 + 250 * 9 + 1000 * 1


@pytest.mark.parametrize(
    ("max_length", "max_trials", "stop_once", "expected"),
    [
        (1000, 256, True, {3: 137, 15: 76, 62: 34, 250: 6, 1000: 3}),
        (1000, 256, False, {3: 137, 15: 76, 62: 34, 250: 8, 1000: 1}),
        (937, 16, True, {58: 9, 234: 5, 937: 2}),
        (937, 16, False, {58: 9, 234: 6, 937: 1}),
    ],
)
def test_preview_other_spec_plans(
    max_length: int, max_trials: int, stop_once: bool, expected: dict[int, int]
) -> None:
    plan = build_adaptive_plan(max_length, max_trials)
    assert plan.trials_per_length(stop_once) == expected
    assert sum(expected.values()) == max_trials


def test_preview_lists_lengths_no_trial_ends_at() -> None:
    # 2 rungs, 3 trials, divisor 4: promotion sends nobody to 100; stopping sends the best one.
    plan = build_async_halving_plan(100, 3, num_rungs=2)
    assert plan.trials_per_length() == {25: 3, 100: 0}
    assert plan.trials_per_length(stop_once=True) == {25: 2, 100: 1}


def test_to_dict_is_json_with_string_lengths() -> None:
    data = json.loads(json.dumps(build_adaptive_plan(1000, 64).to_dict(stop_once=True)))
    assert data["brackets"][0] == {
        "rungs": 4,
        "trials": 45,
        "concurrency": 6,
        "rung_ends": [15, 62, 250, 1000],
    }
    assert data["trials_per_length"] == {"15": 34, "62": 20, "250": 7, "1000": 3}


def test_async_halving_plan_is_one_bracket_with_all_trials() -> None:
    plan = build_async_halving_plan(64, 16, num_rungs=3, divisor=4, max_concurrent_trials=5)
    assert _shape(plan) == [(3, 16, 5)]
    assert plan.brackets[0].rung_ends == [4, 16, 64]
    assert plan.total_length() == 4 * 12 + 16 * 3 + 64 * 1


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"divisor": 1}, r"divisor is 1, but must be > 1"),
        ({"divisor": 0.5}, r"divisor is 0\.5, but must be > 1"),
        ({"divisor": float("inf")}, r"divisor is inf, but must be > 1"),
        ({"divisor": "4"}, r"divisor is '4', but must be a number > 1"),
        ({"max_trials": 0}, r"max_trials is 0, but must be an int >= 1"),
        ({"max_trials": True}, r"max_trials is True, but must be an int >= 1"),
        ({"max_length": 0}, r"max_length is 0, but must be an int >= 1"),
        ({"max_length": 10.5}, r"max_length is 10\.5, but must be an int >= 1"),
        ({"max_rungs": 0}, r"max_rungs is 0, but must be an int >= 1"),
        ({"max_concurrent_trials": -1}, r"max_concurrent_trials is -1, but must be an int >= 0"),
        ({"bracket_rungs": [3, 0]}, r"bracket_rungs\[1\] is 0, but must be an int >= 1"),
        (
            {"mode": "fast"},
            r"mode is 'fast', but must be one of: aggressive, standard, conservative",
        ),
        (
            {"max_length": 2, "divisor": 1.5, "bracket_rungs": [3]},
            r"max_length is 2, but a bracket with 3 rungs and divisor 1\.5 needs rung ends "
            r"that strictly increase, and they would be \[1, 1, 2\]",
        ),
    ],
)
def test_bad_adaptive_arguments_raise_config_error(kwargs: dict[str, Any], match: str) -> None:
    arguments: dict[str, Any] = {"max_length": 1000, "max_trials": 64, **kwargs}
    with pytest.raises(ConfigError, match=match):
        build_adaptive_plan(**arguments)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_rungs": 0}, r"num_rungs is 0, but must be an int >= 1"),
        ({"divisor": 1.0}, r"divisor is 1\.0, but must be > 1"),
        ({"max_trials": -3}, r"max_trials is -3, but must be an int >= 1"),
        ({"num_rungs": 8}, r"max_length is 64, but a bracket with 8 rungs and divisor 4"),
    ],
)
def test_bad_async_halving_arguments_raise_config_error(kwargs: dict[str, Any], match: str) -> None:
    arguments: dict[str, Any] = {"max_length": 64, "max_trials": 16, "num_rungs": 3, **kwargs}
    with pytest.raises(ConfigError, match=match):
        build_async_halving_plan(**arguments)
