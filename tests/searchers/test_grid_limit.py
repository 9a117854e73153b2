"""Grid size: computed from the counts before anything is built, capped, and points made lazily."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from searchers import (
    DEFAULT_MAX_GRID_TRIALS,
    build_search_method,
    check_grid_size,
    preview_plan,
)
from searchers._simple import GridSearch
from searchers._space import HyperparameterSpace, _nest, grid_values
from searchlab.config import load_experiment_config
from searchlab.errors import ConfigError

SPACES: list[dict[str, Any]] = [
    {"x": {"type": "int", "minval": 8, "maxval": 64, "count": 4}},
    {"x": {"type": "int", "minval": 1, "maxval": 3, "count": 100}},  # c = min(count, 3)
    {"x": {"type": "int", "minval": 5, "maxval": 5, "count": 7}},
    {
        "b": {"type": "categorical", "vals": [1, 2, 3]},
        "a": {"x": {"type": "double", "minval": 0.1, "maxval": 0.5, "count": 3}},
        "c": {"type": "log", "minval": -5, "maxval": -3, "base": 10, "count": 1},
        "d": [1, 2],
        "e": {"type": "const", "val": {"nested": True}},
    },
    {},
]


def _product_reference(space: HyperparameterSpace) -> list[dict[str, Any]]:
    """The grid as SPEC defines it: the product of the axes, first leaf slowest."""
    paths = [spec.path for spec in space.specs]
    axes = [grid_values(spec) for spec in space.specs]
    return [_nest(list(zip(paths, point))) for point in itertools.product(*axes)]


@pytest.mark.parametrize("raw", SPACES)
def test_the_computed_size_and_the_lazy_points_match_the_product(raw: dict[str, Any]) -> None:
    space = HyperparameterSpace(raw, grid=True)
    reference = _product_reference(space)

    assert space.grid_size() == len(reference)
    assert list(space.grid()) == reference
    assert [space.grid_point(i) for i in range(len(reference))] == reference


def test_grid_point_out_of_range() -> None:
    space = HyperparameterSpace(SPACES[0], grid=True)

    with pytest.raises(IndexError, match=r"^grid point 4 out of range; the grid has 4 points$"):
        space.grid_point(4)


def _huge() -> HyperparameterSpace:
    return HyperparameterSpace(
        {
            "a": {"type": "int", "minval": 0, "maxval": 10**12, "count": 10**6},
            "b": {"type": "double", "minval": 0.0, "maxval": 1.0, "count": 10**6},
            "c": {"type": "categorical", "vals": ["x", "y"]},
            "d": 1,
        },
        grid=True,
    )


@pytest.mark.timeout(20)
def test_a_grid_over_the_limit_is_refused_naming_its_biggest_axes() -> None:
    with pytest.raises(
        ConfigError,
        match=r"^grid\.yaml: hyperparameters\.a\.count: grid search would run "
        r"2,000,000,000,000 trials \(hyperparameters\.a\.count 1,000,000 x "
        r"hyperparameters\.b\.count 1,000,000 x hyperparameters\.c\.vals 2\), more than the "
        r"limit of 100,000; lower the counts, or allow it with --max-grid-trials 2000000000000 "
        r"\(max_grid_trials=2000000000000 in Python\)$",
    ):
        check_grid_size(_huge(), DEFAULT_MAX_GRID_TRIALS, "grid.yaml")


def test_an_int_axis_counts_only_its_distinct_values() -> None:
    space = HyperparameterSpace(
        {"a": {"type": "int", "minval": 1, "maxval": 10, "count": 10**9}}, grid=True
    )

    assert check_grid_size(space, 10, "grid.yaml") == 10


def test_more_than_three_axes_are_summed_up() -> None:
    space = HyperparameterSpace(
        {
            k: {"type": "categorical", "vals": list(range(n))}
            for k, n in zip("abcde", [2, 3, 4, 5, 6])
        },
        grid=True,
    )

    with pytest.raises(
        ConfigError,
        match=r"^g\.yaml: hyperparameters\.e\.vals: grid search would run 720 trials "
        r"\(hyperparameters\.e\.vals 6 x hyperparameters\.d\.vals 5 x hyperparameters\.c\.vals 4 "
        r"x 2 more axes\), more than the limit of 100;",
    ):
        check_grid_size(space, 100, "g.yaml")


@pytest.mark.parametrize(("limit", "allowed"), [(720, True), (719, False), (None, True)])
def test_the_limit_is_inclusive_and_none_lifts_it(limit: int | None, allowed: bool) -> None:
    space = HyperparameterSpace(
        {k: {"type": "categorical", "vals": list(range(n))} for k, n in zip("abc", [8, 9, 10])},
        grid=True,
    )
    if allowed:
        assert check_grid_size(space, limit, "g.yaml") == 720
    else:
        with pytest.raises(ConfigError, match=r"--max-grid-trials 720 "):
            check_grid_size(space, limit, "g.yaml")


@pytest.mark.parametrize("limit", [0, -5, 2.5, True, "10"])
def test_a_bad_limit_is_refused(limit: Any) -> None:
    with pytest.raises(
        ConfigError,
        match=r"^max_grid_trials \(--max-grid-trials\): must be an integer >= 1, or None for no "
        rf"limit, got {limit!r}$",
    ):
        check_grid_size(HyperparameterSpace({}), limit, "g.yaml")


# --- through the config -------------------------------------------------------------------

HUGE_GRID = """\
name: huge
entrypoint: model_def:Trial
hyperparameters:
  width: {type: int, minval: 1, maxval: 2000000000, count: 1e9}
  lr: {type: log, base: 10, minval: -5, maxval: -1, count: 1000000}
  act: {type: categorical, vals: [relu, gelu]}
searcher: {name: grid, metric: loss, max_length: 10, max_concurrent_trials: 4}
"""


@pytest.fixture
def huge_config(tmp_path: Path) -> Any:
    path = tmp_path / "huge.yaml"
    path.write_text(HUGE_GRID)
    return load_experiment_config(path)


@pytest.mark.timeout(20)
@pytest.mark.parametrize("build", [build_search_method, preview_plan])
def test_the_driver_and_the_preview_refuse_a_huge_grid_at_once(
    huge_config: Any, build: Any
) -> None:
    with pytest.raises(
        ConfigError,
        match=r"^huge\.yaml: hyperparameters\.width\.count: grid search would run "
        r"2,000,000,000,000,000 trials .*--max-grid-trials 2000000000000000 ",
    ):
        build(huge_config)


@pytest.mark.timeout(20)
def test_an_allowed_huge_grid_previews_without_enumerating(huge_config: Any) -> None:
    plan = preview_plan(huge_config, max_grid_trials=None)

    assert plan["brackets"] == [
        {"rungs": 1, "trials": 2 * 10**15, "concurrency": 4, "rung_ends": [10]}
    ]
    assert plan["trials_per_length"] == {"10": 2 * 10**15}


@pytest.mark.timeout(20)
def test_an_allowed_huge_grid_starts_at_once_and_resumes_where_it_was(huge_config: Any) -> None:
    search = build_search_method(huge_config, max_grid_trials=10**16)
    assert isinstance(search, GridSearch) and search.num_points == 2 * 10**15
    first = [search.start_trial(f"t{i}") for i in range(3)]

    assert [s.hparams for s in first if s is not None] == [
        {"act": "relu", "lr": pytest.approx(1e-5), "width": 1},
        {"act": "relu", "lr": pytest.approx(1e-5), "width": 3},
        {"act": "relu", "lr": pytest.approx(1e-5), "width": 5},
    ]
    state = json.loads(json.dumps(search.state_dict()))
    resumed = build_search_method(huge_config, max_grid_trials=None)
    resumed.load_state_dict(state)
    next_start = resumed.start_trial("t3")
    assert next_start is not None and next_start.hparams["width"] == 7
    assert not resumed.finished


def test_other_searchers_check_the_limit_argument_too(tmp_path: Path) -> None:
    path = tmp_path / "random.yaml"
    path.write_text(
        "entrypoint: m:T\nhyperparameters: {lr: 0.1}\n"
        "searcher: {name: random, metric: loss, max_length: 10, max_trials: 3}\n"
    )
    cfg = load_experiment_config(path)

    assert preview_plan(cfg, max_grid_trials=1)["trials_per_length"] == {"10": 3}
    with pytest.raises(ConfigError, match=r"^max_grid_trials \(--max-grid-trials\): must be"):
        build_search_method(cfg, max_grid_trials=0)
