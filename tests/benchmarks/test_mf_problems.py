"""The problems of ``search_efficiency.py``: curves that cross, noise fixed by the seed."""

from __future__ import annotations

import math

import numpy as np
import pytest
from _mf_problems import H6_ARGMIN, H6_MIN, DigitsCurves, SyntheticCurves, hartmann6, make_problem


def _random_hparams(rng: np.random.Generator) -> dict[str, float]:
    return {"lr": 10 ** rng.uniform(-4, 0), **{f"x{i}": rng.uniform() for i in range(1, 6)}}


def test_hartmann6_has_its_published_minimum() -> None:
    assert hartmann6(H6_ARGMIN) == pytest.approx(H6_MIN, abs=1e-4)
    assert hartmann6([0.5] * 6) > H6_MIN + 0.5


def test_synthetic_curves_cross() -> None:
    """Some pairs of configurations swap their order between the first and the last unit."""
    problem = SyntheticCurves()
    rng = np.random.default_rng(0)
    curves = [problem.curve(_random_hparams(rng), seed=0) for _ in range(200)]
    first = np.array([c.true(1) for c in curves])
    last = np.array([c.true(problem.max_length) for c in curves])
    swapped = np.sum(
        np.sign(first[:, None] - first[None, :]) != np.sign(last[:, None] - last[None, :])
    )
    assert swapped / (len(curves) * (len(curves) - 1)) > 0.1
    order_first, order_last = np.argsort(np.argsort(first)), np.argsort(np.argsort(last))
    assert np.corrcoef(order_first, order_last)[0, 1] < 0.9


def test_synthetic_best_configuration_is_slow_at_first_and_best_at_the_end() -> None:
    problem = SyntheticCurves()
    best = problem.curve(problem._z_to_hparams(H6_ARGMIN), seed=0)
    faster = {**problem._z_to_hparams(H6_ARGMIN), "lr": 0.3, "x5": 0.5}  # a higher lr, x5
    fast = problem.curve(faster, seed=0)
    assert best.true(1) > fast.true(1)
    assert best.true(problem.max_length) < fast.true(problem.max_length)
    assert problem.optimum == pytest.approx(min(best.true(t) for t in range(1, 82)))


def test_synthetic_observations_are_deterministic_per_seed() -> None:
    problem = SyntheticCurves()
    hp = _random_hparams(np.random.default_rng(1))
    a, b, c = problem.curve(hp, 3), problem.curve(hp, 3), problem.curve(hp, 4)
    units = range(1, problem.max_length + 1)
    assert [a.observe(t) for t in units] == [b.observe(t) for t in units]
    assert [a.observe(t) for t in units] != [c.observe(t) for t in units]
    assert [a.true(t) for t in units] == [c.true(t) for t in units]
    noise = np.array([a.observe(t) - a.true(t) for t in units])
    assert 0.003 < noise.std() < 0.03


def test_synthetic_curves_have_a_late_rise_for_low_x3() -> None:
    problem = SyntheticCurves()
    curve = problem.curve({"lr": 0.5, "x1": 0.5, "x2": 0.5, "x3": 0.0, "x4": 0.5, "x5": 0.9}, 0)
    values = [curve.true(t) for t in range(1, problem.max_length + 1)]
    assert values.index(min(values)) < len(values) - 1


def test_digits_training_is_deterministic_and_learns() -> None:
    problem = DigitsCurves(max_length=3)
    hp = {"lr": 0.1, "width": 32, "weight_decay": 1e-4, "dropout": 0.1}
    a, b = problem.curve(hp, seed=0), problem.curve(hp, seed=0)
    assert [a.observe(t) for t in (1, 2, 3)] == [b.observe(t) for t in (3, 2, 1)][::-1]
    assert a.observe(3) < 0.5


def test_digits_divergence_counts_as_guessing() -> None:
    curve = DigitsCurves(max_length=2).curve(
        {"lr": 1e6, "width": 16, "weight_decay": 0.0, "dropout": 0.0}, seed=0
    )
    assert math.isfinite(curve.observe(2)) and curve.observe(2) >= 0.5


def test_make_problem_names_the_choices() -> None:
    with pytest.raises(
        ValueError, match=r"problem is 'mnist', but must be one of \['digits', 'synthetic'\]"
    ):
        make_problem("mnist")
