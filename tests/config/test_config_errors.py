"""Config errors (one line naming the file and the YAML path) and command-line overrides."""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

import pytest
import yaml

from searchlab.config import IgnoredFieldWarning, RandomConfig, load_experiment_config
from searchlab.errors import ConfigError


def base_config(**searcher: Any) -> dict[str, Any]:
    """A small valid random-search config; ``searcher`` overrides its searcher fields."""
    return {
        "entrypoint": "model_def:Trial",
        "hyperparameters": {"lr": {"type": "double", "minval": 0.1, "maxval": 0.5}},
        "searcher": {
            "name": "random",
            "metric": "loss",
            "max_length": {"batches": 100},
            "max_trials": 4,
            **searcher,
        },
    }


def write(tmp_path: Path, data: dict[str, Any] | str, name: str = "grid.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


# --- errors --------------------------------------------------------------------------------


def load_quietly(path: Path) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IgnoredFieldWarning)
        return load_experiment_config(path)


def _grid(lr: dict[str, Any]) -> dict[str, Any]:
    return {
        "entrypoint": "m:T",
        "hyperparameters": {"optimizer": {"lr": lr}},
        "searcher": {"name": "grid", "metric": "loss", "max_length": 10},
    }


ERRORS: list[tuple[dict[str, Any], str]] = [
    (base_config(max_trials=0), r"^grid\.yaml: searcher\.max_trials: must be >= 1, got 0$"),
    (
        base_config(max_trails=3),
        r"^grid\.yaml: searcher\.max_trails: unknown key; did you mean max_trials\?$",
    ),
    (
        base_config(name="hyperband"),
        r"^grid\.yaml: searcher\.name: unknown searcher 'hyperband'; valid names are: adaptive, "
        r"adaptive_asha, async_halving, grid, random, single$",
    ),
    (
        _grid({"type": "double", "minval": 0.1, "maxval": 1.0}),
        r"^grid\.yaml: hyperparameters\.optimizer\.lr\.count: missing; grid search needs .* \(e\.g\. count: 4\)$",
    ),
    (
        _grid({"type": "int", "minval": 9, "maxval": 1, "count": 2}),
        r"^grid\.yaml: hyperparameters\.optimizer\.lr\.minval: must be <= maxval, got minval=9 > maxval=1",
    ),
    (
        _grid({"type": "uniform", "minval": 1, "maxval": 2}),
        r"^grid\.yaml: hyperparameters\.optimizer\.lr\.type: unknown hyperparameter type 'uniform'; "
        r"valid types are: const, int, double, log, categorical \(a constant map with a .type. key "
        r"is written \{type: const, val: \{\.\.\.\}\}\)$",
    ),
    (
        _grid({"type": "int", "minval": 1, "maxval": 2, "cont": 2}),
        r"^grid\.yaml: hyperparameters\.optimizer\.lr\.cont: unknown key; did you mean count\?$",
    ),
    (
        _grid({"type": "int", "minval": 0.5, "maxval": 2, "count": 2}),
        r"hyperparameters\.optimizer\.lr\.minval: ",
    ),
    (
        _grid({"type": "categorical", "vals": []}),
        r"hyperparameters\.optimizer\.lr\.vals: must be a non-empty list",
    ),
    (
        _grid({"type": "log", "minval": 1, "maxval": 2, "base": 1, "count": 2}),
        r"optimizer\.lr\.base: must be",
    ),
    (
        _grid({"type": "int", "minval": 1, "maxval": 2, "count": 0}),
        r"optimizer\.lr\.count: must be an integer >= 1",
    ),
    (
        base_config(max_trials=None),
        r"^grid\.yaml: searcher\.max_trials: missing; random search needs it; set how many trials",
    ),
    (
        {
            **base_config(),
            "searcher": {"name": "adaptive_asha", "metric": "loss", "max_length": 10},
        },
        r"^grid\.yaml: searcher\.max_trials: missing; adaptive_asha search needs it",
    ),
    (
        {
            **base_config(),
            "searcher": {"name": "async_halving", "metric": "l", "max_length": 10, "max_trials": 2},
        },
        r"^grid\.yaml: searcher\.num_rungs: missing",
    ),
    (
        base_config(max_length={"batches": 0}),
        r"^grid\.yaml: searcher\.max_length\.batches: must be >= 1, got 0$",
    ),
    (base_config(max_length=-5), r"^grid\.yaml: searcher\.max_length: must be >= 1, got -5$"),
    (
        base_config(max_length={"steps": 5}),
        r"^grid\.yaml: searcher\.max_length\.steps: unknown unit; valid units",
    ),
    (
        base_config(max_length=None, time_metric="batches", max_time=0),
        r"^grid\.yaml: searcher\.max_length\.batches: must be >= 1, got 0$",
    ),
    (
        base_config(max_length=None),
        r"^grid\.yaml: searcher\.max_length: missing; set how far each trial trains",
    ),
    (
        base_config(time_metric="batches", max_time=10),
        r"^grid\.yaml: searcher\.max_length: give either max_length or time_metric \+ max_time, not both",
    ),
    (
        base_config(max_length=None, time_metric="steps", max_time=10),
        r"^grid\.yaml: searcher\.time_metric: must be one of batches, epochs, got 'steps'$",
    ),
    (base_config(max_length=None, max_time=10), r"^grid\.yaml: searcher\.time_metric: missing"),
    (base_config(metric=""), r"^grid\.yaml: searcher\.metric: must not be empty$"),
    (base_config(max_length=0), r"^grid\.yaml: searcher\.max_length: must be >= 1, got 0$"),
    (
        {**base_config(), "min_checkpoint_period": -2},
        r"^grid\.yaml: min_checkpoint_period: must be >= 0, got -2$",
    ),
    (
        {**base_config(), "min_validation_period": {"epochs": -1}},
        r"^grid\.yaml: min_validation_period\.epochs: must be >= 0, got -1$",
    ),
    (
        {**base_config(), "entrypoint": "python3 -m determined.launch.horovod python3 train.py"},
        r"^grid\.yaml: entrypoint: determined\.launch\.horovod: searchlab launches scripts with "
        r"torch\.distributed only; use python3 -m searchlab\.launch\.torch_distributed",
    ),
    (
        {**base_config(), "entrypoint": "model_def"},
        r"^grid\.yaml: entrypoint: must be 'module:Class'",
    ),
    (
        {k: v for k, v in base_config().items() if k != "entrypoint"},
        r"^grid\.yaml: entrypoint: missing; set entrypoint: module:TrialClass",
    ),
    ({"entrypoint": "m:T"}, r"^grid\.yaml: searcher: missing; add a searcher section"),
    (
        {**base_config(), "searcher": {"metric": "l", "max_length": 1}},
        r"^grid\.yaml: searcher\.name: missing; valid names are",
    ),
    (
        {**base_config(), "resources": {"slots_per_trail": 2}},
        r"^grid\.yaml: resources\.slots_per_trail: .*slots_per",
    ),
    (
        {**base_config(), "resources": {"slots_per_trial": 0}},
        r"^grid\.yaml: resources\.slots_per_trial: must be >= 1",
    ),
    (
        {**base_config(), "tensorboard_storage": {}},
        r"^grid\.yaml: tensorboard_storage: unknown key; valid keys are:",
    ),
    (
        {**base_config(), "checkpoint_policy": "latest"},
        r"^grid\.yaml: checkpoint_policy: must be one of 'best', 'all' or 'none'; got 'latest'$",
    ),
    (
        {**base_config(), "checkpoint_storage": {"type": "s3"}},
        r"^grid\.yaml: checkpoint_storage\.bucket: missing; type s3 needs bucket$",
    ),
    (
        {**base_config(), "environment": {"environment_variables": ["A=1", "B"]}},
        r"^grid\.yaml: environment\.environment_variables\[1\]: must be a 'KEY=VALUE' string, got 'B'$",
    ),
    (
        {**base_config(), "optimizations": {"aggregation_frequncy": 2}},
        r"^grid\.yaml: optimizations\.aggregation_frequncy: unknown key; did you mean aggregation_frequency\?$",
    ),
    (
        base_config(name="adaptive_asha", bracket_rungs=[2, 0]),
        r"^grid\.yaml: searcher\.bracket_rungs\[1\]: must be >= 1, got 0$",
    ),
    (base_config(name="adaptive_asha", divisor=1), r"^grid\.yaml: searcher\.divisor: must be > 1"),
    (
        base_config(name="adaptive_asha", mode="fast"),
        r"^grid\.yaml: searcher\.mode: must be one of 'aggressive'",
    ),
    (
        {
            **base_config(),
            "searcher": {"name": "grid", "metric": "l", "max_length": 1, "max_trials": 3},
        },
        r"max_trials",
    ),
    (
        base_config(sampler="cmaes"),
        r"^grid\.yaml: searcher\.sampler: must be one of 'random' or 'tpe'",
    ),
    (
        {**base_config(), "reproducibility": {"experiment_seed": -1}},
        r"reproducibility\.experiment_seed: must be >= 0",
    ),
    (
        {**base_config(), "max_restarts": "often"},
        r"^grid\.yaml: max_restarts: must be an integer, got 'often'$",
    ),
    ({**base_config(), "hyperparameters": [1, 2]}, r"^grid\.yaml: hyperparameters: must be a map"),
    (
        {**base_config(), "hyperparameters": {"a.b": 1}},
        r"^grid\.yaml: hyperparameters\.a\.b: hyperparameter names",
    ),
]


@pytest.mark.parametrize(("raw", "match"), ERRORS)
def test_config_errors_name_the_yaml_path(tmp_path: Path, raw: dict[str, Any], match: str) -> None:
    path = write(tmp_path, raw)
    with pytest.raises(ConfigError, match=match) as info:
        load_quietly(path)
    assert "\n" not in str(info.value)


def test_grid_with_max_trials_is_an_unknown_key(tmp_path: Path) -> None:
    raw = {
        **base_config(),
        "searcher": {"name": "grid", "metric": "l", "max_length": 1, "max_trials": 3},
    }
    with pytest.raises(ConfigError, match=r"^grid\.yaml: searcher\.max_trials: unknown key"):
        load_experiment_config(write(tmp_path, raw))


def test_several_problems_are_counted(tmp_path: Path) -> None:
    raw = {**base_config(max_trials=0), "max_restarts": -1}
    with pytest.raises(
        ConfigError,
        match=r"^grid\.yaml: [a-z_.]+: must be >= \S+, got -?\d \(and 1 more problem\)$",
    ):
        load_experiment_config(write(tmp_path, raw))


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (
            "entrypoint: m:T\nsearcher:\n  name: random\n  metric: loss\n   max_length: 3\n",
            r"^broken\.yaml: line 5, column 14: invalid YAML: mapping values are not allowed here",
        ),
        ("searcher: [1, 2\n", r"^broken\.yaml: line 2, column 1: invalid YAML"),
        (
            "entrypoint: m:T\nsearcher:\n  metric: a\n  metric: b\n",
            r"^broken\.yaml: line 4, column 3: invalid YAML: duplicate key 'metric'; keep only one$",
        ),
        ("", r"^broken\.yaml: <root>: the file is empty"),
        ("- 1\n- 2\n", r"^broken\.yaml: <root>: must be a map of config sections, got list$"),
    ],
)
def test_broken_yaml(tmp_path: Path, text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_experiment_config(write(tmp_path, text, "broken.yaml"))


def test_file_not_found(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(
        ConfigError,
        match=rf"^nope\.yaml: file not found: {re.escape(str(missing))}; check the path$",
    ):
        load_experiment_config(missing)


def test_directory_is_not_a_config(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"is a directory, not a YAML file"):
        load_experiment_config(tmp_path)


# --- overrides (good and bad) -----------------------------------------------------------------------------


def test_overrides(tmp_path: Path) -> None:
    path = write(tmp_path, {**base_config(), "labels": ["a", "b"]})
    cfg = load_experiment_config(
        path,
        [
            "searcher.max_trials=7",
            "hyperparameters.lr={type: log, minval: -4, maxval: -1, base: 10}",
            "hyperparameters.optimizer.momentum=0.9",
            "labels.1=c",
            "resources.slots_per_trial=2",
            "name=from override",
        ],
    )
    assert isinstance(cfg.searcher, RandomConfig) and cfg.searcher.max_trials == 7
    assert cfg.hyperparameters["lr"] == {"type": "log", "minval": -4, "maxval": -1, "base": 10}
    assert cfg.hyperparameters["optimizer"] == {"momentum": 0.9}
    assert cfg.labels == ["a", "c"]
    assert cfg.resources.slots_per_trial == 2
    assert cfg.name == "from override"


@pytest.mark.parametrize(
    ("override", "match"),
    [
        (
            "searcher.metric.x=1",
            r"^grid\.yaml: searcher\.metric\.x: cannot set .*searcher\.metric is str",
        ),
        ("searcher", r"^grid\.yaml: searcher: bad override 'searcher'; write key\.path=value"),
        ("a..b=1", r"^grid\.yaml: a\.\.b: bad override"),
        ("labels.5=x", r"^grid\.yaml: labels\.5: cannot set"),
        (
            "searcher.max_trials={a",
            r"^grid\.yaml: searcher\.max_trials: override value: line 1, .*invalid YAML",
        ),
        (
            "searcher.max_trails=3",
            r"^grid\.yaml: searcher\.max_trails: unknown key; did you mean max_trials\?$",
        ),
        ("searcher.max_trials=0", r"^grid\.yaml: searcher\.max_trials: must be >= 1, got 0$"),
    ],
)
def test_bad_overrides(tmp_path: Path, override: str, match: str) -> None:
    path = write(tmp_path, {**base_config(), "labels": ["a"]})
    with pytest.raises(ConfigError, match=match):
        load_experiment_config(path, [override])
