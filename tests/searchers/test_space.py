"""The hyperparameter space against SPEC section 2: grid vectors, order, sampling, names."""

from __future__ import annotations

import random
from typing import Any

import pytest

from searchers._space import (
    HyperparameterSpace,
    derive_seed,
    flatten_hparams,
    rng_state_from_json,
    rng_state_to_json,
    round_half_away,
    unflatten_hparams,
)
from searchlab.config import load_experiment_config
from searchlab.errors import ConfigError


def axis(spec: dict[str, Any]) -> list[Any]:
    return [point["x"] for point in HyperparameterSpace({"x": spec}).grid()]


@pytest.mark.parametrize(
    ("x", "expected"),
    [
        (2.5, 3),
        (-2.5, -3),
        (0.5, 1),
        (1.5, 2),
        (1.4999, 1),
        (-0.4, 0),
        (26.666, 27),
        (45.333, 45),
        (7.0, 7),
    ],
)
def test_round_half_away(x: float, expected: int) -> None:
    assert round_half_away(x) == expected


def test_int_grid_vector() -> None:
    assert axis({"type": "int", "minval": 8, "maxval": 64, "count": 4}) == [8, 27, 45, 64]


def test_int_grid_is_not_bankers_rounding() -> None:
    # 0 + 1*5/2 = 2.5 -> 3 (Python's round would give 2).
    assert axis({"type": "int", "minval": 0, "maxval": 5, "count": 3}) == [0, 3, 5]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"type": "int", "minval": 1, "maxval": 3, "count": 10}, [1, 2, 3]),
        ({"type": "int", "minval": 4, "maxval": 4, "count": 3}, [4]),
        ({"type": "int", "minval": 1, "maxval": 4, "count": 1}, [3]),
        ({"type": "int", "minval": -4, "maxval": -1, "count": 1}, [-3]),
        ({"type": "int", "minval": -10, "maxval": 10, "count": 5}, [-10, -5, 0, 5, 10]),
    ],
)
def test_int_grid_count_cap_and_midpoint(spec: dict[str, Any], expected: list[int]) -> None:
    values = axis(spec)
    assert values == expected
    assert all(isinstance(v, int) for v in values)


def test_double_grid_vector() -> None:
    assert axis({"type": "double", "minval": 0.1, "maxval": 0.5, "count": 3}) == pytest.approx(
        [0.1, 0.3, 0.5]
    )


def test_double_grid_midpoint_when_count_is_one() -> None:
    assert axis({"type": "double", "minval": 0.1, "maxval": 0.5, "count": 1}) == pytest.approx(
        [0.3]
    )


def test_log_grid_vector() -> None:
    values = axis({"type": "log", "minval": -5, "maxval": -3, "base": 10, "count": 3})
    assert values == pytest.approx([1e-5, 1e-4, 1e-3])


def test_log_grid_base_two_and_midpoint() -> None:
    assert axis({"type": "log", "minval": 0, "maxval": 4, "base": 2, "count": 3}) == pytest.approx(
        [1, 4, 16]
    )
    assert axis({"type": "log", "minval": 0, "maxval": 4, "base": 2, "count": 1}) == pytest.approx(
        [4]
    )


def test_categorical_in_order_and_const() -> None:
    assert axis({"type": "categorical", "vals": ["c", "a", [1, 2]]}) == ["c", "a", [1, 2]]
    assert axis({"type": "const", "val": {"k": 1}}) == [{"k": 1}]
    assert [p["x"] for p in HyperparameterSpace({"x": [1, 2]}).grid()] == [[1, 2]]


def test_grid_order_first_sorted_key_varies_slowest() -> None:
    space = HyperparameterSpace(
        {
            "b": {"type": "categorical", "vals": [1, 2]},
            "a": {"type": "categorical", "vals": ["x", "y"]},
            "c": 0,
        }
    )
    assert list(space.grid()) == [
        {"a": "x", "b": 1, "c": 0},
        {"a": "x", "b": 2, "c": 0},
        {"a": "y", "b": 1, "c": 0},
        {"a": "y", "b": 2, "c": 0},
    ]


def test_nested_groups_in_the_grid() -> None:
    space = HyperparameterSpace(
        {
            "optimizer": {
                "momentum": {"type": "categorical", "vals": [0.0, 0.9]},
                "lr": {"type": "log", "minval": -2, "maxval": -1, "base": 10, "count": 2},
            },
            "batch": {"type": "categorical", "vals": [32, 64]},
        }
    )
    points = list(space.grid())
    assert len(points) == space.grid_size() == 8
    assert points[0] == {"batch": 32, "optimizer": {"lr": pytest.approx(0.01), "momentum": 0.0}}
    assert points[1]["optimizer"]["momentum"] == 0.9
    assert points[2]["optimizer"]["lr"] == pytest.approx(0.1)
    assert [p["batch"] for p in points] == [32] * 4 + [64] * 4
    assert space.leaves() == ["batch", "optimizer.lr", "optimizer.momentum"]


def test_keys_are_sorted_per_level_not_as_dotted_strings() -> None:
    # "a" < "a-b" at the top level, although "a-b" < "a.x" as strings.
    space = HyperparameterSpace(
        {
            "a-b": {"type": "categorical", "vals": [1, 2]},
            "a": {"x": {"type": "categorical", "vals": [3, 4]}},
        }
    )
    assert space.leaves() == ["a.x", "a-b"]
    assert [(p["a"]["x"], p["a-b"]) for p in space.grid()] == [(3, 1), (3, 2), (4, 1), (4, 2)]


def test_grid_points_do_not_share_mutable_values() -> None:
    points = list(
        HyperparameterSpace(
            {"x": {"type": "const", "val": [1]}, "y": {"type": "categorical", "vals": [1, 2]}}
        ).grid()
    )
    points[0]["x"].append(2)
    assert points[1]["x"] == [1]


def test_grid_without_count_names_the_leaf() -> None:
    space = HyperparameterSpace(
        {"optimizer": {"lr": {"type": "double", "minval": 0.1, "maxval": 1.0}}}
    )
    with pytest.raises(
        ConfigError, match=r"hyperparameters\.optimizer\.lr\.count: missing; grid search needs"
    ):
        space.grid()
    with pytest.raises(ConfigError, match=r"hyperparameters\.optimizer\.lr\.count: missing"):
        HyperparameterSpace(
            {"optimizer": {"lr": {"type": "double", "minval": 0.1, "maxval": 1.0}}}, grid=True
        )


def test_invalid_space_is_a_config_error() -> None:
    with pytest.raises(
        ConfigError, match=r"hyperparameters\.lr\.type: unknown hyperparameter type 'normal'"
    ):
        HyperparameterSpace({"lr": {"type": "normal"}})


def test_from_config_requires_count_for_grid() -> None:
    raw = {
        "entrypoint": "m:T",
        "hyperparameters": {"lr": {"type": "int", "minval": 8, "maxval": 64, "count": 4}},
        "searcher": {"name": "grid", "metric": "loss", "max_length": 10},
    }
    space = HyperparameterSpace.from_config(load_experiment_config(raw))
    assert [p["lr"] for p in space.grid()] == [8, 27, 45, 64]


SAMPLE_SPACE = {
    "n": {"type": "int", "minval": 1, "maxval": 3},
    "d": {"type": "double", "minval": 0.25, "maxval": 0.5},
    "l": {"type": "log", "minval": -3, "maxval": -1, "base": 10},
    "c": {"type": "categorical", "vals": ["a", "b", "c"]},
    "k": {"type": "const", "val": 7},
    "group": {"m": 0.9},
}


def test_sample_distributions_cover_their_ranges() -> None:
    space = HyperparameterSpace(SAMPLE_SPACE)
    rng = random.Random(0)
    samples = [space.sample(rng) for _ in range(2000)]
    assert {s["n"] for s in samples} == {1, 2, 3}
    assert all(0.25 <= s["d"] < 0.5 for s in samples)
    assert all(1e-3 <= s["l"] < 1e-1 for s in samples)
    # Log-uniform: about half the samples below 10**-2.
    assert 0.4 < sum(s["l"] < 1e-2 for s in samples) / len(samples) < 0.6
    assert {s["c"] for s in samples} == {"a", "b", "c"}
    assert all(s["k"] == 7 and s["group"] == {"m": 0.9} for s in samples)


def test_sample_is_reproducible_from_the_seed() -> None:
    space = HyperparameterSpace(SAMPLE_SPACE)
    first = [space.sample(random.Random(5)) for _ in range(3)]
    assert first[0] == first[1] == first[2]
    assert space.sample(random.Random(5)) != space.sample(random.Random(6))


def test_leaves_len_and_dimensions() -> None:
    space = HyperparameterSpace(SAMPLE_SPACE)
    assert space.leaves() == ["c", "d", "group.m", "k", "l", "n"]
    assert len(space) == 6
    assert space.dimensions == 4


@pytest.mark.parametrize(
    ("nested", "flat"),
    [
        (
            {"optimizer": {"lr": 0.1, "beta": {"one": 0.9}}, "layers": 2},
            {"layers": 2, "optimizer.beta.one": 0.9, "optimizer.lr": 0.1},
        ),
        ({"empty": {}, "lst": [1, {"a": 1}]}, {"empty": {}, "lst": [1, {"a": 1}]}),
        ({}, {}),
    ],
)
def test_flatten_and_unflatten(nested: dict[str, Any], flat: dict[str, Any]) -> None:
    assert flatten_hparams(nested) == flat
    assert unflatten_hparams(flat) == nested


def test_rng_state_json_round_trip() -> None:
    import json

    rng = random.Random(3)
    rng.random()
    restored = random.Random()
    restored.setstate(rng_state_from_json(json.loads(json.dumps(rng_state_to_json(rng)))))
    assert [restored.random() for _ in range(3)] == [rng.random() for _ in range(3)]


def test_derive_seed_is_stable_and_in_range() -> None:
    assert derive_seed(42, "hparams") == derive_seed(42, "hparams")
    assert derive_seed(42, "hparams") != derive_seed(42, "trial_seed")
    assert all(0 <= derive_seed(s, "x") < 2**31 for s in range(100))
