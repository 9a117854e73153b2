"""Ray Tune adapters around the pure ``SearchDriver``: a gated searcher and a scheduler.

Tune asks the searcher for new trials and the scheduler for what a running trial does next and
which trial to start. Both translate to and from one ``SearchDriver`` (``searchers._driver``),
which decides everything: "promote a paused trial or start a new one", the answers to results
(including results replayed after a crash), what a restored run keeps paused, Ctrl-C's drain.
"""

from __future__ import annotations

import json
import math
import pathlib
from collections.abc import Callable
from typing import Any

from ray.tune.experiment import Trial
from ray.tune.schedulers import FIFOScheduler, TrialScheduler
from ray.tune.search import Searcher

from searchers._base import Action, ExitReason
from searchers._driver import FINISHED, RunnerStatus, SearchDriver
from searchlab._failpoints import failpoint
from searchlab.experiment._compat import (
    end_run_resumably,
    keep_idle_actors,
    keep_only_this_session_staged,
    keep_starting_actors,
    set_trial_paused,
    start_in_idle_workers,
)
from searchlab.experiment._protocol import Outcome, TrialConfig, TrialReport
from searchlab.experiment._records import is_disk_full, trial_error_text
from searchlab.experiment._snapshot import Snapshots

__all__ = ["GatedSearcher", "RestoreFailed", "RunControl", "SearchScheduler"]

_DECISIONS = {
    Action.CONTINUE: TrialScheduler.CONTINUE,
    Action.PAUSE: TrialScheduler.PAUSE,
    Action.STOP: TrialScheduler.STOP,
}
_STATUSES = {
    Trial.PENDING: RunnerStatus.PENDING,
    Trial.RUNNING: RunnerStatus.RUNNING,
    Trial.PAUSED: RunnerStatus.PAUSED,
}


class RunControl:
    """What the driver process tells the adapters: an interrupt, a restore to settle."""

    def __init__(
        self, *, restored: bool = False, concurrency: int = 1, standby_actors: int = 0
    ) -> None:
        self.interrupted = False  # Ctrl-C (or a full disk): pause everything at a checkpoint
        self.drained = False  # interrupted and nothing runs any more: the run ended
        self.fatal = False  # a user error every trial would hit: stop everything
        self.restore_expected = restored
        self.restored = restored  # the first scheduling step settles the restored trials
        self.searcher_restored = False  # Tune handed the saved search state back
        self.restore_error: str | None = None  # why Tune could not restore the search state
        self.disk_full: set[str] = set()  # trials that failed on a full disk: they resume
        # How many trials run at once: the cluster's room or max_concurrent_trials at the
        # start, raised to the most seen running or pending (a cluster that grows, brackets
        # that each need a trial).
        self.concurrency = concurrency
        # With standby, the idle trial actors Tune should keep (two per GPU), not yet asked.
        self.standby_actors = standby_actors
        # Where Ray started here without a runtime environment: what its workers inherited,
        # until the trials' actors are let into its idle workers (``start_in_idle_workers``).
        # Never pickled: it may hold the user's secrets.
        self.worker_environ: dict[str, str] | None = None
        # Every trial Tune holds, and those told to pause whose pause Tune has not finished
        # (their state is being saved): trial id -> Tune's ``Trial``. Not pickled: Tune
        # pickles its searcher and scheduler, and the trials are its own.
        self._trials: dict[str, Trial] = {}
        self._pausing: dict[str, Trial] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_trials": {}, "_pausing": {}, "worker_environ": None}

    def track(self, trial: Trial) -> None:
        self._trials[trial.trial_id] = trial

    def pause_started(self, trial: Trial) -> None:
        self.track(trial)
        self._pausing[trial.trial_id] = trial

    def pause_ended(self, trial_id: str) -> None:
        """The trial failed, ended or was removed: its pause, if any, is over."""
        self._pausing.pop(trial_id, None)

    def hold_new_trials(self) -> bool:
        """Whether a new or resumed trial would only fit in the place of a trial that is
        still pausing, so nothing more is handed to Tune until that pause is done.

        Tune starts a trial it is handed in the same step. With the pausing trial's worker
        still saving it, that means a new worker process, which Tune drops once the pause
        frees the old worker and reuses that one; the dropped process still starts (imports,
        the trial's build) wherever resources allow, and Tune waits for it at the end of
        the run. Where the trial fits beside the running and pausing ones, nothing is held,
        so a search never waits on pauses for room it has; there a new worker may still be
        started and dropped, if the pause frees its worker first.
        """
        if not self._pausing:
            return False
        self._pausing = {t: x for t, x in self._pausing.items() if x.status == Trial.RUNNING}
        if not self._pausing:
            return False
        busy = sum(1 for x in self._trials.values() if x.status in (Trial.RUNNING, Trial.PENDING))
        self.concurrency = max(self.concurrency, busy)
        return busy >= self.concurrency

    @property
    def restore_failed(self) -> bool:
        """A resumed run whose search state Tune did not restore (it would start over)."""
        return self.restore_expected and not self.searcher_restored


class RestoreFailed(Exception):
    """Raised before Tune's first step when it did not restore the search state."""


class GatedSearcher(Searcher):
    """Hands Tune the driver's new trials; None ("ask later") while promotions are due."""

    def __init__(
        self,
        driver: SearchDriver,
        metric: str,
        smaller_is_better: bool,
        control: RunControl | None = None,
        snapshots: Snapshots | None = None,
    ) -> None:
        super().__init__(metric=metric, mode="min" if smaller_is_better else "max")
        self.driver = driver
        self.control = control or RunControl()
        self.snapshots = snapshots

    @property
    def method(self) -> Any:
        return self.driver.method

    def set_search_properties(
        self, metric: str | None, mode: str | None, config: dict, **spec: Any
    ) -> bool:
        return True

    # Tune's contract: a dict of config, None for "ask again later", or ``Searcher.FINISHED``
    # (a str) when no trial will ever be suggested again; its annotation leaves out the str.
    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:  # type: ignore[override]
        if self.control.fatal:
            return Searcher.FINISHED
        if self.control.interrupted or self.control.hold_new_trials():
            return None
        plan = self.driver.suggest(trial_id)
        if plan is None or plan == FINISHED:
            return Searcher.FINISHED if plan == FINISHED else None
        assert not isinstance(plan, str)
        return TrialConfig(plan.hparams, plan.rung_ends, plan.bracket, plan.trial_seed).to_tune()

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        if error and trial_id in self.control.disk_full:
            return  # not the trial's failure: it goes on when `searchlab resume` runs
        self.driver.on_exit(trial_id, exit_reason(result, error))

    def save(self, checkpoint_path: str) -> None:
        failpoint("searcher-save")  # Tune wrote its experiment state, not yet the searcher's
        keep_only_this_session_staged(pathlib.Path(checkpoint_path))
        state = self.driver.state_dict()
        if self.snapshots is None:
            pathlib.Path(checkpoint_path).write_text(json.dumps({"driver": state}))
            return
        pathlib.Path(checkpoint_path).write_text(self.snapshots.searcher_file_text(state))
        self.snapshots.staged(pathlib.Path(checkpoint_path).parent, lambda: state)

    def restore(self, checkpoint_path: str) -> None:
        try:
            data = json.loads(pathlib.Path(checkpoint_path).read_text())
            self.driver.load_state_dict(data["driver"])
        except Exception as exc:
            self.control.restore_error = f"{pathlib.Path(checkpoint_path).name}: {exc}"
            raise
        self.control.searcher_restored = True


def exit_reason(result: dict[str, Any] | None, error: bool) -> ExitReason:
    if error:
        return ExitReason.ERRORED
    outcome = TrialReport.of(result).outcome
    if outcome is Outcome.INVALID_HP:
        return ExitReason.INVALID_HP
    if outcome in (Outcome.FATAL, Outcome.TRIAL_ERROR):
        return ExitReason.ERRORED
    return ExitReason.COMPLETED


class SearchScheduler(FIFOScheduler):
    """Turns rung results into CONTINUE/PAUSE/STOP and carries out the driver's choices."""

    def __init__(
        self,
        searcher: GatedSearcher,
        smaller_is_better: bool,
        checkpoint_length: Callable[[Trial], int | None] | None = None,
    ) -> None:
        super().__init__()
        self._searcher = searcher
        self._searcher_metric = str(searcher.metric)
        self._checkpoint_length = checkpoint_length or (lambda trial: None)
        # Trials an interrupt's drain asked to pause, each asked once (``RunControl`` tracks
        # which pauses are still under way).
        self._drain_paused: set[str] = set()

    @property
    def driver(self) -> SearchDriver:
        return self._searcher.driver

    def on_trial_result(self, tune_controller: Any, trial: Trial, result: dict[str, Any]) -> str:
        decision = TrialScheduler.CONTINUE
        length = TrialReport.of(result).length
        if length is not None:
            reported = result.get(self._searcher_metric)
            value = float(reported) if reported is not None else math.nan
            action = self.driver.on_result(trial.trial_id, length, value)
            if not result.get("done"):  # a trial at its last rung ends by itself
                decision = _DECISIONS[action]
        if self._searcher.control.interrupted and decision == TrialScheduler.CONTINUE:
            decision = TrialScheduler.CONTINUE if result.get("done") else TrialScheduler.PAUSE
        if decision == TrialScheduler.PAUSE:
            self._searcher.control.pause_started(trial)
        return decision

    def on_trial_error(self, tune_controller: Any, trial: Trial) -> None:
        self._searcher.control.pause_ended(trial.trial_id)  # Tune may retry it: it runs again
        if is_disk_full(trial_error_text(trial)):
            self._searcher.control.disk_full.add(trial.trial_id)
            self._searcher.control.interrupted = True  # pause the rest, resumably

    def on_trial_add(self, tune_controller: Any, trial: Trial) -> None:
        self._searcher.control.track(trial)

    def on_trial_complete(self, tune_controller: Any, trial: Trial, result: dict[str, Any]) -> None:
        self._searcher.control.pause_ended(trial.trial_id)

    def on_trial_remove(self, tune_controller: Any, trial: Trial) -> None:
        self._searcher.control.pause_ended(trial.trial_id)

    def choose_trial_to_run(self, tune_controller: Any) -> Trial | None:
        trials = {t.trial_id: t for t in tune_controller.get_trials()}
        control = self._searcher.control
        for trial in trials.values():
            control.track(trial)
        if control.restored:
            control.restored = False
            self._settle_restored(tune_controller, trials)
        if control.interrupted and not self.driver.interrupted:
            self.driver.interrupt()
        if control.fatal:  # every trial would hit the same user error: stop them all
            for trial in trials.values():
                if trial.status in (Trial.PENDING, Trial.RUNNING, Trial.PAUSED):
                    tune_controller.stop_trial(trial)
            return None
        if control.worker_environ is not None and trials:
            # Before Tune starts the first actor, so that it can take an idle worker.
            trainable = next(iter(trials.values())).get_trainable_cls()
            start_in_idle_workers(tune_controller, trainable, control.worker_environ)
            control.worker_environ = None
        if control.standby_actors and trials:
            # Standby needs every actor of a GPU to stay: a paused trial's actor waits in
            # Tune's cache for the next trial instead of being stopped, and an actor that
            # is starting is not removed when another frees first.
            resources = next(iter(trials.values())).placement_group_factory
            keep_idle_actors(tune_controller, resources, control.standby_actors)
            keep_starting_actors(tune_controller)
            control.standby_actors = 0
        if control.hold_new_trials():  # the next trial takes a pausing trial's place: wait
            return None
        choice = self.driver.choose(_runner_view(trials.values()))
        for trial_id in choice.stop:
            tune_controller.stop_trial(trials[trial_id])
        if choice.stop:
            failpoint("trials-stopped")  # close-out: paused trials that will never go on
        for trial_id in choice.pause:
            if trials[trial_id].status == Trial.PENDING:
                set_trial_paused(tune_controller, trials[trial_id])
        for trial_id in choice.checkpoint_pause:
            if trial_id not in self._drain_paused:
                self._drain_paused.add(trial_id)
                control.pause_started(trials[trial_id])
                tune_controller.pause_trial(trials[trial_id], should_checkpoint=True)
        if choice.drained and not control.drained:
            control.drained = True
            end_run_resumably()  # the trials keep their PAUSED state, for `searchlab resume`
        return trials[choice.run] if choice.run is not None else None

    def _settle_restored(self, tune_controller: Any, trials: dict[str, Trial]) -> None:
        """Tune brought every unfinished trial back as PENDING: keep waiting ones paused,
        stop finished ones, let the rest (and those behind their last result) run."""
        view = _runner_view(trials.values())
        lengths = {t: self._checkpoint_length(trials[t]) for t in view}
        choice = self.driver.restore(view, lengths)
        for trial_id in choice.pause:
            set_trial_paused(tune_controller, trials[trial_id])
        for trial_id in choice.stop:
            tune_controller.stop_trial(trials[trial_id])

    def debug_string(self) -> str:
        return "searchlab scheduler"


def _runner_view(trials: Any) -> dict[str, RunnerStatus]:
    return {t.trial_id: _STATUSES.get(t.status, RunnerStatus.ENDED) for t in trials}
