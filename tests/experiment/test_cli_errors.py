"""``searchlab run`` with bad configs: one line naming the file and YAML path, exit code 2."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys
from typing import Any

import pytest
import yaml
from toy_experiment import TOY_MODEL_DIR, toy_config

import searchlab
from searchlab.cli import main


def _grid_config(**fields: Any) -> dict[str, Any]:
    config = toy_config(
        "bad",
        hyperparameters={
            "hidden": {"type": "int", "minval": 2, "maxval": 8, "count": 2},
            "optimizer": {"lr": {"type": "double", "minval": 0.01, "maxval": 0.1, "count": 2}},
        },
        searcher={"name": "grid"},
    )
    config.update(fields)
    return config


def _with(path: str, value: Any, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """``config`` with the dotted ``path`` set to ``value`` (``None`` deletes it)."""
    config = config or _grid_config()
    *parents, leaf = path.split(".")
    node = config
    for part in parents:
        node = node[part]
    if value is None:
        del node[leaf]
    else:
        node[leaf] = value
    return config


BAD_CONFIGS = [
    pytest.param(
        _with("searcher.smaler_is_better", False),
        r"bad\.yaml: searcher\.smaler_is_better: unknown key; did you mean smaller_is_better\?$",
        id="unknown-key",
    ),
    pytest.param(
        _with("checkpoint_polcy", "all"),
        r"bad\.yaml: checkpoint_polcy: unknown key; did you mean checkpoint_policy\?",
        id="unknown-top-level-key",
    ),
    pytest.param(
        _with("searcher.name", "hyperband"),
        r"bad\.yaml: searcher\.name: unknown searcher 'hyperband'; valid names are: adaptive, "
        r"adaptive_asha, async_halving, grid, random, single",
        id="unknown-searcher",
    ),
    pytest.param(
        _with("hyperparameters.optimizer.lr.count", None),
        r"bad\.yaml: hyperparameters\.optimizer\.lr\.count: missing; grid search needs",
        id="grid-without-count",
    ),
    pytest.param(
        _with("hyperparameters.hidden.minval", 9),
        r"bad\.yaml: hyperparameters\.hidden\.minval: must be <= maxval, got minval=9 > maxval=8",
        id="minval-above-maxval",
    ),
    pytest.param(
        _with("searcher.name", "random"),
        r"bad\.yaml: searcher\.max_trials: missing; random search needs it",
        id="random-without-max-trials",
    ),
    pytest.param(
        _with("searcher.max_length", {"batches": 0}),
        r"bad\.yaml: searcher\.max_length\.batches: must be >= 1, got 0",
        id="zero-max-length",
    ),
    pytest.param(
        _with("searcher.max_length", {"epochs": -2}),
        r"bad\.yaml: searcher\.max_length\.epochs: must be >= 1, got -2",
        id="negative-max-length",
    ),
    pytest.param(
        _with("min_validation_period", {"batches": -1}),
        r"bad\.yaml: min_validation_period\.batches: must be >= 0, got -1",
        id="negative-validation-period",
    ),
    pytest.param(
        _with("scheduling_unit", 0),
        r"bad\.yaml: scheduling_unit: must be >= 1, got 0",
        id="zero-scheduling-unit",
    ),
    pytest.param(
        _with("entrypoint", "toy_model_def:NoSuchTrial"),
        r"bad\.yaml: entrypoint: module 'toy_model_def' has no class 'NoSuchTrial'",
        id="entrypoint-class-missing",
    ),
    pytest.param(
        _with("entrypoint", "no_such_module:Trial"),
        r"bad\.yaml: entrypoint: 'no_such_module:Trial': no no_such_module\.py in the model "
        r"directory .*toy_model",
        id="entrypoint-module-missing",
    ),
    pytest.param(
        "name: bad\nsearcher:\n  name: grid\n   metric: loss\n",
        r"bad\.yaml: line 4, column 10: invalid YAML: mapping values are not allowed here",
        id="broken-yaml",
    ),
]


def _write(tmp_path: pathlib.Path, config: dict[str, Any] | str, name: str = "bad.yaml") -> str:
    path = tmp_path / name
    path.write_text(config if isinstance(config, str) else yaml.safe_dump(config))
    return str(path)


def _one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize(("config", "message"), BAD_CONFIGS)
def test_bad_config_is_one_line_with_file_and_yaml_path(
    tmp_path: pathlib.Path,
    capsys: pytest.CaptureFixture[str],
    config: dict[str, Any] | str,
    message: str,
) -> None:
    path = _write(tmp_path, config)
    storage = tmp_path / "results"
    assert main(["run", path, str(TOY_MODEL_DIR), "--storage-path", str(storage)]) == 2
    line = _one_line_error(capsys)
    assert re.match(f"searchlab: error: {message}", line), line
    assert not storage.exists()  # rejected before anything ran


def test_missing_config_file(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nowhere.yaml"
    storage = tmp_path / "results"
    assert main(["run", str(missing), str(TOY_MODEL_DIR), "--storage-path", str(storage)]) == 2
    line = _one_line_error(capsys)
    assert line == f"searchlab: error: nowhere.yaml: file not found: {missing}; check the path"


def test_bad_override_names_the_overridden_path(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, _with("searcher.name", "random"))
    args = ["run", path, str(TOY_MODEL_DIR), "--storage-path", str(tmp_path / "results")]
    args += ["--config", "searcher.max_trials=0"]
    assert main(args) == 2
    line = _one_line_error(capsys)
    assert line == "searchlab: error: bad.yaml: searcher.max_trials: must be >= 1, got 0"


def test_console_script_exits_2_without_a_traceback(tmp_path: pathlib.Path) -> None:
    path = _write(tmp_path, _with("searcher.name", "hyperband"))
    script = shutil.which("searchlab", path=str(pathlib.Path(sys.executable).parent))
    assert script is not None, "the searchlab console script is not installed in this venv"
    proc = subprocess.run(
        [script, "run", path, str(TOY_MODEL_DIR)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "RAY_ADDRESS": ""},
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "searchlab: error: bad.yaml: searcher.name: unknown searcher 'hyperband'; valid names "
        "are: adaptive, adaptive_asha, async_halving, grid, random, single"
    ]
    assert not (tmp_path / "searchlab-results").exists()  # nothing ran


@pytest.mark.ray
def test_searcher_metric_never_reported(
    ray_session: Any, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = toy_config("wrong-metric", searcher={"metric": "val_accuracy"})
    path = _write(tmp_path, config, "metric.yaml")
    storage = tmp_path / "results"
    assert main(["run", path, str(TOY_MODEL_DIR), "--storage-path", str(storage)]) == 2
    line = _one_line_error(capsys)
    assert line == (
        "searchlab: error: metric.yaml: searcher.metric: the searcher metric 'val_accuracy' is "
        "not among the validation metrics ['accuracy', 'validation_loss'] that ToyModelTrial "
        "reported; return it from evaluate_batch()/evaluate_full_dataset() or change "
        "searcher.metric"
    )
    trials = searchlab.load_results(storage / "wrong-metric").trials
    assert trials["state"].tolist() == ["ERRORED"]
    assert "'val_accuracy' is not among the validation metrics" in trials["error"].iloc[0]


@pytest.mark.ray
def test_trial_resources_beyond_the_cluster(
    ray_session: Any, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, _with("resources", {"cpus_per_trial": 64}))
    storage = tmp_path / "results"
    assert main(["run", path, str(TOY_MODEL_DIR), "--storage-path", str(storage)]) == 2
    line = _one_line_error(capsys)
    assert re.match(
        r"searchlab: error: bad\.yaml: resources: each trial asks for 64 CPU but the Ray "
        r"cluster has 1 node\(s\): 2 CPU/0 GPU in all; lower",
        line,
    ), line
    assert not (storage / "bad").exists()  # no half experiment: a fixed rerun gets the name
