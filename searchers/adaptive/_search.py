"""Adaptive ASHA as a :class:`searchers._base.SearchMethod`: brackets, trials, pauses and resumes.

The rung rules live in :mod:`._rungs` (promotion) and :mod:`._stopping` (``stop_once``); this
module decides which bracket a new trial joins and when, keeps every trial's place, queues
promoted trials for resuming, closes out paused trials that can never go on, and saves it all
as JSON-able data.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from searchers._base import Action, Decision, ExitReason, TrialStart
from searchers.adaptive._plan import AdaptivePlan, BracketPlan
from searchers.adaptive._rungs import WORST, Promotion, PromotionRungs, Rung
from searchers.adaptive._stopping import StoppingRungs
from searchlab.errors import CheckpointError, ConfigError

__all__ = ["AdaptiveSearch", "TrialStatus"]

_STATE_VERSION = 1


class TrialStatus(str, enum.Enum):
    """Where a trial stands in the search."""

    RUNNING = "running"  # training toward its rung
    QUEUED = "queued"  # promoted into its rung, waiting for next_resume()
    PAUSED = "paused"  # has a result at its rung, may still be promoted
    DONE = "done"  # finished its last rung, or was stopped (stop_once)
    CLOSED = "closed"  # paused and closed out: will never be resumed
    EXITED = "exited"  # errored or canceled: counts as the worst result
    INVALID = "invalid"  # raised InvalidHP: forgotten, replaced

    @property
    def ended(self) -> bool:
        """True when the search is through with the trial."""
        return self in (
            TrialStatus.DONE,
            TrialStatus.CLOSED,
            TrialStatus.EXITED,
            TrialStatus.INVALID,
        )


@dataclass
class _Trial:
    bracket: int
    rung: int
    status: TrialStatus


@dataclass
class _Bracket:
    plan: BracketPlan
    rungs: PromotionRungs | StoppingRungs
    created: int = 0
    invalid: int = 0

    @property
    def counted(self) -> int:
        """Trials created that count toward the bracket's trials (InvalidHP ones do not)."""
        return self.created - self.invalid


class AdaptiveSearch:
    """Adaptive ASHA (``adaptive_asha`` / ``async_halving``) over the brackets of a plan.

    Values are the raw searcher metric; the sign is flipped inside when larger is better.
    Promoted trials are resumed (``next_resume``) before any new trial starts.

    Example:
        >>> from searchers.adaptive import AdaptiveSearch, build_adaptive_plan
        >>> plan = build_adaptive_plan(64, 16, mode="aggressive")
        >>> search = AdaptiveSearch(plan, lambda trial_id: {"lr": 0.1})
        >>> start = search.start_trial("t0")
        >>> start.train_to, start.rung_ends
        (4, [4, 16, 64])
        >>> search.report("t0", 4, 0.3)
        Decision(action=<Action.PAUSE: 'pause'>, train_to=None)
    """

    def __init__(
        self,
        plan: AdaptivePlan,
        sample_hparams: Callable[[str], dict[str, Any]],
        *,
        smaller_is_better: bool = True,
        stop_once: bool = False,
    ) -> None:
        self.plan = plan
        self.smaller_is_better = smaller_is_better
        self.stop_once = stop_once
        self._sample = sample_hparams
        self._brackets = [_Bracket(b, self._new_rungs(b)) for b in plan.brackets]
        self._trials: dict[str, _Trial] = {}
        # Creations owed, oldest first, as bracket indices (the count per bracket is what is
        # owed to it); the initial trials come bracket by bracket.
        self._owed = [i for i, b in enumerate(plan.brackets) for _ in range(b.initial_trials)]
        self._resumes: list[tuple[str, int]] = []
        self._closed: list[str] = []

    # The SearchMethod protocol.

    def start_trial(self, trial_id: str) -> TrialStart | None:
        """A new trial in the bracket owed one longest, or None when none should start now."""
        if trial_id in self._trials:
            raise ValueError(f"trial {trial_id!r} was started before; trial ids must be new")
        if self._resumes or not self._owed:
            return None
        index = self._owed[0]
        bracket = self._brackets[index]
        ends = bracket.plan.rung_ends
        hparams = self._sample(trial_id)  # first: a sampler that raises changes nothing
        self._owed.pop(0)
        bracket.created += 1
        bracket.rungs.admit()
        self._trials[trial_id] = _Trial(index, 0, TrialStatus.RUNNING)
        return TrialStart(hparams=hparams, train_to=ends[0], rung_ends=list(ends), bracket=index)

    def report(self, trial_id: str, length: int, value: float) -> Decision:
        """The running trial validated at ``length`` (total units) with metric ``value``."""
        trial = self._running(trial_id)
        end = self._brackets[trial.bracket].plan.rung_ends[trial.rung]
        if length < end:
            return Decision(Action.CONTINUE, train_to=end)
        signed = self._signed(value)
        if self.stop_once:
            return self._report_stopping(trial_id, trial, length, signed)
        return self._report_promotion(trial_id, trial, length, signed)

    def trial_exited(self, trial_id: str, reason: ExitReason) -> None:
        """The trial left outside the plan: InvalidHP is replaced, anything else counts worst.

        A trial the search is through with (done, closed, exited) is not affected.
        """
        trial = self._known(trial_id)
        if trial.status.ended:
            return
        if ExitReason(reason) is ExitReason.INVALID_HP:
            self._invalidate(trial_id, trial)
        else:
            self._exit(trial_id, trial)

    def next_resume(self) -> tuple[str, int] | None:
        """The promoted trial waiting longest and the length to train it to, or None."""
        if not self._resumes:
            return None
        trial_id, train_to = self._resumes.pop(0)
        self._trials[trial_id].status = TrialStatus.RUNNING
        return trial_id, train_to

    def closed_trials(self) -> list[str]:
        """Paused trials closed out since the last call: they will never be resumed."""
        closed, self._closed = self._closed, []
        return closed

    @property
    def finished(self) -> bool:
        """True when every trial was created, none is queued to resume and none is running."""
        if self._resumes or self._owed:
            return False
        return all(
            b.counted >= b.plan.num_trials and not any(r.outstanding for r in b.rungs.rungs)
            for b in self._brackets
        )

    # Progress.

    def paused_trials(self) -> list[str]:
        """Trials waiting at their rung for a promotion that may still come."""
        return [tid for tid, t in self._trials.items() if t.status is TrialStatus.PAUSED]

    def trial_position(self, trial_id: str) -> tuple[int, int]:
        """(bracket, rung): the rung the trial trains toward, waits at, or ended at."""
        trial = self._known(trial_id)
        return trial.bracket, trial.rung

    def rung_table(self) -> list[dict[str, Any]]:
        """Per bracket, its rungs: ``rung_end``, ``results``, ``promoted`` (went on; with
        stop_once: continued) and ``outstanding`` (results still to come).

        Example: ``[{"bracket": 0, "rungs": [{"rung": 0, "rung_end": 15, "results": 4,
        "promoted": 1, "outstanding": 2}, ...]}, ...]``.
        """
        return [
            {
                "bracket": b,
                "rungs": [
                    {
                        "rung": k,
                        "rung_end": rung.end,
                        "results": len(rung.entries),
                        "promoted": rung.num_promoted,
                        "outstanding": rung.outstanding,
                    }
                    for k, rung in enumerate(bracket.rungs.rungs)
                ],
            }
            for b, bracket in enumerate(self._brackets)
        ]

    # Saving and restoring.

    def state_dict(self) -> dict[str, Any]:
        """The whole search state as JSON-able data (infinite values encoded as strings)."""
        return {
            "version": _STATE_VERSION,
            "config": self._config_dict(),
            "brackets": [
                {
                    "created": b.created,
                    "invalid": b.invalid,
                    "rungs": [r.to_dict() for r in b.rungs.rungs],
                }
                for b in self._brackets
            ],
            "trials": {tid: [t.bracket, t.rung, t.status.value] for tid, t in self._trials.items()},
            "owed": list(self._owed),
            "resumes": [[tid, train_to] for tid, train_to in self._resumes],
            "closed": list(self._closed),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned, for the same plan and options.

        Raises:
            CheckpointError: The state has a format version this code does not read.
            ConfigError: The state was saved with another plan or other options.
        """
        version = state.get("version")
        if version != _STATE_VERSION:
            raise CheckpointError(
                f"adaptive search state version is {version!r}, but must be {_STATE_VERSION}"
            )
        self._check_config(state["config"])
        for bracket, saved in zip(self._brackets, state["brackets"]):
            bracket.created, bracket.invalid = int(saved["created"]), int(saved["invalid"])
            bracket.rungs.rungs = [Rung.from_dict(r) for r in saved["rungs"]]
        self._trials = {
            str(tid): _Trial(int(b), int(k), TrialStatus(s))
            for tid, (b, k, s) in state["trials"].items()
        }
        self._owed = [int(i) for i in state["owed"]]
        self._resumes = [(str(tid), int(train_to)) for tid, train_to in state["resumes"]]
        self._closed = [str(tid) for tid in state["closed"]]

    # Rung results.

    def _report_promotion(
        self, trial_id: str, trial: _Trial, length: int, value: float
    ) -> Decision:
        bracket = self._brackets[trial.bracket]
        ends = bracket.plan.rung_ends
        while True:
            at_last = trial.rung == bracket.rungs.last
            promotion = self._record_promotion(trial_id, trial, value, alive=True)
            if at_last:
                trial.status, decision = TrialStatus.DONE, Decision(Action.STOP)
                break
            if promotion is None or not promotion.now:
                trial.status, decision = TrialStatus.PAUSED, Decision(Action.PAUSE)
                break
            trial.rung += 1
            if length < ends[trial.rung]:
                decision = Decision(Action.CONTINUE, train_to=ends[trial.rung])
                break
            # The trial already trained past the next rung end: it reports there too.
        self._close_out(trial.bracket)
        return decision

    def _record_promotion(
        self, trial_id: str, trial: _Trial, value: float, *, alive: bool
    ) -> Promotion | None:
        bracket = self._brackets[trial.bracket]
        assert isinstance(bracket.rungs, PromotionRungs)
        promotion = bracket.rungs.record(
            trial_id, trial.rung, value, alive=alive, can_resume=self._can_resume
        )
        if promotion is None:
            self._owe(trial.bracket)
        elif not promotion.now:
            promoted = self._trials[promotion.trial_id]
            promoted.rung, promoted.status = promotion.to_rung, TrialStatus.QUEUED
            self._resumes.append((promotion.trial_id, bracket.plan.rung_ends[promotion.to_rung]))
        return promotion

    def _report_stopping(self, trial_id: str, trial: _Trial, length: int, value: float) -> Decision:
        bracket = self._brackets[trial.bracket]
        assert isinstance(bracket.rungs, StoppingRungs)
        ends = bracket.plan.rung_ends
        while bracket.rungs.record(trial_id, trial.rung, value, alive=True):
            trial.rung += 1
            if length < ends[trial.rung]:
                return Decision(Action.CONTINUE, train_to=ends[trial.rung])
        trial.status = TrialStatus.DONE
        self._owe(trial.bracket)
        return Decision(Action.STOP)

    # Exits.

    def _exit(self, trial_id: str, trial: _Trial) -> None:
        was, trial.status = trial.status, TrialStatus.EXITED
        bracket = self._brackets[trial.bracket]
        if was is TrialStatus.PAUSED:
            # Its result stands at its rung, now as the worst; it frees no slot, so no creation.
            assert isinstance(bracket.rungs, PromotionRungs)
            bracket.rungs.mark_worst(trial_id, trial.rung)
            return
        if was is TrialStatus.QUEUED:
            # Its promotion is lost: it counts as the worst result at the rung it was promoted to.
            self._resumes = [r for r in self._resumes if r[0] != trial_id]
        if isinstance(bracket.rungs, StoppingRungs):
            bracket.rungs.record(trial_id, trial.rung, WORST, alive=False)
            self._owe(trial.bracket)
        else:
            self._record_promotion(trial_id, trial, WORST, alive=False)
            self._close_out(trial.bracket)

    def _invalidate(self, trial_id: str, trial: _Trial) -> None:
        was, trial.status = trial.status, TrialStatus.INVALID
        bracket = self._brackets[trial.bracket]
        bracket.invalid += 1
        self._resumes = [r for r in self._resumes if r[0] != trial_id]
        if isinstance(bracket.rungs, StoppingRungs):
            bracket.rungs.remove(trial_id, trial.rung)
        else:
            bracket.rungs.remove(trial_id, trial.rung, outstanding=was is not TrialStatus.PAUSED)
        self._owe(trial.bracket)

    # Helpers.

    def _owe(self, index: int) -> None:
        """Owe the bracket a new trial, unless it created (or is owed) all of its trials."""
        bracket = self._brackets[index]
        if bracket.counted + self._owed.count(index) < bracket.plan.num_trials:
            self._owed.append(index)

    def _close_out(self, index: int) -> None:
        bracket = self._brackets[index]
        assert isinstance(bracket.rungs, PromotionRungs)
        for trial_id in bracket.rungs.close_out(bracket.plan.num_trials):
            trial = self._trials[trial_id]
            if trial.status is TrialStatus.PAUSED:
                trial.status = TrialStatus.CLOSED
                self._closed.append(trial_id)

    def _can_resume(self, trial_id: str) -> bool:
        return self._trials[trial_id].status is TrialStatus.PAUSED

    def _signed(self, value: float) -> float:
        signed = float(value) if self.smaller_is_better else -float(value)
        return WORST if math.isnan(signed) else signed

    def _new_rungs(self, bracket: BracketPlan) -> PromotionRungs | StoppingRungs:
        if self.stop_once:
            return StoppingRungs(bracket.rung_ends, self.plan.divisor)
        return PromotionRungs(bracket.rung_ends, self.plan.divisor)

    def _known(self, trial_id: str) -> _Trial:
        try:
            return self._trials[trial_id]
        except KeyError:
            raise ValueError(f"trial {trial_id!r} is not a trial of this search") from None

    def _running(self, trial_id: str) -> _Trial:
        trial = self._known(trial_id)
        if trial.status is not TrialStatus.RUNNING:
            raise ValueError(
                f"trial {trial_id!r} reported a result while {trial.status.value}; only running "
                "trials report (a paused trial runs again once next_resume() hands it out)"
            )
        return trial

    def _config_dict(self) -> dict[str, Any]:
        return {
            "stop_once": self.stop_once,
            "smaller_is_better": self.smaller_is_better,
            "divisor": self.plan.divisor,
            "brackets": [b.to_dict() for b in self.plan.brackets],
        }

    def _check_config(self, saved: dict[str, Any]) -> None:
        current = self._config_dict()
        for key, value in current.items():
            if saved.get(key) != value:
                raise ConfigError(
                    f"searcher {key} is {value!r}, but the saved search state has {saved.get(key)!r}: "
                    "an experiment must resume with the searcher config it started with"
                )
