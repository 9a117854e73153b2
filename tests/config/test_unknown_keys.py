"""A misspelled key is named first, with the closest valid key, before what it makes missing."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import yaml

from searchlab.config import IgnoredFieldWarning, load_experiment_config
from searchlab.errors import ConfigError


def _config(**changes: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "name": "typos",
        "entrypoint": "model_def:Trial",
        "hyperparameters": {"lr": {"type": "double", "minval": 0.1, "maxval": 0.5}},
        "searcher": {
            "name": "random",
            "metric": "loss",
            "max_length": {"batches": 100},
            "max_trials": 4,
        },
    }
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        node = raw
        for part in parents:
            node = node.setdefault(part, {})
        if value is None:
            del node[leaf]
        else:
            node[leaf] = value
    return raw


def _load(tmp_path: Path, raw: dict[str, Any]) -> Any:
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IgnoredFieldWarning)
        return load_experiment_config(path)


TYPOS: list[tuple[dict[str, Any], str]] = [
    (
        _config(searcher__max_trials=None, searcher__max_trails=4),
        r"searcher\.max_trails: unknown key; did you mean max_trials\?$",
    ),
    (
        _config(searcher__max_length=None, searcher__max_lenght={"batches": 100}),
        r"searcher\.max_lenght: unknown key; did you mean max_length\?$",
    ),
    (
        _config(searcher__metric=None, searcher__metirc="loss"),
        r"searcher\.metirc: unknown key; did you mean metric\?$",
    ),
    (
        _config(searcher__name=None, searcher__nmae="random"),
        r"searcher\.nmae: unknown key; did you mean name\?$",
    ),
    (
        _config(searcher__max_length=None, searcher__time_metric="batches", searcher__max_tme=100),
        r"searcher\.max_tme: unknown key; did you mean max_time\?$",
    ),
    (
        _config(entrypoint=None, entrypont="model_def:Trial"),
        r"entrypont: unknown key; did you mean entrypoint\?$",
    ),
    (
        _config(searcher=None, seacher={"name": "single"}),
        r"seacher: unknown key; did you mean searcher\?$",
    ),
    (
        _config(resources={"slots_per_trail": 2}),
        r"resources\.slots_per_trail: unknown key; did you mean slots_per_trial\?$",
    ),
    (
        _config(checkpoint_storage={"type": "s3", "buckte": "b"}),
        r"checkpoint_storage\.buckte: unknown key; did you mean bucket\?$",
    ),
    (
        _config(reproducibility={"experiment_sed": 3}),
        r"reproducibility\.experiment_sed: unknown key; did you mean experiment_seed\?$",
    ),
    (
        _config(hyperparameters={"layers": {"type": "int", "minval": 1, "maxvl": 4}}),
        r"hyperparameters\.layers\.maxvl: unknown key; did you mean maxval\?$",
    ),
    (
        _config(
            hyperparameters={"opt": {"lr": {"type": "categorical", "val": [0.1, 0.2]}}},
        ),
        r"hyperparameters\.opt\.lr\.val: unknown key; did you mean vals\?$",
    ),
    (
        _config(hyperparameters={"layers": {"typ": "int", "minval": 1, "maxval": 4}}),
        r"hyperparameters\.layers\.typ: unknown key; did you mean type\?$",
    ),
    (
        _config(workspce="w"),
        r"workspce: unknown key; did you mean workspace\?$",
    ),
    (
        _config(searcher__name="grid", searcher__max_trials=4),
        r"searcher\.max_trials: unknown key for grid search; only adaptive_asha, async_halving, "
        r"random take it$",
    ),
]


@pytest.mark.parametrize(("raw", "match"), TYPOS)
def test_a_misspelled_key_is_named_first(tmp_path: Path, raw: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=rf"^typo\.yaml: {match}"):
        _load(tmp_path, raw)


def test_the_misspelling_comes_before_an_invalid_value_elsewhere(tmp_path: Path) -> None:
    raw = _config(max_restarts=-1, searcher__max_trials=None, searcher__max_trails=4)

    with pytest.raises(
        ConfigError,
        match=r"^typo\.yaml: searcher\.max_trails: unknown key; did you mean max_trials\?$",
    ):
        _load(tmp_path, raw)


def test_several_misspellings_are_counted(tmp_path: Path) -> None:
    raw = _config(searcher__max_trials=None, searcher__max_trails=4, resources={"slots": 1})

    with pytest.raises(
        ConfigError,
        match=r"^typo\.yaml: searcher\.max_trails: unknown key; did you mean max_trials\? "
        r"\(and 1 more unknown key\)$",
    ):
        _load(tmp_path, raw)


def test_a_key_with_no_close_match_lists_the_valid_ones(tmp_path: Path) -> None:
    raw = _config(resources={"zzz": 1})

    with pytest.raises(
        ConfigError,
        match=r"^typo\.yaml: resources\.zzz: unknown key; valid keys are: cpus_per_trial, "
        r"gpus_per_trial, max_slots, slots_per_trial$",
    ):
        _load(tmp_path, raw)


def test_a_nested_group_that_merely_resembles_a_spec_is_kept(tmp_path: Path) -> None:
    # Not a misspelled `type`: "tpe" names no hyperparameter type.
    raw = _config(hyperparameters={"sampler": {"tpe": True, "count": 3}})

    assert _load(tmp_path, raw).hyperparameters == {"sampler": {"tpe": True, "count": 3}}
