"""What crosses the process boundary between the driver and a trial's worker, typed.

Ray Tune carries a trial's config to its worker and each result back as plain dicts. searchlab's
part of them is one dataclass each, written and read only here:

- :class:`TrialConfig`: a trial's hyperparameters and search plan, as its Tune config;
- :class:`TrialReport`: searchlab's part of a Tune result, under the one key ``searchlab``:
  the rung a validation ended, how a trial ended itself (:class:`Outcome`), a warning, timings.

Example:
    >>> result = TrialReport(length=40, rung=0).attach({"validation_loss": 0.3})
    >>> TrialReport.of(result).length
    40
"""

from __future__ import annotations

import dataclasses
import enum
import os
import pathlib
from collections.abc import Mapping
from typing import Any

from searchlab.experiment._compat import TUNE_FLAT_DELIMITER

__all__ = [
    "CHECKPOINT_LENGTH_KEY",
    "HPARAMS_KEY",
    "PLAN_KEY",
    "RESULT_KEY",
    "WRITING_MARKER",
    "Outcome",
    "TrialConfig",
    "TrialReport",
    "is_being_written",
]

RESULT_KEY = "searchlab"  # in a Tune result: searchlab's part (TrialReport)
HPARAMS_KEY = "hparams"  # in a Tune config: the trial's hyperparameters
PLAN_KEY = "searchlab"  # in a Tune config: the trial's search plan
# In a checkpoint's metadata.json: the longest rung length whose result the trial had reported.
CHECKPOINT_LENGTH_KEY = "searchlab_length_done"
# In a checkpoint directory: its state file is still being written by the worker the file
# names (``_checkpoint_writer``); gone once ``state-dict.pth`` is in place.
WRITING_MARKER = "state-dict.writing"


class Outcome(str, enum.Enum):
    """How a trial ended itself (a result with ``done``), when not by finishing its plan."""

    INVALID_HP = "invalid_hp"  # raised InvalidHP: replaced, not counted
    FATAL = "fatal"  # a user error every trial would hit: the experiment stops
    TRIAL_ERROR = "trial_error"  # this trial failed for good (a NaN loss): the worst result


@dataclasses.dataclass(frozen=True)
class TrialReport:
    """searchlab's part of a trial's result.

    ``length``/``rung``: set on a rung-end validation (the length in searcher units).
    ``outcome``/``message``: how and why the trial ended itself; ``config_path`` names the
    config field a fatal error is about (``searcher.metric``). ``warning``: something the user
    should know (a damaged checkpoint skipped). ``timing``: seconds the worker spent outside
    training since its last result (``build_s``, ``checkpoint_write_s``, ...).
    """

    length: int | None = None
    rung: int | None = None
    outcome: Outcome | None = None
    message: str | None = None
    config_path: str | None = None
    warning: str | None = None
    timing: Mapping[str, float] | None = None

    def attach(self, result: dict[str, Any]) -> dict[str, Any]:
        """``result`` with this report under ``RESULT_KEY`` (nothing added when empty)."""
        data = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) is not None
        }
        if data:
            if self.outcome is not None:
                data["outcome"] = self.outcome.value
            if self.timing is not None:
                data["timing"] = dict(self.timing)
            result[RESULT_KEY] = data
        return result

    @classmethod
    def of(cls, result: Mapping[str, Any] | None) -> TrialReport:
        """The report in a Tune result (an empty one when the result carries none).

        Tune hands schedulers and searchers its results flattened (``searchlab/length``);
        callbacks get them as the trial returned them. Both read the same.
        """
        result = result or {}
        data = result.get(RESULT_KEY)
        if not isinstance(data, Mapping):
            data = _unflatten(result, RESULT_KEY + TUNE_FLAT_DELIMITER)
        if not data:
            return cls()
        outcome = data.get("outcome")
        return cls(
            length=_int(data.get("length")),
            rung=_int(data.get("rung")),
            outcome=Outcome(outcome) if outcome is not None else None,
            message=data.get("message"),
            config_path=data.get("config_path"),
            warning=data.get("warning"),
            timing=data.get("timing"),
        )

    def merged(self, **changes: Any) -> TrialReport:
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True)
class TrialConfig:
    """A trial's hyperparameters and plan, as Tune carries them in the trial's config.

    Example:
        >>> TrialConfig({"lr": 0.1}, rung_ends=[4, 16], bracket=0, trial_seed=7).to_tune()
        {'hparams': {'lr': 0.1}, 'searchlab': {'rung_ends': [4, 16], 'bracket': 0, 'trial_seed': 7}}
    """

    hparams: dict[str, Any]
    rung_ends: list[int]
    bracket: int | None = None
    trial_seed: int = 0

    def to_tune(self) -> dict[str, Any]:
        plan = {
            "rung_ends": list(self.rung_ends),
            "bracket": self.bracket,
            "trial_seed": self.trial_seed,
        }
        return {HPARAMS_KEY: self.hparams, PLAN_KEY: plan}

    @classmethod
    def from_tune(cls, config: Mapping[str, Any]) -> TrialConfig:
        plan = config.get(PLAN_KEY) or {}
        return cls(
            hparams=dict(config.get(HPARAMS_KEY) or {}),
            rung_ends=[int(x) for x in plan.get("rung_ends", [])],
            bracket=_int(plan.get("bracket")),
            trial_seed=int(plan.get("trial_seed") or 0),
        )


def _unflatten(result: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for key, value in result.items():
        if not key.startswith(prefix):
            continue
        name, _, sub = key[len(prefix) :].partition(TUNE_FLAT_DELIMITER)
        if sub:
            data.setdefault(name, {})[sub] = value
        else:
            data[name] = value
    return data


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def is_being_written(directory: str | os.PathLike[str]) -> bool:
    """True while ``directory``'s state file is still to be written (or its writer died)."""
    return (pathlib.Path(directory) / WRITING_MARKER).exists()
