"""The figures of ``search_efficiency``: budget ratios and the comparison with random search."""

from __future__ import annotations

from typing import Any

import pytest
from _mf_report import ratios_for, summary_of, worse_than_random

GRID = [10, 20, 30, 40]


def _method(iqm: list[float | None], budget: float = 40.0) -> dict[str, Any]:
    return {"iqm": iqm, "final_iqm": iqm[-1], "budget": budget}


def test_ratio_is_the_budget_to_reach_the_peers_final_over_its_budget() -> None:
    methods = {
        "searchlab_asha_tpe": _method([0.5, 0.3, 0.2, 0.1]),
        "ray_asha": _method([0.6, 0.4, 0.35, 0.3]),
        "random": _method([None, 0.9, 0.8, 0.05]),
    }
    ratios = ratios_for("searchlab_asha_tpe", methods, GRID)
    assert ratios == {"ray_asha": pytest.approx(0.5), "random": None}


@pytest.mark.parametrize(("from_budget", "worse"), [(10, True), (30, False)])
def test_worse_than_random_counts_from_the_first_full_length_trials(
    from_budget: int, worse: bool
) -> None:
    methods = {"m": _method([0.5, 0.3, 0.2, 0.1]), "random": _method([0.4, None, 0.3, 0.2])}
    result = worse_than_random("m", methods, GRID, from_budget)
    assert result["worse"] is worse
    assert result["any_budget"] == [10]


def test_summary_takes_the_worst_problem_and_states_the_goals() -> None:
    def problem(ray_ratio: float | None) -> dict[str, Any]:
        return {
            "searchlab_ratios": {"searchlab_asha_tpe": {"ray_asha": ray_ratio, "random": 0.1}},
            "worse_than_random": {
                "searchlab_asha_tpe": {"worse": False, "budgets": [], "any_budget": []}
            },
        }

    summary = summary_of({"a": problem(0.2), "b": problem(0.6)}, "searchlab_asha_tpe")
    assert summary["budget_ratio_vs_ray_asha"] == 0.6
    assert summary["meets"] == {
        "ray_asha_at_most_0.5": False,
        "every_peer_below_1": True,
        "never_worse_than_random": True,
    }
    never = summary_of({"a": problem(None)}, "searchlab_asha_tpe")
    assert never["budget_ratio_vs_ray_asha"] is None
    assert never["meets"]["ray_asha_at_most_0.5"] is False
