"""Loading an experiment YAML: parsing, overrides, cluster-only fields and one-line errors."""

from __future__ import annotations

import copy
import difflib
import os
import types
import typing
import warnings
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from searchlab.config._keys import unknown_keys
from searchlab.config._length import ConfigFieldError
from searchlab.config._model import ExperimentConfig
from searchlab.config._searchers import SEARCHER_CONFIGS, SearcherName
from searchlab.config._yaml import check_expanded_size, parse_yaml, read_config_text
from searchlab.errors import ConfigError

__all__ = [
    "CLUSTER_ONLY_FIELDS",
    "IgnoredFieldWarning",
    "format_validation_error",
    "load_experiment_config",
]

DICT_SOURCE = "<dict>"

CLUSTER_ONLY_FIELDS: tuple[str, ...] = (
    "bind_mounts",
    "workspace",
    "project",
    "profiling",
    "debug",
    "log_policies",
    "retention_policy",
    "integrations",
    "slurm",
    "pbs",
    "environment.image",
    "environment.pod_spec",
    "environment.registry_auth",
    "environment.force_pull_image",
    "environment.add_capabilities",
    "environment.drop_capabilities",
    "environment.ports",
    "environment.proxy_ports",
    "resources.resource_pool",
    "resources.priority",
    "resources.weight",
    "resources.shm_size",
    "resources.devices",
    "resources.agent_label",
    "resources.is_single_node",
    "checkpoint_storage.propagation",
    "checkpoint_storage.access_key",
    "checkpoint_storage.secret_key",
    "checkpoint_storage.endpoint_url",
    "checkpoint_storage.checkpoint_path",
    "checkpoint_storage.tensorboard_path",
    "optimizations.average_aggregated_gradients",
    "optimizations.average_training_metrics",
    "optimizations.gradient_compression",
    "optimizations.mixed_precision",
    "optimizations.tensor_fusion_threshold",
    "optimizations.tensor_fusion_cycle_time",
    "optimizations.auto_tune_tensor_fusion",
    "optimizations.grad_updates_size_file",
)


class IgnoredFieldWarning(UserWarning):
    """A Determined cluster-only field that searchlab accepts and ignores."""


def _read_source(
    source: str | os.PathLike[str] | dict[str, Any],
) -> tuple[dict[str, Any], str, str]:
    """The raw config, the name used in messages and the default model directory."""
    if isinstance(source, dict):
        check_expanded_size(source, DICT_SOURCE)  # before deepcopy, which recurses
        return copy.deepcopy(source), DICT_SOURCE, os.getcwd()
    path = os.path.abspath(os.fspath(source))
    name = os.path.basename(path)
    text = read_config_text(path, name)
    raw = parse_yaml(text, name)
    if raw is None:
        raise ConfigError(
            f"{name}: <root>: the file is empty; expected entrypoint, hyperparameters, searcher"
        )
    if not isinstance(raw, dict):
        raise ConfigError(
            f"{name}: <root>: must be a map of config sections, got {type(raw).__name__}"
        )
    return raw, name, os.path.dirname(path)


def _apply_override(raw: dict[str, Any], override: str, name: str) -> None:
    key, sep, text = override.partition("=")
    key = key.strip()
    parts = key.split(".")
    if not sep or not all(parts):
        raise ConfigError(
            f"{name}: {key or '<override>'}: bad override {override!r}; "
            "write key.path=value, e.g. searcher.max_trials=4"
        )
    value = parse_yaml(text, f"{name}: {key}: override value") if text.strip() else None
    node: Any = raw
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        if isinstance(node, dict):
            if last:
                node[part] = value
            elif node.get(part) is None:
                node[part] = {}
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            if last:
                node[int(part)] = value
        else:
            where = ".".join(parts[:depth]) or "<root>"
            raise ConfigError(
                f"{name}: {key}: cannot set (override {override!r}): "
                f"{where} is {type(node).__name__} {_show(node)}, not a map or has no item {part!r}"
            )
        if not last:
            node = node[part] if isinstance(node, dict) else node[int(part)]


def _drop_cluster_fields(raw: dict[str, Any], name: str) -> None:
    for dotted in CLUSTER_ONLY_FIELDS:
        section, _, leaf = dotted.rpartition(".")
        parent = raw.get(section) if section else raw
        if isinstance(parent, dict) and leaf in parent:
            del parent[leaf]
            warnings.warn(
                f"{name}: {dotted}: ignored; it only applies on a Determined cluster",
                IgnoredFieldWarning,
                stacklevel=3,
            )


def _refuse_unknown_keys(raw: dict[str, Any], name: str) -> None:
    """Name a misspelled key before the missing key it causes (and before any other problem)."""
    problems = unknown_keys(raw, CLUSTER_ONLY_FIELDS)
    if problems:
        path, message = problems[0]
        more = len(problems) - 1
        also = f" (and {more} more unknown key{'s' if more > 1 else ''})" if more else ""
        raise ConfigError(f"{name}: {path}: {message}{also}")


def load_experiment_config(
    source: str | os.PathLike[str] | dict[str, Any],
    overrides: Sequence[str] = (),
    *,
    model_dir: str | None = None,
) -> ExperimentConfig:
    """Load, override and validate an experiment config.

    Args:
        source: A YAML file path or the config as a dict (then messages name ``<dict>``).
        overrides: ``key.path=value`` strings; each value is parsed as YAML
            (``searcher.max_trials=4``, ``hyperparameters.lr={type: log, minval: -4, maxval: -1, base: 10}``).
        model_dir: Where the entrypoint module lives; the config's directory (or the current one
            for a dict) when not given.

    Returns:
        The validated config.

    Raises:
        ConfigError: With one line ``<file>: <yaml.path>: <problem>``.

    Example:
        >>> cfg = load_experiment_config("const.yaml", ["searcher.max_length={epochs: 1}"])  # doctest: +SKIP
    """
    if isinstance(overrides, str):
        overrides = [overrides]
    raw, name, default_dir = _read_source(source)
    for override in overrides:
        _apply_override(raw, override, name)
    _drop_cluster_fields(raw, name)
    check_expanded_size(raw, name)
    _refuse_unknown_keys(raw, name)
    try:
        cfg = ExperimentConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, name)) from None
    cfg._source_name = name
    cfg._model_dir = os.path.abspath(model_dir) if model_dir is not None else default_dir
    return cfg


# --- pydantic errors as one line ------------------------------------------------------------

_TAGS = {member.value for member in SearcherName}
_MISSING_HINTS = {
    "entrypoint": "set entrypoint: module:TrialClass (e.g. model_def:MNistTrial)",
    "searcher": "add a searcher section with name, metric and max_length",
    "metric": "set the validation metric to optimise, e.g. metric: validation_loss",
    "max_trials": "set how many trials to run, e.g. max_trials: 16",
    "num_rungs": "set the number of rungs, e.g. num_rungs: 4",
}
_TEMPLATES = {
    "greater_than_equal": "must be >= {ge}, got {input}",
    "greater_than": "must be > {gt}, got {input}",
    "less_than_equal": "must be <= {le}, got {input}",
    "less_than": "must be < {lt}, got {input}",
    "string_too_short": "must not be empty",
    "int_type": "must be an integer, got {input}",
    "int_parsing": "must be an integer, got {input}",
    "int_from_float": "must be an integer, got {input}",
    "float_type": "must be a number, got {input}",
    "float_parsing": "must be a number, got {input}",
    "bool_type": "must be true or false, got {input}",
    "bool_parsing": "must be true or false, got {input}",
    "string_type": "must be a string, got {input}",
    "dict_type": "must be a map, got {input}",
    "model_type": "must be a map, got {input}",
    "model_attributes_type": "must be a map, got {input}",
    "list_type": "must be a list, got {input}",
    "enum": "must be one of {expected}; got {input}",
    "literal_error": "must be {expected}; got {input}",
}


def _show(value: Any) -> str:
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _field_model(annotation: Any) -> type[BaseModel] | None:
    candidates = (
        typing.get_args(annotation) if isinstance(annotation, types.UnionType) else (annotation,)
    )
    for candidate in candidates:
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _model_at(loc: Sequence[Any]) -> type[BaseModel] | None:
    """The model class at a pydantic location, following the searcher tag."""
    model: type[BaseModel] | None = ExperimentConfig
    items = list(loc)
    while items and model is not None:
        item = items.pop(0)
        if model is ExperimentConfig and item == "searcher":
            tag = items.pop(0) if items else None
            model = SEARCHER_CONFIGS.get(SearcherName(tag)) if tag in _TAGS else None
        elif isinstance(item, str) and item in model.model_fields:
            model = _field_model(model.model_fields[item].annotation)
        else:
            return None
    return model


def _yaml_path(loc: Sequence[Any], extra: str = "") -> str:
    parts = [
        item
        for index, item in enumerate(loc)
        if not (index == 1 and loc[0] == "searcher" and item in _TAGS)
    ]
    path = ""
    for part in parts:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    if extra:
        path += extra if extra.startswith("[") else f".{extra}"
    return path.lstrip(".") or "<root>"


def _unknown_key(loc: Sequence[Any]) -> str:
    model = _model_at(loc[:-1])
    if model is None:
        return "unknown key"
    valid = sorted(model.model_fields)
    close = difflib.get_close_matches(str(loc[-1]), valid, n=1)
    return (
        f"unknown key; did you mean {close[0]}?"
        if close
        else f"unknown key; valid keys are: {', '.join(valid)}"
    )


def _describe(error: Any) -> tuple[str, str]:
    loc, kind = tuple(error["loc"]), error["type"]
    ctx = error.get("ctx") or {}
    cause = ctx.get("error")
    if isinstance(cause, ConfigFieldError):
        return _yaml_path(loc, cause.field), cause.message
    if kind == "extra_forbidden":
        return _yaml_path(loc), _unknown_key(loc)
    if kind == "missing" or (kind.endswith("_type") and error.get("input", "") is None):
        hint = _MISSING_HINTS.get(str(loc[-1]) if loc else "", "add it")
        who = f"{loc[1]} search needs it; " if len(loc) > 2 and loc[0] == "searcher" else ""
        return _yaml_path(loc), f"missing; {who}{hint}"
    template = _TEMPLATES.get(kind)
    if template is None:
        message = str(error["msg"]).removeprefix("Value error, ")
        return _yaml_path(loc), f"{message}, got {_show(error.get('input'))}"
    return _yaml_path(loc), template.format(**{**ctx, "input": _show(error.get("input"))})


def format_validation_error(exc: ValidationError, name: str) -> str:
    """One line ``<file>: <yaml.path>: <problem>`` for the first error (and how many more)."""
    errors = exc.errors(include_url=False)
    path, message = _describe(errors[0])
    more = (
        f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
        if len(errors) > 1
        else ""
    )
    return f"{name}: {path}: {message}{more}"
