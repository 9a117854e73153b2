"""Typed experiment config: the sections of a Determined-style experiment YAML."""

from __future__ import annotations

import enum
import os
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from searchlab.config._entrypoint import class_entrypoint, is_command, parse_command
from searchlab.config._hparams import check_global_batch_size, validate_hyperparameters
from searchlab.config._length import ConfigFieldError, Length
from searchlab.config._searchers import SearcherConfig, SearcherName, normalise_searcher_name

__all__ = [
    "SCRIPT_LENGTH",
    "CheckpointPolicy",
    "CheckpointStorageConfig",
    "EnvironmentConfig",
    "ExperimentConfig",
    "OptimizationsConfig",
    "ReproducibilityConfig",
    "ResourcesConfig",
    "StorageType",
]


# The searcher length of a script experiment that leaves it to the script (no max_length,
# no max_time): more batches than any trial trains, so the script's own length ends it.
SCRIPT_LENGTH = 2**62
_LENGTHLESS_SEARCHERS = (SearcherName.SINGLE, SearcherName.GRID, SearcherName.RANDOM)


class CheckpointPolicy(str, enum.Enum):
    """Which validated states are checkpointed."""

    BEST = "best"
    ALL = "all"
    NONE = "none"


class StorageType(str, enum.Enum):
    """Where checkpoints go; each maps onto a Ray storage path."""

    SHARED_FS = "shared_fs"
    DIRECTORY = "directory"
    S3 = "s3"
    GCS = "gcs"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True)


class ResourcesConfig(_Section):
    """``resources``: what one trial and the whole experiment may use.

    Example:
        >>> ResourcesConfig(slots_per_trial=2).slots_per_trial
        2
    """

    slots_per_trial: int = Field(default=1, ge=1)
    max_slots: int | None = Field(default=None, ge=1)
    gpus_per_trial: float | None = Field(default=None, ge=0)
    cpus_per_trial: float | None = Field(default=None, gt=0)


class CheckpointStorageConfig(_Section):
    """``checkpoint_storage``: how many checkpoints to keep and where.

    Example:
        >>> CheckpointStorageConfig(type="s3", bucket="b", prefix="runs").storage_uri()
        's3://b/runs'
    """

    save_experiment_best: int = Field(default=0, ge=0)
    save_trial_best: int = Field(default=1, ge=0)
    save_trial_latest: int = Field(default=1, ge=0)
    type: StorageType | None = None
    host_path: str | None = None
    storage_path: str | None = None
    container_path: str | None = None
    bucket: str | None = None
    prefix: str | None = None

    @model_validator(mode="after")
    def _check_location(self) -> CheckpointStorageConfig:
        needed = {
            StorageType.SHARED_FS: "host_path",
            StorageType.DIRECTORY: "container_path",
            StorageType.S3: "bucket",
            StorageType.GCS: "bucket",
        }
        if self.type is not None and not getattr(self, needed[self.type]):
            field = needed[self.type]
            raise ConfigFieldError(f"missing; type {self.type.value} needs {field}", field)
        return self

    def storage_uri(self) -> str | None:
        """The Ray storage path for checkpoints, or None to use searchlab's default."""
        if self.type is StorageType.SHARED_FS:
            assert self.host_path is not None
            return os.path.join(self.host_path, self.storage_path or "")
        if self.type is StorageType.DIRECTORY:
            return self.container_path
        if self.type in (StorageType.S3, StorageType.GCS):
            scheme = "s3" if self.type is StorageType.S3 else "gs"
            prefix = (self.prefix or "").strip("/")
            return f"{scheme}://{self.bucket}/{prefix}" if prefix else f"{scheme}://{self.bucket}"
        return None


def _time_seed() -> int:
    return int(time.time()) % 2**31


class ReproducibilityConfig(_Section):
    """``reproducibility``: the experiment seed (from the clock when absent, then kept).

    Example:
        >>> ReproducibilityConfig(experiment_seed=7).experiment_seed
        7
    """

    experiment_seed: int = Field(default_factory=_time_seed, ge=0, lt=2**31)


class OptimizationsConfig(_Section):
    """``optimizations``: only gradient accumulation applies outside a Determined cluster.

    Example:
        >>> OptimizationsConfig(aggregation_frequency=4).aggregation_frequency
        4
    """

    aggregation_frequency: int = Field(default=1, ge=1)


def _pairs_to_dict(items: list[Any], field: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for index, item in enumerate(items):
        if not isinstance(item, str) or "=" not in item or item.startswith("="):
            raise ConfigFieldError(
                f"must be a 'KEY=VALUE' string, got {item!r}", f"{field}[{index}]"
            )
        key, value = item.split("=", 1)
        out[key] = value
    return out


def _scalars_to_dict(items: dict[Any, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in items.items():
        if isinstance(value, (dict, list)):
            raise ConfigFieldError(f"must be a string, got {value!r}", str(key))
        out[str(key)] = (
            "" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
        )
    return out


class EnvironmentConfig(_Section):
    """``environment``: variables set in every trial process.

    Accepts a list of ``KEY=VALUE`` strings, a map, or Determined's per-device form
    ``{cpu: [...], cuda: [...]}`` (merged: ``cpu`` first, then ``cuda``/``rocm`` override).

    Example:
        >>> EnvironmentConfig(environment_variables=["A=1"]).environment_variables
        {'A': '1'}
    """

    environment_variables: dict[str, str] = Field(default_factory=dict)

    @field_validator("environment_variables", mode="before")
    @classmethod
    def _to_dict(cls, raw: Any) -> dict[str, str]:
        if raw is None:
            return {}
        if isinstance(raw, list):
            return _pairs_to_dict(raw, "")
        if not isinstance(raw, dict):
            raise ConfigFieldError(f"must be a list of 'KEY=VALUE' strings or a map, got {raw!r}")
        devices = ("cpu", "cuda", "rocm")
        if (
            raw
            and set(raw) <= set(devices)
            and all(isinstance(v, (list, type(None))) for v in raw.values())
        ):
            merged: dict[str, str] = {}
            for device in devices:
                merged.update(_pairs_to_dict(raw.get(device) or [], device))
            return merged
        return _scalars_to_dict(raw)


def _check_entrypoint(value: str) -> str:
    value = value.strip()
    trial_class = class_entrypoint(value)
    if trial_class is not None:
        return trial_class
    if is_command(value):
        parse_command(value)  # a command that cannot be run is refused here
        return value
    raise ConfigFieldError(
        "must be 'module:Class' naming a PyTorchTrial (e.g. model_def:MNistTrial) or a "
        f"command that runs a script (e.g. python3 train.py), got {value!r}"
    )


def _script_decides_length(data: dict[str, Any]) -> dict[str, Any]:
    """A script entrypoint may leave the length out (Determined 0.38's ``single``, ``grid``
    and ``random``): the script's own ``fit(max_length=...)`` decides how far it trains."""
    searcher = data.get("searcher")
    entrypoint = data.get("entrypoint")
    if not isinstance(searcher, dict) or not isinstance(entrypoint, str):
        return data
    lengthless = all(searcher.get(k) is None for k in ("max_length", "time_metric", "max_time"))
    simple = searcher.get("name") in _LENGTHLESS_SEARCHERS
    if lengthless and simple and is_command(entrypoint):
        data = {**data, "searcher": {**searcher, "max_length": {"batches": SCRIPT_LENGTH}}}
    return data


class ExperimentConfig(_Section):
    """A validated experiment config; build it with :func:`load_experiment_config`.

    Example:
        >>> cfg = ExperimentConfig.model_validate({
        ...     "entrypoint": "model_def:MyTrial",
        ...     "hyperparameters": {"lr": 0.1},
        ...     "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 100}},
        ... })
        >>> cfg.searcher.name.value, cfg.searcher.max_length.value
        ('single', 100)
    """

    name: str = "experiment"
    description: str | None = None
    labels: list[str] = Field(default_factory=list)
    entrypoint: str
    hyperparameters: dict[str, Any] = Field(default_factory=dict)
    searcher: SearcherConfig
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)
    records_per_epoch: int = Field(default=0, ge=0)
    scheduling_unit: int = Field(default=100, ge=1)
    min_validation_period: Length | None = None
    min_checkpoint_period: Length | None = None
    perform_initial_validation: bool = False
    checkpoint_policy: CheckpointPolicy = CheckpointPolicy.BEST
    checkpoint_storage: CheckpointStorageConfig = Field(default_factory=CheckpointStorageConfig)
    max_restarts: int = Field(default=5, ge=0)
    reproducibility: ReproducibilityConfig = Field(default_factory=ReproducibilityConfig)
    optimizations: OptimizationsConfig = Field(default_factory=OptimizationsConfig)
    data: dict[str, Any] = Field(default_factory=dict)
    environment: EnvironmentConfig = Field(default_factory=EnvironmentConfig)

    _source_name: str = PrivateAttr("<dict>")
    _model_dir: str = PrivateAttr(default_factory=os.getcwd)

    @model_validator(mode="before")
    @classmethod
    def _normalise_searcher(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("searcher"), dict):
            searcher = dict(data["searcher"])
            searcher["name"] = normalise_searcher_name(searcher.get("name"), "searcher.name")
            data = _script_decides_length({**data, "searcher": searcher})
        return data

    @field_validator("entrypoint")
    @classmethod
    def _entrypoint_form(cls, value: str) -> str:
        return _check_entrypoint(value)

    @field_validator("hyperparameters", "data", mode="before")
    @classmethod
    def _none_is_empty(cls, value: Any) -> Any:
        return {} if value is None else value

    @field_validator("name")
    @classmethod
    def _name_not_empty(cls, value: str) -> str:
        if not value.strip():
            raise ConfigFieldError("must not be empty; it names the experiment directory")
        return value

    @model_validator(mode="after")
    def _check_hyperparameters(self) -> ExperimentConfig:
        grid = self.searcher.name is SearcherName.GRID
        self.hyperparameters = validate_hyperparameters(self.hyperparameters, grid=grid)
        check_global_batch_size(self.hyperparameters, self.resources.slots_per_trial)
        return self

    @property
    def source_name(self) -> str:
        """The config's file name as used in messages (``<dict>`` when built from a dict)."""
        return self._source_name

    @property
    def model_dir(self) -> str:
        """The directory the entrypoint is resolved in (the config's directory unless given)."""
        return self._model_dir

    def to_dict(self) -> dict[str, Any]:
        """The normalised config as plain JSON-able data; loading it again gives the same config."""
        data = self.model_dump(mode="json")
        searcher = data["searcher"]
        data["searcher"] = {"name": searcher.pop("name"), **searcher}
        return data
