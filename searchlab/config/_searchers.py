"""The ``searcher`` section: one model per search method, chosen by ``name``."""

from __future__ import annotations

import enum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from searchlab.config._length import ConfigFieldError, Length

__all__ = [
    "SEARCHER_ALIASES",
    "SEARCHER_CONFIGS",
    "AdaptiveASHAConfig",
    "AdaptiveMode",
    "AsyncHalvingConfig",
    "GridConfig",
    "RandomConfig",
    "SamplerName",
    "SearcherConfig",
    "SearcherName",
    "SingleConfig",
    "TimeMetric",
    "normalise_searcher_name",
]


class SearcherName(str, enum.Enum):
    """The search methods searchlab runs."""

    SINGLE = "single"
    GRID = "grid"
    RANDOM = "random"
    ADAPTIVE_ASHA = "adaptive_asha"
    ASYNC_HALVING = "async_halving"


SEARCHER_ALIASES: dict[str, SearcherName] = {"adaptive": SearcherName.ADAPTIVE_ASHA}


class AdaptiveMode(str, enum.Enum):
    """How many brackets adaptive ASHA runs: one (aggressive) up to ``max_rungs`` (conservative)."""

    AGGRESSIVE = "aggressive"
    STANDARD = "standard"
    CONSERVATIVE = "conservative"


class SamplerName(str, enum.Enum):
    """How new hyperparameters are drawn: uniformly, or by TPE on the results so far."""

    RANDOM = "random"
    TPE = "tpe"


class TimeMetric(str, enum.Enum):
    """The unit of ``max_time`` in the newer ``time_metric`` + ``max_time`` form."""

    BATCHES = "batches"
    EPOCHS = "epochs"


# Determined's searchers that need its master: why searchlab refuses each, and what to use.
_NOT_RUN = {
    "custom": (
        "a custom SearchMethod runs inside a Determined master and searchlab does not run "
        "one; use adaptive_asha, random or grid, or random/adaptive_asha with sampler: tpe "
        "for a model-based search"
    ),
    "pbt": (
        "population-based training is not available; use adaptive_asha (early stopping with "
        "promotion) or random"
    ),
}


def _names() -> str:
    return ", ".join(sorted([n.value for n in SearcherName] + list(SEARCHER_ALIASES)))


def normalise_searcher_name(raw: Any, path: str = "searcher.name") -> SearcherName:
    """Map a ``searcher.name`` (or an alias such as ``adaptive``) onto :class:`SearcherName`.

    Raises:
        ConfigFieldError: For a missing or unknown name, listing the valid ones.
    """
    if raw is None:
        raise ConfigFieldError(f"missing; valid names are: {_names()}", path)
    if isinstance(raw, SearcherName):
        return raw
    name = str(raw)
    if name in _NOT_RUN:
        raise ConfigFieldError(f"{name!r}: {_NOT_RUN[name]}", path)
    if name in SEARCHER_ALIASES:
        return SEARCHER_ALIASES[name]
    try:
        return SearcherName(name)
    except ValueError:
        raise ConfigFieldError(
            f"unknown searcher {name!r}; valid names are: {_names()}", path
        ) from None


def _length_from_time(data: dict[str, Any]) -> dict[str, Any]:
    metric, max_time = data.get("time_metric"), data.get("max_time")
    if metric is None:
        raise ConfigFieldError(
            "missing; max_time needs time_metric: batches or epochs", "time_metric"
        )
    if max_time is None:
        raise ConfigFieldError(f"missing; time_metric: {metric} needs max_time: N", "max_time")
    try:
        unit = TimeMetric(metric)
    except ValueError:
        valid = ", ".join(m.value for m in TimeMetric)
        raise ConfigFieldError(f"must be one of {valid}, got {metric!r}", "time_metric") from None
    if isinstance(max_time, bool) or not isinstance(max_time, int):
        raise ConfigFieldError(f"must be an integer, got {max_time!r}", "max_time")
    return {**data, "max_length": {unit.value: max_time}, "time_metric": None, "max_time": None}


def _check_positive(raw: Any) -> None:
    """A searcher's length must be >= 1 (a validation period may be 0)."""
    field, value = "max_length", raw
    if isinstance(raw, dict) and len(raw) == 1:
        ((key, value),) = raw.items()
        field = f"max_length.{key}"
    if isinstance(value, int) and not isinstance(value, bool) and value < 1:
        raise ConfigFieldError(f"must be >= 1, got {value}", field)


class _SearcherBase(BaseModel):
    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True)

    metric: str = Field(min_length=1)
    smaller_is_better: bool = True
    max_length: Length
    time_metric: TimeMetric | None = None
    max_time: int | None = None
    max_concurrent_trials: int = Field(default=16, ge=0)
    source_checkpoint_uuid: str | None = None
    source_trial_id: int | None = None

    @model_validator(mode="before")
    @classmethod
    def _normalise_length(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        has_time = data.get("time_metric") is not None or data.get("max_time") is not None
        has_length = data.get("max_length") is not None
        if has_time and has_length:
            raise ConfigFieldError(
                "give either max_length or time_metric + max_time, not both; remove one",
                "max_length",
            )
        if has_time:
            data = _length_from_time(data)
        elif not has_length:
            raise ConfigFieldError(
                "missing; set how far each trial trains, e.g. max_length: {batches: 1000} "
                "(or time_metric: batches + max_time: 1000)",
                "max_length",
            )
        _check_positive(data["max_length"])
        return data


class SingleConfig(_SearcherBase):
    """``name: single``: one trial.

    Example:
        >>> SingleConfig(metric="loss", max_length=100).max_length.value
        100
    """

    name: Literal[SearcherName.SINGLE] = SearcherName.SINGLE


class GridConfig(_SearcherBase):
    """``name: grid``: every point of the grid; int/double/log hyperparameters need ``count``.

    Example:
        >>> GridConfig(metric="loss", max_length={"epochs": 2}).max_concurrent_trials
        16
    """

    name: Literal[SearcherName.GRID] = SearcherName.GRID


class RandomConfig(_SearcherBase):
    """``name: random``: ``max_trials`` independent samples.

    Example:
        >>> RandomConfig(metric="loss", max_length=100, max_trials=8).sampler.value
        'random'
    """

    name: Literal[SearcherName.RANDOM] = SearcherName.RANDOM
    max_trials: int = Field(ge=1)
    sampler: SamplerName = SamplerName.RANDOM


class AdaptiveASHAConfig(_SearcherBase):
    """``name: adaptive_asha`` (alias ``adaptive``): brackets of asynchronous successive halving.

    Example:
        >>> AdaptiveASHAConfig(metric="loss", max_length=1000, max_trials=64).mode.value
        'standard'
    """

    name: Literal[SearcherName.ADAPTIVE_ASHA] = SearcherName.ADAPTIVE_ASHA
    max_trials: int = Field(ge=1)
    mode: AdaptiveMode = AdaptiveMode.STANDARD
    divisor: float = Field(default=4.0, gt=1)
    max_rungs: int = Field(default=5, ge=1)
    bracket_rungs: list[int] | None = None
    stop_once: bool = False
    sampler: SamplerName = SamplerName.RANDOM

    @field_validator("bracket_rungs")
    @classmethod
    def _rungs_positive(cls, value: list[int] | None) -> list[int] | None:
        if value is not None:
            if not value:
                raise ConfigFieldError("must list at least one rung count (or be left out)")
            for index, rungs in enumerate(value):
                if rungs < 1:
                    raise ConfigFieldError(f"must be >= 1, got {rungs}", f"[{index}]")
        return value


class AsyncHalvingConfig(_SearcherBase):
    """``name: async_halving``: one bracket of ``num_rungs`` rungs.

    Example:
        >>> AsyncHalvingConfig(metric="loss", max_length=1000, max_trials=64, num_rungs=4).divisor
        4.0
    """

    name: Literal[SearcherName.ASYNC_HALVING] = SearcherName.ASYNC_HALVING
    num_rungs: int = Field(ge=1)
    max_trials: int = Field(ge=1)
    divisor: float = Field(default=4.0, gt=1)
    stop_once: bool = False
    sampler: SamplerName = SamplerName.RANDOM


SEARCHER_CONFIGS: dict[SearcherName, type[_SearcherBase]] = {
    SearcherName.SINGLE: SingleConfig,
    SearcherName.GRID: GridConfig,
    SearcherName.RANDOM: RandomConfig,
    SearcherName.ADAPTIVE_ASHA: AdaptiveASHAConfig,
    SearcherName.ASYNC_HALVING: AsyncHalvingConfig,
}

SearcherConfig = Annotated[
    SingleConfig | GridConfig | RandomConfig | AdaptiveASHAConfig | AsyncHalvingConfig,
    Field(discriminator="name"),
]
