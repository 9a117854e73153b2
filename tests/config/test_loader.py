"""Loading Determined-style experiment YAML: values, defaults, overrides, warnings and errors."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

import pytest
import yaml

from searchlab.config import (
    CLUSTER_ONLY_FIELDS,
    AdaptiveASHAConfig,
    AdaptiveMode,
    AsyncHalvingConfig,
    CheckpointPolicy,
    ExperimentConfig,
    IgnoredFieldWarning,
    Length,
    LengthUnit,
    RandomConfig,
    SamplerName,
    SearcherName,
    load_experiment_config,
)
from searchlab.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]

# The shape of Determined's examples/tutorials/mnist_pytorch/const.yaml and adaptive.yaml.
DETERMINED_CONST = """
name: mnist_pytorch_const
data:
  url: https://s3-us-west-2.amazonaws.com/determined-ai-test-data/pytorch_mnist.tar.gz
hyperparameters:
  learning_rate: 1.0
  global_batch_size: 64
  n_filters1: 32
  n_filters2: 64
  dropout1: 0.25
  dropout2: 0.5
records_per_epoch: 50000
searcher:
  name: single
  metric: validation_loss
  max_length:
    batches: 937  # 60,000 training images with batch size 64
  smaller_is_better: true
entrypoint: model_def:MNistTrial
environment:
  image: determinedai/environments:cuda-11.3-pytorch-1.12-gpu-0.19.4
resources:
  slots_per_trial: 1
  resource_pool: default
max_restarts: 0
"""

DETERMINED_ADAPTIVE = """
name: mnist_pytorch_adaptive_search
data:
  url: https://s3-us-west-2.amazonaws.com/determined-ai-test-data/pytorch_mnist.tar.gz
hyperparameters:
  global_batch_size: 64
  learning_rate:
    type: double
    minval: .0001
    maxval: 1.0
  n_filters1:
    type: int
    minval: 8
    maxval: 64
  n_filters2:
    type: int
    minval: 8
    maxval: 72
  dropout1:
    type: double
    minval: .2
    maxval: .8
  dropout2:
    type: double
    minval: .2
    maxval: .8
records_per_epoch: 50000
searcher:
  name: adaptive_asha
  metric: validation_loss
  smaller_is_better: true
  max_length:
    batches: 937
  max_trials: 16
entrypoint: model_def:MNistTrial
workspace: my-workspace
project: mnist
bind_mounts:
  - host_path: /data
    container_path: /data
    read_only: true
"""


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


def load_quietly(source: Any, overrides: tuple[str, ...] = ()) -> ExperimentConfig:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IgnoredFieldWarning)
        return load_experiment_config(source, overrides)


# --- real Determined configs ---------------------------------------------------------------


def test_determined_const_config_loads_unchanged(tmp_path: Path) -> None:
    path = write(tmp_path, DETERMINED_CONST, "const.yaml")
    with pytest.warns(IgnoredFieldWarning) as record:
        cfg = load_experiment_config(path)
    assert sorted(str(w.message) for w in record) == [
        "const.yaml: environment.image: ignored; it only applies on a Determined cluster",
        "const.yaml: resources.resource_pool: ignored; it only applies on a Determined cluster",
    ]
    assert cfg.name == "mnist_pytorch_const"
    assert cfg.entrypoint == "model_def:MNistTrial"
    assert cfg.searcher.name is SearcherName.SINGLE
    assert cfg.searcher.max_length == Length(unit=LengthUnit.BATCHES, value=937)
    assert cfg.records_per_epoch == 50000
    assert cfg.resources.slots_per_trial == 1
    assert cfg.max_restarts == 0
    assert cfg.hyperparameters["global_batch_size"] == 64
    assert cfg.data["url"].startswith("https://")
    assert cfg.source_name == "const.yaml"
    assert cfg.model_dir == str(tmp_path)


def test_determined_adaptive_config_loads_unchanged(tmp_path: Path) -> None:
    path = write(tmp_path, DETERMINED_ADAPTIVE, "adaptive.yaml")
    with pytest.warns(IgnoredFieldWarning) as record:
        cfg = load_experiment_config(path)
    assert [str(w.message).split(":")[1].strip() for w in record] == [
        "bind_mounts",
        "workspace",
        "project",
    ]
    searcher = cfg.searcher
    assert isinstance(searcher, AdaptiveASHAConfig)
    assert (searcher.max_trials, searcher.mode, searcher.divisor, searcher.max_rungs) == (
        16,
        AdaptiveMode.STANDARD,
        4.0,
        5,
    )
    assert searcher.stop_once is False and searcher.bracket_rungs is None
    assert searcher.max_concurrent_trials == 16
    assert cfg.hyperparameters["learning_rate"] == {
        "type": "double",
        "minval": 0.0001,
        "maxval": 1.0,
    }


@pytest.mark.parametrize("name", ["const.yaml", "grid.yaml", "random.yaml", "adaptive.yaml"])
def test_repository_configs_load_without_warnings(name: str) -> None:
    path = REPO / "configs" / name
    if not path.exists():
        pytest.skip(f"{path} is not in this checkout")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cfg = load_experiment_config(path)
    assert cfg.searcher.metric == "validation_loss"


def test_defaults() -> None:
    cfg = load_quietly(base_config())
    assert cfg.name == "experiment"
    assert cfg.description is None and cfg.labels == []
    assert cfg.scheduling_unit == 100 and cfg.records_per_epoch == 0
    assert cfg.min_validation_period is None and cfg.min_checkpoint_period is None
    assert cfg.perform_initial_validation is False
    assert cfg.checkpoint_policy is CheckpointPolicy.BEST
    storage = cfg.checkpoint_storage
    assert (storage.save_experiment_best, storage.save_trial_best, storage.save_trial_latest) == (
        0,
        1,
        1,
    )
    assert storage.storage_uri() is None
    assert cfg.max_restarts == 5
    assert cfg.optimizations.aggregation_frequency == 1
    assert cfg.resources.slots_per_trial == 1 and cfg.resources.max_slots is None
    assert cfg.searcher.smaller_is_better is True
    assert isinstance(cfg.searcher, RandomConfig) and cfg.searcher.sampler is SamplerName.RANDOM
    assert cfg.environment.environment_variables == {}
    assert 0 <= cfg.reproducibility.experiment_seed < 2**31


def test_dict_source_names_itself_and_uses_cwd() -> None:
    cfg = load_quietly(base_config())
    assert cfg.source_name == "<dict>"
    assert cfg.model_dir == os.getcwd()
    with pytest.raises(ConfigError, match=r"^<dict>: searcher\.max_trials: must be >= 1, got 0$"):
        load_experiment_config(base_config(max_trials=0))


def test_model_dir_argument(tmp_path: Path) -> None:
    path = write(tmp_path, base_config())
    cfg = load_experiment_config(path, model_dir=str(tmp_path / "models"))
    assert cfg.model_dir == str(tmp_path / "models")


def test_seed_is_stored_and_survives_a_round_trip(tmp_path: Path) -> None:
    cfg = load_quietly(base_config())
    saved = cfg.to_dict()
    assert saved["reproducibility"]["experiment_seed"] == cfg.reproducibility.experiment_seed
    again = load_experiment_config(json.loads(json.dumps(saved)))
    assert again.to_dict() == saved


def test_to_dict_round_trip_without_warnings(tmp_path: Path) -> None:
    cfg = load_quietly(write(tmp_path, DETERMINED_ADAPTIVE, "adaptive.yaml"))
    data = cfg.to_dict()
    assert data["searcher"]["name"] == "adaptive_asha"
    assert data["searcher"]["max_length"] == {"batches": 937}
    assert "workspace" not in data and "bind_mounts" not in data
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = load_experiment_config(data)
    assert again.to_dict() == data


def test_yaml_12_floats_and_adaptive_alias(tmp_path: Path) -> None:
    text = (
        "entrypoint: m:T\nhyperparameters:\n  lr: 1e-4\n  wd: 5E-3\n"
        "searcher: {name: adaptive, metric: acc, smaller_is_better: false, max_length: 300, max_trials: 8}\n"
    )
    cfg = load_experiment_config(write(tmp_path, text, "a.yaml"))
    assert cfg.hyperparameters == {"lr": 1e-4, "wd": 5e-3}
    assert cfg.searcher.name is SearcherName.ADAPTIVE_ASHA
    assert cfg.searcher.smaller_is_better is False
    assert cfg.searcher.max_length == Length.parse({"batches": 300})


@pytest.mark.parametrize(
    ("time_metric", "unit"), [("batches", LengthUnit.BATCHES), ("epochs", LengthUnit.EPOCHS)]
)
def test_time_metric_and_max_time_become_max_length(time_metric: str, unit: LengthUnit) -> None:
    raw = base_config(max_length=None, time_metric=time_metric, max_time=7)
    cfg = load_quietly(raw)
    assert cfg.searcher.max_length == Length(unit=unit, value=7)
    assert cfg.to_dict()["searcher"]["max_length"] == {time_metric: 7}


DETERMINED_038_SEARCHER = """
name: mnist_pytorch_adaptive_038
entrypoint: model_def:MNistTrial
hyperparameters:
  global_batch_size: 64
  learning_rate: {type: log, base: 10, minval: -4, maxval: -1}
searcher:
  name: adaptive_asha
  metric: validation_loss
  max_trials: 16
  time_metric: UNIT
  max_time: 937
"""


@pytest.mark.parametrize("unit", ["batches", "epochs"])
def test_determined_038_time_metric_file_means_max_length(tmp_path: Path, unit: str) -> None:
    new_text = DETERMINED_038_SEARCHER.replace("UNIT", unit)
    new = load_experiment_config(write(tmp_path, new_text, "new.yaml"))
    old_text = new_text.replace(
        f"  time_metric: {unit}\n  max_time: 937\n", f"  max_length: {{{unit}: 937}}\n"
    )
    assert "max_time" not in old_text
    old = load_experiment_config(write(tmp_path, old_text, "old.yaml"))

    assert new.searcher.max_length == old.searcher.max_length == Length.parse({unit: 937})
    new_searcher, old_searcher = new.to_dict()["searcher"], old.to_dict()["searcher"]
    assert new_searcher == old_searcher


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"batches": 5}, Length(unit=LengthUnit.BATCHES, value=5)),
        ({"records": 640}, Length(unit=LengthUnit.RECORDS, value=640)),
        ({"epochs": 2}, Length(unit=LengthUnit.EPOCHS, value=2)),
        (12, Length(unit=LengthUnit.BATCHES, value=12)),
    ],
)
def test_length_forms(raw: Any, expected: Length) -> None:
    assert Length.parse(raw) == expected
    assert Length.parse(expected.to_dict()) == expected
    cfg = load_quietly(
        {**base_config(), "min_validation_period": raw, "min_checkpoint_period": raw}
    )
    assert cfg.min_validation_period == expected and cfg.min_checkpoint_period == expected


@pytest.mark.parametrize("raw", [{"steps": 3}, {"batches": 1, "epochs": 1}, "ten", 1.5])
def test_length_parse_errors(raw: Any) -> None:
    with pytest.raises(ConfigError, match=r"^length: "):
        Length.parse(raw)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (["A=1", "B=x=y"], {"A": "1", "B": "x=y"}),
        ({"A": 1, "B": "two", "C": True}, {"A": "1", "B": "two", "C": "true"}),
        ({"cpu": ["A=cpu", "B=1"], "cuda": ["A=cuda"]}, {"A": "cuda", "B": "1"}),
    ],
)
def test_environment_variables_forms(raw: Any, expected: dict[str, str]) -> None:
    cfg = load_quietly({**base_config(), "environment": {"environment_variables": raw}})
    assert cfg.environment.environment_variables == expected


@pytest.mark.parametrize(
    ("storage", "uri"),
    [
        ({"type": "shared_fs", "host_path": "/mnt/ckpt", "storage_path": "runs"}, "/mnt/ckpt/runs"),
        ({"type": "shared_fs", "host_path": "/mnt/ckpt"}, "/mnt/ckpt/"),
        ({"type": "directory", "container_path": "/ckpt"}, "/ckpt"),
        ({"type": "s3", "bucket": "b", "prefix": "x/y/"}, "s3://b/x/y"),
        ({"type": "s3", "bucket": "b"}, "s3://b"),
        ({"type": "gcs", "bucket": "g", "prefix": "p"}, "gs://g/p"),
    ],
)
def test_checkpoint_storage_uri(storage: dict[str, Any], uri: str) -> None:
    cfg = load_quietly({**base_config(), "checkpoint_storage": {**storage, "save_trial_best": 2}})
    assert cfg.checkpoint_storage.storage_uri() == uri
    assert cfg.checkpoint_storage.save_trial_best == 2


def test_launcher_entrypoint_is_reduced_to_the_trial_class() -> None:
    raw = {
        **base_config(),
        "entrypoint": "python3 -m determined.launch.torch_distributed --trial model_def:MNistTrial",
    }
    assert load_quietly(raw).entrypoint == "model_def:MNistTrial"


def test_hyperparameter_forms_are_kept() -> None:
    hps = {
        "const_list": [1, 2],
        "explicit": {"type": "const", "val": {"a": 1}},
        "optimizer": {"lr": {"type": "log", "minval": -4, "maxval": -1}, "inner": {"m": 0.9}},
        "act": {"type": "categorical", "vals": ["relu", "gelu"]},
        "global_batch_size": 32,
    }
    cfg = load_quietly({**base_config(), "hyperparameters": hps})
    assert cfg.hyperparameters["optimizer"]["lr"] == {
        "type": "log",
        "minval": -4,
        "maxval": -1,
        "base": 10.0,
    }
    assert cfg.hyperparameters["const_list"] == [1, 2]
    assert cfg.hyperparameters["optimizer"]["inner"] == {"m": 0.9}


@pytest.mark.parametrize("name", ["random", "adaptive_asha", "async_halving"])
def test_tpe_sampler_is_accepted(name: str) -> None:
    extra = {"num_rungs": 3} if name == "async_halving" else {}
    cfg = load_quietly(base_config(name=name, sampler="tpe", **extra))
    assert isinstance(cfg.searcher, (RandomConfig, AdaptiveASHAConfig, AsyncHalvingConfig))
    assert cfg.searcher.sampler is SamplerName.TPE


# --- cluster-only fields -------------------------------------------------------------------


def _with_field(dotted: str) -> dict[str, Any]:
    raw = base_config()
    section, _, leaf = dotted.rpartition(".")
    (raw.setdefault(section, {}) if section else raw)[leaf] = "x"
    return raw


@pytest.mark.parametrize("dotted", CLUSTER_ONLY_FIELDS)
def test_cluster_only_fields_warn_once_each(tmp_path: Path, dotted: str) -> None:
    path = write(tmp_path, _with_field(dotted), "cluster.yaml")
    with pytest.warns(IgnoredFieldWarning) as record:
        cfg = load_experiment_config(path)
    messages = [str(w.message) for w in record if issubclass(w.category, IgnoredFieldWarning)]
    assert messages == [f"cluster.yaml: {dotted}: ignored; it only applies on a Determined cluster"]
    assert issubclass(IgnoredFieldWarning, UserWarning)
    section, _, leaf = dotted.rpartition(".")
    saved = cfg.to_dict()
    assert leaf not in (saved[section] if section else saved)
