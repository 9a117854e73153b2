"""The search driver: what runs when, decided without Ray.

A :class:`SearchDriver` wraps a pure ``SearchMethod`` and keeps, for every trial, where it
stands as the trial runner sees it (running, waiting at a rung, queued for a promotion, done).
The runner (Ray Tune, through thin adapters) feeds it events and carries out its answers:

- ``suggest`` hands out new trials, or "ask later" while promotions are due or the run drains;
- ``on_result`` answers a rung result with CONTINUE, PAUSE or STOP;
- ``on_exit`` takes errors, InvalidHP and completions;
- ``choose`` says which waiting trial to run next, which to stop, and whether a drained run
  may end;
- ``restore`` settles the trials a crashed run left behind.

Results that repeat a length the driver already decided on are *replays*: a trial restored
from a checkpoint older than its last result trains those batches again. The driver answers
them from its own record (CONTINUE until the trial is back where it was, then the answer it
got before), so the search method sees every result exactly once and a crash at any moment
leaves the search where an uninterrupted run would be. The whole state is JSON-able.

Example:
    >>> from searchers import SearchDriver, build_search_method
    >>> driver = SearchDriver(build_search_method(cfg))
    >>> start = driver.suggest("t1")
    >>> driver.on_result("t1", start.train_to, 0.3)
    <Action.PAUSE: 'pause'>
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping
from typing import Any

from searchers._base import Action, ExitReason, SearchMethod
from searchlab.errors import CheckpointError

__all__ = ["Choice", "Phase", "RunnerStatus", "SearchDriver", "TrialPlan"]

_STATE_VERSION = 2
FINISHED = "FINISHED"


class Phase(str, enum.Enum):
    """Where a trial stands, as the driver sees it."""

    RUNNING = "running"  # handed out or resumed; trains toward its next rung
    WAITING = "waiting"  # paused at a rung; a promotion may still come
    QUEUED = "queued"  # promoted; waits for the runner to resume it
    DONE = "done"  # the search is through with it (finished, stopped, closed out)
    EXITED = "exited"  # errored, InvalidHP or canceled


class RunnerStatus(str, enum.Enum):
    """A trial's status in the runner (Ray Tune's PENDING/RUNNING/PAUSED/TERMINATED/ERROR)."""

    PENDING = "pending"
    RUNNING = "running"
    PAUSED = "paused"
    ENDED = "ended"


@dataclasses.dataclass(frozen=True)
class TrialPlan:
    """What a new trial is told: its hyperparameters, rung ends, bracket and seed."""

    hparams: dict[str, Any]
    rung_ends: list[int]
    train_to: int
    bracket: int | None
    trial_seed: int

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrialPlan:
        return cls(
            hparams=dict(data["hparams"]),
            rung_ends=[int(x) for x in data["rung_ends"]],
            train_to=int(data["train_to"]),
            bracket=None if data.get("bracket") is None else int(data["bracket"]),
            trial_seed=int(data["trial_seed"]),
        )


@dataclasses.dataclass
class _Trial:
    plan: TrialPlan
    phase: Phase = Phase.RUNNING
    length: int = 0  # the longest length the search method decided on for it

    def to_list(self) -> list[Any]:
        return [self.plan.to_dict(), self.phase.value, self.length]

    @classmethod
    def from_list(cls, data: list[Any]) -> _Trial:
        return cls(TrialPlan.from_dict(data[0]), Phase(data[1]), int(data[2]))


@dataclasses.dataclass(frozen=True)
class Choice:
    """The driver's answer to "what now?" for the trials the runner holds.

    ``run``: the trial to start or resume next (None: nothing). ``pause``: trials to keep
    paused (they are pending in the runner but wait for the search). ``stop``: trials to end.
    ``checkpoint_pause``: running trials to pause with a checkpoint (an interrupt).
    ``drained``: an interrupted run has nothing running any more and may end, resumable.
    """

    run: str | None = None
    pause: tuple[str, ...] = ()
    stop: tuple[str, ...] = ()
    checkpoint_pause: tuple[str, ...] = ()
    drained: bool = False


class SearchDriver:
    """Turns runner events into search decisions and runner commands (see the module doc)."""

    def __init__(self, method: SearchMethod, *, smaller_is_better: bool = True) -> None:
        self.method = method
        self.smaller_is_better = smaller_is_better
        self._trials: dict[str, _Trial] = {}
        self._queue: list[str] = []  # promoted trials, in the order they are to resume
        self._to_stop: list[str] = []  # trials the runner still holds that must end
        self._catching_up: set[str] = set()  # restored behind their last result
        self.interrupted = False
        self._drained = False

    # -- new trials ----------------------------------------------------------------------
    def suggest(self, trial_id: str) -> TrialPlan | str | None:
        """A new trial's plan, None ("ask later") or ``FINISHED`` (no trial will ever start)."""
        self._collect()
        if self._queue or self.interrupted:
            return None
        start = self.method.start_trial(trial_id)
        if start is None:
            return FINISHED if self.method.finished else None
        plan = TrialPlan(
            hparams=start.hparams,
            rung_ends=list(start.rung_ends),
            train_to=int(start.train_to),
            bracket=start.bracket,
            trial_seed=int(start.extra.get("trial_seed", 0)),
        )
        self._trials[trial_id] = _Trial(plan)
        return plan

    def plan(self, trial_id: str) -> TrialPlan | None:
        trial = self._trials.get(trial_id)
        return trial.plan if trial is not None else None

    # -- results ---------------------------------------------------------------------------
    def on_result(self, trial_id: str, length: int, value: float | None) -> Action:
        """A rung-end validation of ``trial_id`` at ``length`` (searcher units)."""
        trial = self._trials.get(trial_id)
        if trial is None or trial.phase is Phase.EXITED:
            return Action.STOP  # not a trial of this search (any more)
        if length <= trial.length:
            return self._replay(trial_id, trial, length)
        if trial.phase is Phase.QUEUED:  # resumed by the runner before the driver chose it
            self._queue.remove(trial_id)
            trial.phase = Phase.RUNNING
        if trial.phase is not Phase.RUNNING:
            return Action.STOP if trial.phase is Phase.DONE else Action.PAUSE
        decision = self.method.report(trial_id, length, self._finite(value))
        trial.length = length
        trial.phase = {
            Action.CONTINUE: Phase.RUNNING,
            Action.PAUSE: Phase.WAITING,
            Action.STOP: Phase.DONE,
        }[decision.action]
        self._collect()
        return decision.action

    def _replay(self, trial_id: str, trial: _Trial, length: int) -> Action:
        """A result the search has had: CONTINUE until the trial is back where it was."""
        if length < trial.length or trial.phase in (Phase.RUNNING, Phase.QUEUED):
            if trial.phase is Phase.QUEUED:
                self._queue.remove(trial_id)
                trial.phase = Phase.RUNNING
            return Action.CONTINUE
        self._catching_up.discard(trial_id)
        return Action.PAUSE if trial.phase is Phase.WAITING else Action.STOP

    def _finite(self, value: float | None) -> float:
        value = math.nan if value is None else float(value)
        if math.isfinite(value):
            return value
        return math.inf if self.smaller_is_better else -math.inf  # the worst result

    def on_exit(self, trial_id: str, reason: ExitReason) -> None:
        """The trial ended in the runner: completed, errored, InvalidHP or canceled."""
        trial = self._trials.get(trial_id)
        self._catching_up.discard(trial_id)
        if trial_id in self._queue:
            self._queue.remove(trial_id)
        if trial is None:
            return
        reason = ExitReason(reason)
        if reason is ExitReason.COMPLETED and trial.phase in (Phase.DONE, Phase.WAITING):
            trial.phase = Phase.DONE
            return
        if trial.phase is not Phase.DONE:
            self.method.trial_exited(trial_id, reason)
            trial.phase = Phase.EXITED if reason is not ExitReason.COMPLETED else Phase.DONE
        self._collect()

    # -- what runs next --------------------------------------------------------------------
    def choose(self, runner: Mapping[str, RunnerStatus]) -> Choice:
        """The next trial to run and the trials to pause or stop, given the runner's view."""
        self._collect()
        # A trial closed as it pauses is stopped once paused (its checkpoint is written).
        idle = (RunnerStatus.PENDING, RunnerStatus.PAUSED)
        stop = tuple(t for t in self._to_stop if runner.get(t) in idle)
        self._to_stop = [t for t in self._to_stop if runner.get(t) is RunnerStatus.RUNNING]
        if self.interrupted:
            return self._drain(runner, stop)
        for trial_id in list(self._queue):
            status = runner.get(trial_id)
            if status in (None, RunnerStatus.ENDED):
                self._queue.remove(trial_id)
                self._trials[trial_id].phase = Phase.EXITED
            elif status is RunnerStatus.PAUSED:  # handed to the runner, which resumes it
                self._queue.remove(trial_id)
                self._trials[trial_id].phase = Phase.RUNNING
                return Choice(run=trial_id, stop=stop)
            elif status is RunnerStatus.PENDING:  # the runner starts it by itself
                self._queue.remove(trial_id)
                self._trials[trial_id].phase = Phase.RUNNING
            # RUNNING: promoted while its pause (a checkpoint) is still being written. It
            # stays queued and is resumed once paused; taking it for running would leave it
            # paused for good.
        for trial_id, status in runner.items():
            if status is RunnerStatus.PENDING:
                return Choice(run=trial_id, stop=stop)
        if self.method.finished and not self._queue:
            waiting = [t for t, s in runner.items() if s is RunnerStatus.PAUSED]
            stop = tuple(dict.fromkeys([*stop, *waiting]))
        return Choice(stop=stop)

    def _drain(self, runner: Mapping[str, RunnerStatus], stop: tuple[str, ...]) -> Choice:
        """Interrupted: running trials pause at a checkpoint, unstarted ones stay unstarted."""
        running = tuple(t for t, s in runner.items() if s is RunnerStatus.RUNNING)
        pending = tuple(t for t, s in runner.items() if s is RunnerStatus.PENDING)
        drained = not running and not self._drained
        self._drained = self._drained or drained
        return Choice(pause=pending, stop=stop, checkpoint_pause=running, drained=drained)

    def interrupt(self) -> None:
        """Ctrl-C: start nothing, pause every running trial at a checkpoint, then end."""
        self.interrupted = True

    @property
    def finished(self) -> bool:
        return self.method.finished and not self._queue

    def _collect(self) -> None:
        """Take the method's promotions and close-outs into the driver's queue and stops."""
        while (nxt := self.method.next_resume()) is not None:
            trial_id = nxt[0]
            trial = self._trials.get(trial_id)
            if trial is not None:
                trial.phase = Phase.QUEUED
                self._queue.append(trial_id)
        for trial_id in self.method.closed_trials():
            trial = self._trials.get(trial_id)
            if trial is not None:
                trial.phase = Phase.DONE
                self._to_stop.append(trial_id)

    # -- restore ---------------------------------------------------------------------------
    def restore(
        self, runner: Mapping[str, RunnerStatus], checkpoint_lengths: Mapping[str, int | None]
    ) -> Choice:
        """Settle the unfinished trials a restored runner brought back (all pending).

        ``checkpoint_lengths`` gives, per trial, the longest rung length its latest checkpoint
        completed (None: no checkpoint). A trial whose checkpoint is behind its last result
        runs until it is back there (its results are replays); one at its last result keeps
        its place: waiting or queued trials stay paused, finished ones are stopped.
        Returns the trials to keep paused and to stop.
        """
        pause: list[str] = []
        stop: list[str] = []
        for trial_id, status in runner.items():
            if status is RunnerStatus.ENDED:
                continue
            trial = self._trials.get(trial_id)
            if trial is None or trial.phase is Phase.EXITED:
                stop.append(trial_id)
                continue
            if trial.phase is Phase.RUNNING:
                continue
            behind = (checkpoint_lengths.get(trial_id) or 0) < trial.length
            if trial.phase is Phase.QUEUED:
                pause.append(trial_id)  # resumes in queue order; replays what it lacks
            elif behind:
                self._catching_up.add(trial_id)
            elif trial.phase is Phase.WAITING:
                pause.append(trial_id)
            else:
                stop.append(trial_id)
        for trial_id, trial in self._trials.items():
            live = trial.phase in (Phase.RUNNING, Phase.QUEUED, Phase.WAITING)
            if live and trial_id not in runner:
                # The runner never saved this trial (its state is older than the search's):
                # the search forgets it and hands its place to a new trial.
                self.method.trial_exited(trial_id, ExitReason.INVALID_HP)
                trial.phase = Phase.EXITED
                if trial_id in self._queue:
                    self._queue.remove(trial_id)
        return Choice(pause=tuple(pause), stop=tuple(stop))

    # -- state -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "version": _STATE_VERSION,
            "method": self.method.state_dict(),
            "trials": {tid: t.to_list() for tid, t in self._trials.items()},
            "queue": list(self._queue),
            "to_stop": list(self._to_stop),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        version = state.get("version")
        if version != _STATE_VERSION:
            raise CheckpointError(
                f"search driver state has version {version!r}, but this searchlab reads "
                f"version {_STATE_VERSION}; resume it with the searchlab that started it"
            )
        self.method.load_state_dict(state["method"])
        self._trials = {str(t): _Trial.from_list(v) for t, v in state["trials"].items()}
        self._queue = [str(t) for t in state["queue"]]
        self._to_stop = [str(t) for t in state["to_stop"]]
