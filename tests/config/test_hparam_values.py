"""Values of hyperparameters the loader must check: global_batch_size and grid counts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from searchlab.config import load_experiment_config
from searchlab.errors import ConfigError


def _config(gbs: Any, slots: int = 1, searcher: str = "single") -> dict[str, Any]:
    return {
        "entrypoint": "model_def:Trial",
        "hyperparameters": {"global_batch_size": gbs, "lr": 0.1},
        "resources": {"slots_per_trial": slots},
        "searcher": {"name": searcher, "metric": "loss", "max_length": 10},
    }


def _load(tmp_path: Path, raw: dict[str, Any]) -> Any:
    path = tmp_path / "gbs.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_experiment_config(path)


RULE = r"must be an integer >= resources\.slots_per_trial \({slots}\), got {got}$"


@pytest.mark.parametrize(
    ("gbs", "slots", "where", "got"),
    [
        (0, 1, "", "0"),
        (-1, 1, "", "-1"),
        ("abc", 1, "", "'abc'"),
        (1.5, 1, "", "1.5"),
        (True, 1, "", "True"),
        (None, 1, "", "None"),
        (3, 4, "", "3"),
        ({"type": "const", "val": 0}, 1, ".val", "0"),
        ({"type": "int", "minval": 2, "maxval": 64}, 4, ".minval", "2"),
        ({"type": "categorical", "vals": [64, 1.5]}, 1, r".vals\[1\]", "1.5"),
        ({"type": "categorical", "vals": [8, 2]}, 4, r".vals\[1\]", "2"),
    ],
)
def test_bad_global_batch_size_names_the_value_and_the_rule(
    tmp_path: Path, gbs: Any, slots: int, where: str, got: str
) -> None:
    match = rf"^gbs\.yaml: hyperparameters\.global_batch_size{where}: " + RULE.format(
        slots=slots, got=got
    )
    with pytest.raises(ConfigError, match=match):
        _load(tmp_path, _config(gbs, slots))


@pytest.mark.parametrize("kind", ["double", "log"])
def test_global_batch_size_must_be_an_integer_hyperparameter(tmp_path: Path, kind: str) -> None:
    gbs = {"type": kind, "minval": 1, "maxval": 2}

    with pytest.raises(
        ConfigError,
        match=r"^gbs\.yaml: hyperparameters\.global_batch_size\.type: must be an integer "
        rf"hyperparameter \(a constant, or type const, int or categorical\), got type {kind}$",
    ):
        _load(tmp_path, _config(gbs))


@pytest.mark.parametrize(
    ("gbs", "slots", "expected"),
    [
        (64, 1, 64),
        (2, 2, 2),
        (64.0, 1, 64),
        ({"type": "const", "val": 32}, 2, {"type": "const", "val": 32}),
        (
            {"type": "int", "minval": 4, "maxval": 64},
            4,
            {"type": "int", "minval": 4, "maxval": 64},
        ),
        (
            {"type": "categorical", "vals": [16, 32.0]},
            2,
            {"type": "categorical", "vals": [16, 32]},
        ),
    ],
)
def test_good_global_batch_size_is_kept(
    tmp_path: Path, gbs: Any, slots: int, expected: Any
) -> None:
    cfg = _load(tmp_path, _config(gbs, slots))

    assert cfg.hyperparameters["global_batch_size"] == expected


def test_slots_from_an_override_are_checked_too(tmp_path: Path) -> None:
    path = tmp_path / "gbs.yaml"
    path.write_text(yaml.safe_dump(_config(2)))

    with pytest.raises(
        ConfigError,
        match=r"^gbs\.yaml: hyperparameters\.global_batch_size: " + RULE.format(slots=4, got="2"),
    ):
        load_experiment_config(path, ["resources.slots_per_trial=4"])


# --- grid counts --------------------------------------------------------------------------


def _grid(count: str) -> str:
    return (
        "entrypoint: model_def:Trial\n"
        f"hyperparameters:\n  layers: {{type: int, minval: 1, maxval: 8, count: {count}}}\n"
        "searcher: {name: grid, metric: loss, max_length: 10}\n"
    )


@pytest.mark.parametrize(("count", "expected"), [("1e9", 10**9), ("4", 4), ("2.0", 2)])
def test_an_integral_count_is_an_int(tmp_path: Path, count: str, expected: int) -> None:
    path = tmp_path / "grid.yaml"
    path.write_text(_grid(count))

    spec = load_experiment_config(path).hyperparameters["layers"]

    assert spec["count"] == expected and type(spec["count"]) is int


@pytest.mark.parametrize(
    ("count", "shown"),
    [
        ("1.5", "1.5"),
        ("0", "0"),
        ("-3", "-3"),
        ("true", "True"),
        ("four", "'four'"),
        (".inf", "inf"),
    ],
)
def test_a_count_that_is_not_a_positive_integer_is_refused(
    tmp_path: Path, count: str, shown: str
) -> None:
    path = tmp_path / "grid.yaml"
    path.write_text(_grid(count))

    with pytest.raises(
        ConfigError,
        match=rf"^grid\.yaml: hyperparameters\.layers\.count: must be an integer >= 1 \(the "
        rf"number of points on this axis\), got {shown}$",
    ):
        load_experiment_config(path)
