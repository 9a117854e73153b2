"""The ``hyperparameters`` section: validation and a typed view of its leaves."""

from __future__ import annotations

import difflib
import enum
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from searchlab.config._length import ConfigFieldError

__all__ = [
    "HParamSpec",
    "HParamType",
    "check_global_batch_size",
    "parse_hyperparameters",
    "unknown_hparam_keys",
    "validate_hyperparameters",
]


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


def _unknown_key(key: Any, kind: HParamType) -> str:
    allowed = _KEYS[kind]
    close = difflib.get_close_matches(str(key), allowed, n=1)
    hint = f"did you mean {close[0]}?" if close else f"{kind.value} takes {', '.join(allowed)}"
    return f"unknown key; {hint}"


def _check_keys(spec: Mapping[str, Any], kind: HParamType, path: str) -> None:
    for key in spec:
        if key not in _KEYS[kind]:
            raise ConfigFieldError(_unknown_key(key, kind), f"{path}.{key}")
    for key in _REQUIRED[kind]:
        if key not in spec:
            raise ConfigFieldError(
                f"missing; a {kind.value} hyperparameter needs {key}", f"{path}.{key}"
            )


def _as_int(value: Any) -> Any:
    """An integral float (``1e9`` in YAML 1.2) as an int; anything else unchanged."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_range(spec: dict[str, Any], kind: HParamType, path: str, grid: bool) -> None:
    for key in ("minval", "maxval"):
        if kind is HParamType.INT:
            spec[key] = value = _as_int(spec[key])
            if not _is_int(value):
                raise ConfigFieldError(
                    f"must be an integer for an int hyperparameter, got {value!r}", f"{path}.{key}"
                )
        if not _is_number(spec[key]):
            raise ConfigFieldError(f"must be a number, got {spec[key]!r}", f"{path}.{key}")
    if spec["minval"] > spec["maxval"]:
        raise ConfigFieldError(
            f"must be <= maxval, got minval={spec['minval']} > maxval={spec['maxval']}; swap them",
            f"{path}.minval",
        )
    if kind is HParamType.LOG:
        base = spec.setdefault("base", DEFAULT_LOG_BASE)
        if not _is_number(base) or base <= 0 or base == 1:
            raise ConfigFieldError(f"must be a number > 0 and != 1, got {base!r}", f"{path}.base")
    _check_count(spec, kind, path, grid)


def _check_count(spec: dict[str, Any], kind: HParamType, path: str, grid: bool) -> None:
    count = spec.get("count")
    if count is None:
        if grid:
            raise ConfigFieldError(
                f"missing; grid search needs the number of points of this {kind.value} "
                "hyperparameter (e.g. count: 4)",
                f"{path}.count",
            )
        return
    spec["count"] = count = _as_int(count)
    if not _is_int(count) or count < 1:
        raise ConfigFieldError(
            f"must be an integer >= 1 (the number of points on this axis), got {count!r}",
            f"{path}.count",
        )


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


_SPEC_KEYS = frozenset(key for keys in _KEYS.values() for key in keys) - {"type"}


def _misspelled_type(group: Mapping[Any, Any]) -> Any:
    """The key of a would-be spec whose ``type`` is misspelled (``{typ: int, minval: 1, ...}``)."""
    others = [key for key in group if key not in _SPEC_KEYS]
    if len(others) != 1 or len(group) == 1 or not isinstance(others[0], str):
        return None
    key = others[0]
    names_a_type = isinstance(group[key], str) and group[key] in {t.value for t in HParamType}
    return key if names_a_type and difflib.get_close_matches(key, ["type"], n=1) else None


def unknown_hparam_keys(raw: Any, path: str = "hyperparameters") -> Iterator[tuple[str, str]]:
    """Unknown keys of hyperparameter specs as ``(yaml path, message)``, in document order.

    Only keys are looked at (a spec with a misspelled key is also missing the right one, and the
    misspelling is the better message); values are checked by :func:`validate_hyperparameters`.
    """
    if not isinstance(raw, Mapping):
        return
    for key, value in raw.items():
        child = f"{path}.{key}"
        if not isinstance(value, Mapping):
            continue
        if "type" not in value:
            typo = _misspelled_type(value)
            if typo is not None:
                yield f"{child}.{typo}", "unknown key; did you mean type?"
            else:
                yield from unknown_hparam_keys(value, child)
            continue
        try:
            kind = HParamType(value["type"])
        except (ValueError, TypeError):
            continue  # validation names the bad type
        for spec_key in value:
            if spec_key not in _KEYS[kind]:
                yield f"{child}.{spec_key}", _unknown_key(spec_key, kind)


GLOBAL_BATCH_SIZE = "global_batch_size"


def _batch_size_value(value: Any, slots: int, path: str) -> int:
    value = _as_int(value)
    if not _is_int(value) or value < slots:
        raise ConfigFieldError(
            f"must be an integer >= resources.slots_per_trial ({slots}), got {value!r}", path
        )
    return int(value)


def check_global_batch_size(hparams: dict[str, Any], slots: int) -> None:
    """Check ``hyperparameters.global_batch_size`` (if any) against ``slots_per_trial``.

    Every value it can take must be an integer >= ``slots`` (each slot trains on
    ``global_batch_size // slots`` records): a constant, an int range's ``minval``, every
    categorical value. Integral floats (``64.0``) become ints in place.

    Raises:
        ConfigFieldError: Naming ``hyperparameters.global_batch_size`` (and the spec key).
    """
    if GLOBAL_BATCH_SIZE not in hparams:
        return
    path = f"hyperparameters.{GLOBAL_BATCH_SIZE}"
    value = hparams[GLOBAL_BATCH_SIZE]
    if not (isinstance(value, dict) and "type" in value):
        hparams[GLOBAL_BATCH_SIZE] = _batch_size_value(value, slots, path)
        return
    kind = HParamType(value["type"])
    if kind is HParamType.CONST:
        value["val"] = _batch_size_value(value["val"], slots, f"{path}.val")
    elif kind is HParamType.INT:
        _batch_size_value(value["minval"], slots, f"{path}.minval")
    elif kind is HParamType.CATEGORICAL:
        value["vals"] = [
            _batch_size_value(val, slots, f"{path}.vals[{index}]")
            for index, val in enumerate(value["vals"])
        ]
    else:
        raise ConfigFieldError(
            f"must be an integer hyperparameter (a constant, or type const, int or categorical), "
            f"got type {kind.value}",
            f"{path}.type",
        )


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
