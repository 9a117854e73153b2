"""The hyperparameter space: grid points, random samples, and nested <-> dotted names.

Leaves are visited with keys sorted at every nesting level; in the grid the first leaf varies
slowest. Trials always see nested dicts (``{"optimizer": {"lr": 0.1}}``).
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import math
import random
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from searchlab.config import (
    ConfigFieldError,
    HParamSpec,
    HParamType,
    SearcherName,
    parse_hyperparameters,
)
from searchlab.errors import ConfigError

if TYPE_CHECKING:
    from searchlab.config import ExperimentConfig

__all__ = [
    "HyperparameterSpace",
    "RandomSampler",
    "Sampler",
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


def _exponents(spec: HParamSpec, count: int) -> list[float]:
    lo, hi = spec.minval, spec.maxval
    if count == 1:
        return [(lo + hi) / 2]
    return [lo + i * (hi - lo) / (count - 1) for i in range(count)]


def grid_values(spec: HParamSpec) -> list[Any]:
    """The grid axis of one leaf, in order (see SPEC section 2, ``grid``).

    Raises:
        ConfigError: If an int/double/log leaf has no ``count``.
    """
    if spec.type is HParamType.CONST:
        return [spec.val]
    if spec.type is HParamType.CATEGORICAL:
        return list(spec.vals)
    if spec.count is None:
        raise _missing_count(spec)
    if spec.type is HParamType.INT:
        lo, hi = int(spec.minval), int(spec.maxval)
        count = min(spec.count, hi - lo + 1)
        if count == 1:
            return [round_half_away((lo + hi) / 2)]
        return [round_half_away(lo + (i * (hi - lo)) / (count - 1)) for i in range(count)]
    points = _exponents(spec, spec.count)
    if spec.type is HParamType.LOG:
        return [spec.base**x for x in points]
    return points


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
        """The number of grid points."""
        return math.prod(len(grid_values(spec)) for spec in self._specs)

    def grid(self) -> list[dict[str, Any]]:
        """Every grid point as nested hyperparameters; the first leaf varies slowest.

        Raises:
            ConfigError: If an int/double/log leaf has no ``count``.
        """
        axes = [grid_values(spec) for spec in self._specs]
        paths = [spec.path for spec in self._specs]
        return [_nest(list(zip(paths, copy.deepcopy(point)))) for point in itertools.product(*axes)]

    def sample(self, rng: random.Random) -> dict[str, Any]:
        """One random point as nested hyperparameters (one draw per non-constant leaf, in order)."""
        return _nest([(spec.path, sample_value(spec, rng)) for spec in self._specs])


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
