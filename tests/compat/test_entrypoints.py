"""Determined 0.38 configs name a command as their entrypoint; they load unchanged."""

from __future__ import annotations

import pathlib

import pytest
import yaml

import searchlab
from searchlab.config import SCRIPT_LENGTH, load_experiment_config, parse_command
from searchlab.errors import ConfigError

# Determined 0.38's examples/tutorials/mnist_pytorch configs, verbatim.
CONST = """
name: mnist_pytorch_const
hyperparameters:
  learning_rate: 1.0
  n_filters1: 32
  n_filters2: 64
  dropout1: 0.25
  dropout2: 0.5
searcher:
  name: single
  metric: validation_loss
  smaller_is_better: true
entrypoint: python3 train.py --epochs 1
"""
ADAPTIVE = """
name: mnist_pytorch_adaptive_search
hyperparameters:
  learning_rate:
    type: double
    minval: .0001
    maxval: 1.0
searcher:
  name: adaptive_asha
  metric: validation_loss
  smaller_is_better: true
  max_trials: 16
  time_metric: batches
  max_time: 937  # 60,000 training images with batch size 64
entrypoint: python3 train.py --epochs 1
"""
DISTRIBUTED = """
name: mnist_pytorch_distributed
hyperparameters:
  learning_rate: 1.0
searcher:
  name: single
  metric: validation_loss
  smaller_is_better: true
resources:
  slots_per_trial: 8
entrypoint: >-
  python3 -m determined.launch.torch_distributed
  python3 train.py --epochs 1
"""


def _load(
    text: str, tmp_path: pathlib.Path, **changes: object
) -> searchlab.config.ExperimentConfig:
    raw = yaml.safe_load(text)
    raw.update(changes)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_experiment_config(path)


def test_a_script_config_without_a_length_lets_the_script_decide(tmp_path) -> None:
    cfg = _load(CONST, tmp_path)
    assert cfg.entrypoint == "python3 train.py --epochs 1"
    assert cfg.searcher.max_length.value == SCRIPT_LENGTH
    again = load_experiment_config(cfg.to_dict())  # what experiment.json keeps loads again
    assert again.searcher.max_length == cfg.searcher.max_length


def test_time_metric_and_max_time_give_the_searchers_length(tmp_path) -> None:
    cfg = _load(ADAPTIVE, tmp_path)
    assert (cfg.searcher.max_length.unit.value, cfg.searcher.max_length.value) == ("batches", 937)


def test_the_launcher_entrypoint_in_either_spelling(tmp_path) -> None:
    cfg = _load(DISTRIBUTED, tmp_path)
    command = parse_command(cfg.entrypoint)
    assert command.launcher
    assert command.script_argv == ["python3", "train.py", "--epochs", "1"]
    assert command.script_file == "train.py"
    ours = parse_command(
        "python3 -m searchlab.launch.torch_distributed --nproc_per_node 2 -- python3 -m pkg.train"
    )
    assert (ours.launcher_args, ours.module, ours.script_file) == (
        ["--nproc_per_node", "2"],
        "pkg.train",
        None,
    )


def test_the_legacy_trial_option_of_the_launcher_names_the_class(tmp_path) -> None:
    entrypoint = "python3 -m determined.launch.torch_distributed --trial model_def:MNistTrial"
    cfg = _load(
        DISTRIBUTED,
        tmp_path,
        entrypoint=entrypoint,
        searcher={"name": "single", "metric": "validation_loss", "max_length": {"batches": 10}},
    )
    assert cfg.entrypoint == "model_def:MNistTrial"


@pytest.mark.parametrize(
    ("searcher", "message"),
    [
        ("custom", r"searcher\.name: 'custom': a custom SearchMethod .* use adaptive_asha"),
        ("pbt", r"searcher\.name: 'pbt': population-based training is not available"),
    ],
)
def test_searchers_that_need_a_determined_master_say_what_to_use(
    tmp_path, searcher: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        _load(CONST, tmp_path, searcher={"name": searcher, "metric": "validation_loss"})


@pytest.mark.parametrize("launcher", ["horovod", "deepspeed"])
def test_other_launchers_are_refused_with_the_one_to_use(tmp_path, launcher: str) -> None:
    entrypoint = f"python3 -m determined.launch.{launcher} python3 train.py"
    with pytest.raises(ConfigError, match=r"entrypoint: .*python3 -m searchlab\.launch\.torch_d"):
        _load(CONST, tmp_path, entrypoint=entrypoint)


def test_adaptive_search_of_a_script_still_needs_a_length(tmp_path) -> None:
    searcher = {"name": "adaptive_asha", "metric": "validation_loss", "max_trials": 4}
    with pytest.raises(ConfigError, match=r"searcher\.max_length: missing; .*max_time"):
        _load(CONST, tmp_path, searcher=searcher)


def test_run_refuses_a_script_that_is_not_in_the_model_directory(tmp_path) -> None:
    path = tmp_path / "const.yaml"
    path.write_text(CONST)
    with pytest.raises(ConfigError, match=r"const\.yaml: entrypoint: .*no train\.py in the model"):
        searchlab.run(path, storage_path=tmp_path / "results", echo=lambda line: None)
    assert not (tmp_path / "results" / "mnist_pytorch_const").exists()


def test_run_refuses_several_slots_without_the_launcher(tmp_path) -> None:
    raw = yaml.safe_load(CONST)
    raw["resources"] = {"slots_per_trial": 2}
    (tmp_path / "train.py").write_text("")
    with pytest.raises(
        ConfigError,
        match=r"slots_per_trial is 2; launch it on every slot: python3 -m searchlab\.launch\.torch"
        r"_distributed python3 train\.py --epochs 1$",
    ):
        searchlab.run(raw, model_dir=tmp_path, storage_path=tmp_path / "r", echo=lambda _: None)
