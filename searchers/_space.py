"""The hyperparameter space: grid points, random samples, and nested <-> dotted names.

Leaves are visited with keys sorted at every nesting level; in the grid the first leaf varies
slowest. Trials always see nested dicts (``{"optimizer": {"lr": 0.1}}``).
"""

from __future__ import annotations

import copy
import hashlib
import math
import random
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from searchlab.config import (
    HParamSpec,
    HParamType,
    SearcherName,
    parse_hyperparameters,
)
from searchlab.config._length import ConfigFieldError
from searchlab.errors import ConfigError

if TYPE_CHECKING:
    from searchlab.config import ExperimentConfig

__all__ = [
    "DEFAULT_MAX_GRID_TRIALS",
    "HyperparameterSpace",
    "RandomSampler",
    "Sampler",
    "axis_path",
    "axis_size",
    "axis_value",
    "check_grid_limit",
    "check_grid_size",
    "derive_seed",
    "flatten_hparams",
    "grid_values",
    "rng_state_from_json",
    "rng_state_to_json",
    "round_half_away",
    "sample_value",
    "unflatten_hparams",
]

_SOURCE = "<hyperparameters>"


def round_half_away(x: float) -> int:
    """Round to the nearest integer, halves away from zero (2.5 -> 3, -2.5 -> -3)."""
    return int(math.copysign(math.floor(abs(x) + 0.5), x))


def _missing_count(spec: HParamSpec) -> ConfigError:
    return ConfigError(
        f"{_SOURCE}: hyperparameters.{spec.name}.count: missing; grid search needs the number of "
        f"points of this {spec.type.value} hyperparameter (e.g. count: 4)"
    )


def axis_size(spec: HParamSpec) -> int:
    """How many grid points one leaf has, without building them (SPEC section 2, ``grid``).

    Raises:
        ConfigError: If an int/double/log leaf has no ``count``.
    """
    if spec.type is HParamType.CONST:
        return 1
    if spec.type is HParamType.CATEGORICAL:
        return len(spec.vals)
    if spec.count is None:
        raise _missing_count(spec)
    if spec.type is HParamType.INT:
        return min(spec.count, int(spec.maxval) - int(spec.minval) + 1)
    return spec.count


def axis_value(spec: HParamSpec, index: int) -> Any:
    """The ``index``-th grid point of one leaf (0 <= index < :func:`axis_size`).

    Raises:
        ConfigError: If an int/double/log leaf has no ``count``.
    """
    count = axis_size(spec)
    if spec.type is HParamType.CONST:
        return spec.val
    if spec.type is HParamType.CATEGORICAL:
        return spec.vals[index]
    if spec.type is HParamType.INT:
        lo, hi = int(spec.minval), int(spec.maxval)
        if count == 1:
            return round_half_away((lo + hi) / 2)
        return round_half_away(lo + (index * (hi - lo)) / (count - 1))
    low, high = spec.minval, spec.maxval
    x = (low + high) / 2 if count == 1 else low + index * (high - low) / (count - 1)
    return spec.base**x if spec.type is HParamType.LOG else x


def grid_values(spec: HParamSpec) -> list[Any]:
    """The grid axis of one leaf, in order (see SPEC section 2, ``grid``); a list, so for small axes.

    Raises:
        ConfigError: If an int/double/log leaf has no ``count``.
    """
    return [axis_value(spec, index) for index in range(axis_size(spec))]


def axis_path(spec: HParamSpec) -> str:
    """The YAML path that sets the size of a leaf's axis (``hyperparameters.lr.count``)."""
    if spec.type is HParamType.CATEGORICAL:
        return f"hyperparameters.{spec.name}.vals"
    if spec.type is HParamType.CONST:
        return f"hyperparameters.{spec.name}"
    return f"hyperparameters.{spec.name}.count"


def sample_value(spec: HParamSpec, rng: random.Random) -> Any:
    """One random value of a leaf: int uniform inclusive, double in [min, max), log ``base**U``."""
    if spec.type is HParamType.CONST:
        return copy.deepcopy(spec.val)
    if spec.type is HParamType.CATEGORICAL:
        return copy.deepcopy(spec.vals[rng.randrange(len(spec.vals))])
    if spec.type is HParamType.INT:
        return rng.randint(int(spec.minval), int(spec.maxval))
    x = spec.minval + (spec.maxval - spec.minval) * rng.random()
    return spec.base**x if spec.type is HParamType.LOG else x


def _nest(pairs: Sequence[tuple[Sequence[str], Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path, value in pairs:
        node = out
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return out


def flatten_hparams(nested: Mapping[str, Any]) -> dict[str, Any]:
    """Nested hyperparameters as ``{"optimizer.lr": 0.1, ...}``; an empty map stays a value.

    Example:
        >>> flatten_hparams({"optimizer": {"lr": 0.1}, "layers": 2})
        {'layers': 2, 'optimizer.lr': 0.1}
    """
    flat: dict[str, Any] = {}
    for key in sorted(nested):
        value = nested[key]
        if isinstance(value, Mapping) and value:
            for sub, leaf in flatten_hparams(value).items():
                flat[f"{key}.{sub}"] = leaf
        else:
            flat[key] = value
    return flat


def unflatten_hparams(flat: Mapping[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`flatten_hparams`.

    Example:
        >>> unflatten_hparams({"optimizer.lr": 0.1, "layers": 2})
        {'optimizer': {'lr': 0.1}, 'layers': 2}
    """
    return _nest([(key.split("."), value) for key, value in flat.items()])


def derive_seed(seed: int, purpose: str) -> int:
    """A seed in [0, 2**31) for one purpose, derived from the experiment seed (stable across runs)."""
    digest = hashlib.sha256(f"{seed}:{purpose}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % 2**31


def rng_state_to_json(rng: random.Random) -> list[Any]:
    """``rng.getstate()`` as JSON-able data."""
    version, internal, gauss_next = rng.getstate()
    return [version, list(internal), gauss_next]


def rng_state_from_json(state: Sequence[Any]) -> tuple[Any, ...]:
    """The argument for ``rng.setstate`` from :func:`rng_state_to_json`'s output."""
    version, internal, gauss_next = state
    return (version, tuple(internal), gauss_next)


class HyperparameterSpace:
    """The leaves of a ``hyperparameters`` section, for grid points and random samples.

    Args:
        hyperparameters: The (nested) section, e.g. ``cfg.hyperparameters``.
        grid: Require ``count`` on int/double/log leaves now rather than in :meth:`grid`.

    Raises:
        ConfigError: If the section is invalid.

    Example:
        >>> space = HyperparameterSpace({"lr": {"type": "double", "minval": 0.1, "maxval": 0.5, "count": 3}})
        >>> [round(p["lr"], 6) for p in space.grid()]
        [0.1, 0.3, 0.5]
        >>> space.leaves()
        ['lr']
    """

    def __init__(self, hyperparameters: Mapping[str, Any] | None, *, grid: bool = False) -> None:
        try:
            self._specs = parse_hyperparameters(hyperparameters, grid=grid)
        except ConfigFieldError as exc:
            raise ConfigError(f"{_SOURCE}: {exc.field}: {exc.message}") from None

    @classmethod
    def from_config(cls, cfg: ExperimentConfig) -> HyperparameterSpace:
        """The space of an experiment config."""
        return cls(cfg.hyperparameters, grid=cfg.searcher.name is SearcherName.GRID)

    @property
    def specs(self) -> list[HParamSpec]:
        """The leaves in grid order."""
        return list(self._specs)

    @property
    def dimensions(self) -> int:
        """How many leaves are searched over (not constant)."""
        return sum(spec.type is not HParamType.CONST for spec in self._specs)

    def __len__(self) -> int:
        return len(self._specs)

    def leaves(self) -> list[str]:
        """The dotted names of the leaves, keys sorted at every level (``optimizer.lr``)."""
        return [spec.name for spec in self._specs]

    def grid_size(self) -> int:
        """The number of grid points (computed from the counts; nothing is built).

        Raises:
            ConfigError: If an int/double/log leaf has no ``count``.
        """
        return math.prod(axis_size(spec) for spec in self._specs)

    def grid_axes(self) -> list[tuple[str, int]]:
        """``(yaml path, size)`` of each axis with more than one point, biggest first."""
        axes = [(axis_path(spec), axis_size(spec)) for spec in self._specs]
        return sorted((axis for axis in axes if axis[1] > 1), key=lambda axis: -axis[1])

    def grid_point(self, index: int) -> dict[str, Any]:
        """The ``index``-th grid point as nested hyperparameters; the first leaf varies slowest.

        Raises:
            IndexError: If ``index`` is not in ``range(grid_size())``.
        """
        size = self.grid_size()
        if not 0 <= index < size:
            raise IndexError(f"grid point {index} out of range; the grid has {size:,} points")
        pairs: list[tuple[Sequence[str], Any]] = []
        for spec in reversed(self._specs):
            index, digit = divmod(index, axis_size(spec))
            pairs.append((spec.path, copy.deepcopy(axis_value(spec, digit))))
        return _nest(pairs[::-1])

    def grid(self) -> Iterator[dict[str, Any]]:
        """Every grid point in order, made one at a time (constant memory, however large).

        Raises:
            ConfigError: If an int/double/log leaf has no ``count``.
        """
        return (self.grid_point(index) for index in range(self.grid_size()))

    def sample(self, rng: random.Random) -> dict[str, Any]:
        """One random point as nested hyperparameters (one draw per non-constant leaf, in order)."""
        return _nest([(spec.path, sample_value(spec, rng)) for spec in self._specs])


DEFAULT_MAX_GRID_TRIALS = 100_000
"""The most grid points a grid search runs unless told otherwise (``--max-grid-trials``)."""


def check_grid_limit(limit: int | None) -> None:
    """Refuse a ``max_grid_trials`` that is not None or an integer >= 1."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ConfigError(
            f"max_grid_trials (--max-grid-trials): must be an integer >= 1, or None for no "
            f"limit, got {limit!r}"
        )


def check_grid_size(space: HyperparameterSpace, limit: int | None, source: str) -> int:
    """The grid's size, refused when over ``limit`` (None: no limit); computed, never built.

    Args:
        space: A grid space (every int/double/log leaf has ``count``).
        limit: The most grid points allowed.
        source: The config's name for messages (``grid.yaml``).

    Returns:
        The number of grid points.

    Raises:
        ConfigError: ``grid.yaml: hyperparameters.a.count: grid search would run ... trials``,
            naming the biggest axes and ``--max-grid-trials``.
    """
    check_grid_limit(limit)
    size = space.grid_size()
    if limit is None or size <= limit:
        return size
    axes = space.grid_axes()
    shown = " x ".join(f"{path} {count:,}" for path, count in axes[:3])
    if len(axes) > 3:
        more = len(axes) - 3
        shown += f" x {more} more ax{'es' if more > 1 else 'is'}"
    raise ConfigError(
        f"{source}: {axes[0][0]}: grid search would run {size:,} trials ({shown}), more than "
        f"the limit of {limit:,}; lower the counts, or allow it with --max-grid-trials {size} "
        f"(max_grid_trials={size} in Python)"
    )


@runtime_checkable
class Sampler(Protocol):
    """Where new hyperparameters come from; values given to :meth:`observe` are smaller-is-better."""

    def sample(self, trial_id: str) -> dict[str, Any]:
        """Nested hyperparameters for a new trial."""

    def observe(self, trial_id: str, length: int, value: float) -> None:
        """The trial reached ``length`` with ``value`` (sign-normalised: smaller is better)."""

    def forget(self, trial_id: str) -> None:
        """Drop what is known about the trial (it raised InvalidHP)."""

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state, enough to continue the same stream."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""


class RandomSampler:
    """Independent uniform samples from the space, from a seeded stream.

    Example:
        >>> space = HyperparameterSpace({"layers": {"type": "int", "minval": 1, "maxval": 4}})
        >>> a, b = RandomSampler(space, seed=1), RandomSampler(space, seed=1)
        >>> a.sample("t0") == b.sample("t0")
        True
    """

    def __init__(self, space: HyperparameterSpace, seed: int) -> None:
        self.space = space
        self._rng = random.Random(seed)

    def sample(self, trial_id: str) -> dict[str, Any]:
        """A uniform sample (``trial_id`` does not affect it)."""
        return self.space.sample(self._rng)

    def observe(self, trial_id: str, length: int, value: float) -> None:
        """Results do not change random sampling."""

    def forget(self, trial_id: str) -> None:
        """Nothing is kept per trial."""

    def state_dict(self) -> dict[str, Any]:
        """The random stream's position."""
        return {"kind": "random", "rng": rng_state_to_json(self._rng)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the stream saved by :meth:`state_dict`."""
        self._rng.setstate(rng_state_from_json(state["rng"]))
