"""The ``hyperparameters`` section: validation and a typed view of its leaves."""

from __future__ import annotations

import difflib
import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from searchlab.config._length import ConfigFieldError

__all__ = ["HParamSpec", "HParamType", "parse_hyperparameters", "validate_hyperparameters"]


class HParamType(str, enum.Enum):
    """The ``type`` of a hyperparameter leaf."""

    CONST = "const"
    INT = "int"
    DOUBLE = "double"
    LOG = "log"
    CATEGORICAL = "categorical"


_KEYS: dict[HParamType, tuple[str, ...]] = {
    HParamType.CONST: ("type", "val"),
    HParamType.INT: ("type", "minval", "maxval", "count"),
    HParamType.DOUBLE: ("type", "minval", "maxval", "count"),
    HParamType.LOG: ("type", "minval", "maxval", "base", "count"),
    HParamType.CATEGORICAL: ("type", "vals"),
}
_REQUIRED: dict[HParamType, tuple[str, ...]] = {
    HParamType.CONST: ("val",),
    HParamType.INT: ("minval", "maxval"),
    HParamType.DOUBLE: ("minval", "maxval"),
    HParamType.LOG: ("minval", "maxval"),
    HParamType.CATEGORICAL: ("vals",),
}
_RANGED = (HParamType.INT, HParamType.DOUBLE, HParamType.LOG)
DEFAULT_LOG_BASE = 10.0


@dataclass(frozen=True)
class HParamSpec:
    """One validated hyperparameter leaf.

    Example:
        >>> (spec,) = parse_hyperparameters({"lr": {"type": "log", "minval": -4, "maxval": -1, "base": 10}})
        >>> spec.name, spec.type.value, spec.minval
        ('lr', 'log', -4)
    """

    path: tuple[str, ...]
    type: HParamType
    val: Any = None
    minval: float = 0
    maxval: float = 0
    base: float = DEFAULT_LOG_BASE
    count: int | None = None
    vals: tuple[Any, ...] = ()

    @property
    def name(self) -> str:
        """The dotted path below ``hyperparameters``, e.g. ``optimizer.lr``."""
        return ".".join(self.path)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _type_names() -> str:
    return ", ".join(t.value for t in HParamType)


def _check_keys(spec: Mapping[str, Any], kind: HParamType, path: str) -> None:
    allowed = _KEYS[kind]
    for key in spec:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = (
                f"did you mean {close[0]}?" if close else f"{kind.value} takes {', '.join(allowed)}"
            )
            raise ConfigFieldError(f"unknown key; {hint}", f"{path}.{key}")
    for key in _REQUIRED[kind]:
        if key not in spec:
            raise ConfigFieldError(
                f"missing; a {kind.value} hyperparameter needs {key}", f"{path}.{key}"
            )


def _check_range(spec: dict[str, Any], kind: HParamType, path: str, grid: bool) -> None:
    for key in ("minval", "maxval"):
        value = spec[key]
        if kind is HParamType.INT and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigFieldError(
                f"must be an integer for an int hyperparameter, got {value!r}", f"{path}.{key}"
            )
        if not _is_number(value):
            raise ConfigFieldError(f"must be a number, got {value!r}", f"{path}.{key}")
    if spec["minval"] > spec["maxval"]:
        raise ConfigFieldError(
            f"must be <= maxval, got minval={spec['minval']} > maxval={spec['maxval']}; swap them",
            f"{path}.minval",
        )
    if kind is HParamType.LOG:
        base = spec.setdefault("base", DEFAULT_LOG_BASE)
        if not _is_number(base) or base <= 0 or base == 1:
            raise ConfigFieldError(f"must be a number > 0 and != 1, got {base!r}", f"{path}.base")
    count = spec.get("count")
    if count is None:
        if grid:
            raise ConfigFieldError(
                f"missing; grid search needs the number of points of this {kind.value} "
                "hyperparameter (e.g. count: 4)",
                f"{path}.count",
            )
    elif isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ConfigFieldError(f"must be an integer >= 1, got {count!r}", f"{path}.count")


def _check_leaf(spec: dict[str, Any], path: str, grid: bool) -> None:
    raw_type = spec["type"]
    try:
        kind = HParamType(raw_type)
    except ValueError:
        raise ConfigFieldError(
            f"unknown hyperparameter type {raw_type!r}; valid types are: {_type_names()} "
            "(a constant map with a 'type' key is written {type: const, val: {...}})",
            f"{path}.type",
        ) from None
    spec["type"] = kind.value
    _check_keys(spec, kind, path)
    if kind in _RANGED:
        _check_range(spec, kind, path, grid)
    elif kind is HParamType.CATEGORICAL:
        vals = spec["vals"]
        if not isinstance(vals, list) or not vals:
            raise ConfigFieldError(f"must be a non-empty list, got {vals!r}", f"{path}.vals")


def _validate_group(group: Mapping[Any, Any], path: str, grid: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in group.items():
        if not isinstance(key, str) or not key or "." in key:
            raise ConfigFieldError(
                f"hyperparameter names must be non-empty strings without '.', got {key!r}",
                f"{path}.{key}",
            )
        child = f"{path}.{key}"
        if isinstance(value, Mapping) and "type" in value:
            leaf = dict(value)
            _check_leaf(leaf, child, grid)
            out[key] = leaf
        elif isinstance(value, Mapping) and value:
            out[key] = _validate_group(value, child, grid)
        else:
            out[key] = value
    return out


def validate_hyperparameters(
    raw: Any, *, grid: bool = False, root: str = "hyperparameters"
) -> dict[str, Any]:
    """Check a ``hyperparameters`` section and return it normalised (log ``base`` filled in).

    Args:
        raw: The section as loaded from YAML.
        grid: Whether the searcher is grid search (then int/double/log need ``count``).
        root: The YAML path of the section, for messages.

    Returns:
        A copy of the nested dict with every leaf checked.

    Raises:
        ConfigFieldError: With the dotted path of the first bad entry.
    """
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigFieldError(
            f"must be a map of name: value or name: {{type: ...}}, got {raw!r}", root
        )
    return _validate_group(raw, root, grid)


def _to_spec(path: tuple[str, ...], value: Any) -> HParamSpec:
    if not (isinstance(value, Mapping) and "type" in value):
        return HParamSpec(path, HParamType.CONST, val=value)
    kind = HParamType(value["type"])
    if kind is HParamType.CONST:
        return HParamSpec(path, kind, val=value["val"])
    if kind is HParamType.CATEGORICAL:
        return HParamSpec(path, kind, vals=tuple(value["vals"]))
    return HParamSpec(
        path,
        kind,
        minval=value["minval"],
        maxval=value["maxval"],
        base=value.get("base", DEFAULT_LOG_BASE),
        count=value.get("count"),
    )


def _walk(group: Mapping[str, Any], prefix: tuple[str, ...]) -> list[HParamSpec]:
    specs: list[HParamSpec] = []
    for key in sorted(group):
        value = group[key]
        path = (*prefix, key)
        if isinstance(value, Mapping) and value and "type" not in value:
            specs.extend(_walk(value, path))
        else:
            specs.append(_to_spec(path, value))
    return specs


def parse_hyperparameters(raw: Mapping[str, Any] | None, *, grid: bool = False) -> list[HParamSpec]:
    """Validate ``raw`` and list its leaves, keys sorted at every nesting level.

    An empty map is a constant ``{}``, so that it still reaches the trial.

    Args:
        raw: A ``hyperparameters`` section.
        grid: Whether int/double/log leaves must have ``count``.

    Returns:
        The leaves in grid order (the first varies slowest).

    Raises:
        ConfigFieldError: If the section is invalid.
    """
    return _walk(validate_hyperparameters(raw, grid=grid), ())
