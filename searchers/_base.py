"""The contract between pure search logic and the Ray Tune adapter.

A search method knows nothing about Ray or torch: it hands out trials (hyperparameters and how
far to train), takes validation results, and answers with decisions. The adapter in
``searchlab`` turns those into Tune searcher/scheduler calls.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["Action", "Decision", "ExitReason", "SearchMethod", "TrialStart"]


class Action(str, enum.Enum):
    """What a trial does after reporting a validation result."""

    CONTINUE = "continue"
    PAUSE = "pause"
    STOP = "stop"


class ExitReason(str, enum.Enum):
    """Why a trial left the search before the search method finished it."""

    COMPLETED = "completed"
    ERRORED = "errored"
    INVALID_HP = "invalid_hp"
    USER_CANCELED = "user_canceled"


@dataclass(frozen=True)
class TrialStart:
    """A new trial: its hyperparameters (nested dicts) and the lengths it reports at.

    ``rung_ends`` are the lengths (in the searcher's unit) at which the trial validates and
    asks for a decision; the last one is the most it will ever train. ``train_to`` is the first
    length it trains to before asking.
    """

    hparams: dict[str, Any]
    train_to: int
    rung_ends: list[int]
    bracket: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Decision:
    """The answer to a validation result: go on to ``train_to``, pause, or stop."""

    action: Action
    train_to: int | None = None


class SearchMethod(Protocol):
    """What every searcher in :mod:`searchers` implements."""

    def start_trial(self, trial_id: str) -> TrialStart | None:
        """A new trial for ``trial_id``, or None when no trial should start now."""

    def report(self, trial_id: str, length: int, value: float) -> Decision:
        """The trial validated at ``length`` with searcher metric ``value``."""

    def trial_exited(self, trial_id: str, reason: ExitReason) -> None:
        """The trial ended outside the search method's plan (error, InvalidHP, completion)."""

    def next_resume(self) -> tuple[str, int] | None:
        """A paused trial to resume now and the length to train it to, or None."""

    def closed_trials(self) -> list[str]:
        """Paused trials that will never be resumed (to be stopped); each is returned once."""

    def paused_trials(self) -> list[str]:
        """Trials waiting at a rung for a promotion (after a restore, they must stay paused)."""

    @property
    def finished(self) -> bool:
        """True when no more trials will be started or resumed."""

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue the search later, as JSON-able data."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
