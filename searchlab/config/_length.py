"""Training lengths as Determined writes them: ``{batches: N}``, ``{records: N}``, ``{epochs: N}``."""

from __future__ import annotations

import enum
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, model_serializer, model_validator

from searchlab.errors import ConfigError

__all__ = ["ConfigFieldError", "Length", "LengthUnit"]


class ConfigFieldError(ValueError):
    """A config value that is wrong at a known place below the object being validated.

    ``field`` is the dotted path relative to the model that raised it (empty for the model
    itself); the loader joins it to the location pydantic reports and formats one line.
    """

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class LengthUnit(str, enum.Enum):
    """The unit a training length is counted in."""

    BATCHES = "batches"
    RECORDS = "records"
    EPOCHS = "epochs"


def _units() -> str:
    return ", ".join(unit.value for unit in LengthUnit)


class Length(BaseModel):
    """A training length: a number of batches, records or epochs.

    Accepts Determined's map form with exactly one key, a bare int (batches), or another
    :class:`Length`. Serialises back to the map form.

    Example:
        >>> Length.parse({"batches": 937})
        Length(unit=<LengthUnit.BATCHES: 'batches'>, value=937)
        >>> Length.parse(100).to_dict()
        {'batches': 100}
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    unit: LengthUnit
    value: int

    @model_validator(mode="before")
    @classmethod
    def _from_determined_form(cls, data: Any) -> Any:
        if isinstance(data, Length):
            return data
        if isinstance(data, bool):
            raise ConfigFieldError(f"must be a map like {{batches: N}} or an int, got {data!r}")
        if isinstance(data, int):
            if data < 0:
                raise ConfigFieldError(f"must be >= 0, got {data}")
            return {"unit": LengthUnit.BATCHES, "value": data}
        if isinstance(data, dict) and set(data) == {"unit", "value"}:
            return data
        if not isinstance(data, dict) or len(data) != 1:
            raise ConfigFieldError(
                f"must be a map with exactly one of {_units()} (e.g. {{batches: 100}}) "
                f"or an int number of batches, got {data!r}"
            )
        ((key, value),) = data.items()
        try:
            unit = LengthUnit(key)
        except ValueError:
            raise ConfigFieldError(
                f"unknown unit; valid units are: {_units()}", field=str(key)
            ) from None
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigFieldError(f"must be an integer, got {value!r}", field=key)
        if value < 0:
            raise ConfigFieldError(f"must be >= 0, got {value}", field=key)
        return {"unit": unit, "value": value}

    @model_serializer
    def _to_determined_form(self) -> dict[str, int]:
        return {self.unit.value: self.value}

    @classmethod
    def parse(cls, raw: Any) -> Length:
        """Build a length from ``{batches|records|epochs: N}``, an int (batches) or a Length.

        Args:
            raw: The value as written in the config.

        Returns:
            The parsed length.

        Raises:
            ConfigError: If ``raw`` is not a length.
        """
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            error = exc.errors()[0]
            cause = error.get("ctx", {}).get("error")
            message = cause.message if isinstance(cause, ConfigFieldError) else error["msg"]
            raise ConfigError(f"length: {message}") from None

    def to_dict(self) -> dict[str, int]:
        """The Determined map form, e.g. ``{"epochs": 2}``."""
        return {self.unit.value: self.value}

    def __str__(self) -> str:
        return f"{self.value} {self.unit.value}"
