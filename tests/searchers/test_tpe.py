"""Samplers: one contract run over both, and TPE's BOHB-style model choice."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import pytest

from searchers._space import HyperparameterSpace, RandomSampler, Sampler
from searchers._tpe import TPESampler, build_hparam_sampler
from searchlab.config import load_experiment_config

SPACE: dict[str, Any] = {
    "x": {"type": "double", "minval": 0.0, "maxval": 1.0},
    "opt": {
        "lr": {"type": "log", "minval": -4, "maxval": -1, "base": 10},
        "layers": {"type": "int", "minval": 1, "maxval": 6},
    },
    "act": {"type": "categorical", "vals": ["relu", [1, 2], {"k": "v"}]},
    "gbs": 32,
}


def objective(hp: dict[str, Any]) -> float:
    return (hp["x"] - 0.2) ** 2 + 0.01 * hp["opt"]["layers"]


def tpe(seed: int = 0) -> Sampler:
    return TPESampler(HyperparameterSpace(SPACE), seed, n_startup=5)


def rand(seed: int = 0) -> Sampler:
    return RandomSampler(HyperparameterSpace(SPACE), seed)


SAMPLERS: list[Callable[[int], Sampler]] = [rand, tpe]


def run(sampler: Sampler, start: int, stop: int, length: int = 100) -> list[dict[str, Any]]:
    out = []
    for i in range(start, stop):
        hp = sampler.sample(f"t{i}")
        sampler.observe(f"t{i}", length, objective(hp))
        out.append(hp)
    return out


def in_space(hp: dict[str, Any]) -> bool:
    return (
        0.0 <= hp["x"] <= 1.0
        and 1e-4 <= hp["opt"]["lr"] <= 1e-1
        and hp["opt"]["layers"] in range(1, 7)
        and hp["act"] in SPACE["act"]["vals"]
        and hp["gbs"] == 32
    )


@pytest.mark.parametrize("make", SAMPLERS, ids=["random", "tpe"])
def test_sampler_contract_values_in_space(make: Callable[[int], Sampler]) -> None:
    sampler = make(0)
    assert isinstance(sampler, Sampler)
    assert all(in_space(hp) for hp in run(sampler, 0, 25))


@pytest.mark.parametrize("make", SAMPLERS, ids=["random", "tpe"])
def test_sampler_contract_same_seed_same_sequence(make: Callable[[int], Sampler]) -> None:
    assert run(make(3), 0, 15) == run(make(3), 0, 15)
    assert run(make(3), 0, 15) != run(make(4), 0, 15)


@pytest.mark.parametrize("make", SAMPLERS, ids=["random", "tpe"])
def test_sampler_contract_state_round_trip(make: Callable[[int], Sampler]) -> None:
    uninterrupted = make(7)
    expected = run(uninterrupted, 0, 16)
    first = make(7)
    head = run(first, 0, 8)
    restored = make(7)
    restored.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert head + run(restored, 8, 16) == expected


@pytest.mark.parametrize("make", SAMPLERS, ids=["random", "tpe"])
def test_sampler_contract_forget_and_unknown_trials(make: Callable[[int], Sampler]) -> None:
    sampler = make(1)
    sampler.observe("never-sampled", 10, 1.0)
    sampler.sample("a")
    sampler.forget("a")
    sampler.forget("never-sampled")
    sampler.observe("a", 10, 1.0)
    assert in_space(sampler.sample("b"))


def test_tpe_samples_randomly_until_a_length_has_enough_results() -> None:
    sampler = TPESampler(HyperparameterSpace(SPACE), 0, n_startup=5)
    run(sampler, 0, 4)
    assert sampler.model_length() is None
    run(sampler, 4, 5)
    assert sampler.model_length() == 100


def test_tpe_default_startup() -> None:
    assert TPESampler(HyperparameterSpace(SPACE), 0).n_startup == 10
    many = {f"p{i}": {"type": "double", "minval": 0, "maxval": 1} for i in range(12)}
    assert TPESampler(HyperparameterSpace(many), 0).n_startup == 13


def test_tpe_models_the_longest_length_with_enough_results() -> None:
    sampler = TPESampler(HyperparameterSpace(SPACE), 0, n_startup=3)
    hps = run(sampler, 0, 6, length=10)
    for i in range(2):
        sampler.observe(f"t{i}", 40, objective(hps[i]))
    assert sampler.model_length() == 10
    sampler.observe("t2", 40, objective(hps[2]))
    assert sampler.model_length() == 40
    assert (sampler.observations_at(10), sampler.observations_at(40)) == (6, 3)


def test_tpe_moves_toward_good_regions() -> None:
    sampler = TPESampler(HyperparameterSpace(SPACE), 0, n_startup=10)
    startup = run(sampler, 0, 10)
    guided = run(sampler, 10, 40)[10:]
    mean_distance = lambda hps: sum(abs(hp["x"] - 0.2) for hp in hps) / len(hps)  # noqa: E731
    assert mean_distance(guided) < mean_distance(startup)
    assert mean_distance(guided) < 0.2


def test_tpe_repeat_result_replaces_and_forget_removes() -> None:
    sampler = TPESampler(HyperparameterSpace(SPACE), 0, n_startup=2)
    sampler.sample("a")
    sampler.observe("a", 10, 1.0)
    sampler.observe("a", 10, 0.5)
    assert sampler.observations_at(10) == 1
    assert sampler.state_dict()["observations"][0]["value"] == 0.5
    sampler.forget("a")
    assert sampler.observations_at(10) == 0


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_tpe_ignores_non_finite_results(value: float) -> None:
    sampler = TPESampler(HyperparameterSpace(SPACE), 0, n_startup=1)
    sampler.sample("a")
    sampler.observe("a", 10, value)
    assert sampler.observations_at(10) == 0


def test_tpe_with_only_constants() -> None:
    sampler = TPESampler(
        HyperparameterSpace({"a": 1, "b": {"type": "const", "val": [2]}}), 0, n_startup=1
    )
    for i in range(3):
        assert sampler.sample(f"t{i}") == {"a": 1, "b": [2]}
        sampler.observe(f"t{i}", 10, float(i))


def test_tpe_refuses_random_sampler_state() -> None:
    with pytest.raises(
        ValueError, match="cannot restore a TPE sampler from sampler state of kind 'random'"
    ):
        tpe().load_state_dict(rand().state_dict())


@pytest.mark.parametrize(
    ("searcher", "kind"),
    [
        ({"name": "random", "max_trials": 4}, RandomSampler),
        ({"name": "random", "max_trials": 4, "sampler": "tpe"}, TPESampler),
        ({"name": "adaptive_asha", "max_trials": 4, "sampler": "tpe"}, TPESampler),
        (
            {"name": "async_halving", "max_trials": 4, "num_rungs": 2, "sampler": "random"},
            RandomSampler,
        ),
        ({"name": "single"}, RandomSampler),
    ],
)
def test_build_hparam_sampler(searcher: dict[str, Any], kind: type) -> None:
    cfg = load_experiment_config(
        {
            "entrypoint": "m:T",
            "hyperparameters": SPACE,
            "searcher": {"metric": "loss", "max_length": 100, **searcher},
            "reproducibility": {"experiment_seed": 3},
        }
    )
    sampler = build_hparam_sampler(cfg)
    assert isinstance(sampler, kind)
    assert sampler.sample("a") == build_hparam_sampler(cfg, 3).sample("a")
    assert sampler.sample("b") != build_hparam_sampler(cfg, 4).sample("b")
