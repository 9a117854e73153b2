"""Experiment configs in Determined's YAML format, validated into typed models.

Example:
    >>> from searchlab.config import load_experiment_config
    >>> cfg = load_experiment_config("const.yaml", ["searcher.max_length={batches: 100}"])  # doctest: +SKIP
"""

from __future__ import annotations

from searchlab.config._entrypoint import (
    LAUNCHER_MODULE,
    ScriptCommand,
    class_entrypoint,
    command_problem,
    is_command,
    is_python,
    parse_command,
)
from searchlab.config._hparams import (
    HParamSpec,
    HParamType,
    parse_hyperparameters,
    validate_hyperparameters,
)
from searchlab.config._length import Length, LengthUnit
from searchlab.config._loader import (
    CLUSTER_ONLY_FIELDS,
    IgnoredFieldWarning,
    format_validation_error,
    load_experiment_config,
)
from searchlab.config._model import (
    SCRIPT_LENGTH,
    CheckpointPolicy,
    CheckpointStorageConfig,
    EnvironmentConfig,
    ExperimentConfig,
    OptimizationsConfig,
    ReproducibilityConfig,
    ResourcesConfig,
    StorageType,
)
from searchlab.config._names import MAX_DIR_NAME_LENGTH, check_dir_name, experiment_dir_name
from searchlab.config._searchers import (
    SEARCHER_ALIASES,
    AdaptiveASHAConfig,
    AdaptiveMode,
    AsyncHalvingConfig,
    GridConfig,
    RandomConfig,
    SamplerName,
    SearcherConfig,
    SearcherName,
    SingleConfig,
    TimeMetric,
)
from searchlab.config._yaml import MAX_CONFIG_BYTES, MAX_EXPANDED_VALUES, MAX_NESTING

__all__ = [
    "CLUSTER_ONLY_FIELDS",
    "LAUNCHER_MODULE",
    "MAX_CONFIG_BYTES",
    "MAX_DIR_NAME_LENGTH",
    "MAX_EXPANDED_VALUES",
    "MAX_NESTING",
    "SCRIPT_LENGTH",
    "SEARCHER_ALIASES",
    "AdaptiveASHAConfig",
    "AdaptiveMode",
    "AsyncHalvingConfig",
    "CheckpointPolicy",
    "CheckpointStorageConfig",
    "EnvironmentConfig",
    "ExperimentConfig",
    "GridConfig",
    "HParamSpec",
    "HParamType",
    "IgnoredFieldWarning",
    "Length",
    "LengthUnit",
    "OptimizationsConfig",
    "RandomConfig",
    "ReproducibilityConfig",
    "ResourcesConfig",
    "SamplerName",
    "ScriptCommand",
    "SearcherConfig",
    "SearcherName",
    "SingleConfig",
    "StorageType",
    "TimeMetric",
    "check_dir_name",
    "class_entrypoint",
    "command_problem",
    "experiment_dir_name",
    "format_validation_error",
    "is_command",
    "is_python",
    "load_experiment_config",
    "parse_command",
    "parse_hyperparameters",
    "validate_hyperparameters",
]
